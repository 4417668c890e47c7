"""One micro-batch of the pipeline (:class:`MicroBatchRunner`): the checkpoint's offset ranges, the
Spark job over them (``chandy_kafka_ranges`` → decode → transform → ``chandy_lake_files``, or one
``mapInArrow`` task per subtask without a transform), waiting for the checkpoint, and the
back-off after a failure."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import random
import time
from typing import Any

from chandy.connectors.kafka.source.split import KafkaPartitionSplit
from chandy.connectors.lake.sink import coordinator_log_id
from chandy.connectors.spark.classic import partitions_of, spark_master
from chandy.connectors.spark.cluster import task_max_failures
from chandy.connectors.spark.driver.coordinator import JobCoordinator
from chandy.connectors.spark.driver.decoders import DecoderFactory
from chandy.connectors.spark.driver.state import DriverState
from chandy.connectors.spark.options import SINK_OPERATOR, PipelineError
from chandy.coordinator.kafka.log_writer import CoordinatorFencedError

log = logging.getLogger(__name__)


class MicroBatchRunner:
    """Runs checkpoint N's micro-batch: subtask *i* of ``lake-sink`` is Spark task *i*, which
    reads its ranges, decodes, writes invisible lake files and acknowledges N (or declines it on
    its last allowed attempt). ``decoders`` infers the decoder from the first micro-batch when
    no schema is known; ``coordinator`` names a newer coordinator when this one is fenced."""

    def __init__(self, state: DriverState, decoders: DecoderFactory, coordinator: JobCoordinator) -> None:
        self.state = state
        self.decoders = decoders
        self.coordinator = coordinator

    def ranges(self, checkpoint_id: int, future: Any, timeout_s: float) -> dict[tuple[str, int], KafkaPartitionSplit]:
        """Checkpoint ``checkpoint_id``'s offset ranges, per (topic, partition), once the
        enumerator fixed them (polled every 5 ms for up to ``timeout_s``); empty when the
        checkpoint (``future``) completed without any.

        Raises:
            CheckpointException: the checkpoint failed before its ranges were fixed.
            PipelineError: they were not fixed within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ranges = self.state.enumerator_call(lambda e: e.ranges_of(checkpoint_id))
            if ranges:
                return ranges
            if future.done():
                future.result()  # raises the reason it failed
                return {}
            time.sleep(0.005)
        raise PipelineError(f"the offset ranges of checkpoint {checkpoint_id} were not fixed within {timeout_s} s")

    def _task_options(self, spark: Any, checkpoint_id: int) -> Any:
        """What every task of checkpoint ``checkpoint_id`` needs (``TaskOptions``): the table's
        columns read again when a commit may have added some, the routed tables' columns as the
        committer last read or evolved them (:meth:`LakeSink.known_fields`), the decoder in
        Spark's session time zone."""
        from chandy.connectors.spark.task.options import TaskOptions

        state, opts = self.state, self.state.options
        if state.table_fields is None or state.add_columns:  # columns added by the last commit count
            state.table_fields = state.sink.table_fields()
        zone = spark.conf.get("spark.sql.session.timeZone") or "UTC"  # the effective zone (Spark Connect gives None for a default)
        if state.decoder is not None and state.decoder.session_time_zone != zone:  # JSON timestamps without an offset
            state.decoder = dataclasses.replace(state.decoder, session_time_zone=zone)
        service = state.running()
        routed_fields = {uri: fields for uri, sink in list(state.routed_sinks.items())
                         if (fields := sink.known_fields()) is not None}
        return TaskOptions(
            table_uri=opts.table_uri, job_id=state.job_id, checkpoint_id=checkpoint_id, epoch=service.epoch,
            operator_id=SINK_OPERATOR, bootstrap_servers=opts.bootstrap_servers, prefix=opts.prefix,
            checkpoint_dir=opts.resolved_checkpoint_dir, partition_by=tuple(opts.partition_by),
            storage_options=state.storage_options(), producer_overrides=opts.task_producer_overrides,
            consumer_overrides=opts.task_consumer_overrides,
            max_task_failures=task_max_failures(spark_master(spark), spark.conf.get("spark.task.maxFailures", None)),
            table_fields=state.table_fields, routed_table_fields=routed_fields, decoder=state.decoder,
            catalog_properties=dict(opts.catalog_properties),
            add_columns=state.add_columns, table_location=getattr(state.sink, "root_url", None),
            write_buffer_bytes=opts.write_buffer_bytes, router=state.router, unrouted=opts.unrouted,
            changes=opts.cdc is not None, fail_on_data_loss=opts.fail_on_data_loss,
            table_properties=dict(opts.table_properties),
            log_id=coordinator_log_id(opts.prefix, state.job_id, service.log_incarnation))

    def run(self, spark: Any, checkpoint_id: int, ranges: dict[tuple[str, int], KafkaPartitionSplit]) -> None:
        """Run checkpoint ``checkpoint_id``'s Spark job over ``ranges`` (each subtask's ranges by
        the enumerator's assignment); the tasks acknowledge the checkpoint, the caller waits for
        it (:meth:`wait`). The first micro-batch of JSON without a schema infers the decoder.

        Raises:
            Exception: whatever the Spark job raised (a task's error as Py4J's or PySpark's text:
                :func:`~chandy.connectors.spark.driver.failures.root_cause` reads it).
        """
        from chandy.connectors.spark.task.datasources import LAKE_FILES_FORMAT, RANGES_FORMAT
        from chandy.connectors.spark.task.options import TASK_OPTION
        from chandy.connectors.spark.task.run import TASK_RESULT_DDL, read_write_and_acknowledge

        state = self.state
        parallelism = state.parallelism
        assignment = state.enumerator_call(lambda e: e.assignment())
        per_subtask = [[[s.topic, s.partition, ranges[s.topic_partition].starting_offset,
                         ranges[s.topic_partition].stopping_offset]
                        for s in assignment.get(i, []) if s.topic_partition in ranges
                        and ranges[s.topic_partition].num_records > 0]
                       for i in range(parallelism)]
        if state.options.value_format is not None and state.decoder is None:
            state.decoder = self.decoders.infer(ranges)
            if state.transform is None:
                self.decoders.check_output_schema(self.decoders.output_schema())
        task = self._task_options(spark, checkpoint_id)
        if state.transform is None:
            # nothing for Spark SQL to do: each task reads, decodes, writes and acknowledges in one
            # Python worker, sparing the batches a round trip through the JVM
            (spark.range(0, parallelism, 1, numPartitions=parallelism)
             .mapInArrow(read_write_and_acknowledge(task, per_subtask), TASK_RESULT_DDL).collect())
            return
        df = (spark.read.format(RANGES_FORMAT).option(TASK_OPTION, task.encode())
              .option("ranges", json.dumps(per_subtask)).load())
        if state.decoder is not None:
            df = self.decoders.decode_frame(df, task)
        df = state.transform(df)
        # a subtask per partition: Spark Connect cannot say how many the transform made, so there
        # the rows are always spread anew (a shuffle; classic Spark spares it when they match)
        partitions = partitions_of(df)
        if partitions is None:
            df = df.repartition(parallelism)
        elif partitions > parallelism:
            df = df.coalesce(parallelism)
        elif partitions < parallelism:
            df = df.repartition(parallelism)
        df.write.format(LAKE_FILES_FORMAT).mode("append").option(TASK_OPTION, task.encode()).save()

    def wait(self, trigger: Any, timeout_s: float) -> Any:
        """The trigger's result (a completed checkpoint, or a savepoint's location), waited for in
        short steps (0.25 s): a fenced or stopped coordinator ends the wait at once (its log writer
        may die with the checkpoint's commit in flight, and then nothing would ever complete the
        future), not at the checkpoint timeout.

        Raises:
            CoordinatorFencedError: a newer coordinator of the job took over.
            PipelineError: the coordinator stopped.
            CheckpointException, concurrent.futures.TimeoutError: as ``trigger.result``.
        """
        service = self.state.running()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return trigger.result(max(0.0, min(0.25, deadline - time.monotonic())))
            except concurrent.futures.TimeoutError:
                if service.fenced.is_set():
                    raise CoordinatorFencedError(self.coordinator.fenced_message()) from None
                if service.stopped.is_set():
                    raise PipelineError(f"job {self.state.job_id}: the coordinator stopped "
                                        f"({service.failure_reason() or 'no reason given'})") from None
                if time.monotonic() >= deadline:
                    raise

    def backoff_s(self, consecutive_failures: int) -> float:
        """The pause in seconds after ``consecutive_failures`` failed checkpoints in a row, as
        Flink's exponential-delay restart strategy: initial x 2^(n-1), capped, with 10 % jitter."""
        opts = self.state.options
        delay = min(opts.restart_backoff_max_ms, opts.restart_backoff_initial_ms * 2 ** (consecutive_failures - 1))
        return delay * (1 + random.uniform(-0.1, 0.1)) / 1000

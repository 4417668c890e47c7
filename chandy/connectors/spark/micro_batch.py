"""One micro-batch of the pipeline and what the loop reads around it: the source's lag, the
checkpoint's offset ranges, the Spark job over them (``chandy_kafka_ranges`` → decode →
transform → ``chandy_lake_files``), waiting for the checkpoint, and the back-off after a failure."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import random
import time
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from chandy.connectors.kafka.source.split import KafkaPartitionSplit
from chandy.connectors.lake.sink import coordinator_log_id
from chandy.connectors.spark.classic import partitions_of, spark_master
from chandy.connectors.spark.cluster import (
    task_max_failures,
)
from chandy.connectors.spark.driver_core import PipelineCore
from chandy.connectors.spark.options import (
    SINK_OPERATOR,
    PipelineError,
    PipelineKafkaError,
)
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.log_writer import CoordinatorFencedError
from chandy.coordinator.kafka.topics import OffsetsUnavailableError, watermark_offsets

log = logging.getLogger(__name__)

#: seconds a source-offset read may keep failing retriably before it is asked with a new client
LAG_CLIENT_RENEW_S = 20.0


class PipelineMicroBatch(PipelineCore):
    """The micro batch part of :class:`~chandy.connectors.spark.pipeline.Pipeline`."""

    def lag(self) -> dict[tuple[str, int], int]:
        """Records between the job's positions (the last completed checkpoint's ends) and the last
        stable offsets; 0 for a partition that is gone.

        Each poll also runs the source's check of the data loss no trigger would see
        (:meth:`~chandy.connectors.kafka.source.enumerator.KafkaSourceEnumerator.check_log_ends`,
        Spark's ``failOnDataLoss``): a partition whose log ends below the job's position (the topic
        deleted and created again, an unclean leader election) shows no lag, and once its new log
        grew past the position every record below it would be skipped in silence. With
        ``--no-fail-on-data-loss`` the job goes on from its position (the table holds the offsets
        below it: :attr:`~chandy.connectors.kafka.source.enumerator.KafkaSourceOptions.sink_holds_offsets`),
        with a notice, and :attr:`offsets_lost` counts the offsets the log moved back by.

        A read that keeps failing retriably for :data:`LAG_CLIENT_RENEW_S` gets a new client (a
        client whose metadata lost the partition while brokers restarted can answer "unknown
        partition" for minutes); reads go on for ``--kafka-retry-timeout`` in all.

        Raises:
            PipelineKafkaError: a fatal error, or retriable ones past ``--kafka-retry-timeout``.
            PipelineError: ``--fail-on-data-loss`` (the default) and a partition whose log ends
                below the job's position or is gone: ``KafkaDataLossError: ...`` in one line naming
                the partition, both offsets and the likely causes.
        """
        from chandy.connectors.kafka.source.data_loss import UNKNOWN_PARTITION_ERRORS, partition_gone
        from chandy.connectors.kafka.source.reader import KafkaDataLossError

        positions, missing = self._enumerator_call(lambda e: (dict(e.committed_end), e.missing))
        logs: dict[tuple[str, int], tuple[int, int] | None] = {}
        deadline = time.monotonic() + self.options.kafka_retry_timeout_ms / 1000
        for tp in sorted(positions):
            if tp in missing and partition_gone(self._lag_client(), tp):
                logs[tp] = None
                continue
            while tp not in logs:
                try:
                    logs[tp] = watermark_offsets(self._lag_client(), TopicPartition(*tp), timeout_s=max(
                        0.1, min(LAG_CLIENT_RENEW_S, deadline - time.monotonic())))
                except OffsetsUnavailableError as exc:
                    if not exc.retriable or time.monotonic() >= deadline:
                        if exc.code in UNKNOWN_PARTITION_ERRORS and partition_gone(self._lag_client(), tp):
                            logs[tp] = None
                            break
                        waited = f"; retried for {self.options.kafka_retry_timeout_ms} ms in all" if exc.retriable else ""
                        raise PipelineKafkaError(f"reading the source's offsets failed: {exc}{waited}") from exc
                    log.warning("job %s: %s; reading with a new client", self.job_id, exc)
                    self.close_lag_client()
        try:
            positions = self._enumerator_call(lambda e: e.check_log_ends(logs))
        except KafkaDataLossError as exc:  # FAILED for good (a restart would meet the same log), as at a trigger
            self._record_failure(f"KafkaDataLossError: {exc}")
            raise PipelineError(f"KafkaDataLossError: {exc}") from exc
        self.sync_data_loss()
        lag = {}
        for tp, log_now in logs.items():
            if log_now is None:
                lag[tp] = 0
                continue
            high = log_now[1]
            if self.ending_offsets is not None:  # a bounded run: nothing past its end is lag
                high = min(high, self.ending_offsets.get(tp, high))
            lag[tp] = max(0, high - positions.get(tp, high))
        return lag

    def sync_data_loss(self) -> None:
        """The source's data-loss warnings of this attempt (``--no-fail-on-data-loss``; Spark's
        ``failOnDataLoss=false``) as notices, and its offsets lost into :attr:`offsets_lost`."""
        seen = self._data_loss_seen
        lost, warnings = self._enumerator_call(lambda e: (e.offsets_lost, e.data_loss[seen:]))
        for warning in warnings:
            self._notice(f"data loss: {warning}")
        self._data_loss_seen += len(warnings)
        self.offsets_lost = self._offsets_lost_before + lost

    def resolve_ending_offsets(self) -> None:
        """``--ending-offsets``, resolved once, when the run starts (Spark's ``endingOffsets``):
        per partition the offset (exclusive) the run stops at.

        Raises:
            PipelineKafkaError: the offsets cannot be read.
            PipelineError: JSON offsets that do not name exactly the job's partitions (Spark's rule).
        """
        from chandy.connectors.kafka.source.offsets import ConsumerOffsetsRetriever, OffsetsSpecError, parse_offsets_spec

        spec = self.options.ending_offsets
        if spec is None or self.ending_offsets is not None:
            return
        initializer = parse_offsets_spec(spec, "--ending-offsets", ending=True)
        try:
            ends = initializer.get_partition_offsets(self.partitions, ConsumerOffsetsRetriever(self._lag_client()))
        except KafkaException as exc:
            raise PipelineKafkaError(f"reading --ending-offsets {spec} failed: {exc.args[0]}") from exc
        except OffsetsSpecError as exc:
            raise PipelineError(str(exc)) from exc
        self.ending_offsets = dict(ends)
        where = ", ".join(f"{t}-{p}@{o}" for (t, p), o in sorted(ends.items())[:6])
        more = "" if len(ends) <= 6 else f" and {len(ends) - 6} more"
        self._notice(f"bounded run (--ending-offsets {spec}): stops once every partition reaches its end ({where}{more})")

    def reached_ending_offsets(self) -> bool:
        """Whether a bounded run read every partition up to its end (False when unbounded)."""
        if self.ending_offsets is None:
            return False
        ends = self._enumerator_call(lambda e: dict(e.committed_end))
        return all(ends.get(tp, -1) >= stop for tp, stop in self.ending_offsets.items())

    def _lag_client(self) -> Any:
        if self._lag_consumer is None:
            self._lag_consumer = kafka_config.consumer(self.options.bootstrap_servers,
                                                       overrides=dict(self.options.consumer_overrides))
        return self._lag_consumer

    def close_lag_client(self) -> None:
        """Close the consumer that reads the source's offsets (a new one is made when needed)."""
        consumer, self._lag_consumer = self._lag_consumer, None
        if consumer is not None:
            consumer.close()

    def _ranges(self, checkpoint_id: int, future: Any, timeout_s: float) -> dict[tuple[str, int], KafkaPartitionSplit]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ranges = self._enumerator_call(lambda e: e.ranges_of(checkpoint_id))
            if ranges:
                return ranges
            if future.done():
                future.result()  # raises the reason it failed
                return {}
            time.sleep(0.005)
        raise PipelineError(f"the offset ranges of checkpoint {checkpoint_id} were not fixed within {timeout_s} s")

    def _task_options(self, spark: Any, checkpoint_id: int) -> Any:
        from chandy.connectors.spark.task.options import TaskOptions

        opts = self.options
        if self.table_fields is None or self.add_columns:  # columns added by the last commit count
            self.table_fields = self.sink.table_fields()
        zone = spark.conf.get("spark.sql.session.timeZone") or "UTC"  # the effective zone (Spark Connect gives None for a default)
        if self.decoder is not None and self.decoder.session_time_zone != zone:  # JSON timestamps without an offset
            self.decoder = dataclasses.replace(self.decoder, session_time_zone=zone)
        assert self.service is not None
        return TaskOptions(
            table_uri=opts.table_uri, job_id=self.job_id, checkpoint_id=checkpoint_id, epoch=self.service.epoch,
            operator_id=SINK_OPERATOR, bootstrap_servers=opts.bootstrap_servers, prefix=opts.prefix,
            checkpoint_dir=opts.resolved_checkpoint_dir, partition_by=tuple(opts.partition_by),
            storage_options=dict(opts.storage_options), producer_overrides=opts.task_producer_overrides,
            consumer_overrides=opts.task_consumer_overrides,
            max_task_failures=task_max_failures(spark_master(spark), spark.conf.get("spark.task.maxFailures", None)),
            table_fields=self.table_fields, decoder=self.decoder, catalog_properties=dict(opts.catalog_properties),
            add_columns=self.add_columns, table_location=getattr(self.sink, "root_url", None),
            write_buffer_bytes=opts.write_buffer_bytes, router=self.router, unrouted=opts.unrouted,
            changes=opts.cdc is not None, fail_on_data_loss=opts.fail_on_data_loss,
            table_properties=dict(opts.table_properties),
            log_id=coordinator_log_id(opts.prefix, self.job_id, self.service.log_incarnation))

    def _run_micro_batch(self, spark: Any, checkpoint_id: int, ranges: dict) -> None:
        from chandy.connectors.spark.task.datasources import LAKE_FILES_FORMAT, RANGES_FORMAT
        from chandy.connectors.spark.task.options import TASK_OPTION
        from chandy.connectors.spark.task.run import TASK_RESULT_DDL, read_write_and_acknowledge

        assignment = self._enumerator_call(lambda e: e.assignment())
        per_subtask = [[[s.topic, s.partition, ranges[s.topic_partition].starting_offset,
                         ranges[s.topic_partition].stopping_offset]
                        for s in assignment.get(i, []) if s.topic_partition in ranges
                        and ranges[s.topic_partition].num_records > 0]
                       for i in range(self.parallelism)]
        if self.options.value_format is not None and self.decoder is None:
            self.decoder = self._infer_decoder(ranges)
            if self._transform is None:
                self._check_output_schema(self._output_schema())
        task = self._task_options(spark, checkpoint_id)
        if self._transform is None:
            # nothing for Spark SQL to do: each task reads, decodes, writes and acknowledges in one
            # Python worker, sparing the batches a round trip through the JVM
            (spark.range(0, self.parallelism, 1, numPartitions=self.parallelism)
             .mapInArrow(read_write_and_acknowledge(task, per_subtask), TASK_RESULT_DDL).collect())
            return
        df = (spark.read.format(RANGES_FORMAT).option(TASK_OPTION, task.encode())
              .option("ranges", json.dumps(per_subtask)).load())
        if self.decoder is not None:
            df = self._decode_frame(df, task)
        df = self._transform(df)
        # a subtask per partition: Spark Connect cannot say how many the transform made, so there
        # the rows are always spread anew (a shuffle; classic Spark spares it when they match)
        partitions = partitions_of(df)
        if partitions is None:
            df = df.repartition(self.parallelism)
        elif partitions > self.parallelism:
            df = df.coalesce(self.parallelism)
        elif partitions < self.parallelism:
            df = df.repartition(self.parallelism)
        df.write.format(LAKE_FILES_FORMAT).mode("append").option(TASK_OPTION, task.encode()).save()

    def _await(self, trigger: Any, timeout_s: float) -> Any:
        """The trigger's result, waited for in short steps: a fenced or stopped coordinator ends
        the wait at once (its log writer may die with the checkpoint's commit in flight, and
        then nothing would ever complete the future), not at the checkpoint timeout.

        Raises:
            CoordinatorFencedError: a newer coordinator of the job took over.
            PipelineError: the coordinator stopped.
            CheckpointException, concurrent.futures.TimeoutError: as ``trigger.result``.
        """
        assert self.service is not None
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return trigger.result(max(0.0, min(0.25, deadline - time.monotonic())))
            except concurrent.futures.TimeoutError:
                if self.service.fenced.is_set():
                    raise CoordinatorFencedError(self._fenced_message()) from None
                if self.service.stopped.is_set():
                    raise PipelineError(f"job {self.job_id}: the coordinator stopped "
                                        f"({self.service.failure_reason() or 'no reason given'})") from None
                if time.monotonic() >= deadline:
                    raise

    # -- control requests (coordinator/kafka/requests.py), applied by the driver loop ------------------

    def _backoff_s(self, consecutive_failures: int) -> float:
        """Flink's exponential-delay restart strategy: initial x 2^(n-1), capped, with 10 % jitter."""
        opts = self.options
        delay = min(opts.restart_backoff_max_ms, opts.restart_backoff_initial_ms * 2 ** (consecutive_failures - 1))
        return delay * (1 + random.uniform(-0.1, 0.1)) / 1000

    def _committed_records(self) -> int:
        assert self.service is not None
        self._last_committed = self.service.call_operator_coordinator(SINK_OPERATOR, lambda c: c.records_committed)
        return self._last_committed

    # -- the loop ------------------------------------------------------------------------------------

    def _safe_committed_records(self) -> int:
        try:
            return self._committed_records()
        except Exception:  # noqa: BLE001 - a stopped (fenced) coordinator: what it last said
            return self._last_committed

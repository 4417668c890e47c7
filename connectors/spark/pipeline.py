"""The main job: an exactly-once Kafka-to-lake pipeline on Spark, driven by Chandy's checkpoints.

Checkpoint N is micro-batch N. The driver runs the checkpoint coordinator with two operator
coordinators, the lake committer (operator ``lake-sink``) and the Kafka source enumerator
(``kafka-source``), and loops:

1. while there is lag, trigger checkpoint N; the enumerator fixes each reader subtask's offset
   ranges [end of N-1, last stable offset) (capped by ``max.records.per.checkpoint``);
2. run one Spark job over those ranges (``chandy_kafka_ranges``), decode values, apply the
   user's transform, and write (``chandy_lake_files``): each Spark task is subtask *i* of
   ``lake-sink``; it writes its Parquet files into the table location, invisible, and
   acknowledges N with them (or declines, on its last allowed attempt);
3. wait for N to complete: the coordinator writes ``_metadata``, logs COMPLETED, then the lake
   committer commits N's files in one Delta commit with app transaction (job id, N), and only
   then the enumerator commits the ranges' ends to the consumer group.

A failed or aborted checkpoint commits nothing; the next one reads its ranges again. After a
crash anywhere, the next start replays the coordinator log, restores the latest completed
checkpoint (committing it to the table if it was not yet: restoring implies completion; a
repeated commit is skipped by its app transaction), deletes unreferenced files, and continues
from that checkpoint's ends: every record lands exactly once.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import TopicPartition

from connectors.kafka import config as kafka_config
from connectors.kafka.source import offsets as offsets_module
from connectors.kafka.source.enumerator import KafkaSourceCoordinatorProvider, KafkaSourceOptions
from connectors.kafka.source.reader import KafkaRangeReader
from connectors.kafka.source.split import KafkaPartitionSplit
from connectors.lake.committer import LakeCommitterProvider
from connectors.lake.delta import DeltaLakeSink
from coordinator.errors import ChandyError
from coordinator import faults
from coordinator.failure import CheckpointException, CheckpointFailureReason
from coordinator.options import CheckpointingOptions
from coordinator.runtime import CoordinatorService
from coordinator.storage import CheckpointStorage

log = logging.getLogger(__name__)

SOURCE_OPERATOR = "kafka-source"
SINK_OPERATOR = "lake-sink"
KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestamp_type", "headers")


class PipelineError(ChandyError):
    """The pipeline cannot start or had to stop (the message says why)."""


def default_job_id(table_uri: str) -> str:
    """A job ID derived from the table URI: the same pipeline resumes its own checkpoints."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"chandy-pipeline:{table_uri.rstrip('/')}").hex


@dataclasses.dataclass(frozen=True)
class PipelineOptions:
    """Everything ``chandy pipeline run`` takes. Times in ms.

    Kafka settings pass through under librdkafka's names (``consumer_overrides``,
    ``producer_overrides``), Spark settings under Spark's (``spark_conf``), storage settings under
    fsspec's / delta-rs's (``storage_options``).
    """

    table_uri: str
    bootstrap_servers: str
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    job_id: str | None = None
    group_id: str | None = None
    starting_offsets: str = "earliest"
    max_records_per_checkpoint: int | None = None
    checkpoint_interval_ms: int = 0
    checkpoint_timeout_ms: int = 300_000
    tolerable_failed_checkpoints: int = 3
    checkpoint_dir: str | None = None
    parallelism: int | None = None
    master: str = "local[*]"
    spark_conf: Mapping[str, str] = dataclasses.field(default_factory=dict)
    value_format: str | None = None
    value_schema: str | None = None
    avro_framing: str = "single-object"
    keep_raw_value: bool = False
    transform: str | None = None
    partition_by: tuple[str, ...] = ()
    consumer_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    producer_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    storage_options: Mapping[str, str] = dataclasses.field(default_factory=dict)
    prefix: str = "chandy"
    stop_when_drained: bool = False
    max_checkpoints: int | None = None

    def __post_init__(self) -> None:
        if bool(self.topics) == bool(self.topic_pattern):
            raise PipelineError("give topics (a list) or a topic pattern (a regex), not both and not neither")
        if self.starting_offsets not in ("earliest", "latest", "committed"):
            raise PipelineError(f"starting offsets must be earliest, latest or committed, got {self.starting_offsets!r}")
        if self.value_format not in (None, "json", "avro"):
            raise PipelineError(f"value format must be json or avro, got {self.value_format!r}")
        if self.value_format == "avro" and not self.value_schema:
            raise PipelineError("Avro values need a value schema (--value-schema)")
        if self.avro_framing not in ("single-object", "confluent", "raw"):
            raise PipelineError(f"Avro framing must be single-object, confluent or raw, got {self.avro_framing!r}")
        if self.transform and ":" not in self.transform:
            raise PipelineError(f"--transform takes module:function, got {self.transform!r}")

    @property
    def resolved_job_id(self) -> str:
        return self.job_id or default_job_id(self.table_uri)

    @property
    def resolved_group_id(self) -> str:
        return self.group_id or f"chandy-{self.resolved_job_id}"

    @property
    def resolved_checkpoint_dir(self) -> str:
        # underscore-prefixed directories are ignored by Delta readers, as _delta_log is
        return self.checkpoint_dir or f"{self.table_uri.rstrip('/')}/_chandy_checkpoints"


@dataclasses.dataclass(frozen=True)
class PipelineProgress:
    """After each checkpoint: what landed, how long it took, and the lag per partition (records)."""

    checkpoint_id: int
    succeeded: bool
    records_in_checkpoint: int
    records_landed: int
    checkpoints_completed: int
    checkpoints_failed: int
    checkpoint_duration_ms: float
    elapsed_s: float
    lag: dict[tuple[str, int], int]
    message: str | None = None
    spark_job_ms: float = 0.0  # of checkpoint_duration_ms, the Spark job (read, transform, write, ack)


@dataclasses.dataclass(frozen=True)
class PipelineSummary:
    """The end of a run: rows this run committed, its checkpoints, seconds, and why it stopped
    (:func:`verify_table` compares the table with the topics)."""

    table_uri: str
    job_id: str
    records_landed: int
    checkpoints_completed: int
    checkpoints_failed: int
    seconds: float
    stopped_because: str = "drained"


def load_transform(spec: str) -> Callable[[Any], Any]:
    """Import ``module:function``.

    Raises:
        PipelineError: the module or the function cannot be found, or is not callable.
    """
    module_name, _, function = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PipelineError(f"--transform {spec}: cannot import {module_name}: {exc}") from exc
    transform = getattr(module, function, None)
    if not callable(transform):
        raise PipelineError(f"--transform {spec}: {module_name} has no function {function!r}")
    return transform


class Pipeline:
    """One run of the pipeline (see the module docstring). Not reusable after :meth:`run`."""

    def __init__(self, options: PipelineOptions, *, spark: Any = None) -> None:
        self.options = options
        self.job_id = options.resolved_job_id
        self._spark = spark
        self._stop = threading.Event()
        self.sink = DeltaLakeSink(options.table_uri, partition_by=options.partition_by,
                                  storage_options=options.storage_options)
        self._transform = load_transform(options.transform) if options.transform else None
        self.service: CoordinatorService | None = None
        self.parallelism = 0

    def request_stop(self) -> None:
        """Finish (or abort) the checkpoint in flight and stop; callable from any thread or signal handler."""
        self._stop.set()

    # -- setup -------------------------------------------------------------------------------------
    def _partitions(self) -> list[tuple[str, int]]:
        import re

        metadata = kafka_config.admin_client(self.options.bootstrap_servers).list_topics(timeout=30)
        if self.options.topics:
            missing = [t for t in self.options.topics if t not in metadata.topics]
            if missing:
                raise PipelineError(f"topic(s) not found on {self.options.bootstrap_servers}: {', '.join(missing)}")
            names = list(self.options.topics)
        else:
            names = [t for t in metadata.topics if re.fullmatch(self.options.topic_pattern, t)]
            if not names:
                raise PipelineError(f"no topic matches {self.options.topic_pattern!r}")
        return [(t, p) for t in names for p in metadata.topics[t].partitions]

    def _spark_session(self) -> Any:
        if self._spark is not None:
            return self._spark
        from pyspark.sql import SparkSession

        # executors' Python workers must import chandy: use this interpreter unless told otherwise
        if not os.environ.get("PYSPARK_PYTHON"):
            os.environ["PYSPARK_PYTHON"] = sys.executable
        if os.environ.get(faults.ENV):
            os.environ[faults.PGID_ENV] = str(os.getpgid(0))  # a crash point in a task kills the driver too
        builder = (SparkSession.builder.master(self.options.master).appName(f"chandy-pipeline-{self.job_id[:8]}")
                   .config("spark.ui.showConsoleProgress", "false")
                   .config("spark.sql.shuffle.partitions", str(self.parallelism)))
        for key, value in self.options.spark_conf.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("WARN")
        return spark

    def _start_coordinator(self) -> CoordinatorService:
        opts = self.options
        initializer = {"earliest": offsets_module.earliest(), "latest": offsets_module.latest(),
                       "committed": offsets_module.committed("earliest")}[opts.starting_offsets]
        source = KafkaSourceOptions(
            opts.bootstrap_servers, topics=tuple(opts.topics), topic_pattern=opts.topic_pattern,
            group_id=opts.resolved_group_id, starting_offsets=initializer,
            max_records_per_checkpoint=opts.max_records_per_checkpoint, consumer_overrides=dict(opts.consumer_overrides))
        storage = CheckpointStorage(opts.resolved_checkpoint_dir, self.job_id, storage_options=dict(opts.storage_options))
        service = CoordinatorService(
            self.job_id, opts.bootstrap_servers,
            CheckpointingOptions(interval_ms=0, timeout_ms=opts.checkpoint_timeout_ms, max_concurrent=1,
                                 tolerable_failed=opts.tolerable_failed_checkpoints, num_retained=2,
                                 checkpoint_dir=opts.resolved_checkpoint_dir),
            {SINK_OPERATOR: self.parallelism},
            # order matters: the lake commit happens before the offset commit (notification order)
            coordinator_providers=[LakeCommitterProvider(SINK_OPERATOR, self.sink, storage),
                                   KafkaSourceCoordinatorProvider(SOURCE_OPERATOR, source, parallelism=self.parallelism)],
            prefix=opts.prefix, producer_overrides=dict(opts.producer_overrides),
            consumer_overrides=dict(opts.consumer_overrides), storage_options=dict(opts.storage_options),
        )
        return service.start(periodic=False)

    def _on_mailbox(self, func: Callable[[], Any]) -> Any:
        return self.service.mailbox.call(func).result(60)

    @property
    def _enumerator(self) -> Any:
        return self.service.coordinator.holders[SOURCE_OPERATOR].coordinator

    @property
    def _committer(self) -> Any:
        return self.service.coordinator.holders[SINK_OPERATOR].coordinator

    # -- the loop ------------------------------------------------------------------------------------
    def lag(self, consumer: Any) -> dict[tuple[str, int], int]:
        """Records between the last completed checkpoint's ends and the last stable offsets."""
        ends = self._on_mailbox(lambda: dict(self._enumerator.committed_end))
        lag = {}
        for tp, start in sorted(ends.items()):
            high = consumer.get_watermark_offsets(TopicPartition(*tp), timeout=30, cached=False)[1]
            lag[tp] = max(0, high - start)
        return lag

    def _ranges(self, checkpoint_id: int, future: Any, timeout_s: float) -> dict[tuple[str, int], KafkaPartitionSplit]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            ranges = self._on_mailbox(lambda: self._enumerator.ranges_of(checkpoint_id))
            if ranges:
                return ranges
            if future.done():
                future.result()  # raises the reason it failed
                return {}
            time.sleep(0.005)
        raise PipelineError(f"the offset ranges of checkpoint {checkpoint_id} were not fixed within {timeout_s} s")

    def _decode(self, spark: Any, df: Any, sample: list[bytes]) -> Any:
        from pyspark.sql import functions as F

        opts = self.options
        keep = [c for c in KAFKA_COLUMNS if c != "value" or opts.keep_raw_value]
        if opts.value_format == "json":
            if opts.value_schema:
                schema = opts.value_schema
                fields = [f.strip().split()[0] for f in opts.value_schema.split(",")]
            else:
                if not sample:
                    raise PipelineError("cannot infer the JSON value schema: the first micro-batch has no records")
                inferred = spark.read.json(spark.sparkContext.parallelize([v.decode("utf-8", "replace") for v in sample]))
                schema, fields = inferred.schema, inferred.schema.fieldNames()
            parsed = df.withColumn("__value", F.from_json(F.col("value").cast("string"), schema))
            return parsed.select(*keep, *[F.col(f"__value.{f}").alias(f if f not in KAFKA_COLUMNS else f"value_{f}")
                                          for f in fields])
        if opts.value_format == "avro":
            from connectors.spark.avro import decode_avro_values

            return decode_avro_values(df, opts.value_schema, opts.avro_framing, keep)
        return df

    def _sample(self, ranges: dict[tuple[str, int], KafkaPartitionSplit], limit: int = 1000) -> list[bytes]:
        reader = KafkaRangeReader(self.options.bootstrap_servers, self.options.consumer_overrides)
        values: list[bytes] = []
        try:
            for split in ranges.values():
                for message in reader.read(split):
                    if message.value() is not None:
                        values.append(message.value())
                    if len(values) >= limit:
                        return values
        finally:
            reader.close()
        return values

    def _run_micro_batch(self, spark: Any, checkpoint_id: int, ranges: dict, state: dict) -> None:
        from connectors.spark.datasource import LAKE_FILES_FORMAT, RANGES_FORMAT

        assignment = self._on_mailbox(self._enumerator.assignment)
        per_subtask = [[[s.topic, s.partition, ranges[s.topic_partition].starting_offset,
                         ranges[s.topic_partition].stopping_offset]
                        for s in assignment.get(i, []) if s.topic_partition in ranges
                        and ranges[s.topic_partition].num_records > 0]
                       for i in range(self.parallelism)]
        opts = self.options
        task_options = {
            "table_uri": opts.table_uri, "partition_by": json.dumps(list(opts.partition_by)),
            "storage_options": json.dumps(dict(opts.storage_options)), "job_id": self.job_id,
            "checkpoint_id": str(checkpoint_id), "epoch": str(self.service.coordinator.epoch),
            "operator_id": SINK_OPERATOR, "bootstrap_servers": opts.bootstrap_servers, "prefix": opts.prefix,
            "producer_overrides": json.dumps(dict(opts.producer_overrides)),
            "consumer_overrides": json.dumps(dict(opts.consumer_overrides)),
            "max_task_failures": spark.conf.get("spark.task.maxFailures", "1"),
        }
        if opts.value_format is None and self._transform is None:
            # nothing for Spark SQL to do: each task reads, writes and acknowledges in one Python
            # worker, sparing the batches a round trip through the JVM
            from connectors.spark.datasource import read_write_and_acknowledge

            # one element per slice: partition i is subtask i, with its ranges
            (spark.sparkContext.parallelize(per_subtask, self.parallelism)
             .mapPartitionsWithIndex(read_write_and_acknowledge(task_options)).collect())
            return
        df = (spark.read.format(RANGES_FORMAT).options(**task_options)
              .option("ranges", json.dumps(per_subtask)).load())
        if opts.value_format == "json" and not opts.value_schema and "json_sample" not in state:
            state["json_sample"] = self._sample(ranges)
        df = self._decode(spark, df, state.get("json_sample", []))
        if self._transform is not None:
            df = self._transform(df)
            partitions = df.rdd.getNumPartitions()
            if partitions > self.parallelism:
                df = df.coalesce(self.parallelism)
            elif partitions < self.parallelism:
                df = df.repartition(self.parallelism)
        df.write.format(LAKE_FILES_FORMAT).mode("append").options(**task_options).save()

    def run(self, on_progress: Callable[[PipelineProgress], None] | None = None) -> PipelineSummary:
        """Run until drained (``stop_when_drained``), ``max_checkpoints``, :meth:`request_stop`, or a failure.

        Raises:
            PipelineError: the topics are missing, or the job failed (too many failed checkpoints).
        """
        opts = self.options
        started = time.monotonic()
        partitions = self._partitions()
        self.parallelism = opts.parallelism or max(1, len(partitions))
        spark = self._spark_session()
        from connectors.spark.datasource import KafkaRangesDataSource, LakeFilesDataSource

        spark.dataSource.register(KafkaRangesDataSource)
        spark.dataSource.register(LakeFilesDataSource)
        self.service = self._start_coordinator()
        consumer = kafka_config.consumer(opts.bootstrap_servers, overrides=dict(opts.consumer_overrides))
        completed = failed = 0
        landed_before = self._on_mailbox(lambda: self._committer.records_committed)
        state: dict[str, Any] = {}
        stopped_because = "stopped"
        try:
            deadline = time.monotonic() + 60
            while not self._on_mailbox(lambda: len(self._enumerator.splits)):
                if time.monotonic() > deadline:
                    raise PipelineError("partition discovery found no partitions within 60 s")
                time.sleep(0.05)
            while True:
                if self._stop.is_set():
                    stopped_because = "stopped on request"
                    break
                if self.service.job_status == "FAILED" or self.service.stopped.is_set():
                    raise PipelineError(f"job {self.job_id} failed: {self.service.coordinator.state.job_status_reason}")
                if opts.max_checkpoints is not None and completed >= opts.max_checkpoints:
                    stopped_because = f"{opts.max_checkpoints} checkpoints done"
                    break
                lag = self.lag(consumer)
                if sum(lag.values()) == 0:
                    if opts.stop_when_drained:
                        stopped_because = "drained"
                        break
                    self._stop.wait(max(0.2, opts.checkpoint_interval_ms / 1000))
                    continue
                batch_started = time.monotonic()
                future = self.service.trigger_checkpoint()
                checkpoint_id = future.checkpoint_id or -1  # None: refused before it got an ID
                message = None
                records = 0
                spark_job_ms = 0.0
                try:
                    ranges = self._ranges(checkpoint_id, future, opts.checkpoint_timeout_ms / 1000)
                    records = sum(r.num_records for r in ranges.values())
                    job_started = time.monotonic()
                    try:
                        self._run_micro_batch(spark, checkpoint_id, ranges, state)
                    except Exception as exc:  # noqa: BLE001 - abort now rather than wait for the timeout
                        message = f"Spark job failed: {exc}".splitlines()[0]
                        log.error("checkpoint %d: %s", checkpoint_id, message)
                        self.service.abort_checkpoint(checkpoint_id, CheckpointFailureReason.CHECKPOINT_DECLINED, message)
                    spark_job_ms = (time.monotonic() - job_started) * 1000
                    future.result(opts.checkpoint_timeout_ms / 1000 + 10)
                    completed += 1
                except CheckpointException as exc:
                    failed += 1
                    message = message or str(exc)
                    log.warning("checkpoint %d failed: %s", checkpoint_id, exc)
                landed = self._on_mailbox(lambda: self._committer.records_committed) - landed_before
                if on_progress is not None:
                    on_progress(PipelineProgress(
                        checkpoint_id, message is None, records, landed, completed, failed,
                        (time.monotonic() - batch_started) * 1000, time.monotonic() - started,
                        self.lag(consumer), message, spark_job_ms))
                pause = opts.checkpoint_interval_ms / 1000 - (time.monotonic() - batch_started)
                if pause > 0:
                    self._stop.wait(pause)
        finally:
            consumer.close()
            self.service.stop()
            if self._spark is None:
                spark.stop()
        return PipelineSummary(opts.table_uri, self.job_id, self._committer.records_committed - landed_before,
                               completed, failed, time.monotonic() - started, stopped_because=stopped_because)


def verify_table(sink: DeltaLakeSink, bootstrap_servers: str, topics: list[str],
                 consumer_overrides: Mapping[str, Any] | None = None) -> tuple[int, int, int]:
    """Compare the committed table with the source topics: (rows in the table, duplicates, missing).

    A duplicate is a (topic, partition, offset) present more than once; a missing record is one
    readable in the topic (read_committed, up to the last stable offset) that is not in the table.
    Reads the table with pyarrow through deltalake, not with the writer.
    """
    table = sink.read_table().select(["topic", "partition", "offset"]) if sink.exists() else None
    rows = 0 if table is None else table.num_rows
    present: set[tuple[str, int, int]] = set()
    if table is not None:
        for t, p, o in zip(*(table.column(c).to_pylist() for c in ("topic", "partition", "offset"))):
            present.add((t, p, o))
    duplicates = rows - len(present)
    admin = kafka_config.admin_client(bootstrap_servers)
    metadata = admin.list_topics(timeout=30)
    consumer = kafka_config.consumer(bootstrap_servers, overrides=consumer_overrides)
    reader = KafkaRangeReader(bootstrap_servers, consumer_overrides)
    missing = 0
    try:
        for topic in topics:
            for partition in metadata.topics[topic].partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30, cached=False)
                for message in reader.read(KafkaPartitionSplit(topic, partition, low, high)):
                    if (topic, partition, message.offset()) not in present:
                        missing += 1
    finally:
        reader.close()
        consumer.close()
    return rows, duplicates, missing

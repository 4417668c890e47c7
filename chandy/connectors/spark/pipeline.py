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

A failed or aborted checkpoint commits nothing; the next one reads its ranges again, after an
exponential back-off (Flink's exponential-delay restart strategy). After a crash anywhere, the next
start replays the coordinator log, restores the latest completed checkpoint (committing it to the
table if it was not yet: restoring implies completion; a repeated commit is skipped by its app
transaction), deletes unreferenced files, and continues from that checkpoint's ends: every record
lands exactly once.

The table is the truth about what landed. Before Spark starts, :meth:`Pipeline.preflight` checks
the brokers, the Kafka settings, the table's location and schema, and reconciles:

1. the table's commits record, per job, the end offset of every (topic, partition) they cover;
   another job that landed one of this job's partitions into the table is an error;
2. the coordinator log is read (read-only); when it holds no completed checkpoint at or after the
   table's (lost, recreated, or a new Kafka cluster with the same topics), the job resumes from
   the table's offsets and says so in one line (``resume_from_table=False`` refuses instead);
3. checkpoint IDs continue above the table's newest (Flink's ``CheckpointIDCounter.setCount``),
   no range starts below the table's offsets (the source's ``offset_floor``), and a consumer group
   ahead of the table is moved back to it: offsets are never committed past what the table holds.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import json
import logging
import os
import queue
import random
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition

from chandy.connectors.kafka.source import offsets as offsets_module
from chandy.connectors.kafka.source.enumerator import (
    KafkaSourceCoordinatorProvider,
    KafkaSourceEnumeratorState,
    KafkaSourceOptions,
)
from chandy.connectors.kafka.source.reader import KafkaRangeReader
from chandy.connectors.kafka.source.split import KafkaPartitionSplit
from chandy.connectors.kafka.source.subscriber import subscribed_topics
from chandy.connectors.lake.committer import LakeCommitterProvider, OffsetRanges
from chandy.connectors.lake.sink import TP, LakeSchemaError, TableProgress
from chandy.connectors.lake.sinks import LakeSink, open_sink
from chandy.connectors.spark.cluster import (
    default_parallelism,
    executor_python,
    is_local_master,
    load_transform,
    root_cause,
    task_code_zip,
    task_max_failures,
    warm_task,
)
from chandy.connectors.spark.decode import KAFKA_COLUMNS, ValueDecoder
from chandy.connectors.spark.options import (
    DETERMINISTIC_ERRORS,
    SINK_OPERATOR,
    SOURCE_OPERATOR,
    PipelineError,
    PipelineFencedError,
    PipelineKafkaError,
    PipelineOptions,
    PipelineProgress,
    PipelineSummary,
)
from chandy.connectors.type_mapping import inferred_json_type
from chandy.coordinator import faults
from chandy.coordinator.environment import OutboundMessage
from chandy.coordinator.errors import ChandyError
from chandy.coordinator.failure import CheckpointException, CheckpointFailureReason
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.election import LeaderElection
from chandy.coordinator.kafka.log_writer import CoordinatorFencedError
from chandy.coordinator.kafka.requests import ControlRequest, ControlRequestType, RequestOutcome
from chandy.coordinator.kafka.runtime import CoordinatorService, JobTerminatedError
from chandy.coordinator.kafka.topics import ChandyTopics, OffsetsUnavailableError, ensure_topics, watermark_offsets
from chandy.coordinator.options import CheckpointingOptions
from chandy.coordinator.storage import CheckpointMetadata, CheckpointStorage

log = logging.getLogger(__name__)


def _stop_spark(spark: Any) -> None:
    """Stop the session this run started. Its JVM may be gone already: a SIGTERM or Ctrl-C to the
    driver's process group reaches Spark's JVM too, and the driver then stops cleanly (exit 143 /
    130) instead of failing on py4j's refused connection."""
    from py4j.protocol import Py4JError

    try:
        spark.stop()
    except (ConnectionError, OSError, Py4JError) as exc:  # the JVM is gone
        log.info("Spark's JVM was gone at stop: %s", exc)


class Pipeline:
    """One run of the pipeline (see the module docstring). Not reusable after :meth:`run`."""

    def __init__(self, options: PipelineOptions, *, spark: Any = None) -> None:
        self.options = options
        self.job_id = options.resolved_job_id
        self._spark = spark
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.stop_signal: int | None = None
        # schema evolution: decoded value fields the table lacks become columns (never the raw
        # Kafka columns of a table landed otherwise)
        self.add_columns = options.schema_evolution and options.value_format is not None
        self.sink: LakeSink = open_sink(options.table_uri, partition_by=options.partition_by,
                                        storage_options=options.storage_options,
                                        catalog_properties=options.catalog_properties, add_columns=self.add_columns)
        self._transform = load_transform(options.transform) if options.transform else None
        self.service: CoordinatorService | None = None
        self.parallelism = 0
        self.topic_names: list[str] = list(options.topics)
        self.partitions: list[TP] = []
        self.notices: list[str] = []
        self.table_progress: TableProgress | None = None
        self.table_fields: dict[str, Any] | None = None
        self.cluster_id: str | None = None
        self.decoder: ValueDecoder | None = None
        self.bad_records = 0
        self.dead_lettered = 0
        self._checkpoint_id_floor: int | None = None
        self._preflight_done = False
        self._static_checked = False
        self._data_sources_registered = False
        self._requests: queue.Queue[tuple[ControlRequest, concurrent.futures.Future]] = queue.Queue()
        self._draining: tuple[ControlRequest, concurrent.futures.Future] | None = None
        # requests taken off the queue by the driver loop, in arrival order (driver thread only)
        self._backlog: collections.deque[tuple[ControlRequest, concurrent.futures.Future]] = collections.deque()
        self.election: LeaderElection | None = None
        self.takeover_s: float | None = None
        self._last_committed = 0

    def request_stop(self, signum: int | None = None) -> None:
        """Finish (or abort) the checkpoint in flight and stop; callable from any thread or signal handler."""
        if signum is not None and self.stop_signal is None:
            self.stop_signal = signum
        self._stop.set()

    def _notice(self, message: str) -> None:
        self.notices.append(message)
        log.warning("%s", message)

    # -- preflight: everything checked before Spark starts --------------------------------------
    def preflight(self) -> None:
        """Check and reconcile before Spark starts (see the module docstring).

        Raises:
            PipelineError: unreachable brokers, an unknown Kafka setting, missing topics, an
                unwritable table location, a schema that does not fit the table, another job's
                data in the table, a table from another Kafka cluster, or (with
                ``resume_from_table=False``) a coordinator log behind the table.
        """
        if self._preflight_done:
            return
        opts = self.options
        started = time.monotonic()
        self.check_static()
        self.decoder = self._decoder_from_known_schema()
        if self._transform is None and (opts.value_format is None or self.decoder is not None):
            self._check_output_schema(self._output_schema())
        checked = time.monotonic()
        self._reconcile()
        self._preflight_done = True
        log.info("job %s: preflight %.2f s (checks %.2f s, reconciling the table and the log %.2f s)", self.job_id,
                 time.monotonic() - started, checked - started, time.monotonic() - checked)

    def check_static(self) -> None:
        """The checks that do not read what a running job changes (Kafka reachable, the settings,
        the source topics, the table location), once: a ``--standby`` runs them before it waits,
        so a misconfigured standby fails at once and its take-over does not pay them.

        Raises:
            PipelineError: as :meth:`preflight`.
        """
        if self._static_checked:
            return
        self._check_kafka()
        self._check_table_location()
        self._warn_local_paths_on_a_cluster()
        self._static_checked = True

    def _check_kafka(self) -> None:
        opts = self.options
        for what, make in (("-X (consumer)", lambda: kafka_config.consumer(opts.bootstrap_servers,
                                                                           overrides=dict(opts.consumer_overrides))),
                           ("--producer-property", lambda: kafka_config.producer(
                               opts.bootstrap_servers, overrides=opts.driver_producer_overrides)),
                           ("--worker-property", lambda: kafka_config.producer(
                               opts.bootstrap_servers, overrides=opts.task_producer_overrides))):
            try:
                client = make()
            except KafkaException as exc:
                raise PipelineError(f"{what} setting refused by librdkafka: {exc.args[0].str() if exc.args else exc}") from exc
            except (TypeError, ValueError) as exc:
                raise PipelineError(f"{what} setting refused by librdkafka: {exc}") from exc
            if hasattr(client, "close"):
                client.close()
        admin = kafka_config.admin_client(opts.bootstrap_servers, {"socket.connection.setup.timeout.ms": 10_000,
                                                                   **kafka_config.security_settings(opts.consumer_overrides)})
        try:
            metadata = admin.list_topics(timeout=15)
            self.cluster_id = metadata.cluster_id
        except KafkaException as exc:
            raise PipelineError(f"cannot reach Kafka at {opts.bootstrap_servers} within 15 s: "
                                f"{exc.args[0].str() if exc.args else exc}") from exc
        available = [t for t, m in metadata.topics.items() if m.error is None]
        if opts.topics:
            missing = [t for t in opts.topics if t not in available]
            if missing:
                hidden = (" (or not visible to this principal: give it READ on them, `chandy topics acls --source-topic`)"
                          if kafka_config.security_settings(opts.consumer_overrides) else "")
                raise PipelineError(f"topic(s) not found on {opts.bootstrap_servers}: {', '.join(missing)}{hidden}")
        self.topic_names = subscribed_topics(available, opts.topics, opts.topic_pattern)
        if not self.topic_names:
            raise PipelineError(f"no topic matches {opts.topic_pattern!r} on {opts.bootstrap_servers}")
        self.partitions = [(t, p) for t in self.topic_names for p in sorted(metadata.topics[t].partitions)]
        if opts.dead_letter_topic and opts.dead_letter_topic not in available:
            raise PipelineError(f"dead-letter topic {opts.dead_letter_topic} not found on {opts.bootstrap_servers} "
                                "(create it first, with the retention you want for bad records)")
        if kafka_config.security_settings(opts.task_consumer_overrides):
            self._check_access()

    def _check_access(self) -> None:
        """On a secured cluster, before Spark starts: the tasks' principal may READ the source
        partitions, and the driver's may use the consumer group its offsets are committed to
        (which would otherwise fail at each checkpoint with a warning only).

        Raises:
            PipelineError: an authorization error, naming the principal, the resource and the ACL.
        """
        from chandy.connectors.kafka.source.reader import SourceAuthorizationError, check_read_access

        opts = self.options
        tasks = opts.task_consumer_overrides
        try:
            check_read_access(opts.bootstrap_servers, self.partitions, tasks)
        except SourceAuthorizationError as exc:
            raise PipelineError(f"the Spark tasks' principal ({tasks.get('sasl.username', 'from -X/--worker-property')}) "
                                f"may not read the source: {exc}; grant it with `chandy topics acls --worker ... "
                                "--source-topic ...`") from exc
        group = opts.resolved_group_id
        admin = kafka_config.admin_client(opts.bootstrap_servers, kafka_config.security_settings(opts.consumer_overrides))
        request = ConsumerGroupTopicPartitions(group, [TopicPartition(t, p) for t, p in self.partitions])
        refused: list[KafkaError] = []
        try:  # OffsetFetch: what the enumerator's commits need first (DESCRIBE on the group, READ grants it)
            answer = admin.list_consumer_group_offsets([request], request_timeout=30)[group].result()
            refused = [tp.error for tp in answer.topic_partitions if tp.error is not None]
        except KafkaException as exc:
            refused = [exc.args[0] if exc.args else KafkaError(KafkaError._FAIL)]
        if refused:
            raise PipelineError(
                f"the driver's principal ({opts.consumer_overrides.get('sasl.username', 'from -X')}) may not use consumer "
                f"group {group} (offset commits on checkpoint completion): {refused[0].str()}; grant it with "
                f"`chandy topics acls --coordinator ... --group {group}`")

    def _check_table_location(self) -> None:
        try:
            self.table_fields = self.sink.table_fields()
        except Exception as exc:  # delta-rs and fsspec raise many types
            raise PipelineError(f"cannot read table {self.sink.table_uri}: {root_cause(exc)}") from exc
        probe = f"{self.sink.root}/_chandy_write_probe_{uuid.uuid4().hex[:8]}"
        try:
            self.sink.fs.makedirs(self.sink.root, exist_ok=True)
            with self.sink.fs.open(probe, "wb") as handle:
                handle.write(b"chandy")
            self.sink.fs.rm(probe)
        except Exception as exc:  # every storage error means "not writable"
            raise PipelineError(f"table location {self.sink.table_uri} is not writable: {exc}") from exc

    def _warn_local_paths_on_a_cluster(self) -> None:
        """Tasks write the table's files (and bad records) where the driver then commits them
        from: off a local master, a local-filesystem path works only when every executor sees the
        driver's directory (one machine, or a shared mount); say so once, before Spark starts."""
        opts = self.options
        if is_local_master(opts.master):
            return
        protocol = self.sink.fs.protocol
        local = []
        if {"file", "local"} & set(protocol if isinstance(protocol, (tuple, list)) else (protocol,)):
            local.append(f"table {self.sink.table_uri}")
        checkpoint_dir = opts.resolved_checkpoint_dir
        if checkpoint_dir.startswith(("file:", "local:")) or "://" not in checkpoint_dir:
            local.append(f"checkpoint directory {checkpoint_dir}")
        if local:
            log.warning("%s on the local filesystem with master %s: the driver and every executor must see the same "
                        "directory (one machine, or a shared mount); on a cluster use shared storage (s3://, "
                        "abfss://, gs://, hdfs://)", " and ".join(local), opts.master)

    def _value_columns(self, struct: Any) -> tuple[pa.Schema, tuple[str, ...]]:
        """Spark StructType of the value -> (landed Arrow columns, names in the value)."""
        from pyspark.sql.pandas.types import to_arrow_schema

        arrow = to_arrow_schema(struct, timezone="UTC")
        renamed = [f.with_name(f"value_{f.name}") if f.name in KAFKA_COLUMNS else f for f in arrow]
        return pa.schema(renamed), tuple(f.name for f in arrow)

    def _make_decoder(self, columns: pa.Schema, names: tuple[str, ...], unknown_fields: str) -> ValueDecoder:
        opts = self.options
        keep = tuple(c for c in KAFKA_COLUMNS if c != "value" or opts.keep_raw_value)
        return ValueDecoder(opts.value_format or "json", columns, names, keep, avro_schema=opts.value_schema
                            if opts.value_format == "avro" else None, avro_framing=opts.avro_framing,
                            avro_schema_id=opts.avro_schema_id, unknown_fields=unknown_fields,
                            tombstones=opts.tombstones, errors_tolerance=opts.errors_tolerance,
                            schema_registry=tuple(sorted(opts.schema_registry.items())))

    def _decoder_from_known_schema(self) -> ValueDecoder | None:
        """The decoder when the value's columns are known before reading: a DDL, an Avro schema,
        or (inferred JSON) an existing table's columns. None: JSON to infer from the first batch."""
        opts = self.options
        if opts.value_format is None:
            return None
        if opts.value_format == "avro":
            from chandy.connectors.spark.avro import value_struct

            columns, names = self._value_columns(value_struct(opts.value_schema or ""))
            return self._make_decoder(columns, names, "ignore")
        if opts.value_schema:
            from chandy.connectors.spark.ddl import parse_ddl

            columns, names = self._value_columns(parse_ddl(opts.value_schema))
            return self._make_decoder(columns, names, "ignore")
        if self.table_fields is not None and self._transform is None:
            from deltalake import Schema as DeltaSchema

            value_fields = [{"name": n, "type": t, "nullable": True, "metadata": {}}
                            for n, t in self.table_fields.items() if n not in KAFKA_COLUMNS]
            arrow = pa.schema(DeltaSchema.from_json(json.dumps({"type": "struct", "fields": value_fields})).to_arrow())
            names = tuple(f.name[len("value_"):] if f.name.startswith("value_") and f.name[6:] in KAFKA_COLUMNS
                          else f.name for f in arrow)
            return self._make_decoder(arrow, names, self._unknown_fields)
        return None

    def _output_schema(self) -> pa.Schema:
        from chandy.connectors.spark.records import ARROW_SCHEMA

        return self.decoder.output_schema if self.decoder is not None else ARROW_SCHEMA

    def _check_output_schema(self, schema: pa.Schema) -> None:
        try:
            self.sink.check_schema(schema, self.table_fields)
        except LakeSchemaError as exc:
            raise PipelineError(str(exc)) from exc

    def _reconcile(self) -> None:
        """Steps 1 to 3 of the module docstring."""
        from chandy.coordinator.kafka.log import load_state

        opts = self.options
        progress = self.sink.progress(self.job_id)
        self.table_progress = progress
        mine = set(self.partitions)
        for other, offsets in sorted(progress.other_jobs.items()):
            shared = sorted(mine & set(offsets))
            if shared:
                topic, partition = shared[0]
                raise PipelineError(
                    f"table {self.sink.table_uri} already holds {topic}-{partition} (and {len(shared) - 1} more "
                    f"partition(s)) landed by job {other}; two jobs landing one partition would duplicate it: "
                    f"pass --job-id {other} to resume that job")
        if progress.checkpoint_id is None:
            return
        if progress.cluster_id and self.cluster_id and progress.cluster_id != self.cluster_id:
            raise PipelineError(
                f"table {self.sink.table_uri} was landed by job {self.job_id} from Kafka cluster {progress.cluster_id}, "
                f"but {opts.bootstrap_servers} is cluster {self.cluster_id}: offsets do not carry over between "
                "clusters; land this cluster's topics with a new --job-id (or into a new table)")
        topics = ChandyTopics(opts.prefix)
        ensure_topics(kafka_config.admin_client(opts.bootstrap_servers, kafka_config.security_settings(opts.consumer_overrides)), topics)
        state, _ = load_state(opts.bootstrap_servers, topics.coordinator_log, self.job_id,
                              consumer_overrides=dict(opts.consumer_overrides), timeout_s=60)
        completed = state.completed(savepoints=False)
        latest = completed[-1].checkpoint_id if completed else None
        self._checkpoint_id_floor = progress.checkpoint_id + 1
        if latest is None or latest < progress.checkpoint_id:
            where = ", ".join(f"{t}-{p}@{o}" for (t, p), o in sorted(progress.offsets.items())[:6])
            more = "" if len(progress.offsets) <= 6 else f" and {len(progress.offsets) - 6} more"
            log_state = "has no completed checkpoint" if latest is None else f"ends at checkpoint {latest}"
            if not opts.resume_from_table:
                raise PipelineError(
                    f"the coordinator log of job {self.job_id} {log_state} but table {self.sink.table_uri} holds "
                    f"checkpoint {progress.checkpoint_id}; refusing to guess (--no-resume-from-table)")
            if latest is None:
                self._notice(f"the coordinator log of job {self.job_id} has no completed checkpoint, the table holds "
                             f"checkpoint {progress.checkpoint_id}: resuming from the table's offsets ({where}{more}); "
                             f"checkpoint IDs continue at {progress.checkpoint_id + 1}")
            else:  # the normal case after a stop between the lake commit and its log record
                self._notice(f"the table already holds checkpoint {progress.checkpoint_id}, ahead of the coordinator "
                             f"log at {latest} (it was committed to the lake just before the last run stopped): "
                             f"resuming from the table ({where}{more}); checkpoint IDs continue at "
                             f"{progress.checkpoint_id + 1}")
        self._rewind_group_past_table(progress.offsets)

    def _rewind_group_past_table(self, table_offsets: Mapping[TP, int]) -> None:
        """A consumer group ahead of the table is moved back to the table's offsets."""
        opts = self.options
        if not table_offsets:
            return
        consumer = kafka_config.consumer(opts.bootstrap_servers, group_id=opts.resolved_group_id,
                                         overrides=dict(opts.consumer_overrides))
        try:
            committed = consumer.committed([TopicPartition(t, p) for t, p in sorted(table_offsets)], timeout=30)
            ahead = [TopicPartition(tp.topic, tp.partition, table_offsets[(tp.topic, tp.partition)])
                     for tp in committed if tp.offset >= 0 and tp.offset > table_offsets[(tp.topic, tp.partition)]]
            if ahead:
                consumer.commit(offsets=ahead, asynchronous=False)
                self._notice(f"consumer group {opts.resolved_group_id} was ahead of the table on {len(ahead)} "
                             "partition(s): moved back to the table's offsets")
        finally:
            consumer.close()

    # -- setup -------------------------------------------------------------------------------------
    def _spark_session(self) -> Any:
        if self._spark is not None:
            return self._spark
        from pyspark.sql import SparkSession

        # the executors' Python workers must import the tasks' packages (see executor_python)
        python = executor_python(self.options.master, self.options.spark_conf, os.environ)
        if python:
            os.environ["PYSPARK_PYTHON"] = python
        if self._transform is not None:
            self._check_planner_python(python or "python3")
        if os.environ.get(faults.ENV):
            os.environ[faults.PGID_ENV] = str(os.getpgid(0))  # a crash point in a task kills the driver too
        builder = (SparkSession.builder.master(self.options.master).appName(f"chandy-pipeline-{self.job_id[:8]}")
                   .config("spark.ui.showConsoleProgress", "false"))
        for key, value in self.options.spark_conf.items():
            builder = builder.config(key, value)
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("WARN")
        if self.options.resolved_ship_code:
            code = task_code_zip()
            spark.sparkContext.addPyFile(code)  # every executor fetches it before its first task
            log.info("shipped %s to the executors; their Python: %s", os.path.basename(code),
                     os.environ.get("PYSPARK_PYTHON", "python3"))
        return spark

    def _register_data_sources(self, spark: Any) -> None:
        """Register the two data sources with ``spark`` once (Spark 4 looks Python data sources up
        in a Python worker: about two seconds a warm standby spends before it leads, not after)."""
        if self._data_sources_registered:
            return
        from chandy.connectors.spark.datasource import KafkaRangesDataSource, LakeFilesDataSource

        spark.dataSource.register(KafkaRangesDataSource)
        spark.dataSource.register(LakeFilesDataSource)
        self._data_sources_registered = True

    def _warm_python_workers(self, spark: Any) -> None:
        """A standby's Spark runs one task per slot that imports the tasks' modules and creates their
        pooled Kafka clients (:func:`~chandy.connectors.spark.cluster.warm_task`), so its first
        micro-batch after a take-over reuses started Python workers (``spark.python.worker.reuse``,
        on by default) instead of paying their start, imports and connections (about a second)."""
        slots = max(1, spark.sparkContext.defaultParallelism)
        opts = self.options
        warm = functools.partial(warm_task, opts.bootstrap_servers, self.job_id, opts.prefix,
                                 dict(opts.task_consumer_overrides), dict(opts.task_producer_overrides))
        try:
            spark.sparkContext.parallelize(range(slots), slots).foreach(warm)
        except Exception as exc:  # noqa: BLE001 - only an optimization: the first micro-batch starts them anyway
            log.warning("could not warm the standby's Python workers: %s", root_cause(exc))

    def _check_planner_python(self, python: str) -> None:
        """With a transform, the micro-batch reads and writes through Python data sources, which
        Spark plans on the driver in a Python worker started with the executors' Python path,
        from this process's directory (``PythonPlannerRunner``): that path must run here too.

        Raises:
            PipelineError: it does not (e.g. ``./environment/bin/python`` of an archive that only
                the executors unpack).
        """
        import shutil

        found = os.path.isfile(python) if os.sep in python else shutil.which(python) is not None
        if not found:
            raise PipelineError(
                f"--transform: Spark plans the transform's data sources on the driver with the executors' Python "
                f"{python!r}, which does not exist from {os.getcwd()}; run from a directory where it does (the "
                "environment archive unpacked there, or a link to an environment with Chandy's dependencies)")

    def offsets_of(self, metadata: CheckpointMetadata) -> OffsetRanges:
        """The offset ranges checkpoint ``metadata`` covers, from the Kafka source's state in it."""
        operator = metadata.operator(SOURCE_OPERATOR)
        if operator is None or operator.coordinator_state is None:
            return {}
        state = KafkaSourceEnumeratorState.deserialize(operator.coordinator_state)
        return {r.topic_partition: (r.starting_offset, r.stopping_offset) for r in state.ranges
                if r.stopping_offset is not None}

    def completion_outputs(self, metadata: CheckpointMetadata) -> list[OutboundMessage]:
        """On the I/O executor, before checkpoint N completes: its bad records, as dead letters
        published in N's completion transaction (see :mod:`chandy.connectors.spark.dead_letters`)."""
        from chandy.connectors.spark.dead_letters import delete_dead_letters_before, read_dead_letters, to_messages

        opts = self.options
        if opts.value_format is None:
            return []
        checkpoint_dir, checkpoint_id = opts.resolved_checkpoint_dir, metadata.checkpoint_id
        bad = read_dead_letters(checkpoint_dir, self.job_id, checkpoint_id, opts.storage_options)
        delete_dead_letters_before(checkpoint_dir, self.job_id, checkpoint_id, opts.storage_options)
        if bad.num_rows == 0:
            return []
        first = bad.slice(0, 1).to_pylist()[0]
        self.bad_records += bad.num_rows
        where = "published to " + opts.dead_letter_topic if opts.dead_letter_topic else "skipped"
        log.warning("checkpoint %d: %d bad record(s) %s; first: topic %s partition %d offset %d: %s: %s",
                    checkpoint_id, bad.num_rows, where, first["topic"], first["partition"], first["offset"],
                    first["error_class"], first["error_message"])
        if not opts.dead_letter_topic:
            return []
        self.dead_lettered += bad.num_rows
        return to_messages(bad, opts.dead_letter_topic, f"chandy-{self.job_id}")

    def _start_coordinator(self) -> CoordinatorService:
        opts = self.options
        initializer = {"earliest": offsets_module.earliest(), "latest": offsets_module.latest(),
                       "committed": offsets_module.committed("earliest")}[opts.starting_offsets]
        floor = dict(self.table_progress.offsets) if self.table_progress is not None else {}
        source = KafkaSourceOptions(
            opts.bootstrap_servers, topics=tuple(opts.topics), topic_pattern=opts.topic_pattern,
            group_id=opts.resolved_group_id, starting_offsets=initializer,
            max_records_per_checkpoint=opts.max_records_per_checkpoint, consumer_overrides=dict(opts.consumer_overrides),
            offset_floor=floor)
        savepoint_dir = f"{opts.resolved_checkpoint_dir.rstrip('/')}/savepoints"
        storage = CheckpointStorage(opts.resolved_checkpoint_dir, self.job_id, savepoint_dir=savepoint_dir,
                                    storage_options=dict(opts.storage_options))
        service = CoordinatorService(
            self.job_id, opts.bootstrap_servers,
            CheckpointingOptions(interval_ms=0, timeout_ms=opts.checkpoint_timeout_ms, max_concurrent=1,
                                 tolerable_failed=opts.tolerable_failed_checkpoints, num_retained=2,
                                 checkpoint_dir=opts.resolved_checkpoint_dir, savepoint_dir=savepoint_dir,
                                 # the driver starts the subtasks (Spark tasks) for each checkpoint
                                 wait_for_running_subtasks=False),
            {SINK_OPERATOR: self.parallelism},
            # order matters: the lake commit happens before the offset commit (notification order)
            coordinator_providers=[LakeCommitterProvider(SINK_OPERATOR, self.sink, storage, offsets_of=self.offsets_of,
                                                         cluster_id=self.cluster_id, optimize_every=opts.optimize_every,
                                                         optimize_target_size=opts.optimize_target_size),
                                   KafkaSourceCoordinatorProvider(SOURCE_OPERATOR, source, parallelism=self.parallelism)],
            prefix=opts.prefix, producer_overrides=opts.driver_producer_overrides,
            consumer_overrides=dict(opts.consumer_overrides), storage_options=dict(opts.storage_options),
            completion_outputs=self.completion_outputs, checkpoint_id_floor=self._checkpoint_id_floor,
            restore_from=opts.from_savepoint, request_executor=self._execute_request, election=self.election,
            metrics_port=opts.metrics_port, standby=opts.standby, retry_timeout_s=opts.kafka_retry_timeout_ms / 1000,
        )
        try:
            return service.start(periodic=False)
        except JobTerminatedError as exc:
            service.stop()
            if opts.standby:
                raise  # run() ends the standby's run with it: nothing to take over
            raise PipelineError(str(exc)) from exc
        except ChandyError as exc:
            service.stop()
            raise PipelineError(f"job {self.job_id} cannot start: {exc}") from exc

    def _release_savepoint_ranges(self, checkpoint_id: int) -> None:
        """An intermediate savepoint's ranges are read again by the next checkpoint (nobody is
        notified of a savepoint's completion, so nothing commits its offsets)."""
        self._enumerator_call(lambda e: e.release_ranges(checkpoint_id))

    def _enumerator_call(self, func: Callable[[Any], Any]) -> Any:
        assert self.service is not None
        return self.service.call_operator_coordinator(SOURCE_OPERATOR, func)

    def _committed_records(self) -> int:
        assert self.service is not None
        self._last_committed = self.service.call_operator_coordinator(SINK_OPERATOR, lambda c: c.records_committed)
        return self._last_committed

    # -- the loop ------------------------------------------------------------------------------------
    def lag(self, consumer: Any) -> dict[tuple[str, int], int]:
        """Records between the last completed checkpoint's ends and the last stable offsets."""
        ends = self._enumerator_call(lambda e: dict(e.committed_end))
        lag = {}
        timeout_s = self.options.kafka_retry_timeout_ms / 1000
        for tp, start in sorted(ends.items()):
            try:
                high = watermark_offsets(consumer, TopicPartition(*tp), timeout_s=timeout_s)[1]
            except OffsetsUnavailableError as exc:  # a fatal error, or retriable ones past --kafka-retry-timeout
                raise PipelineKafkaError(f"reading the source's offsets failed: {exc}") from exc
            lag[tp] = max(0, high - start)
        return lag

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

    def _infer_decoder(self, ranges: dict[tuple[str, int], KafkaPartitionSplit]) -> ValueDecoder:
        """JSON without a schema or a table: infer the columns from up to 1,000 values of the
        first micro-batch (pyarrow's JSON inference); later fields without a column are bad."""
        import io

        from pyarrow import json as pa_json

        lines = []
        for raw in self._sample(ranges):
            try:
                value = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                continue
            if isinstance(value, dict):
                lines.append(json.dumps(value))
        if not lines:
            raise PipelineError("cannot infer the JSON value schema: the first micro-batch has no JSON object "
                                "(give --value-schema)")
        inferred = pa_json.read_json(io.BytesIO("\n".join(lines).encode())).schema
        inferred = pa.schema([f.with_type(inferred_json_type(f.type)) for f in inferred])
        renamed = [f.with_name(f"value_{f.name}") if f.name in KAFKA_COLUMNS else f for f in inferred]
        return self._make_decoder(pa.schema(renamed), tuple(f.name for f in inferred), self._unknown_fields)

    @property
    def _unknown_fields(self) -> str:
        """JSON fields without a column (columns inferred or from the table): new columns with
        schema evolution (not with a transform, whose Spark schema is fixed), else bad records."""
        return "add" if self.add_columns and self._transform is None else "error"

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

    def _task_options(self, spark: Any, checkpoint_id: int) -> Any:
        from chandy.connectors.spark.datasource import TaskOptions

        opts = self.options
        if self.table_fields is None or self.add_columns:  # columns added by the last commit count
            self.table_fields = self.sink.table_fields()
        zone = spark.conf.get("spark.sql.session.timeZone", None) or "UTC"
        if self.decoder is not None and self.decoder.session_time_zone != zone:  # JSON timestamps without an offset
            self.decoder = dataclasses.replace(self.decoder, session_time_zone=zone)
        assert self.service is not None
        return TaskOptions(
            table_uri=opts.table_uri, job_id=self.job_id, checkpoint_id=checkpoint_id, epoch=self.service.epoch,
            operator_id=SINK_OPERATOR, bootstrap_servers=opts.bootstrap_servers, prefix=opts.prefix,
            checkpoint_dir=opts.resolved_checkpoint_dir, partition_by=tuple(opts.partition_by),
            storage_options=dict(opts.storage_options), producer_overrides=opts.task_producer_overrides,
            consumer_overrides=opts.task_consumer_overrides,
            max_task_failures=task_max_failures(spark.sparkContext.master, spark.conf.get("spark.task.maxFailures", None)),
            table_fields=self.table_fields, decoder=self.decoder, catalog_properties=dict(opts.catalog_properties),
            add_columns=self.add_columns, table_location=getattr(self.sink, "root_url", None),
            write_buffer_bytes=opts.write_buffer_bytes)

    def _run_micro_batch(self, spark: Any, checkpoint_id: int, ranges: dict, counts: Any) -> None:
        from chandy.connectors.spark.datasource import LAKE_FILES_FORMAT, RANGES_FORMAT, TASK_OPTION, read_write_and_acknowledge

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
            (spark.sparkContext.parallelize(per_subtask, self.parallelism)
             .mapPartitionsWithIndex(read_write_and_acknowledge(task, counts)).collect())
            return
        df = (spark.read.format(RANGES_FORMAT).option(TASK_OPTION, task.encode())
              .option("ranges", json.dumps(per_subtask)).load())
        if self.decoder is not None:
            df = self._decode_frame(df, task, counts)
        df = self._transform(df)
        partitions = df.rdd.getNumPartitions()
        if partitions > self.parallelism:
            df = df.coalesce(self.parallelism)
        elif partitions < self.parallelism:
            df = df.repartition(self.parallelism)
        df.write.format(LAKE_FILES_FORMAT).mode("append").option(TASK_OPTION, task.encode()).save()

    @staticmethod
    def _decode_frame(df: Any, task: Any, counts: Any) -> Any:
        from pyspark.sql.pandas.types import from_arrow_schema

        from chandy.connectors.spark.datasource import decode_with_dead_letters, task_context

        def decode(batches: Any) -> Any:
            yield from decode_with_dead_letters(task, batches, task_context().partitionId(), counts)

        return df.mapInArrow(decode, from_arrow_schema(task.decoder.output_schema, prefer_timestamp_ntz=True))

    def _install_signal_handlers(self) -> dict[int, Any]:
        """Ctrl-C (SIGINT) and SIGTERM finish or abort the checkpoint in flight and stop; a
        second one stops at once. Installed after Spark starts, since PySpark's SparkContext
        replaces the SIGINT handler with its own."""
        if threading.current_thread() is not threading.main_thread():
            return {}

        def handler(signum: int, frame: Any) -> None:
            if self._stop.is_set():
                raise KeyboardInterrupt
            print(f"\n{signal.Signals(signum).name}: stopping after the checkpoint in flight "
                  "(again to stop at once)", file=sys.stderr)
            self.request_stop(signum)

        previous: dict[int, Any] = {}
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, handler)
        return previous

    def _fenced_message(self) -> str:
        from chandy.coordinator.kafka.log import load_state

        assert self.service is not None
        mine = self.service.epoch
        newer = mine
        deadline = time.monotonic() + 10
        while newer <= mine and time.monotonic() < deadline:
            try:
                state, _ = load_state(self.options.bootstrap_servers, ChandyTopics(self.options.prefix).coordinator_log,
                                      self.job_id, consumer_overrides=dict(self.options.consumer_overrides), timeout_s=10)
                newer = state.epoch
            except ChandyError:
                break
            if newer <= mine:
                time.sleep(0.5)
        epoch = f"epoch {newer}" if newer > mine else f"an epoch above {mine}"
        return f"job {self.job_id}: fenced by a newer coordinator ({epoch}); this run stopped writing"

    def run(self, on_progress: Callable[[PipelineProgress], None] | None = None, *,
            handle_signals: bool = False) -> PipelineSummary:
        """Run until drained (``stop_when_drained``), ``max_checkpoints``, :meth:`request_stop`, a
        signal (with ``handle_signals``), or a failure.

        Raises:
            PipelineError: a preflight check failed, a record or schema the job cannot land, or
                the job failed; the message names the root cause.
            PipelineFencedError: a newer coordinator of the job took over.
        """
        opts = self.options
        started = time.monotonic()
        if opts.standby:
            self.parallelism = opts.parallelism or 1
            self.check_static()  # a misconfigured standby fails now, not at its take-over
            warm = self._spark_session()  # a warm standby: Spark is up before it leads
            self._register_data_sources(warm)
            self._warm_python_workers(warm)
            if not self._stand_by():
                if self._spark is None:
                    _stop_spark(warm)
                return PipelineSummary(opts.table_uri, self.job_id, 0, 0, 0, time.monotonic() - started,
                                       stopped_because="stopped while standing by", signal=self.stop_signal)
        self.preflight()
        spark = self._spark_session()
        self.parallelism = opts.parallelism or default_parallelism(
            len(self.partitions), spark.sparkContext.master, spark.sparkContext.defaultParallelism)
        if self._spark is None and "spark.sql.shuffle.partitions" not in opts.spark_conf:
            spark.conf.set("spark.sql.shuffle.partitions", str(self.parallelism))  # a transform's shuffles
        previous_handlers = self._install_signal_handlers() if handle_signals else {}
        self._register_data_sources(spark)
        from pyspark.accumulators import AccumulatorParam

        class _Pair(AccumulatorParam):
            def zero(self, value: Any) -> tuple[int, int]:
                return (0, 0)

            def addInPlace(self, a: Any, b: Any) -> tuple[int, int]:  # PySpark's method name
                return (a[0] + b[0], a[1] + b[1])

        counts = spark.sparkContext.accumulator((0, 0), _Pair())
        try:
            self.service = self._start_coordinator()
        except JobTerminatedError as exc:  # a standby of a job that ended: it says why and exits 0
            self._restore_signal_handlers(previous_handlers)
            if self._spark is None:
                _stop_spark(spark)
            self._notice(str(exc))
            return PipelineSummary(opts.table_uri, self.job_id, 0, 0, 0, time.monotonic() - started,
                                   stopped_because=str(exc), signal=self.stop_signal, notices=tuple(self.notices))
        except BaseException:
            self._restore_signal_handlers(previous_handlers)
            if self._spark is None:
                _stop_spark(spark)
            raise
        metrics = None
        if self.service.metrics_server is not None:
            from chandy.connectors.spark.metrics import PipelineMetricsCollector

            service = self.service
            metrics = PipelineMetricsCollector(self.job_id, SOURCE_OPERATOR, SINK_OPERATOR, read_commit_ms=lambda: (
                service.call_operator_coordinator(SINK_OPERATOR, lambda c: c.last_commit_ms, timeout_s=5.0)))
            self.service.metrics_server.register(metrics)
        consumer = kafka_config.consumer(opts.bootstrap_servers, overrides=dict(opts.consumer_overrides))
        completed = failed = consecutive = 0
        first_failure: str | None = None
        landed_before = self._committed_records()
        if self.election is not None and self.election.became_leader_at is not None:
            self.takeover_s = time.monotonic() - self.election.became_leader_at
            self._notice(f"standby of job {self.job_id} leads: coordinator started {self.takeover_s:.1f} s after "
                         "the election")
        stopped_because = "stopped"
        canceled = False
        request: tuple[ControlRequest, concurrent.futures.Future] | None = None
        try:
            deadline = time.monotonic() + 60
            while not self._enumerator_call(lambda e: len(e.splits)):
                if time.monotonic() > deadline:
                    raise PipelineError("partition discovery found no partitions within 60 s")
                time.sleep(0.05)
            while True:
                if self._stop.is_set():
                    stopped_because = ("stopped by " + signal.Signals(self.stop_signal).name if self.stop_signal
                                       else "stopped on request")
                    break
                if self.service.fenced.is_set():
                    raise PipelineFencedError(self._fenced_message())
                if self.service.job_status == "FAILED" or self.service.stopped.is_set():
                    reason = self.service.failure_reason() or "the coordinator stopped"
                    cause = f"; first failure: {first_failure}" if first_failure else ""
                    raise PipelineError(f"job {self.job_id} failed: {reason}{cause}")
                if opts.max_checkpoints is not None and completed >= opts.max_checkpoints:
                    stopped_because = f"{opts.max_checkpoints} checkpoints done"
                    break
                request = self._next_request()
                if request is not None and request[0].request_type is ControlRequestType.CANCEL:
                    self._cancel(request)
                    stopped_because = f"canceled by request {request[0].request_id}"
                    canceled = True
                    break
                lag = self.lag(consumer)
                if (request is not None and request[0].request_type is ControlRequestType.STOP_WITH_SAVEPOINT
                        and request[0].drain and sum(lag.values()) > 0):
                    self._draining, request = request, None  # land what is available first (Flink's --drain)
                if request is None and sum(lag.values()) == 0:
                    if opts.stop_when_drained:
                        stopped_because = "drained"
                        break
                    self._idle(max(0.2, opts.checkpoint_interval_ms / 1000))
                    continue
                batch_started = time.monotonic()
                trigger = self._trigger_for(request)
                checkpoint_id = trigger.checkpoint_id or -1  # None: refused before it got an ID
                message = None
                fatal = None
                records = 0
                spark_job_ms = 0.0
                try:
                    ranges = self._ranges(checkpoint_id, trigger, opts.checkpoint_timeout_ms / 1000)
                    records = sum(r.num_records for r in ranges.values())
                    job_started = time.monotonic()
                    try:
                        self._run_micro_batch(spark, checkpoint_id, ranges, counts)
                    except Exception as exc:  # noqa: BLE001 - any failure of the Spark job aborts the checkpoint now, not at its timeout
                        message = root_cause(exc)
                        if message.startswith("ModuleNotFoundError"):
                            message += (f" in the executors' Python ({os.environ.get('PYSPARK_PYTHON', 'python3')}): "
                                        "install Chandy there, or its dependencies with --ship-code "
                                        "(README, Running on a cluster)")
                        fatal = message if message.split(":")[0] in DETERMINISTIC_ERRORS else None
                        log.error("checkpoint %d: Spark job failed: %s", checkpoint_id, message)
                        self.service.abort_checkpoint(checkpoint_id, CheckpointFailureReason.CHECKPOINT_DECLINED,
                                                      f"Spark job failed: {message}"[:1000])
                    spark_job_ms = (time.monotonic() - job_started) * 1000
                    result = self._await(trigger, opts.checkpoint_timeout_ms / 1000 + 10)
                    completed += 1
                    consecutive = 0
                    first_failure = None
                    if request is not None and request[0].request_type is ControlRequestType.TRIGGER_SAVEPOINT:
                        self._release_savepoint_ranges(checkpoint_id)
                    if request is not None:
                        request[1].set_result(RequestOutcome(checkpoint_id, result if isinstance(result, str)
                                                             else getattr(result, "external_pointer", None)))
                        if request[0].request_type is ControlRequestType.STOP_WITH_SAVEPOINT:
                            stopped_because = f"stopped with savepoint {result}"
                            self._stop.set()
                except CoordinatorFencedError as exc:
                    self._fail_request(request, exc)
                    raise PipelineFencedError(self._fenced_message()) from exc
                except CheckpointException as exc:
                    self._fail_request(request, exc)
                    failed += 1
                    consecutive += 1
                    message = message or root_cause(exc)
                    first_failure = first_failure or f"checkpoint {checkpoint_id}: {message}"
                    log.warning("checkpoint %d failed: %s", checkpoint_id, message)
                if fatal is not None:
                    raise PipelineError(f"checkpoint {checkpoint_id} failed: {fatal}")
                if on_progress is not None or metrics is not None:
                    landed = self._committed_records() - landed_before
                    progress = PipelineProgress(
                        checkpoint_id, message is None, records, landed, completed, failed,
                        (time.monotonic() - batch_started) * 1000, time.monotonic() - started,
                        self.lag(consumer), message, spark_job_ms, self.bad_records, self.dead_lettered,
                        counts.value[1])
                    if metrics is not None:
                        metrics.update(progress)
                    if on_progress is not None:
                        on_progress(progress)
                pause = opts.checkpoint_interval_ms / 1000 - (time.monotonic() - batch_started)
                if consecutive:
                    pause = max(pause, self._backoff_s(consecutive))
                if self._stop.is_set() and stopped_because.startswith("stopped with savepoint"):
                    break
                if pause > 0:
                    self._idle(pause)
        except ChandyError as exc:
            if self.service.fenced.is_set() and not isinstance(exc, PipelineFencedError):
                raise PipelineFencedError(self._fenced_message()) from exc
            if isinstance(exc, PipelineKafkaError):
                self._record_failure(str(exc))
            raise
        finally:
            landed_total = self._safe_committed_records() - landed_before
            self._fail_request(request, PipelineError("the pipeline stopped before the request was applied"))
            while (queued := self._next_request()) is not None:
                self._fail_request(queued, PipelineError("the pipeline stopped before the request was applied"))
            consumer.close()
            self.service.stop()
            if self._spark is None:
                _stop_spark(spark)
            self._restore_signal_handlers(previous_handlers)
        return PipelineSummary(opts.table_uri, self.job_id, landed_total, completed, failed,
                               time.monotonic() - started, stopped_because=stopped_because,
                               bad_records=self.bad_records, dead_lettered=self.dead_lettered,
                               tombstones_skipped=counts.value[1], signal=self.stop_signal,
                               notices=tuple(self.notices), canceled=canceled)

    def _record_failure(self, reason: str) -> None:
        """Make the job FAILED in the log and on the events topic before the run exits (issue 36:
        Kafka gave up). The brokers may be the reason, so this waits 10 s at most, then says it
        could not."""
        assert self.service is not None
        try:
            self.service.fail_job(reason).result(10)
        except Exception as exc:  # noqa: BLE001 - the run exits with its own error either way
            log.error("job %s: could not record FAILED (%s); the job's last status stays in the log", self.job_id,
                      root_cause(exc))

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
    def _stand_by(self) -> bool:
        """Join the job's election group and wait until this process leads (True) or is stopped
        (False). Nothing of the table or the log is read before: the active process changes them."""
        opts = self.options
        topics = ChandyTopics(opts.prefix)
        ensure_topics(kafka_config.admin_client(opts.bootstrap_servers, kafka_config.security_settings(opts.consumer_overrides)), topics)
        self.election = LeaderElection(opts.bootstrap_servers, topics, self.job_id,
                                       consumer_overrides=dict(opts.consumer_overrides), standby=True).join()
        log.warning("standby for job %s: waiting until the active coordinator stops (group %s)", self.job_id,
                    self.election.group_id)
        if self.election.wait_until_leader(stop=self._stop):
            return True
        self.election.close()
        return False

    def _execute_request(self, request: ControlRequest) -> concurrent.futures.Future:
        """The coordinator's request executor (mailbox thread): queue the request for the driver
        loop, which runs the micro-batch of the checkpoint or savepoint it asks for."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._requests.put((request, future))
        self._wake.set()
        return future

    def _next_request(self) -> tuple[ControlRequest, concurrent.futures.Future] | None:
        """The next control request for the driver loop (driver thread only).

        A queued CANCEL overtakes everything, a stop-with-savepoint that is draining included
        (its request fails: the job is canceled instead, as Flink's cancel ends a draining job).
        Then the draining request, then the queue in order; a queued request whose deadline
        passed before the loop got to it fails unapplied (its sender has given up waiting)."""
        while True:
            try:
                self._backlog.append(self._requests.get_nowait())
            except queue.Empty:
                break
        cancel = next((r for r in self._backlog if r[0].request_type is ControlRequestType.CANCEL), None)
        if cancel is not None:
            self._backlog.remove(cancel)
            if self._draining is not None:
                self._fail_request(self._draining, PipelineError(
                    f"canceled by request {cancel[0].request_id} while draining; no savepoint was taken"))
                self._draining = None
            return cancel
        if self._draining is not None:
            request, self._draining = self._draining, None
            return request
        while self._backlog:
            request = self._backlog.popleft()
            now = int(time.time() * 1000)
            if request[0].deadline and now > request[0].deadline:
                self._fail_request(request, PipelineError(
                    f"expired {now - request[0].deadline} ms before the pipeline could apply it: not applied"))
                continue
            return request
        return None

    def _idle(self, seconds: float) -> None:
        """Wait up to ``seconds``, less when a stop or a control request arrives."""
        deadline = time.monotonic() + seconds
        while not self._stop.is_set() and not self._wake.is_set() and time.monotonic() < deadline:
            self._wake.wait(min(0.05, max(0.0, deadline - time.monotonic())))
        self._wake.clear()

    def _trigger_for(self, request: tuple[ControlRequest, concurrent.futures.Future] | None) -> Any:
        """The trigger of this round: a checkpoint, or what a control request asks for."""
        assert self.service is not None
        if request is None:
            return self.service.trigger_checkpoint()
        kind, target = request[0].request_type, request[0].target_directory
        if kind is ControlRequestType.TRIGGER_SAVEPOINT:
            return self.service.trigger_savepoint(target)
        if kind is ControlRequestType.STOP_WITH_SAVEPOINT:
            return self.service.trigger_savepoint(target, terminate=True)
        return self.service.trigger_checkpoint(forced=True)

    def _cancel(self, request: tuple[ControlRequest, concurrent.futures.Future]) -> None:
        """Cancel the job (Flink's ``JobMaster.cancel``): no savepoint, nothing more lands."""
        assert self.service is not None
        try:
            self.service.cancel_job(f"canceled by request {request[0].request_id}").result(30)
            request[1].set_result(RequestOutcome())
        except Exception as exc:  # noqa: BLE001 - the request's answer says why
            request[1].set_exception(exc)

    @staticmethod
    def _fail_request(request: tuple[ControlRequest, concurrent.futures.Future] | None, exc: BaseException) -> None:
        if request is not None and not request[1].done():
            request[1].set_exception(exc)

    def _safe_committed_records(self) -> int:
        try:
            return self._committed_records()
        except Exception:  # noqa: BLE001 - a stopped (fenced) coordinator: what it last said
            return self._last_committed

    def _backoff_s(self, consecutive_failures: int) -> float:
        """Flink's exponential-delay restart strategy: initial x 2^(n-1), capped, with 10 % jitter."""
        opts = self.options
        delay = min(opts.restart_backoff_max_ms, opts.restart_backoff_initial_ms * 2 ** (consecutive_failures - 1))
        return delay * (1 + random.uniform(-0.1, 0.1)) / 1000

    def check_values(self) -> Any:
        """``--verify``'s value check (:func:`chandy.connectors.spark.verify.check_values`) after a run:
        each landed row's value columns against its source record decoded again; None when
        there is nothing to compare (raw Kafka columns, or a ``--transform`` that reshapes rows).

        Returns:
            :class:`chandy.connectors.spark.verify.ValueCheck` or None.
        """
        if self.decoder is None or self._transform is not None:
            return None
        from chandy.connectors.spark.verify import check_values

        return check_values(self.sink, self.options.bootstrap_servers, self.decoder, self.topic_names,
                            self.options.consumer_overrides)

    @staticmethod
    def _restore_signal_handlers(previous: dict[int, Any]) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


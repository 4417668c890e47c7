"""The pipeline's checks before Spark starts (:meth:`Preflight.run`): the brokers, the Kafka
settings and ACLs, the table's location and schema, and the reconciliation of the table with the
coordinator log and the consumer group (:meth:`Preflight.reconcile`, again before each restart):

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

import logging
import re
import time
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition

from chandy.connectors.kafka.source.subscriber import subscribed_topics
from chandy.connectors.lake.sink import TP
from chandy.connectors.spark.driver.decoders import DecoderFactory
from chandy.connectors.spark.driver.state import DriverState
from chandy.connectors.spark.options import PipelineError
from chandy.connectors.spark.spark_urls import is_local_master, redact_remote
from chandy.coordinator.filesystems import StorageBackendError, is_local, open_filesystem, storage_error_cause
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.topics import ChandyTopics, ensure_topics
from chandy.formats.registry import RegistryError

log = logging.getLogger(__name__)


class Preflight:
    """The checks of one run before Spark starts, each done once (see the module docstring); the
    reconciliation again before every restart's attempt (:meth:`reconcile`)."""

    def __init__(self, state: DriverState, decoders: DecoderFactory) -> None:
        self.state = state
        self.decoders = decoders
        self._done = False
        self._static_checked = False

    def run(self) -> None:
        """Check and reconcile before Spark starts (see the module docstring).

        Raises:
            PipelineError: unreachable brokers, an unknown Kafka setting, missing topics, an
                unwritable table location, a schema that does not fit the table, another job's
                data in the table, a table from another Kafka cluster, or (with
                ``resume_from_table=False``) a coordinator log behind the table.
        """
        if self._done:
            return
        opts = self.state.options
        started = time.monotonic()
        self.check_static()
        try:
            self.state.decoder = self.decoders.from_known_schema()
        except RegistryError as exc:  # the registry's refusal or silence fails the start, as any setting's
            raise PipelineError(str(exc)) from exc
        if self.state.transform is None and (opts.value_format is None or self.state.decoder is not None):
            self.decoders.check_output_schema(self.decoders.output_schema())
        checked = time.monotonic()
        self.reconcile()
        self._done = True
        log.info("job %s: preflight %.2f s (checks %.2f s, reconciling the table and the log %.2f s)", self.state.job_id,
                 time.monotonic() - started, checked - started, time.monotonic() - checked)

    def check_static(self) -> None:
        """The checks that do not read what a running job changes (Kafka reachable, the settings,
        the source topics, the table location), once: a ``--standby`` runs them before it waits,
        so a misconfigured standby fails at once and its take-over does not pay them.

        Raises:
            PipelineError: as :meth:`run`.
        """
        if self._static_checked:
            return
        self._check_kafka()
        self._check_table_location()
        self._check_checkpoint_directory()
        self._warn_local_paths_on_a_cluster()
        self._say_what_readers_see_across_tables()
        self._static_checked = True

    def _check_kafka(self) -> None:
        opts = self.state.options
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
            self.state.cluster_id = metadata.cluster_id
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
        self.state.topic_names = subscribed_topics(available, opts.topics, opts.topic_pattern)
        if not self.state.topic_names:
            raise PipelineError(f"no topic matches {opts.topic_pattern!r} on {opts.bootstrap_servers}")
        self.state.partitions = [(t, p) for t in self.state.topic_names for p in sorted(metadata.topics[t].partitions)]
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

        opts = self.state.options
        tasks = opts.task_consumer_overrides
        try:
            check_read_access(opts.bootstrap_servers, self.state.partitions, tasks)
        except SourceAuthorizationError as exc:
            raise PipelineError(f"the Spark tasks' principal ({tasks.get('sasl.username', 'from -X/--worker-property')}) "
                                f"may not read the source: {exc}; grant it with `chandy topics acls --worker ... "
                                "--source-topic ...`") from exc
        group = opts.resolved_group_id
        admin = kafka_config.admin_client(opts.bootstrap_servers, kafka_config.security_settings(opts.consumer_overrides))
        request = ConsumerGroupTopicPartitions(group, [TopicPartition(t, p) for t, p in self.state.partitions])
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
            self.state.table_fields = self.state.sink.table_fields()
        except Exception as exc:  # delta-rs, pyiceberg and fsspec raise many types
            raise PipelineError(f"cannot read table {self.state.sink.table_uri}: {storage_error_cause(exc)}") from exc
        location = self.state.sink.fs.unstrip_protocol(self.state.sink.root)
        where = self.state.sink.table_uri if location.rstrip("/") == self.state.sink.table_uri.rstrip("/") else \
            f"{self.state.sink.table_uri} (at {location})"
        try:
            _probe_write(self.state.sink.fs, self.state.sink.root)
        except Exception as exc:  # every storage error means "not writable"
            raise PipelineError(f"table location {where} is not writable: {storage_error_cause(exc)}") from exc

    def _check_checkpoint_directory(self) -> None:
        """The checkpoint directory (``--checkpoint-dir``, Flink's ``state.checkpoints.dir``) is
        a store of its own when it is not inside the table: its backend, bucket and credentials
        are checked as the table's are."""
        checkpoint_dir = self.state.options.resolved_checkpoint_dir
        location = self.state.sink.fs.unstrip_protocol(self.state.sink.root).rstrip("/")
        if any(checkpoint_dir.startswith(f"{root.rstrip('/')}/") for root in (self.state.sink.table_uri, location)):
            return  # inside the table (the default): its location was just probed
        try:
            fs, path = open_filesystem(checkpoint_dir, self.state.storage_options())
            _probe_write(fs, path)
        except StorageBackendError as exc:
            raise PipelineError(str(exc)) from exc
        except Exception as exc:  # every storage error means "not writable"
            raise PipelineError(f"checkpoint directory {checkpoint_dir} is not writable: "
                                f"{storage_error_cause(exc)}") from exc

    def _warn_local_paths_on_a_cluster(self) -> None:
        """Tasks write the table's files (and bad records) where the driver then commits them
        from: off a local master, a local-filesystem path works only when every executor sees the
        driver's directory (one machine, or a shared mount); say so once, before Spark starts."""
        opts = self.state.options
        where = f"Spark Connect server {redact_remote(opts.remote)}" if opts.remote else f"master {opts.master}"
        if opts.remote and re.match(r"sc://(localhost|127\.0\.0\.1|\[::1\])[:/;]?", opts.remote):
            return  # a server on this machine sees its files
        if not opts.remote and is_local_master(opts.master):
            return
        protocol = self.state.sink.fs.protocol
        local = []
        if {"file", "local"} & set(protocol if isinstance(protocol, (tuple, list)) else (protocol,)):
            local.append(f"table {self.state.sink.table_uri}")
        checkpoint_dir = opts.resolved_checkpoint_dir
        if checkpoint_dir.startswith(("file:", "local:")) or "://" not in checkpoint_dir:
            local.append(f"checkpoint directory {checkpoint_dir}")
        if local:
            log.warning("%s on the local filesystem with %s: the driver and every executor must see the same "
                        "directory (one machine, or a shared mount); on a cluster use shared storage (s3://, "
                        "abfss://, gs://, hdfs://)", " and ".join(local), where)

    def _say_what_readers_see_across_tables(self) -> None:
        """A routed job writes several tables per checkpoint: say at start whether they commit
        together (an Iceberg REST catalog that serves the multi-table commit:
        :func:`~chandy.connectors.lake.iceberg_transactions.transaction_key`) or table by table,
        so that a reader of two tables may see them at different checkpoints (docs/design.md §7)."""
        opts = self.state.options
        if not opts.routes:
            return
        from chandy.connectors.lake.iceberg_transactions import transaction_key
        from chandy.connectors.lake.routing import Router

        sink = self.state.sink
        targets = [rule.table for rule in Router.parse(opts.routes, opts.route_field, opts.route_by).rules]
        catalog = getattr(sink, "catalog_name", None)  # an Iceberg table's
        same_catalog = catalog is not None and all(t.startswith(f"iceberg://{catalog}/") for t in targets)
        if same_catalog and transaction_key(sink) is not None:
            log.info("job %s: the tables of a checkpoint in catalog %s are committed in one request (the Iceberg REST "
                     "multi-table commit); how atomic it is for readers is the server's (docs/design.md section 7)",
                     self.state.job_id, catalog)
            return
        why = ("Delta has no multi-table commit" if catalog is None else
               f"catalog {catalog} does not serve the Iceberg REST multi-table commit" if same_catalog else
               "they are not all in one Iceberg REST catalog")
        log.warning("job %s: the tables of a checkpoint are committed table by table (%s): between two commits a "
                    "reader can see one routed table at checkpoint N and another at N-1; --table %s is committed "
                    "last, so its LAKE_COMMITTED event says every table holds N", self.state.job_id, why, sink.table_uri)

    def reconcile(self) -> None:
        """Steps 1 to 3 of the module docstring: the table's progress into
        :attr:`DriverState.table_progress`, the checkpoint ID floor, notices, and the group rewound.

        Raises:
            PipelineError: another job's partitions in the table, a table from another Kafka
                cluster, a log behind the table with ``--no-resume-from-table``, or Kafka did not
                answer the group's offsets.
        """
        from chandy.coordinator.kafka.log import load_state

        opts = self.state.options
        progress = self.state.sink.progress(self.state.job_id, self.state.partitions)
        self.state.table_progress = progress
        mine = set(self.state.partitions)
        for other, offsets in sorted(progress.other_jobs.items()):
            shared = sorted(mine & set(offsets))
            if shared:
                topic, partition = shared[0]
                raise PipelineError(
                    f"table {self.state.sink.table_uri} already holds {topic}-{partition} (and {len(shared) - 1} more "
                    f"partition(s)) landed by job {other}; two jobs landing one partition would duplicate it: "
                    f"pass --job-id {other} to resume that job")
        if progress.checkpoint_id is None:
            return
        if progress.cluster_id and self.state.cluster_id and progress.cluster_id != self.state.cluster_id:
            raise PipelineError(
                f"table {self.state.sink.table_uri} was landed by job {self.state.job_id} from Kafka cluster {progress.cluster_id}, "
                f"but {opts.bootstrap_servers} is cluster {self.state.cluster_id}: offsets do not carry over between "
                "clusters; land this cluster's topics with a new --job-id (or into a new table)")
        topics = ChandyTopics(opts.prefix)
        ensure_topics(kafka_config.admin_client(opts.bootstrap_servers, kafka_config.security_settings(opts.consumer_overrides)), topics)
        state, _ = load_state(opts.bootstrap_servers, topics.coordinator_log, self.state.job_id,
                              consumer_overrides=dict(opts.consumer_overrides), timeout_s=60)
        completed = state.completed(savepoints=False)
        latest = completed[-1].checkpoint_id if completed else None
        self.state.checkpoint_id_floor = progress.checkpoint_id + 1
        if latest is None or latest < progress.checkpoint_id:
            where = ", ".join(f"{t}-{p}@{o}" for (t, p), o in sorted(progress.offsets.items())[:6])
            more = "" if len(progress.offsets) <= 6 else f" and {len(progress.offsets) - 6} more"
            log_state = "has no completed checkpoint" if latest is None else f"ends at checkpoint {latest}"
            if not opts.resume_from_table:
                raise PipelineError(
                    f"the coordinator log of job {self.state.job_id} {log_state} but table {self.state.sink.table_uri} holds "
                    f"checkpoint {progress.checkpoint_id}; refusing to guess (--no-resume-from-table)")
            if latest is None:
                self.state.notice(f"the coordinator log of job {self.state.job_id} has no completed checkpoint, the table holds "
                             f"checkpoint {progress.checkpoint_id}: resuming from the table's offsets ({where}{more}); "
                             f"checkpoint IDs continue at {progress.checkpoint_id + 1}")
            else:  # the normal case after a stop between the lake commit and its log record
                self.state.notice(f"the table already holds checkpoint {progress.checkpoint_id}, ahead of the coordinator "
                             f"log at {latest} (it was committed to the lake just before the last run stopped): "
                             f"resuming from the table ({where}{more}); checkpoint IDs continue at "
                             f"{progress.checkpoint_id + 1}")
        self.rewind_group_past_table(progress.offsets)

    def rewind_group_past_table(self, table_offsets: Mapping[TP, int]) -> None:
        """A consumer group ahead of the table is moved back to the table's offsets.

        The group's offsets are read with ``isolation.level=read_uncommitted``: its committed
        offsets as they stand, without waiting for a transaction in flight. A read_committed
        consumer asks for stable offsets (KIP-447's ``require_stable``), which a coordinator killed
        between ``send_offsets_to_transaction`` and its commit leaves unstable until the
        transaction ends, and this runs before this run's coordinator fences it (a standby's
        take-over waited here for 30 s, then failed). The offsets of that transaction never
        count: the fencing aborts it.

        Raises:
            PipelineError: Kafka did not answer (naming the group and the error).
        """
        opts = self.state.options
        if not table_offsets:
            return
        consumer = kafka_config.consumer(opts.bootstrap_servers, group_id=opts.resolved_group_id,
                                         overrides={**opts.consumer_overrides, "isolation.level": "read_uncommitted"})
        try:
            try:
                committed = consumer.committed([TopicPartition(t, p) for t, p in sorted(table_offsets)], timeout=30)
            except KafkaException as exc:
                raise PipelineError(f"reading consumer group {opts.resolved_group_id}'s offsets failed: "
                                    f"{exc.args[0].str() if exc.args else exc} (is Kafka reachable?)") from exc
            ahead = [TopicPartition(tp.topic, tp.partition, table_offsets[(tp.topic, tp.partition)])
                     for tp in committed if tp.offset >= 0 and tp.offset > table_offsets[(tp.topic, tp.partition)]]
            if ahead:
                consumer.commit(offsets=ahead, asynchronous=False)
                self.state.notice(f"consumer group {opts.resolved_group_id} was ahead of the table on {len(ahead)} "
                             "partition(s): moved back to the table's offsets")
        finally:
            consumer.close()


def _probe_write(fs: Any, root: str) -> None:
    """Write then delete a small file in ``root`` (created first on a local disk; on an object
    store, where a "directory" is a bucket, making it would create the user's bucket), as a
    checkpoint will."""
    probe = f"{root}/_chandy_write_probe_{uuid.uuid4().hex[:8]}"
    if is_local(fs):
        fs.makedirs(root, exist_ok=True)
    with fs.open(probe, "wb") as handle:
        handle.write(b"chandy")
    fs.rm(probe)

"""The pipeline's settings and outcomes: :class:`PipelineOptions` (every setting, one field each,
with its default), the errors a run raises, the progress of a micro-batch and the summary of a
run; the job ID a table and topics give. The CLI builds the options; the driver
(:mod:`chandy.connectors.spark.driver`) runs them."""

from __future__ import annotations

import dataclasses
import logging
import re
import uuid
from collections.abc import Mapping
from typing import Any, Literal, get_args

from chandy.connectors.kafka.source.offsets import OffsetsSpecError, parse_offsets_spec
from chandy.connectors.lake.tables import is_iceberg
from chandy.connectors.lake.uri import normalize_table_uri
from chandy.connectors.spark.progress import CHECKPOINT_PHASES as CHECKPOINT_PHASES  # re-exported
from chandy.connectors.spark.progress import PipelineProgress as PipelineProgress
from chandy.connectors.spark.progress import PipelineSummary as PipelineSummary
from chandy.connectors.spark.spark_urls import is_local_master, redact_remote
from chandy.connectors.spark.task.options import DEFAULT_WRITE_BUFFER_BYTES
from chandy.coordinator.errors import ChandyError
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.restart_strategy import RestartStrategyConfigError, RestartStrategyOptions
from chandy.formats.modes import KEY_FORMATS, AvroFraming, ChangeFormat, ErrorsTolerance, KeyFormat, Tombstones

log = logging.getLogger(__name__)

#: what ``--value-format`` takes (``json-schema``: JSON framed by Confluent's JSON Schema serializer)
ValueFormatOption = Literal["json", "avro", "json-schema", "protobuf"]

SOURCE_OPERATOR = "kafka-source"
SINK_OPERATOR = "lake-sink"

class PipelineError(ChandyError):
    """The pipeline cannot start or had to stop (the message says why, in one line)."""


class PipelineFencedError(PipelineError):
    """A newer coordinator of the same job took over; this run stopped writing at once."""


class PipelineFailoverError(PipelineError):
    """A failure a restart can cure (a lake commit that failed, Kafka unreachable past
    ``--kafka-retry-timeout``, the coordinator log unwritable, more failed checkpoints in a row
    than tolerated): the restart strategy (``-D restart-strategy.type=...``) restarts the job from
    its latest completed checkpoint, or, once it gives up, the job ends FAILED."""


class PipelineKafkaError(PipelineFailoverError):
    """Kafka refused a call of the running pipeline (not authorized, a topic gone) or kept
    failing past ``--kafka-retry-timeout``: restarted by the restart strategy; once it gives up the
    job ends FAILED (on the events topic too), and a later run resumes it only from a savepoint or
    retained checkpoint (``--from-savepoint``)."""


@dataclasses.dataclass(frozen=True)
class Flag:
    """How a :class:`PipelineOptions` field is spelled on ``chandy pipeline run``: the CLI derives
    its options from these (``chandy/cli/pipeline.py``), so a setting is defined once, here.

    ``kind``: ``value`` (one value), ``flag`` (on when given), ``switch`` (``--x/--no-x``),
    ``multiple`` (repeatable, a tuple) or ``settings`` (repeatable ``KEY=VALUE``, a mapping).
    ``minimum`` / ``maximum`` bound an integer; ``read_at_file``: a value ``@path`` is that file's text;
    ``envvar``: the environment variable that gives the value when the option is not.
    """

    decls: tuple[str, ...]
    help: str = ""
    kind: str = "value"
    choices: tuple[str, ...] = ()
    minimum: int | None = None
    maximum: int | None = None
    metavar: str | None = None
    required: bool = False
    read_at_file: bool = False
    envvar: str | None = None


_REQUIRED: Any = dataclasses.MISSING


def _opt(default: Any, *decls: str, help: str = "", **spec: Any) -> Any:
    """A :class:`PipelineOptions` field with ``default`` (a dict default is copied per instance),
    spelled ``decls`` on the CLI (none: not a CLI option)."""
    metadata = {"flag": Flag(tuple(decls), help=help, **spec)} if decls else {}
    if isinstance(default, dict):
        return dataclasses.field(default_factory=dict, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def cli_flags() -> list[tuple[dataclasses.Field, Flag]]:
    """Every :class:`PipelineOptions` field that the CLI takes, with its :class:`Flag`, in field order."""
    return [(f, f.metadata["flag"]) for f in dataclasses.fields(PipelineOptions) if "flag" in f.metadata]


def default_job_id(table_uri: str, topics: tuple[str, ...] | list[str] = (), topic_pattern: str | None = None) -> str:
    """A job ID derived from the normalised, absolute table URI and the topics (or pattern):
    the same pipeline resumes its own checkpoints however the table was spelled."""
    source = ",".join(sorted(topics)) if topics else f"pattern:{topic_pattern or ''}"
    return uuid.uuid5(uuid.NAMESPACE_URL, f"chandy-pipeline:{normalize_table_uri(table_uri)}|{source}").hex


def _restart_strategy_options(flink_conf: Mapping[str, str], restart_strategy: str | None) -> RestartStrategyOptions:
    """The restart strategy ``-D restart-strategy.*`` and ``--restart-strategy`` give.

    Raises:
        PipelineError: an unknown option or value, or two different types.
    """
    config = dict(flink_conf)
    if restart_strategy is not None:
        given = config.setdefault("restart-strategy.type", restart_strategy)
        if given != restart_strategy:
            raise PipelineError(f"--restart-strategy {restart_strategy} and -D restart-strategy.type={given} "
                                "disagree: give one")
    try:
        return RestartStrategyOptions.from_flink_config(config)
    except RestartStrategyConfigError as exc:
        raise PipelineError(f"-D: {exc}") from exc


@dataclasses.dataclass(frozen=True)
class PipelineOptions:
    """Everything ``chandy pipeline run`` takes. Times in ms.

    Kafka settings pass through under librdkafka's names (``consumer_overrides``,
    ``producer_overrides``, ``worker_overrides``), Spark settings under Spark's (``spark_conf``), storage settings under
    fsspec's / delta-rs's (``storage_options``). ``table_uri`` is normalised to an absolute URI
    when the options are made. Bad records follow Kafka Connect's ``errors.tolerance`` (``none``
    or ``all``) and ``errors.deadletterqueue.topic.name`` (``dead_letter_topic``); ``tombstones``
    is ``error``, ``skip`` or ``null`` (see :mod:`chandy.formats.decoder`).

    ``from_savepoint`` starts the job from a savepoint (Flink's ``flink run -s``) when its
    coordinator log has no checkpoint: offsets and the enumerator's state come from it, IDs
    continue above it. ``standby`` waits, before anything else, until this process leads the job's
    election group: a second process for the same job that takes over when the active one dies.

    ``schema_registry`` (Confluent-framed Avro): ``SchemaRegistryClient`` settings; each
    record's writer schema is fetched by ID and resolved against ``value_schema``. Without
    ``value_schema`` the registry is the source of the schema (``value_subject``'s latest version
    at start, ``<topic>-value`` by default as Confluent's ``TopicNameStrategy``, gives the
    starting columns) and each record is read with its own writer schema, so a field a producer
    adds becomes a column (see :class:`~chandy.formats.decoder.ValueDecoder`'s ``as_written``).
    ``schema_evolution`` (with a value format): a decoded field the table lacks becomes a new
    column (Delta: ADD COLUMN; Iceberg: ``union_by_name``); a field whose type changes fails the
    micro-batch naming the field, both types and the offset range, and lands nothing of it.

    Raises:
        PipelineError: inconsistent options; DdlError / AvroValueSchemaError: a bad value schema.
    """

    table_uri: str = _opt(_REQUIRED, "--table", required=True, help=(
        "Delta table URL (file://, s3://, ... or a local path), or iceberg://<catalog>/<namespace>.<table>."))
    bootstrap_servers: str = _opt(_REQUIRED)  # the CLI's -b / --data-dir resolve it (cli/app.py)
    topics: tuple[str, ...] = _opt((), "--topic", kind="multiple", help="Topic to read (repeatable).")
    topic_pattern: str | None = _opt(None, "--topic-pattern", help="Regex of topics to read (instead of --topic).")
    job_id: str | None = _opt(None, "--job-id", help="Job ID (default: derived from the table URL, so a restart resumes).")
    job_name: str | None = _opt(None, "--job-name", help=(
        "Job name, as Flink's: the metrics' job_name label and what the dashboard shows beside the ID "
        "(default: <topics> -> <table>)."))
    group_id: str | None = _opt(None, "--group-id", help="Consumer group for offset commits (default chandy-<job id>).")
    starting_offsets: str = _opt("earliest", "--starting-offsets", metavar="SPEC", help=(
        "Where partitions the table has never seen start (Spark's startingOffsets, Flink's OffsetsInitializer): "
        "earliest, latest, committed (the consumer group's, else earliest), timestamp:<ms or ISO-8601> (the first "
        "record at or after it) or JSON offsets {\"topic\": {\"0\": 23}} (-2 earliest, -1 latest; partitions "
        "not named: earliest). A partition the table holds always resumes at the table's offsets."))
    ending_offsets: str | None = _opt(None, "--ending-offsets", metavar="SPEC", help=(
        "A bounded run (Spark's endingOffsets, Flink's setBounded): latest (the last stable offsets at start), "
        "timestamp:<ms or ISO-8601> (records before it) or JSON offsets (exclusive; -1 latest), resolved when "
        "the run starts; it stops with exit 0 once every partition reached its end."))
    max_records_per_checkpoint: int | None = _opt(None, "--max-records-per-checkpoint", minimum=1,
                                                  help="Cap per partition per checkpoint (micro-batch).")
    min_records_per_checkpoint: int | None = _opt(None, "--min-records-per-checkpoint", minimum=1, help=(
        "Spark's minOffsetsPerTrigger: a periodic checkpoint waits until the topics hold at least this many "
        "records to land, or --max-trigger-delay has passed since the last one (fewer, larger files at low "
        "traffic; not in a bounded run: --until-drained, --ending-offsets)."))
    max_trigger_delay_ms: int = _opt(900_000, "--max-trigger-delay", minimum=0, help=(
        "Spark's maxTriggerDelay, in ms: how long --min-records-per-checkpoint may hold back a checkpoint "
        "while some records wait."))
    source_idle_timeout_ms: int | None = _opt(None, "--source-idle-timeout", minimum=1, metavar="MS", help=(
        "Flink's WatermarkStrategy.withIdleness, in ms: a partition that got no record for this long stops holding "
        "the completeness watermark (valid_through_ms) back, and LAKE_COMMITTED names it in idle_partitions. "
        "Default: every assigned partition holds it back until read, and at its newest record."))
    checkpoint_interval_ms: int = _opt(0, "--checkpoint-interval", minimum=0, help=(
        "Minimum ms between checkpoint triggers (0: back to back while there is lag)."))
    checkpoint_timeout_ms: int = _opt(300_000, "--checkpoint-timeout", minimum=1,
                                      help="execution.checkpointing.timeout in ms.")
    tolerable_failed_checkpoints: int = _opt(3, "--tolerable-failed-checkpoints", minimum=0)
    checkpoint_dir: str | None = _opt(None, "--checkpoint-dir",
                                      help="state.checkpoints.dir (default: <table>/_chandy_checkpoints).")
    parallelism: int | None = _opt(None, "--parallelism", minimum=1, help=(
        "Subtasks, one Spark task each (default: one per partition of the topics; on a local master at most its "
        "cores or spark.default.parallelism)."))
    master: str = _opt("local[*]", "--master", help="Spark master URL.")
    remote: str | None = _opt(None, "--remote", envvar="SPARK_REMOTE", metavar="sc://HOST:PORT", help=(
        "Run the tasks through Spark Connect (sc://host:15002[/;token=...;use_ssl=true], as pyspark's "
        "SPARK_REMOTE): the coordinator, the lake committer and the source's enumerator stay in this process, "
        "the tasks run on the server's executors (instead of --master)."))
    spark_conf: Mapping[str, str] = _opt({}, "--conf", kind="settings", help="Spark setting (repeatable).")
    value_format: ValueFormatOption | None = _opt(None, "--value-format", choices=get_args(ValueFormatOption), help=(
        "Decode values into columns: JSON, Avro, JSON with Confluent's JSON Schema framing (json-schema: the "
        "5-byte header of JSONSerializer; with --schema-registry-url the subject's JSON Schema gives the columns), "
        "or Confluent-framed Protobuf (protobuf: needs --schema-registry-url, each record read with its writer's "
        "message)."))
    value_schema: str | None = _opt(None, "--value-schema", read_at_file=True,
                                    help="JSON: Spark DDL (default inferred); Avro: schema JSON or @file.")
    avro_framing: AvroFraming = _opt("single-object", "--avro-framing", choices=get_args(AvroFraming))
    avro_schema_id: int | None = _opt(None, "--avro-schema-id", minimum=0,
                                      help="With --avro-framing confluent: the only schema ID accepted.")
    value_subject: str | None = _opt(None, "--value-subject", metavar="SUBJECT", help=(
        "With --schema-registry-url and no --value-schema: the subject whose latest version gives the table's "
        "columns at start  [default: <topic>-value, Confluent's TopicNameStrategy; name a RecordNameStrategy "
        "(com.acme.Order) or TopicRecordNameStrategy (orders-com.acme.Order) subject here]"))
    keep_raw_value: bool = _opt(False, "--keep-raw-value", kind="flag", help="Keep the value bytes next to the decoded columns.")
    transform: str | None = _opt(None, "--transform", metavar="MODULE:FUNCTION",
                                 help="DataFrame -> DataFrame, applied per micro-batch.")
    partition_by: tuple[str, ...] = _opt((), "--partition-by", kind="multiple", metavar="COLUMN|TRANSFORM(COLUMN)", help=(
        "Partition the table by a column, or by a transform of one that adds its partition column (Iceberg's "
        "names): year(ts), month(ts), day(ts), hour(ts), bucket(N, col), truncate(W, col)  (repeatable)."))
    consumer_overrides: Mapping[str, Any] = _opt({}, "-X", kind="settings", help="librdkafka consumer setting (repeatable).")
    producer_overrides: Mapping[str, Any] = _opt({}, "--producer-property", kind="settings",
                                                 help="librdkafka producer setting for acks (repeatable).")
    #: the Spark tasks' principal (docs/design.md, "The pipeline's principals"): laid over the
    #: driver's settings for the tasks' clients, its credentials replacing the driver's
    worker_overrides: Mapping[str, Any] = _opt({}, "--worker-property", kind="settings", help=(
        "librdkafka setting of the Spark tasks' clients (source reads, acks), repeatable: credentials given here "
        "(sasl.username, sasl.password, ...) replace the driver's -X ones, so the tasks act as the worker principal "
        "of `chandy topics acls --worker`  [default: the tasks use the driver's]"))
    storage_options: Mapping[str, str] = _opt({}, "--storage-option", kind="settings",
                                              help=("storage setting under delta-rs's name (AWS_REGION, "
                                                    "AWS_ENDPOINT_URL, AZURE_STORAGE_ACCOUNT_NAME, ...), mapped for "
                                                    "fsspec and pyiceberg; the environment's are read too "
                                                    "(repeatable)"))
    prefix: str = _opt("chandy", "--prefix", help="Chandy topic prefix.")
    stop_when_drained: bool = _opt(False, "--until-drained", kind="flag", help="Stop once every partition is read to its end.")
    max_checkpoints: int | None = _opt(None, "--max-checkpoints", minimum=1, help="Stop after this many checkpoints.")
    errors_tolerance: ErrorsTolerance = _opt("none", "--errors-tolerance", choices=get_args(ErrorsTolerance), help=(
        "Kafka Connect's errors.tolerance: none fails the micro-batch at the first bad record (naming topic, "
        "partition, offset); all skips bad records (counted, logged)."))
    dead_letter_topic: str | None = _opt(None, "--dead-letter-topic", metavar="TOPIC", help=(
        "With --errors-tolerance all: publish bad records, raw, with Connect's __connect.errors.* headers, exactly "
        "once with their checkpoint."))
    tombstones: Tombstones = _opt("error", "--tombstones", choices=get_args(Tombstones),
                           help="With --value-format: a null value is a bad record, skipped, or a row of null columns.")
    fail_on_data_loss: bool = _opt(True, "--fail-on-data-loss/--no-fail-on-data-loss", kind="switch", help=(
        "Spark's failOnDataLoss: a partition whose log moved below the job's position (records deleted by "
        "retention or DeleteRecords before they were read, a topic deleted and created again, an unclean leader "
        "election, a topic gone) ends the job in one line naming the partition and both offsets; "
        "--no-fail-on-data-loss goes on from the new log with a warning (and counts the offsets lost in the run's "
        "summary)."))
    resume_from_table: bool = _opt(True, "--resume-from-table/--no-resume-from-table", kind="switch", help=(
        "When the coordinator log is missing or behind the table, resume from the table's offsets (or refuse)."))
    restart_backoff_initial_ms: int = _opt(1_000)  # between failed checkpoints (not a job restart)
    restart_backoff_max_ms: int = _opt(60_000)
    #: Flink's restart strategy of the job (chandy/coordinator/restart_strategy.py), its options
    #: under Flink's keys; --restart-strategy is restart-strategy.type
    restart_strategy: str | None = _opt(None, "--restart-strategy", choices=(
        "exponential-delay", "fixed-delay", "failure-rate", "none"), help=(
        "Flink's restart-strategy.type: how a failure a restart can cure (a lake or Kafka outage, a failed lake "
        "commit) restarts the job from its latest checkpoint before it ends FAILED  [default: exponential-delay]"))
    flink_conf: Mapping[str, str] = _opt({}, "-D", kind="settings", help=(
        "Flink option of the job, under Flink's name (repeatable): the restart-strategy.* options, e.g. "
        "-D restart-strategy.fixed-delay.attempts=3 -D restart-strategy.fixed-delay.delay='10 s'."))
    optimize_every: int | None = _opt(None, "--optimize-every", minimum=1, metavar="K", help=(
        "Compact the table's small files after every K-th checkpoint, while the pipeline runs."))
    optimize_target_size: int | None = _opt(None, "--optimize-target-size", minimum=1, metavar="BYTES",
                                            help="With --optimize-every: the compacted files' size (default: the table format's).")
    vacuum_every: int | None = _opt(None, "--vacuum-every", "--expire-snapshots-every", minimum=1, metavar="K", help=(
        "After every K-th checkpoint, while the pipeline runs (after any compaction): delete what the table "
        "removed more than --vacuum-retention-hours ago (Delta: lite VACUUM; Iceberg: expire snapshots, hence "
        "its other name), as `chandy lake vacuum` does."))
    vacuum_retention_hours: float = _opt(168.0, "--vacuum-retention-hours", "--retention-hours", metavar="HOURS", help=(
        "With --vacuum-every: how long removed files and old snapshots stay readable by time travel (Delta's "
        "delta.deletedFileRetentionDuration default, 7 days)."))
    vacuum_retain_last: int = _opt(1, "--retain-last", minimum=1, metavar="M", help=(
        "With --vacuum-every on an Iceberg table: keep the M newest snapshots whatever their age (Iceberg's "
        "ExpireSnapshots.retainLast; the current one always). Delta keeps every version in its log: it has no "
        "snapshots to expire."))
    catalog_properties: Mapping[str, str] = _opt({}, "--catalog-property", kind="settings", help=(
        "pyiceberg catalog property for iceberg:// tables (repeatable; default: a SQLite catalog and local warehouse)."))
    table_properties: Mapping[str, str] = _opt({}, "--table-property", kind="settings", help=(
        "Property of a table Chandy creates, under its format's name (repeatable), as Kafka Connect's "
        "iceberg.tables.auto-create-props.*: Delta's delta.* (delta.appendOnly, delta.logRetentionDuration, ...), "
        "Iceberg's (format-version, write.*, ...); write.parquet.compression-codec (zstd, snappy, gzip, lz4, brotli, "
        "uncompressed) and write.parquet.compression-level set the codec of Chandy's Parquet files in both formats "
        "[default: zstd]. An existing table keeps its own properties."))
    schema_evolution: bool = _opt(True, "--schema-evolution/--no-schema-evolution", kind="switch", help=(
        "With --value-format: a new field adds a column (Delta schema merge, Iceberg union by name); a field whose "
        "type changes always fails the micro-batch."))
    #: SchemaRegistryClient settings; the CLI's --schema-registry-url is its "url"
    schema_registry: Mapping[str, str] = _opt({}, "--schema-registry-property", kind="settings",
                                              help="Schema Registry client setting, e.g. basic.auth.user.info (repeatable).")
    metrics_port: int | None = _opt(None, "--metrics-port", minimum=0, maximum=65535, metavar="PORT", help=(
        "Serve Prometheus metrics (Flink's checkpoint metric names) at http://0.0.0.0:PORT/metrics while the "
        "coordinator runs (0: a free port)."))  # coordinator/kafka/metrics.py
    metrics_legacy_names: bool = _opt(False, "--metrics-legacy-names", kind="flag", help=(
        "Also serve Chandy 0.1's bare metric names (lastCheckpointDuration{job_id=...}) beside Flink's "
        "(flink_jobmanager_job_lastCheckpointDuration{job_id=...,job_name=...,host=...})."))
    from_savepoint: str | None = _opt(None, "--from-savepoint", metavar="URL", help=(
        "Start the job from this savepoint (Flink's `flink run -s`) when its coordinator log has none: offsets come "
        "from it, checkpoint IDs continue above it."))
    standby: bool = _opt(False, "--standby", kind="flag", help=(
        "Wait as a standby until the running coordinator of this job dies or stops, then take over."))
    ship_code: bool | None = _opt(None, "--ship-code/--no-ship-code", kind="switch", help=(
        "Ship Chandy's task code (a zip: SparkContext.addPyFile, or a pyfile artifact under --remote) to the executors, "
        "whose Python then needs only Chandy's dependencies  [default: with --remote, or --master not local]"))
    #: a subtask writes lake files whenever the Arrow batches it holds reach this many bytes, so its
    #: memory is bounded whatever the checkpoint's size (connectors/spark/task/write.py)
    write_buffer_bytes: int = _opt(DEFAULT_WRITE_BUFFER_BYTES, "--write-buffer-bytes", minimum=1, metavar="BYTES", help=(
        "A subtask writes its records as lake files whenever it holds this many bytes of Arrow data: memory stays "
        "bounded however large a checkpoint is."))
    #: how long the running pipeline rides through Kafka being unavailable (a broker's death, a
    #: leader election) before it stops with one line: retriable errors are retried with backoff
    kafka_retry_timeout_ms: int = _opt(180_000, "--kafka-retry-timeout", minimum=1, help=(
        "ms the running pipeline rides through Kafka being unavailable (a broker's death, a leader election: "
        "retriable errors, retried with backoff) before it stops."))

    routes: tuple[str, ...] = _opt((), "--route", kind="multiple", metavar="PATTERN=TABLE", help=(
        "Route records to many tables (repeatable, first match wins): PATTERN, a regex, must match the whole topic "
        "(or --route-field's value); TABLE is a Delta or iceberg:// URI that may name its groups as $1 or ${name}, "
        "e.g. 'cdc\\.sales\\.(.*)=lake/sales/$1'. TABLE may hold '=' (hive-style 'lake/events/region=$1'): the rule "
        "splits at the '=' that leaves a PATTERN without '/', and one that splits two ways is refused (write a "
        "literal '=' of PATTERN as '\\='). A table inside --table's directory is refused. Tables that do not exist "
        "are created."))
    route_field: str | None = _opt(None, "--route-field", metavar="FIELD", help=(
        "Route by this decoded field's value instead of the topic (a static map: 'eu=lake/eu'; the value as the "
        "table's name, allowed by a pattern: '([a-z_]+)=lake/$1')."))
    route_by: str = _opt("topic", "--route-by", choices=("topic", "record-name"), help=(
        "What --route's PATTERN matches: the topic, or each value's writer schema's full record name from the Schema "
        "Registry (Avro namespace.name, Protobuf package.Message, JSON Schema title), e.g. 'com\\.acme\\.(\\w+)=lake/$1'."))
    commit_threads: int = _opt(8, "--commit-threads", minimum=1, metavar="N", help=(
        "How many of a checkpoint's routed tables commit at once (the Kafka Connect Iceberg sink's "
        "iceberg.control.commit.threads), each through its own guarded commit; --table commits after them. "
        "1: one after another."))
    unrouted: str = _opt("table", "--unrouted", choices=("table", "dead-letter"), help=(
        "Records no --route rule matches land in --table, or are bad records (dead-lettered with "
        "--errors-tolerance all --dead-letter-topic, else they fail the micro-batch)."))
    cdc: ChangeFormat | None = _opt(None, "--cdc", choices=get_args(ChangeFormat), help=(
        "debezium: values are Debezium change events (before/after/op, JSON with or without schema/payload, or "
        "Avro); --value-schema then describes the row (JSON: DDL of the row; Avro: the envelope schema). upsert: "
        "each value is the row itself, keyed by --id-columns (or the Kafka key's fields), a tombstone deletes its "
        "key's row (a compacted topic's shape), --cdc-op-field may name an operation field. Either way each "
        "checkpoint upserts the last change per key (Delta MERGE, Iceberg delete + insert)."))
    cdc_op_field: str | None = _opt(None, "--cdc-op-field", metavar="FIELD", help=(
        "With --cdc upsert: the value's field holding the change's operation, as Kafka Connect's Iceberg sink "
        "(iceberg.tables.cdc-field): D (or d, delete) deletes the row, I, U, C, R (any case) upsert it; a "
        "record without the field upserts. It stays a column of the row."))
    id_columns: tuple[str, ...] = _opt((), "--id-columns", kind="multiple", metavar="COLUMN[,COLUMN]", help=(
        "With --cdc: the row's key columns (repeatable or comma-separated)  [default: the Kafka key's fields]"))
    key_schema: str | None = _opt(None, "--key-schema", read_at_file=True, help=(
        "Avro keys' schema (JSON or @file), read with --avro-framing, with --cdc or --key-format avro  [default: "
        "JSON keys, or the Schema Registry's schema with --avro-framing confluent]"))
    key_format: KeyFormat = _opt("raw", "--key-format", choices=KEY_FORMATS, help=(
        "raw: the key column holds Kafka's bytes; string: UTF-8 text; json, avro, protobuf, json-schema: the key's "
        "fields become columns key_<field> (Avro: --key-schema, or each key's writer schema from the Schema Registry; "
        "Protobuf and JSON Schema: Confluent-framed, through the Schema Registry)."))

    def __post_init__(self) -> None:
        """Validate the options, in the order a user meets them (the source, the values, the
        limits, routing and changes, the table, the schemas), and normalise ``table_uri`` and
        ``id_columns``.

        Raises:
            PipelineError: the first inconsistent or malformed option, in one line.
            DdlError, AvroValueSchemaError: a ``--value-schema`` that does not parse.
        """
        _restart_strategy_options(self.flink_conf, self.restart_strategy)  # a bad -D restart-strategy.* fails now
        self._check_source()
        self._check_value_format()
        self._check_limits()
        self._check_routing_and_cdc()
        self._check_table()
        self._check_schemas()

    def _check_source(self) -> None:
        """The topics (a list or a pattern), ``--remote``, and the starting and ending offsets."""
        if bool(self.topics) == bool(self.topic_pattern):
            raise PipelineError("give topics (a list) or a topic pattern (a regex), not both and not neither")
        if self.remote is not None and not re.fullmatch(r"sc://(\[[0-9A-Fa-f:.]+\]|[^/;:\s\[\]]+)(:\d+)?/?(;.*)?",
                                                        self.remote):
            raise PipelineError(f"--remote {redact_remote(self.remote)!r} is not a Spark Connect URL: "
                                "sc://host[:port][/;param=value;...] (e.g. sc://localhost:15002)")
        if self.topic_pattern:
            try:
                re.compile(self.topic_pattern)
            except re.error as exc:
                raise PipelineError(f"--topic-pattern {self.topic_pattern!r} is not a regex: {exc}") from exc
        try:
            parse_offsets_spec(self.starting_offsets, "--starting-offsets")
            if self.ending_offsets is not None:
                parse_offsets_spec(self.ending_offsets, "--ending-offsets", ending=True)
        except OffsetsSpecError as exc:
            raise PipelineError(str(exc)) from exc

    def _check_value_format(self) -> None:
        """The value format with its schema, Schema Registry, subject and framing."""
        if self.value_format not in (None, "json", "avro", "json-schema", "protobuf"):
            raise PipelineError(f"value format must be json, avro, json-schema or protobuf, got {self.value_format!r}")
        if self.value_format == "protobuf" and (not self.schema_registry or self.value_schema or self.cdc):
            raise PipelineError("--value-format protobuf reads each record with its writer's message from a Schema "
                                "Registry: it needs --schema-registry-url, and takes neither --value-schema nor --cdc")
        if self.value_format == "avro" and not self.value_schema and not self.schema_registry:
            raise PipelineError("Avro values need a value schema (--value-schema) or a Schema Registry "
                                "(--schema-registry-url, whose subject's latest version is the table's schema)")
        if self.value_subject and (not self.schema_registry or self.value_schema):
            raise PipelineError("--value-subject names the Schema Registry subject the columns come from: it needs "
                                "--schema-registry-url and no --value-schema")
        if self.schema_registry and not self.value_schema and not self.value_subject and (
                len(self.topics) != 1 or self.topic_pattern) and not self.routes_per_subject:
            raise PipelineError("with a Schema Registry and no --value-schema, --value-subject names the subject of "
                                "the table's columns when the job reads several topics or a --topic-pattern "
                                "(one topic's default is <topic>-value)")
        if self.avro_framing not in ("single-object", "confluent", "raw"):
            raise PipelineError(f"Avro framing must be single-object, confluent or raw, got {self.avro_framing!r}")
        if self.schema_registry and self.value_format not in ("json-schema", "protobuf") and (
                self.value_format != "avro" or self.avro_framing != "confluent") and (
                self.key_format != "avro" or self.avro_framing != "confluent" or self.value_format == "avro") and (
                self.key_format not in ("protobuf", "json-schema")):
            raise PipelineError("a Schema Registry (--schema-registry-url) needs --value-format avro --avro-framing "
                                "confluent (the registry resolves each record's writer schema by its ID), "
                                "--value-format json-schema, --value-format protobuf or --key-format avro, "
                                "protobuf or json-schema")
        if self.schema_registry and "url" not in self.schema_registry:
            raise PipelineError("Schema Registry settings need a url (--schema-registry-url)")

    def _check_limits(self) -> None:
        """The transform's spelling, bad records and dead letters, and the numeric bounds (bytes,
        checkpoints, hours, a port)."""
        if self.transform and ":" not in self.transform:
            raise PipelineError(f"--transform takes module:function, got {self.transform!r}")
        if self.errors_tolerance not in ("none", "all"):
            raise PipelineError(f"errors tolerance must be none or all, got {self.errors_tolerance!r}")
        if self.write_buffer_bytes < 1:
            raise PipelineError(f"--write-buffer-bytes takes a number of bytes >= 1, got {self.write_buffer_bytes}")
        if self.optimize_every is not None and self.optimize_every < 1:
            raise PipelineError(f"--optimize-every takes a number of checkpoints >= 1, got {self.optimize_every}")
        if self.tombstones not in ("error", "skip", "null"):
            raise PipelineError(f"tombstones must be error, skip or null, got {self.tombstones!r}")
        if self.dead_letter_topic and self.value_format is None:
            raise PipelineError("a dead-letter topic needs a value format (--value-format): raw records are never bad")
        if self.dead_letter_topic and self.errors_tolerance != "all":
            raise PipelineError("a dead-letter topic needs --errors-tolerance all (with none, the first bad record "
                                "fails the micro-batch), as Kafka Connect's errors.deadletterqueue.topic.name")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65535:
            raise PipelineError(f"--metrics-port takes a port 0-65535, got {self.metrics_port}")
        if self.vacuum_retention_hours < 0:
            raise PipelineError(f"--vacuum-retention-hours takes hours >= 0, got {self.vacuum_retention_hours}")
        if self.optimize_target_size is not None and self.optimize_target_size < 1:
            raise PipelineError(f"--optimize-target-size takes bytes >= 1, got {self.optimize_target_size}")

    def _check_table(self) -> None:
        """``--partition-by`` and ``--table-property`` (the format's names), then ``table_uri``
        normalised to an absolute URI."""
        from chandy.connectors.lake.partitioning import PartitionSpecError, parse_partition_by

        try:
            parse_partition_by(self.partition_by)
        except PartitionSpecError as exc:
            raise PipelineError(str(exc)) from exc
        try:
            from chandy.connectors.lake.delta import check_delta_properties
            from chandy.connectors.lake.sink import parquet_write_options
            from chandy.connectors.lake.tables import is_iceberg

            parquet_write_options(self.table_properties)
            if not is_iceberg(self.table_uri):
                check_delta_properties(self.table_properties)
        except ValueError as exc:
            raise PipelineError(f"--table-property {exc}") from exc
        object.__setattr__(self, "table_uri", normalize_table_uri(self.table_uri))

    def _check_schemas(self) -> None:
        """The value schema (Spark DDL, or Avro: with ``--cdc debezium`` the envelope's row) and
        the Avro key schema parse.

        Raises:
            DdlError, AvroValueSchemaError: the value schema (the error names where it fails).
            PipelineError: the key schema.
        """
        if self.value_format in ("json", "json-schema") and self.value_schema:
            from chandy.connectors.spark.ddl import parse_ddl

            parse_ddl(self.value_schema)
        if self.value_format == "avro" and self.value_schema:
            from chandy.formats.avro import change_row_schema, value_schema

            # with --cdc the columns are the envelope's row (its source block may hold any type)
            value_schema(change_row_schema(self.value_schema) if self.cdc == "debezium" else self.value_schema)
        if self.key_schema:
            from chandy.formats.avro import AvroValueSchemaError, value_schema

            try:
                value_schema(self.key_schema)
            except AvroValueSchemaError as exc:
                raise PipelineError(f"--key-schema: {exc}") from exc

    def _check_routing_and_cdc(self) -> None:
        if self.routes:
            from chandy.connectors.lake.routing import RouteError, Router
            from chandy.connectors.lake.uri import TableUriError, check_route_layout

            try:
                router = Router.parse(self.routes, self.route_field, self.route_by)
                for rule in router.rules:
                    check_route_layout(self.table_uri, rule.table)
            except (RouteError, TableUriError) as exc:
                raise PipelineError(str(exc)) from exc
        if self.route_by == "record-name" and (self.route_field or not self.routes or self.cdc or self.transform or (
                self.value_format not in ("avro", "protobuf", "json-schema")) or not self.schema_registry
                or self.value_schema):
            raise PipelineError("--route-by record-name routes by each value's writer schema from the Schema Registry: "
                                "it needs --route rules, --value-format avro, protobuf or json-schema with "
                                "--schema-registry-url "
                                "and no --value-schema, and takes neither --route-field, --cdc nor --transform")
        if self.route_field and not self.routes:
            raise PipelineError("--route-field needs --route rules (PATTERN=TABLE) to route by its value")
        if self.route_field and self.value_format is None:
            raise PipelineError("--route-field needs a value format (--value-format): raw values have no fields")
        if self.unrouted not in ("table", "dead-letter"):
            raise PipelineError(f"--unrouted must be table or dead-letter, got {self.unrouted!r}")
        if self.unrouted == "dead-letter" and (self.value_format is None or self.transform):
            raise PipelineError("--unrouted dead-letter needs a value format (--value-format) and no --transform: "
                                "unrouted records are found as they are decoded")
        if self.cdc not in (None, "debezium", "upsert"):
            raise PipelineError(f"--cdc takes debezium or upsert, got {self.cdc!r}")
        if self.cdc_op_field and self.cdc != "upsert":
            raise PipelineError("--cdc-op-field names the operation field of --cdc upsert's rows")
        if self.cdc and self.value_format is None:
            raise PipelineError(f"--cdc {self.cdc} needs --value-format json, avro or json-schema: the change "
                                "events are decoded")
        if self.cdc and self.transform:
            raise PipelineError("--cdc cannot take a --transform: the merge needs the change records as decoded "
                                "(their key, operation, partition and offset)")
        if self.key_format != "raw" and (self.cdc or (self.key_format == "avro" and not (
                self.key_schema or (self.schema_registry and self.avro_framing == "confluent"))) or (
                self.key_format in ("protobuf", "json-schema") and not self.schema_registry)):
            raise PipelineError("--key-format takes the keys of plain values (with --cdc the change's key is the row's "
                                "id); --key-format avro needs --key-schema or --schema-registry-url with Confluent "
                                "framing; --key-format protobuf and json-schema need --schema-registry-url")
        if (self.id_columns or (self.key_schema and self.key_format != "avro")) and not self.cdc:
            raise PipelineError("--id-columns and --key-schema go with --cdc debezium or upsert")
        columns = tuple(c.strip() for text in self.id_columns for c in text.split(",") if c.strip())
        object.__setattr__(self, "id_columns", columns)

    @property
    def resolved_job_id(self) -> str:
        return self.job_id or default_job_id(self.table_uri, self.topics, self.topic_pattern)

    @property
    def resolved_ship_code(self) -> bool:
        if self.ship_code is not None:
            return self.ship_code
        return bool(self.remote) or not is_local_master(self.master)

    @property
    def driver_producer_overrides(self) -> dict[str, Any]:
        """The driver's producers (the coordinator's log writer and completion transactions):
        ``producer_overrides`` completed with the security settings of ``consumer_overrides``,
        so credentials given once with ``-X`` reach every client of the driver."""
        return kafka_config.with_security_of(self.consumer_overrides, self.producer_overrides)

    @property
    def task_consumer_overrides(self) -> dict[str, Any]:
        """The Spark tasks' consumers (source ranges): the driver's, as ``worker_overrides``' principal."""
        return kafka_config.as_principal(self.consumer_overrides, self.worker_overrides)

    @property
    def task_producer_overrides(self) -> dict[str, Any]:
        """The Spark tasks' producers (acks, declines): the driver's, as ``worker_overrides``' principal."""
        return kafka_config.as_principal(self.driver_producer_overrides, self.worker_overrides)

    @property
    def resolved_job_name(self) -> str:
        """``job_name``, else ``<topics or pattern> -> <table>``."""
        source = ",".join(self.topics) if self.topics else (self.topic_pattern or "")
        return self.job_name or f"{source} -> {self.table_uri}"

    @property
    def restart_strategy_options(self) -> RestartStrategyOptions:
        """The job's restart strategy (``--restart-strategy`` and ``-D restart-strategy.*``).

        Raises:
            PipelineError: an unknown option or value, or two different types.
        """
        return _restart_strategy_options(self.flink_conf, self.restart_strategy)

    @property
    def routes_per_subject(self) -> bool:
        """Routed records read through a registry (Avro or JSON Schema without ``--value-schema``,
        or Protobuf; no ``--cdc``, no ``--route-field``): each table's columns come from its own
        records' writer schemas, and without ``--value-subject`` the job's table starts with none."""
        return bool(self.routes) and not self.route_field and not self.cdc and bool(self.schema_registry) and (
            self.value_format == "protobuf" or (self.value_format in ("avro", "json-schema") and not self.value_schema))

    @property
    def resolved_value_subject(self) -> str:
        """The Schema Registry subject of the table's columns (no ``value_schema``):
        ``value_subject``, else the one topic's ``<topic>-value`` (Confluent's ``TopicNameStrategy``)."""
        return self.value_subject or f"{self.topics[0]}-value"

    @property
    def resolved_group_id(self) -> str:
        return self.group_id or f"chandy-{self.resolved_job_id}"

    @property
    def resolved_checkpoint_dir(self) -> str:
        if self.checkpoint_dir:
            return self.checkpoint_dir
        if is_iceberg(self.table_uri):
            from chandy.connectors.lake.iceberg import default_checkpoint_dir

            return default_checkpoint_dir(self.table_uri, self.catalog_properties)
        # underscore-prefixed directories are ignored by Delta readers, as _delta_log is
        return f"{self.table_uri.rstrip('/')}/_chandy_checkpoints"

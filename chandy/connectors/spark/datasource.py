"""PySpark Python data sources (Spark 4's ``pyspark.sql.datasource``) for one micro-batch.

- ``chandy_kafka_ranges`` reads the offset ranges the Kafka source enumerator fixed for a
  checkpoint: Spark partition *i* is reader subtask *i* and reads exactly its ranges with
  :class:`~chandy.connectors.kafka.source.reader.KafkaRangeReader`, yielding Arrow batches.
- ``chandy_lake_files`` writes each Spark partition (= subtask) as Parquet files into the lake
  table location (invisible until committed) and acknowledges the checkpoint with them as state
  handles; an attempt that fails on its last allowed try declines the checkpoint instead.

Both run inside Spark tasks; what they need travels as one typed :class:`TaskOptions`, set by
:mod:`chandy.connectors.spark.pipeline`.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import pickle
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, DataSourceReader, InputPartition, WriterCommitMessage

from chandy.connectors.lake.routing import Router
from chandy.connectors.lake.sink import (
    SOURCE_METRICS_KIND,
    DataFile,
    LakeSink,
    data_files_to_handles,
    offsets_to_json,
)
from chandy.connectors.spark.options import DEFAULT_WRITE_BUFFER_BYTES
from chandy.coordinator.messages import StateHandle
from chandy.formats.decoder import ValueDecoder, decode_batches
from chandy.formats.evolution import SchemaChangeError, concat_evolving, offset_ranges
from chandy.formats.records import SPARK_DDL, to_record_batch
from chandy.formats.type_mapping import wider

RANGES_FORMAT = "chandy_kafka_ranges"
LAKE_FILES_FORMAT = "chandy_lake_files"
TASK_OPTION = "chandy.task"


@dataclasses.dataclass(frozen=True)
class TaskOptions:
    """What a Spark task of micro-batch N needs, as one typed, picklable object.

    It reaches the tasks in the closure of an RDD function, or as the single data source option
    :data:`TASK_OPTION` (:meth:`encode` / :meth:`decode`), never as loose strings.
    ``table_fields`` are the table's columns (name -> Delta type JSON) when the table exists, so
    a task refuses data of another shape before writing anything (with ``add_columns``, schema
    evolution, new columns pass and only other types are refused); ``decoder`` decodes values in
    the task (None: raw Kafka columns); ``checkpoint_dir`` is where dead letters go.
    ``write_buffer_bytes`` bounds a subtask's memory: it writes its records as lake files
    whenever the Arrow batches it holds reach that size (bytes), not once per checkpoint.
    """

    table_uri: str
    job_id: str
    checkpoint_id: int
    epoch: int
    operator_id: str
    bootstrap_servers: str
    prefix: str
    checkpoint_dir: str
    partition_by: tuple[str, ...] = ()
    storage_options: Mapping[str, str] = dataclasses.field(default_factory=dict)
    producer_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    consumer_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    max_task_failures: int = 1
    table_fields: Mapping[str, Any] | None = None
    decoder: ValueDecoder | None = None
    batch_size: int = 20_000
    catalog_properties: Mapping[str, str] = dataclasses.field(default_factory=dict)
    add_columns: bool = False
    table_location: str | None = None  # Iceberg: the table's root URL, so tasks need no catalog
    write_buffer_bytes: int = DEFAULT_WRITE_BUFFER_BYTES  # Arrow bytes a subtask holds before writing them as files
    #: routing to many tables (``--route``): rows go to the table their rule names, unrouted ones
    #: to ``table_uri`` (None: every row to ``table_uri``)
    router: Router | None = None
    unrouted: str = "table"  # "table": unrouted rows go to table_uri; "dead-letter": they are bad records
    #: ``--cdc``: rows are changes, written as change files (merged at the lake commit, never appended)
    changes: bool = False
    #: Spark's ``failOnDataLoss``: offsets of a range that Kafka no longer holds fail the task
    #: (``KafkaDataLossError``); False skips them, with a warning in the task's log
    fail_on_data_loss: bool = True
    #: ``--table-property``: set on tables the tasks' sinks create, and their files' Parquet codec
    table_properties: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: the ID of the coordinator log (in the incarnation the checkpoint's coordinator replayed)
    #: the data files are named with (``coordinator_log_id``); None: named without one
    log_id: str | None = None

    def encode(self) -> str:
        return base64.b64encode(pickle.dumps(self)).decode()

    @classmethod
    def decode(cls, text: str) -> TaskOptions:
        options = pickle.loads(base64.b64decode(text))
        if not isinstance(options, cls):
            raise TypeError(f"{TASK_OPTION} holds a {type(options).__name__}, not TaskOptions")
        return options


@dataclasses.dataclass
class RangesPartition(InputPartition):
    """One subtask's ranges: [(topic, partition, start, stop), ...]."""

    subtask: int
    ranges: list


def read_ranges(options: TaskOptions, ranges: list, clock: FetchClock | None = None) -> Iterator[pa.RecordBatch]:
    """A subtask's ranges ([topic, partition, start, stop], ...) as Arrow batches of at most
    ``options.batch_size`` records, in order, read with a reader pooled in this process
    (:mod:`chandy.connectors.spark.clients`); ``clock`` gets the Fetch requests and records the
    reader's librdkafka statistics counted meanwhile."""
    from chandy.connectors.kafka.source.split import KafkaPartitionSplit
    from chandy.connectors.spark.clients import range_reader
    from chandy.coordinator.faults import crash_point

    checkpoint_id = options.checkpoint_id
    with range_reader(options.bootstrap_servers, options.consumer_overrides) as reader:
        requests, records = reader.fetch_requests, reader.records_fetched
        for topic, p, start, stop in ranges:
            split = KafkaPartitionSplit(topic, p, start, stop)
            for messages in reader.read_batches(split, options.batch_size, fail_on_data_loss=options.fail_on_data_loss):
                yield to_record_batch(messages)
                crash_point("task-read", checkpoint_id)
        if clock is not None:  # the statistics lag up to their interval: over a run, task after task, they add up
            clock.fetch_requests += max(0, reader.fetch_requests - requests)
            clock.records_fetched += max(0, reader.records_fetched - records)


class FetchClock:
    """Watches a subtask's raw batches go by (:meth:`watch`): the newest Kafka record timestamp
    fetched (ms since the epoch) and the wall-clock time it was fetched (ms), for Flink's
    ``currentFetchEventTimeLag`` (FetchTime - EventTime of the last fetched record), and per
    (topic, partition) the newest timestamp read, for the completeness watermark the lake commit
    records (:func:`chandy.connectors.lake.sink.watermark_metadata`)."""

    def __init__(self) -> None:
        self.event_time_ms: int | None = None
        self.fetch_time_ms: int | None = None
        self.partition_event_time_ms: dict[tuple[str, int], int] = {}
        self.bytes_read = 0  # the records' keys and values, as consumed (Kafka's bytes-consumed)
        self.fetch_requests = self.records_fetched = 0  # librdkafka's counts (read_ranges), records-per-request

    def watch(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``batches``, unchanged, noting each one's newest timestamp and fetch time."""
        import time

        import pyarrow.compute as pc

        for batch in batches:
            for column in ("key", "value"):
                self.bytes_read += pc.sum(pc.binary_length(batch.column(column))).as_py() or 0
            newest = pc.max(batch.column("timestamp")).as_py() if batch.num_rows else None
            if newest is not None:
                self.event_time_ms = int(newest.timestamp() * 1000)
                self.fetch_time_ms = int(time.time() * 1000)
                per_partition = (pa.Table.from_batches([batch]).group_by(["topic", "partition"])
                                 .aggregate([("timestamp", "max")]).to_pylist())
                for row in per_partition:
                    if row["timestamp_max"] is not None:
                        key, millis = (row["topic"], row["partition"]), int(row["timestamp_max"].timestamp() * 1000)
                        self.partition_event_time_ms[key] = max(millis, self.partition_event_time_ms.get(key, millis))
            yield batch

    def state_handle(self) -> StateHandle | None:
        """The :data:`SOURCE_METRICS_KIND` handle to acknowledge with (None: no timestamp seen)."""
        if self.event_time_ms is None or self.fetch_time_ms is None:
            return None
        return StateHandle(SOURCE_METRICS_KIND, None, None, 0, {
            "event_time_ms": str(self.event_time_ms), "fetch_time_ms": str(self.fetch_time_ms),
            "bytes_read": str(self.bytes_read), "fetch_requests": str(self.fetch_requests),
            "records_fetched": str(self.records_fetched),
            "partition_event_time_ms": offsets_to_json(self.partition_event_time_ms)})


def decode_with_dead_letters(options: TaskOptions, batches: Iterator[pa.RecordBatch],
                             subtask: int) -> Iterator[pa.RecordBatch]:
    """Decode a subtask's batches with ``options.decoder`` (routed per subject: each table's
    records with its own columns, :mod:`chandy.connectors.spark.routed_decoding`); bad records (and
    the count of skipped tombstones) are written, at the end of the input, to the checkpoint's
    dead-letter file of this subtask (see :mod:`chandy.connectors.spark.dead_letters`)."""
    from chandy.connectors.spark.dead_letters import DeadLetterFile
    from chandy.connectors.spark.routed_decoding import decode_routed, routes_before_decoding

    assert options.decoder is not None
    dead = DeadLetterFile(options.checkpoint_dir, options.job_id, options.checkpoint_id, subtask,
                          options.storage_options)
    if routes_before_decoding(options):
        routed = RoutedTables(options)
        yield from decode_routed(options, batches, lambda uri: routed.fields_of(routed.sink(uri)), dead)
    elif options.router is not None and options.unrouted == "dead-letter":
        yield from without_unrouted(options, _with_raw(batches, options.decoder, dead), dead.add)
    else:
        yield from decode_batches(batches, options.decoder, dead.add, dead.add_skipped)
    dead.close()


def _with_raw(batches: Iterator[pa.RecordBatch], decoder: ValueDecoder,
              dead: Any) -> Iterator[tuple[pa.RecordBatch, pa.RecordBatch]]:
    """(raw batch, decoded batch) pairs, bad records and skipped tombstones noted in ``dead``."""
    for batch in batches:
        decoded, bad, skipped = decoder.decode(batch)
        if bad is not None:
            dead.add(bad)
        if skipped:
            dead.add_skipped(skipped)
        yield batch, decoded


def without_unrouted(options: TaskOptions, batches: Iterator[tuple[pa.RecordBatch, pa.RecordBatch]],
                     on_bad: Callable[[pa.RecordBatch], None]) -> Iterator[pa.RecordBatch]:
    """``--unrouted dead-letter``: the decoded rows no ``--route`` rule matches are bad records
    (dead letters, or the micro-batch fails under ``--errors-tolerance none``); the rest pass."""
    import pyarrow.compute as pc

    assert options.router is not None and options.decoder is not None
    router = options.router
    rule = f"route {router.field or 'topic'}"
    for raw, batch in batches:
        table = pa.Table.from_batches([batch])
        keys = router.keys(table)
        distinct = pc.unique(keys).to_pylist()
        unrouted = [k for k in distinct if router.table_for(k) is None]
        if not unrouted:
            yield batch
            continue
        mask = pc.fill_null(pc.is_in(keys, value_set=pa.array(unrouted, pa.string())), True)
        gone = table.filter(mask)
        where = set(zip(gone["topic"].to_pylist(), gone["partition"].to_pylist(), gone["offset"].to_pylist(),
                        strict=True))
        rows = [i for i, tpo in enumerate(zip(raw.column("topic").to_pylist(), raw.column("partition").to_pylist(),
                                              raw.column("offset").to_pylist(), strict=True)) if tpo in where]
        on_bad(options.decoder.refuse(raw, rows, "Unrouted",
                                      f"no --route rule matches its {rule} (--unrouted dead-letter)"))
        yield batch.filter(pc.invert(mask).combine_chunks())


def buffered(batches: Iterator[pa.RecordBatch], limit_bytes: int) -> Iterator[list[pa.RecordBatch]]:
    """``batches`` regrouped into lists that hold at least ``limit_bytes`` Arrow bytes each
    (the last one less), so a subtask holds one such list at a time, whatever its checkpoint's size."""
    held: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        held.append(batch)
        size += batch.nbytes
        if size >= limit_bytes:
            yield held
            held, size = [], 0
    if held:
        yield held


def _check_same_types(table: pa.Table, seen: dict[str, tuple[pa.DataType, str]], where: str) -> None:
    """Refuse a part whose column has another type than in an earlier part of the same
    checkpoint (what :func:`concat_evolving` checks within a part), before anything of it is written.

    Raises:
        SchemaChangeError: names the column, both types and both parts' offset ranges.
    """
    ranges = None
    for field in table.schema:
        earlier = seen.get(field.name)
        if earlier is None:
            ranges = ranges or offset_ranges(table)
            seen[field.name] = (field.type, ranges)
        elif wider(field.type, earlier[0]) is not None:  # a widened column: each part's file keeps its type
            seen[field.name] = (wider(field.type, earlier[0]), earlier[1])
        else:
            raise SchemaChangeError(
                f"{where}field {field.name} changed type: {earlier[0]} at {earlier[1]} but {field.type} at "
                f"{offset_ranges(table)}; nothing of it was landed")


def write_and_acknowledge(options: TaskOptions, batches: Iterator[pa.RecordBatch], subtask: int,
                          attempt: int, fetch_clock: FetchClock | None = None) -> tuple[int, int]:
    """Write one subtask's batches as lake files and acknowledge the checkpoint with them; on
    failure decline it when this is the last allowed attempt, and re-raise. Returns (files, rows).

    Memory stays bounded: the batches are written as files every ``options.write_buffer_bytes``
    (:func:`buffered`), each part checked against the table before it is written. Files of a
    part written before a later part failed stay unreferenced: nothing acknowledges them, and
    they are deleted with the aborted checkpoint's files. ``fetch_clock``: the subtask's fetch
    times, acknowledged with the files as a :data:`SOURCE_METRICS_KIND` handle.

    Raises:
        LakeSchemaError: the data does not fit the table (checked before its part is written).
    """
    from chandy.connectors.spark.clients import ack_sender, discard_sender, task_sink
    from chandy.connectors.spark.routed_decoding import by_destination, routes_before_decoding
    from chandy.coordinator.failure import CheckpointFailureReason
    from chandy.coordinator.faults import crash_point

    o = options
    sender = ack_sender(o.bootstrap_servers, o.job_id, prefix=o.prefix, producer_overrides=o.producer_overrides)
    try:
        where = f"checkpoint {o.checkpoint_id}: "
        sink = task_sink(o.table_uri, partition_by=tuple(o.partition_by), storage_options=o.storage_options,
                         catalog_properties=o.catalog_properties, add_columns=o.add_columns,
                         location=o.table_location, table_properties=o.table_properties)
        files: list[DataFile] = []
        rows = 0
        seen: dict[str | None, dict[str, tuple[pa.DataType, str]]] = {}  # per table, a column's earlier type
        routed, routed_first = RoutedTables(o), routes_before_decoding(o)
        for part in buffered(batches, o.write_buffer_bytes):
            for group_uri, group in by_destination(part) if routed_first else [(None, part)]:
                table = concat_evolving(group, where=where)
                _check_same_types(table, seen.setdefault(group_uri, {}), where)
                destinations = ([(group_uri, table)] if routed_first or o.router is None else o.router.split(table))
                for table_uri, data in destinations:
                    files += routed.write(sink if table_uri in (None, o.table_uri) else routed.sink(table_uri), data,
                                          subtask, attempt)
                rows += table.num_rows
                del table, destinations
            del part
        crash_point("task-written", o.checkpoint_id)
        handles = data_files_to_handles(files)  # each distinct schema once, not once a file
        metrics = fetch_clock.state_handle() if fetch_clock is not None else None
        sender.acknowledge(o.epoch, o.checkpoint_id, o.operator_id, subtask, attempt,
                           handles + ([metrics] if metrics is not None else []))
        return len(files), rows
    except Exception as exc:
        # Spark retries a failed task; only its last allowed attempt declines the checkpoint
        if attempt + 1 >= o.max_task_failures:
            try:
                sender.decline(o.epoch, o.checkpoint_id, o.operator_id, subtask, attempt,
                               CheckpointFailureReason.CHECKPOINT_DECLINED, f"{type(exc).__name__}: {exc}")
            except Exception:  # noqa: BLE001 - the checkpoint then expires instead
                pass
        discard_sender(sender)
        raise


class RoutedTables:
    """What one subtask writes to each table of a checkpoint: the job's own table (``sink``) or a
    routed one (opened once per process, its columns read once per subtask and checkpoint), as
    data files, or as change files with ``changes`` (``--cdc``)."""

    def __init__(self, options: TaskOptions) -> None:
        self.options = options
        self._fields: dict[str, Mapping[str, Any] | None] = {}

    def sink(self, table_uri: str) -> LakeSink:
        from chandy.connectors.spark.clients import task_sink

        o = self.options
        return task_sink(table_uri, partition_by=tuple(o.partition_by), storage_options=o.storage_options,
                         catalog_properties=o.catalog_properties, add_columns=o.add_columns,
                         table_properties=o.table_properties)

    def fields_of(self, sink: LakeSink) -> Mapping[str, Any] | None:
        """``sink``'s table's columns (name to Delta type JSON; None: no table yet), read once."""
        if sink.table_uri == self.options.table_uri:
            return self.options.table_fields
        if sink.table_uri not in self._fields:
            self._fields[sink.table_uri] = sink.table_fields()
        return self._fields[sink.table_uri]

    def write(self, sink: LakeSink, data: pa.Table, subtask: int, attempt: int) -> list[DataFile]:
        """Check ``data`` against ``sink``'s table and write it. Returns the files, each naming
        its table when it is a routed one, and its key columns when it is a change file.

        Raises:
            LakeSchemaError: the data does not fit the table.
        """
        from chandy.formats.debezium import OP_COLUMN, ChangeEventError
        from chandy.formats.decoder import BadRecordError

        o = self.options
        fields = self.fields_of(sink)
        shape = data.schema.remove(data.schema.get_field_index(OP_COLUMN)) if o.changes else data.schema
        if fields is not None:
            sink.check_schema(shape, fields, where=f"checkpoint {o.checkpoint_id} ({offset_ranges(data)}): ")
        written = sink.write_files(data, job_id=o.job_id, checkpoint_id=o.checkpoint_id, subtask=subtask, table_fields=fields,
                                   attempt=attempt, partitioned=not o.changes,
                                   log_id=o.log_id)
        changes: dict[str, Any] = {}
        if o.changes and written:
            assert o.decoder is not None
            try:
                changes["id_columns"] = o.decoder.key_fields(data.column("key")[0].as_py())
            except ChangeEventError as exc:
                raise BadRecordError(f"checkpoint {o.checkpoint_id} ({offset_ranges(data)}): the key columns of "
                                     f"table {sink.table_uri} are unknown: {exc} (give --id-columns)") from exc
        if sink.table_uri != o.table_uri:
            changes["table_uri"] = sink.table_uri
        return [dataclasses.replace(f, **changes) for f in written] if changes else written


#: the row each task of :func:`read_write_and_acknowledge` returns (Spark DDL)
TASK_RESULT_DDL = "subtask long, attempt long, files long, records long"


def read_write_and_acknowledge(options: TaskOptions, per_subtask: list[list[list]]
                               ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """For ``spark.range(n, numPartitions=n).mapInArrow(...)`` (a DataFrame operation, so classic
    Spark and Spark Connect run it alike): partition *i* is subtask *i*, whose task reads its
    ranges ``per_subtask[i]`` (``[topic, partition, start, stop]`` lists), decodes them (with a
    decoder), writes them and acknowledges, all in one Python worker (no round trip through the
    JVM): the path without a transform. Each task returns one :data:`TASK_RESULT_DDL` row."""

    def task(rows: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in rows:  # partition i holds the one row i
            pass
        context = task_context()
        subtask, attempt = context.partitionId(), context.attemptNumber()
        clock = FetchClock()
        batches = clock.watch(read_ranges(options, per_subtask[subtask], clock))
        if options.decoder is not None:
            batches = decode_with_dead_letters(options, batches, subtask)
        files, records = write_and_acknowledge(options, batches, subtask, attempt, clock)
        yield pa.RecordBatch.from_pydict({"subtask": [subtask], "attempt": [attempt], "files": [files],
                                          "records": [records]},
                                         pa.schema([(name, pa.int64()) for name in ("subtask", "attempt", "files", "records")]))

    return task


def task_context() -> Any:
    """The running Spark task's ``TaskContext`` (partition = subtask, attempt number).

    Raises:
        RuntimeError: not inside a Spark task.
    """
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("not inside a Spark task: no TaskContext")
    return context


class _RangesReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = options

    def partitions(self) -> list[RangesPartition]:
        per_subtask = json.loads(self.options["ranges"])
        return [RangesPartition(i, ranges) for i, ranges in enumerate(per_subtask)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangesPartition)
        return read_ranges(TaskOptions.decode(self.options[TASK_OPTION]), partition.ranges)


class KafkaRangesDataSource(DataSource):
    """``spark.read.format("chandy_kafka_ranges")``: a checkpoint's offset ranges as rows."""

    @classmethod
    def name(cls) -> str:
        return RANGES_FORMAT

    def schema(self) -> str:
        return SPARK_DDL

    def reader(self, schema) -> DataSourceReader:
        return _RangesReader(self.options)


@dataclasses.dataclass
class FilesWritten(WriterCommitMessage):
    subtask: int
    attempt: int
    files: int
    records: int


class _LakeFilesWriter(DataSourceArrowWriter):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FilesWritten:
        context = task_context()
        subtask, attempt = context.partitionId(), context.attemptNumber()
        files, rows = write_and_acknowledge(TaskOptions.decode(self.options[TASK_OPTION]), iterator, subtask, attempt)
        return FilesWritten(subtask, attempt, files, rows)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # the lake committer commits, on checkpoint completion

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # unreferenced files are deleted when the checkpoint aborts


class LakeFilesDataSource(DataSource):
    """``df.write.format("chandy_lake_files")``: lake files plus checkpoint acknowledgements."""

    @classmethod
    def name(cls) -> str:
        return LAKE_FILES_FORMAT

    def writer(self, schema, overwrite: bool) -> DataSourceArrowWriter:
        return _LakeFilesWriter(self.options)

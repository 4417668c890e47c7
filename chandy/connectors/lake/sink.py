"""What every lake sink shares, and the interface a sink implements (:class:`LakeSink`).

A sink writes *data files* from the Spark tasks (:class:`DataFile`: invisible until committed,
named :data:`DATA_FILE_NAME` so files no commit references can be found and deleted) and adds a
checkpoint's files in one idempotent table commit recording (job ID, checkpoint ID, the end offset
of every (topic, partition) landed: :class:`TableProgress`). Delta
(:mod:`chandy.connectors.lake.delta`) and Iceberg (:mod:`chandy.connectors.lake.iceberg`) each
implement :class:`LakeSink` and import nothing of each other; a third format would add a module of
its own and a line to :func:`chandy.connectors.lake.tables.open_sink`. Schemas are compared as Delta
types (one type system for both formats: :func:`schema_differences`, :func:`merge_schemas`).
"""

from __future__ import annotations

import abc
import base64
import dataclasses
import datetime
import hashlib
import json
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from types import EllipsisType
from typing import Any, Protocol

import pyarrow as pa

from chandy.coordinator.errors import ChandyError, SuppressRestartsError
from chandy.coordinator.messages import StateHandle
from chandy.formats.type_mapping import utc_schema

#: the kind of a data file's state handle (:meth:`DataFile.to_state_handle`, :func:`data_files_to_handles`)
FILE_KIND = "lake-file"
#: the kind of the state handle that carries one Arrow schema (IPC bytes, ``inline_data``) for the
#: file handles of the same acknowledgement that name it by :data:`SCHEMA_HASH` (:func:`data_files_to_handles`)
SCHEMA_KIND = "lake-schema"
#: the property of a schema handle, and of a file handle that references it, holding the schema's
#: key: the first 16 hex digits (64 bits) of the SHA-256 of its IPC bytes
SCHEMA_HASH = "schema_hash"
#: the kind of the state handle a pipeline task acknowledges besides its files: the newest Kafka
#: record timestamp it fetched and when (``chandy.connectors.spark.task.read.FetchClock``), for
#: Flink's ``currentFetchEventTimeLag``, and per partition the newest it read (``partition_event_time_ms``,
#: JSON as ``chandy.offsets``), for the completeness watermark
SOURCE_METRICS_KIND = "source-metrics"
#: a data file's name: ``part-chandy-<job ID[:8]>-<checkpoint:010d>-<subtask:05d>-a<attempt>-log<log ID>-<random
#: hex>.parquet`` (:func:`data_file_name`); files written before log IDs have no ``-log<log ID>``
DATA_FILE_NAME = re.compile(r"part-chandy-(?P<job>[0-9a-zA-Z]{1,8})-(?P<checkpoint>\d{10})-(?P<subtask>\d{5})"
                            r"-a(?P<attempt>\d+)-(?:log(?P<log>[0-9a-f]{8})-)?[0-9a-f]+\.parquet$")


def coordinator_log_id(prefix: str, job_id: str, incarnation: str | None = None) -> str:
    """The ID (8 hex digits) of job ``job_id``'s coordinator log under topic prefix ``prefix``,
    in its ``incarnation`` (the log topic's Kafka topic ID, ``OperatorCoordinatorContext.
    log_incarnation``; None: the ID of the prefix and job alone, as files written before
    incarnations carry), which every data file its runs write carries (:func:`data_file_name`).
    A cleanup deletes only the files of its own log (and files without a log ID): the
    coordinators of one log incarnation are ordered by fencing and by the checkpoint IDs the log
    hands out, so a cleanup bounded by its log's IDs never meets a file another coordinator of that
    log may still commit. A second log of the same job (another ``--prefix``: an operator's
    mistake nothing fences) hands out the same IDs, and so does a lost log created again, while
    a coordinator of the old one may still be committing (issue 54): their files are never this
    log's to delete (docs/design.md §7, "Cleanup")."""
    return with_incarnation(hashlib.sha256(f"{prefix}/{job_id}".encode()).hexdigest()[:8], incarnation)


def with_incarnation(log_id: str, incarnation: str | None) -> str:
    """``log_id`` (:func:`coordinator_log_id` without an incarnation) in log ``incarnation``
    (None: ``log_id`` itself): 8 hex digits of the SHA-256 of ``<log_id>/<incarnation>``."""
    if incarnation is None:
        return log_id
    return hashlib.sha256(f"{log_id}/{incarnation}".encode()).hexdigest()[:8]


def data_file_name(job_id: str, checkpoint_id: int, subtask: int, attempt: int, log_id: str | None) -> str:
    """A new data file's name (:data:`DATA_FILE_NAME`; ``log_id``: :func:`coordinator_log_id`,
    None for a writer that knows no log), unique by its random part."""
    log = f"log{log_id}-" if log_id else ""
    return f"part-chandy-{job_id[:8]}-{checkpoint_id:010d}-{subtask:05d}-a{attempt}-{log}{uuid.uuid4().hex[:12]}.parquet"


class LakeCommitError(ChandyError):
    """A lake commit failed (storage error), or would land records the table already holds."""


class LakeSchemaError(LakeCommitError, SuppressRestartsError):
    """The data's schema does not fit the table's (a column the table lacks, or another type)."""


class LakeDivergenceError(LakeCommitError, SuppressRestartsError):
    """The table and the checkpoint disagree about what landed (a range the table holds already,
    another coordinator's ranges under the same checkpoint ID, files gone): committing would lose
    or duplicate records, and a restart would meet the same disagreement."""


class LakeLayoutError(LakeCommitError, SuppressRestartsError):
    """Two tables of one job whose locations nest (one inside the other's directory): each one's
    data files and cleanup would meet the other's."""


TP = tuple[str, int]


def check_unchanged(table_uri: str, job_id: str, checkpoint_id: int, done: int | None,
                    checked_at: int | None | EllipsisType) -> None:
    """A sink's commit of ``checkpoint_id`` goes on only while the job's newest checkpoint in the
    table (``done``, just read by the commit) is still the one the committer checked the commit's
    ranges against (``checked_at``; ``...``: not given). Another coordinator of the job committed
    between the check and the commit otherwise (a zombie, a run it did not fence, one job under two
    coordinator logs), and committing would land what that commit may hold twice (found by the
    commit-protocol simulation, family ``two-logs-faults``). A ``done`` at or past
    ``checkpoint_id`` is the caller's (the table holds it: nothing is committed, and the committer
    compares what it holds).

    Raises:
        LakeCommitError: the checkpoint fails; the next one reads the table again.
    """
    if checked_at is ... or done == checked_at or (done is not None and done >= checkpoint_id):
        return
    then = "none of the job's checkpoints" if checked_at is None else f"the job's checkpoint {checked_at}"
    raise LakeCommitError(
        f"committing checkpoint {checkpoint_id} to {table_uri}: another coordinator of job {job_id} committed its "
        f"checkpoint {done} since this commit's ranges were checked against the table (which then held {then}); "
        "not committed, so no record lands twice: the next checkpoint reads the table again")


#: commitInfo (Delta) / snapshot summary and table property (Iceberg) key of a random token each
#: commit carries: after a conflict, the table's commit of the checkpoint is this writer's only if it
#: holds the token (a fenced coordinator then does not report a newer one's commit as its own)
COMMIT_TOKEN = "chandy.commit_token"
#: commitInfo (Delta) / snapshot summary (Iceberg) keys of the records and data files a commit added
RECORDS_KEY = "chandy.records"
FILES_KEY = "chandy.files"
#: the completeness watermark a commit records (commitInfo / snapshot summary, and an Iceberg table
#: property per job): per partition the newest Kafka record timestamp the job has landed (JSON as
#: ``chandy.offsets``, ms), and their minimum (ms); Iceberg's snapshots also carry the minimum
#: under Kafka Connect's Iceberg sink's name, as an ISO-8601 instant
EVENT_TIMES_KEY = "chandy.event_time_ms"
VALID_THROUGH_KEY = "chandy.valid_through_ms"
ICEBERG_VALID_THROUGH_KEY = "kafka.connect.valid-through-ts"
#: attempts of a commit (or an OPTIMIZE) that meets a concurrent commit delta-rs cannot rebase
COMMIT_ATTEMPTS = 8



@dataclasses.dataclass(frozen=True)
class TableProgress:
    """What a table says it holds for one job, from its app transactions and ``commitInfo``.

    ``checkpoint_id``: the job's newest committed checkpoint (its app transaction version), or
    None; ``offsets``: end offset (exclusive) per (topic, partition) landed by the job;
    ``cluster_id``: the Kafka cluster the job's newest commit read from; ``other_jobs``: the
    offsets other jobs recorded in the same table, by job ID; ``event_times``: the completeness
    watermark's per-partition times the newest commit recorded (:func:`watermark_metadata`).
    """

    checkpoint_id: int | None
    offsets: Mapping[TP, int]
    cluster_id: str | None
    other_jobs: Mapping[str, Mapping[TP, int]]
    #: per (topic, partition) the newest Kafka record timestamp (ms) the job's commits landed
    event_times: Mapping[TP, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class LakeCommit:
    """One job's commit of one checkpoint to a table, as the table records it.

    ``table_version`` is what a reader time-travels to: Delta's commit version, Iceberg's snapshot
    ID (None: an Iceberg table with no snapshot yet); ``previous_table_version`` the version just
    before it (Delta: ``table_version - 1``; Iceberg: the parent snapshot; None for a table's
    first commit; equal to ``table_version`` for an Iceberg commit that added no data file and so
    made no snapshot). ``records`` and ``files`` the commit added (None when an older Chandy
    made the commit without recording them); ``timestamp`` in ms since the epoch; ``offsets`` the
    job's cumulative end offsets the commit recorded (``chandy.offsets``; None when it recorded
    none, or the table keeps them elsewhere); ``event_times`` the completeness watermark's
    per-partition times it recorded (:data:`EVENT_TIMES_KEY`; None when none); ``valid_through_ms``
    the completeness watermark it recorded (:data:`VALID_THROUGH_KEY`; None when none).
    """

    checkpoint_id: int
    table_version: int | None
    previous_table_version: int | None
    records: int | None
    files: int | None
    timestamp: int
    offsets: Mapping[TP, int] | None = None
    event_times: Mapping[TP, int] | None = None
    valid_through_ms: int | None = None
    #: the tables (URIs, sorted, this one's included) one catalog request committed together with this
    #: one (an Iceberg REST multi-table commit); None when committed alone or read back from history
    committed_with: tuple[str, ...] | None = None


def recorded_valid_through(metadata: Mapping[str, Any]) -> int | None:
    """The completeness watermark (ms) a commit's ``commitInfo`` or snapshot summary records
    (:data:`VALID_THROUGH_KEY`), None when it records none or an unreadable one."""
    try:
        return int(metadata[VALID_THROUGH_KEY])
    except (KeyError, TypeError, ValueError):
        return None


def offsets_to_json(offsets: Mapping[TP, int]) -> str:
    nested: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(offsets.items()):
        nested.setdefault(topic, {})[str(partition)] = int(offset)
    return json.dumps(nested, separators=(",", ":"))


def offsets_from_json(text: str | None) -> dict[TP, int]:
    if not text:
        return {}
    try:
        nested = json.loads(text)
        return {(topic, int(p)): int(o) for topic, parts in nested.items() for p, o in parts.items()}
    except (ValueError, AttributeError, TypeError) as exc:
        raise LakeCommitError(f"the table's chandy.offsets commit metadata is not readable: {text[:200]!r}: {exc}") from exc


def valid_through_ms(event_times: Mapping[TP, int] | None, partitions: Iterable[TP] | None = None,
                     idle: Iterable[TP] = ()) -> int | None:
    """The completeness watermark (ms) of per-partition ``event_times`` (the newest Kafka record
    timestamp landed of each partition read), over the job's assigned ``partitions`` (default, or
    when empty: those of ``event_times``), as a Flink watermark combines its inputs': the minimum
    over every partition that is not ``idle`` (Flink's ``WatermarkStrategy.withIdleness``), and
    None while one of them has not been read yet (a Flink split that emitted nothing holds its
    output at ``Long.MIN_VALUE``). When every partition is idle, the minimum over those read (a
    Flink output whose inputs are all idle emits no new watermark). Within a partition whose
    timestamps grow with its offsets (Kafka's LogAppendTime, or producers that stamp records in
    order), every record stamped before it has landed."""
    times = event_times or {}
    assigned = set(partitions or ()) or set(times)
    active = assigned - set(idle)
    if not active:
        known = [times[tp] for tp in assigned if tp in times]
        return min(known) if known else None
    if any(tp not in times for tp in active):
        return None
    return min(times[tp] for tp in active)


def watermark_metadata(event_times: Mapping[TP, int] | None, *, iceberg: bool = False,
                       valid_through: int | None | EllipsisType = ...) -> dict[str, str]:
    """The commit metadata that records ``event_times`` (:data:`EVENT_TIMES_KEY`) and the
    completeness watermark ``valid_through`` (:data:`VALID_THROUGH_KEY`, with ``iceberg`` also
    :data:`ICEBERG_VALID_THROUGH_KEY` as Kafka Connect's Iceberg sink writes it; ``...``: their
    minimum, :func:`valid_through_ms`; None: not recorded, an assigned partition is unread); empty
    when there are no times."""
    if not event_times:
        return {}
    valid = valid_through_ms(event_times) if valid_through is ... else valid_through
    metadata = {EVENT_TIMES_KEY: offsets_to_json(event_times)}
    if valid is None:
        return metadata
    metadata[VALID_THROUGH_KEY] = str(valid)
    if iceberg:
        instant = datetime.datetime.fromtimestamp(valid / 1000, datetime.UTC)
        metadata[ICEBERG_VALID_THROUGH_KEY] = instant.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return metadata


def _type_shape(delta_type_json: Any) -> Any:
    """A Delta type's JSON without nullability and metadata, for comparing types."""
    if isinstance(delta_type_json, dict):
        return {k: _type_shape(v) for k, v in delta_type_json.items()
                if k not in ("nullable", "containsNull", "valueContainsNull", "metadata")}
    if isinstance(delta_type_json, list):
        return [_type_shape(v) for v in delta_type_json]
    return delta_type_json


def _type_text(delta_type_json: Any) -> str:
    return delta_type_json if isinstance(delta_type_json, str) else json.dumps(_type_shape(delta_type_json))


def delta_fields(data: pa.Schema) -> dict[str, Any]:
    """``data``'s columns as Delta types (name -> Delta type JSON), zoned timestamps as UTC at
    every depth (:func:`~chandy.formats.type_mapping.utc_schema`)."""
    from deltalake import Schema as DeltaSchema

    return {f["name"]: f["type"] for f in json.loads(DeltaSchema.from_arrow(utc_schema(data)).to_json())["fields"]}


def _lake_widens(narrow: Any, wide: Any) -> bool:
    """:func:`~chandy.formats.type_mapping.widens` for two Delta type JSONs (``integer`` to
    ``long``, ``float`` to ``double``, ``decimal(P,S)`` to a greater precision)."""
    if not isinstance(narrow, str) or not isinstance(wide, str):
        return False
    first, second = (re.fullmatch(r"decimal\((\d+),\s*(\d+)\)", t) for t in (narrow, wide))
    if first is not None and second is not None:
        (p1, s1), (p2, s2) = map(int, first.groups()), map(int, second.groups())
        return s1 == s2 and p2 > p1
    return (narrow, wide) in (("integer", "long"), ("float", "double"))


def schema_differences(data: pa.Schema, table_fields: Mapping[str, Any], *, add_columns: bool = False,
                       widen: bool = False) -> list[str]:
    """What stops ``data`` (Arrow) from landing in a table whose columns are ``table_fields``
    (name -> Delta type JSON); empty when it fits. Columns of the table the data lacks are fine
    (they land as nulls); a column of another type is a difference, and so is a column the table
    lacks unless ``add_columns`` (schema evolution: the commit adds it). With ``widen`` (Iceberg
    with schema evolution), a column the data has in a type the table's :func:`_lake_widens` to
    (older files read through the table's type) or wider than the table's (the commit widens the
    column) fits."""
    mine = delta_fields(data)
    problems = []
    for name, kind in mine.items():
        if name not in table_fields:
            if not add_columns:
                problems.append(f"column {name} ({_type_text(kind)}) is not in the table")
        elif widen and (_lake_widens(kind, table_fields[name]) or _lake_widens(table_fields[name], kind)):
            continue
        elif _type_shape(kind) != _type_shape(table_fields[name]):
            problems.append(f"column {name} is {_type_text(kind)} in the data but "
                            f"{_type_text(table_fields[name])} in the table")
    return problems


EVOLUTION_NOTE = "new columns are added with schema evolution; a column of another type is refused"


def evolves(data: pa.Schema, table_fields: Mapping[str, Any] | None) -> bool:
    """Whether landing ``data`` changes the table's schema: a column the table lacks, or one the
    data has wider than the table's (:func:`_lake_widens`)."""
    fields = table_fields or {}
    return any(name not in fields or _lake_widens(fields[name], kind) for name, kind in delta_fields(data).items())


def merge_schemas(schemas: Sequence[pa.Schema], *, where: str = "", widen: bool = False) -> pa.Schema:
    """The union of ``schemas`` by column name (first appearance order), as Iceberg's
    ``union_by_name`` and Delta's schema merge do; a missing column is fine; with ``widen``, a
    column of two types one widens to is the wider (:func:`_lake_widens`).

    Raises:
        LakeSchemaError: one column of two types, naming it and both types.
    """
    seen: dict[str, pa.Field] = {}
    kinds: dict[str, Any] = {}
    for schema in schemas:
        for name, kind in delta_fields(schema).items():
            if name not in seen:
                seen[name], kinds[name] = schema.field(name), kind
            elif widen and _lake_widens(kinds[name], kind):
                seen[name], kinds[name] = schema.field(name), kind
            elif widen and _lake_widens(kind, kinds[name]):
                continue
            elif _type_shape(kinds[name]) != _type_shape(kind):
                raise LakeSchemaError(f"{where}column {name} is {_type_text(kind)} in one file but "
                                      f"{_type_text(kinds[name])} in another: nothing was committed")
    return pa.schema(list(seen.values()))


@dataclasses.dataclass(frozen=True)
class DataFile:
    """A Parquet file written into the table location, not yet committed.

    ``path`` is relative to the table root; ``size`` in bytes; ``records`` rows; ``schema`` the
    table's Arrow schema (with the partition columns) as base64 IPC.
    """

    path: str
    size: int
    records: int
    partition_values: Mapping[str, str | None]
    modification_time: int
    schema: str
    #: the table the file belongs to when the job routes records to many tables (None: the job's own)
    table_uri: str | None = None
    #: a change file (``--cdc``): the key columns its rows are merged on (None: a data file to append)
    id_columns: tuple[str, ...] | None = None
    #: the file's column statistics in the Delta protocol's ``stats`` form (JSON: ``numRecords``,
    #: ``minValues``, ``maxValues``, ``nullCount``; :func:`file_stats`), None when not computed
    stats: str | None = None

    def to_state_handle(self, *, schema_hash: str | None = None) -> StateHandle:
        """This file's state handle (kind :data:`FILE_KIND`; ``state_size`` is the file's bytes).

        With ``schema_hash`` (:func:`schema_hash`) the handle names its schema by that key and is
        only readable with the :data:`SCHEMA_KIND` handle carrying it (:func:`data_files_to_handles`
        writes both); without, the schema is inline as base64 text (1 to 3 KB a file), the
        self-contained form every file had before.
        """
        properties = {"records": str(self.records), "partition_values": json.dumps(dict(self.partition_values)),
                      "modification_time": str(self.modification_time)}
        if schema_hash is None:
            properties["schema"] = self.schema
        else:
            properties[SCHEMA_HASH] = schema_hash
        if self.table_uri is not None:
            properties["table_uri"] = self.table_uri
        if self.id_columns is not None:
            properties["id_columns"] = json.dumps(list(self.id_columns))
        if self.stats is not None:
            properties["stats"] = self.stats
        return StateHandle(FILE_KIND, self.path, None, self.size, properties)

    @classmethod
    def from_state_handle(cls, handle: StateHandle, schemas: Mapping[str, str] | None = None) -> DataFile:
        """The file of ``handle`` (kind :data:`FILE_KIND`), its schema inline or, for a handle that
        names it by hash, looked up in ``schemas`` (hash to base64 IPC, :func:`schemas_of`).

        Raises:
            LakeCommitError: the handle names a schema ``schemas`` lacks.
        """
        p = handle.properties
        schema = p.get("schema")
        if schema is None:
            key = p.get(SCHEMA_HASH)
            schema = (schemas or {}).get(key or "")
            if schema is None:
                raise LakeCommitError(f"the state handle of data file {handle.path} names schema {key}, which no "
                                      f"{SCHEMA_KIND} handle of its checkpoint carries")
        id_columns = p.get("id_columns")
        return cls(handle.path or "", handle.state_size, int(p["records"]), json.loads(p["partition_values"]),
                   int(p["modification_time"]), schema, p.get("table_uri"),
                   None if id_columns is None else tuple(json.loads(id_columns)), p.get("stats"))


def file_stats(table: pa.Table) -> str:
    """The Delta protocol's per-file ``stats`` of the rows ``table`` holds (the file's columns,
    partition columns left out), JSON: ``numRecords``, and for each top-level integer column
    (8 to 64 bits, signed or not) ``minValues``, ``maxValues`` (of its non-null values; left out
    when all are null) and ``nullCount``: exact values, so a reader's data skipping (Spark's, delta-rs's
    ``MERGE`` file pruning) skips a file only when no row of it can match. Other types are left
    out (a reader then reads the file), as the protocol allows any column's statistics to be."""
    import pyarrow.compute as pc

    minimum: dict[str, int] = {}
    maximum: dict[str, int] = {}
    nulls: dict[str, int] = {}
    for field, column in zip(table.schema, table.columns, strict=True):
        if not pa.types.is_integer(field.type):
            continue
        nulls[field.name] = column.null_count
        if column.null_count < len(column):
            bounds = pc.min_max(column)
            minimum[field.name], maximum[field.name] = bounds["min"].as_py(), bounds["max"].as_py()
    stats: dict[str, object] = {"numRecords": table.num_rows}
    if nulls:
        stats.update(minValues=minimum, maxValues=maximum, nullCount=nulls)
    return json.dumps(stats, separators=(",", ":"))


def schema_hash(ipc: bytes) -> str:
    """The key of a schema's IPC bytes in state handles: the first 16 hex digits of their SHA-256."""
    return hashlib.sha256(ipc).hexdigest()[:16]


def data_files_to_handles(files: Iterable[DataFile]) -> list[StateHandle]:
    """The state handles of ``files`` for one acknowledgement: each distinct schema once, as a
    :data:`SCHEMA_KIND` handle (its IPC bytes in ``inline_data``, its :func:`schema_hash` in
    :data:`SCHEMA_HASH`; ``state_size`` 0, so a checkpoint's size stays its files' bytes), then one
    :data:`FILE_KIND` handle per file naming its schema by hash. An ack of 10,000 files then carries
    its schema once instead of 10,000 times (about 250 bytes a file instead of 2 KB and more)."""
    files = list(files)
    keys: dict[str, str] = {}  # base64 schema -> hash
    handles: list[StateHandle] = []
    for text in dict.fromkeys(f.schema for f in files):
        ipc = base64.b64decode(text)
        keys[text] = key = schema_hash(ipc)
        handles.append(StateHandle(SCHEMA_KIND, None, ipc, 0, {SCHEMA_HASH: key}))
    return handles + [f.to_state_handle(schema_hash=keys[f.schema]) for f in files]


def schemas_of(handles: Iterable[StateHandle]) -> dict[str, str]:
    """The schemas the :data:`SCHEMA_KIND` handles among ``handles`` carry: hash to base64 IPC.

    Raises:
        LakeCommitError: a schema handle without bytes, or whose bytes do not have its hash.
    """
    schemas = {}
    for handle in handles:
        if handle.kind != SCHEMA_KIND:
            continue
        key = handle.properties.get(SCHEMA_HASH, "")
        if handle.inline_data is None or schema_hash(handle.inline_data) != key:
            raise LakeCommitError(f"a {SCHEMA_KIND} state handle is damaged: its bytes do not have its hash {key!r}")
        schemas[key] = base64.b64encode(handle.inline_data).decode()
    return schemas


def data_files_from_handles(handles: Iterable[StateHandle]) -> list[DataFile]:
    """The data files among ``handles`` (kind :data:`FILE_KIND`, in order), each with its schema:
    inline (the form Chandy wrote before schemas were carried once per ack, still found in older
    checkpoints' ``_metadata``) or from the :data:`SCHEMA_KIND` handle its hash names. ``handles``
    may be those of several subtasks (hashes are content keys).

    Raises:
        LakeCommitError: a file names a schema no handle carries, or a schema handle is damaged.
    """
    handles = list(handles)
    schemas = schemas_of(handles)
    return [DataFile.from_state_handle(h, schemas) for h in handles if h.kind == FILE_KIND]


def schema_to_b64(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_b64(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


#: Parquet codecs of ``write.parquet.compression-codec`` (Iceberg's table property and values)
PARQUET_CODECS = ("zstd", "snappy", "gzip", "lz4", "brotli", "uncompressed")


def parquet_write_options(table_properties: Mapping[str, str] | None) -> dict[str, Any]:
    """``pyarrow.parquet.write_table``'s ``compression`` and ``compression_level`` for Chandy's
    data files, from the table properties given for the table (``--table-property``) under
    Iceberg's names ``write.parquet.compression-codec`` (default zstd, Iceberg's default since
    1.4) and ``write.parquet.compression-level`` (default: the codec's), for both formats.

    Raises:
        ValueError: an unknown codec or a level that is not an integer (naming the property).
    """
    properties = table_properties or {}
    codec = properties.get("write.parquet.compression-codec", "zstd").lower()
    if codec not in PARQUET_CODECS:
        raise ValueError(f"write.parquet.compression-codec={codec}: not one of {', '.join(PARQUET_CODECS)}")
    level = properties.get("write.parquet.compression-level")
    try:
        compression_level = None if level in (None, "") else int(level)
    except ValueError as exc:
        raise ValueError(f"write.parquet.compression-level={level}: not an integer") from exc
    return {"compression": "none" if codec == "uncompressed" else codec, "compression_level": compression_level}


def write_parquet(fs: Any, path: str, table: pa.Table, options: Mapping[str, Any]) -> int:
    """Write ``table`` as one Parquet file at ``path`` on the fsspec file system ``fs``, with
    ``pyarrow.parquet.write_table``'s ``options`` (:func:`parquet_write_options`). Returns its
    size (bytes): what was written, without a stat of the file (a HEAD on an object store). The
    parent directory is made only when opening fails for want of it (a local disk's first file
    of a table or partition; an object store has no directories).

    Raises:
        OSError: the file cannot be written.
    """
    import pyarrow.parquet as pq

    try:
        handle = fs.open(path, "wb")
    except FileNotFoundError:
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
        handle = fs.open(path, "wb")
    with handle:
        pq.write_table(table, handle, **options)
        handle.flush()
        return int(handle.tell())


class SchemaChecked(abc.ABC):
    """What both formats share to refuse data that does not fit their table: a base of
    :class:`~chandy.connectors.lake.delta.DeltaLakeSink` and
    :class:`~chandy.connectors.lake.iceberg.IcebergSink`, which give ``table_uri``,
    ``add_columns``, ``table_properties`` (set on the table when the sink creates it, and the
    Parquet settings of its files, :func:`parquet_write_options`) and :meth:`table_fields`."""

    table_uri: str
    add_columns: bool
    table_properties: dict[str, str]
    storage_options: dict[str, Any]
    #: whether schema evolution widens a column (int to long, ...) in place: Iceberg's type
    #: promotion; Delta's type widening is a table feature delta-rs cannot write
    widens_columns: bool = False

    @property
    def parquet_options(self) -> dict[str, Any]:
        """How this sink's data files are compressed (:func:`parquet_write_options`)."""
        return parquet_write_options(self.table_properties)

    @abc.abstractmethod
    def table_fields(self) -> dict[str, Any] | None:
        """The table's columns, name to Delta type JSON (so both formats compare alike); None
        when there is no table yet."""

    def known_fields(self) -> dict[str, Any] | None:
        """The table's columns as this sink last read them (as :meth:`table_fields` gives them),
        without reading the table again; None when it holds no read of the table. What the tasks
        of a routed job check their data against before the committer checks it again against the
        table at its commit (:meth:`check_schema`, every path)."""
        return None

    def task_storage_options(self) -> dict[str, Any]:
        """The storage options (:mod:`~chandy.coordinator.filesystems`' names) a task that writes
        this table's files needs: the ones given, and, for an Iceberg table of a REST catalog, the
        credentials the catalog vended with it (renewed first when they expire soon)."""
        return dict(self.storage_options)

    def check_schema(self, data: pa.Schema, table_fields: Mapping[str, Any] | None = None, *, where: str = "") -> None:
        """Refuse data that does not fit the table (see :func:`schema_differences`); ``table_fields``
        as :meth:`table_fields` returns them, read from the table when None.

        Raises:
            LakeSchemaError: one line naming every column that differs, with both types.
        """
        fields = self.table_fields() if table_fields is None else table_fields
        if fields is None:
            return
        problems = schema_differences(data, fields, add_columns=self.add_columns,
                                      widen=self.add_columns and self.widens_columns)
        if problems:
            raise LakeSchemaError(f"{where}the data does not fit table {self.table_uri}: {'; '.join(problems)} "
                                  f"({EVOLUTION_NOTE}: nothing was committed)")


class LakeSink(Protocol):
    """What the pipeline, the lake committer and the maintenance commands use of a table (the
    methods of :class:`DeltaLakeSink`, which documents them)."""

    #: "delta" or "iceberg", as the LAKE_COMMITTED event names the table's format
    FORMAT: str
    table_uri: str
    root: str
    fs: Any

    def write_files(self, table: pa.Table, *, job_id: str, checkpoint_id: int, subtask: int,
                    attempt: int, partitioned: bool = True, table_fields: Mapping[str, Any] | None = None,
                    log_id: str | None = None) -> list[DataFile]: ...

    def exists(self) -> bool: ...

    def task_storage_options(self) -> dict[str, Any]: ...

    def committed_checkpoint(self, job_id: str) -> int | None: ...

    def table_fields(self) -> dict[str, Any] | None: ...

    def known_fields(self) -> dict[str, Any] | None: ...

    def check_schema(self, data: pa.Schema, table_fields: Mapping[str, Any] | None = None, *, where: str = "") -> None: ...

    def progress(self, job_id: str, partitions: Iterable[TP] = ()) -> TableProgress: ...

    def commit(self, job_id: str, checkpoint_id: int, files: Iterable[DataFile], *,
               offsets: Mapping[tuple[str, int], int] | None = None,
               cluster_id: str | None = None, event_times: Mapping[TP, int] | None = None,
               checked_at: int | None | EllipsisType = ...,
               valid_through_ms: int | None | EllipsisType = ...) -> LakeCommit | None: ...

    def commit_changes(self, job_id: str, checkpoint_id: int, files: Iterable[DataFile], *,
                       offsets: Mapping[tuple[str, int], int] | None = None,
                       cluster_id: str | None = None, event_times: Mapping[TP, int] | None = None,
                       checked_at: int | None | EllipsisType = ...,
                       valid_through_ms: int | None | EllipsisType = ...) -> LakeCommit | None: ...

    def commits_after(self, job_id: str, checkpoint_id: int) -> list[LakeCommit]: ...

    def missing_files(self, files: Iterable[DataFile]) -> list[str]: ...

    def delete_unreferenced(self, job_id: str, *, keep_checkpoints_after: int | None = None,
                            log_id: str | None = None) -> list[str]: ...

    def optimize(self, *, target_size: int | None = None) -> dict[str, Any]: ...

    def vacuum(self, *, retention_hours: float, dry_run: bool = False, retain_last: int = 1) -> list[str]: ...

    def read_table(self) -> pa.Table: ...

    def read_commit(self, table_version: int, previous_table_version: int | None) -> pa.Table: ...

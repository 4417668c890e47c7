"""The Delta Lake sink, written with the ``deltalake`` package (delta-rs), readable by Spark,
DuckDB, Polars and pyarrow.

Tasks write Parquet files into the table location (:meth:`DeltaLakeSink.write_files`); the files
are invisible until the lake committer adds them in one Delta commit that also records an *app
transaction* ``(app id = job id, version = checkpoint id)``. delta-rs does not skip a repeated
commit by itself, so :meth:`DeltaLakeSink.commit` reads ``transaction_version(job id)`` first and
skips a checkpoint that is already in the table: committing after a restart is idempotent.

Each commit also records, in its ``commitInfo``, ``chandy.job_id``, ``chandy.checkpoint_id``,
``chandy.offsets`` (JSON ``{topic: {partition: end offset}}``: every partition the job has landed,
cumulative) and ``chandy.kafka_cluster_id``, so the table itself says what landed
(:meth:`DeltaLakeSink.progress`); the pipeline reconciles with it at start.

Data files are named as :func:`~chandy.connectors.lake.sink.data_file_name` says
(under ``<column>=<value>/`` directories for partitioned tables, without the partition columns
inside the files, as Delta lays them out), so files that no commit references can be found and
deleted.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import EllipsisType
from typing import Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import quote, unquote

import pyarrow as pa

from chandy.connectors.lake.cleanup import delete_files, job_files
from chandy.connectors.lake.delta_maintenance import DeltaMaintenance, is_conflict
from chandy.connectors.lake.partitioning import (
    partition_columns,
    partition_groups,
    with_generation_expressions,
    with_partition_columns,
)
from chandy.connectors.lake.sink import (
    COMMIT_ATTEMPTS,
    COMMIT_TOKEN,
    EVENT_TIMES_KEY,
    FILES_KEY,
    RECORDS_KEY,
    TP,
    DataFile,
    LakeCommit,
    LakeCommitError,
    SchemaChecked,
    TableProgress,
    check_unchanged,
    data_file_name,
    file_stats,
    merge_schemas,
    offsets_from_json,
    offsets_to_json,
    recorded_valid_through,
    schema_from_b64,
    schema_to_b64,
    watermark_metadata,
    write_parquet,
)
from chandy.coordinator.filesystems import delta_options, open_filesystem
from chandy.formats.type_mapping import to_lake_types

log = logging.getLogger(__name__)

def _partition_string(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


#: the table configuration every Delta table Chandy creates starts from, unless ``--table-property``
#: sets the key: a checkpoint of the log every 10 commits, Delta Lake's own default
#: (``DeltaConfigs.CHECKPOINT_INTERVAL`` in delta-spark; delta-rs defaults to 100). delta-rs
#: replays every commit since the last checkpoint to read the table, so with 100 each commit and
#: each read of a table costs up to 10 times more near the end of the interval (docs/benchmarks.md,
#: "many routed tables", issue 57).
DELTA_DEFAULTS = {"delta.checkpointInterval": "10"}


def delta_configuration(table_properties: Mapping[str, str] | None) -> dict[str, str]:
    """The Delta table configuration of a new table with ``table_properties`` (``--table-property``):
    :data:`DELTA_DEFAULTS`, then all of them but the Parquet settings of Chandy's own writer
    (``write.parquet.*``), which are no Delta property."""
    return {**DELTA_DEFAULTS,
            **{k: v for k, v in (table_properties or {}).items() if not k.startswith("write.parquet.")}}


def check_delta_properties(table_properties: Mapping[str, str] | None) -> None:
    """Refuse, before anything is written, properties that delta-rs would refuse when it creates
    the table (it takes only the Delta protocol's ``delta.*`` keys it knows): an empty table
    with them is created in a temporary directory.

    Raises:
        ValueError: names the property delta-rs refused.
    """
    import tempfile

    from deltalake import write_deltalake

    configuration = {k: v for k, v in delta_configuration(table_properties).items() if k not in DELTA_DEFAULTS}
    if not configuration:
        return
    with tempfile.TemporaryDirectory(prefix="chandy-delta-properties-") as scratch:
        try:
            write_deltalake(scratch, pa.table({"c": pa.array([], pa.int32())}), configuration=configuration)
        except Exception as exc:  # delta-rs raises its own exception types
            raise ValueError(f"{str(exc).splitlines()[0]} (Delta takes the delta.* properties of its protocol, "
                             "e.g. delta.appendOnly, delta.logRetentionDuration)") from exc


#: the app IDs of the app transactions that keep a job's progress where Delta keeps state across
#: its checkpoints and log cleanup (:func:`progress_transactions`): ``chandy/<job id>/offset/<topic>/<partition>``
#: (version: the end offset landed) and ``chandy/<job id>/event-time/<topic>/<partition>`` (version:
#: the completeness watermark's newest timestamp landed, ms); a Kafka topic name holds no ``/``
PROGRESS_APP_ID = "chandy/{job_id}/{kind}/{topic}/{partition}"


def progress_app_id(job_id: str, kind: str, tp: TP) -> str:
    """The app ID of ``job_id``'s ``kind`` (``offset`` or ``event-time``) of partition ``tp`` (:data:`PROGRESS_APP_ID`)."""
    return PROGRESS_APP_ID.format(job_id=job_id, kind=kind, topic=tp[0], partition=tp[1])


def progress_transactions(transaction_version: Callable[[str], int | None] | None, job_id: str,
                          offsets: Mapping[TP, int] | None, event_times: Mapping[TP, int] | None) -> list[Any]:
    """The app transactions (``deltalake.transaction.Transaction``) that record ``offsets`` and
    ``event_times`` per partition beside a commit's ``commitInfo``, for the partitions whose value
    the table does not hold already (``transaction_version``: the table's version of an app ID,
    as delta-rs ``DeltaTable.transaction_version``; None: a new table).

    Why: ``commitInfo`` lives only in its commit's JSON file, which Delta's log cleanup
    (``delta.logRetentionDuration``, 30 days, once a checkpoint covers it) deletes, while the
    latest ``txn`` action of every app ID is part of the table's state and so of every Delta
    checkpoint (the protocol's "Transaction Identifiers"; only ``delta.setTransactionRetentionDuration``,
    unset by default, expires them). A job whose last commit left the log (a routed table that
    gets a record a month, a job idle for a month) is then still read exactly by
    :meth:`DeltaLakeSink.progress`."""
    from deltalake.transaction import Transaction

    found = []
    for kind, values in (("offset", offsets), ("event-time", event_times)):
        for tp, value in sorted((values or {}).items()):
            app_id = progress_app_id(job_id, kind, tp)
            if transaction_version is None or transaction_version(app_id) != value:
                found.append(Transaction(app_id, int(value)))
    return found


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _exclusive(method: Callable[Concatenate[DeltaLakeSink, _P], _R]) -> Callable[Concatenate[DeltaLakeSink, _P], _R]:
    """``method`` run holding the sink's ``_state_lock``: one commit or read of its table state at a time."""
    @functools.wraps(method)
    def locked(self: DeltaLakeSink, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._state_lock:
            return method(self, *args, **kwargs)
    return locked


class DeltaLakeSink(SchemaChecked):
    """A Delta table at any fsspec/object-store URL (see the module docstring).

    Args:
        table_uri: where the table lives (``file:///...``, ``s3://...``, a local path).
        partition_by: partition columns (their values become ``<col>=<value>`` directories), or
            transforms of columns (:mod:`~chandy.connectors.lake.partitioning`: ``day(ts)`` adds
            and partitions by ``ts_day``).
        storage_options: options for fsspec and delta-rs, under their own names.
        add_columns: schema evolution: a column the data has and the table lacks is added to
            the table (an ADD COLUMN commit before the checkpoint's, as Delta's schema merge
            would); a column of another type is still refused.
    """

    FORMAT = "delta"

    def __init__(self, table_uri: str, *, partition_by: Sequence[str] = (),
                 storage_options: Mapping[str, str] | None = None, add_columns: bool = False,
                 table_properties: Mapping[str, str] | None = None) -> None:
        from chandy.connectors.lake.uri import normalize_table_uri

        self.table_uri = normalize_table_uri(table_uri)
        self.add_columns = add_columns
        self.table_properties = dict(table_properties or {})
        self.partition_fields, self.partition_by = partition_columns(partition_by)  # transforms: added columns
        self.storage_options = dict(storage_options or {})
        self.fs, self.root = open_filesystem(self.table_uri, self.storage_options)
        # the committer's copy of the table (:meth:`_fresh`) and the app transaction versions
        # known at its version (:meth:`_transaction_version`); the lock keeps one commit or read at a time
        self._state_lock = threading.RLock()
        self._current: Any = None
        self._behind = False  # this sink committed after _current's version: it has a newer version
        self._found = False  # the table was there once: :meth:`_open` asks delta-rs without looking first
        # known_fields of one version of one table object (a table deleted and made again starts at 0)
        self._known_fields: tuple[Any, int | None, dict[str, Any] | None] = (None, None, None)
        self._transactions: dict[str, int | None] = {}
        self._transactions_at: int | None = None

    @property
    def maintenance(self) -> DeltaMaintenance:
        """The table's OPTIMIZE and VACUUM (:class:`DeltaMaintenance`), reading the table as the
        commits do."""
        return DeltaMaintenance(self.table_uri, self.root, self._open)

    def optimize(self, *, target_size: int | None = None) -> dict[str, Any]:
        """See :meth:`DeltaMaintenance.optimize`."""
        return self.maintenance.optimize(target_size=target_size)

    def vacuum(self, *, retention_hours: float, dry_run: bool = False, retain_last: int = 1) -> list[str]:
        """See :meth:`DeltaMaintenance.vacuum`."""
        return self.maintenance.vacuum(retention_hours=retention_hours, dry_run=dry_run, retain_last=retain_last)

    @property
    def _delta_uri(self) -> str:
        # delta-rs takes local tables as plain paths
        return self.root if self.table_uri.startswith("file://") else self.table_uri

    @property
    def _delta_options(self) -> dict[str, str] | None:
        return delta_options(self.table_uri, self.storage_options)

    # -- task side ------------------------------------------------------------------------------------
    def write_files(self, table: pa.Table, *, job_id: str, checkpoint_id: int, subtask: int, attempt: int,
                    partitioned: bool = True, table_fields: Mapping[str, Any] | None = None,
                    log_id: str | None = None) -> list[DataFile]:
        """Write ``table`` as Parquet files (one per partition value; one file when not
        ``partitioned``: a change file, ``--cdc``), not yet visible. Returns them.
        ``table_fields`` (Iceberg's hidden partitions) does not matter to Delta: a partition
        transform is always a column of a Delta table."""
        if table.num_rows == 0:
            return []
        table = to_lake_types(with_partition_columns(table, self.partition_fields))
        schema = schema_to_b64(table.schema)
        stem = data_file_name(job_id, checkpoint_id, subtask, attempt, log_id)
        if not partitioned:  # a change file (--cdc): merged, never added, so no statistics
            return [self._write_one(table, stem, {}, schema, stats=False)]
        if not self.partition_by:
            return [self._write_one(table, stem, {}, schema)]
        missing = [c for c in self.partition_by if c not in table.column_names]
        if missing:
            raise LakeCommitError(f"partition column(s) {missing} are not in the data: {table.column_names}")
        files = []
        for key, rows in partition_groups(table, self.partition_by):
            part = rows.drop_columns(self.partition_by)
            values = {c: _partition_string(v) for c, v in key.items()}
            directory = "/".join(f"{c}={quote(v if v is not None else '__HIVE_DEFAULT_PARTITION__', safe='')}"
                                 for c, v in values.items())
            files.append(self._write_one(part, f"{directory}/{stem}", values, schema))
        return files

    def _write_one(self, table: pa.Table, relative: str, partition_values: dict, schema: str, *,
                   stats: bool = True) -> DataFile:
        size = write_parquet(self.fs, f"{self.root}/{relative}", table, self.parquet_options)
        return DataFile(relative, size, table.num_rows, partition_values, int(time.time() * 1000), schema,
                        stats=file_stats(table) if stats else None)

    # -- committer side ----------------------------------------------------------------------------------
    def exists(self) -> bool:
        from deltalake import DeltaTable

        return DeltaTable.is_deltatable(self._delta_uri, self._delta_options)

    def _open(self) -> Any:
        """The table's current version (a new ``deltalake.DeltaTable``), or None when there is none.
        Until the table was found once, a missing ``_delta_log`` directory answers None without
        delta-rs (0.01 ms here where delta-rs's refusal costs 0.26 ms: a routed job asks of each
        new table several times before its first commit creates it); a store that refuses the
        look is asked through delta-rs, whose error names the cause."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        if not self._found:
            try:
                if not self.fs.exists(f"{self.root}/_delta_log"):
                    return None
            except OSError:  # a HEAD's 403 has no body to say why: delta-rs's listing below tells it
                pass
        try:
            table = DeltaTable(self._delta_uri, storage_options=self._delta_options)
        except TableNotFoundError:
            return None
        self._found = True
        return table

    def _fresh(self) -> Any:
        """The table's current version for the commit path (a ``deltalake.DeltaTable``), or None
        when there is none: the object this sink read last, brought up to date by delta-rs
        ``update_incremental`` (which reads only the commits after its version: one listing of
        ``_delta_log`` from there, where opening the table again replays the log from its last
        checkpoint), unless the commit file of its version is gone (the table was deleted) or the
        update fails: then the table is opened again. Call it holding ``_state_lock``.

        Delta's versions are contiguous (each commit is the put-if-absent of the file of the next
        version, the protocol's "Delta Log Entries"), so when the file of the version after it is
        not there either, the table has no newer version and the object is current as it is: one
        look at a file (a HEAD on an object store) instead of delta-rs's listing (0.7 ms of CPU
        here). After this sink's own commit that look is skipped: the version is newer.

        What it returns is as current as a new ``DeltaTable``: the guards of :meth:`commit` read
        the table's state from it, never from what an earlier read remembered.
        """
        from deltalake.exceptions import DeltaError

        table = self._current
        if table is not None:
            try:
                log_dir = f"{self.root}/_delta_log"
                version = table.version()
                if self.fs.exists(f"{log_dir}/{version:020d}.json"):
                    if self._behind or self.fs.exists(f"{log_dir}/{version + 1:020d}.json"):
                        table.update_incremental()
                        self._behind = False
                    return table
            except (DeltaError, OSError) as exc:  # delta-rs's, and its storage's: open it again
                log.info("%s: reading the table's new commits failed (%s): opening it again", self.table_uri, exc)
        self._current = table = self._open()
        self._behind = False
        return table

    def _transaction_version(self, table: Any, app_id: str) -> int | None:
        """``table.transaction_version(app_id)`` (delta-rs reads the log's ``txn`` actions for
        each call), remembered for ``table``'s version: the versions of one table version never
        change, and :meth:`_wrote` carries them over this sink's own next commit."""
        version = table.version()
        if self._transactions_at != version:
            self._transactions, self._transactions_at = {}, version
        if app_id not in self._transactions:
            self._transactions[app_id] = table.transaction_version(app_id)
        return self._transactions[app_id]

    def _wrote(self, read_version: int | None, landed: LakeCommit, transactions: Sequence[Any]) -> None:
        """This sink's commit ``landed`` was made on the table's version ``read_version`` (None: it
        created the table) with app ``transactions``: when it is the very next version, the
        versions known at ``read_version`` plus these are the table's at ``landed``'s version."""
        self._behind = True
        known = {} if read_version is None else (self._transactions if self._transactions_at == read_version else None)
        if known is not None and landed.table_version == (0 if read_version is None else read_version + 1):
            self._transactions = {**known, **{t.app_id: t.version for t in transactions}}
            self._transactions_at = landed.table_version

    def _generated(self, schema: pa.Schema) -> pa.Schema:
        """A new table's ``schema``: each partition transform's column a Delta generated column
        where both Spark and delta-rs evaluate its expression alike
        (:func:`~chandy.connectors.lake.partitioning.delta_generation_expression`; the table's
        writer protocol becomes 4)."""
        return with_generation_expressions(schema, self.partition_fields)

    @staticmethod
    def _fields_of(table: Any) -> dict[str, Any]:
        return {f["name"]: f["type"] for f in json.loads(table.schema().to_json())["fields"]}

    @_exclusive
    def committed_checkpoint(self, job_id: str) -> int | None:
        """The newest checkpoint of ``job_id`` in the table (its app transaction version), or None."""
        table = self._fresh()
        return None if table is None else self._transaction_version(table, job_id)

    def table_fields(self) -> dict[str, Any] | None:
        """The table's columns (name -> Delta type JSON), or None when there is no table yet."""
        table = self._open()
        return None if table is None else self._fields_of(table)

    def known_fields(self) -> dict[str, Any] | None:
        """The columns of the table object the committer's reads keep (:meth:`_fresh`), as of its
        last read, with the columns its own schema evolution added since (:meth:`_add_columns`
        brings the object up to date): no I/O (the tasks of a routed job get them instead of each
        opening every table in every checkpoint). None before the committer read the table."""
        with self._state_lock:
            table = self._current
            if table is None:
                return None
            version = table.version()
            if self._known_fields[0] is not table or self._known_fields[1] != version:
                self._known_fields = (table, version, self._fields_of(table))
            return self._known_fields[2]

    def progress(self, job_id: str, partitions: Iterable[TP] = ()) -> TableProgress:
        """What the table holds for ``job_id`` (and which partitions other jobs landed), read from
        its app transactions and the ``commitInfo`` of its commits (newest first). When the job's
        commits have all left the log (Delta's log cleanup), its offsets and watermark times of
        ``partitions`` are read from the app transactions each commit also records
        (:func:`progress_transactions`), which Delta's checkpoints keep."""
        table = self._open()
        if table is None:
            return TableProgress(None, {}, None, {})
        done = table.transaction_version(job_id)
        offsets: dict[TP, int] | None = None
        cluster_id = None
        event_times: dict[TP, int] = {}
        others: dict[str, dict[TP, int]] = {}
        for commit in table.history():  # newest first
            owner = commit.get("chandy.job_id")
            if owner is None or "chandy.offsets" not in commit:
                continue
            if owner == job_id:
                if offsets is None:
                    offsets = offsets_from_json(commit["chandy.offsets"])
                    cluster_id = commit.get("chandy.kafka_cluster_id")
                    event_times = offsets_from_json(commit.get(EVENT_TIMES_KEY))
            elif owner not in others:
                others[owner] = offsets_from_json(commit["chandy.offsets"])
        if offsets is None and done is not None:  # the job's commits left the log: its app transactions
            offsets, event_times = {}, {}
            for tp in partitions:
                offset, millis = (table.transaction_version(progress_app_id(job_id, kind, tp))
                                  for kind in ("offset", "event-time"))
                if offset is not None:
                    offsets[tp] = offset
                if millis is not None:
                    event_times[tp] = millis
            if offsets:
                log.info("job %s: its commits to %s left the Delta log; its offsets read from the table's app "
                         "transactions", job_id, self.table_uri)
        return TableProgress(done, offsets or {}, cluster_id, others, event_times)

    def missing_files(self, files: Iterable[DataFile]) -> list[str]:
        """Paths (relative to the table root) of ``files`` that are not in the table's location:
        written once, then deleted (for example by a cleanup of files no commit referenced)."""
        return [f.path for f in files if not self.fs.exists(f"{self.root}/{f.path}")]

    @staticmethod
    def _lake_commit(entry: Mapping[str, Any]) -> LakeCommit:
        """The :class:`LakeCommit` of one ``history()`` entry made by Chandy."""
        version = int(entry["version"])
        records, files = entry.get(RECORDS_KEY), entry.get(FILES_KEY)
        offsets, event_times = entry.get("chandy.offsets"), entry.get(EVENT_TIMES_KEY)
        return LakeCommit(int(entry["chandy.checkpoint_id"]), version, version - 1 if version > 0 else None,
                          None if records is None else int(records), None if files is None else int(files),
                          int(entry.get("timestamp") or 0), None if offsets is None else offsets_from_json(offsets),
                          None if event_times is None else offsets_from_json(event_times), recorded_valid_through(entry))

    @classmethod
    def _commit_in(cls, history: Iterable[Mapping[str, Any]], match: Mapping[str, str]) -> LakeCommit | None:
        """The :class:`LakeCommit` of the first ``history`` entry (newest first) whose
        ``commitInfo`` holds every item of ``match``, or None."""
        for entry in history:
            if all(entry.get(k) == v for k, v in match.items()):
                return cls._lake_commit(entry)
        return None

    def commits_after(self, job_id: str, checkpoint_id: int) -> list[LakeCommit]:
        """The table's commits of ``job_id``'s checkpoints after ``checkpoint_id``, oldest first,
        from the ``commitInfo`` of its history (read newest first, 100 versions, then 10,000,
        then all, until a commit of an earlier checkpoint of the job is met)."""
        table = self._open()
        if table is None:
            return []
        for limit in (100, 10_000, None):
            history = table.history(limit)
            found: list[LakeCommit] = []
            for entry in history:
                if entry.get("chandy.job_id") != job_id or "chandy.checkpoint_id" not in entry:
                    continue
                if int(entry["chandy.checkpoint_id"]) <= checkpoint_id:
                    return found[::-1]
                found.append(self._lake_commit(entry))
            if limit is None or len(history) < limit:
                return found[::-1]
        return []  # not reached

    def _commit_info(self, version: int) -> dict[str, Any] | None:
        """The ``commitInfo`` action of the table's commit ``version`` (its log file
        ``_delta_log/<version, 20 digits>.json``, one JSON action per line, the Delta protocol's
        "Delta Log Entries"), with ``version`` added as delta-rs's ``history()`` adds it; None when
        the file or the action is not there, or the file cannot be read."""
        try:
            with self.fs.open(f"{self.root}/_delta_log/{version:020d}.json", "rb") as handle:
                actions = [json.loads(line) for line in handle.read().splitlines() if line.strip()]
        except (OSError, ValueError):  # gone, unreadable or not JSON: the caller reads the history
            return None
        return next(({**a["commitInfo"], "version": version} for a in actions
                     if isinstance(a, dict) and "commitInfo" in a), None)

    def _landed(self, table: Any, token: str, checkpoint_id: int, expected: int | None = None) -> LakeCommit:
        """The commit carrying ``token`` that this sink just made: read from its log file when it
        is version ``expected`` (the version after the one the commit was made on: one read, where
        the table's update and history cost a listing and a read more), else from ``table``
        brought up to date (delta-rs leaves the table object at its old version after a commit)."""
        if expected is not None:
            entry = self._commit_info(expected)
            if entry is not None and entry.get(COMMIT_TOKEN) == token:
                return self._lake_commit(entry)
        if table is None:
            table = self._current = self._open()
        else:
            table.update_incremental()
        # the newest version is this commit unless another writer committed right after it: one
        # commit file to read in the usual case (each is a GET on an object store)
        found = (self._commit_in(table.history(1), {COMMIT_TOKEN: token})
                 or self._commit_in(table.history(COMMIT_ATTEMPTS + 2), {COMMIT_TOKEN: token}))
        if found is None:
            raise LakeCommitError(f"checkpoint {checkpoint_id} was committed to {self.table_uri} but its commit is "
                                  "not among the table's newest versions")
        return found

    @_exclusive
    def commit(self, job_id: str, checkpoint_id: int, files: Iterable[DataFile], *,
               offsets: Mapping[TP, int] | None = None, cluster_id: str | None = None,
               event_times: Mapping[TP, int] | None = None,
               checked_at: int | None | EllipsisType = ...,
               valid_through_ms: int | None | EllipsisType = ...) -> LakeCommit | None:
        """Add ``files`` to the table in one commit with app transaction (job id, checkpoint id)
        and ``commitInfo`` recording the job, the checkpoint, the records and files added and the
        ``offsets`` (end offset per (topic, partition), cumulative) it covers, and the
        completeness watermark of ``event_times`` and ``valid_through_ms`` (:func:`~chandy.connectors.lake.sink.watermark_metadata`).

        Returns the :class:`LakeCommit` made (its version), or None (committing nothing) when the
        table already holds this checkpoint or a later one of the job, or when there are neither
        files nor offsets to record (a commit with offsets but no files records progress: records
        that were all filtered out or dead-lettered are landed too). ``checked_at``: the job's
        newest checkpoint in the table when the committer checked the ranges of these files
        (:func:`~chandy.connectors.lake.sink.check_unchanged`), before and after a conflict.

        Raises:
            LakeSchemaError: the files' schema does not fit the table's.
            LakeCommitError: delta-rs refused the commit, or another coordinator of the job
                committed since ``checked_at``.
        """
        from deltalake.transaction import AddAction, CommitProperties, Transaction, create_table_with_add_actions

        files = list(files)
        table = self._fresh()  # one read of the table's state for the whole commit
        done = None if table is None else self._transaction_version(table, job_id)
        if done is not None and done >= checkpoint_id:
            log.info("checkpoint %d of job %s is already in %s (version %d): skipped", checkpoint_id, job_id,
                     self.table_uri, done)
            return None
        if not files and (not offsets or table is None):
            return None
        # column statistics, for readers' data skipping, unless the table maps column names to
        # physical ones (the statistics name the file's columns)
        mapped = table is not None and table.metadata().configuration.get("delta.columnMapping.mode", "none") != "none"
        actions = [
            AddAction(f.path, f.size, dict(f.partition_values), f.modification_time, True,
                      f.stats if f.stats is not None and not mapped else json.dumps({"numRecords": f.records}))
            for f in files
        ]
        token = uuid.uuid4().hex  # tells this commit apart from the same checkpoint's commit by another coordinator
        metadata = {"chandy.job_id": job_id, "chandy.checkpoint_id": str(checkpoint_id), COMMIT_TOKEN: token,
                    RECORDS_KEY: str(sum(f.records for f in files)), FILES_KEY: str(len(files))}
        if offsets:
            metadata["chandy.offsets"] = offsets_to_json(offsets)
        if cluster_id:
            metadata["chandy.kafka_cluster_id"] = cluster_id
        metadata.update(watermark_metadata(event_times, valid_through=valid_through_ms))
        transactions = [Transaction(job_id, checkpoint_id), *progress_transactions(
            None if table is None else functools.partial(self._transaction_version, table), job_id, offsets, event_times)]
        properties = CommitProperties(app_transactions=transactions, custom_metadata=metadata)
        fields = None if table is None else self._fields_of(table)
        schemas = [schema_from_b64(b) for b in dict.fromkeys(f.schema for f in files)]
        for schema in schemas:
            self.check_schema(schema, fields, where=f"checkpoint {checkpoint_id}: ")
        merged = merge_schemas(schemas, where=f"checkpoint {checkpoint_id}: ") if schemas else None
        check_unchanged(self.table_uri, job_id, checkpoint_id, done, checked_at)  # before any change to the table
        read_done = done if checked_at is ... else checked_at
        if table is not None and merged is not None and self.add_columns:
            table = self._add_columns(table, merged, checkpoint_id)
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                if fields is None:
                    from deltalake import Schema as DeltaSchema

                    schema = merged if merged is not None else schema_from_b64(files[0].schema)
                    create_table_with_add_actions(
                        self._delta_uri, DeltaSchema.from_arrow(self._generated(schema)), actions, mode="append",
                        partition_by=self.partition_by or None, storage_options=self._delta_options,
                        configuration=delta_configuration(self.table_properties),
                        commit_properties=properties)
                    landed = self._landed(None, token, checkpoint_id, expected=0)
                    self._wrote(None, landed, transactions)
                    return landed
                read_version = table.version()
                table.create_write_transaction(actions, mode="append", schema=table.schema(),
                                               partition_by=self.partition_by or None, commit_properties=properties)
                landed = self._landed(table, token, checkpoint_id, expected=read_version + 1)
                self._wrote(read_version, landed, transactions)
                return landed
            except Exception as exc:  # delta-rs raises several exception types
                if not is_conflict(exc) or attempt == COMMIT_ATTEMPTS:
                    raise LakeCommitError(f"committing checkpoint {checkpoint_id} to {self.table_uri} failed "
                                          f"(attempt {attempt}): {exc}") from exc
                # a concurrent commit (e.g. an OPTIMIZE) won the version: re-read the table; if
                # our commit landed after all, it is done, else commit again on the new version
                table = self._current = self._open()
                done = None if table is None else self._transaction_version(table, job_id)
                if done is not None and done >= checkpoint_id:
                    ours = self._commit_in(table.history(50), {COMMIT_TOKEN: token}) if done == checkpoint_id else None
                    log.info("checkpoint %d: commit conflicted but is in %s (%s): done", checkpoint_id, self.table_uri,
                             "this commit landed" if ours else "another coordinator of the job committed it")
                    return ours
                # delta-rs refuses a commit racing one of the same app id; committing again on the
                # new version would skip the committer's check of what that commit holds
                check_unchanged(self.table_uri, job_id, checkpoint_id, done, read_done)
                fields = None if table is None else self._fields_of(table)
                log.warning("checkpoint %d: concurrent commit to %s (%s): retrying (attempt %d of %d)", checkpoint_id,
                            self.table_uri, exc, attempt + 1, COMMIT_ATTEMPTS)
                time.sleep(min(2.0, 0.05 * 2 ** attempt))
        return None  # not reached

    @_exclusive
    def commit_changes(self, job_id: str, checkpoint_id: int, files: Iterable[DataFile], *,
                       offsets: Mapping[TP, int] | None = None, cluster_id: str | None = None,
                       event_times: Mapping[TP, int] | None = None,
                       checked_at: int | None | EllipsisType = ...,
                       valid_through_ms: int | None | EllipsisType = ...) -> LakeCommit | None:
        """Apply the change ``files`` (``--cdc``) in one Delta ``MERGE`` commit (delta-rs
        ``DeltaTable.merge``) carrying the app transaction (job id, checkpoint id) and the
        ``commitInfo`` :meth:`commit` records: per key (the files' ``id_columns``) the last change
        wins (:func:`~chandy.connectors.lake.changes.latest_changes`); a delete (``op = d``, a
        tombstone) deletes the row, any other change updates it or inserts it. A table that does
        not exist is created first, empty, from the changes' schema and ``partition_by``.

        The idempotence check runs before the merge: a checkpoint the table holds is skipped
        (None), so a replay changes nothing. As :meth:`commit`, the merge goes on only while the
        job's newest checkpoint in the table is ``checked_at`` (:func:`~chandy.connectors.lake.sink.check_unchanged`),
        before it and after any conflict: a stale coordinator's merge would overwrite newer values,
        undo deletes and move the recorded offsets back. The change files are deleted once merged.

        Raises:
            LakeSchemaError: the changes do not fit the table; LakeCommitError: delta-rs refused
                the merge, the files disagree on the key, or another coordinator of the job
                committed since ``checked_at``.
        """
        from deltalake import DeltaTable
        from deltalake import Schema as DeltaSchema
        from deltalake.transaction import CommitProperties, Transaction

        from chandy.connectors.lake.changes import (
            OP_COLUMN,
            delete_change_files,
            id_columns_of,
            latest_changes,
            read_change_files,
        )

        files = list(files)
        table = self._fresh()
        done = None if table is None else self._transaction_version(table, job_id)
        if done is not None and done >= checkpoint_id:
            log.info("checkpoint %d of job %s is already in %s (version %d): skipped", checkpoint_id, job_id,
                     self.table_uri, done)
            return None
        check_unchanged(self.table_uri, job_id, checkpoint_id, done, checked_at)  # before any change to the table
        read_done = done if checked_at is ... else checked_at
        if not files:
            return self.commit(job_id, checkpoint_id, [], offsets=offsets, cluster_id=cluster_id, event_times=event_times,
                               checked_at=read_done, valid_through_ms=valid_through_ms)
        changes = latest_changes(read_change_files(self.fs, self.root, files), id_columns_of(files, self.table_uri))
        where = f"checkpoint {checkpoint_id}: "
        rows = changes.latest.drop_columns([OP_COLUMN])
        self.check_schema(rows.schema, None if table is None else self._fields_of(table), where=where)
        if table is None:
            missing = [c for c in self.partition_by if c not in rows.column_names]
            if missing:
                raise LakeCommitError(f"partition column(s) {missing} are not in the data: {rows.column_names}")
            DeltaTable.create(self._delta_uri, DeltaSchema.from_arrow(self._generated(rows.schema)), mode="ignore",
                              partition_by=self.partition_by or None, storage_options=self._delta_options,
                              configuration=delta_configuration(self.table_properties))
            table = self._current = self._open()
        elif self.add_columns:
            table = self._add_columns(table, rows.schema, checkpoint_id)
        token = uuid.uuid4().hex
        metadata = {"chandy.job_id": job_id, "chandy.checkpoint_id": str(checkpoint_id), COMMIT_TOKEN: token,
                    RECORDS_KEY: str(changes.latest.num_rows), FILES_KEY: "0", "chandy.changes": str(changes.changes),
                    "chandy.upserts": str(changes.upserts.num_rows), "chandy.deletes": str(changes.deletes.num_rows)}
        if offsets:
            metadata["chandy.offsets"] = offsets_to_json(offsets)
        if cluster_id:
            metadata["chandy.kafka_cluster_id"] = cluster_id
        metadata.update(watermark_metadata(event_times, valid_through=valid_through_ms))
        transactions = [Transaction(job_id, checkpoint_id), *progress_transactions(
            functools.partial(self._transaction_version, table), job_id, offsets, event_times)]
        properties = CommitProperties(app_transactions=transactions, custom_metadata=metadata)
        on = " AND ".join([f"t.`{c}` = s.`{c}`" for c in changes.id_columns] + _key_bounds(changes.latest, changes.id_columns))
        is_delete = f"s.`{OP_COLUMN}` = 'd'"
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                read_version = table.version()
                (table.merge(changes.latest, on, source_alias="s", target_alias="t", commit_properties=properties)
                 .when_matched_delete(is_delete)
                 .when_matched_update_all(f"NOT ({is_delete})", except_cols=[OP_COLUMN])
                 .when_not_matched_insert_all(f"NOT ({is_delete})", except_cols=[OP_COLUMN])
                 .execute())
                landed = self._landed(table, token, checkpoint_id, expected=read_version + 1)
                self._wrote(read_version, landed, transactions)
                break
            except Exception as exc:  # delta-rs raises several exception types
                if not is_conflict(exc) or attempt == COMMIT_ATTEMPTS:
                    raise LakeCommitError(f"merging checkpoint {checkpoint_id}'s changes into {self.table_uri} failed "
                                          f"(attempt {attempt}): {exc}") from exc
                table = self._current = self._open()
                done = self._transaction_version(table, job_id)
                if done is not None and done >= checkpoint_id:
                    return self._commit_in(table.history(50), {COMMIT_TOKEN: token}) if done == checkpoint_id else None
                # merging again on a version another coordinator of the job committed would skip the
                # committer's check of what it holds (and undo its changes)
                check_unchanged(self.table_uri, job_id, checkpoint_id, done, read_done)
                log.warning("checkpoint %d: concurrent commit to %s (%s): retrying the merge (attempt %d of %d)",
                            checkpoint_id, self.table_uri, exc, attempt + 1, COMMIT_ATTEMPTS)
                time.sleep(min(2.0, 0.05 * 2 ** attempt))
        delete_change_files(self.fs, self.root, files)
        return landed

    def _add_columns(self, table: Any, data: pa.Schema, checkpoint_id: int) -> Any:
        """Schema evolution: add ``data``'s columns the table lacks (one ADD COLUMN commit, made
        before the checkpoint's commit; adding nullable columns changes no row, so a crash between
        the two loses nothing). Returns the table as it is now."""
        from deltalake import Schema as DeltaSchema

        have = self._fields_of(table)
        new = [f for f in DeltaSchema.from_arrow(to_lake_types(data.empty_table()).schema).fields
               if f.name not in have]
        if not new:
            return table
        try:
            table.alter.add_columns(new)
        except Exception as exc:  # delta-rs raises several exception types
            raise LakeCommitError(f"checkpoint {checkpoint_id}: adding column(s) {[f.name for f in new]} to "
                                  f"{self.table_uri} failed: {exc}") from exc
        log.info("checkpoint %d: added column(s) %s to %s", checkpoint_id, ", ".join(f.name for f in new), self.table_uri)
        table.update_incremental()
        return table

    @staticmethod
    def _referenced_in(table: Any) -> set[str]:
        """Paths (relative to the table root, as on storage) of the files in ``table``'s version.
        The log holds each path as a URI (Delta's protocol): ``p=a%20b`` on storage is
        ``p=a%2520b`` in the log, so the paths are decoded once."""
        return {unquote(p) for p in pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist()}

    def referenced_files(self) -> set[str]:
        """Paths (relative to the table root, as on storage) of the files in the table's current version."""
        table = self._open()
        return set() if table is None else self._referenced_in(table)

    def removed_files(self) -> set[str]:
        """Paths (relative to the table root) of files a commit removed (e.g. an OPTIMIZE) that
        are still on storage: older versions reference them until :meth:`vacuum` deletes them."""
        table = self._open()
        return set() if table is None else self._removed_in(table)

    @staticmethod
    def _removed_in(table: Any) -> set[str]:
        """:meth:`removed_files` of ``table`` (a dry-run vacuum, which replays the log's tombstones)."""
        return set(table.vacuum(retention_hours=0, dry_run=True, enforce_retention_duration=False))

    def delete_unreferenced(self, job_id: str, *, keep_checkpoints_after: int | None = None,
                            log_id: str | None = None) -> list[str]:
        """Delete this job's data files that no version of the table references (written by
        aborted or crashed checkpoints), except those of checkpoints above
        ``keep_checkpoints_after`` (still in flight) and, with ``log_id``, those another
        coordinator log of the job wrote (:func:`~chandy.connectors.lake.sink.coordinator_log_id`).
        Files a compaction removed are left to :meth:`vacuum` and its retention, so readers of
        older versions keep working. Returns what was deleted (paths relative to the table root).

        It lists first, then reads the table: a file committed after the listing is in the
        version read, one written after it is not listed. Its cost on a large table: one
        listing of the job's files (:func:`~chandy.connectors.lake.cleanup.job_files`: the table
        root and its partition directories, never ``_delta_log``); one read of the table, only
        when the job has files on storage; and the dry-run vacuum that finds removed files only
        when an unreferenced file belongs to a checkpoint the table holds (its app transaction
        version or below). A file of a later checkpoint was never committed (a checkpoint's files
        land in its own commit, which records the checkpoint's app transaction), so no version
        references it.
        """
        listed = job_files(self.fs, self.root, job_id, keep_checkpoints_after=keep_checkpoints_after, log_id=log_id)
        if not listed:
            return []
        table = self._open()
        unreferenced = listed
        if table is not None:
            referenced = self._referenced_in(table)
            unreferenced = {path: c for path, c in listed.items() if path not in referenced}
            done = table.transaction_version(job_id)
            if done is not None and any(c <= done for c in unreferenced.values()):
                removed = self._removed_in(table)
                unreferenced = {path: c for path, c in unreferenced.items() if path not in removed}
        return delete_files(self.fs, self.root, sorted(unreferenced))

    def read_commit(self, table_version: int, previous_table_version: int | None) -> pa.Table:
        """The rows version ``table_version`` added to the table since ``previous_table_version``
        (None: since the table's creation): the data files of the first that the second lacks,
        read through deltalake's dataset of ``table_version`` (time travel; partition columns
        from the files' partition values). For a ``LAKE_COMMITTED`` event: exactly its checkpoint's
        rows, whatever compactions ran since.

        Raises:
            LakeCommitError: no table, or a version the log no longer has (vacuumed or checkpointed away).
        """
        import pyarrow.dataset as ds
        from deltalake import DeltaTable

        def files(version: int | None) -> set[str]:
            if version is None:
                return set()
            return {uri.rsplit("/", 1)[-1] for uri in DeltaTable(self._delta_uri, version=version,
                                                                 storage_options=self._delta_options).file_uris()}

        try:
            added = files(table_version) - files(previous_table_version)
            dataset = DeltaTable(self._delta_uri, version=table_version,
                                 storage_options=self._delta_options).to_pyarrow_dataset()
        except Exception as exc:  # delta-rs raises several exception types
            raise LakeCommitError(f"cannot read version {table_version} of {self.table_uri}: {exc}") from exc
        fragments = [f for f in dataset.get_fragments() if f.path.rsplit("/", 1)[-1] in added]
        return ds.FileSystemDataset(fragments, dataset.schema, dataset.format, dataset.filesystem).to_table()

    def read_table(self) -> pa.Table:
        """The committed table, read with pyarrow through deltalake (a reader other than the writer)."""
        from deltalake import DeltaTable

        # through a dataset: deltalake 1.x's to_pyarrow_table leaves a process that read S3 to
        # abort at exit ("terminate called without an active exception")
        return DeltaTable(self._delta_uri, storage_options=self._delta_options).to_pyarrow_dataset().to_table()


def _key_bounds(changes: pa.Table, id_columns: Sequence[str]) -> list[str]:
    """Conditions a ``MERGE`` on ``id_columns`` may add without changing what matches: for each
    integer key column, the target's value between the changes' smallest and largest (a row
    outside cannot equal any change's key). delta-rs then prunes the target's files by their
    ``minValues``/``maxValues`` statistics (:func:`~chandy.connectors.lake.sink.file_stats`)
    instead of reading every file: a database's changes, which touch its newest keys, merge at
    a cost that follows them, not the table (``benchmarks/upsert_cost.py``)."""
    import pyarrow.compute as pc

    bounds = []
    for column in id_columns:
        values = changes.column(column)
        if not pa.types.is_integer(values.type) or values.null_count == len(values):
            continue
        extent = pc.min_max(values)
        bounds += [f"t.`{column}` >= {int(extent['min'].as_py())}", f"t.`{column}` <= {int(extent['max'].as_py())}"]
    return bounds

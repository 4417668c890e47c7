"""The Apache Iceberg sink, written with pyiceberg, readable by Spark, Trino, DuckDB and pyiceberg.

``iceberg://<catalog>/<namespace>.<table>`` names a table in a pyiceberg catalog. Without
``--catalog-property`` the catalog is pyiceberg's SQL catalog on a SQLite file with a local
warehouse (``<warehouse>/catalog.db``; the warehouse defaults to ``<user data dir>/chandy/iceberg/<catalog>``,
or give ``warehouse=...``); a catalog configured in ``~/.pyiceberg.yaml`` or ``PYICEBERG_CATALOG__*``
is used as it is; any other pyiceberg catalog (REST, Glue, Hive) by its own properties
(``type=rest``, ``uri=...``, ...).

The protocol is the Delta sink's (:mod:`chandy.connectors.lake.delta`): tasks write Parquet files
(named as the Delta sink names them) under ``<table location>/data/``, invisible until the lake
committer adds them in one Iceberg commit per checkpoint. That commit, atomic through the
catalog's compare-and-swap of the metadata location, appends the files (a ``fast_append``
snapshot whose summary records ``chandy.job_id``, ``chandy.checkpoint_id``, ``chandy.offsets``,
``chandy.kafka_cluster_id``) and sets the table properties ``chandy.job.<job id>.checkpoint_id``,
``.offsets`` and ``.kafka_cluster_id``: the committer's record lives in the table's properties
so that expiring snapshots or compacting files never loses it. A repeated commit of a checkpoint
the properties already hold is skipped; a commit that loses to a concurrent one re-reads the table
and is retried (or found done).
"""

from __future__ import annotations

import functools
import json
import logging
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import EllipsisType
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import pyarrow as pa

from chandy.connectors.lake.cleanup import delete_files, job_files
from chandy.connectors.lake.iceberg_catalog import catalog_properties_for, parse_iceberg_uri
from chandy.connectors.lake.iceberg_commits import (
    PROPERTY_PREFIX,
    commit_failure,
    commit_in,
    commit_record,
    commits_after,
    data_file_paths,
    is_conflict,
    landed_after,
    recorded_event_times,
    without_snapshot,
)
from chandy.connectors.lake.partitioning import HIDDEN, iceberg_transform, partition_columns, partition_groups, with_partition_columns
from chandy.connectors.lake.sink import (
    COMMIT_ATTEMPTS,
    COMMIT_TOKEN,
    TP,
    DataFile,
    LakeCommit,
    LakeCommitError,
    LakeSchemaError,
    SchemaChecked,
    TableProgress,
    check_unchanged,
    data_file_name,
    evolves,
    merge_schemas,
    offsets_from_json,
    schema_from_b64,
    schema_to_b64,
    write_parquet,
)
from chandy.connectors.lake.uri import normalize_table_uri
from chandy.coordinator.filesystems import open_filesystem, pyiceberg_properties
from chandy.formats.type_mapping import to_lake_types

if TYPE_CHECKING:
    from chandy.connectors.lake.iceberg_transactions import CatalogTransaction

__all__ = ["IcebergSink", "catalog_properties_for", "default_checkpoint_dir", "parse_iceberg_uri"]

log = logging.getLogger(__name__)

DATA_DIR = "data"


def default_checkpoint_dir(table_uri: str, catalog_properties: Mapping[str, str] | None = None) -> str:
    """``state.checkpoints.dir`` of a pipeline into an Iceberg table: ``_chandy_checkpoints``
    under the table's location (looked up in the catalog once per process)."""
    return _checkpoint_dir(table_uri, tuple(sorted((catalog_properties or {}).items())))


@functools.lru_cache(maxsize=64)
def _checkpoint_dir(table_uri: str, catalog_properties: tuple[tuple[str, str], ...]) -> str:
    return f"{IcebergSink(table_uri, catalog_properties=dict(catalog_properties)).root_url}/_chandy_checkpoints"


#: the keys of a table's ``config`` (a REST catalog's load-table answer) that say when the
#: credentials it vended expire (ms since the epoch), as Iceberg's FileIOs read them:
#: ``S3FileIOProperties.SESSION_TOKEN_EXPIRES_AT_MS``, ``GCPProperties.GCS_OAUTH2_TOKEN_EXPIRES_AT``
#: and ADLS's ``adls.sas-token-expires-at-ms.<account>``
EXPIRES_AT_KEYS = ("s3.session-token-expires-at-ms", "gcs.oauth2.token-expires-at", "adls.sas-token-expires-at-ms")
#: vended credentials are loaded again once less than this remains of them (or less than half
#: their lifetime, when that is shorter), ms
RENEW_MARGIN_MS = 5 * 60 * 1000

#: the schema of the staged create that asks a REST catalog where a new table goes (never committed)
_PLACEHOLDER_SCHEMA = pa.schema([pa.field("placeholder", pa.int32())])

class IcebergSink(SchemaChecked):
    """An Iceberg table in a pyiceberg catalog (see the module docstring); the methods of
    :class:`~chandy.connectors.lake.sink.LakeSink`, with the contracts :class:`~chandy.connectors.lake.delta.DeltaLakeSink` documents.

    Args:
        table_uri: ``iceberg://<catalog>/<namespace>.<table>``.
        partition_by: columns or transforms (:mod:`~chandy.connectors.lake.partitioning`): a new
            table gets an identity spec of their partition columns, one file per value under
            ``data/<col>=<value>/`` (``add_files`` reads it from its statistics); an existing table keeps its spec.
        catalog_properties: pyiceberg catalog properties (see :func:`catalog_properties_for`).
        storage_options: fsspec options for the table location.
        add_columns: schema evolution: columns the data has and the table lacks are added, and
            columns widened (int to long, float to double, a decimal's precision up: Iceberg's
            type promotion), in the checkpoint's own commit (pyiceberg's ``union_by_name``);
            other type changes are refused.
        location: the table's location, when known (the Spark tasks get it from the driver):
            then the catalog is not contacted, which only :meth:`write_files` may rely on.

    Raises:
        TableUriError: a URI that names no table; LakeCommitError: partitioning, or a warehouse
            the default catalog cannot serve.
    """

    FORMAT, widens_columns = "iceberg", True

    def __init__(self, table_uri: str, *, partition_by: Sequence[str] = (),
                 catalog_properties: Mapping[str, str] | None = None,
                 storage_options: Mapping[str, str] | None = None, add_columns: bool = False,
                 location: str | None = None, table_properties: Mapping[str, str] | None = None) -> None:
        self.table_uri = normalize_table_uri(table_uri)
        self.add_columns, self.table_properties = add_columns, dict(table_properties or {})
        self.catalog_name, self.namespace, self.name = parse_iceberg_uri(self.table_uri)
        self.partition_fields, self.partition_by = partition_columns(partition_by)  # transforms: added columns
        self.storage_options = dict(storage_options or {})
        self._given_storage = dict(self.storage_options)
        #: the storage settings the catalog vended with the table (:meth:`_take_vended`), when
        #: (ms since the epoch) and until when
        self._vended: dict[str, str] = {}
        self._vended_at_ms: float = 0.0
        self._vended_until_ms: int | None = None
        self._catalog: Any = None
        #: while a checkpoint's tables commit in one catalog transaction, the transaction that
        #: records this table's commit (:class:`~chandy.connectors.lake.iceberg_transactions.CatalogTransaction`)
        self.transaction: CatalogTransaction | None = None
        if location is not None:  # a task's writer: no catalog (nor pyiceberg) needed to write files
            self.catalog_properties = dict(catalog_properties or {})
            self.root_url = location.rstrip("/")
        else:
            self.catalog_properties = catalog_properties_for(self.catalog_name, catalog_properties)
            storage = pyiceberg_properties(self.catalog_properties.get("warehouse"), self.storage_options)
            self.catalog_properties = {**storage, **self.catalog_properties}  # a catalog property wins
            table = self._load()
            self.root_url = (table.location() if table is not None else self._default_location()).rstrip("/")
        self.fs, self.root = open_filesystem(self.root_url, self.storage_options)

    # -- catalog ---------------------------------------------------------------------------------------
    @property
    def identifier(self) -> tuple[str, ...]:
        return (*self.namespace, self.name)

    @property
    def catalog(self) -> Any:
        if self._catalog is None:
            from pyiceberg.catalog import load_catalog

            self._catalog = load_catalog(self.catalog_name, **self.catalog_properties)
        return self._catalog

    def __getstate__(self) -> dict[str, Any]:  # tasks get the sink without its catalog connection
        return {**self.__dict__, "_catalog": None, "transaction": None}

    def _default_location(self) -> str:
        """Where a new table goes: where a REST catalog places it (its ``warehouse``, if given,
        is the catalog's own setting, e.g. Polaris's catalog name, not a path), else
        ``<warehouse>/<namespace>/<table>``.

        Raises:
            LakeCommitError: no warehouse to place it in (a catalog other than REST).
        """
        if self.catalog_properties.get("type") == "rest":
            return self._location_from_catalog()
        warehouse = self.catalog_properties.get("warehouse")
        if not warehouse:
            raise LakeCommitError(f"{self.table_uri}: the table does not exist and catalog {self.catalog_name} has no "
                                  "warehouse property to place it in (--catalog-property warehouse=...)")
        return f"{warehouse.rstrip('/')}/{'/'.join(self.namespace)}/{self.name}"

    def _location_from_catalog(self) -> str:
        """The location a REST catalog assigns the table: a *staged* create (the Iceberg REST
        protocol's ``stage-create``, pyiceberg's ``create_table_transaction``) answers the new
        table's metadata, its location included, and creates nothing until committed, which this
        never does; the table is created at the first checkpoint's commit, at this location. The
        namespace is created if missing (a REST catalog refuses a staged create in none).

        Raises:
            LakeCommitError: the catalog refused (the message says why).
        """
        from pyiceberg.exceptions import RESTError

        try:
            self._ensure_namespace()
            staged = self.catalog.create_table_transaction(self.identifier, schema=_PLACEHOLDER_SCHEMA,
                                                           properties=dict(self.table_properties))
        except (RESTError, OSError) as exc:
            raise LakeCommitError(f"{self.table_uri}: catalog {self.catalog_name} did not place the new table: "
                                  f"{type(exc).__name__}: {exc}") from exc
        self._take_vended(staged._table)  # the StagedTable: pyiceberg's FileIO of the answer's config
        return str(staged.table_metadata.location)

    def _take_vended(self, table: Any) -> None:
        """Use the storage settings the catalog vended with ``table`` (a pyiceberg ``Table`` or
        ``StagedTable``): an Iceberg REST catalog answers a table load (and a staged create) with a
        ``config`` of FileIO properties, credentials scoped to the table's location among them
        (pyiceberg asks for them: ``X-Iceberg-Access-Delegation: vended-credentials``) and when
        they expire (:data:`EXPIRES_AT_KEYS`). pyiceberg's FileIO of the table uses them; this
        sink's own file system (the committer's checks and cleanup) and the tasks' writers
        (:meth:`task_storage_options`) take them too, over the storage options given, as
        pyiceberg lets the table's config win over the catalog's properties."""
        from chandy.coordinator.filesystems import settings_from_pyiceberg

        properties = getattr(getattr(table, "io", None), "properties", None) or {}
        config = {k: str(v) for k, v in properties.items() if self.catalog_properties.get(k) != v}
        vended = settings_from_pyiceberg(config)
        expiries = [int(v) for k, v in config.items() if k.startswith(EXPIRES_AT_KEYS) and v.isdigit()]
        self._vended_at_ms, self._vended_until_ms = time.time() * 1000, min(expiries) if expiries else None
        if vended == self._vended:
            return
        if self._vended or vended:
            log.info("%s: catalog %s vended storage settings %s%s", self.table_uri, self.catalog_name,
                     ", ".join(sorted(vended)) or "none",
                     "" if self._vended_until_ms is None else f", valid for {self._vended_until_ms - self._vended_at_ms:.0f} ms")
        self._vended = vended
        self.storage_options = {**self._given_storage, **vended}
        if getattr(self, "root_url", None):
            self.fs, self.root = open_filesystem(self.root_url, self.storage_options)

    def renew_credentials(self) -> None:
        """Load the table again (or stage its creation again, when it does not exist yet) when
        the credentials the catalog vended expire soon (:data:`RENEW_MARGIN_MS`), so that what
        writes next holds valid ones. A sink without vended expiring credentials does nothing."""
        until = self._vended_until_ms
        if until is None:
            return
        now = time.time() * 1000
        if now < until - min(RENEW_MARGIN_MS, (until - self._vended_at_ms) / 2):
            return
        log.info("%s: the storage credentials catalog %s vended expire in %.0f ms: loading the table again",
                 self.table_uri, self.catalog_name, until - now)
        if self._load() is None and self.catalog_properties.get("type") == "rest":
            self._location_from_catalog()

    def task_storage_options(self) -> dict[str, Any]:
        """See :meth:`~chandy.connectors.lake.sink.SchemaChecked.task_storage_options`: the
        credentials renewed first (:meth:`renew_credentials`)."""
        self.renew_credentials()
        return dict(self.storage_options)

    def _load(self) -> Any:
        """The table (``pyiceberg.table.Table``), or None when there is none. While
        :attr:`transaction` is set, its commits are recorded there instead of sent."""
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        try:
            table = self.catalog.load_table(self.identifier)
        except (NoSuchTableError, NoSuchNamespaceError):
            return None
        self._take_vended(table)
        return table if self.transaction is None else self.transaction.staged(table)

    def _ensure_namespace(self) -> None:
        """Create the table's namespace unless it exists. Another writer may create it at the same
        time (another job, or this job's other routed tables, committed side by side): pyiceberg's
        SQL catalog then fails its insert (an ``IntegrityError``, not ``NamespaceAlreadyExistsError``)
        although the namespace now exists, which is all this asks.

        Raises:
            Exception: the catalog's error, when the namespace does not exist after it.
        """
        try:
            self.catalog.create_namespace_if_not_exists(self.namespace)
        except Exception:
            if not self.catalog.namespace_exists(self.namespace):
                raise

    def _create(self, schema: pa.Schema) -> Any:
        from pyiceberg.exceptions import TableAlreadyExistsError

        self._ensure_namespace()
        # a hidden partition's column is not in the files: its source column is
        hidden = [f for f in self.partition_fields if f.column not in schema.names and f.transform in HIDDEN]
        missing = [f.column for f in self.partition_fields if f not in hidden and f.column not in schema.names]
        missing += [f.source for f in hidden if f.source not in schema.names]
        if missing:
            raise LakeCommitError(f"partition column(s) {missing} are not in the data: {schema.names}")
        try:
            creation = self.catalog.create_table_transaction(self.identifier, schema=schema, location=self.root_url,
                                                             properties=dict(self.table_properties))
            if self.partition_fields:  # one commit: the table never exists without its spec
                with creation.update_spec() as spec:
                    for field in self.partition_fields:
                        if field in hidden:
                            spec.add_field(field.source, iceberg_transform(field), field.column)
                        else:
                            spec.add_identity(field.column)
            creation.commit_transaction()
        except TableAlreadyExistsError:
            pass
        return self._load()

    # -- task side ---------------------------------------------------------------------------------------
    def write_files(self, table: pa.Table, *, job_id: str, checkpoint_id: int, subtask: int, attempt: int,
                    partitioned: bool = True, table_fields: Mapping[str, Any] | None = None,
                    log_id: str | None = None) -> list[DataFile]:
        """Write ``table`` as Parquet files under ``data/`` (one per partition value, or one when
        not ``partitioned``: a change file, ``--cdc``; named as the Delta sink names its files),
        not yet visible. Returns them. ``table_fields``: the table's columns (None: no table yet);
        a hidden partition's column (:data:`~chandy.connectors.lake.partitioning.HIDDEN`) is left
        out of the files unless the table has it."""

        if table.num_rows == 0:
            return []
        self.renew_credentials()  # a routed table's sink, opened through the catalog in a task, lives long
        table = to_lake_types(with_partition_columns(table, self.partition_fields))
        hidden = [f.column for f in self.partition_fields
                  if f.transform in HIDDEN and f.column not in (table_fields or {}) and f.column in table.column_names]
        schema = schema_to_b64(table.drop_columns(hidden).schema)
        stem = data_file_name(job_id, checkpoint_id, subtask, attempt, log_id)
        parts: list[tuple[str, dict[str, Any], Any]] = [("", {}, table)]
        if self.partition_by and partitioned:  # change files (--cdc) are never partitioned
            missing = [c for c in self.partition_by if c not in table.column_names]
            if missing:
                raise LakeCommitError(f"partition column(s) {missing} are not in the data: {table.column_names}")
            parts = []
            for key, rows in partition_groups(table, self.partition_by):
                values = {c: None if v is None else str(v) for c, v in key.items()}
                directory = "".join(f"{c}={quote(v if v is not None else 'null', safe='')}/" for c, v in values.items())
                parts.append((directory, values, rows))
        files = []
        for directory, values, part in parts:
            relative = f"{DATA_DIR}/{directory}{stem}"
            size = write_parquet(self.fs, f"{self.root}/{relative}", part.drop_columns(hidden), self.parquet_options)
            files.append(DataFile(relative, size, part.num_rows, values, int(time.time() * 1000), schema))
        return files

    # -- committer side ----------------------------------------------------------------------------------
    def exists(self) -> bool:
        return self._load() is not None

    @staticmethod
    def _fields_of(table: Any) -> dict[str, Any]:
        from deltalake import Schema as DeltaSchema

        arrow = table.schema().as_arrow()
        arrow = pa.schema([f.with_type(pa.string()) if pa.types.is_large_string(f.type) else
                           f.with_type(pa.binary()) if pa.types.is_large_binary(f.type) else f for f in arrow])
        return {f["name"]: f["type"] for f in json.loads(DeltaSchema.from_arrow(arrow).to_json())["fields"]}

    def table_fields(self) -> dict[str, Any] | None:
        """The table's columns (name -> Delta type JSON, to compare as the Delta sink does), or None."""
        table = self._load()
        return None if table is None else self._fields_of(table)

    @staticmethod
    def _record_of(table: Any, job_id: str) -> tuple[int | None, dict[TP, int], str | None]:
        props = table.properties
        key = f"{PROPERTY_PREFIX}{job_id}."
        done = props.get(key + "checkpoint_id")
        return (None if done is None else int(done), offsets_from_json(props.get(key + "offsets")),
                props.get(key + "kafka_cluster_id"))

    def committed_checkpoint(self, job_id: str) -> int | None:
        """The newest checkpoint of ``job_id`` in the table (its ``chandy.job.<id>.checkpoint_id``), or None."""
        table = self._load()
        return None if table is None else self._record_of(table, job_id)[0]

    def progress(self, job_id: str, partitions: Iterable[TP] = ()) -> TableProgress:
        """What the table holds for ``job_id`` and which partitions other jobs landed, from its
        properties (which no snapshot expiration removes: ``partitions`` is not needed)."""
        table = self._load()
        if table is None:
            return TableProgress(None, {}, None, {})
        done, offsets, cluster_id = self._record_of(table, job_id)
        others: dict[str, dict[TP, int]] = {}
        for key, value in table.properties.items():
            if key.startswith(PROPERTY_PREFIX) and key.endswith(".offsets"):
                owner = key[len(PROPERTY_PREFIX):-len(".offsets")]
                if owner != job_id:
                    others[owner] = offsets_from_json(value)
        return TableProgress(done, offsets, cluster_id, others, recorded_event_times(table, job_id))

    def missing_files(self, files: Iterable[DataFile]) -> list[str]:
        """Paths (relative to the table root) of ``files`` that are not in the table's location:
        written once, then deleted (for example by a cleanup of files no commit referenced)."""
        return [f.path for f in files if not self.fs.exists(f"{self.root}/{f.path}")]

    def commits_after(self, job_id: str, checkpoint_id: int) -> list[LakeCommit]:
        """The table's commits of ``job_id``'s checkpoints after ``checkpoint_id``, oldest first
        (:func:`~chandy.connectors.lake.iceberg_commits.commits_after`)."""
        table = self._load()
        if table is None:
            return []
        newest, offsets, _ = self._record_of(table, job_id)
        return commits_after(table, job_id, checkpoint_id, newest, offsets or None)

    def commit(self, job_id: str, checkpoint_id: int, files: Iterable[DataFile], *,
               offsets: Mapping[TP, int] | None = None, cluster_id: str | None = None,
               event_times: Mapping[TP, int] | None = None,
               checked_at: int | None | EllipsisType = ...,
               valid_through_ms: int | None | EllipsisType = ...) -> LakeCommit | None:
        """Add ``files`` in one Iceberg commit recording (job id, checkpoint id, offsets, records and
        files added) in the snapshot summary and the table properties. Returns the
        :class:`LakeCommit` made (its snapshot), or None (committing nothing) when the table already
        holds this checkpoint or a later one, or there is nothing to record.

        ``checked_at``: see :func:`~chandy.connectors.lake.sink.check_unchanged`.

        Raises:
            LakeSchemaError: the files' schema does not fit the table's.
            LakeCommitError: the catalog refused the commit (after ``COMMIT_ATTEMPTS`` conflicts),
                or another coordinator of the job committed since ``checked_at``.
        """
        files = list(files)
        token = uuid.uuid4().hex  # tells this commit apart from the same checkpoint's commit by another coordinator
        key = f"{PROPERTY_PREFIX}{job_id}."
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            table = self._load()
            done = None if table is None else self._record_of(table, job_id)[0]
            if done is not None and done >= checkpoint_id:
                if attempt == 1:
                    log.info("checkpoint %d of job %s is already in %s: skipped", checkpoint_id, job_id, self.table_uri)
                    return None
                # found done after a conflict: ours only if the table holds this very commit
                ours = None
                if done == checkpoint_id and table.properties.get(key + "commit_token") == token:
                    ours = (commit_in(table, {COMMIT_TOKEN: token}, checkpoint_id)
                            or without_snapshot(table, checkpoint_id))
                log.info("checkpoint %d: commit conflicted but is in %s (%s): done", checkpoint_id, self.table_uri,
                         "this commit landed" if ours else "another coordinator of the job committed it")
                return ours
            if attempt == 1 and checked_at is ...:
                checked_at = done  # a conflict must find the job where this commit found it
            check_unchanged(self.table_uri, job_id, checkpoint_id, done, checked_at)
            if not files and (not offsets or table is None):
                return None
            fields = None if table is None else self._fields_of(table)
            schemas = [schema_from_b64(b) for b in dict.fromkeys(f.schema for f in files)]
            for schema in schemas:
                self.check_schema(schema, fields, where=f"checkpoint {checkpoint_id}: ")
            merged = merge_schemas(schemas, where=f"checkpoint {checkpoint_id}: ",
                                   widen=self.add_columns) if schemas else None
            summary, properties = commit_record(job_id, checkpoint_id, token, records=sum(f.records for f in files),
                                                files=len(files), offsets=offsets, cluster_id=cluster_id,
                                                event_times=event_times, valid_through_ms=valid_through_ms)
            try:
                if table is None:
                    assert merged is not None
                    table = self._create(merged)
                    fields = self._fields_of(table)  # created by another writer since the read: its columns rule
                    for schema in schemas:
                        self.check_schema(schema, fields, where=f"checkpoint {checkpoint_id}: ")
                transaction = table.transaction()
                if merged is not None and self.add_columns and evolves(merged, fields):
                    with transaction.update_schema() as update:
                        update.union_by_name(merged)  # adds columns, and widens them by Iceberg's promotion
                if files:
                    transaction.add_files([f"{self.root_url}/{f.path}" for f in files], snapshot_properties=summary,
                                          check_duplicate_files=False)
                transaction.set_properties(properties)
                table = transaction.commit_transaction()
            except LakeSchemaError:  # the table another writer created does not fit: nothing was committed
                raise
            except Exception as exc:  # pyiceberg and the catalogs raise many types
                action = f"committing checkpoint {checkpoint_id} to {self.table_uri}"
                reloaded = self._landed_after(exc, token, action)
                if reloaded is None:
                    failure = commit_failure(exc, attempt, action)
                    if failure is not None:
                        raise failure from exc
                    continue
                table = reloaded  # the catalog's answer was unknown, the table holds the commit
            if not files:
                return without_snapshot(table, checkpoint_id)
            landed = commit_in(table, {COMMIT_TOKEN: token}, checkpoint_id)
            if landed is None:
                raise LakeCommitError(f"checkpoint {checkpoint_id} was committed to {self.table_uri} but no "
                                      "snapshot of the table carries its commit")
            return landed
        return None  # not reached

    def commit_changes(self, job_id: str, checkpoint_id: int, files: Iterable[DataFile], *,
                       offsets: Mapping[TP, int] | None = None, cluster_id: str | None = None,
                       event_times: Mapping[TP, int] | None = None,
                       checked_at: int | None | EllipsisType = ...,
                       valid_through_ms: int | None | EllipsisType = ...) -> LakeCommit | None:
        """Apply the change ``files`` (``--cdc``) in one Iceberg transaction (a row-level delete
        of every key the changes touch, then an append of the upserted rows; see
        :func:`chandy.connectors.lake.iceberg_changes.apply_changes`, which documents it), only
        while the job's newest checkpoint in the table is ``checked_at``."""
        from chandy.connectors.lake.iceberg_changes import apply_changes

        return apply_changes(self, job_id, checkpoint_id, files, offsets=offsets, cluster_id=cluster_id,
                             event_times=event_times, checked_at=checked_at, valid_through_ms=valid_through_ms)

    def _landed_after(self, exc: Exception, token: str, action: str) -> Any | None:
        """The table when the commit carrying ``token`` landed despite ``exc``, else None; raises
        LakeCommitError when no read answers (:func:`~chandy.connectors.lake.iceberg_commits.landed_after`)."""
        return landed_after(self._load, exc, token, action)

    def _all_referenced(self, table: Any) -> set[str]:
        """Paths (relative to the table root) of the data files any snapshot references."""
        if table is None or table.current_snapshot() is None:
            return set()
        return {self._relative(p) for p in data_file_paths(table, table.snapshots())}

    def _relative(self, path: str) -> str:
        for prefix in (self.root_url + "/", self.root + "/", "file://" + self.root + "/"):
            if path.startswith(prefix):
                return path[len(prefix):]
        return path

    def referenced_files(self) -> set[str]:
        """Paths (relative to the table root) of the data files in the current snapshot."""
        table = self._load()
        if table is None or table.current_snapshot() is None:
            return set()
        return {self._relative(p) for p in data_file_paths(table, [table.current_snapshot()])}

    def delete_unreferenced(self, job_id: str, *, keep_checkpoints_after: int | None = None,
                            log_id: str | None = None) -> list[str]:
        """As :meth:`DeltaLakeSink.delete_unreferenced <chandy.connectors.lake.delta.DeltaLakeSink.delete_unreferenced>`,
        under ``data/``: every snapshot's files are read only for a file of a checkpoint the table holds."""
        listed = job_files(self.fs, self.root, job_id, data_dir=DATA_DIR, log_id=log_id,
                           keep_checkpoints_after=keep_checkpoints_after)
        table = self._load() if listed else None
        done = None if table is None else self._record_of(table, job_id)[0]
        if done is not None and any(c <= done for c in listed.values()):
            referenced = self._all_referenced(table)
            listed = {path: c for path, c in listed.items() if path not in referenced}
        return delete_files(self.fs, self.root, sorted(listed))

    # -- maintenance -----------------------------------------------------------------------------------
    def optimize(self, *, target_size: int | None = None) -> dict[str, Any]:
        """Compact the current snapshot's data files into files of about ``target_size`` bytes
        (default 128 MiB) in one ``overwrite`` snapshot that deletes the old files and adds the
        new ones (pyiceberg has no ``rewrite_data_files``: this reads and rewrites every file
        smaller than the target). The catalog's compare-and-swap makes it fail, and retry, when
        the pipeline committed meanwhile, so no appended file is lost or doubled. Returns
        ``numFilesRemoved`` and ``numFilesAdded`` (and ``commitOutcomeChecked``: True when the
        catalog's answer left the outcome unknown and the table, read again, held the commit).
        The new files are deleted only when the commit certainly did not land: a conflict, or an
        error of unknown outcome (a REST 5xx, a Glue or Hive timeout) and a table, read again,
        without this compaction's ``chandy.commit_token`` (:meth:`_landed_after`).

        Raises:
            LakeCommitError: no table, ``COMMIT_ATTEMPTS`` conflicts in a row, any other error
                (its new files deleted), or an outcome nobody could check (its files kept).
        """
        from pyiceberg.io.pyarrow import parquet_files_to_data_files

        target = target_size or 128 * 1024 * 1024
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            table = self._load()
            if table is None:
                raise LakeCommitError(f"no Iceberg table {self.table_uri}: nothing to optimize")
            tasks = [t for t in table.scan().plan_files() if t.file.file_size_in_bytes < target and not t.delete_files]
            if len(tasks) < 2:
                return {"numFilesRemoved": 0, "numFilesAdded": 0}
            written = self._write_compacted(tasks, table.schema().as_arrow(), target)
            token = uuid.uuid4().hex  # finds this compaction's snapshot when the catalog's answer is unknown
            metrics = {"numFilesRemoved": len(tasks), "numFilesAdded": len(written)}
            try:
                transaction = table.transaction()
                summary = {"chandy.operation": "compaction", COMMIT_TOKEN: token}
                with transaction.update_snapshot(snapshot_properties=summary).overwrite() as ow:
                    for task in tasks:
                        ow.delete_data_file(task.file)
                    for data_file in parquet_files_to_data_files(table.io, table.metadata, iter(written)):
                        ow.append_data_file(data_file)
                transaction.commit_transaction()
                log.info("optimized %s: %d file(s) removed, %d added", self.table_uri, len(tasks), len(written))
                return metrics
            except Exception as exc:  # pyiceberg and the catalogs raise many types
                if self._landed_after(exc, token, f"optimizing {self.table_uri}") is not None:
                    return {**metrics, "commitOutcomeChecked": True}
                for path in written:  # the commit certainly did not land: nothing references them
                    self.fs.rm(self._fs_path(path))
                if not is_conflict(exc) or attempt == COMMIT_ATTEMPTS:
                    raise LakeCommitError(f"optimizing {self.table_uri} failed (attempt {attempt}): {exc}") from exc
                log.warning("optimize of %s met a concurrent commit (%s): retrying", self.table_uri, exc)
                time.sleep(min(2.0, 0.05 * 2 ** attempt))
        return {}  # not reached

    def _write_compacted(self, tasks: list[Any], schema: pa.Schema, target: int) -> list[str]:
        """Read the files of ``tasks`` and write them again in files of about ``target`` bytes,
        never mixing two partitions in one file."""
        import pyarrow.parquet as pq

        written: list[str] = []
        by_partition: dict[str, list[Any]] = {}
        for task in tasks:
            by_partition.setdefault(repr(task.file.partition), []).append(task)
        groups: list[list[Any]] = []
        for same_partition in by_partition.values():
            groups.append([])
            size = 0
            for task in same_partition:
                if size >= target:
                    groups.append([])
                    size = 0
                groups[-1].append(task)
                size += task.file.file_size_in_bytes
        for group in groups:
            data = pa.concat_tables([pq.read_table(self._open_file(t.file.file_path)) for t in group],
                                    promote_options="permissive").cast(schema)
            path = f"{self.root_url}/{DATA_DIR}/compacted-{time.time_ns()}-{len(written):05d}.parquet"
            with self.fs.open(self._fs_path(path), "wb") as handle:
                pq.write_table(data, handle, **self.parquet_options)
            written.append(path)
        return written

    def _fs_path(self, url: str) -> str:
        return f"{self.root}/{self._relative(url)}"

    def _open_file(self, url: str) -> Any:
        return self.fs.open(self._fs_path(url), "rb")

    def vacuum(self, *, retention_hours: float, dry_run: bool = False, retain_last: int = 1) -> list[str]:
        """Expire snapshots older than ``retention_hours`` but the ``retain_last`` newest and the
        current one (Iceberg's ``ExpireSnapshots.expireOlderThan`` with ``retainLast``; pyiceberg's
        ``expire_snapshots``), delete the data files only they referenced (never an in-flight
        checkpoint's: no snapshot has it). Returns those paths (relative to the table root; with
        ``dry_run``: those it would delete). A pipeline commit meanwhile fails the catalog's
        compare-and-swap: it reads the table again and retries, up to ``COMMIT_ATTEMPTS`` times.

        Raises:
            LakeCommitError: no table, a negative retention, or ``COMMIT_ATTEMPTS`` conflicts in a row.
        """
        if retention_hours < 0:
            raise LakeCommitError(f"vacuum retention must be 0 hours or more, got {retention_hours}")
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            table = self._load()
            if table is None:
                raise LakeCommitError(f"no Iceberg table {self.table_uri}: nothing to vacuum")
            cutoff_ms, current = int((time.time() - retention_hours * 3600) * 1000), table.current_snapshot()
            retained = {s.snapshot_id for s in sorted(table.snapshots(), key=lambda s: (s.timestamp_ms, s.sequence_number or 0))
                        [-max(1, retain_last):]} | ({current.snapshot_id} if current is not None else set())
            expired = [s.snapshot_id for s in table.snapshots() if s.timestamp_ms < cutoff_ms and s.snapshot_id not in retained]
            if not expired:
                return []
            before = self._all_referenced(table)
            if dry_run:
                kept = {self._relative(f.file_path) for s in table.snapshots() if s.snapshot_id not in expired
                        for f in self._snapshot_files(table, s)}
                return sorted(before - kept)
            try:
                table.maintenance.expire_snapshots().by_ids(expired).commit()
            except Exception as exc:  # pyiceberg and the catalogs raise many types
                if not is_conflict(exc) or attempt == COMMIT_ATTEMPTS:
                    raise LakeCommitError(f"vacuuming {self.table_uri} failed (attempt {attempt}): {exc}") from exc
                log.warning("vacuum of %s met a concurrent commit (%s): retrying", self.table_uri, exc)
                time.sleep(min(2.0, 0.05 * 2 ** attempt))
                continue
            gone = sorted(before - self._all_referenced(self._load()))
            for relative in gone:
                if self.fs.exists(f"{self.root}/{relative}"):
                    self.fs.rm(f"{self.root}/{relative}")
            return gone
        return []  # not reached

    @staticmethod
    def _snapshot_files(table: Any, snapshot: Any) -> Iterator[Any]:
        for task in table.scan(snapshot_id=snapshot.snapshot_id).plan_files():
            yield task.file

    def read_commit(self, table_version: int, previous_table_version: int | None) -> pa.Table:
        """The rows snapshot ``table_version`` added since snapshot ``previous_table_version``
        (None: since the table's creation): the data files the first's scan plans and the
        second's does not, read as :meth:`read_table` reads them, in the table's current schema.

        Raises:
            LakeCommitError: no table, or no such snapshot (expired).
        """
        table = self._load()
        if table is None:
            raise LakeCommitError(f"no Iceberg table {self.table_uri}")

        def files(snapshot_id: int | None) -> set[str]:
            if snapshot_id is None:
                return set()
            if table.snapshot_by_id(snapshot_id) is None:
                raise LakeCommitError(f"table {self.table_uri} has no snapshot {snapshot_id} (expired?)")
            return {task.file.file_path for task in table.scan(snapshot_id=snapshot_id).plan_files()}

        added = files(table_version) - files(previous_table_version)
        return self._read_files(table, sorted(added))

    def read_table(self) -> pa.Table:
        """The current snapshot: its data files as pyiceberg's scan plans them, each read with
        pyarrow's Parquet reader (readers other than the writer), in the table's schema (columns
        a file lacks, added later by schema evolution, as nulls).

        Not ``scan().to_arrow()``: pyiceberg 0.12's projection reads a NULL map whose values are
        records as an empty map (the file holds NULL; found by the differential tests of values).
        Chandy writes no delete files, so the data files are the snapshot's rows.
        """
        table = self._load()
        if table is None:
            raise LakeCommitError(f"no Iceberg table {self.table_uri}")
        return self._read_files(table, [task.file.file_path for task in table.scan().plan_files()])

    def _read_files(self, table: Any, paths: Sequence[str]) -> pa.Table:
        """Data files of ``table``, each read with pyarrow, in the table's schema."""
        import pyarrow.parquet as pq

        schema = table.schema().as_arrow()
        parts = []
        for path in paths:
            with self._open_file(path) as handle:
                data = pq.read_table(handle)
            parts.append(pa.Table.from_arrays(
                [data.column(f.name).cast(f.type) if f.name in data.schema.names else pa.nulls(data.num_rows, f.type)
                 for f in schema], schema=schema))
        return pa.concat_tables(parts) if parts else schema.empty_table()


"""A checkpoint's change records (``--cdc``) as one change set per table: the last change per key.

The Spark tasks write a table's decoded change records as *change files* (Parquet, named as data
files are, never added to the table): the row's columns, the Kafka columns, and :data:`OP_COLUMN`
(Debezium's ``op``: ``c`` create, ``u`` update, ``r`` snapshot read, ``d`` delete). At the lake
commit the sink reads a checkpoint's change files (:func:`read_change_files`) and keeps, per key
(the ``id_columns``), the change with the highest (Kafka partition, offset)
(:func:`latest_changes`): Debezium keys a row's changes by its primary key, so one key's changes
live in one partition, in order. The sink then applies that change set in one table commit:
``d`` deletes the row, every other operation replaces (or inserts) it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from chandy.connectors.lake.sink import DataFile, LakeCommitError
from chandy.formats.debezium import DELETE, OP_COLUMN

log = logging.getLogger(__name__)

#: the columns that order one key's changes
ORDER_COLUMNS = ("partition", "offset")


@dataclasses.dataclass(frozen=True)
class ChangeSet:
    """One table's changes of one checkpoint, one per key: ``upserts`` (rows as the table holds
    them, without :data:`OP_COLUMN`) and ``deletes`` (the keys of deleted rows: the
    ``id_columns`` only); ``changes``: the change records read (before the last one per key won)."""

    id_columns: tuple[str, ...]
    latest: pa.Table  # the last change per key, with OP_COLUMN, in (partition, offset) order
    upserts: pa.Table
    deletes: pa.Table
    changes: int

    @property
    def keys(self) -> pa.Table:
        """Every key the change set touches (upserted or deleted)."""
        columns = list(self.id_columns)
        return pa.concat_tables([self.upserts.select(columns), self.deletes.select(columns)],
                                promote_options="permissive")


def id_columns_of(files: Sequence[DataFile], table_uri: str) -> tuple[str, ...]:
    """The key columns the change ``files`` agree on.

    Raises:
        LakeCommitError: files with other keys (the key of a table cannot change in a checkpoint).
    """
    keys = {f.id_columns for f in files if f.id_columns is not None}
    if len(keys) != 1:
        raise LakeCommitError(f"the change files of table {table_uri} name {len(keys)} different keys "
                              f"({sorted(keys)}): one table needs one key (--id-columns)")
    return next(iter(keys))


def read_change_files(fs: Any, root: str, files: Iterable[DataFile]) -> pa.Table:
    """The rows of change ``files`` (paths relative to ``root`` on filesystem ``fs``), as one
    table whose schema is the union of theirs."""
    tables = []
    for f in files:
        with fs.open(f"{root}/{f.path}", "rb") as handle:
            tables.append(pq.read_table(handle))
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="permissive")


def latest_changes(changes: pa.Table, id_columns: Sequence[str]) -> ChangeSet:
    """Per key, the change with the highest (partition, offset), split into upserts and deletes.

    Raises:
        LakeCommitError: a key column, :data:`OP_COLUMN` or an order column is missing, or a
            change has a null key column.
    """
    columns = list(id_columns)
    missing = [c for c in (*columns, OP_COLUMN, *ORDER_COLUMNS) if c not in changes.column_names]
    if missing:
        raise LakeCommitError(f"change records lack column(s) {missing} (columns: {changes.column_names})")
    for column in columns:
        nulls = changes[column].null_count
        if nulls:
            raise LakeCommitError(f"{nulls} change record(s) have a null key column {column}")
    ordered = changes.sort_by([(c, "ascending") for c in ORDER_COLUMNS])
    ordered = ordered.append_column("__row", pa.array(range(ordered.num_rows), pa.int64()))
    last = ordered.group_by(columns, use_threads=False).aggregate([("__row", "max")])
    keep = pc.take(last["__row_max"], pc.sort_indices(last["__row_max"]))  # in (partition, offset) order
    latest = ordered.take(keep)
    latest = latest.drop_columns(["__row"])
    is_delete = pc.equal(latest[OP_COLUMN], DELETE)
    upserts = latest.filter(pc.invert(is_delete)).drop_columns([OP_COLUMN])
    deletes = latest.filter(is_delete).select(columns)
    return ChangeSet(tuple(columns), latest, upserts, deletes, changes.num_rows)


def delete_change_files(fs: Any, root: str, files: Iterable[DataFile]) -> None:
    """Delete applied change ``files`` (paths relative to ``root`` on ``fs``), best effort: a file
    left behind is deleted with the unreferenced files at the next restore or abort."""
    for f in files:
        try:
            fs.rm(f"{root}/{f.path}")
        except OSError as exc:
            log.info("could not delete applied change file %s: %s", f.path, exc)

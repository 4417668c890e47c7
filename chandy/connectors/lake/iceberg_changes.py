"""Change data capture into Iceberg (``--cdc``): a checkpoint's change files applied in one
transaction of :class:`~chandy.connectors.lake.iceberg.IcebergSink`'s table."""

from __future__ import annotations

import dataclasses
import logging
import uuid
import warnings
from collections.abc import Iterable, Mapping
from types import EllipsisType
from typing import Any

import pyarrow as pa

from chandy.connectors.lake.changes import (
    OP_COLUMN,
    delete_change_files,
    id_columns_of,
    latest_changes,
    read_change_files,
)
from chandy.connectors.lake.iceberg_commits import (
    PROPERTY_PREFIX,
    commit_failure,
    commit_in,
    commit_record,
    without_snapshot,
)
from chandy.connectors.lake.sink import COMMIT_ATTEMPTS, COMMIT_TOKEN, TP, DataFile, LakeCommit, check_unchanged

log = logging.getLogger(__name__)


def apply_changes(sink: Any, job_id: str, checkpoint_id: int, files: Iterable[DataFile], *,
                  offsets: Mapping[TP, int] | None = None, cluster_id: str | None = None,
                  event_times: Mapping[TP, int] | None = None,
                  checked_at: int | None | EllipsisType = ...,
                  valid_through_ms: int | None | EllipsisType = ...) -> LakeCommit | None:
    """Apply the change ``files`` (``--cdc``) to ``sink``'s table (an
    :class:`~chandy.connectors.lake.iceberg.IcebergSink`) in one Iceberg transaction: a row-level
    delete of every key the changes touch (pyiceberg's copy-on-write ``Transaction.delete``: the
    data files holding such rows are rewritten without them), then an append of the last change
    per key that is not a delete (:func:`~chandy.connectors.lake.changes.latest_changes`), with
    the snapshot summaries and table properties ``IcebergSink.commit`` records. pyiceberg writes
    no equality or position delete files (it cannot), so readers need no merge-on-read support.

    A checkpoint the table holds is skipped (None) before anything is read: a replay changes
    nothing. The transaction is committed only while the job's newest checkpoint in the table is
    ``checked_at`` (:func:`~chandy.connectors.lake.sink.check_unchanged`), at every attempt: after
    a conflict the table is read again, and a commit of another coordinator of the job since the
    check fails the checkpoint instead of applying the changes over it. A table that does not
    exist is created from the changes' schema. The change files are deleted once applied.

    Raises:
        LakeSchemaError: the changes do not fit the table; LakeCommitError: the catalog refused
            the commit, the files disagree on the key, or another coordinator of the job
            committed since ``checked_at``.
    """
    files = list(files)
    table = sink._load()
    held = None if table is None else sink._record_of(table, job_id)[0]
    if held is not None and held >= checkpoint_id:
        log.info("checkpoint %d of job %s is already in %s: skipped", checkpoint_id, job_id, sink.table_uri)
        return None
    if checked_at is ...:
        checked_at = held  # a conflict must find the job where this commit found it
    check_unchanged(sink.table_uri, job_id, checkpoint_id, held, checked_at)
    if not files:
        return sink.commit(job_id, checkpoint_id, [], offsets=offsets, cluster_id=cluster_id, event_times=event_times,
                           checked_at=checked_at, valid_through_ms=valid_through_ms)
    changes = latest_changes(read_change_files(sink.fs, sink.root, files), id_columns_of(files, sink.table_uri))
    token = uuid.uuid4().hex
    key = f"{PROPERTY_PREFIX}{job_id}."
    summary, properties = commit_record(job_id, checkpoint_id, token, records=changes.latest.num_rows, files=0,
                                        offsets=offsets, cluster_id=cluster_id, event_times=event_times,
                                        valid_through_ms=valid_through_ms)
    summary.update({"chandy.changes": str(changes.changes), "chandy.upserts": str(changes.upserts.num_rows),
                    "chandy.deletes": str(changes.deletes.num_rows)})
    where = f"checkpoint {checkpoint_id}: "
    rows = changes.upserts
    shape = changes.latest.drop_columns([OP_COLUMN]).schema  # the change files' columns, deletes' too
    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        table = sink._load()
        done = None if table is None else sink._record_of(table, job_id)[0]
        if done is not None and done >= checkpoint_id:  # found done after a conflict
            ours = table.properties.get(key + "commit_token") == token
            return commit_in(table, {COMMIT_TOKEN: token}, checkpoint_id) if ours else None
        check_unchanged(sink.table_uri, job_id, checkpoint_id, done, checked_at)
        fields = None if table is None else sink._fields_of(table)
        sink.check_schema(shape, fields, where=where)
        try:
            if table is None:
                table = sink._create(shape)
                fields = sink._fields_of(table)
            transaction = table.transaction()
            if sink.add_columns and set(shape.names) - set(fields or {}):
                with transaction.update_schema() as update:
                    update.union_by_name(shape)
            keys = changes.keys
            if keys.num_rows and table.current_snapshot() is not None:
                with warnings.catch_warnings():  # "Delete operation did not match any records": new keys
                    warnings.simplefilter("ignore", UserWarning)
                    transaction.delete(_keys_filter(keys), snapshot_properties=summary)
            if rows.num_rows:
                transaction.append(_as_table_schema(rows, transaction.table_metadata.schema()),
                                   snapshot_properties=summary)
            transaction.set_properties(properties)
            table = transaction.commit_transaction()
        except Exception as exc:  # pyiceberg and the catalogs raise many types
            action = f"applying checkpoint {checkpoint_id}'s changes to {sink.table_uri}"
            reloaded = sink._landed_after(exc, token, action)  # an unknown outcome: did it land?
            if reloaded is None:
                failure = commit_failure(exc, attempt, action)
                if failure is not None:
                    raise failure from exc
                continue
            table = reloaded
        landed = commit_in(table, {COMMIT_TOKEN: token}, checkpoint_id) or without_snapshot(table, checkpoint_id)
        first = next((snap for snap in table.snapshots() if (snap.summary or {}).get(COMMIT_TOKEN) == token), None)
        if first is not None:  # the version before the delete, so the event's diff spans the whole change
            landed = dataclasses.replace(landed, previous_table_version=first.parent_snapshot_id)
        delete_change_files(sink.fs, sink.root, files)
        return landed
    return None  # not reached


def _keys_filter(keys: pa.Table) -> Any:
    """A pyiceberg row filter matching the rows whose key columns equal one of ``keys``' rows:
    ``In`` for a one-column key, else an ``Or`` of ``And``s of ``EqualTo``; and, for each integer
    key column, between the keys' smallest and largest value, which matches the same rows but
    lets pyiceberg skip the data files whose column bounds lie outside (its metrics evaluator
    prunes nothing by an ``In`` of more than 200 values, Iceberg's ``IN_PREDICATE_LIMIT``): a
    database's changes, which touch its newest keys, rewrite the files that hold those keys,
    not the table (``benchmarks/upsert_cost.py``)."""
    import pyarrow.compute as pc
    from pyiceberg.expressions import And, BooleanExpression, EqualTo, GreaterThanOrEqual, In, LessThanOrEqual, Or
    from pyiceberg.expressions.literals import literal

    columns = keys.column_names
    if len(columns) == 1:
        match: BooleanExpression = In(term=columns[0], values=set(keys.column(0).to_pylist()))
    else:
        rows = {tuple(r[c] for c in columns) for r in keys.to_pylist()}
        terms: list[BooleanExpression] = []
        for row in rows:
            equal: list[BooleanExpression] = [EqualTo(term=c, value=v) for c, v in zip(columns, row, strict=True)]
            terms.append(equal[0] if len(equal) == 1 else And(*equal))
        match = terms[0] if len(terms) == 1 else Or(*terms)
    bounds: list[BooleanExpression] = []
    for column in columns:
        values = keys.column(column)
        if pa.types.is_integer(values.type) and values.null_count < len(values):
            extent = pc.min_max(values)
            bounds += [GreaterThanOrEqual(term=column, value=literal(int(extent["min"].as_py()))),
                       LessThanOrEqual(term=column, value=literal(int(extent["max"].as_py())))]
    return And(match, *bounds) if bounds else match


def _as_table_schema(rows: pa.Table, schema: Any) -> pa.Table:
    """``rows`` with the table's columns in the table's order and Arrow types (pyiceberg's append
    wants them so); a column the rows lack is null."""
    target = schema.as_arrow()
    arrays = [rows.column(f.name).cast(f.type) if f.name in rows.column_names else pa.nulls(rows.num_rows, f.type)
              for f in target]
    return pa.Table.from_arrays(arrays, schema=target)

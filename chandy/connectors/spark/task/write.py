"""The task's write stage: decoded batches into lake files, a part of at most
``write_buffer_bytes`` at a time (:func:`buffered`), each part checked against its table and the
checkpoint's earlier parts before anything of it is written, routed to its table."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from chandy.connectors.lake.sink import DataFile
from chandy.connectors.spark.task.options import TaskOptions
from chandy.connectors.spark.task.route import by_destination, routes_before_decoding
from chandy.connectors.spark.task.tables import RoutedTables
from chandy.formats.evolution import SchemaChangeError, concat_evolving, offset_ranges
from chandy.formats.type_mapping import wider


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


def check_same_types(table: pa.Table, seen: dict[str, tuple[pa.DataType, str]], where: str) -> None:
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


def write_parts(options: TaskOptions, batches: Iterator[pa.RecordBatch], subtask: int, attempt: int,
                tables: RoutedTables) -> tuple[list[DataFile], int]:
    """Write one subtask's decoded batches as lake files, ``options.write_buffer_bytes`` at a time
    (:func:`buffered`), each part checked (:func:`check_same_types`, then against its table)
    before it is written and routed to its table. Returns (the files, rows written).

    Memory stays bounded. Files of a part written before a later part failed stay unreferenced:
    nothing acknowledges them, and they are deleted with the aborted checkpoint's files.

    Raises:
        LakeSchemaError: the data does not fit its table.
        SchemaChangeError: a column changed type within the checkpoint.
    """
    o = options
    where = f"checkpoint {o.checkpoint_id}: "
    sink = tables.sink(o.table_uri, location=o.table_location)
    files: list[DataFile] = []
    rows = 0
    seen: dict[str | None, dict[str, tuple[pa.DataType, str]]] = {}  # per table, a column's earlier type
    routed_first = routes_before_decoding(o)
    for part in buffered(batches, o.write_buffer_bytes):
        for group_uri, group in by_destination(part) if routed_first else [(None, part)]:
            table = concat_evolving(group, where=where)
            check_same_types(table, seen.setdefault(group_uri, {}), where)
            destinations = ([(group_uri, table)] if routed_first or o.router is None else o.router.split(table))
            for table_uri, data in destinations:
                files += tables.write(sink if table_uri in (None, o.table_uri) else tables.sink(table_uri), data,
                                      subtask, attempt)
            rows += table.num_rows
            del table, destinations
        del part
    return files, rows

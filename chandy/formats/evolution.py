"""Schema evolution across the batches of a micro-batch: batches whose schemas differ by added
columns are concatenated into one table; a column of two types fails the micro-batch, naming
it, both types and the offsets (:class:`SchemaChangeError`)."""

from __future__ import annotations

import pyarrow as pa

from chandy.formats.errors import FormatError
from chandy.formats.type_mapping import wider


def concat_evolving(batches: list[pa.RecordBatch], *, where: str = "") -> pa.Table:
    """One table of batches whose schemas may differ by added columns (schema evolution): the
    union of their columns, in order of first appearance, missing ones as nulls; a column one
    batch has widened (int to long, ...: :func:`~chandy.formats.type_mapping.widens`, which
    the decoder only does for a table that can widen) is the wider type in all.

    Raises:
        SchemaChangeError: a column of two types, naming it, both types and the offset ranges
            of the batches that disagree.
    """
    if len({b.schema for b in batches}) == 1:
        return pa.Table.from_batches(batches)
    fields: dict[str, pa.Field] = {}
    first: dict[str, pa.RecordBatch] = {}
    for batch in batches:
        for field in batch.schema:
            if field.name not in fields:
                fields[field.name], first[field.name] = field, batch
            elif wider(field.type, fields[field.name].type) is not None:
                fields[field.name] = fields[field.name].with_type(wider(field.type, fields[field.name].type))
            else:
                raise SchemaChangeError(
                    f"{where}field {field.name} changed type: {fields[field.name].type} at {offset_ranges(first[field.name])} "
                    f"but {field.type} at {offset_ranges(batch)}; nothing of it was landed")
    schema = pa.schema(list(fields.values()))
    tables = []
    for batch in batches:
        columns = [batch.column(f.name).cast(f.type) if f.name in batch.schema.names
                   else pa.nulls(batch.num_rows, f.type) for f in schema]
        tables.append(pa.Table.from_arrays(columns, schema=schema))
    return pa.concat_tables(tables)


def offset_ranges(data: pa.RecordBatch | pa.Table) -> str:
    """``topic-partition [first, last]`` per partition in ``data`` (or "offsets unknown" when
    the Kafka columns were dropped)."""
    if not {"topic", "partition", "offset"} <= set(data.schema.names) or data.num_rows == 0:
        return "offsets unknown"
    table = data if isinstance(data, pa.Table) else pa.Table.from_batches([data])
    grouped = table.group_by(["topic", "partition"]).aggregate([("offset", "min"), ("offset", "max")])
    return ", ".join(f"{r['topic']}-{r['partition']} offsets [{r['offset_min']}, {r['offset_max']}]"
                     for r in sorted(grouped.to_pylist(), key=lambda r: (r["topic"], r["partition"])))


class SchemaChangeError(FormatError):
    """A field whose type changed incompatibly within a micro-batch: the message names the
    field, both types and the offset ranges."""

"""``--partition-by``'s partition transforms: a table partitioned by the day or hour of a timestamp,
a bucket of a key, a truncated string, as Iceberg's partition transforms name them.

Each entry of ``--partition-by`` is a column (identity) or ``transform(column)`` /
``transform(N, column)``. A transform adds a *partition column* to every row before the files are
written, named as Iceberg names the partition field (``<column>_<transform>``), and the table is
partitioned by it (identity partitioning in both formats, so every Delta and Iceberg reader sees
an ordinary column it can filter on):

===================  ==========================  ==============================================
entry                partition column            value
===================  ==========================  ==============================================
``year(ts)``         ``ts_year`` INT             the UTC year (2026)
``month(ts)``        ``ts_month`` STRING         the UTC month, ``2026-09`` (Iceberg's text form)
``day(ts)``          ``ts_day`` DATE             the UTC date
``hour(ts)``         ``ts_hour`` TIMESTAMP       the UTC hour (the timestamp truncated to it)
``bucket(N, col)``   ``col_bucket`` INT          Iceberg's bucket: murmur3 of the value, mod N
``truncate(W, col)`` ``col_trunc`` (col's type)  strings: the first W characters; integers:
                                                 the value rounded down to a multiple of W
===================  ==========================  ==============================================

``ts`` may be a timestamp (with or without a zone; a zoned one in UTC) or a date (not for
``hour``); ``bucket`` takes integers, strings, binary, dates and timestamps (pyiceberg's
``BucketTransform``, the hash Iceberg's spec defines); a null value is a null partition.

**Delta's generated columns.** In a new Delta table the ``year``, ``month``, ``day``, ``hour`` and
``truncate`` partition columns carry their ``delta.generationExpression``
(:func:`delta_generation_expression`), so any Delta writer computes or checks them, and Delta's
Spark reader derives partition filters on ``day``, ``hour`` and a string's ``truncate`` from
predicates on the source column; ``bucket`` stays a plain column.

**Iceberg's hidden partitioning.** A new Iceberg table is partitioned by ``year``, ``month``,
``day`` and ``hour`` as Iceberg means it: its spec holds the transform of the source column
(``day(ts)``, partition field ``ts_day``) and the data files hold no partition column, so any
Iceberg reader prunes on predicates of ``ts`` itself. Chandy still writes one file per partition
value, and pyiceberg's ``add_files`` reads each file's partition from its ``ts`` bounds (these
transforms preserve order). ``bucket`` and ``truncate`` keep an identity partition on their
partition column (pyiceberg cannot read a bucket from bounds, and bounds of long strings are
truncated), as does every transform of a table created with its partition column.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

TRANSFORMS = ("year", "month", "day", "hour", "bucket", "truncate")
_ENTRY = re.compile(r"^\s*(?:(?P<transform>[a-z]+)\s*\(\s*(?:(?P<width>\d+)\s*,\s*)?(?P<source>[^()\s,]+)\s*\)"
                    r"|(?P<column>[^()\s,]+))\s*$")
_SUFFIX = {"year": "year", "month": "month", "day": "day", "hour": "hour", "bucket": "bucket", "truncate": "trunc"}


class PartitionSpecError(ValueError):
    """A ``--partition-by`` entry that is not a column nor a known transform of one (the message
    names the entry and what is expected)."""


@dataclasses.dataclass(frozen=True)
class PartitionField:
    """One ``--partition-by`` entry: ``transform`` (``identity`` or one of :data:`TRANSFORMS`) of
    ``source``, with ``width`` for ``bucket`` and ``truncate``."""

    source: str
    transform: str = "identity"
    width: int | None = None

    @property
    def column(self) -> str:
        """The partition column: the source itself, or ``<source>_<transform>``."""
        return self.source if self.transform == "identity" else f"{self.source}_{_SUFFIX[self.transform]}"


def parse_partition_by(entries: Sequence[str]) -> list[PartitionField]:
    """The fields of ``--partition-by`` entries (see the module docstring).

    Raises:
        PartitionSpecError: an entry of another shape, an unknown transform, a width missing or
            given where none is taken, or two entries with the same partition column.
    """
    fields = []
    for entry in entries:
        found = _ENTRY.match(entry)
        if found is None:
            raise PartitionSpecError(f"--partition-by {entry!r}: expected a column or transform(column) "
                                     f"({', '.join(TRANSFORMS)}; bucket and truncate take a width: bucket(16, id))")
        if found["column"]:
            fields.append(PartitionField(found["column"]))
            continue
        transform, width = found["transform"], found["width"]
        if transform not in TRANSFORMS:
            raise PartitionSpecError(f"--partition-by {entry!r}: unknown transform {transform!r} "
                                     f"(one of {', '.join(TRANSFORMS)})")
        if (width is None) == (transform in ("bucket", "truncate")):
            raise PartitionSpecError(f"--partition-by {entry!r}: {transform} takes "
                                     + ("a width first: " + f"{transform}(16, {found['source']})"
                                        if width is None else f"only a column: {transform}({found['source']})"))
        if width is not None and int(width) < 1:
            raise PartitionSpecError(f"--partition-by {entry!r}: the width must be at least 1")
        fields.append(PartitionField(found["source"], transform, None if width is None else int(width)))
    columns = [f.column for f in fields]
    twice = sorted({c for c in columns if columns.count(c) > 1})
    if twice:
        raise PartitionSpecError(f"--partition-by: partition column(s) {twice} given twice")
    return fields


#: the transforms a new Iceberg table takes as hidden partitions (see the module docstring)
HIDDEN = ("year", "month", "day", "hour")


def iceberg_transform(field: PartitionField) -> Any:
    """pyiceberg's transform of ``field`` (one of :data:`HIDDEN`)."""
    from pyiceberg.transforms import DayTransform, HourTransform, MonthTransform, YearTransform

    return {"year": YearTransform, "month": MonthTransform, "day": DayTransform, "hour": HourTransform}[field.transform]()


#: the generation expression of each transform's partition column of a new Delta table (Delta's
#: generated columns, ``delta.generationExpression``), where one expression means the same value in
#: Spark SQL and in delta-rs (DataFusion), which both check a written value against it
DELTA_GENERATED = ("year", "month", "day", "hour", "truncate")


def delta_generation_expression(field: PartitionField, source_type: pa.DataType) -> str | None:
    """The Delta generation expression of ``field``'s partition column, whose source column is of
    ``source_type``, or None where there is none both engines evaluate alike (``bucket``: Spark
    has no Iceberg murmur3 bucket): that stays a plain column. ``day`` is ``CAST(ts AS DATE)``,
    ``hour`` ``DATE_TRUNC('HOUR', ts)`` and a string's ``truncate`` ``SUBSTRING(s, 1, W)``, which
    Delta's Spark reader turns into partition filters on predicates of the source column; ``year``
    is ``EXTRACT(YEAR FROM ts)`` (delta-rs has no ``YEAR``), ``month``
    ``SUBSTRING(CAST(ts AS STRING), 1, 7)`` (both engines cast a date or timestamp to text
    starting ``yyyy-MM-``; Delta's optimizable month form, ``DATE_FORMAT(ts, 'yyyy-MM')``, is a
    Spark pattern DataFusion does not read, so Spark prunes no month from ``ts``) and an
    integer's ``truncate`` ``i - (((i % W) + W) % W)``. Spark evaluates a
    zone-aware timestamp's expressions in the session time zone, and Chandy computes them in UTC,
    as delta-rs does: a Spark session reading or writing the table runs with
    ``spark.sql.session.timeZone=UTC``."""
    if field.transform not in DELTA_GENERATED:
        return None
    column = f"`{field.source}`"
    if field.transform == "year":
        return f"EXTRACT(YEAR FROM {column})"
    if field.transform == "month":
        return f"SUBSTRING(CAST({column} AS STRING), 1, 7)"
    if field.transform == "day":
        return f"CAST({column} AS DATE)"
    if field.transform == "hour":
        return f"DATE_TRUNC('HOUR', {column})"
    if pa.types.is_string(source_type) or pa.types.is_large_string(source_type):
        return f"SUBSTRING({column}, 1, {field.width})"
    if pa.types.is_integer(source_type):
        return f"{column} - ((({column} % {field.width}) + {field.width}) % {field.width})"
    return None


def with_generation_expressions(schema: pa.Schema, fields: Sequence[PartitionField]) -> pa.Schema:
    """``schema`` with each transform's partition column carrying its Delta generation expression
    (:func:`delta_generation_expression`) in its field metadata, as a new Delta table's schema."""
    for field in fields:
        if field.transform == "identity" or field.column not in schema.names or field.source not in schema.names:
            continue
        expression = delta_generation_expression(field, schema.field(field.source).type)
        if expression is None:
            continue
        index = schema.get_field_index(field.column)
        column = schema.field(index)
        schema = schema.set(index, column.with_metadata({**(column.metadata or {}),
                                                         b"delta.generationExpression": expression.encode()}))
    return schema


def partition_columns(entries: Sequence[str]) -> tuple[list[PartitionField], list[str]]:
    """(the fields of ``entries``, their partition columns): what a sink partitions by."""
    fields = parse_partition_by(entries)
    return fields, [f.column for f in fields]


def partition_groups(table: pa.Table, columns: Sequence[str]) -> list[tuple[dict[str, Any], pa.Table]]:
    """``table``'s rows grouped by their values of ``columns`` (one partition each): (the
    partition's values, column to value or None, its rows), in the order Arrow's group-by finds them."""
    groups = []
    for key in table.select(list(columns)).group_by(list(columns)).aggregate([]).to_pylist():
        mask = None
        for column, value in key.items():
            condition = pc.is_null(table[column]) if value is None else pc.equal(table[column], value)
            mask = condition if mask is None else pc.and_(mask, condition)
        groups.append((key, table.filter(mask)))
    return groups


def with_partition_columns(table: pa.Table, fields: Sequence[PartitionField]) -> pa.Table:
    """``table`` with the partition column of each transform in ``fields`` appended (computed from
    its source column; one already there is kept, as a replayed part has it).

    Raises:
        PartitionSpecError: a source column missing, or of a type the transform does not take.
    """
    for field in fields:
        if field.transform == "identity" or field.column in table.column_names:
            continue
        if field.source not in table.column_names:
            raise PartitionSpecError(f"--partition-by {field.transform}({field.source}): there is no column "
                                     f"{field.source} (columns: {', '.join(table.column_names)})")
        table = table.append_column(field.column, _transformed(table.column(field.source), field))
    return table


def _transformed(values: Any, field: PartitionField) -> pa.Array:
    kind = values.type
    where = f"--partition-by {field.transform}({field.source})"
    temporal = pa.types.is_timestamp(kind) or pa.types.is_date(kind)
    if field.transform in ("year", "month", "day", "hour") and not temporal:
        raise PartitionSpecError(f"{where}: {field.source} is {kind}, not a timestamp or a date")
    if pa.types.is_timestamp(kind) and kind.tz is not None:
        values = pc.cast(values, pa.timestamp(kind.unit, tz="UTC"))  # the UTC fields of each instant
    if field.transform == "year":
        return pc.cast(pc.year(values), pa.int32())
    if field.transform == "month":
        return pc.strftime(values, format="%Y-%m")
    if field.transform == "day":
        return pc.cast(pc.cast(values, pa.timestamp("us")) if pa.types.is_timestamp(kind) else values, pa.date32())
    if field.transform == "hour":
        if not pa.types.is_timestamp(kind):
            raise PartitionSpecError(f"{where}: {field.source} is a date, which has no hour")
        return pc.floor_temporal(values, unit="hour")
    assert field.width is not None
    if field.transform == "truncate":
        if pa.types.is_string(kind) or pa.types.is_large_string(kind):
            return pc.utf8_slice_codeunits(values, 0, field.width)
        if pa.types.is_integer(kind):  # Iceberg's v - (((v % W) + W) % W): Python's % is that floor modulo
            return pa.array([None if v is None else v - v % field.width for v in values.to_pylist()], kind)
        raise PartitionSpecError(f"{where}: {field.source} is {kind}; truncate takes strings and integers")
    return _bucket(values, field.width, where)


def _bucket(values: Any, width: int, where: str) -> pa.Array:
    """Iceberg's bucket transform of ``values``: pyiceberg's ``BucketTransform`` (murmur3, as the
    spec defines it), value by value."""
    import datetime

    from pyiceberg.transforms import BucketTransform
    from pyiceberg.types import BinaryType, DateType, IntegerType, LongType, StringType, TimestampType, TimestamptzType

    kind = values.type
    epoch = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)

    def micros(t: datetime.datetime) -> int:
        return ((t if t.tzinfo is not None else t.replace(tzinfo=datetime.UTC)) - epoch) // datetime.timedelta(
            microseconds=1)

    iceberg: Any
    convert: Callable[[Any], Any]
    if pa.types.is_integer(kind):
        iceberg, convert = (IntegerType() if kind.bit_width <= 32 else LongType()), int
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        iceberg, convert = StringType(), str
    elif pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        iceberg, convert = BinaryType(), bytes
    elif pa.types.is_date(kind):
        iceberg, convert = DateType(), lambda d: (d - epoch.date()).days
    elif pa.types.is_timestamp(kind):
        iceberg, convert = (TimestamptzType() if kind.tz is not None else TimestampType()), micros
    else:
        raise PartitionSpecError(f"{where}: bucket takes integers, strings, binary, dates and timestamps, not {kind}")
    hash_to_bucket = BucketTransform(width).transform(iceberg)
    return pa.array([None if v is None else hash_to_bucket(convert(v)) for v in values.to_pylist()], pa.int32())

"""The one type-mapping table: every Avro type and logical type, and every Spark DDL type a JSON
value schema may use, to the Arrow, Delta and Iceberg type it lands as, at every depth, and what
happens to a value that does not fit. ``docs/type-mapping.md`` prints :data:`TYPE_MAPPING`
(a unit test keeps the two equal).

The column types follow Spark: Avro as spark-avro's ``SchemaConverters.toSqlType`` maps it (what
``from_avro`` returns), JSON as ``from_json`` reads a DDL schema (Spark's ``JacksonParser``).
Values are converted here, in the Spark tasks, strictly: a value that does not fit its column
is a *bad record* (``--errors-tolerance`` decides what happens to it, see
:mod:`chandy.formats.decoder`), never rounded, truncated or landed as NULL. Where ``from_json``
converts a value (an integer into ``DOUBLE``, a decimal with more fractional digits than the
scale), Chandy converts it the same way; the table's last column says so.

Zoned timestamps land as microseconds in UTC (``timestamp[us, tz=UTC]``) at every depth:
:func:`utc_schema` / :func:`to_lake_types` normalize what Spark hands a writer in its session
time zone (often named ``Etc/UTC``), which Delta refuses.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime
import decimal
import functools
import math
import zoneinfo
from collections.abc import Callable
from typing import Any

import pyarrow as pa


@dataclasses.dataclass(frozen=True)
class TypeRow:
    """One row of the mapping: a source type, the Spark SQL type it becomes, its Arrow, Delta and
    Iceberg types, and what happens to a value that does not fit."""

    source: str
    spark: str
    arrow: str
    delta: str
    iceberg: str
    unfit: str


_BAD = "bad record"

#: Every supported Avro type (value format ``avro``), in the order of the Avro specification.
AVRO_TYPES: tuple[TypeRow, ...] = (
    TypeRow("null (alone)", "-", "-", "-", "-", "refused at start"),
    TypeRow("boolean", "BOOLEAN", "bool", "boolean", "boolean", "-"),
    TypeRow("int", "INT", "int32", "integer", "int", "-"),
    TypeRow("long", "BIGINT", "int64", "long", "long", "-"),
    TypeRow("float", "FLOAT", "float32", "float", "float", "- (NaN, ±inf and -0.0 kept)"),
    TypeRow("double", "DOUBLE", "float64", "double", "double", "- (NaN, ±inf and -0.0 kept)"),
    TypeRow("bytes", "BINARY", "binary", "binary", "binary", "-"),
    TypeRow("string", "STRING", "string", "string", "string", "-"),
    TypeRow("record", "STRUCT", "struct", "struct", "struct", "a record that contains itself: refused at start"),
    TypeRow("enum", "STRING", "string", "string", "string", "-"),
    TypeRow("array", "ARRAY", "list", "array", "list", "-"),
    TypeRow("map", "MAP<STRING, ...>", "map<string, ...>", "map", "map", "-"),
    TypeRow("fixed", "BINARY", "binary", "binary", "binary", "-"),
    TypeRow("union of null and one type", "that type, nullable", "that type", "that type", "that type, optional", "-"),
    TypeRow("union of int and long (and null)", "BIGINT", "int64", "long", "long", "-"),
    TypeRow("union of float and double (and null)", "DOUBLE", "float64", "double", "double", "-"),
    TypeRow("union of two or more other non-null types", "STRUCT<member0, member1, ...> (one nullable field per "
            "non-null branch, in order; the branch written is set, the others null)", "struct", "struct", "struct", "-"),
    TypeRow("union with two branches of one type (e.g. `{\"type\": \"int\", \"logicalType\": \"date\"}` and "
            "`\"int\"`: both int)", "-", "-", "-", "-",
            "refused at start, naming the field: the Avro spec allows one branch per type but the named ones"),
    TypeRow("decimal (bytes or fixed), precision p ≤ 38, scale s (default 0)", "DECIMAL(p, s)", "decimal128(p, s)",
            "decimal(p,s)", "decimal(p, s)", f"more digits than p: {_BAD}; p > 38: refused at start"),
    TypeRow("uuid (string)", "STRING", "string", "string", "string", "-"),
    TypeRow("date (int)", "DATE", "date32", "date", "date", "-"),
    TypeRow("time-millis (int)", "INT (milliseconds after midnight, as from_avro)", "int32", "integer", "int", "-"),
    TypeRow("time-micros (long)", "BIGINT (microseconds after midnight, as from_avro)", "int64", "long", "long", "-"),
    TypeRow("timestamp-millis / timestamp-micros (long)", "TIMESTAMP", "timestamp[us, tz=UTC]", "timestamp",
            "timestamptz", "-"),
    TypeRow("local-timestamp-millis / local-timestamp-micros (long)", "TIMESTAMP_NTZ", "timestamp[us]", "timestamp_ntz",
            "timestamp", "-"),
)

#: Every Spark DDL type a JSON value schema (``--value-schema``) may use, and what JSON value each takes.
JSON_TYPES: tuple[TypeRow, ...] = (
    TypeRow("BOOLEAN: true / false", "BOOLEAN", "bool", "boolean", "boolean", f"any other value: {_BAD}"),
    TypeRow("TINYINT, SMALLINT, INT, BIGINT: an integer", "same", "int8, int16, int32, int64", "byte, short, integer, long",
            "int, int, int, long", f"a number with a fraction or exponent (1.5, 1.0, 1e3), out of range, a string: {_BAD}"),
    TypeRow("FLOAT, DOUBLE: a number, or \"NaN\", \"Infinity\", \"-Infinity\" (also bare NaN / Infinity)", "same",
            "float32, float64", "float, double", "float, double",
            "a number is rounded to the nearest float / double, as from_json (2^53 + 1 into DOUBLE lands 2^53); "
            f"a number beyond the type's range, a boolean, another string: {_BAD}"),
    TypeRow("DECIMAL(p, s): a number or a string holding one, parsed exactly (never through a float)",
            "DECIMAL(p, s)", "decimal128(p, s)", "decimal(p,s)", "decimal(p, s)",
            "more fractional digits than s: rounded half up to s, as from_json (1.005 into DECIMAL(10,2) lands 1.01); "
            f"then more than p digits, NaN, infinity, a boolean: {_BAD}"),
    TypeRow("STRING, CHAR(n), VARCHAR(n): a string", "STRING", "string", "string", "string",
            f"a number, boolean, object or array: {_BAD} (from_json would land its JSON text)"),
    TypeRow("BINARY: a base64 string", "BINARY", "binary", "binary", "binary", f"not base64: {_BAD}"),
    TypeRow("DATE: an ISO-8601 date string", "DATE", "date32", "date", "date", f"anything else: {_BAD}"),
    TypeRow("TIMESTAMP, TIMESTAMP_LTZ: an ISO-8601 string (no offset: the Spark session time zone, "
            "spark.sql.session.timeZone), or an integer of seconds since the epoch", "TIMESTAMP", "timestamp[us, tz=UTC]",
            "timestamp", "timestamptz", f"anything else: {_BAD}"),
    TypeRow("TIMESTAMP_NTZ: an ISO-8601 string without an offset", "TIMESTAMP_NTZ", "timestamp[us]", "timestamp_ntz",
            "timestamp", f"a string with an offset, anything else: {_BAD}"),
    TypeRow("ARRAY<t>: an array", "ARRAY<t>", "list", "array", "list", f"each element as t; not an array: {_BAD}"),
    TypeRow("MAP<STRING, t>: an object", "MAP<STRING, t>", "map<string, t>", "map", "map",
            f"each value as t; not an object: {_BAD}"),
    TypeRow("STRUCT<...>: an object (fields without a column are ignored, missing ones null)", "STRUCT", "struct",
            "struct", "struct", f"each field as its type; not an object: {_BAD}"),
)

#: The whole table (Avro, then JSON).
TYPE_MAPPING: tuple[TypeRow, ...] = AVRO_TYPES + JSON_TYPES


def markdown_table(rows: tuple[TypeRow, ...]) -> str:
    """``rows`` as a Markdown table (what ``docs/type-mapping.md`` holds)."""
    head = "| source | Spark SQL | Arrow | Delta | Iceberg | a value that does not fit |\n|---|---|---|---|---|---|\n"
    return head + "".join(f"| {r.source} | {r.spark} | {r.arrow} | {r.delta} | {r.iceberg} | {r.unfit} |\n" for r in rows)


# ---------------------------------------------------------------------------------------------
# Zoned timestamps: UTC at every depth


UTC_TIMESTAMP = pa.timestamp("us", tz="UTC")


def widens(narrow: pa.DataType, wide: pa.DataType) -> bool:
    """Whether a column of Arrow type ``narrow`` may become ``wide`` in place, by the Iceberg
    spec's type promotions in schema evolution: int to long, float to double, and decimal(P, S) to
    decimal(P', S) with P' > P (Delta's type widening allows these too, but delta-rs cannot write
    it, see ``docs/design.md``)."""
    if pa.types.is_decimal(narrow) and pa.types.is_decimal(wide):
        return narrow.scale == wide.scale and wide.precision > narrow.precision
    return (narrow, wide) in ((pa.int32(), pa.int64()), (pa.float32(), pa.float64()))


def wider(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The wider of two column types when one :func:`widens` to the other (the same type: it);
    None when neither does."""
    if a.equals(b) or widens(b, a):
        return a
    return b if widens(a, b) else None


def utc_type(arrow_type: pa.DataType) -> pa.DataType:
    """``arrow_type`` with every zoned timestamp, at any depth, as ``timestamp[us, tz=UTC]`` (the
    same instants); large strings, binaries and lists as their plain forms (what Delta stores)."""
    if pa.types.is_timestamp(arrow_type):
        return UTC_TIMESTAMP if arrow_type.tz else arrow_type
    if pa.types.is_large_string(arrow_type) or pa.types.is_string_view(arrow_type):
        return pa.string()
    if pa.types.is_large_binary(arrow_type) or pa.types.is_binary_view(arrow_type):
        return pa.binary()
    if pa.types.is_struct(arrow_type):
        return pa.struct([arrow_type.field(i).with_type(utc_type(arrow_type.field(i).type))
                          for i in range(arrow_type.num_fields)])
    if pa.types.is_map(arrow_type):
        return pa.map_(arrow_type.key_field.with_type(utc_type(arrow_type.key_type)),
                       arrow_type.item_field.with_type(utc_type(arrow_type.item_type)))
    if pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) or pa.types.is_list_view(arrow_type):
        return pa.list_(arrow_type.value_field.with_type(utc_type(arrow_type.value_type)))
    return arrow_type


def utc_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with :func:`utc_type` applied to every column (metadata kept)."""
    return pa.schema([f.with_type(utc_type(f.type)) for f in schema], metadata=schema.metadata)


def inferred_json_type(arrow_type: pa.DataType) -> pa.DataType:
    """A type pyarrow's JSON reader inferred, as a column: all-null fields as strings and
    timestamps (any unit) as ``timestamp[us, tz=UTC]``, at every depth."""
    t = arrow_type
    if pa.types.is_null(t):
        return pa.string()
    if pa.types.is_timestamp(t):
        return UTC_TIMESTAMP
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(inferred_json_type(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(inferred_json_type(t.value_type))
    return t


def to_lake_types(table: pa.Table) -> pa.Table:
    """``table`` cast to :func:`utc_schema` (a no-op when it already is): what a lake writer takes."""
    target = utc_schema(table.schema)
    return table if target.equals(table.schema) else table.cast(target)


# ---------------------------------------------------------------------------------------------
# JSON values into their columns, exactly


class Unfit(ValueError):
    """A JSON value that does not fit its column; ``path`` is where, inside the column
    (``""`` at the top, ``.field``, ``[3]``, ``{key}``)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path

    def at(self, step: str) -> Unfit:
        return Unfit(step + self.path, str(self))


_INT_RANGES = {8: (-(2**7), 2**7 - 1), 16: (-(2**15), 2**15 - 1), 32: (-(2**31), 2**31 - 1), 64: (-(2**63), 2**63 - 1)}
_NON_FINITE = {"NaN": math.nan, "+NaN": math.nan, "-NaN": math.nan, "Infinity": math.inf, "+Infinity": math.inf,
               "Inf": math.inf, "+Inf": math.inf, "INF": math.inf, "+INF": math.inf,
               "-Infinity": -math.inf, "-Inf": -math.inf, "-INF": -math.inf}
#: the largest finite FLOAT (float32), as a double
FLOAT32_MAX = 3.4028234663852886e38
#: the smallest magnitude that rounds to infinity in a float32 under IEEE 754 round-to-nearest-even,
#: (2 - 2**-24) * 2**127, exact as a double: a number below it lands as the nearest float (at
#: most FLOAT32_MAX), as Java's ``Float.parseFloat`` and Spark's JSON reader read
#: ``3.4028235e38`` (the shortest decimal of Float.MAX_VALUE) as Float.MAX_VALUE
FLOAT32_OVERFLOW = 3.4028235677973366e38


def _shown(value: Any) -> str:
    text = repr(value) if not isinstance(value, decimal.Decimal) else str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _integer(bits: int) -> Callable[[Any], Any]:
    low, high = _INT_RANGES[bits]

    def convert(value: Any) -> Any:
        if value is None:
            return None
        if type(value) is not int:
            what = "a number with a fraction or an exponent" if isinstance(value, decimal.Decimal | float) else type(value).__name__
            raise Unfit("", f"{_shown(value)} is {what}, not an integer")
        if not low <= value <= high:
            raise Unfit("", f"{value} is out of the range of a {bits}-bit integer")
        return value

    return convert


def _float32_overflows(value: int | decimal.Decimal | float, result: float) -> bool:
    """Whether ``value`` (``result``: it as the nearest double) rounds to infinity as a float32:
    compared exactly with :data:`FLOAT32_OVERFLOW` for an integer or a decimal (rounding it to a
    double first could cross the boundary), as the double otherwise."""
    if isinstance(value, int | decimal.Decimal):
        return decimal.Decimal(value).copy_abs() >= decimal.Decimal(FLOAT32_OVERFLOW)  # exact: abs() rounds to 28 digits
    return abs(result) >= FLOAT32_OVERFLOW


def _nearest_float32(value: int | decimal.Decimal | float, result: float) -> float:
    """The float32 nearest ``value`` (ties to even), as a double: ``result`` (the double nearest
    ``value``) rounded to float32 is that, except where ``result`` lies exactly halfway between two
    floats and ``value`` does not (rounding twice would then go the wrong way: the integer
    2^128 - 2^103 - 1 would become infinity), as Java's ``Float.parseFloat`` rounds once."""
    import numpy as np

    if not isinstance(value, int | decimal.Decimal) or not math.isfinite(result):
        return result
    exact, halfway = decimal.Decimal(value), decimal.Decimal(result)
    if exact == halfway:
        return result
    with np.errstate(over="ignore"):
        near = np.float32(result)
        if float(near) == result:
            return result  # a float32 itself: no tie to break
        other = np.nextafter(near, np.float32(-np.inf if float(near) > result else np.inf))
    low, high = sorted((float(near), float(other)))

    def exactly(x: float) -> decimal.Decimal:  # a float32 neighbour; infinity stands for 2^128
        return decimal.Decimal(2**128 if x > 0 else -(2**128)) if math.isinf(x) else decimal.Decimal(x)

    with decimal.localcontext() as context:
        context.prec = 400  # exact: a float32 has at most 150 significant decimal digits (its subnormals)
        tie = exactly(low) + exactly(high) == 2 * halfway
    if not tie:
        return float(near)
    return high if exact > halfway else low


def _floating(single: bool) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, bool):
            raise Unfit("", f"{value} is a boolean, not a number")
        if isinstance(value, str):
            if value in _NON_FINITE:
                return _NON_FINITE[value]
            raise Unfit("", f"{_shown(value)} is a string, not a number")
        if isinstance(value, int | decimal.Decimal | float):
            try:
                result = float(value)  # correctly rounded, as Java's BigDecimal.doubleValue
            except OverflowError:
                result = math.inf
            if math.isinf(result) and not (isinstance(value, float) and math.isinf(value)):
                raise Unfit("", f"{_shown(value)} is out of the range of a double")
            if single and math.isfinite(result) and _float32_overflows(value, result):
                raise Unfit("", f"{_shown(value)} is out of the range of a float")
            return _nearest_float32(value, result) if single else result
        raise Unfit("", f"{_shown(value)} is {type(value).__name__}, not a number")

    return convert


def _decimal(precision: int, scale: int) -> Callable[[Any], Any]:
    quantum = decimal.Decimal(1).scaleb(-scale)
    context = decimal.Context(prec=max(precision, 1) + 80, rounding=decimal.ROUND_HALF_UP)

    def convert(value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | decimal.Decimal | str | float):
            raise Unfit("", f"{_shown(value)} is {type(value).__name__}, not a decimal number")
        if isinstance(value, str):
            try:
                number = decimal.Decimal(value.strip())
            except decimal.InvalidOperation as exc:
                raise Unfit("", f"{_shown(value)} is not a decimal number") from exc
        elif isinstance(value, float):
            number = decimal.Decimal(repr(value))  # only reached for values not parsed by Chandy's JSON parser
        else:
            number = decimal.Decimal(value)
        if not number.is_finite():
            raise Unfit("", f"{_shown(value)} is not a finite decimal number")
        try:
            rounded = number.quantize(quantum, context=context)  # Java's BigDecimal.setScale(scale, HALF_UP)
        except decimal.InvalidOperation:
            rounded = None
        if rounded is None or len(rounded.as_tuple().digits) > precision:
            raise Unfit("", f"{_shown(value)} does not fit DECIMAL({precision}, {scale}): more than "
                            f"{precision - scale} digit(s) before the point")
        return rounded

    return convert


def _boolean(value: Any) -> Any:
    if value is None or isinstance(value, bool):
        return value
    raise Unfit("", f"{_shown(value)} is {type(value).__name__}, not a boolean")


def _string(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    raise Unfit("", f"{_shown(value)} is {type(value).__name__}, not a string")


def _binary(value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, str):
        raise Unfit("", f"{_shown(value)} is {type(value).__name__}, not a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise Unfit("", f"{_shown(value)} is not base64: {exc}") from exc


def _date(value: Any) -> Any:
    if value is None:
        return None
    if not isinstance(value, str):
        raise Unfit("", f"{_shown(value)} is {type(value).__name__}, not an ISO-8601 date string")
    try:
        return datetime.date.fromisoformat(value.strip())
    except ValueError as exc:
        raise Unfit("", f"{_shown(value)} is not an ISO-8601 date: {exc}") from exc


def _parse_iso(value: Any) -> datetime.datetime:
    if not isinstance(value, str):
        raise Unfit("", f"{_shown(value)} is {type(value).__name__}, not an ISO-8601 timestamp string")
    try:
        return datetime.datetime.fromisoformat(value.strip())
    except ValueError as exc:
        raise Unfit("", f"{_shown(value)} is not an ISO-8601 timestamp: {exc}") from exc


def _timestamp(session_time_zone: str) -> Callable[[Any], Any]:
    zone: datetime.tzinfo = datetime.UTC if session_time_zone.upper() in ("UTC", "Z", "ETC/UTC", "GMT") \
        else zoneinfo.ZoneInfo(session_time_zone)

    def convert(value: Any) -> Any:
        if value is None:
            return None
        if type(value) is int:  # seconds since the epoch, as from_json
            try:
                return datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC) + datetime.timedelta(seconds=value)
            except OverflowError as exc:
                raise Unfit("", f"{value} s after the epoch is out of the timestamp range") from exc
        parsed = _parse_iso(value)
        return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=zone)

    return convert


def _timestamp_ntz(value: Any) -> Any:
    if value is None:
        return None
    parsed = _parse_iso(value)
    if parsed.tzinfo is not None:
        raise Unfit("", f"{_shown(value)} has a UTC offset: a TIMESTAMP_NTZ takes a local date-time")
    return parsed


def _list(element: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, list):
            raise Unfit("", f"{_shown(value)} is {type(value).__name__}, not an array")
        if element is None:
            return value
        out = []
        for i, item in enumerate(value):
            try:
                out.append(element(item))
            except Unfit as exc:
                raise exc.at(f"[{i}]") from None
        return out

    return convert


def _map(key: Callable[[Any], Any] | None, item: Callable[[Any], Any] | None) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise Unfit("", f"{_shown(value)} is {type(value).__name__}, not an object")
        out = []
        for k, v in value.items():
            try:
                out.append((k if key is None else key(k), v if item is None else item(v)))
            except Unfit as exc:
                raise exc.at(f"{{{k}}}") from None
        return out

    return convert


def _struct(fields: list[tuple[str, Callable[[Any], Any] | None]]) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, dict):
            raise Unfit("", f"{_shown(value)} is {type(value).__name__}, not an object")
        out = {}
        for name, field in fields:
            found = value.get(name)
            try:
                out[name] = found if field is None else field(found)
            except Unfit as exc:
                raise exc.at(f".{name}") from None
        return out

    return convert


@functools.lru_cache(maxsize=256)
def json_converter(arrow_type: pa.DataType, session_time_zone: str = "UTC") -> Callable[[Any], Any] | None:
    """How a JSON value (parsed with :func:`parse_json`, numbers with a fraction or exponent as
    :class:`decimal.Decimal`) becomes a value of ``arrow_type`` for ``pyarrow.array``, following
    :data:`JSON_TYPES`; None when pyarrow's own strict conversion is it (strings of a string column).
    ``session_time_zone``: the zone of timestamps without an offset (Spark's ``spark.sql.session.timeZone``).

    The converter raises :class:`Unfit` (with the path inside the column) for a value that does
    not fit.
    """
    t = arrow_type
    if pa.types.is_boolean(t):
        return _boolean
    if pa.types.is_integer(t):
        return _integer(t.bit_width)
    if pa.types.is_floating(t):
        return _floating(t.bit_width == 32)
    if pa.types.is_decimal(t):
        return _decimal(t.precision, t.scale)
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return _string
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return _binary
    if pa.types.is_date(t):
        return _date
    if pa.types.is_timestamp(t):
        return _timestamp(session_time_zone) if t.tz else _timestamp_ntz
    if pa.types.is_struct(t):
        return _struct([(t.field(i).name, json_converter(t.field(i).type, session_time_zone)) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return _map(json_converter(t.key_type, session_time_zone), json_converter(t.item_type, session_time_zone))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _list(json_converter(t.value_type, session_time_zone))
    raise TypeError(f"{t} has no JSON mapping (see docs/type-mapping.md)")


def parse_json(raw: bytes | str) -> Any:
    """A JSON text parsed exactly: integers as ``int``, numbers with a fraction or an exponent as
    :class:`decimal.Decimal` (their text, never through a float), ``NaN`` / ``Infinity`` as floats.

    Raises:
        ValueError, UnicodeDecodeError: not JSON.
    """
    import json

    return json.loads(raw, parse_float=decimal.Decimal)


def plain_numbers(value: Any) -> Any:
    """``value`` (from :func:`parse_json`) with decimals as floats, for type inference."""
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, dict):
        return {k: plain_numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_numbers(v) for v in value]
    return value

"""JSON values decoded a batch at a time by Arrow's own JSON reader (``pyarrow.json``), for the
batches where that gives exactly what the record-by-record path
(:meth:`chandy.formats.decoder.ValueDecoder.decode`) gives.

The record-by-record path parses each value with ``json.loads`` and converts each field through
:func:`chandy.formats.type_mapping.json_converter`: one Python object per field, about a fifth
of the raw-bytes rate. Arrow's reader parses a whole batch in C++ into typed columns, and keeps
numbers as their text until it converts them, so decimals are exact. Its rules are stricter than
the type mapping's, never looser, for the column types it is used for (a unit test compares the
two paths on generated records):

- integers: a fraction, an exponent, a string or a number out of range is an error in both;
- DOUBLE: numbers correctly rounded in both; FLOAT is read as DOUBLE and then rounded as the
  type mapping does (a finite number beyond FLOAT's range sends the batch to the other path);
- DECIMAL(p, s): exact in both; more fractional digits than ``s`` (which the type mapping
  rounds half up, as ``from_json``), more than ``p`` digits (checked by a full validation of the
  columns read: Arrow scales an integer up without checking), or a malformed string is an error;
- STRING, BOOLEAN, ARRAY, STRUCT: a value of another JSON type is an error in both;
- TIMESTAMP, TIMESTAMP_NTZ, DATE and BINARY columns are read as strings by Arrow and converted
  by the type mapping's own converters (an integer timestamp, which means seconds there, is an
  error here);
- a key given twice, a value that is not one JSON object on one line, or invalid UTF-8 is an
  error here.

Any error, and any batch this module cannot read (a null or empty value, a line break inside a
value, a MAP column, a nested FLOAT, TIMESTAMP, DATE or BINARY, or, with schema evolution, a field
without a column), makes :func:`decode_json_batch`
return None, and the caller decodes that batch record by record, which finds and names the bad
records. A batch of good records therefore lands the same values either way, faster here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pa_json

from chandy.formats.type_mapping import FLOAT32_OVERFLOW, Unfit, json_converter

#: Column types Arrow's reader converts exactly as the type mapping does, at any depth.
_NESTABLE = (pa.types.is_boolean, pa.types.is_integer, pa.types.is_float64, pa.types.is_decimal,
             pa.types.is_string, pa.types.is_large_string)
#: Top-level column types read as strings and converted by the type mapping's converters.
_AS_STRING = (pa.types.is_timestamp, pa.types.is_date, pa.types.is_binary, pa.types.is_large_binary)


def _exact(kind: pa.DataType) -> bool:
    """Whether Arrow's reader reads ``kind`` (at any depth) exactly as the type mapping does."""
    if any(test(kind) for test in _NESTABLE):
        return True
    if pa.types.is_struct(kind):
        return all(_exact(kind.field(i).type) for i in range(kind.num_fields))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _exact(kind.value_type)
    return False


@functools.lru_cache(maxsize=32)
def _plan(columns: pa.Schema, source_names: tuple[str, ...],
          session_time_zone: str) -> tuple[pa.Schema, tuple[Callable[[Any], Any] | None, ...]] | None:
    """The schema Arrow reads (fields under their names in the value) and, per column, the
    type mapping's converter to apply after it (None: Arrow's column is the value); None when
    a column's type is not one this module reads."""
    fields: list[pa.Field] = []
    converters: list[Callable[[Any], Any] | None] = []
    for field, name in zip(columns, source_names, strict=True):
        kind = field.type
        if _exact(kind):
            fields.append(pa.field(name, kind))
            converters.append(None)
        elif pa.types.is_float32(kind):
            fields.append(pa.field(name, pa.float64()))
            converters.append(None)
        elif any(test(kind) for test in _AS_STRING):
            fields.append(pa.field(name, pa.string()))
            converters.append(json_converter(kind, session_time_zone))
        else:
            return None
    return pa.schema(fields), tuple(converters)


def decode_json_batch(values: pa.Array, columns: pa.Schema, source_names: Sequence[str], *,
                      unknown_fields: str, session_time_zone: str) -> list[pa.Array] | None:
    """The value columns of a batch of JSON values (a binary array, one Kafka value each), in
    the order and types of ``columns``, read by Arrow's JSON reader; None when this batch must be
    decoded record by record instead (see the module docstring: that path finds and names any
    bad record).

    Args:
        values: the Kafka values, ``binary``.
        columns: the value columns as landed; ``source_names`` their field names in the value.
        unknown_fields: ``"ignore"``, ``"error"`` or ``"add"`` (a field without a column: see
            :class:`~chandy.formats.decoder.ValueDecoder`); with ``"add"``, a batch
            with such a field is decoded record by record (None), which adds its column.
        session_time_zone: the zone of timestamps without an offset.
    """
    if unknown_fields not in ("ignore", "error", "add") or len(values) == 0 or values.null_count:
        return None
    plan = _plan(columns, tuple(source_names), session_time_zone)
    if plan is None:
        return None
    read_schema, converters = plan
    table = _read_lines(values, read_schema, "ignore" if unknown_fields == "ignore" else "error")
    if table is None or table.num_columns != len(columns):
        return None
    return _converted(columns, converters, [c.combine_chunks() for c in table.columns])


def _read_lines(values: pa.Array, schema: pa.Schema, unexpected: str) -> pa.Table | None:
    """``values`` (one JSON object each, no line break inside) read by Arrow with ``schema``;
    None when a value has a line break, is blank, or Arrow refuses the batch."""
    if pc.any(pc.match_substring_regex(values, r"[\r\n]|^[ \t]*$")).as_py():
        return None
    text = b"\n".join(values.to_pylist())
    try:
        table = pa_json.read_json(
            pa.py_buffer(text),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=max(1 << 20, len(text) + 1)),
            parse_options=pa_json.ParseOptions(explicit_schema=schema, newlines_in_values=False,
                                               unexpected_field_behavior=unexpected))
        table.validate(full=True)  # Arrow's reader scales an integer into a DECIMAL without checking its precision
    except (pa.ArrowException, UnicodeDecodeError, ValueError):
        return None
    return table if table.num_rows == len(values) else None


def decode_json_change_batch(values: pa.Array, columns: pa.Schema, source_names: Sequence[str], *,
                             session_time_zone: str, keys: pa.Array | None = None,
                             id_columns: Sequence[str] = ()) -> tuple[list[pa.Array], pa.Array] | None:
    """A batch of Debezium JSON change events (``--cdc debezium``) read by Arrow's JSON reader:
    (the row columns, as :func:`decode_json_batch` gives them, and the operations), each row
    ``after`` for ``c``, ``u`` and ``r``, ``before`` for ``d``, and for a tombstone (a null
    value) its key's fields (``keys``: the Kafka keys, plain JSON objects; only ``id_columns``
    when given). None when the batch must go record by record (the converter's
    ``schema``/``payload`` wrapper on a value or a tombstone's key, another operation, a missing
    row, or anything :func:`decode_json_batch` would refuse), which also reads and names what is
    bad. Fields without a column are ignored, as with a value schema."""
    if len(values) == 0:
        return None
    plan = _plan(columns, tuple(source_names), session_time_zone)
    if plan is None:
        return None
    row_schema, converters = plan
    row = pa.struct(list(row_schema))
    tombstones = pc.is_null(values)
    table = _read_lines(pc.fill_null(values, b"{}"), pa.schema([("before", row), ("after", row), ("op", pa.string())]),
                        "ignore")
    if table is None:
        return None
    ops = pc.if_else(tombstones, "d", table.column("op").combine_chunks())
    if ops.null_count or not pc.all(pc.is_in(ops, value_set=pa.array(["c", "u", "r", "d"]))).as_py():
        return None
    is_delete = pc.equal(ops, "d")
    before, after = table.column("before").combine_chunks(), table.column("after").combine_chunks()
    chosen_null = pc.if_else(is_delete, pc.is_null(before), pc.is_null(after))
    if pc.any(pc.and_(chosen_null, pc.invert(tombstones))).as_py():
        return None
    arrays = [pc.if_else(is_delete, before.field(i), after.field(i)) for i in range(len(columns))]
    if values.null_count:
        key_rows = _tombstone_keys(keys, tombstones, row_schema, id_columns)
        if key_rows is None:
            return None
        arrays = [pc.if_else(tombstones, key_rows.field(i), array) for i, array in enumerate(arrays)]
    converted = _converted(columns, converters, arrays)
    return None if converted is None else (converted, ops)


def _tombstone_keys(keys: pa.Array | None, tombstones: pa.Array, row_schema: pa.Schema,
                    id_columns: Sequence[str]) -> pa.StructArray | None:
    """The rows tombstones delete: their keys read with the row's schema (other columns null),
    only ``id_columns`` when given; None when a tombstone's key is missing, wrapped in
    ``schema``/``payload``, or lacks an ID column."""
    if keys is None or pc.any(pc.and_(tombstones, pc.is_null(keys))).as_py():
        return None
    texts = pc.if_else(tombstones, pc.fill_null(keys, b"{}"), b"{}")
    if pc.any(pc.match_substring(texts, '"payload"')).as_py():
        return None
    read = _read_lines(texts, row_schema, "ignore")
    if read is None:
        return None
    names = list(id_columns) or list(row_schema.names)
    key_fields = [read.column(n).combine_chunks() if n in names else pa.nulls(len(texts), read.schema.field(n).type)
                  for n in row_schema.names]
    if id_columns and any(pc.any(pc.and_(tombstones, pc.is_null(key_fields[row_schema.names.index(n)]))).as_py()
                          for n in id_columns if n in row_schema.names):
        return None
    if not id_columns and not pc.all(pc.or_(pc.invert(tombstones), _any_valid(key_fields))).as_py():
        return None
    return pa.StructArray.from_arrays(key_fields, fields=list(row_schema))


def _any_valid(arrays: Sequence[pa.Array]) -> pa.Array:
    """Per row, whether any of ``arrays`` is not null there."""
    valid = pc.is_valid(arrays[0])
    for array in arrays[1:]:
        valid = pc.or_(valid, pc.is_valid(array))
    return valid


def _converted(columns: pa.Schema, converters: Sequence[Callable[[Any], Any] | None],
               read: Sequence[pa.Array]) -> list[pa.Array] | None:
    """Arrow's columns as ``columns``: the type mapping's converter applied where the plan says,
    FLOAT rounded from DOUBLE; None when a value does not fit (the batch goes record by record)."""
    arrays: list[pa.Array] = []
    for field, converter, array in zip(columns, converters, read, strict=True):
        if _negative_zero(array):  # an integer -0 reads as -0.0 here, 0.0 in the type mapping (as Jackson)
            return None
        try:
            if converter is not None:
                array = pa.array([converter(v) for v in array.to_pylist()], field.type)
            elif pa.types.is_float32(field.type):
                finite = pc.is_finite(array)
                # a double that rounds to infinity as a float goes record by record (a bad record there)
                if pc.any(pc.and_(finite, pc.greater_equal(pc.abs(array), FLOAT32_OVERFLOW))).as_py():
                    return None
                array = array.cast(pa.float32(), safe=False)  # a double rounded to the nearest float
        except (Unfit, pa.ArrowException, TypeError, ValueError, OverflowError):
            return None
        if not array.type.equals(field.type):
            return None
        arrays.append(array)
    return arrays


def _negative_zero(array: pa.Array) -> bool:
    """Whether a floating-point value of ``array``, at any depth, is -0.0."""
    kind = array.type
    if pa.types.is_floating(kind):
        zero = pc.equal(array, 0)
        return bool(pc.any(pc.and_(zero, pc.less(pc.divide(pa.scalar(1.0, kind), array), 0))).as_py())
    if pa.types.is_struct(kind):
        return any(_negative_zero(array.field(i)) for i in range(kind.num_fields))
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        return _negative_zero(array.flatten())
    return False

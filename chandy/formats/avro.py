"""Avro value schemas for the pipeline: which Avro schemas become which columns. Values are
decoded in the Spark tasks with fastavro (no spark-avro jar needed), see :mod:`chandy.formats.decoder`.

The value schema must be a record; each field becomes a column, as spark-avro's
``SchemaConverters.toSqlType`` maps it (so as ``from_avro`` would read it): the table, with the
Delta and Iceberg types and what happens to values that do not fit, is
:data:`chandy.formats.type_mapping.AVRO_TYPES` (``docs/type-mapping.md``). In short: records
are structs, arrays arrays, maps ``map<string, ...>``, enums and ``uuid`` strings, ``fixed`` and
``bytes`` binary, ``decimal`` decimal(p, s) at any depth, ``date`` date, ``timestamp-*`` UTC
timestamps, ``local-timestamp-*`` timestamp_ntz, ``time-millis`` int and ``time-micros`` long
(after midnight, as ``from_avro``), a union of null and one type that type, a union of int and
long a long, of float and double a double, and any other union a struct with one nullable field
``member<i>`` per non-null branch.

Named types (a record, enum or fixed referred to by name) resolve to their definition; a record
that contains itself is refused (:class:`AvroValueSchemaError`). Values are decoded with
:func:`reader_schema`, a rewrite of the schema for fastavro that reads the same bytes into those
column types. Framing: Avro single-object encoding (checked against the schema's fingerprint),
the Confluent wire format (the schema given is used as the writer schema), or raw Avro binary.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from chandy.formats.errors import FormatError

#: Avro's primitive types as spark-avro's ``SchemaConverters.toSqlType`` maps them, in Arrow (as
#: pyspark's ``to_arrow_type`` turns those Spark types into Arrow)
_PRIMITIVES = {"boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
               "double": pa.float64(), "bytes": pa.binary(), "string": pa.string()}
_UTC_MICROS = pa.timestamp("us", tz="UTC")


class AvroValueSchemaError(FormatError):
    """The value schema is not a record, or has a type that has no column type."""


def _struct(fields: list[tuple[str, pa.DataType]]) -> pa.DataType:
    """A struct of nullable fields (Spark's ``StructField`` default)."""
    return pa.struct([pa.field(name, kind, nullable=True) for name, kind in fields])


def _arrow_type(avro_type: Any, named: dict[str, Any], path: str, stack: tuple[str, ...] = ()) -> pa.DataType:
    """The Arrow type of ``avro_type`` (at field ``path``, for errors): spark-avro's Spark type,
    as pyspark's ``to_arrow_type`` gives it in Arrow (UTC timestamps, nullable struct fields, list
    elements ``element`` and map values nullable, map keys not)."""
    if isinstance(avro_type, list):
        seen: dict[str, Any] = {}
        for branch in avro_type:
            key = _union_key(branch, named)
            if key in seen:
                raise AvroValueSchemaError(f"field {path}: the union has two branches of type {key} ({seen[key]!r} and "
                                           f"{branch!r}); the Avro spec allows one of each type but the named ones")
            seen[key] = branch
        kinds = [t for t in avro_type if t != "null"]
        if not kinds:
            raise AvroValueSchemaError(f"field {path}: a union of null alone has no column type")
        if len(kinds) == 1:
            return _arrow_type(kinds[0], named, path, stack)
        widened = widened_union(kinds)
        if widened is not None:
            return _PRIMITIVES[widened]
        return _struct([(f"member{i}", _arrow_type(k, named, f"{path}.member{i}", stack))
                        for i, k in enumerate(kinds)])
    if isinstance(avro_type, str):
        if avro_type in _PRIMITIVES:
            return _PRIMITIVES[avro_type]
        if avro_type in named:
            if avro_type in stack:
                raise AvroValueSchemaError(f"field {path}: record {avro_type} contains itself (recursive types "
                                           "have no column type)")
            return _arrow_type(named[avro_type], named, path, stack)
        raise AvroValueSchemaError(f"field {path}: unknown Avro type {avro_type!r}")
    if not isinstance(avro_type, dict):
        raise AvroValueSchemaError(f"field {path}: unsupported Avro type {avro_type!r}")
    kind, logical = avro_type.get("type"), avro_type.get("logicalType")
    if logical == "decimal" and kind in ("bytes", "fixed"):
        if kind == "fixed":
            named.setdefault(avro_type.get("name", ""), avro_type)
        precision, scale = int(avro_type["precision"]), int(avro_type.get("scale", 0))
        if not 0 < precision <= 38 or not 0 <= scale <= precision:
            raise AvroValueSchemaError(f"field {path}: decimal({precision}, {scale}) has no column type "
                                       "(Spark's decimals hold 1 to 38 digits, a scale of 0 to the precision)")
        return pa.decimal128(precision, scale)
    if logical == "date" and kind == "int":
        return pa.date32()
    if logical in ("timestamp-millis", "timestamp-micros") and kind == "long":
        return _UTC_MICROS
    if logical in ("local-timestamp-millis", "local-timestamp-micros") and kind == "long":
        return pa.timestamp("us")
    if logical == "time-millis" and kind == "int":
        return pa.int32()  # milliseconds after midnight, as from_avro
    if logical == "time-micros" and kind == "long":
        return pa.int64()  # microseconds after midnight, as from_avro
    if logical == "uuid" and kind == "string":
        return pa.string()
    if kind == "record":
        name = avro_type.get("name", "")
        if name in stack:
            raise AvroValueSchemaError(f"field {path}: record {name} contains itself (recursive types have no column type)")
        named[name] = avro_type
        if "namespace" in avro_type:
            named[f"{avro_type['namespace']}.{name}"] = avro_type
        return _struct([(f["name"], _arrow_type(f["type"], named, f"{path}.{f['name']}", (*stack, name)))
                        for f in avro_type.get("fields", [])])
    if kind == "enum":
        named[avro_type.get("name", "")] = avro_type
        return pa.string()
    if kind == "fixed":
        named[avro_type.get("name", "")] = avro_type
        return pa.binary()
    if kind == "array":
        return pa.list_(pa.field("element", _arrow_type(avro_type["items"], named, f"{path}[]", stack)))
    if kind == "map":
        return pa.map_(pa.field("key", pa.string(), nullable=False),
                       pa.field("value", _arrow_type(avro_type["values"], named, f"{path}{{}}", stack)))
    if isinstance(kind, (str, list, dict)):
        return _arrow_type(kind, named, path, stack)  # {"type": "string"} and the like
    raise AvroValueSchemaError(f"field {path}: unsupported Avro type {avro_type!r}")


def _union_key(branch: Any, named: dict[str, Any]) -> str:
    """What the Avro spec tells a union's branches apart by: the type (``{"type": "int",
    "logicalType": "date"}`` is an int), or a named type's (record, enum, fixed) name."""
    if isinstance(branch, dict):
        if branch.get("type") in ("record", "enum", "fixed"):
            return str(branch.get("name"))
        return _union_key(branch.get("type"), named)
    if isinstance(branch, list):
        return "union"
    return str(branch)


def _record(schema_json: str) -> dict[str, Any]:
    try:
        schema = json.loads(schema_json)
    except json.JSONDecodeError as exc:
        raise AvroValueSchemaError(f"value schema is not JSON: {exc}") from exc
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise AvroValueSchemaError("the Avro value schema must be a record")
    return schema


def value_schema(schema_json: str) -> pa.Schema:
    """The value schema's fields as Arrow columns, named as in the value (see the module
    docstring for the mapping: spark-avro's Spark types, as pyspark's ``to_arrow_schema`` gives
    them with ``timezone="UTC"``; decoding itself is :mod:`chandy.formats.decoder`'s).

    Raises:
        AvroValueSchemaError: not JSON, not a record, or a field of a type without a column type
            (the message names the field's path, e.g. ``address.lines[]``).
    """
    schema = _record(schema_json)
    struct = _arrow_type(schema, {}, schema.get("name", "value"))
    return pa.schema(list(struct))


def change_row_schema(schema_json: str) -> str:
    """The row record of a Debezium change event's Avro envelope (``--cdc debezium``): the
    record type of its ``before`` or ``after`` field (a union of null and the row, Debezium's
    ``<server>.<schema>.<table>.Value``), as JSON, so its fields become the table's columns.

    Raises:
        AvroValueSchemaError: not a record, or neither field is a union holding a record.
    """
    envelope = _record(schema_json)
    for field in envelope.get("fields", []):
        if field.get("name") not in ("before", "after"):
            continue
        kinds = field.get("type")
        for kind in kinds if isinstance(kinds, list) else [kinds]:
            if isinstance(kind, dict) and kind.get("type") == "record":
                return json.dumps(kind)
    raise AvroValueSchemaError("the value schema is not a Debezium envelope: neither its before nor its after field "
                               "is a union of null and a record (the row)")


def widened_union(kinds: list[Any]) -> str | None:
    """The one type of a union of ``kinds`` (its non-null branches) that widens to one:
    spark-avro's two unions that widen to one type: int and long (long), float and double (double)."""
    if len(kinds) == 2 and all(isinstance(k, str) for k in kinds):
        if set(kinds) == {"int", "long"}:
            return "long"
        if set(kinds) == {"float", "double"}:
            return "double"
    return None


_PLAIN_LOGICAL = ("time-millis", "time-micros", "uuid")


def reader_schema(schema: Any) -> Any:
    """``schema`` (parsed JSON) rewritten for fastavro so that it decodes the same bytes into the
    values of the columns :func:`value_schema` gives:

    - ``time-millis``, ``time-micros`` and ``uuid`` lose their logical type (fastavro would
      return ``datetime.time`` and ``uuid.UUID``; the columns are int, long and string);
    - each non-null branch *i* of a union that becomes a struct is wrapped in a record of one
      field ``member<i>``: a record's binary encoding is its fields', so the bytes are the same,
      and fastavro returns ``{"member<i>": value}`` for the branch written, the struct's value.

    The result is for decoding only (its wrapper records' names are Chandy's).
    """
    counter = iter(range(1_000_000))

    def rewrite(node: Any) -> Any:
        if isinstance(node, list):
            kinds = [t for t in node if t != "null"]
            if len(kinds) < 2 or widened_union(kinds) is not None:
                return [rewrite(t) for t in node]
            out: list[Any] = []
            i = 0
            for branch in node:
                if branch == "null":
                    out.append("null")
                    continue
                out.append({"type": "record", "name": f"chandy_union_member_{next(counter)}",
                            "fields": [{"name": f"member{i}", "type": rewrite(branch)}]})
                i += 1
            return out
        if not isinstance(node, dict):
            return node
        copy = dict(node)
        if copy.get("logicalType") in _PLAIN_LOGICAL:
            del copy["logicalType"]
        kind = copy.get("type")
        if kind == "record":
            copy["fields"] = [_with_default(f, rewrite(f["type"])) for f in copy.get("fields", [])]
        elif kind == "array":
            copy["items"] = rewrite(copy["items"])
        elif kind == "map":
            copy["values"] = rewrite(copy["values"])
        elif isinstance(kind, list | dict):
            copy["type"] = rewrite(kind)
        return copy

    return rewrite(schema)


def _with_default(field: dict[str, Any], rewritten: Any) -> dict[str, Any]:
    """``field`` of type ``rewritten``; a default of a union whose first branch was wrapped in a
    ``member0`` record is wrapped the same way (a union's default is its first branch's value)."""
    out = {**field, "type": rewritten}
    first = rewritten[0] if isinstance(rewritten, list) and rewritten else None
    if out.get("default") is not None and isinstance(first, dict) and str(first.get("name", "")).startswith(
            "chandy_union_member_"):
        out["default"] = {"member0": out["default"]}
    return out


def promotes(written: Any, column: Any) -> bool:
    """Whether Avro's schema resolution reads a value written as Arrow type ``written`` into a
    column of Arrow type ``column``: int to long, float or double; long to float or double;
    float to double (the spec's promotions between types that have distinct columns)."""

    promotions = {pa.int32(): (pa.int64(), pa.float32(), pa.float64()), pa.int64(): (pa.float32(), pa.float64()),
                  pa.float32(): (pa.float64(),)}
    return any(column.equals(target) for target in promotions.get(written, ()))


def avro_columns(schema: Any) -> tuple[Any, tuple[str, ...]]:
    """An Avro record schema (JSON text or parsed) as landed columns: (a ``pyarrow.Schema``, each
    field's name in the value), as spark-avro maps it (:func:`value_schema`); a field named like a
    Kafka column lands as ``value_<name>``.

    Raises:
        AvroValueSchemaError: not a record, or a field without a column type.
    """
    from chandy.formats.records import ARROW_SCHEMA

    arrow = value_schema(schema if isinstance(schema, str) else json.dumps(schema))
    renamed = [f.with_name(f"value_{f.name}") if f.name in ARROW_SCHEMA.names else f for f in arrow]
    return pa.schema(renamed), tuple(f.name for f in arrow)


"""Avro value schemas for the pipeline: which Avro schemas become which columns. Values are
decoded in the Spark tasks with fastavro (no spark-avro jar needed), see :mod:`chandy.connectors.spark.decode`.

The value schema must be a record; each field becomes a column, as spark-avro's
``SchemaConverters.toSqlType`` maps it (so as ``from_avro`` would read it): the table, with the
Delta and Iceberg types and what happens to values that do not fit, is
:data:`chandy.connectors.type_mapping.AVRO_TYPES` (``docs/type-mapping.md``). In short: records
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

from chandy.coordinator.errors import ChandyError

_PRIMITIVES = {"boolean": "BooleanType", "int": "IntegerType", "long": "LongType", "float": "FloatType",
               "double": "DoubleType", "bytes": "BinaryType", "string": "StringType"}


class AvroValueSchemaError(ChandyError):
    """The value schema is not a record, or has a type that has no column type."""


def _spark_type(avro_type: Any, named: dict[str, Any], path: str, stack: tuple[str, ...] = ()) -> Any:
    """The Spark type of ``avro_type`` (at field ``path``, for errors)."""
    from pyspark.sql import types as T

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
            return _spark_type(kinds[0], named, path, stack)
        widened = _widened_union(kinds)
        if widened is not None:
            return getattr(T, _PRIMITIVES[widened])()
        return T.StructType([T.StructField(f"member{i}", _spark_type(k, named, f"{path}.member{i}", stack))
                             for i, k in enumerate(kinds)])
    if isinstance(avro_type, str):
        if avro_type in _PRIMITIVES:
            return getattr(T, _PRIMITIVES[avro_type])()
        if avro_type in named:
            if avro_type in stack:
                raise AvroValueSchemaError(f"field {path}: record {avro_type} contains itself (recursive types "
                                           "have no column type)")
            return _spark_type(named[avro_type], named, path, stack)
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
        return T.DecimalType(precision, scale)
    if logical == "date" and kind == "int":
        return T.DateType()
    if logical in ("timestamp-millis", "timestamp-micros") and kind == "long":
        return T.TimestampType()
    if logical in ("local-timestamp-millis", "local-timestamp-micros") and kind == "long":
        return T.TimestampNTZType()
    if logical == "time-millis" and kind == "int":
        return T.IntegerType()  # milliseconds after midnight, as from_avro
    if logical == "time-micros" and kind == "long":
        return T.LongType()  # microseconds after midnight, as from_avro
    if logical == "uuid" and kind == "string":
        return T.StringType()
    if kind == "record":
        name = avro_type.get("name", "")
        if name in stack:
            raise AvroValueSchemaError(f"field {path}: record {name} contains itself (recursive types have no column type)")
        named[name] = avro_type
        if "namespace" in avro_type:
            named[f"{avro_type['namespace']}.{name}"] = avro_type
        return T.StructType([T.StructField(f["name"], _spark_type(f["type"], named, f"{path}.{f['name']}", (*stack, name)))
                             for f in avro_type.get("fields", [])])
    if kind == "enum":
        named[avro_type.get("name", "")] = avro_type
        return T.StringType()
    if kind == "fixed":
        named[avro_type.get("name", "")] = avro_type
        return T.BinaryType()
    if kind == "array":
        return T.ArrayType(_spark_type(avro_type["items"], named, f"{path}[]", stack))
    if kind == "map":
        return T.MapType(T.StringType(), _spark_type(avro_type["values"], named, f"{path}{{}}", stack))
    if isinstance(kind, (str, list, dict)):
        return _spark_type(kind, named, path, stack)  # {"type": "string"} and the like
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


def value_struct(schema_json: str) -> Any:
    """The value schema's fields as a :class:`pyspark.sql.types.StructType` (see the module
    docstring for the mapping; decoding itself happens record by record in
    :mod:`chandy.connectors.spark.decode`).

    Raises:
        AvroValueSchemaError: not JSON, not a record, or a field of a type without a column type
            (the message names the field's path, e.g. ``address.lines[]``).
    """
    schema = _record(schema_json)
    return _spark_type(schema, {}, schema.get("name", "value"))


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


def value_fields(schema_json: str) -> list[tuple[str, str]]:
    """(field name, Spark type as ``simpleString``) of the value schema's fields.

    Raises:
        AvroValueSchemaError: see :func:`value_struct`.
    """
    return [(f.name, f.dataType.simpleString()) for f in value_struct(schema_json).fields]


def _widened_union(kinds: list[Any]) -> str | None:
    """spark-avro's two unions that widen to one type: int and long (long), float and double (double)."""
    if len(kinds) == 2 and all(isinstance(k, str) for k in kinds):
        if set(kinds) == {"int", "long"}:
            return "long"
        if set(kinds) == {"float", "double"}:
            return "double"
    return None


_PLAIN_LOGICAL = ("time-millis", "time-micros", "uuid")


def reader_schema(schema: Any) -> Any:
    """``schema`` (parsed JSON) rewritten for fastavro so that it decodes the same bytes into the
    values of the columns :func:`value_struct` gives:

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
            if len(kinds) < 2 or _widened_union(kinds) is not None:
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
    import pyarrow as pa

    promotions = {pa.int32(): (pa.int64(), pa.float32(), pa.float64()), pa.int64(): (pa.float32(), pa.float64()),
                  pa.float32(): (pa.float64(),)}
    return any(column.equals(target) for target in promotions.get(written, ()))


def avro_columns(schema: Any) -> tuple[Any, tuple[str, ...]]:
    """An Avro record schema (JSON text or parsed) as landed columns: (a ``pyarrow.Schema``, each
    field's name in the value), as spark-avro maps it (:func:`value_struct`); a field named like a
    Kafka column lands as ``value_<name>``.

    Raises:
        AvroValueSchemaError: not a record, or a field without a column type.
    """
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema

    from chandy.connectors.spark.records import ARROW_SCHEMA

    arrow = to_arrow_schema(value_struct(schema if isinstance(schema, str) else json.dumps(schema)), timezone="UTC")
    renamed = [f.with_name(f"value_{f.name}") if f.name in ARROW_SCHEMA.names else f for f in arrow]
    return pa.schema(renamed), tuple(f.name for f in arrow)


"""Avro value schemas for the pipeline: which Avro schemas become which columns. Values are
decoded in the Spark tasks with fastavro (no spark-avro jar needed), see :mod:`connectors.spark.decode`.

The value schema must be a record; each field becomes a column, as spark-avro's
``SchemaConverters.toSqlType`` maps it:

============================================  ============================================
Avro                                          Spark (Arrow)
============================================  ============================================
boolean, int, long, float, double             boolean, int, long, float, double
bytes, fixed                                  binary
string, enum, ``uuid``                        string
record                                        struct (nested, recursively)
array                                         array
map                                           map<string, ...>
union of ``null`` and one type                that type, nullable
``decimal`` (bytes or fixed)                  decimal(precision, scale)
``date``                                      date
``timestamp-millis`` / ``-micros``            timestamp (UTC, microseconds)
``local-timestamp-millis`` / ``-micros``      timestamp_ntz
============================================  ============================================

Named types (a record, enum or fixed referred to by name) resolve to their definition; a
record that contains itself, a union of two non-null types and ``time-*`` are refused
(:class:`AvroValueSchemaError`). Framing: Avro single-object encoding (checked against the
schema's fingerprint), the Confluent wire format (the schema given is used as the writer
schema), or raw Avro binary.
"""

from __future__ import annotations

import json
from typing import Any

from coordinator.errors import ChandyError

_PRIMITIVES = {"boolean": "BooleanType", "int": "IntegerType", "long": "LongType", "float": "FloatType",
               "double": "DoubleType", "bytes": "BinaryType", "string": "StringType"}


class AvroValueSchemaError(ChandyError):
    """The value schema is not a record, or has a type that has no column type."""


def _spark_type(avro_type: Any, named: dict[str, Any], path: str, stack: tuple[str, ...] = ()) -> Any:
    """The Spark type of ``avro_type`` (at field ``path``, for errors)."""
    from pyspark.sql import types as T

    if isinstance(avro_type, list):
        kinds = [t for t in avro_type if t != "null"]
        if len(kinds) == 1:
            return _spark_type(kinds[0], named, path, stack)
        raise AvroValueSchemaError(f"field {path}: a union of {len(kinds)} non-null types {kinds!r} has no column type "
                                   "(only unions of null and one type)")
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
        return T.DecimalType(int(avro_type["precision"]), int(avro_type.get("scale", 0)))
    if logical == "date" and kind == "int":
        return T.DateType()
    if logical in ("timestamp-millis", "timestamp-micros") and kind == "long":
        return T.TimestampType()
    if logical in ("local-timestamp-millis", "local-timestamp-micros") and kind == "long":
        return T.TimestampNTZType()
    if logical in ("time-millis", "time-micros"):
        raise AvroValueSchemaError(f"field {path}: {logical} has no Spark column type")
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
    :mod:`connectors.spark.decode`).

    Raises:
        AvroValueSchemaError: not JSON, not a record, or a field of a type without a column type
            (the message names the field's path, e.g. ``address.lines[]``).
    """
    schema = _record(schema_json)
    return _spark_type(schema, {}, schema.get("name", "value"))


def value_fields(schema_json: str) -> list[tuple[str, str]]:
    """(field name, Spark type as ``simpleString``) of the value schema's fields.

    Raises:
        AvroValueSchemaError: see :func:`value_struct`.
    """
    return [(f.name, f.dataType.simpleString()) for f in value_struct(schema_json).fields]


def has_uuid(schema_json: str) -> bool:
    """Whether the schema has a ``uuid`` logical type (fastavro decodes it to ``uuid.UUID``)."""
    return '"uuid"' in schema_json

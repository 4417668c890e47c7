"""Avro value schemas for the pipeline: which Avro schemas become which columns. Values are
decoded in the Spark tasks with fastavro (no spark-avro jar needed), see :mod:`connectors.spark.decode`.

Supported: a record schema whose fields are Avro primitives (null, boolean, int, long, float,
double, bytes, string) or nullable unions of one primitive. Framing: Avro single-object encoding
(checked against the schema's fingerprint), the Confluent wire format (the schema given is used
as the writer schema), or raw Avro binary.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from coordinator.errors import ChandyError

_ARROW = {"boolean": pa.bool_(), "int": pa.int32(), "long": pa.int64(), "float": pa.float32(),
          "double": pa.float64(), "bytes": pa.binary(), "string": pa.string()}
_SPARK = {"boolean": "boolean", "int": "int", "long": "long", "float": "float", "double": "double",
          "bytes": "binary", "string": "string"}


class AvroValueSchemaError(ChandyError):
    """The value schema is not a record of primitive fields."""


def _field_type(avro_type: Any) -> str:
    if isinstance(avro_type, list):
        kinds = [t for t in avro_type if t != "null"]
        if len(kinds) == 1:
            return _field_type(kinds[0])
    if isinstance(avro_type, str) and avro_type in _ARROW:
        return avro_type
    if isinstance(avro_type, dict) and avro_type.get("type") in _ARROW and "logicalType" not in avro_type:
        return avro_type["type"]
    raise AvroValueSchemaError(f"unsupported Avro field type {avro_type!r} (primitives and nullable primitives only)")


def value_fields(schema_json: str) -> list[tuple[str, str]]:
    """(field name, Avro primitive) of the value schema.

    Raises:
        AvroValueSchemaError: not JSON, not a record, or a field of an unsupported type.
    """
    try:
        schema = json.loads(schema_json)
    except json.JSONDecodeError as exc:
        raise AvroValueSchemaError(f"value schema is not JSON: {exc}") from exc
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise AvroValueSchemaError("the Avro value schema must be a record")
    return [(f["name"], _field_type(f["type"])) for f in schema["fields"]]


def value_struct(schema_json: str) -> Any:
    """The value schema's fields as a :class:`pyspark.sql.types.StructType` (decoding itself
    happens record by record in :mod:`connectors.spark.decode`).

    Raises:
        AvroValueSchemaError: see :func:`value_fields`.
    """
    from pyspark.sql import types as T

    spark_types = {"boolean": T.BooleanType(), "int": T.IntegerType(), "long": T.LongType(), "float": T.FloatType(),
                   "double": T.DoubleType(), "bytes": T.BinaryType(), "string": T.StringType()}
    return T.StructType([T.StructField(name, spark_types[kind]) for name, kind in value_fields(schema_json)])

"""Avro-encoded Kafka values, decoded in the Spark tasks with fastavro (no spark-avro jar needed).

Supported: a record schema whose fields are Avro primitives (null, boolean, int, long, float,
double, bytes, string) or nullable unions of one primitive. Framing: Avro single-object encoding
(checked against the schema's fingerprint), the Confluent wire format (the schema given is used
as the writer schema), or raw Avro binary.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
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


def decode_avro_values(df: Any, schema_json: str, framing: str, keep: list[str]) -> Any:
    """``df`` with the Avro value fields as columns (``keep`` Kafka columns first)."""
    fields = value_fields(schema_json)
    kafka_types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    ddl = ", ".join([f"`{c}` {kafka_types[c]}" for c in keep] + [f"`{n}` {_SPARK[t]}" for n, t in fields])

    def decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import io

        import fastavro

        from schemas.codec import Schema, SchemaRepository, SingleObjectCodec

        parsed = fastavro.parse_schema(json.loads(schema_json))
        codec = SingleObjectCodec(SchemaRepository([Schema.from_definition(schema_json)]))
        for batch in batches:
            rows = []
            for raw in batch.column("value").to_pylist():
                if raw is None:
                    rows.append({})
                elif framing == "single-object":
                    rows.append(codec.decode(raw).value)
                else:
                    rows.append(fastavro.schemaless_reader(io.BytesIO(raw[5:] if framing == "confluent" else raw), parsed, None))
            columns = [batch.column(c) for c in keep]
            columns += [pa.array([r.get(n) for r in rows], _ARROW[t]) for n, t in fields]
            yield pa.RecordBatch.from_arrays(columns, names=keep + [n for n, _ in fields])

    return df.mapInArrow(decode, ddl)

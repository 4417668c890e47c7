"""The Avro value schema -> column type mapping (spark-avro's SchemaConverters), and nested Avro
values decoded record by record into those Arrow types, without servers."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from connectors.spark.avro import AvroValueSchemaError, value_fields, value_struct
from connectors.spark.decode import ValueDecoder
from connectors.spark.records import to_record_batch
from tests.fixtures.nested_avro import ARROW_TYPES, SCHEMA, confluent_bytes, value


class Message:
    def __init__(self, offset: int, raw: bytes) -> None:
        self._offset, self._raw = offset, raw

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return self._raw

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)

    def headers(self) -> None:
        return None


def test_every_avro_type_has_its_arrow_type() -> None:
    arrow = to_arrow_schema(value_struct(json.dumps(SCHEMA)), timezone="UTC")
    assert {f.name: f.type for f in arrow} == ARROW_TYPES
    assert dict(value_fields(json.dumps(SCHEMA)))["attributes"] == "map<string,bigint>"


def test_nested_values_decode_to_those_types() -> None:
    arrow = to_arrow_schema(value_struct(json.dumps(SCHEMA)), timezone="UTC")
    decoder = ValueDecoder("avro", arrow, tuple(arrow.names), ("offset",), avro_schema=json.dumps(SCHEMA),
                           avro_framing="confluent", avro_schema_id=7)
    decoded, bad, _ = decoder.decode(to_record_batch([Message(i, confluent_bytes(i)) for i in range(4)]))
    assert bad is None and decoded.num_rows == 4
    rows = decoded.to_pylist()
    for i in range(4):
        want = value(i)
        assert rows[i]["customer"] == want["customer"] and rows[i]["items"] == want["items"]
        assert dict(rows[i]["attributes"]) == want["attributes"] and rows[i]["trace"] == want["trace"]
        assert rows[i]["day"] == want["day"] and rows[i]["created_ms"] == want["created_ms"]
    assert decoded.schema.field("items").type == pa.list_(pa.struct([("sku", pa.string()),
                                                                     ("price", pa.decimal128(10, 2))]))


@pytest.mark.parametrize(("field_type", "message"), [
    (["null", "string", "long"], r"field R.f: a union of 2 non-null types"),
    ({"type": "int", "logicalType": "time-millis"}, r"field R.f: time-millis has no Spark column type"),
    ({"type": "array", "items": "R"}, r"field R.f\[\]: record R contains itself"),
    ("Nope", r"field R.f: unknown Avro type 'Nope'"),
])
def test_types_without_a_column_type_are_refused_naming_the_field(field_type, message) -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "f", "type": field_type}]}
    with pytest.raises(AvroValueSchemaError, match=message):
        value_struct(json.dumps(schema))

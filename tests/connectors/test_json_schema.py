"""Issue 45: JSON Schema values (``--value-format json-schema``) without servers: the JSON Schema
to column mapping, and Confluent-framed JSON decoded on both paths (Arrow's JSON reader, value by
value) to the same rows as plain JSON, with values not framed as bad records naming the framing."""

from __future__ import annotations

import json
import struct

import pyarrow as pa
import pytest

from chandy.formats.decoder import BadRecordError, ValueDecoder
from chandy.formats.json_schema import JsonSchemaError, json_schema_columns
from chandy.formats.records import to_record_batch
from tests.fixtures.messages import FakeMessage as Message

SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
    "properties": {
        "id": {"type": "integer"}, "qty": {"type": "integer", "connect.type": "int32"},
        "price": {"type": "number"}, "ratio": {"type": "number", "connect.type": "float32"},
        "paid": {"type": "boolean"}, "note": {"oneOf": [{"type": "null"}, {"type": "string"}]},
        "day": {"type": "string", "format": "date"}, "at": {"type": "string", "format": "date-time"},
        "raw": {"type": "string", "contentEncoding": "base64"}, "tags": {"type": "array", "items": {"type": "string"}},
        "attrs": {"type": "object", "additionalProperties": {"type": "integer"}},
        "address": {"$ref": "#/definitions/Address"}, "kind": {"enum": ["a", "b"]}, "offset": {"type": "string"},
    },
    "definitions": {"Address": {"type": "object", "properties": {"city": {"type": "string"},
                                                                  "zip": {"type": ["null", "string"]}}}},
}


def test_json_schema_types_map_as_connect_and_the_spec_define() -> None:
    columns, names = json_schema_columns(json.dumps(SCHEMA))
    assert names == tuple(SCHEMA["properties"])
    assert [(f.name, str(f.type)) for f in columns] == [
        ("id", "int64"), ("qty", "int32"), ("price", "double"), ("ratio", "float"), ("paid", "bool"),
        ("note", "string"), ("day", "date32[day]"), ("at", "timestamp[us, tz=UTC]"), ("raw", "binary"),
        ("tags", "list<item: string>"), ("attrs", "map<string, int64>"),
        ("address", "struct<city: string, zip: string>"), ("kind", "string"), ("value_offset", "string")]
    for bad, why in (({"type": "array"}, "must be an object with properties"),
                     ({"type": "object", "properties": {"x": {"type": ["string", "integer"]}}}, "property value.x: type"),
                     ({"type": "object", "properties": {"x": {"$ref": "http://x/y.json"}}}, "is not in this schema"),
                     ({"type": "object", "properties": {"x": {"$ref": "#/definitions/X"}},
                       "definitions": {"X": {"type": "object", "properties": {"y": {"$ref": "#/definitions/X"}}}}},
                      "refers to itself"),
                     ({"type": "object", "properties": {"x": {}}}, "property value.x: type")):
        with pytest.raises(JsonSchemaError, match=why):
            json_schema_columns(bad)


def _framed(schema_id: int, value: dict) -> bytes:
    return b"\x00" + struct.pack(">I", schema_id) + json.dumps(value).encode()


def test_framed_json_decodes_as_plain_json_on_both_paths_and_unframed_values_are_bad() -> None:
    schema = {"type": "object", "properties": {"id": {"type": "integer"}, "name": {"type": "string"},
                                               "at": {"type": "string", "format": "date-time"}}}
    columns, names = json_schema_columns(schema)
    values = [{"id": i, "name": f"n{i}", "at": f"2026-11-27T10:00:0{i}Z"} for i in range(5)]
    plain = ValueDecoder("json", columns, names, ("offset",))
    framed = ValueDecoder("json", columns, names, ("offset",), json_framing="confluent")
    expected, _, _ = plain.decode(to_record_batch([Message(i, json.dumps(v).encode()) for i, v in enumerate(values)]))
    batch = to_record_batch([Message(i, _framed(7, v)) for i, v in enumerate(values)])
    for vectorized in (True, False):
        decoded, bad, _ = framed.decode(batch, vectorized=vectorized)
        assert bad is None and decoded.equals(expected), vectorized
    assert decoded.column("at").to_pylist()[0].isoformat() == "2026-11-27T10:00:00+00:00"
    mixed = to_record_batch([Message(0, _framed(7, values[0])), Message(1, json.dumps(values[1]).encode())])
    lenient = ValueDecoder("json", columns, names, ("offset",), json_framing="confluent", errors_tolerance="all")
    decoded, bad, _ = lenient.decode(mixed)
    assert decoded.column("id").to_pylist() == [0]
    assert bad is not None and bad.column("error_class").to_pylist() == ["WireFormatError"]
    assert "magic byte 7b, expected 00" in bad.column("error_message")[0].as_py()
    with pytest.raises(BadRecordError, match=r"offset 1: WireFormatError: not the Confluent wire format"):
        framed.decode(mixed)
    assert pa.types.is_timestamp(decoded.schema.field("at").type)

"""The Avro value schema -> column type mapping (spark-avro's SchemaConverters), and nested Avro
values decoded record by record into those Arrow types, without servers."""

from __future__ import annotations

import dataclasses
import json

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from chandy.connectors.spark.ddl import value_fields, value_struct
from chandy.formats.avro import AvroValueSchemaError
from chandy.formats.decoder import ValueDecoder
from chandy.formats.records import to_record_batch
from tests.fixtures.messages import FakeMessage as Message
from tests.fixtures.nested_avro import ARROW_TYPES, SCHEMA, confluent_bytes, value


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
    (["null"], r"field R.f: a union of null alone has no column type"),
    ({"type": "bytes", "logicalType": "decimal", "precision": 39, "scale": 2}, r"field R.f: decimal\(39, 2\) has no column type"),
    ({"type": "array", "items": "R"}, r"field R.f\[\]: record R contains itself"),
    ("Nope", r"field R.f: unknown Avro type 'Nope'"),
    # the Avro spec: one branch per type in a union (a date is an int): fastavro would write an
    # int to the date branch, and reading it back would fail record by record
    ([{"type": "int", "logicalType": "date"}, "int"], r"field R.f: the union has two branches of type int"),
    (["null", "string", "null"], r"field R.f: the union has two branches of type null"),
])
def test_types_without_a_column_type_are_refused_naming_the_field(field_type, message) -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "f", "type": field_type}]}
    with pytest.raises(AvroValueSchemaError, match=message):
        value_struct(json.dumps(schema))


def test_each_record_is_read_with_its_writer_schema_from_the_registry() -> None:
    """Confluent framing with a Schema Registry (confluent-kafka's in-process ``mock://`` one):
    records written with an older schema (no email) take the reader's default, records written
    with a newer one (an extra age) lose the field, an unknown ID is a bad record."""
    import io
    import struct

    import fastavro
    from confluent_kafka.schema_registry import Schema

    from chandy.formats.registry import registry_client

    settings = {"url": "mock://chandy-unit"}
    v1 = {"type": "record", "name": "User", "fields": [{"name": "id", "type": "long"}]}
    reader = {**v1, "fields": [*v1["fields"], {"name": "email", "type": ["null", "string"], "default": None}]}
    v3 = {**v1, "fields": [*reader["fields"], {"name": "age", "type": "int"}]}
    client = registry_client(settings)
    ids = [client.register_schema(f"users-value-{i}", Schema(json.dumps(s), "AVRO")) for i, s in enumerate((v1, reader, v3))]

    def framed(schema_id: int, schema: dict, value: dict) -> bytes:
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema), value)
        return b"\x00" + struct.pack(">I", schema_id) + buffer.getvalue()

    arrow = to_arrow_schema(value_struct(json.dumps(reader)), timezone="UTC")
    decoder = ValueDecoder("avro", arrow, tuple(arrow.names), ("offset",), avro_schema=json.dumps(reader),
                           avro_framing="confluent", schema_registry=tuple(sorted(settings.items())),
                           errors_tolerance="all")
    batch = to_record_batch([Message(0, framed(ids[0], v1, {"id": 1})),
                             Message(1, framed(ids[1], reader, {"id": 2, "email": "b@x"})),
                             Message(2, framed(ids[2], v3, {"id": 3, "email": "c@x", "age": 30})),
                             Message(3, framed(999, v1, {"id": 4}))])
    decoded, bad, _ = decoder.decode(batch)
    assert decoded.to_pylist() == [{"offset": 0, "id": 1, "email": None}, {"offset": 1, "id": 2, "email": "b@x"},
                                   {"offset": 2, "id": 3, "email": "c@x"}]
    assert bad is not None and bad.column("error_class").to_pylist() == ["UnknownSchemaId"]


def test_read_as_written_new_fields_become_typed_columns_and_a_narrowing_fails() -> None:
    """Issue 45: with the registry as the source of the schema (``as_written``), each record is
    read with its own writer schema: a field a producer adds becomes a column typed as the
    writer schema says (an Avro int is an int32 column, not an inferred int64), a field the writer
    lacks is null, int widened to long in a writer reads into a long column (Avro's promotion), and
    a long column written as int by a newer schema is fine while a long written where the column is
    int fails the micro-batch naming the field, both types, both schema IDs and the offsets."""
    import io
    import struct

    import fastavro
    from confluent_kafka.schema_registry import Schema

    from chandy.formats.avro import avro_columns
    from chandy.formats.evolution import SchemaChangeError
    from chandy.formats.registry import registry_client

    settings = {"url": "mock://chandy-as-written"}
    v1 = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}, {"name": "qty", "type": "int"},
                                                        {"name": "note", "type": ["null", "string"], "default": None}]}
    v2 = {**v1, "fields": [v1["fields"][0], v1["fields"][1], {"name": "price", "type": "float", "default": 0.0}]}
    v3 = {**v1, "fields": [v1["fields"][0], {"name": "qty", "type": "long"}]}
    client = registry_client(settings)
    ids = [client.register_schema(f"orders-value-{i}", Schema(json.dumps(s), "AVRO")) for i, s in enumerate((v1, v2, v3))]

    def framed(schema_id: int, schema: dict, value: dict) -> bytes:
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema), value)
        return b"\x00" + struct.pack(">I", schema_id) + buffer.getvalue()

    columns, names = avro_columns(v1)
    decoder = ValueDecoder("avro", columns, names, ("offset",), avro_schema=json.dumps(v1), avro_framing="confluent",
                           schema_registry=tuple(sorted(settings.items())), unknown_fields="add", as_written=True,
                           columns_schema_id=ids[0])
    decoded, bad, _ = decoder.decode(to_record_batch([Message(0, framed(ids[0], v1, {"id": 1, "qty": 2, "note": "a"})),
                                                      Message(1, framed(ids[1], v2, {"id": 2, "qty": 3, "price": 1.5}))]))
    assert bad is None
    assert decoded.schema.field("price").type == pa.float32() and decoded.schema.field("qty").type == pa.int32()
    assert decoded.to_pylist() == [{"offset": 0, "id": 1, "qty": 2, "note": "a", "price": None},
                                   {"offset": 1, "id": 2, "qty": 3, "note": None, "price": 1.5}]
    with pytest.raises(SchemaChangeError, match=rf"offset 2: field qty changed type: its column is int32 \(schema ID "
                                                rf"{ids[0]}\) but schema ID {ids[2]} writes int64.*lands nothing of it"):
        decoder.decode(to_record_batch([Message(2, framed(ids[2], v3, {"id": 3, "qty": 2**40}))]))
    # the other way round: a long column reads an older int writer (Avro's int -> long promotion)
    wide_columns, wide_names = avro_columns(v3)
    wide = dataclasses.replace(decoder, columns=wide_columns, source_names=wide_names, columns_schema_id=ids[2])
    decoded, bad, _ = wide.decode(to_record_batch([Message(3, framed(ids[0], v1, {"id": 4, "qty": 7, "note": None})),
                                                   Message(4, framed(ids[2], v3, {"id": 5, "qty": 2**40}))]))
    assert bad is None and decoded.schema.field("qty").type == pa.int64()
    assert decoded.column("qty").to_pylist() == [7, 2**40]


def test_a_schema_registry_needs_confluent_framed_avro() -> None:
    from chandy.connectors.spark.options import PipelineError, PipelineOptions

    schema = json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]})
    with pytest.raises(PipelineError, match="needs --value-format avro --avro-framing confluent"):
        PipelineOptions(table_uri="t", bootstrap_servers="x:1", topics=("a",), value_format="avro", value_schema=schema,
                        schema_registry={"url": "http://registry:8081"})
    options = PipelineOptions(table_uri="t", bootstrap_servers="x:1", topics=("a",), value_format="avro",
                              value_schema=schema, avro_framing="confluent", schema_registry={"url": "http://r:8081"})
    assert dict(options.schema_registry) == {"url": "http://r:8081"}

"""``--key-format`` (issue 45's "keys the same way"), at the decoder, without servers: keys as
UTF-8 text, or their fields as ``key_<field>`` columns (JSON, Avro as written from a registry:
confluent-kafka's in-process ``mock://`` one); a key that does not decode makes its record bad,
named, and the other records' keys stay on their rows."""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
import pytest

from chandy.formats.avro import avro_columns
from chandy.formats.decoder import KAFKA_COLUMNS, BadRecordError, ValueDecoder
from chandy.formats.records import ARROW_SCHEMA
from tests.fixtures.avro_values import confluent_framed


def _batch(records: list[tuple[bytes | None, bytes | None]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"key": k, "value": v, "topic": "t", "partition": 0, "offset": i, "timestamp": None, "timestamp_type": 0,
          "headers": []} for i, (k, v) in enumerate(records)], schema=ARROW_SCHEMA)


def test_string_keys_of_raw_values_land_as_text_and_a_key_not_utf8_is_a_bad_record() -> None:
    decoder = ValueDecoder("raw", pa.schema([]), (), KAFKA_COLUMNS, key_format="string", errors_tolerance="all")
    assert decoder.output_schema.field("key").type == pa.string()
    decoded, bad, _ = decoder.decode(_batch([(b"order-1", b"a"), (None, b"b"), (b"\xff\xfe", b"c"), ("é".encode(), b"d")]))
    assert decoded.column("key").to_pylist() == ["order-1", None, "é"]
    assert decoded.column("value").to_pylist() == [b"a", b"b", b"d"] and decoded.column("offset").to_pylist() == [0, 1, 3]
    assert bad is not None and bad.column("offset").to_pylist() == [2]
    assert bad.column("error_class").to_pylist() == ["KeyError"] and "key: not UTF-8" in bad.column("error_message")[0].as_py()
    strict = ValueDecoder("raw", pa.schema([]), (), KAFKA_COLUMNS, key_format="string")
    with pytest.raises(BadRecordError, match="topic t partition 0 offset 0: KeyError: key: not UTF-8"):
        strict.decode(_batch([(b"\xff", b"x")]))


def test_json_keys_become_key_columns_beside_the_values_and_bad_keys_or_values_leave_the_others_in_place() -> None:
    columns = pa.schema([("amount", pa.float64())])
    decoder = ValueDecoder("json", columns, ("amount",), ("offset",), key_format="json", unknown_fields="add",
                           errors_tolerance="all")
    decoded, bad, _ = decoder.decode(_batch([
        (b'{"id": 1, "region": "eu"}', b'{"amount": 1.5}'),
        (b'{"id": 2, "region": "us"}', b'not json'),          # a bad value
        (b'not a key', b'{"amount": 3.0}'),                    # a bad key
        (None, b'{"amount": 4.0}'),                            # no key
        (b'{"id": 5, "region": "eu"}', b'{"amount": 5.0}')]))
    assert decoded.schema.names == ["offset", "key_id", "key_region", "amount"]
    assert decoded.to_pylist() == [{"offset": 0, "key_id": 1, "key_region": "eu", "amount": 1.5},
                                   {"offset": 3, "key_id": None, "key_region": None, "amount": 4.0},
                                   {"offset": 4, "key_id": 5, "key_region": "eu", "amount": 5.0}]
    assert bad is not None and sorted(zip(bad.column("offset").to_pylist(), bad.column("error_class").to_pylist(),
                                          strict=True)) == [(1, "JsonParseError"), (2, "KeyError")]


def test_avro_keys_are_read_with_their_writer_schemas_from_the_registry() -> None:
    from confluent_kafka.schema_registry import Schema

    from chandy.formats.registry import registry_client

    settings = {"url": "mock://chandy-keys"}
    key_v1 = {"type": "record", "name": "OrderKey", "fields": [{"name": "id", "type": "long"}]}
    key_v2 = {**key_v1, "fields": [*key_v1["fields"], {"name": "shard", "type": "int", "default": 0}]}
    value = {"type": "record", "name": "Order", "fields": [{"name": "amount", "type": "double"}]}
    client = registry_client(settings)
    ids = [client.register_schema(f"orders-{i}", Schema(json.dumps(s), "AVRO")) for i, s in enumerate((key_v1, key_v2, value))]

    columns, names = avro_columns(value)
    decoder = ValueDecoder("avro", columns, names, ("offset",), avro_framing="confluent", as_written=True,
                           schema_registry=tuple(sorted(settings.items())), unknown_fields="add", key_format="avro",
                           key_as_written=True, errors_tolerance="all")
    decoded, bad, _ = decoder.decode(_batch([(confluent_framed(ids[0], key_v1, {"id": 7}), confluent_framed(ids[2], value, {"amount": 1.0})),
                                             (confluent_framed(ids[1], key_v2, {"id": 8, "shard": 3}),
                                              confluent_framed(ids[2], value, {"amount": 2.0})),
                                             (b"\x01bad", confluent_framed(ids[2], value, {"amount": 3.0}))]))
    assert decoded.to_pylist() == [{"offset": 0, "key_id": 7, "key_shard": None, "amount": 1.0},
                                   {"offset": 1, "key_id": 8, "key_shard": 3, "amount": 2.0}]
    assert decoded.schema.field("key_shard").type == pa.int32()  # typed as the key's writer schema says
    assert bad is not None and bad.column("offset").to_pylist() == [2]
    assert "key: WireFormatError: not the Confluent wire format" in bad.column("error_message")[0].as_py()


def _order_key_class() -> Any:
    """``chandy.test.OrderKey`` (proto3): id int64, region string."""
    from google.protobuf.descriptor_pb2 import FieldDescriptorProto as F

    from tests.fixtures.protobuf_messages import message_class

    return message_class("chandy.test", "OrderKey", [("id", F.TYPE_INT64), ("region", F.TYPE_STRING)])


@pytest.fixture(params=["mock", "apicurio"])
def registry_url(request: pytest.FixtureRequest) -> str:
    """confluent-kafka's in-process ``mock://`` registry, then the real one the tests start
    (Apicurio Registry's Confluent-compatible API: ``schema_registry_url``)."""
    if request.param == "mock":
        return "mock://chandy-keys-protobuf-json"
    return str(request.getfixturevalue("schema_registry_url"))


def test_protobuf_and_json_schema_keys_become_key_columns_read_through_the_registry(registry_url: str) -> None:
    """``--key-format protobuf`` and ``json-schema``: keys written by confluent-kafka's own
    ``ProtobufSerializer`` and ``JSONSerializer`` (Confluent framing, schemas registered under
    ``<topic>-key``, in the in-process registry and in a real one) land as ``key_<field>`` columns
    beside raw values, each as protobuf's runtime or the JSON reads it; a key not so framed is a
    bad record named ``key: ...``, the others keep their rows."""
    import uuid

    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from chandy.formats.registry import registry_client

    settings = {"url": registry_url}
    registry = registry_client(settings)
    context = SerializationContext(f"t{uuid.uuid4().hex[:8]}", MessageField.KEY)
    order_key = _order_key_class()
    protobuf_key = ProtobufSerializer(order_key, registry, {"auto.register.schemas": True,
                                                            "use.deprecated.format": False})
    keys = [protobuf_key(order_key(id=7, region="eu"), context), protobuf_key(order_key(id=8), context), b"\x01bad"]
    decoder = ValueDecoder("raw", pa.schema([]), (), ("offset", "value"), key_format="protobuf", key_as_written=True,
                           schema_registry=tuple(sorted(settings.items())), errors_tolerance="all")
    decoded, bad, _ = decoder.decode(_batch([(k, f"v{i}".encode()) for i, k in enumerate(keys)]))
    assert decoded.to_pylist() == [{"offset": 0, "key_id": 7, "key_region": "eu", "value": b"v0"},
                                   {"offset": 1, "key_id": 8, "key_region": "", "value": b"v1"}]
    assert decoded.schema.field("key_id").type == pa.int64()
    assert bad is not None and bad.column("offset").to_pylist() == [2]
    assert bad.column("error_message")[0].as_py().startswith("key: ")

    key_schema = {"$schema": "http://json-schema.org/draft-07/schema#", "title": "OrderKey", "type": "object",
                  "properties": {"id": {"type": "integer"}, "region": {"type": "string"}}, "required": ["id"]}
    json_key = JSONSerializer(json.dumps(key_schema), registry, conf={"auto.register.schemas": True})
    keys = [json_key({"id": 9, "region": "us"}, context), json_key({"id": 10}, context), b'{"id": 11}']
    decoder = ValueDecoder("raw", pa.schema([]), (), ("offset", "value"), key_format="json-schema",
                           schema_registry=tuple(sorted(settings.items())), errors_tolerance="all")
    decoded, bad, _ = decoder.decode(_batch([(k, f"v{i}".encode()) for i, k in enumerate(keys)]))
    assert decoded.to_pylist() == [{"offset": 0, "key_id": 9, "key_region": "us", "value": b"v0"},
                                   {"offset": 1, "key_id": 10, "key_region": None, "value": b"v1"}]
    assert bad is not None and bad.column("offset").to_pylist() == [2]  # plain JSON: not Confluent-framed
    assert bad.column("error_message")[0].as_py().startswith("key: ")


def test_protobuf_and_json_schema_keys_need_a_registry() -> None:
    from chandy.connectors.spark.options import PipelineError, PipelineOptions

    for key_format in ("protobuf", "json-schema"):
        with pytest.raises(PipelineError, match="--key-format protobuf and json-schema need --schema-registry-url"):
            PipelineOptions(table_uri="t", bootstrap_servers="k:1", topics=("a",), key_format=key_format)
        options = PipelineOptions(table_uri="t", bootstrap_servers="k:1", topics=("a",), key_format=key_format,
                                  schema_registry={"url": "http://registry:8081"})
        assert options.key_format == key_format

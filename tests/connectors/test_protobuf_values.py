"""Issue 45: Protobuf values read with each record's writer message from a real Schema Registry
(Apicurio's Confluent API, :mod:`tests.fixtures.schema_registry`) and produced by confluent-kafka's
own ``ProtobufSerializer``, decoded without Spark and compared field by field with protobuf's
runtime: the column mapping of every kind of field, presence, a writer that adds a field, a
value that is not framed."""

from __future__ import annotations

import uuid

import pyarrow as pa
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from chandy.formats.decoder import ValueDecoder
from chandy.formats.framing import split_protobuf as split_framing
from chandy.formats.protobuf import arrow_columns, message_descriptor
from chandy.formats.records import to_record_batch
from tests.fixtures.messages import FakeMessage as Message
from tests.fixtures.protobuf_messages import expected_row, order, order_class


def test_protobuf_values_land_as_the_runtime_reads_them_and_a_new_field_adds_a_column(schema_registry_url) -> None:
    registry = SchemaRegistryClient({"url": schema_registry_url})
    topic = f"pb{uuid.uuid4().hex[:8]}"
    context = SerializationContext(topic, MessageField.VALUE)
    v1, v2 = order_class(1), order_class(2)
    serialize_v1 = ProtobufSerializer(v1, registry, {"auto.register.schemas": True})
    serialize_v2 = ProtobufSerializer(v2, registry, {"auto.register.schemas": True,
                                                     "subject.name.strategy": lambda c, r: f"{topic}-v2"})
    messages = [order(v1, i) for i in range(12)] + [order(v2, i) for i in range(12, 24)]
    raw = [(serialize_v1 if m.DESCRIPTOR is v1.DESCRIPTOR else serialize_v2)(m, context) for m in messages]
    latest = registry.get_latest_version(f"{topic}-value")
    assert split_framing(raw[0])[:2] == (latest.schema_id, [0])
    columns, names = arrow_columns(message_descriptor(registry, latest.schema_id, [0]))
    assert [(f.name, str(f.type)) for f in columns] == [
        ("id", "int64"), ("qty", "int32"), ("note", "string"), ("status", "string"), ("tags", "list<item: string>"),
        ("attrs", "map<string, int64>"), ("at", "timestamp[us, tz=UTC]"), ("big", "decimal128(20, 0)"),
        ("address", "struct<city: string, zip: int32>"), ("count", "int64")]
    decoder = ValueDecoder("protobuf", columns, names, ("offset",), schema_registry=(("url", schema_registry_url),),
                           unknown_fields="add", as_written=True, columns_schema_id=latest.schema_id,
                           errors_tolerance="all")
    batch = to_record_batch([Message(i, r) for i, r in enumerate(raw)] + [Message(24, b"\x01not framed")])
    decoded, bad, _ = decoder.decode(batch)
    assert decoded.schema.field("price").type == pa.float64()  # V2's field, typed as its writer says
    rows = decoded.to_pylist()
    assert len(rows) == 24
    for row, message in zip(rows, messages, strict=True):
        expected = {"price": None, **expected_row(message)}
        row["attrs"] = sorted(row["attrs"])
        assert {k: row[k] for k in expected} == expected, row["offset"]
    assert bad is not None and bad.column("error_class").to_pylist() == ["WireFormatError"]
    assert "magic byte 01" in bad.column("error_message")[0].as_py()


def test_the_batch_path_reads_protobuf_as_record_by_record_does() -> None:
    """The column-by-column batch path (:mod:`chandy.formats.protobuf_batch`) lands what
    record by record lands, for a batch of two writer versions (every kind of field: enums, maps,
    Timestamps, uint64, nested messages, presence), and hands a batch with an unframed value or a
    writer's new field to record by record (confluent-kafka's in-process registry)."""
    import dataclasses

    from chandy.formats.protobuf_batch import decode_protobuf_batch
    from chandy.formats.registry import registry_client

    settings = {"url": "mock://chandy-protobuf-batch"}
    registry = registry_client(settings)
    topic = "pbbatch"
    context = SerializationContext(topic, MessageField.VALUE)
    v1, v2 = order_class(1), order_class(2)
    serialize_v1 = ProtobufSerializer(v1, registry, {"auto.register.schemas": True, "use.deprecated.format": False})
    serialize_v2 = ProtobufSerializer(v2, registry, {"auto.register.schemas": True, "use.deprecated.format": False,
                                                     "subject.name.strategy": lambda c, r: f"{topic}-v2"})
    raw = [serialize_v1(order(v1, i), context) for i in range(10)] + [serialize_v2(order(v2, i), context)
                                                                      for i in range(10, 20)]
    v2_id = split_framing(raw[-1])[0]
    columns, names = arrow_columns(message_descriptor(registry, v2_id, [0]))
    decoder = ValueDecoder("protobuf", columns, names, ("offset",), schema_registry=tuple(sorted(settings.items())),
                           unknown_fields="add", as_written=True, columns_schema_id=v2_id, errors_tolerance="all")
    batch = to_record_batch([Message(i, r) for i, r in enumerate(raw)])
    assert decode_protobuf_batch(batch.column("value"), decoder) is not None
    fast, slow = decoder.decode(batch), decoder.decode(batch, vectorized=False)
    assert fast[0].schema == slow[0].schema and fast[0].to_pylist() == slow[0].to_pylist() and fast[1] is slow[1] is None
    assert [r["price"] for r in fast[0].to_pylist()][9:11] == [None, order(v2, 10).price]
    unframed = to_record_batch([Message(i, r) for i, r in enumerate(raw)] + [Message(20, b"\x01x")])
    assert decode_protobuf_batch(unframed.column("value"), decoder) is None
    narrow = dataclasses.replace(decoder, columns=pa.schema(list(columns)[:-1]), source_names=names[:-1])
    assert decode_protobuf_batch(batch.column("value"), narrow) is None  # V2's price is new to these columns
    assert narrow.decode(batch)[0].to_pylist() == slow[0].to_pylist()


def test_a_schema_the_registry_answers_as_proto_text_is_compiled_and_read(schema_registry_url) -> None:
    """Apicurio 2.x answers ``.proto`` text for a schema registered as text (as Java and Go
    clients register them), whatever ``format=serialized`` asks: Chandy compiles it with protoc
    (grpcio-tools), its Timestamp import included, and reads the values as protobuf's runtime
    does; text that does not compile is one ProtobufSchemaError naming the schema ID."""
    import datetime

    import pytest
    from confluent_kafka.schema_registry import Schema
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

    from chandy.formats.protobuf import ProtobufSchemaError

    registry = SchemaRegistryClient({"url": schema_registry_url})
    text = ('syntax = "proto3";\npackage chandy.text;\nimport "google/protobuf/timestamp.proto";\n'
            "message Reading {\n  int64 id = 1;\n  string station = 2;\n  google.protobuf.Timestamp at = 3;\n"
            "  optional double celsius = 4;\n}\n")
    schema_id = registry.register_schema(f"pbtext{uuid.uuid4().hex[:6]}-value", Schema(text, "PROTOBUF"))
    assert "message Reading" in registry.get_schema(schema_id, fmt="serialized").schema_str  # text, not base64
    descriptor = message_descriptor(registry, schema_id, [0])
    assert [f.name for f in descriptor.fields] == ["id", "station", "at", "celsius"]
    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="reading.proto", package="chandy.text", syntax="proto3",
                                               dependency=["google/protobuf/timestamp.proto"])
    message = proto.message_type.add(name="Reading")
    message.field.add(name="id", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    message.field.add(name="station", number=2, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    message.field.add(name="at", number=3, type=f.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp",
                      label=f.LABEL_OPTIONAL)
    message.field.add(name="celsius", number=4, type=f.TYPE_DOUBLE, label=f.LABEL_OPTIONAL, proto3_optional=True,
                      oneof_index=0)
    message.oneof_decl.add(name="_celsius")
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.AddSerializedFile(proto.SerializeToString())
    reading = message_factory.GetMessageClass(pool.FindMessageTypeByName("chandy.text.Reading"))
    at = datetime.datetime(2026, 11, 27, 12, 0, tzinfo=datetime.UTC)
    written = [reading(id=1, station="Oslo", celsius=-3.5), reading(id=2, station="Bergen")]
    written[0].at.FromDatetime(at)
    columns, names = arrow_columns(descriptor)
    decoder = ValueDecoder("protobuf", columns, names, ("offset",), schema_registry=(("url", schema_registry_url),),
                           as_written=True, columns_schema_id=schema_id)
    batch = to_record_batch([Message(i, b"\x00" + schema_id.to_bytes(4, "big") + b"\x00" + m.SerializeToString())
                             for i, m in enumerate(written)])
    assert decoder.decode(batch)[0].to_pylist() == [
        {"offset": 0, "id": 1, "station": "Oslo", "at": at, "celsius": -3.5},
        {"offset": 1, "id": 2, "station": "Bergen", "at": None, "celsius": None}]
    from chandy.formats.registry import registry_client

    mock = registry_client({"url": "mock://chandy-proto-text"})  # a registry that stores what it is given
    broken = mock.register_schema("broken-value", Schema('syntax = "proto3";\nmessage Broken {\n  int64 id = ;\n}\n',
                                                         "PROTOBUF"))
    with pytest.raises(ProtobufSchemaError, match=rf"schema ID {broken}: the registry returned .proto text that protoc "
                                                  r"does not compile"):
        message_descriptor(mock, broken, [0])

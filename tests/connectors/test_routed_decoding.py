"""Every subject its table (issue 45), without servers: routed records read as written from a
registry (confluent-kafka's in-process ``mock://`` one) are split by table before decoding, by
topic or by their writer schema's record name, and each part is decoded with its own table's
columns, so record types that share a field name with different types land side by side."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pyarrow as pa
import pytest

from chandy.connectors.lake.routing import Router
from chandy.connectors.spark.task.route import (
    ROUTE_KEY,
    by_destination,
    decode_routed,
    routes_before_decoding,
    value_columns,
)
from chandy.formats.decoder import BadRecordError, ValueDecoder
from chandy.formats.records import ARROW_SCHEMA
from chandy.formats.writer_schemas import record_names
from tests.fixtures.avro_values import confluent_framed

ORDER = {"type": "record", "name": "Order", "namespace": "com.acme", "fields": [
    {"name": "id", "type": "long"}, {"name": "total", "type": "double"}]}
CUSTOMER = {"type": "record", "name": "Customer", "namespace": "com.acme", "fields": [
    {"name": "id", "type": "string"}, {"name": "email", "type": "string"}]}
OTHER = {"type": "record", "name": "Audit", "namespace": "org.else", "fields": [{"name": "who", "type": "string"}]}


@dataclasses.dataclass
class _Task:
    router: Router | None
    decoder: ValueDecoder | None
    changes: bool = False
    unrouted: str = "table"


class _Dead:
    def __init__(self) -> None:
        self.bad: list[pa.RecordBatch] = []
        self.skipped = 0

    def add(self, batch: pa.RecordBatch) -> None:
        self.bad.append(batch)

    def add_skipped(self, count: int) -> None:
        self.skipped += count


def _setup(name: str) -> tuple[dict[str, str], dict[str, int]]:
    from confluent_kafka.schema_registry import Schema

    from chandy.formats.registry import registry_client

    settings = {"url": f"mock://{name}"}
    client = registry_client(settings)
    ids = {s["name"]: client.register_schema(f"{name}-{s['name']}", Schema(json.dumps(s), "AVRO"))
           for s in (ORDER, CUSTOMER, OTHER)}
    return settings, ids



def _batch(values: list[tuple[str, bytes | None]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"key": None, "value": v, "topic": t, "partition": 0, "offset": i, "timestamp": None, "timestamp_type": 0,
          "headers": []} for i, (t, v) in enumerate(values)], schema=ARROW_SCHEMA)


def _decoder(settings: dict[str, str], **kwargs: Any) -> ValueDecoder:
    return ValueDecoder("avro", pa.schema([]), (), ("topic", "offset"), avro_framing="confluent",
                        schema_registry=tuple(sorted(settings.items())), unknown_fields="add", as_written=True,
                        **kwargs)


def test_record_types_sharing_a_field_name_decode_into_their_own_tables(tmp_path) -> None:
    settings, ids = _setup("routed-by-name")
    router = Router.parse([r"com\.acme\.(\w+)=" + str(tmp_path / "$1")], by="record-name").resolved()
    task = _Task(router, _decoder(settings))
    assert routes_before_decoding(task)
    raws = [("t", confluent_framed(ids["Order"], ORDER, {"id": 1, "total": 2.5})),
            ("t", confluent_framed(ids["Customer"], CUSTOMER, {"id": "c-1", "email": "a@x"})),
            ("t", confluent_framed(ids["Audit"], OTHER, {"who": "root"})),
            ("t", confluent_framed(ids["Order"], ORDER, {"id": 2, "total": 3.5}))]
    assert record_names(_batch(raws).column("value"), task.decoder) == [
        "com.acme.Order", "com.acme.Customer", "org.else.Audit", "com.acme.Order"]
    # an ID the registry does not know, and a value not framed: unrouted (a registry that is down raises)
    assert record_names(_batch([("t", confluent_framed(99_999, ORDER, {"id": 1, "total": 1.0})), ("t", b"{}")]
                               ).column("value"), task.decoder) == [None, None]
    dead = _Dead()
    decoded = list(decode_routed(task, iter([_batch(raws)]), lambda uri: None, dead))
    groups = dict(by_destination(decoded))
    orders, customers = groups[f"file://{tmp_path}/Order"], groups[f"file://{tmp_path}/Customer"]
    assert pa.Table.from_batches(orders).to_pylist() == [{"topic": "t", "offset": 0, "id": 1, "total": 2.5},
                                                         {"topic": "t", "offset": 3, "id": 2, "total": 3.5}]
    assert customers[0].schema.field("id").type == pa.string() and orders[0].schema.field("id").type == pa.int64()
    assert customers[0].schema.metadata is None  # the route is dropped before writing
    assert pa.Table.from_batches(groups[None]).to_pylist() == [{"topic": "t", "offset": 2, "who": "root"}]
    assert dead.bad == []


def test_by_topic_a_routed_tables_columns_come_from_that_table() -> None:
    """An existing routed table's columns are the decoder's (the batch path reads into them);
    unrouted records are dead letters with --unrouted dead-letter."""
    settings, ids = _setup("routed-by-topic")
    router = Router.parse(["db\\.inv\\.orders=lake/orders"]).resolved()
    task = _Task(router, _decoder(settings, errors_tolerance="all"), unrouted="dead-letter")
    raws = [("db.inv.orders", confluent_framed(ids["Order"], ORDER, {"id": 7, "total": 1.0})),
            ("db.inv.customers", confluent_framed(ids["Customer"], CUSTOMER, {"id": "c", "email": "e"}))]
    orders_fields = {"id": "long", "total": "double", "note": "string", "offset": "long"}
    dead = _Dead()
    decoded = list(decode_routed(task, iter([_batch(raws)]), lambda uri: orders_fields, dead))
    assert len(decoded) == 1 and decoded[0].schema.metadata == {ROUTE_KEY: router.destination("db.inv.orders").encode()}
    assert decoded[0].to_pylist() == [{"topic": "db.inv.orders", "offset": 0, "id": 7, "total": 1.0, "note": None}]
    assert [b.column("error_class").to_pylist() for b in dead.bad] == [["Unrouted"]]
    with pytest.raises(BadRecordError, match="offset 1: Unrouted: no --route rule matches its topic"):
        list(decode_routed(dataclasses.replace(task, decoder=_decoder(settings)), iter([_batch(raws)]),
                           lambda uri: orders_fields, _Dead()))


def test_value_columns_of_a_table_leave_out_kafkas_and_name_renamed_fields() -> None:
    columns, names = value_columns({"key": "binary", "id": "long", "value_offset": "long", "when": "timestamp"})
    assert columns.names == ["id", "value_offset", "when"] and names == ("id", "offset", "when")
    assert columns.field("when").type == pa.timestamp("us", "UTC")
    assert value_columns(None) == (pa.schema([]), ())


def _customer_class() -> Any:
    """``chandy.test.Customer`` (proto3): id string, email string; its ``id`` is a string where
    ``chandy.test.Order``'s is an int64."""
    from google.protobuf.descriptor_pb2 import FieldDescriptorProto as F

    from tests.fixtures.protobuf_messages import message_class

    return message_class("chandy.test", "Customer", [("id", F.TYPE_STRING), ("email", F.TYPE_STRING)])


def test_protobuf_message_types_route_by_their_full_names_into_their_own_tables(tmp_path) -> None:
    """Protobuf as Avro: one topic carrying two message types (confluent-kafka's
    ``ProtobufSerializer``, TopicRecordNameStrategy-like subjects), routed by the writer message's
    full name (``package.Message``), each part decoded with its own table's columns: Order's ``id``
    an int64, Customer's a string; every value as protobuf's runtime reads it."""
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from chandy.formats.registry import registry_client
    from tests.fixtures.protobuf_messages import expected_row, order, order_class

    settings = {"url": "mock://routed-protobuf"}
    registry = registry_client(settings)
    context = SerializationContext("t", MessageField.VALUE)
    orders, customers = order_class(1), _customer_class()
    serialize = {cls: ProtobufSerializer(cls, registry, {"auto.register.schemas": True, "use.deprecated.format": False,
                                                         "subject.name.strategy": lambda c, r, n=name: f"t-{n}"})
                 for cls, name in ((orders, "Order"), (customers, "Customer"))}
    messages = [order(orders, 1), customers(id="c-1", email="a@x"), order(orders, 2), customers(id="c-2")]
    raws = [("t", serialize[type(m)](m, context)) for m in messages]
    decoder = ValueDecoder("protobuf", pa.schema([]), (), ("topic", "offset"),
                           schema_registry=tuple(sorted(settings.items())), unknown_fields="add", as_written=True)
    router = Router.parse([r"chandy\.test\.(\w+)=" + str(tmp_path / "$1")], by="record-name").resolved()
    task = _Task(router, decoder)
    assert routes_before_decoding(task)
    assert record_names(_batch(raws).column("value"), decoder) == [
        "chandy.test.Order", "chandy.test.Customer", "chandy.test.Order", "chandy.test.Customer"]
    dead = _Dead()
    groups = dict(by_destination(list(decode_routed(task, iter([_batch(raws)]), lambda uri: None, dead))))
    order_rows = pa.Table.from_batches(groups[f"file://{tmp_path}/Order"]).to_pylist()
    customer_table = pa.Table.from_batches(groups[f"file://{tmp_path}/Customer"])
    assert [r["offset"] for r in order_rows] == [0, 2]
    for row, i in zip(order_rows, (1, 2), strict=True):
        expected = expected_row(order(orders, i))
        assert {k: sorted(row[k]) if k == "attrs" else row[k] for k in expected} == expected  # a map: unordered
    assert customer_table.schema.field("id").type == pa.string()
    assert pa.Table.from_batches(groups[f"file://{tmp_path}/Order"]).schema.field("id").type == pa.int64()
    assert customer_table.to_pylist() == [{"topic": "t", "offset": 1, "id": "c-1", "email": "a@x"},
                                          {"topic": "t", "offset": 3, "id": "c-2", "email": ""}]
    assert dead.bad == [] and None not in groups


def test_json_schema_record_types_route_by_their_titles_into_tables_with_their_own_columns(tmp_path) -> None:
    """JSON Schema as Avro: one topic carrying two record types written by confluent-kafka's
    ``JSONSerializer`` (subjects by record name), routed by the writer schema's ``title`` (the
    record name Confluent's serializers use); a new table starts with the columns of the newest
    writer schema among its records (Order's ``qty`` an int32 from ``connect.type``, its added
    ``note`` there for version 1's records too), an existing table decodes with its own columns,
    and a schema without a title is unrouted."""
    from confluent_kafka.schema_registry.json_schema import JSONSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from chandy.formats.registry import registry_client

    settings = {"url": "mock://routed-json-schema"}
    registry = registry_client(settings)
    context = SerializationContext("t", MessageField.VALUE)
    order_v1 = {"title": "com.acme.Order", "type": "object", "properties": {
        "id": {"type": "integer"}, "qty": {"type": "integer", "connect.type": "int32"}}}
    order_v2 = {**order_v1, "properties": {**order_v1["properties"], "note": {"type": "string"}}}
    customer = {"title": "com.acme.Customer", "type": "object", "properties": {
        "id": {"type": "string"}, "email": {"type": "string"}}}
    untitled = {"type": "object", "properties": {"who": {"type": "string"}}}

    def serializer(schema: dict[str, Any]) -> Any:
        return JSONSerializer(json.dumps(schema), registry, conf={
            "auto.register.schemas": True, "subject.name.strategy": lambda c, name: f"t-{name or 'untitled'}"})

    raws = [("t", serializer(order_v1)({"id": 1, "qty": 2}, context)),
            ("t", serializer(customer)({"id": "c-1", "email": "a@x"}, context)),
            ("t", serializer(order_v2)({"id": 2, "qty": 3, "note": "gift"}, context)),
            ("t", serializer(untitled)({"who": "root"}, context))]
    decoder = ValueDecoder("json", pa.schema([]), (), ("topic", "offset"), json_framing="confluent",
                           schema_registry=tuple(sorted(settings.items())), unknown_fields="add")
    router = Router.parse([r"com\.acme\.(\w+)=" + str(tmp_path / "$1")], by="record-name").resolved()
    task = _Task(router, decoder)
    assert routes_before_decoding(task)
    assert record_names(_batch(raws).column("value"), decoder) == [
        "com.acme.Order", "com.acme.Customer", "com.acme.Order", None]
    customer_table = {"id": "string", "email": "string", "topic": "string"}  # an existing table's columns
    fields = {f"file://{tmp_path}/Customer": customer_table}
    dead = _Dead()
    groups = dict(by_destination(list(decode_routed(task, iter([_batch(raws)]), fields.get, dead))))
    orders = pa.Table.from_batches(groups[f"file://{tmp_path}/Order"])
    assert orders.schema.field("qty").type == pa.int32() and orders.schema.field("id").type == pa.int64()
    assert orders.to_pylist() == [{"topic": "t", "offset": 0, "id": 1, "qty": 2, "note": None},
                                  {"topic": "t", "offset": 2, "id": 2, "qty": 3, "note": "gift"}]
    assert pa.Table.from_batches(groups[f"file://{tmp_path}/Customer"]).to_pylist() == [
        {"topic": "t", "offset": 1, "id": "c-1", "email": "a@x"}]
    assert pa.Table.from_batches(groups[None]).to_pylist() == [{"topic": "t", "offset": 3, "who": "root"}]
    assert dead.bad == []

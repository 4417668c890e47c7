"""The throughput benchmark's records and its floor (``pipeline_vs_structured_streaming.py``).

Three value formats of the same topic shape (8 partitions):

- ``raw``: about 200 bytes of opaque bytes (landed as Kafka's key/value/metadata columns);
- ``json``: the 12-field record below as JSON (about 330 bytes), read with a declared schema
  (:data:`JSON_DDL`; Structured Streaming: ``from_json``);
- ``avro``: the same record as plain Avro binary (:data:`AVRO_SCHEMA`, no framing; Chandy
  ``--avro-framing raw``, Structured Streaming ``from_avro``).
- ``protobuf``: the same record as Protobuf ``bench.PageView`` (:func:`protobuf_class`; the price
  in cents, the timestamp a ``google.protobuf.Timestamp``) in Confluent's framing, its schema in a
  Schema Registry (:func:`use_registry`; Chandy ``--value-format protobuf``, Structured Streaming
  ``from_protobuf`` with a descriptor set file, after the 6-byte header).

The record has strings, longs, a decimal (12, 2), a timestamp and one nested record.

The *floor* is what the machine does with no Spark and no coordination: one plain process per
core, each consuming its share of the partitions with confluent-kafka, decoding a batch at a time
(JSON with Arrow's JSON reader and the declared schema, Avro with fastavro) and writing Parquet
files of ``per_file`` records with pyarrow.
"""

from __future__ import annotations

import datetime
import decimal
import io
import json
import multiprocessing
import os
import time
import uuid
from pathlib import Path
from typing import Any

AVRO_SCHEMA: dict[str, Any] = {
    "type": "record", "name": "PageView", "namespace": "bench", "fields": [
        {"name": "id", "type": "long"},
        {"name": "user_id", "type": "long"},
        {"name": "session", "type": "string"},
        {"name": "event", "type": "string"},
        {"name": "country", "type": "string"},
        {"name": "device", "type": "string"},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
        {"name": "quantity", "type": "long"},
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "page", "type": "string"},
        {"name": "referrer", "type": "string"},
        {"name": "geo", "type": {"type": "record", "name": "Geo", "fields": [
            {"name": "lat", "type": "double"}, {"name": "lon", "type": "double"}, {"name": "city", "type": "string"}]}},
    ]}
JSON_DDL = ("id BIGINT, user_id BIGINT, session STRING, event STRING, country STRING, device STRING, "
            "price DECIMAL(12, 2), quantity BIGINT, ts TIMESTAMP, page STRING, referrer STRING, "
            "geo STRUCT<lat: DOUBLE, lon: DOUBLE, city: STRING>")
FORMATS = ("raw", "json", "avro", "protobuf")
#: the Schema Registry (``url``) the Protobuf values' schema is registered in, and the descriptor set file
_REGISTRY: dict[str, str] = {}

_EVENTS = ("view", "click", "add_to_cart", "purchase")
_COUNTRIES = ("NO", "SE", "DE", "FR", "US", "BR", "JP", "IN")
_DEVICES = ("ios-17.2", "android-14", "web-chrome-131", "web-firefox-133")
_CITIES = ("Oslo", "Stockholm", "Berlin", "Paris", "Boston", "Recife", "Osaka", "Pune")
_EPOCH = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def record(i: int) -> dict[str, Any]:
    """Record ``i``: its values as Python objects (decimal as :class:`decimal.Decimal`)."""
    return {"id": i, "user_id": 1_000_000 + i % 50_000, "session": f"s-{i // 20:010d}", "event": _EVENTS[i % 4],
            "country": _COUNTRIES[i % 8], "device": _DEVICES[i % 4],
            "price": decimal.Decimal(i % 100_000) / 100, "quantity": 1 + i % 9,
            "ts": _EPOCH + datetime.timedelta(milliseconds=i * 7), "page": f"/products/{i % 5000}/details",
            "referrer": "https://www.example.com/search?q=" + str(i % 997),
            "geo": {"lat": 59.9 + (i % 1000) / 10_000, "lon": 10.75 - (i % 1000) / 10_000, "city": _CITIES[i % 8]}}


def use_registry(url: str, descriptor_set: Path) -> None:
    """The Schema Registry the Protobuf values are registered in, and where to write the descriptor
    set file Structured Streaming's ``from_protobuf`` reads."""
    _REGISTRY.update(url=url, descriptor_set=str(descriptor_set))


def protobuf_class() -> Any:
    """``bench.PageView`` (proto3), built from its descriptor: the record's fields, the price as
    ``int64 price_cents``, ``ts`` a ``google.protobuf.Timestamp``, ``geo`` a nested message."""
    from google.protobuf import descriptor_pool, message_factory, timestamp_pb2

    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.AddSerializedFile(_protobuf_file().SerializeToString())
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.PageView"))


def _protobuf_file() -> Any:
    from google.protobuf import descriptor_pb2

    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="bench/pageview.proto", package="bench", syntax="proto3",
                                               dependency=["google/protobuf/timestamp.proto"])
    view = proto.message_type.add(name="PageView")
    geo = view.nested_type.add(name="Geo")
    for number, (name, kind) in enumerate((("lat", f.TYPE_DOUBLE), ("lon", f.TYPE_DOUBLE), ("city", f.TYPE_STRING)), 1):
        geo.field.add(name=name, number=number, type=kind, label=f.LABEL_OPTIONAL)
    fields = (("id", f.TYPE_INT64), ("user_id", f.TYPE_INT64), ("session", f.TYPE_STRING), ("event", f.TYPE_STRING),
              ("country", f.TYPE_STRING), ("device", f.TYPE_STRING), ("price_cents", f.TYPE_INT64),
              ("quantity", f.TYPE_INT64))
    for number, (name, kind) in enumerate(fields, 1):
        view.field.add(name=name, number=number, type=kind, label=f.LABEL_OPTIONAL)
    view.field.add(name="ts", number=9, type=f.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp",
                   label=f.LABEL_OPTIONAL)
    view.field.add(name="page", number=10, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    view.field.add(name="referrer", number=11, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    view.field.add(name="geo", number=12, type=f.TYPE_MESSAGE, type_name=".bench.PageView.Geo", label=f.LABEL_OPTIONAL)
    return proto


def _protobuf_encoder(topic: str) -> Any:
    """Record ``i`` as ``bench.PageView`` framed as confluent-kafka's ProtobufSerializer frames it
    (it registers the schema as ``<topic>-value`` and frames the first record; the others reuse
    its 6-byte header: magic 0, the schema ID, message index 0). Writes the descriptor set file."""
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext
    from google.protobuf import descriptor_pb2, timestamp_pb2

    view = protobuf_class()
    files = descriptor_pb2.FileDescriptorSet()
    files.file.add().ParseFromString(timestamp_pb2.DESCRIPTOR.serialized_pb)
    files.file.append(_protobuf_file())
    Path(_REGISTRY["descriptor_set"]).write_bytes(files.SerializeToString())

    def message(i: int) -> Any:
        value = record(i)
        out = view(id=value["id"], user_id=value["user_id"], session=value["session"], event=value["event"],
                   country=value["country"], device=value["device"], price_cents=int(value["price"] * 100),
                   quantity=value["quantity"], page=value["page"], referrer=value["referrer"])
        out.ts.FromDatetime(value["ts"])
        out.geo.lat, out.geo.lon, out.geo.city = value["geo"]["lat"], value["geo"]["lon"], value["geo"]["city"]
        return out

    from chandy.formats.registry import registry_client  # new_client: a mock:// URL too

    serializer = ProtobufSerializer(view, registry_client({"url": _REGISTRY["url"]}),
                                    {"auto.register.schemas": True, "use.deprecated.format": False})
    first = serializer(message(0), SerializationContext(topic, MessageField.VALUE))
    header = first[:6]
    assert first == header + message(0).SerializeToString()
    return lambda i: header + message(i).SerializeToString()


def value_encoder(value_format: str, topic: str = "") -> Any:
    """A function ``i -> bytes``: record ``i`` in ``value_format`` (``raw``: an opaque payload;
    ``protobuf`` registers its schema for ``topic``)."""
    if value_format == "protobuf":
        return _protobuf_encoder(topic)
    if value_format == "raw":
        payload = os.urandom(90).hex()[:180]
        return lambda i: f"{i:012d}:{payload}".encode()
    if value_format == "json":
        def encode_json(i: int) -> bytes:
            value = record(i)
            value["price"] = str(value["price"])
            value["ts"] = value["ts"].isoformat().replace("+00:00", "Z")
            return json.dumps(value, separators=(",", ":")).encode()
        return encode_json
    import fastavro

    parsed = fastavro.parse_schema(AVRO_SCHEMA)

    def encode_avro(i: int) -> bytes:
        out = io.BytesIO()
        fastavro.schemaless_writer(out, parsed, record(i))
        return out.getvalue()
    return encode_avro


def chandy_value_options(value_format: str) -> dict[str, Any]:
    """Chandy's ``PipelineOptions`` for ``value_format``."""
    if value_format == "json":
        return {"value_format": "json", "value_schema": JSON_DDL}
    if value_format == "avro":
        return {"value_format": "avro", "value_schema": json.dumps(AVRO_SCHEMA), "avro_framing": "raw"}
    if value_format == "protobuf":
        return {"value_format": "protobuf", "schema_registry": {"url": _REGISTRY["url"]}}
    return {}


def decode_column(value_format: str) -> Any:
    """Structured Streaming: a function ``DataFrame -> DataFrame`` decoding ``value`` into the
    record's columns (with the Kafka columns Chandy keeps), as a data engineer writes it."""
    from pyspark.sql.functions import col

    def decode(frame: Any) -> Any:
        if value_format == "raw":
            return frame
        if value_format == "json":
            from pyspark.sql.functions import from_json

            value = from_json(col("value").cast("string"), JSON_DDL)
        elif value_format == "protobuf":
            from pyspark.sql.functions import expr
            from pyspark.sql.protobuf.functions import from_protobuf

            value = from_protobuf(expr("substring(value, 7)"), "bench.PageView",  # after Confluent's 6-byte header
                                  descFilePath=_REGISTRY["descriptor_set"])
        else:
            from pyspark.sql.avro.functions import from_avro

            value = from_avro(col("value"), json.dumps(AVRO_SCHEMA))
        return frame.select("key", "topic", "partition", "offset", "timestamp", "timestampType", "headers",
                            value.alias("v")).select("*", "v.*").drop("v")
    return decode


# -- the floor --------------------------------------------------------------------------------------

def _floor_worker(servers: str, topic: str, partitions: list[int], ends: dict[int, int], value_format: str,
                  out: str, per_file: int, start_at: float) -> tuple[int, float, float]:
    """One floor process: (records written, its first record's arrival, its last file's end), in
    seconds since the epoch; it starts consuming at ``start_at`` (the same moment in all)."""
    import pyarrow as pa
    import pyarrow.json as pa_json
    import pyarrow.parquet as pq
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": servers, "group.id": f"floor-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "isolation.level": "read_committed",
                         "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 10485760})
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    remaining = {p: ends[p] for p in partitions if ends[p] > 0}
    buffered: list[Any] = []
    written = 0
    if value_format == "json":
        from pyspark.sql.pandas.types import to_arrow_schema

        from chandy.connectors.spark.ddl import parse_ddl

        schema = to_arrow_schema(parse_ddl(JSON_DDL), timezone="UTC")
    elif value_format == "avro":
        import fastavro

        parsed = fastavro.parse_schema(AVRO_SCHEMA)

    def flush() -> None:
        nonlocal written
        if not buffered:
            return
        if value_format == "raw":
            table = pa.table({"key": [m.key() for m in buffered], "value": [m.value() for m in buffered],
                              "partition": [m.partition() for m in buffered], "offset": [m.offset() for m in buffered],
                              "timestamp": [m.timestamp()[1] for m in buffered]})
        elif value_format == "json":
            table = pa_json.read_json(pa.py_buffer(b"\n".join(m.value() for m in buffered)),
                                      parse_options=pa_json.ParseOptions(explicit_schema=schema))
        else:
            table = pa.Table.from_pylist([fastavro.schemaless_reader(io.BytesIO(m.value()), parsed) for m in buffered])
        pq.write_table(table, f"{out}/part-{uuid.uuid4().hex}.parquet")
        written += len(buffered)
        buffered.clear()

    time.sleep(max(0.0, start_at - time.time()))
    first = None
    while remaining:
        for message in consumer.consume(10_000, 1.0):
            if message.error():
                continue
            if first is None:
                first = time.time()
            buffered.append(message)
            partition = message.partition()
            if partition in remaining and message.offset() + 1 >= remaining[partition]:
                del remaining[partition]
        if len(buffered) >= per_file:
            flush()
    flush()
    ended = time.time()
    consumer.close()
    return written, first or ended, ended


def run_floor(servers: str, topic: str, partitions: int, value_format: str, root: Path, per_file: int) -> dict:
    """The floor: ``os.cpu_count()`` processes, each consuming its share of the partitions to
    their ends and writing Parquet files of ``per_file`` records. Returns records and seconds from
    the first record's arrival to the last file written (the processes' start and imports, paid
    once, are left out, as Chandy's and Spark's start are)."""
    from confluent_kafka import TopicPartition

    from chandy.coordinator.kafka import config as kafka_config

    consumer = kafka_config.consumer(servers)
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    consumer.close()
    out = root / f"floor-{value_format}-{uuid.uuid4().hex[:6]}"
    out.mkdir(parents=True)
    processes = max(1, os.cpu_count() or 1)
    shares = [[p for p in range(partitions) if p % processes == i] for i in range(processes)]
    context = multiprocessing.get_context("spawn")
    with context.Pool(processes) as pool:
        start_at = time.time() + 10  # after every process imported and connected
        done = pool.starmap(_floor_worker, [(servers, topic, share, ends, value_format, str(out), per_file, start_at)
                                            for share in shares])
    seconds = max(d[2] for d in done) - min(d[1] for d in done)
    return {"records": sum(d[0] for d in done), "seconds": seconds, "batches": 0, "worker_mib": None,
            "overhead_ms": 0.0, "batch_ms": 0.0, "processes": processes}

"""Issue 45: the Schema Registry as the source of the schema, end to end, against a real
registry (Apicurio's Confluent-compatible API, :mod:`tests.fixtures.schema_registry`), a real
broker, Spark and Delta. Producers are confluent-kafka's own ``AvroSerializer``; what landed is
read with deltalake and compared, field by field, with confluent-kafka's ``AvroDeserializer``
reading each Kafka record (readers Chandy did not write)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from deltalake import DeltaTable

from chandy.connectors.spark.options import PipelineError, PipelineOptions
from chandy.connectors.spark.pipeline import Pipeline
from chandy.coordinator.kafka import config as kafka_config
from tests.fixtures.pipeline import make_topic

V1 = {"type": "record", "name": "Order", "namespace": "com.acme", "fields": [
    {"name": "id", "type": "long"}, {"name": "customer", "type": "string"}, {"name": "qty", "type": "int"}]}
#: a producer adds a field (a nullable double with a default) and drops one (customer)
V2 = {**V1, "fields": [V1["fields"][0], V1["fields"][2],
                       {"name": "price", "type": ["null", "double"], "default": None}]}
#: then a narrowing the table cannot take: qty as a string
V3 = {**V1, "fields": [V1["fields"][0], {"name": "qty", "type": "string"}]}


def _produce(servers: str, registry: SchemaRegistryClient, topic: str, schema: dict, values: list[dict],
             subject: str | None = None) -> int:
    """Produce ``values`` with confluent-kafka's AvroSerializer (registering ``schema`` under
    ``subject``, default the topic's TopicNameStrategy subject); returns the schema ID."""
    conf: dict[str, Any] = {"auto.register.schemas": True}
    if subject is not None:
        conf["subject.name.strategy"] = lambda ctx, record_name: subject
    serializer = AvroSerializer(registry, json.dumps(schema), conf=conf)
    producer = kafka_config.producer(servers)
    context = SerializationContext(topic, MessageField.VALUE)
    for i, value in enumerate(values):
        producer.produce(topic, serializer(value, context), key=str(value["id"]).encode(), partition=i % 2)
    producer.flush(30)
    return int.from_bytes(serializer(values[0], context)[1:5], "big")


def _source_values(servers: str, registry: SchemaRegistryClient, topic: str,
                   deserializer: Any = None) -> dict[tuple[int, int], Any]:
    """Every record of ``topic`` (2 partitions) as ``deserializer`` (confluent-kafka's; default its
    AvroDeserializer, which reads each with its writer schema) reads it, by (partition, offset)."""
    deserializer = deserializer or AvroDeserializer(registry)
    consumer = kafka_config.consumer(servers)
    found: dict[tuple[int, int], Any] = {}
    for partition in (0, 1):
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)
        consumer.assign([TopicPartition(topic, partition, low)])
        while sum(1 for p, _ in found if p == partition) < high - low:
            for message in consumer.consume(100, timeout=5):
                if message.error() is None:
                    found[(partition, message.offset())] = deserializer(
                        message.value(), SerializationContext(topic, MessageField.VALUE))
    consumer.close()
    return found


def _drained_run(servers: str, topic: str, table: str, registry_url: str, value_format: str) -> PipelineOptions:
    """A run of ``topic`` into ``table`` until drained, 20 records a partition per checkpoint,
    its values of ``value_format`` read through the registry."""
    return PipelineOptions(table_uri=table, bootstrap_servers=servers, topics=(topic,), stop_when_drained=True,
                           prefix=f"rg{uuid.uuid4().hex[:6]}", value_format=value_format,
                           schema_registry={"url": registry_url}, max_records_per_checkpoint=20,
                           restart_backoff_initial_ms=100)


def _landed(table: str) -> dict[tuple[int, int], dict]:
    rows = DeltaTable(table).to_pyarrow_table().to_pylist()
    assert len({(r["partition"], r["offset"]) for r in rows}) == len(rows), "a record landed twice"
    return {(r["partition"], r["offset"]): r for r in rows}


def test_the_registry_gives_the_schema_and_writer_fields_evolve_the_table(spark, kafka_bootstrap_servers,
                                                                          schema_registry_url, tmp_path) -> None:
    """No --value-schema: the subject's latest version (V1) is the table's schema; records a
    producer wrote with V2 (registered under another subject, so the latest of the topic's subject
    stays V1) add their new field price as a DOUBLE column in the same run and lack customer
    (null); every value of both versions lands as confluent-kafka's deserializer reads it, once.
    Then V3 (qty as a string) fails the job naming the field, both types and both schema IDs, and
    lands nothing of that micro-batch."""
    registry = SchemaRegistryClient({"url": schema_registry_url})
    servers = kafka_bootstrap_servers
    topic = make_topic(servers, [])
    v1_id = _produce(servers, registry, topic, V1, [{"id": i, "customer": f"c{i}", "qty": i} for i in range(40)])
    v2_id = _produce(servers, registry, topic, V2, [{"id": i, "qty": -i, "price": i / 4 if i % 3 else None}
                                                      for i in range(40, 80)], subject=f"{topic}-v2")
    assert v2_id != v1_id
    assert registry.get_latest_version(f"{topic}-value").schema_id == v1_id
    table = str(tmp_path / "orders")
    opts = PipelineOptions(table_uri=table, bootstrap_servers=servers, topics=(topic,), stop_when_drained=True,
                           prefix=f"rg{uuid.uuid4().hex[:6]}", value_format="avro", avro_framing="confluent",
                           schema_registry={"url": schema_registry_url}, max_records_per_checkpoint=30,
                           restart_backoff_initial_ms=100)
    result = Pipeline(opts, spark=spark).run()
    assert result.records_landed == 80
    schema = {f.name: f.type for f in pa.schema(DeltaTable(table).schema().to_arrow())}
    assert str(schema["qty"]) == "int32" and str(schema["price"]) == "double" and str(schema["customer"]) == "string"
    source, landed = _source_values(servers, registry, topic), _landed(table)
    assert set(landed) == set(source) and len(landed) == 80
    for where, value in source.items():
        row = landed[where]
        for column in ("id", "customer", "qty", "price"):
            assert row[column] == value.get(column), (where, column, row[column], value.get(column))

    v3_id = _produce(servers, registry, topic, V3, [{"id": 100 + i, "qty": "many"} for i in range(4)],
                     subject=f"{topic}-v3")
    with pytest.raises(PipelineError, match=rf"SchemaChangeError: topic {topic} partition [01] offset \d+: field qty "
                                            r"changed type: "
                                            rf"its column is int32 \(schema ID {v1_id}\) but schema ID {v3_id} "
                                            r"writes string.*lands nothing of it"):
        Pipeline(opts, spark=spark).run()
    assert len(_landed(table)) == 80


_PRICE = {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}
W1 = {"type": "record", "name": "Reading", "namespace": "com.acme", "fields": [
    {"name": "id", "type": "long"}, {"name": "qty", "type": "int"}, {"name": "price", "type": _PRICE},
    {"name": "ratio", "type": "float"}]}
#: the widenings Iceberg's type promotion allows: int to long, a decimal's precision up, float to double
W2 = {**W1, "fields": [W1["fields"][0], {"name": "qty", "type": "long"},
                       {"name": "price", "type": {**_PRICE, "precision": 12}}, {"name": "ratio", "type": "double"}]}


def test_a_writer_schema_that_widens_columns_widens_the_iceberg_table(spark, kafka_bootstrap_servers,
                                                                     schema_registry_url, tmp_path) -> None:
    """Records of W1, then of W2 (qty int to long, price decimal(10,2) to (12,2), ratio float to
    double, with values only the wider types hold), then of W1 again, land in one run: the Iceberg
    table's columns are widened in the checkpoint's commit (read back with pyiceberg), every value
    of both versions is what confluent-kafka's deserializer reads; a restart, whose subject's latest
    version is still W1, keeps the table's wider columns and lands W1's records into them. The table
    is partitioned by day(timestamp), Iceberg's hidden partitioning (issue 47): its spec holds the
    transform of the Kafka timestamp and its files no partition column."""
    from decimal import Decimal

    from pyiceberg.types import DecimalType, DoubleType, LongType

    from tests.fixtures.exactly_once import iceberg_table

    registry = SchemaRegistryClient({"url": schema_registry_url})
    servers = kafka_bootstrap_servers
    topic = make_topic(servers, [])

    def narrow(i: int) -> dict:
        return {"id": i, "qty": -i, "price": Decimal(i * 101) / 100, "ratio": i / 8}

    _produce(servers, registry, topic, W1, [narrow(i) for i in range(30)])
    _produce(servers, registry, topic, W2, [{"id": i, "qty": 2**40 + i, "price": Decimal("9999999999.99") - i,
                                             "ratio": 0.1 * i} for i in range(30, 60)], subject=f"{topic}-w2")
    _produce(servers, registry, topic, W1, [narrow(i) for i in range(60, 80)])
    warehouse, name = tmp_path / "wh", f"registry.widened_{uuid.uuid4().hex[:6]}"
    opts = PipelineOptions(table_uri=f"iceberg://local/{name}", bootstrap_servers=servers, topics=(topic,),
                           stop_when_drained=True, prefix=f"rw{uuid.uuid4().hex[:6]}", value_format="avro",
                           avro_framing="confluent", schema_registry={"url": schema_registry_url},
                           max_records_per_checkpoint=20, catalog_properties={"warehouse": str(warehouse)},
                           partition_by=("day(timestamp)",))
    assert Pipeline(opts, spark=spark).run().records_landed == 80
    fields = {f.name: f.field_type for f in iceberg_table(warehouse, name).schema().fields}
    assert (fields["qty"], fields["price"], fields["ratio"]) == (LongType(), DecimalType(12, 2), DoubleType())
    spec = iceberg_table(warehouse, name).spec()
    assert [(f.source_id, str(f.transform), f.name) for f in spec.fields] == [
        (iceberg_table(warehouse, name).schema().find_field("timestamp").field_id, "day", "timestamp_day")]
    assert "timestamp_day" not in fields

    _produce(servers, registry, topic, W1, [narrow(i) for i in range(80, 90)])
    assert Pipeline(opts, spark=spark).run().records_landed == 10
    rows = iceberg_table(warehouse, name).scan().to_arrow().to_pylist()
    landed = {(r["partition"], r["offset"]): r for r in rows}
    assert len(landed) == len(rows) == 90, "a record landed twice or not at all"
    for where, value in _source_values(servers, registry, topic).items():
        for column in ("id", "qty", "price", "ratio"):
            assert landed[where][column] == value[column], (where, column, landed[where][column], value[column])


def test_an_unreachable_registry_or_unknown_subject_fails_before_spark_starts(kafka_bootstrap_servers,
                                                                              schema_registry_url, tmp_path) -> None:
    """The table's schema comes from the registry at start: a registry that does not answer, or a
    subject it does not hold, is one PipelineError naming the registry and the subject, raised by
    the preflight, which runs before Spark starts."""
    topic = make_topic(kafka_bootstrap_servers, [])
    base = dict(table_uri=str(tmp_path / "t"), bootstrap_servers=kafka_bootstrap_servers, topics=(topic,),
                value_format="avro", avro_framing="confluent", prefix=f"rg{uuid.uuid4().hex[:6]}")
    with pytest.raises(PipelineError, match=rf"Schema Registry {schema_registry_url}: the latest version of subject "
                                            rf"{topic}-value: .*no such subject"):
        Pipeline(PipelineOptions(**base, schema_registry={"url": schema_registry_url})).preflight()
    with pytest.raises(PipelineError, match=r"Schema Registry http://127.0.0.1:9 is unreachable .*subject "
                                            rf"{topic}-value"):
        Pipeline(PipelineOptions(**base, schema_registry={"url": "http://127.0.0.1:9"})).preflight()


#: the commit protocol's steps a run is SIGKILLed at, one run each, at checkpoints 2, 4, 6, 8, 10
KILL_POINTS = ("task-written", "before-lake-commit", "before-lake-event", "before-offset-commit", "before-complete")
#: of those, the kills ``make test`` runs (``-m slow`` runs them all)
KEY_KILL_POINTS = ("task-written", "before-lake-event", "before-complete")


def _killed_at_every_step_then_finished(args: list[str], points: tuple[str, ...] = KILL_POINTS) -> None:
    """``chandy pipeline run ARGS`` SIGKILLed at each of ``points`` in turn, then run to its end
    (exit 0)."""
    from tests.fixtures import exactly_once

    for i, point in enumerate(points):
        crashed = exactly_once.run_cli(args, crash_at=f"{point}@{2 + 2 * i}")
        assert crashed.returncode == -9, f"{point}: {crashed.stderr[-3000:]}"
    finished = exactly_once.run_cli(args)
    assert finished.returncode == 0, finished.stderr[-3000:]


@pytest.mark.parametrize("points", [pytest.param(KEY_KILL_POINTS, id="key-steps"),
                                    pytest.param(KILL_POINTS, id="every-step", marks=pytest.mark.slow)])
def test_a_writer_schema_that_adds_a_field_lands_every_value_once_through_a_kill_at_every_step(
        kafka_bootstrap_servers, schema_registry_url, tmp_path, points: tuple[str, ...]) -> None:
    """`chandy pipeline run --value-format avro --schema-registry-url URL` (no --value-schema) as
    a process SIGKILLed at each step of the commit protocol while the stream switches from V1 to
    V2 (a field added, one dropped) halfway: the run that finishes leaves every record in the
    table once, every value as confluent-kafka's deserializer reads it, the new column typed as
    V2 says, and the consumer group at the topic's end."""
    registry = SchemaRegistryClient({"url": schema_registry_url})
    servers = kafka_bootstrap_servers
    topic = make_topic(servers, [])
    _produce(servers, registry, topic, V1, [{"id": i, "customer": f"c{i}", "qty": i} for i in range(240)])
    _produce(servers, registry, topic, V2, [{"id": i, "qty": i % 7, "price": i * 0.5 if i % 5 else None}
                                            for i in range(240, 480)], subject=f"{topic}-v2")
    table, prefix = tmp_path / "orders", f"rk{uuid.uuid4().hex[:6]}"
    args = ["--table", str(table), "--topic", topic, "-b", servers, "--prefix", prefix, "--until-drained",
            "--max-records-per-checkpoint", "20", "--parallelism", "2", "--value-format", "avro",
            "--schema-registry-url", schema_registry_url]
    _killed_at_every_step_then_finished(args, points)
    source, landed = _source_values(servers, registry, topic), _landed(str(table))
    assert set(landed) == set(source) and len(landed) == 480
    for where, value in source.items():
        for column in ("id", "customer", "qty", "price"):
            assert landed[where][column] == value.get(column), (where, column)
    assert str(pa.schema(DeltaTable(str(table)).schema().to_arrow()).field("price").type) == "double"
    assert _group_of(servers, str(table), topic) == {(topic, 0): 240, (topic, 1): 240}


@pytest.mark.slow
@pytest.mark.parametrize("point", KILL_POINTS)
def test_a_widening_lands_every_value_once_through_a_kill_at_each_step_of_its_commit(
        kafka_bootstrap_servers, schema_registry_url, tmp_path, point: str) -> None:
    """`chandy pipeline run` into Iceberg, SIGKILLed at one step of the commit protocol of the very
    checkpoint that widens the table (checkpoint 4, the first to read W2's records: qty int to
    long, price decimal(10,2) to (12,2), ratio float to double, with values only the wider types
    hold), then run to the end: every record of W1, W2 and W1 again lands once, every value as
    confluent-kafka's deserializer reads it, the columns wide, the consumer group at the end.
    Slow (five Spark runs killed and five finished; `-m slow`)."""
    from decimal import Decimal

    from pyiceberg.types import DecimalType, DoubleType, LongType

    from tests.fixtures import exactly_once

    registry = SchemaRegistryClient({"url": schema_registry_url})
    servers = kafka_bootstrap_servers
    topic = make_topic(servers, [])

    def narrow(i: int) -> dict:
        return {"id": i, "qty": -i, "price": Decimal(i * 101) / 100, "ratio": i / 8}

    _produce(servers, registry, topic, W1, [narrow(i) for i in range(120)])  # checkpoints 1 to 3
    _produce(servers, registry, topic, W2, [{"id": i, "qty": 2**40 + i, "price": Decimal("9999999999.99") - i,
                                             "ratio": 0.1 * i} for i in range(120, 200)], subject=f"{topic}-w2")
    _produce(servers, registry, topic, W1, [narrow(i) for i in range(200, 240)])
    warehouse, name = tmp_path / "wh", f"registry.killed_{uuid.uuid4().hex[:6]}"
    args = ["--table", f"iceberg://local/{name}", "--catalog-property", f"warehouse={warehouse}", "--topic", topic,
            "-b", servers, "--prefix", f"rw{uuid.uuid4().hex[:6]}", "--until-drained",
            "--max-records-per-checkpoint", "20", "--parallelism", "2", "--value-format", "avro",
            "--schema-registry-url", schema_registry_url]
    crashed = exactly_once.run_cli(args, crash_at=f"{point}@4")
    assert crashed.returncode == -9, f"{point}: {crashed.stderr[-3000:]}"
    finished = exactly_once.run_cli(args)
    assert finished.returncode == 0, finished.stderr[-3000:]
    table = exactly_once.iceberg_table(warehouse, name)
    fields = {f.name: f.field_type for f in table.schema().fields}
    assert (fields["qty"], fields["price"], fields["ratio"]) == (LongType(), DecimalType(12, 2), DoubleType())
    rows = table.scan().to_arrow().to_pylist()
    landed = {(r["partition"], r["offset"]): r for r in rows}
    assert len(landed) == len(rows) == 240, f"{point}: a record landed twice or not at all"
    for where, value in _source_values(servers, registry, topic).items():
        for column in ("id", "qty", "price", "ratio"):
            assert landed[where][column] == value[column], (point, where, column)
    assert _group_of(servers, f"iceberg://local/{name}", topic) == {(topic, 0): 120, (topic, 1): 120}


ORDER = {"type": "record", "name": "Order", "namespace": "com.acme", "fields": [
    {"name": "id", "type": "long"}, {"name": "total", "type": "double"}]}
#: shares a field name with Order, of another type: each table keeps its own
CUSTOMER = {"type": "record", "name": "Customer", "namespace": "com.acme", "fields": [
    {"name": "id", "type": "string"}, {"name": "email", "type": ["null", "string"], "default": None}]}
AUDIT = {"type": "record", "name": "Audit", "namespace": "org.other", "fields": [
    {"name": "id", "type": "int"}, {"name": "who", "type": "string"}]}
_RECORDS = {"Order": (ORDER, lambda i: {"id": i, "total": i / 4}),
            "Customer": (CUSTOMER, lambda i: {"id": f"c-{i}", "email": None if i % 3 else f"{i}@x"}),
            "Audit": (AUDIT, lambda i: {"id": i, "who": f"user{i % 5}"})}


def _check_own_columns(rows_by_table: dict[str, list[dict]], source: dict[tuple[str, int, int], Any]) -> None:
    """Each table holds exactly its records' fields as value columns, and every record of the
    source exactly once, in the table of its record type, with its values."""
    from chandy.formats.decoder import KAFKA_COLUMNS

    seen: set[tuple[str, int, int]] = set()
    for name, rows in rows_by_table.items():
        fields = {f["name"] for f in _RECORDS[name][0]["fields"]}
        assert rows and set(rows[0]) - set(KAFKA_COLUMNS) == fields, (name, sorted(rows[0]))
        for row in rows:
            where = (row["topic"], row["partition"], row["offset"])
            assert where not in seen, f"{where} landed twice"
            seen.add(where)
            assert {f: row[f] for f in fields} == source[where], (name, where)
    assert seen == set(source)


def test_every_subject_its_table_a_multi_type_topic_and_a_database_in_one_job(spark, kafka_bootstrap_servers,
                                                                              schema_registry_url, tmp_path) -> None:
    """`--route-by record-name`: one topic holding three record types (TopicRecordNameStrategy
    subjects; Order and Customer share the field id as long and string) lands each type in its own
    Delta table with exactly its fields (the kills of tests/pipeline/test_routing.py cover routed
    commits; tests/cli/test_pipeline_options.py the command line); a Debezium-shaped
    database (three topics, three <topic>-value subjects) routed by topic lands in three Iceberg
    tables in one job, each with its own columns. Values as confluent-kafka's deserializer reads them."""
    import re

    from chandy.connectors.spark.options import PipelineError, PipelineOptions
    from tests.fixtures.exactly_once import iceberg_table

    registry = SchemaRegistryClient({"url": schema_registry_url})
    servers = kafka_bootstrap_servers
    topic = make_topic(servers, [])
    for schema, make in _RECORDS.values():
        full = f"{schema['namespace']}.{schema['name']}"
        _produce(servers, registry, topic, schema, [make(i) for i in range(30)], subject=f"{topic}-{full}")
    rest = tmp_path / "rest"
    opts = PipelineOptions(table_uri=str(rest), bootstrap_servers=servers, topics=(topic,), stop_when_drained=True,
                           prefix=f"rn{uuid.uuid4().hex[:6]}", max_records_per_checkpoint=20, value_format="avro",
                           avro_framing="confluent", schema_registry={"url": schema_registry_url},
                           route_by="record-name", routes=(r"com\.acme\.(\w+)=" + str(tmp_path / "$1"),))
    assert Pipeline(opts, spark=spark).run().records_landed == 90
    source = {(topic, *where): value for where, value in _source_values(servers, registry, topic).items()}
    _check_own_columns({name: DeltaTable(str(tmp_path / name if name != "Audit" else rest)).to_pyarrow_table()
                        .to_pylist() for name in _RECORDS}, source)

    database = f"db{uuid.uuid4().hex[:6]}"
    topics = {name: make_topic(servers, [], topic=f"{database}.{name.lower()}s") for name in _RECORDS}
    source = {}
    for name, (schema, make) in _RECORDS.items():
        _produce(servers, registry, topics[name], schema, [make(i) for i in range(25)])
        source.update({(topics[name], *where): value
                       for where, value in _source_values(servers, registry, topics[name]).items()})
    warehouse = tmp_path / "wh"
    opts = PipelineOptions(table_uri=str(tmp_path / "unrouted"), bootstrap_servers=servers,
                           topics=tuple(topics.values()), stop_when_drained=True, prefix=f"db{uuid.uuid4().hex[:6]}",
                           value_format="avro", avro_framing="confluent", schema_registry={"url": schema_registry_url},
                           routes=(re.escape(database) + r"\.(\w+)=iceberg://local/" + database + ".$1",),
                           catalog_properties={"warehouse": str(warehouse)})
    assert Pipeline(opts, spark=spark).run().records_landed == 75
    _check_own_columns({name: iceberg_table(warehouse, f"{database}.{name.lower()}s").scan().to_arrow().to_pylist()
                        for name in _RECORDS}, source)
    with pytest.raises(PipelineError, match="--route-by record-name routes by each value's writer schema"):
        PipelineOptions(table_uri=str(rest), bootstrap_servers=servers, topics=(topic,), value_format="json",
                        routes=("a=b",), route_by="record-name")


def test_avro_keys_become_key_columns_read_as_their_producers_wrote_them(kafka_bootstrap_servers,
                                                                         schema_registry_url, tmp_path) -> None:
    """`--key-format avro` with the registry: keys written by confluent-kafka's AvroSerializer (a
    key schema that gains a field halfway) land as key_<field> columns beside the values, every
    one as its AvroDeserializer reads it; the raw key column stays."""
    from tests.fixtures import exactly_once

    registry = SchemaRegistryClient({"url": schema_registry_url})
    servers = kafka_bootstrap_servers
    topic = make_topic(servers, [])
    key_v1 = {"type": "record", "name": "OrderKey", "namespace": "com.acme", "fields": [{"name": "id", "type": "long"}]}
    key_v2 = {**key_v1, "fields": [*key_v1["fields"], {"name": "region", "type": ["null", "string"], "default": None}]}
    values = AvroSerializer(registry, json.dumps(V1))
    producer = kafka_config.producer(servers)
    for i in range(40):
        schema = key_v1 if i < 20 else key_v2
        key = {"id": i} if i < 20 else {"id": i, "region": "eu" if i % 2 else None}
        keys = AvroSerializer(registry, json.dumps(schema), conf={"subject.name.strategy": lambda ctx, name: f"{topic}-key"})
        producer.produce(topic, values({"id": i, "customer": f"c{i}", "qty": i}, SerializationContext(topic, MessageField.VALUE)),
                         key=keys(key, SerializationContext(topic, MessageField.KEY)), partition=i % 2)
    producer.flush(30)
    table = tmp_path / "orders"
    finished = exactly_once.run_cli(["--table", str(table), "--topic", topic, "-b", servers, "--until-drained",
                                     "--prefix", f"kf{uuid.uuid4().hex[:6]}", "--value-format", "avro",
                                     "--key-format", "avro", "--schema-registry-url", schema_registry_url])
    assert finished.returncode == 0, finished.stderr[-3000:]
    rows = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
    assert len(rows) == 40 and {"key", "key_id", "key_region", "id", "customer", "qty"} <= set(rows[0])
    read_key = AvroDeserializer(registry)
    for row in rows:
        key = read_key(row["key"], SerializationContext(topic, MessageField.KEY))
        assert (row["key_id"], row["key_region"]) == (key["id"], key.get("region")) and row["key_id"] == row["id"]


def _group_of(servers: str, table: str, topic: str) -> dict[tuple[str, int], int]:
    """The committed offsets of the job's default consumer group (chandy-<job id>)."""
    from chandy.connectors.spark.options import default_job_id
    from tests.fixtures import exactly_once

    return exactly_once.committed_offsets(servers, f"chandy-{default_job_id(table, (topic,))}")


ORDER_JSON_V1 = {"$schema": "http://json-schema.org/draft-07/schema#", "title": "Order", "type": "object",
                 "properties": {"id": {"type": "integer"}, "customer": {"type": "string"},
                                "qty": {"type": "integer", "connect.type": "int32"},
                                "at": {"type": "string", "format": "date-time"},
                                "tags": {"type": "array", "items": {"type": "string"}}},
                 "required": ["id"]}
ORDER_JSON_V2 = {**ORDER_JSON_V1, "properties": {**ORDER_JSON_V1["properties"], "price": {"type": "number"}}}


def test_json_schema_values_land_with_the_registrys_columns_and_evolve(spark, kafka_bootstrap_servers,
                                                                       schema_registry_url, tmp_path) -> None:
    """--value-format json-schema with a registry and no --value-schema: confluent-kafka's
    JSONSerializer writes V1 (the subject's latest, so the table's columns: qty an INT as its
    connect.type says, at a UTC timestamp) and V2 (a price added, registered under another
    subject): every value lands once as confluent-kafka's JSONDeserializer reads it, and price
    becomes a column in the same run."""
    from datetime import datetime

    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer

    registry = SchemaRegistryClient({"url": schema_registry_url})
    servers = kafka_bootstrap_servers
    topic = make_topic(servers, [])
    producer = kafka_config.producer(servers)
    context = SerializationContext(topic, MessageField.VALUE)
    v1 = JSONSerializer(json.dumps(ORDER_JSON_V1), registry)
    v2 = JSONSerializer(json.dumps(ORDER_JSON_V2), registry, conf={"subject.name.strategy": lambda c, r: f"{topic}-v2"})
    for i in range(60):
        value: dict[str, Any] = {"id": i, "customer": f"c{i}", "qty": i * 3, "at": f"2026-11-27T10:{i:02d}:00Z",
                                 "tags": [f"t{i}"] * (i % 3)}
        if i >= 30:
            value["price"] = i / 8
        producer.produce(topic, (v2 if i >= 30 else v1)(value, context), partition=i % 2)
    producer.flush(30)
    table = str(tmp_path / "orders")
    opts = _drained_run(servers, topic, table, schema_registry_url, "json-schema")
    assert Pipeline(opts, spark=spark).run().records_landed == 60
    schema = {f.name: str(f.type) for f in pa.schema(DeltaTable(table).schema().to_arrow())}
    assert (schema["qty"], schema["at"], schema["price"]) == ("int32", "timestamp[us, tz=UTC]", "double")
    source = _source_values(servers, registry, topic, JSONDeserializer(None, schema_registry_client=registry))
    landed = _landed(table)
    assert set(landed) == set(source)
    for where, value in source.items():
        row = landed[where]
        assert row["at"] == datetime.fromisoformat(value["at"]), where
        for column in ("id", "customer", "qty", "tags", "price"):
            assert row[column] == value.get(column), (where, column, row[column], value.get(column))


def test_protobuf_values_land_once_with_the_registrys_columns_and_evolve(spark, kafka_bootstrap_servers,
                                                                         schema_registry_url, tmp_path) -> None:
    """--value-format protobuf: confluent-kafka's ProtobufSerializer writes Order V1 (the
    subject's latest: the table's columns) and V2 (price added, under another subject); read back
    with deltalake, every field of every record is what confluent-kafka's ProtobufDeserializer and
    protobuf's runtime read, and price is a DOUBLE column."""
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer

    from tests.fixtures.protobuf_messages import expected_row, order, order_class

    registry = SchemaRegistryClient({"url": schema_registry_url})
    servers = kafka_bootstrap_servers
    topic = make_topic(servers, [])
    context = SerializationContext(topic, MessageField.VALUE)
    v1, v2 = order_class(1), order_class(2)
    writers = {1: ProtobufSerializer(v1, registry, {"auto.register.schemas": True}),
               2: ProtobufSerializer(v2, registry, {"auto.register.schemas": True,
                                                    "subject.name.strategy": lambda c, r: f"{topic}-v2"})}
    producer = kafka_config.producer(servers)
    for i in range(60):
        version = 1 if i < 30 else 2
        producer.produce(topic, writers[version](order(v1 if version == 1 else v2, i), context), partition=i % 2)
    producer.flush(30)
    table = str(tmp_path / "orders")
    opts = _drained_run(servers, topic, table, schema_registry_url, "protobuf")
    assert Pipeline(opts, spark=spark).run().records_landed == 60
    assert str(pa.schema(DeltaTable(table).schema().to_arrow()).field("price").type) == "double"
    landed = _landed(table)
    source = _source_values(servers, registry, topic, ProtobufDeserializer(v2, None, registry))
    assert set(source) == set(landed)
    compared = 0
    for where, message in source.items():
        row = landed[where]
        expected = {"price": None, **expected_row(message)}
        if int(row["id"]) < 30:
            expected["price"] = None  # V1 has no price: read as V2, the runtime says 0.0
        row["attrs"] = sorted(row["attrs"])
        assert {k: row[k] for k in expected} == expected, where
        compared += 1
    assert compared == len(landed) == 60


ORDER_TITLED = {"$schema": "http://json-schema.org/draft-07/schema#", "title": "com.acme.Order", "type": "object",
                "properties": {"id": {"type": "integer"}, "qty": {"type": "integer", "connect.type": "int32"}},
                "required": ["id"]}
#: shares the property id with Order, as a string: each table keeps its own
CUSTOMER_TITLED = {"$schema": "http://json-schema.org/draft-07/schema#", "title": "com.acme.Customer",
                   "type": "object", "properties": {"id": {"type": "string"}, "email": {"type": "string"}}}


def test_json_schema_record_types_route_by_title_into_their_own_tables(spark, kafka_bootstrap_servers,
                                                                       schema_registry_url, tmp_path) -> None:
    """`--value-format json-schema --route-by record-name`: one topic holding two JSON Schema
    record types written by confluent-kafka's JSONSerializer (TopicRecordNameStrategy subjects)
    lands each in its own Delta table, named by the schema's title, with its own schema's columns
    (Order's qty an int32 from connect.type, Customer's id a string beside Order's bigint); every
    value once, as confluent-kafka's JSONDeserializer reads it."""
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer

    registry = SchemaRegistryClient({"url": schema_registry_url})
    servers = kafka_bootstrap_servers
    topic = make_topic(servers, [])
    producer = kafka_config.producer(servers)
    context = SerializationContext(topic, MessageField.VALUE)
    serializers = {schema["title"]: JSONSerializer(json.dumps(schema), registry, conf={
        "subject.name.strategy": lambda c, record_name: f"{c.topic}-{record_name}"})
        for schema in (ORDER_TITLED, CUSTOMER_TITLED)}
    for i in range(40):
        value: dict[str, Any] = {"id": i, "qty": i * 3} if i % 2 else {"id": f"c-{i}", "email": f"{i}@x"}
        title = "com.acme.Order" if i % 2 else "com.acme.Customer"
        producer.produce(topic, serializers[title](value, context), partition=i % 2 if i < 20 else (i + 1) % 2)
    producer.flush(30)
    opts = PipelineOptions(table_uri=str(tmp_path / "rest"), bootstrap_servers=servers, topics=(topic,),
                           stop_when_drained=True, prefix=f"js{uuid.uuid4().hex[:6]}", max_records_per_checkpoint=8,
                           value_format="json-schema", schema_registry={"url": schema_registry_url},
                           route_by="record-name", routes=(r"com\.acme\.(\w+)=" + str(tmp_path / "$1"),))
    assert Pipeline(opts, spark=spark).run().records_landed == 40
    source = _source_values(servers, registry, topic, JSONDeserializer(None, schema_registry_client=registry))
    orders, customers = _landed(str(tmp_path / "Order")), _landed(str(tmp_path / "Customer"))
    assert {f.name: str(f.type) for f in pa.schema(DeltaTable(str(tmp_path / "Order")).schema().to_arrow())
            if f.name in ("id", "qty")} == {"id": "int64", "qty": "int32"}
    assert pa.schema(DeltaTable(str(tmp_path / "Customer")).schema().to_arrow()).field("id").type == pa.string()
    assert set(orders) | set(customers) == set(source) and not set(orders) & set(customers)
    for where, value in source.items():
        row, fields = (orders[where], ("id", "qty")) if where in orders else (customers[where], ("id", "email"))
        assert {f: row[f] for f in fields} == {f: value[f] for f in fields}, where


def _produce_versions(servers: str, registry: SchemaRegistryClient, topic: str, value_format: str,
                      count: int) -> Any:
    """``count`` records, the first half written as version 1 of the value schema and the second
    as version 2 (a field added), by confluent-kafka's own JSONSerializer or ProtobufSerializer
    (version 2 under another subject); returns the deserializer that reads them back."""
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer

    from tests.fixtures.protobuf_messages import order, order_class

    context = SerializationContext(topic, MessageField.VALUE)
    second = {"auto.register.schemas": True, "subject.name.strategy": lambda c, r: f"{topic}-v2"}
    producer = kafka_config.producer(servers)
    if value_format == "protobuf":
        v1, v2 = order_class(1), order_class(2)
        first_writer, second_writer = (ProtobufSerializer(v1, registry, {"auto.register.schemas": True}),
                                       ProtobufSerializer(v2, registry, second))
        for i in range(count):
            half = i < count // 2
            producer.produce(topic, (first_writer if half else second_writer)(order(v1 if half else v2, i), context),
                             partition=i % 2)
        producer.flush(30)
        return ProtobufDeserializer(v2, None, registry)
    first_writer = JSONSerializer(json.dumps(ORDER_JSON_V1), registry)
    second_writer = JSONSerializer(json.dumps(ORDER_JSON_V2), registry, conf=second)
    for i in range(count):
        value: dict[str, Any] = {"id": i, "customer": f"c{i}", "qty": i * 3, "at": f"2026-11-27T10:{i % 60:02d}:00Z",
                                 "tags": [f"t{i}"] * (i % 3)}
        if i >= count // 2:
            value["price"] = i / 8
        producer.produce(topic, (first_writer if i < count // 2 else second_writer)(value, context), partition=i % 2)
    producer.flush(30)
    return JSONDeserializer(None, schema_registry_client=registry)


@pytest.mark.slow
@pytest.mark.parametrize("value_format", ["json-schema", "protobuf"])
def test_json_schema_and_protobuf_evolve_once_through_a_kill_at_every_step(
        kafka_bootstrap_servers, schema_registry_url, tmp_path, value_format: str) -> None:
    """As the Avro test above, for `--value-format json-schema` and `protobuf`: `chandy pipeline
    run` SIGKILLed at each step of the commit protocol while the writers switch from version 1 to
    version 2 (price added) halfway, then run to the end: every record lands once, every value as
    confluent-kafka's deserializer (and protobuf's runtime) reads it, price a DOUBLE column, the
    consumer group at the end. Slow (five Spark runs killed and one finished per format; `-m slow`)."""
    from datetime import datetime

    from tests.fixtures.protobuf_messages import expected_row

    registry = SchemaRegistryClient({"url": schema_registry_url})
    servers = kafka_bootstrap_servers
    topic = make_topic(servers, [])
    deserializer = _produce_versions(servers, registry, topic, value_format, 240)
    table, prefix = tmp_path / "orders", f"rk{uuid.uuid4().hex[:6]}"
    args = ["--table", str(table), "--topic", topic, "-b", servers, "--prefix", prefix, "--until-drained",
            "--max-records-per-checkpoint", "10", "--parallelism", "2", "--value-format", value_format,
            "--schema-registry-url", schema_registry_url]
    _killed_at_every_step_then_finished(args)
    source, landed = _source_values(servers, registry, topic, deserializer), _landed(str(table))
    assert set(landed) == set(source) and len(landed) == 240
    for where, value in source.items():
        row = landed[where]
        if value_format == "protobuf":
            expected = {"price": None, **expected_row(value)}
            if int(row["id"]) < 120:
                expected["price"] = None  # version 1 has no price: read as version 2, the runtime says 0.0
            row["attrs"] = sorted(row["attrs"])
            assert {k: row[k] for k in expected} == expected, where
        else:
            assert row["at"] == datetime.fromisoformat(value["at"]), where
            for column in ("id", "customer", "qty", "tags", "price"):
                assert row[column] == value.get(column), (where, column)
    assert str(pa.schema(DeltaTable(str(table)).schema().to_arrow()).field("price").type) == "double"
    assert _group_of(servers, str(table), topic) == {(topic, 0): 120, (topic, 1): 120}

"""Pipeline features against real Kafka, real Spark and a real Delta table, in one Spark session:
JSON decoding (given and inferred schemas), a user transform, partition columns, Avro values
(single-object encoding), bad options, and a resumed run that lands nothing twice."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid

import pytest
from confluent_kafka.admin import NewTopic
from deltalake import DeltaTable

from chandy.connectors.spark.options import PipelineError, PipelineOptions
from chandy.connectors.spark.pipeline import Pipeline
from chandy.connectors.spark.verify import verify_table
from chandy.coordinator.kafka import config as kafka_config
from chandy.schemas.codec import Schema, SchemaRepository, SingleObjectCodec

pytestmark = pytest.mark.integration

FLIGHTS = [
    {"carrier": c, "flight": i, "dep_delay": d, "origin": o}
    for i, (c, d, o) in enumerate([("UA", 5, "EWR"), ("AA", -3, "JFK"), ("UA", 12, "LGA"), ("DL", 0, "JFK"),
                                   ("AA", 30, "EWR"), ("B6", -1, "LGA")] * 20)
]


@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (SparkSession.builder.master("local[2]").appName("chandy-tests").config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def make_topic(servers: str, values: list[bytes], partitions: int = 2) -> str:
    topic = f"pf-{uuid.uuid4().hex[:8]}"
    admin = kafka_config.admin_client(servers)
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result()
    time.sleep(0.3)
    producer = kafka_config.producer(servers)
    for i, value in enumerate(values):
        producer.produce(topic, value, f"k{i}".encode(), partition=i % partitions, headers=[("source", b"test")])
    producer.flush(30)
    return topic


def run(spark, servers, topic, tmp_path, **options) -> tuple[Pipeline, object]:
    options.setdefault("prefix", f"pf{uuid.uuid4().hex[:6]}")
    pipeline = Pipeline(PipelineOptions(table_uri=str(tmp_path / "table"), bootstrap_servers=servers, topics=(topic,),
                                        stop_when_drained=True, **options), spark=spark)
    return pipeline, pipeline.run()


def test_json_values_with_a_transform_and_partition_columns(spark, kafka_bootstrap_servers, tmp_path) -> None:
    topic = make_topic(kafka_bootstrap_servers, [json.dumps(f).encode() for f in FLIGHTS])
    pipeline, summary = run(spark, kafka_bootstrap_servers, topic, tmp_path, value_format="json",
                            value_schema="carrier string, flight int, dep_delay int, origin string",
                            transform="tests.transforms.flights:late_only", partition_by=("origin",),
                            max_records_per_checkpoint=25)
    late = [f for f in FLIGHTS if f["dep_delay"] > 0]
    table = DeltaTable(str(tmp_path / "table"))
    rows = table.to_pyarrow_table().to_pylist()
    assert summary.records_landed == len(rows) == len(late)
    assert sorted((r["flight"], r["late_by"], r["origin"]) for r in rows) == sorted(
        (f["flight"], f["dep_delay"] * 60, f["origin"]) for f in late)
    assert table.metadata().partition_columns == ["origin"]
    assert {p.name for p in (tmp_path / "table").iterdir() if p.name.startswith("origin=")} == {
        "origin=EWR", "origin=LGA"}
    assert summary.checkpoints_completed >= 3  # 60 records per partition, at most 25 per checkpoint
    assert rows[0]["headers"] == [{"key": "source", "value": b"test"}] and "value" not in rows[0]


def test_inferred_json_schema_and_a_resumed_run_land_nothing_twice(spark, kafka_bootstrap_servers, tmp_path) -> None:
    topic = make_topic(kafka_bootstrap_servers, [json.dumps(f).encode() for f in FLIGHTS])
    pipeline, first = run(spark, kafka_bootstrap_servers, topic, tmp_path, value_format="json", keep_raw_value=True)
    assert first.records_landed == len(FLIGHTS)
    rows = DeltaTable(str(tmp_path / "table")).to_pyarrow_table().to_pylist()
    assert {r["carrier"] for r in rows} == {"UA", "AA", "DL", "B6"} and all(r["value"] for r in rows)
    pipeline = Pipeline(pipeline.options, spark=spark)
    again = pipeline.run()
    assert again.records_landed == 0 and again.checkpoints_completed == 0
    assert verify_table(pipeline.sink, kafka_bootstrap_servers, [topic]) == (len(FLIGHTS), 0, 0)


def test_avro_single_object_values_become_columns(spark, kafka_bootstrap_servers, tmp_path) -> None:
    schema = json.dumps({"type": "record", "name": "Flight", "namespace": "test", "fields": [
        {"name": "carrier", "type": "string"}, {"name": "flight", "type": "long"},
        {"name": "dep_delay", "type": ["null", "int"], "default": None}, {"name": "origin", "type": "string"}]})
    codec = SingleObjectCodec(SchemaRepository([Schema.from_definition(schema)]))
    topic = make_topic(kafka_bootstrap_servers, [codec.encode("test.Flight", f) for f in FLIGHTS])
    _, summary = run(spark, kafka_bootstrap_servers, topic, tmp_path, value_format="avro", value_schema=schema)
    rows = DeltaTable(str(tmp_path / "table")).to_pyarrow_table().to_pylist()
    assert summary.records_landed == len(FLIGHTS)
    assert sorted((r["flight"], r["carrier"], r["dep_delay"]) for r in rows) == sorted(
        (f["flight"], f["carrier"], f["dep_delay"]) for f in FLIGHTS)


def test_a_subtask_writes_a_part_whenever_it_holds_write_buffer_bytes(spark, kafka_bootstrap_servers,
                                                                      tmp_path) -> None:
    # 4 partitions over 2 subtasks: each subtask reads 2 ranges, each range one Arrow batch; a
    # 1-byte buffer makes every batch a part of its own, so each subtask writes 2 files
    topic = make_topic(kafka_bootstrap_servers, [json.dumps(f).encode() for f in FLIGHTS], partitions=4)
    _, summary = run(spark, kafka_bootstrap_servers, topic, tmp_path, value_format="json", parallelism=2,
                     max_records_per_checkpoint=30, write_buffer_bytes=1)
    table = DeltaTable(str(tmp_path / "table"))
    assert summary.records_landed == table.to_pyarrow_table().num_rows == len(FLIGHTS)
    assert summary.checkpoints_completed == 1 and len(table.file_uris()) == 4
    assert sorted(r["flight"] for r in table.to_pyarrow_table().to_pylist()) == sorted(f["flight"] for f in FLIGHTS)


def test_a_job_restarts_at_another_parallelism_and_defaults_to_the_local_cores(spark, kafka_bootstrap_servers,
                                                                             tmp_path) -> None:
    """Rescaling from a checkpoint: 4 subtasks land two checkpoints, the restarted job (no
    --parallelism, on local[2]) runs 2 subtasks that take over all 4 partitions' splits where
    the checkpoint left them; the table holds every record once."""
    topic = make_topic(kafka_bootstrap_servers, [json.dumps(f).encode() for f in FLIGHTS], partitions=4)
    first, summary = run(spark, kafka_bootstrap_servers, topic, tmp_path, parallelism=4, max_records_per_checkpoint=10,
                         max_checkpoints=2)
    assert first.parallelism == 4 and summary.records_landed == 80
    second, rest = run(spark, kafka_bootstrap_servers, topic, tmp_path, max_records_per_checkpoint=10,
                       prefix=first.options.prefix)
    assert second.parallelism == 2  # min(4 partitions, local[2]'s 2 cores)
    assert rest.records_landed == len(FLIGHTS) - 80 and rest.checkpoints_completed == 1
    assert verify_table(second.sink, kafka_bootstrap_servers, [topic]) == (len(FLIGHTS), 0, 0)
    subtasks: dict[int, set[int]] = {}
    for uri in DeltaTable(str(tmp_path / "table")).file_uris():
        checkpoint, subtask = (int(x) for x in os.path.basename(uri).split("-")[3:5])
        subtasks.setdefault(checkpoint, set()).add(subtask)
    assert subtasks == {1: {0, 1, 2, 3}, 2: {0, 1, 2, 3}, 3: {0, 1}}


def test_bad_options_are_clear_errors(spark, kafka_bootstrap_servers, tmp_path) -> None:
    with pytest.raises(PipelineError, match="topics .* or a topic pattern"):
        PipelineOptions(table_uri="t", bootstrap_servers="x:1")
    with pytest.raises(PipelineError, match="need a value schema"):
        PipelineOptions(table_uri="t", bootstrap_servers="x:1", topics=("a",), value_format="avro")
    with pytest.raises(PipelineError, match="write-buffer-bytes"):
        PipelineOptions(table_uri="t", bootstrap_servers="x:1", topics=("a",), write_buffer_bytes=0)
    with pytest.raises(PipelineError, match="cannot import"):
        Pipeline(PipelineOptions(table_uri=str(tmp_path), bootstrap_servers="x:1", topics=("a",),
                                 transform="no_such_module:f"))
    with pytest.raises(PipelineError, match="not found"):
        run(spark, kafka_bootstrap_servers, "no-such-topic-here", tmp_path)

"""Exactly-once into Apache Iceberg, shown as for Delta: the pipeline (real Kafka, real Spark, an
Iceberg table in pyiceberg's SQL catalog on SQLite) is killed with SIGKILL at each step of the
commit protocol and restarted; afterwards the table, read with pyiceberg's scan (not the writer),
holds every (topic, partition, offset) exactly once with its content, the consumer group's
offsets equal the topic's ends, and no data file is left that no snapshot references."""

from __future__ import annotations

import json
import signal
import subprocess
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import NewTopic
from pyiceberg.catalog import load_catalog

from chandy.connectors.spark.options import default_job_id
from chandy.coordinator.faults import POINTS
from chandy.coordinator.kafka import config as kafka_config
from tests.fixtures import exactly_once

pytestmark = pytest.mark.integration

PARTITIONS = 3
PER_PARTITION = 300
CAP = 120  # records per partition per checkpoint: checkpoints 1, 2 and 3 each carry data


@pytest.fixture(scope="module")
def source_topic(kafka_bootstrap_servers: str) -> tuple[str, dict]:
    topic = f"ice-{uuid.uuid4().hex[:8]}"
    admin = kafka_config.admin_client(kafka_bootstrap_servers)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result()
    producer = kafka_config.producer(kafka_bootstrap_servers, overrides={"linger.ms": 5})
    values = {}
    for i in range(PER_PARTITION * PARTITIONS):
        value = f"record-{i}-{uuid.uuid4().hex}".encode()
        producer.produce(topic, value, f"k{i}".encode(), partition=i % PARTITIONS)
        values[(i % PARTITIONS, i // PARTITIONS)] = value
    producer.flush(30)
    return topic, {(topic, p, o): v for (p, o), v in values.items()}


def run_pipeline(servers: str, topic: str, warehouse: Path, table: str, prefix: str, crash_at: str | None = None,
                 timeout_s: float = 400) -> subprocess.CompletedProcess:
    return exactly_once.run_pipeline(
        ["--table", f"iceberg://local/{table}", "--catalog-property", f"warehouse={warehouse}"], servers, topic,
        prefix, cap=CAP, parallelism=PARTITIONS, crash_at=crash_at, timeout_s=timeout_s)


def check_exactly_once(servers: str, warehouse: Path, table_name: str, content: dict, topic: str) -> None:
    catalog = load_catalog("local", type="sql", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")
    table = catalog.load_table(table_name)
    exactly_once.assert_rows_exactly_once(table.scan(selected_fields=exactly_once.COLUMNS).to_arrow(), content)
    job = default_job_id(f"iceberg://local/{table_name}", [topic])
    assert exactly_once.committed_offsets(servers, f"chandy-{job}") == {
        (topic, p): PER_PARTITION for p in range(PARTITIONS)}
    recorded = json.loads(table.properties[f"chandy.job.{job}.offsets"])
    assert recorded == {topic: {str(p): PER_PARTITION for p in range(PARTITIONS)}}
    referenced = {Path(p).name for p in table.inspect.all_data_files().column("file_path").to_pylist()}
    on_disk = {p.name for p in warehouse.rglob("part-chandy-*.parquet")}
    assert on_disk == referenced, f"unreferenced files left: {sorted(on_disk - referenced)}"


#: make test kills at the steps where Iceberg's commit differs from Delta's (the table commit, its
#: event, the offsets after it); the other steps, the same code as Delta's (tests/pipeline/
#: test_pipeline_exactly_once.py kills at every step), run with -m slow, as docs/testing.md says
ICEBERG_STEPS = ("before-lake-commit", "before-lake-event", "before-offset-commit")


@pytest.mark.parametrize("point", [p if p in ICEBERG_STEPS else pytest.param(p, marks=pytest.mark.slow) for p in POINTS])
def test_killed_at_each_step_then_restarted_lands_every_record_exactly_once(
        kafka_bootstrap_servers, source_topic, tmp_path, point) -> None:
    topic, content = source_topic
    warehouse = tmp_path / "warehouse"
    table = f"lake.events_{point.replace('-', '_')}"  # one job (and consumer group) per test
    prefix = f"ie{uuid.uuid4().hex[:8]}"
    crashed = run_pipeline(kafka_bootstrap_servers, topic, warehouse, table, prefix, crash_at=f"{point}@2")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    finished = run_pipeline(kafka_bootstrap_servers, topic, warehouse, table, prefix)
    assert finished.returncode == 0, finished.stderr[-3000:]
    check_exactly_once(kafka_bootstrap_servers, warehouse, table, content, topic)
    exactly_once.check_iceberg_lake_events(kafka_bootstrap_servers, prefix, warehouse, table, topic, set(content))

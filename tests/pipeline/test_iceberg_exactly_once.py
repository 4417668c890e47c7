"""Exactly-once into Apache Iceberg, shown as for Delta: the pipeline (real Kafka, real Spark, an
Iceberg table in pyiceberg's SQL catalog on SQLite) is killed with SIGKILL at each step of the
commit protocol and restarted; afterwards the table, read with pyiceberg's scan (not the writer),
holds every (topic, partition, offset) exactly once with its content, the consumer group's
offsets equal the topic's ends, and no data file is left that no snapshot references."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import NewTopic
from pyiceberg.catalog import load_catalog

from chandy.connectors.spark.options import default_job_id
from chandy.coordinator.faults import POINTS
from chandy.coordinator.kafka import config as kafka_config
from tests.fixtures import REPO_ROOT

pytestmark = pytest.mark.integration

ROOT = REPO_ROOT
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
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    env.pop("CHANDY_CRASH_AT", None)
    if crash_at:
        env["CHANDY_CRASH_AT"] = crash_at
    return subprocess.run(
        [sys.executable, "-m", "chandy.cli", "pipeline", "run", "--table", f"iceberg://local/{table}",
         "--catalog-property", f"warehouse={warehouse}", "--topic", topic,
         "-b", servers, "--prefix", prefix, "--until-drained", "--max-records-per-checkpoint", str(CAP),
         "--parallelism", str(PARTITIONS), "--master", "local[2]", "--conf", "spark.ui.enabled=false"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s, start_new_session=True,
    )


def check_exactly_once(servers: str, warehouse: Path, table_name: str, content: dict, topic: str) -> None:
    catalog = load_catalog("local", type="sql", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")
    table = catalog.load_table(table_name)
    data = table.scan(selected_fields=("topic", "partition", "offset", "value")).to_arrow()
    rows = list(zip(*(data.column(c).to_pylist() for c in ("topic", "partition", "offset", "value")), strict=True))
    keys = [(t, p, o) for t, p, o, _ in rows]
    assert len(keys) == len(set(keys)), f"{len(keys) - len(set(keys))} duplicates"
    assert set(keys) == set(content), f"{len(set(content) - set(keys))} missing"
    assert all(content[(t, p, o)] == v for t, p, o, v in rows), "content differs from the source"
    job = default_job_id(f"iceberg://local/{table_name}", [topic])
    group = f"chandy-{job}"
    admin = kafka_config.admin_client(servers)
    committed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result()
    assert {(tp.topic, tp.partition): tp.offset for tp in committed.topic_partitions} == {
        (topic, p): PER_PARTITION for p in range(PARTITIONS)}
    recorded = json.loads(table.properties[f"chandy.job.{job}.offsets"])
    assert recorded == {topic: {str(p): PER_PARTITION for p in range(PARTITIONS)}}
    referenced = {Path(p).name for p in table.inspect.all_data_files().column("file_path").to_pylist()}
    on_disk = {p.name for p in warehouse.rglob("part-chandy-*.parquet")}
    assert on_disk == referenced, f"unreferenced files left: {sorted(on_disk - referenced)}"


@pytest.mark.parametrize("point", POINTS)
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

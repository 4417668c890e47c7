"""Exactly-once, shown: the pipeline (real Kafka, real Spark, a real Delta table) is killed with
SIGKILL at each step of the commit protocol and restarted; afterwards the table holds every
(topic, partition, offset) of the source exactly once with its content intact, read with pyarrow
through deltalake (not the writer), and the consumer group's offsets equal the topic's ends."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic
from deltalake import DeltaTable

from chandy.connectors.spark.options import default_job_id
from chandy.coordinator.faults import POINTS
from chandy.coordinator.kafka import config as kafka_config
from tests.fixtures import REPO_ROOT, exactly_once

pytestmark = pytest.mark.integration

ROOT = REPO_ROOT
PARTITIONS = 3
PER_PARTITION = 900
CAP = 400  # records per partition per checkpoint: checkpoints 1, 2 and 3 each carry data


@pytest.fixture(scope="module")
def source_topic(kafka_bootstrap_servers: str) -> tuple[str, dict]:
    """A topic of 3 partitions with unique values, plus an aborted transaction in the middle."""
    topic = f"eo-{uuid.uuid4().hex[:8]}"
    admin = kafka_config.admin_client(kafka_bootstrap_servers)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result()
    time.sleep(0.5)
    producer = kafka_config.producer(kafka_bootstrap_servers, overrides={"linger.ms": 5})
    for i in range(PER_PARTITION * PARTITIONS // 2):
        producer.produce(topic, f"record-{i}-{uuid.uuid4().hex}".encode(), f"k{i}".encode(), partition=i % PARTITIONS)
    producer.flush(30)
    aborted = kafka_config.producer(kafka_bootstrap_servers, transactional_id=f"eo-{uuid.uuid4().hex}")
    aborted.init_transactions(10)
    aborted.begin_transaction()
    for i in range(30):
        aborted.produce(topic, b"never-visible", b"x", partition=i % PARTITIONS)
    aborted.flush(10)
    aborted.abort_transaction(10)
    for i in range(PER_PARTITION * PARTITIONS // 2, PER_PARTITION * PARTITIONS):
        producer.produce(topic, f"record-{i}-{uuid.uuid4().hex}".encode(), f"k{i}".encode(), partition=i % PARTITIONS)
    producer.flush(30)
    content = {(topic, m.partition(), m.offset()): m.value()
               for m in exactly_once.consume_to_end(kafka_bootstrap_servers, topic, range(PARTITIONS))}
    assert len(content) == PER_PARTITION * PARTITIONS
    return topic, content


def run_pipeline(servers: str, topic: str, table: Path, prefix: str, crash_at: str | None = None,
                 timeout_s: float = 400) -> subprocess.CompletedProcess:
    return exactly_once.run_pipeline(["--table", str(table)], servers, topic, prefix, cap=CAP,
                                     parallelism=PARTITIONS, crash_at=crash_at, timeout_s=timeout_s)


def check_exactly_once(servers: str, table: Path, content: dict, topic: str) -> None:
    data = DeltaTable(str(table)).to_pyarrow_table(columns=list(exactly_once.COLUMNS))
    exactly_once.assert_rows_exactly_once(data, content)
    # the consumer group shows the pipeline's progress: its offsets are the topic's ends
    group = f"chandy-{default_job_id(str(table), [topic])}"
    consumer = kafka_config.consumer(servers)
    ends = {(topic, p): consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
            for p in range(PARTITIONS)}
    consumer.close()
    assert exactly_once.committed_offsets(servers, group) == ends
    # no data file is left that the table does not reference
    referenced = {Path(u).name for u in DeltaTable(str(table)).file_uris()}
    on_disk = {p.name for p in table.rglob("part-chandy-*.parquet")}
    assert on_disk == referenced, f"unreferenced files left: {sorted(on_disk - referenced)}"


@pytest.mark.parametrize("point", POINTS)
def test_killed_at_each_step_then_restarted_lands_every_record_exactly_once(
        kafka_bootstrap_servers, source_topic, tmp_path, point) -> None:
    topic, content = source_topic
    table = tmp_path / "lake" / "table"
    prefix = f"eo{uuid.uuid4().hex[:8]}"
    crashed = run_pipeline(kafka_bootstrap_servers, topic, table, prefix, crash_at=f"{point}@2")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    before = DeltaTable(str(table)).to_pyarrow_dataset().count_rows() if (table / "_delta_log").exists() else 0
    finished = run_pipeline(kafka_bootstrap_servers, topic, table, prefix)
    assert finished.returncode == 0, finished.stderr[-3000:]
    check_exactly_once(kafka_bootstrap_servers, table, content, topic)
    exactly_once.check_delta_lake_events(kafka_bootstrap_servers, prefix, str(table), topic, set(content))
    # the restart's summary counts every row it landed, those of the checkpoint its restore committed too
    landed = re.search(r"rows landed \(this run\)\D*?([\d,]+)", finished.stdout)
    assert landed is not None, finished.stdout[-2000:]
    assert int(landed.group(1).replace(",", "")) == len(content) - before


@pytest.mark.slow
def test_random_kills_then_restart_lands_every_record_exactly_once(kafka_bootstrap_servers, source_topic, tmp_path) -> None:
    """By hand: ``pytest -m slow``. Kills the pipeline at random moments, again and again."""
    topic, content = source_topic
    table = tmp_path / "lake" / "table"
    prefix = f"eo{uuid.uuid4().hex[:8]}"
    rng = random.Random(int(os.environ.get("CHANDY_SEED", "7")))
    kills = int(os.environ.get("CHANDY_KILLS", "8"))
    killed_mid_run = 0
    for _ in range(kills):
        env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
        process = subprocess.Popen(
            [sys.executable, "-m", "chandy.cli", "pipeline", "run", "--table", str(table), "--topic", topic,
             "-b", kafka_bootstrap_servers, "--prefix", prefix, "--until-drained", "--max-records-per-checkpoint", "20",
             "--parallelism", str(PARTITIONS), "--master", "local[2]"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        time.sleep(rng.uniform(5, 30))
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            killed_mid_run += 1
        process.wait()
    print(f"{killed_mid_run} of {kills} runs were killed while running")
    assert killed_mid_run > 0
    finished = run_pipeline(kafka_bootstrap_servers, topic, table, prefix)
    assert finished.returncode == 0, finished.stderr[-3000:]
    check_exactly_once(kafka_bootstrap_servers, table, content, topic)

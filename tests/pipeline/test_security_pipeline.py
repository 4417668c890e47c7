"""The pipeline on a secured cluster: SASL/SCRAM with ``StandardAuthorizer`` (what ``chandy kafka
up --security sasl-scram`` starts) and only the ACLs ``chandy topics acls`` prints for the
pipeline, applied by the administrator; nothing more. ``chandy pipeline run`` connects its driver
(coordinator, source enumerator, offset commits, dead letters) as the ``coordinator`` principal
(``-X``) and its Spark tasks (source reads, acks) as the ``worker`` principal
(``--worker-property``). Every record of the source lands exactly once (bad ones in the
dead-letter topic), the consumer group's offsets reach the topic's ends, and no checkpoint fails;
since only the worker may write acks and only the coordinator the coordinator's topics, that also
shows each client ran as its principal. The same pipeline whose worker was not granted READ on its
source, or whose coordinator was not granted its consumer group, stops before Spark starts with
Kafka's authorisation error, and lands nothing.

Run it under the Spark lock: ``flock /tmp/chandy-spark.lock .venv/bin/pytest
tests/pipeline/test_security_pipeline.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import (
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)

from chandy.broker import BrokerInfo, EmbeddedKafkaBroker
from chandy.connectors.kafka.source.reader import KafkaRangeReader
from chandy.connectors.kafka.source.split import KafkaPartitionSplit
from chandy.connectors.lake.tables import open_sink
from chandy.connectors.spark.verify import verify_table
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.acls import chandy_acls
from chandy.coordinator.kafka.topics import ChandyTopics
from tests.fixtures.lake_pipeline import make_topic, topic_ends

pytestmark = pytest.mark.integration

USERS = {"coordinator": "coordinator-secret", "worker": "worker-secret"}
CHANDY = [sys.executable, "-m", "chandy.cli"]
PARTITIONS = 2
RECORDS = 300
BAD = {i for i in range(RECORDS) if i % 30 == 7}  # not JSON: dead letters


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerInfo]:
    broker = EmbeddedKafkaBroker(tmp_path_factory.mktemp("secured-pipeline"), security="sasl-scram", scram_users=USERS)
    info = broker.up()
    try:
        yield info
    finally:
        broker.down()


def _credentials(user: str) -> list[str]:
    """``-X`` options of ``user``'s SASL/SCRAM settings, under librdkafka's names."""
    return [f"{k}={v}" for k, v in kafka_config.sasl_settings(user, USERS[user]).items()]


def _chandy(*args: str, timeout_s: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*CHANDY, *args], capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "PYSPARK_PYTHON": sys.executable})


def _source(info: BrokerInfo) -> str:
    """A source topic written by the admin: JSON values, every 30th one not JSON."""
    values = [b"not json" if i in BAD else json.dumps({"i": i}).encode() for i in range(RECORDS)]
    return make_topic(info.bootstrap_servers, values, PARTITIONS, prefix="secure", overrides=info.client_settings)


def _acls(info: BrokerInfo, prefix: str, *args: str) -> str:
    """Apply ``chandy topics acls`` as the embedded broker's super user; its printed table."""
    applied = _chandy("topics", "acls", "--data-dir", info.data_dir, "-b", info.bootstrap_servers, "--prefix", prefix,
                      *args, timeout_s=120)
    assert applied.returncode == 0, applied.stderr
    return applied.stdout


def _pipeline(info: BrokerInfo, prefix: str, topic: str, group: str, dead_letters: str, table: Path,
              ) -> subprocess.CompletedProcess:
    coordinator = [x for setting in _credentials("coordinator") for x in ("-X", setting)]
    worker = [x for setting in _credentials("worker") for x in ("--worker-property", setting)
              if not setting.startswith(("security.protocol", "sasl.mechanism"))]  # the driver's carry over
    return _chandy("pipeline", "run", "--table", str(table), "--topic", topic, "-b", info.bootstrap_servers,
                   "--prefix", prefix, "--group-id", group, "--until-drained", "--max-records-per-checkpoint", "60",
                   "--value-format", "json", "--value-schema", "i INT", "--errors-tolerance", "all",
                   "--dead-letter-topic", dead_letters, "--tolerable-failed-checkpoints", "0", "--parallelism", "2",
                   *coordinator, *worker)


def _committed(info: BrokerInfo, group: str, topic: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets, read by the admin (-1001: none)."""
    admin = kafka_config.admin_client(info.bootstrap_servers, info.client_settings)
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(PARTITIONS)])
    answer = admin.list_consumer_group_offsets([request])[group].result()
    return {(tp.topic, tp.partition): tp.offset for tp in answer.topic_partitions}


def _dead_letters(info: BrokerInfo, topic: str) -> list[tuple[int, int]]:
    """The source (partition, offset) of each record in the dead-letter topic (read_committed, by the admin)."""
    consumer = kafka_config.consumer(info.bootstrap_servers, overrides=info.client_settings)
    reader = KafkaRangeReader(info.bootstrap_servers, info.client_settings)
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)
        headers = [dict(m.headers()) for m in reader.read(KafkaPartitionSplit(topic, 0, low, high))]
        return sorted((int(h["__connect.errors.partition"]), int(h["__connect.errors.offset"])) for h in headers)
    finally:
        reader.close()
        consumer.close()


def _prepare(info: BrokerInfo, prefix: str) -> tuple[str, str, str]:
    """As the administrator (no Chandy principal may create topics): Chandy's topics through
    ``chandy topics ensure``, a source topic and its dead-letter topic. (source, dead letters, group)."""
    ensured = _chandy("topics", "ensure", "--data-dir", info.data_dir, "-b", info.bootstrap_servers, "--prefix", prefix,
                      timeout_s=120)
    assert ensured.returncode == 0, ensured.stderr
    topic = _source(info)
    dead_letters = f"{topic}-dlq"
    admin = kafka_config.admin_client(info.bootstrap_servers, info.client_settings)
    admin.create_topics([NewTopic(dead_letters, 1, 1)])[dead_letters].result()
    return topic, dead_letters, f"landing-{topic}"


def test_the_pipeline_lands_exactly_once_as_coordinator_and_worker_with_only_the_minimal_acls(
        secured: BrokerInfo, topic_prefix: str, tmp_path: Path) -> None:
    servers, admin_settings = secured.bootstrap_servers, dict(secured.client_settings)
    admin = kafka_config.admin_client(servers, admin_settings)
    topic, dead_letters, group = _prepare(secured, topic_prefix)

    table = _acls(secured, topic_prefix, "--coordinator", "coordinator", "--worker", "worker", "--source-topic", topic,
                  "--group", group, "--dead-letter-topic", dead_letters)
    rows = {tuple(line.split()) for line in table.splitlines()[1:]}
    assert ("coordinator", "User:coordinator", "TOPIC", topic, "LITERAL", "READ") in rows
    assert ("coordinator", "User:coordinator", "GROUP", group, "LITERAL", "READ") in rows
    assert ("coordinator", "User:coordinator", "TOPIC", dead_letters, "LITERAL", "WRITE") in rows
    assert ("worker", "User:worker", "TOPIC", topic, "LITERAL", "READ") in rows
    # nothing more than what chandy_acls gives: the cluster's ACLs are exactly these
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                                  AclPermissionType.ANY)
    expected = chandy_acls(ChandyTopics(topic_prefix), coordinator="coordinator", workers=["worker"],
                           source_topics=[topic], group=group, dead_letter_topics=[dead_letters])
    assert set(admin.describe_acls(everything).result()) == {acl.binding() for acl in expected}

    run = _pipeline(secured, topic_prefix, topic, group, dead_letters, tmp_path / "table")
    assert run.returncode == 0, run.stderr[-3000:]
    # with --tolerable-failed-checkpoints 0 a failed checkpoint (e.g. an ack refused) would have failed the run
    failed = re.search(r"checkpoints failed\W+(\d+)", run.stdout)
    completed = re.search(r"checkpoints completed\W+(\d+)", run.stdout)
    assert failed is not None and completed is not None, run.stdout
    assert int(failed.group(1)) == 0 and int(completed.group(1)) >= RECORDS // PARTITIONS // 60

    landed, duplicates, missing = verify_table(open_sink(str(tmp_path / "table")), servers, [topic], admin_settings,
                                               dead_letter_topic=dead_letters)
    assert (landed, duplicates, missing) == (RECORDS - len(BAD), 0, 0)
    # record i went to partition i % 2 at offset i // 2; each bad one is a dead letter, once
    assert _dead_letters(secured, dead_letters) == sorted((i % PARTITIONS, i // PARTITIONS) for i in BAD)
    # commit.offsets.on.checkpoint: the coordinator's principal committed the ends to the group
    assert _committed(secured, group, topic) == topic_ends(servers, topic, PARTITIONS, admin_settings)


@pytest.mark.parametrize("missing", ["worker-read-source", "coordinator-read-group"])
def test_a_missing_acl_stops_the_pipeline_before_anything_lands(
        secured: BrokerInfo, topic_prefix: str, tmp_path: Path, missing: str) -> None:
    topic, dead_letters, group = _prepare(secured, topic_prefix)
    coordinator = ["--coordinator", "coordinator", "--dead-letter-topic", dead_letters, "--source-topic", topic]
    worker = ["--worker", "worker", "--source-topic", topic]
    if missing == "worker-read-source":  # the worker gets Chandy's topics only
        _acls(secured, topic_prefix, *coordinator, "--group", group)
        _acls(secured, topic_prefix, *worker[:2])
        expected = ["the Spark tasks' principal (worker) may not read the source", f"topic {topic}",
                    "Topic authorization failed", "--source-topic"]
    else:  # the coordinator may not use the pipeline's consumer group
        _acls(secured, topic_prefix, *coordinator)
        _acls(secured, topic_prefix, *worker)
        expected = [f"the driver's principal (coordinator) may not use consumer group {group}",
                    "Group authorization failed", f"--group {group}"]

    run = _pipeline(secured, topic_prefix, topic, group, dead_letters, tmp_path / "table")
    assert run.returncode == 2, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]
    assert all(part in last for part in expected), last
    # nothing landed: no table, no dead letters, no committed offsets
    assert not open_sink(str(tmp_path / "table")).exists()
    assert _dead_letters(secured, dead_letters) == []
    assert set(_committed(secured, group, topic).values()) == {-1001}

"""The Spark tasks' Kafka clients, pooled per Python worker process (connectors/spark/task/clients.py),
against a real broker: a second task's read reuses the first one's consumer and reads exactly its
own range, acks share one producer, and a failed task's clients are not handed out again."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka.admin import NewTopic

from chandy.connectors.spark.task import clients
from chandy.connectors.spark.task.options import TaskOptions
from chandy.connectors.spark.task.read import read_ranges
from chandy.coordinator.kafka import config as kafka_config

pytestmark = pytest.mark.integration


@pytest.fixture
def topic(kafka_bootstrap_servers: str) -> str:
    name = f"tc-{uuid.uuid4().hex[:8]}"
    admin = kafka_config.admin_client(kafka_bootstrap_servers)
    admin.create_topics([NewTopic(name, 1, 1)])[name].result()
    producer = kafka_config.producer(kafka_bootstrap_servers)
    for i in range(100):
        producer.produce(name, f"v{i}".encode(), partition=0)
    producer.flush(30)
    return name


def _task(servers: str) -> TaskOptions:
    return TaskOptions(table_uri="unused", job_id=uuid.uuid4().hex, checkpoint_id=1, epoch=1, operator_id="sink",
                       bootstrap_servers=servers, prefix="tc", checkpoint_dir="unused", batch_size=30)


def _offsets(batches) -> list[int]:
    return [o for b in batches for o in b.column("offset").to_pylist()]


def test_reads_reuse_one_consumer_and_read_exactly_their_ranges(kafka_bootstrap_servers, topic) -> None:
    clients.close_all()
    before = dict(clients.stats)
    task = _task(kafka_bootstrap_servers)
    assert _offsets(read_ranges(task, [[topic, 0, 10, 40]])) == list(range(10, 40))
    assert _offsets(read_ranges(task, [[topic, 0, 0, 5], [topic, 0, 90, 100]])) == [*range(5), *range(90, 100)]
    assert clients.stats["readers_created"] - before["readers_created"] == 1
    assert clients.stats["readers_lent"] - before["readers_lent"] == 2
    # a read abandoned half way (a failed task) closes its reader: the next read gets a new one
    batches = read_ranges(task, [[topic, 0, 0, 100]])
    next(batches)
    batches.close()
    assert _offsets(read_ranges(task, [[topic, 0, 50, 60]])) == list(range(50, 60))
    assert clients.stats["readers_created"] - before["readers_created"] == 2
    # other settings (another principal) never share a client
    other = TaskOptions(**{**task.__dict__, "consumer_overrides": {"client.id": "another"}})
    assert _offsets(read_ranges(other, [[topic, 0, 0, 3]])) == [0, 1, 2]
    assert clients.stats["readers_created"] - before["readers_created"] == 3
    clients.close_all()


def test_acks_share_one_producer_until_a_task_fails(kafka_bootstrap_servers) -> None:
    clients.close_all()
    job = uuid.uuid4().hex
    first = clients.ack_sender(kafka_bootstrap_servers, job, prefix="tc")
    assert clients.ack_sender(kafka_bootstrap_servers, job, prefix="tc") is first
    assert clients.ack_sender(kafka_bootstrap_servers, job, prefix="tc",
                              producer_overrides={"client.id": "x"}) is not first
    clients.discard_sender(first)
    assert clients.ack_sender(kafka_bootstrap_servers, job, prefix="tc") is not first
    clients.close_all()

"""Issue 44, item 2, on a real broker: a coordinator whose ``send_offsets_to_transaction`` hangs
(librdkafka issues 5456/5511) must never fence a coordinator of the same job started meanwhile
and then write from its memory. Run A hangs; run B of the same job is started as a plain run
(no standby: docs/operations.md's way to restart a job), fences A, and commits the consumer group
further; when A's stuck call times out, A's replacement producer may fence B, but A then reads
the log, finds B's newer epoch, and stops as fenced without writing: the group never moves back
and the log holds nothing of A's epoch after B's."""

from __future__ import annotations

import threading
import uuid

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic

from chandy.coordinator.environment import Batch, SourceOffsets
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka import log_writer
from chandy.coordinator.kafka.runtime import CoordinatorService
from tests.fixtures.workers import options, wait_for

pytestmark = pytest.mark.integration


class _HangingSendOffsets:
    """A transactional producer whose ``send_offsets_to_transaction`` blocks until released."""

    def __init__(self, producer) -> None:
        self._producer = producer
        self.released = threading.Event()
        self.hung = threading.Event()

    def send_offsets_to_transaction(self, *args, **kwargs) -> None:
        self.hung.set()
        self.released.wait(120)

    def __getattr__(self, name: str):
        return getattr(self._producer, name)


def _group_offset(servers: str, group: str, topic: str) -> int:
    consumer = kafka_config.consumer(servers, group_id=group)
    try:
        return consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
    finally:
        consumer.close()


def test_a_stuck_producers_replacement_never_writes_over_a_newer_run(
        kafka_bootstrap_servers, topic_prefix, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(log_writer, "SEND_OFFSETS_STUCK_S", 8.0)
    job, group, topic = uuid.uuid4().hex, f"g-{uuid.uuid4().hex[:8]}", f"{topic_prefix}-data"
    admin = kafka_config.admin_client(kafka_bootstrap_servers)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    consumer = kafka_config.consumer(kafka_bootstrap_servers, group_id=group)
    consumer.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)  # the group's coordinator is loaded
    consumer.close()
    a = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path), {"src": 1},
                           prefix=topic_prefix).start(periodic=False)
    b = None
    try:
        epoch_a = a.epoch
        assert a._writer is not None
        hanging = _HangingSendOffsets(a._writer.producer)
        a._writer.producer = hanging
        a._writer.submit(Batch(source_offsets=[SourceOffsets(group, ((topic, 0, 5),))]))  # A's stale commit
        assert hanging.hung.wait(10)
        # inside A's window: a plain run of the same job (it fences A's producer, replays, leads)
        b = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path), {"src": 1},
                               prefix=topic_prefix).start(periodic=False)
        assert b.epoch > epoch_a
        assert b._writer is not None
        committed = threading.Event()
        b._writer.submit(Batch(source_offsets=[SourceOffsets(group, ((topic, 0, 10),))]), committed.set)
        wait_for(lambda: _group_offset(kafka_bootstrap_servers, group, topic) == 10, what="B's offset commit")
        # A's stuck call times out: its replacement must find B's epoch and stop without writing
        wait_for(lambda: a.fenced.is_set(), timeout_s=60, what="A stopping as fenced")
        assert f"another coordinator of job {job} wrote to its log (the newest epoch record: epoch {b.epoch}, " \
               f"coordinator {b.coordinator.coordinator_id}; this one: epoch {epoch_a}" in str(a.stop_reason)
        hanging.released.set()
        assert _group_offset(kafka_bootstrap_servers, group, topic) == 10  # never moved back to A's 5
    finally:
        a.stop()
        if b is not None:
            b.stop()

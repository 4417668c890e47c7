"""Many subtask attempts in one process over one consumer and one producer (ParticipantHost, a
Flink TaskExecutor): checkpoints complete for 200 subtasks, one decline aborts the checkpoint for
all, and a new attempt of a subtask never sees triggers written before it registered."""

from __future__ import annotations

import threading
import uuid

import pytest

from chandy.coordinator.failure import CheckpointException
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.host import HostError, ParticipantHost
from chandy.coordinator.kafka.runtime import CoordinatorService
from chandy.coordinator.kafka.topics import ChandyTopics, ensure_topics
from chandy.coordinator.messages import StateHandle, TriggerCheckpoint
from chandy.schemas.codec import SingleObjectCodec
from tests.fixtures.workers import options, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def job() -> str:
    return uuid.uuid4().hex


class Recorder:
    """Callbacks of one hosted subtask: records triggers, completions and aborts."""

    def __init__(self, decline: set[int] | None = None, hold: set[int] | None = None) -> None:
        self.triggers: list[int] = []
        self.completed: list[int] = []
        self.aborted: list[int] = []
        self.decline = decline or set()
        self.hold = hold or set()
        self.holding = threading.Event()
        self.release = threading.Event()

    def snapshot(self, checkpoint_id: int, trigger: TriggerCheckpoint):
        self.triggers.append(checkpoint_id)
        if checkpoint_id in self.decline:
            raise RuntimeError("simulated snapshot failure")
        if checkpoint_id in self.hold:
            self.holding.set()
            self.release.wait(60)
        return [StateHandle("inline", None, f"state-{checkpoint_id}".encode(), 7)]

    def register(self, host: ParticipantHost, job: str, op: str, idx: int, attempt: int = 0, **kw):
        return host.register(job, op, idx, attempt, snapshot=self.snapshot, on_complete=self.completed.append,
                             on_aborted=self.aborted.append, **kw)


def test_two_hundred_subtasks_in_one_host_complete_checkpoints(kafka_bootstrap_servers, topic_prefix, job, tmp_path):
    service = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path), {"src": 150, "sink": 50},
                                 prefix=topic_prefix).start()
    host = ParticipantHost(kafka_bootstrap_servers, prefix=topic_prefix).start()
    recorders = {}
    try:
        now = host.control_end_offsets()
        for op, n in (("src", 150), ("sink", 50)):
            for i in range(n):
                recorders[op, i] = Recorder()
                recorders[op, i].register(host, job, op, i, report_ready=False, start_offsets=now)
        host.flush()
        assert host.subtasks() == 200
        for expected_id in (1, 2, 3):
            record = service.trigger_checkpoint().result(60)
            assert (record.checkpoint_id, record.status, record.num_acknowledged) == (expected_id, "COMPLETED", 200)
        wait_for(lambda: all(r.completed[-1:] == [3] for r in recorders.values()), what="notifications")
        assert all(r.triggers == [1, 2, 3] and r.completed == [1, 2, 3] for r in recorders.values())
        assert (tmp_path / "chk" / job / "chk-3" / "_metadata").exists()
    finally:
        host.close()
        service.stop()
    with pytest.raises(HostError):
        host.register(job, "src", 0)


def test_one_hosted_subtask_declining_aborts_the_checkpoint_for_all(kafka_bootstrap_servers, topic_prefix, job,
                                                                    tmp_path):
    service = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path, tolerable_failed=5), {"src": 20},
                                 prefix=topic_prefix).start()
    host = ParticipantHost(kafka_bootstrap_servers, prefix=topic_prefix).start()
    recorders = [Recorder(decline={1} if i == 7 else None) for i in range(20)]
    try:
        for i, r in enumerate(recorders):
            r.register(host, job, "src", i)
        with pytest.raises(CheckpointException) as raised:
            service.trigger_checkpoint().result(30)
        assert raised.value.reason.value == "CHECKPOINT_DECLINED" and "simulated snapshot failure" in str(raised.value)
        wait_for(lambda: all(r.aborted == [1] for r in recorders), what="abort notifications to every subtask")
        assert all(r.completed == [] for r in recorders)
        # the next checkpoint completes with every subtask
        record = service.trigger_checkpoint().result(30)
        assert (record.checkpoint_id, record.status, record.num_acknowledged) == (2, "COMPLETED", 20)
        wait_for(lambda: all(r.completed == [2] for r in recorders), what="completion notifications")
    finally:
        host.close()
        service.stop()


def test_a_new_attempt_of_a_subtask_drops_triggers_written_before_it_registered(kafka_bootstrap_servers,
                                                                                topic_prefix, job):
    topics = ChandyTopics(topic_prefix)
    ensure_topics(kafka_config.admin_client(kafka_bootstrap_servers), topics)
    codec = SingleObjectCodec()
    producer = kafka_config.producer(kafka_bootstrap_servers)

    def trigger(checkpoint_id: int) -> None:
        message = TriggerCheckpoint(job, 1, checkpoint_id, 0)
        producer.produce(topics.control, codec.encode(message.SCHEMA, message.to_avro(), topic=topics.control),
                         job.encode())
        assert producer.flush(30) == 0

    host = ParticipantHost(kafka_bootstrap_servers, prefix=topic_prefix).start()
    first, other, second = Recorder(hold={1}), Recorder(), Recorder()
    try:
        old_slot = first.register(host, job, "src", 0, attempt=0)
        other.register(host, job, "src", 1)
        trigger(1)
        assert first.holding.wait(30)  # the host thread is inside attempt 0's snapshot of checkpoint 1
        trigger(2)  # in the topic, not yet dispatched
        new_slot = second.register(host, job, "src", 0, attempt=1)
        first.release.set()
        trigger(3)
        wait_for(lambda: second.triggers == [3] and other.triggers == [1, 2, 3], what="trigger 3")
        assert first.triggers == [1]  # the replaced attempt gets nothing more
        assert new_slot.dropped_before_registration == 1  # trigger 2 was written before attempt 1 registered
        assert not old_slot.active and new_slot.active
        assert host.subtasks() == 2
    finally:
        first.release.set()
        host.close()

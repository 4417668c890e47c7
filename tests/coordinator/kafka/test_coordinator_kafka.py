"""The coordinator over a real Apache Kafka broker: checkpoints end to end with worker
participants, declines, public events, bad messages, epochs, fencing, SIGKILL and restart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from chandy.coordinator.completed_checkpoint_store import CompletedCheckpointStore
from chandy.coordinator.failure import CheckpointException
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.log import load_state, read_log
from chandy.coordinator.kafka.runtime import CoordinatorService
from chandy.coordinator.kafka.topics import ChandyTopics
from chandy.coordinator.messages import TriggerCheckpoint
from chandy.coordinator.options import CheckpointingOptions
from chandy.coordinator.records import CheckpointRecord, CoordinatorEpochRecord
from chandy.schemas.codec import SingleObjectCodec
from tests.fixtures import REPO_ROOT
from tests.fixtures.workers import Worker, options, read_events, wait_for
from tests.procs.common import RecordingHook

pytestmark = pytest.mark.integration

ROOT = REPO_ROOT


@pytest.fixture
def job() -> str:
    return uuid.uuid4().hex


def test_checkpoints_complete_over_kafka_and_workers_are_notified(kafka_bootstrap_servers, topic_prefix, job, tmp_path):
    service = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path), {"src": 2, "sink": 1},
                                 prefix=topic_prefix).start()
    workers = [Worker(kafka_bootstrap_servers, job, topic_prefix, op, i).start()
               for op, i in (("src", 0), ("src", 1), ("sink", 0))]
    try:
        for expected_id in (1, 2, 3):
            record = service.trigger_checkpoint().result(30)
            assert (record.checkpoint_id, record.status, record.num_acknowledged) == (expected_id, "COMPLETED", 3)
        wait_for(lambda: all(w.completed[-1:] == [3] for w in workers), what="notifications")
        assert all(w.completed == [1, 2, 3] for w in workers)
        assert all(t.epoch == 1 for w in workers for t in w.triggers)
        assert (tmp_path / "chk" / job / "chk-3" / "_metadata").exists()
        # the live state equals a replay of the log written so far
        live = service.snapshot_state()
        replayed, load_stats = load_state(kafka_bootstrap_servers, ChandyTopics(topic_prefix).coordinator_log, job)
        # the load reads every record and applies only the newest of each key (as compaction would)
        assert replayed.equals_ignoring_counters(live)
        assert load_stats.read == live.records_applied and load_stats.applied < load_stats.read
        stats = service.stats()
        assert stats["counts"]["completed"] == 3
        assert stats["latest"]["completed"]["num_acknowledged_subtasks"] == 3
    finally:
        for w in workers:
            w.close()
        service.stop()
    events = read_events(kafka_bootstrap_servers, ChandyTopics(topic_prefix).checkpoint_events, job, 6)
    assert [(e.checkpoint_id, e.event_type) for e in events] == [
        (1, "TRIGGERED"), (1, "COMPLETED"), (2, "TRIGGERED"), (2, "COMPLETED"), (3, "TRIGGERED"), (3, "COMPLETED")]
    assert events[1].num_acknowledged == 3 and events[1].state_size == 21 and events[1].end_to_end_duration_ms >= 0


def test_a_decline_aborts_and_workers_hear_of_it_and_savepoints_complete(kafka_bootstrap_servers, topic_prefix, job, tmp_path):
    service = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path, tolerable_failed=5), {"src": 2},
                                 prefix=topic_prefix).start()
    workers = [Worker(kafka_bootstrap_servers, job, topic_prefix, "src", 0, decline={1}).start(),
               Worker(kafka_bootstrap_servers, job, topic_prefix, "src", 1).start()]
    try:
        with pytest.raises(CheckpointException) as raised:
            service.trigger_checkpoint().result(30)
        assert raised.value.reason.value == "CHECKPOINT_DECLINED" and "simulated snapshot failure" in str(raised.value)
        wait_for(lambda: all(w.aborted == [1] for w in workers), what="abort notifications")
        pointer = service.trigger_savepoint().result(30)
        assert Path(pointer.removeprefix("file://")).name.startswith(f"savepoint-{job[:6]}-")
        assert (Path(pointer.removeprefix("file://")) / "_metadata").exists()
    finally:
        for w in workers:
            w.close()
        service.stop()
    events = read_events(kafka_bootstrap_servers, ChandyTopics(topic_prefix).checkpoint_events, job, 4)
    assert [(e.checkpoint_id, e.event_type) for e in events] == [
        (1, "TRIGGERED"), (1, "ABORTED"), (2, "TRIGGERED"), (2, "SAVEPOINT_COMPLETED")]
    assert events[1].failure_reason == "CHECKPOINT_DECLINED" and events[3].external_pointer == pointer


def test_bad_bytes_on_the_acks_topic_are_skipped_and_the_coordinator_goes_on(kafka_bootstrap_servers, topic_prefix, job, tmp_path):
    dlq = f"{topic_prefix}.dlq"
    from confluent_kafka.admin import NewTopic

    admin = kafka_config.admin_client(kafka_bootstrap_servers)
    admin.create_topics([NewTopic(dlq, 1, 1)])[dlq].result()
    service = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path), {"src": 1}, prefix=topic_prefix,
                                 dead_letter_topic=dlq).start()
    worker = Worker(kafka_bootstrap_servers, job, topic_prefix, "src", 0).start()
    try:
        producer = kafka_config.producer(kafka_bootstrap_servers)
        for garbage in (b"\xc3\x01\x00", b"not avro at all", b"\xc3\x01" + b"\x99" * 20):
            producer.produce(ChandyTopics(topic_prefix).acks, garbage, job.encode())
        producer.flush(10)
        wait_for(lambda: service._acks.bad_messages == 3, what="bad messages counted")
        assert service.trigger_checkpoint().result(30).status == "COMPLETED"
        consumer = kafka_config.consumer(kafka_bootstrap_servers)
        consumer.assign([TopicPartition(dlq, 0, 0)])
        copied = []
        wait_for(lambda: copied.append(consumer.poll(0.2)) or len([m for m in copied if m and not m.error()]) == 3,
                 what="dead letters")
        consumer.close()
    finally:
        worker.close()
        service.stop()


def test_workers_drop_control_messages_of_an_older_epoch(kafka_bootstrap_servers, topic_prefix, job, tmp_path):
    from chandy.coordinator.kafka.topics import TopicError, ensure_topics

    with pytest.raises(TopicError, match="does not exist"):
        Worker(kafka_bootstrap_servers, job, topic_prefix, "src", 0).start()
    ensure_topics(kafka_config.admin_client(kafka_bootstrap_servers), ChandyTopics(topic_prefix))
    worker = Worker(kafka_bootstrap_servers, job, topic_prefix, "src", 0).start()
    codec = SingleObjectCodec()
    producer = kafka_config.producer(kafka_bootstrap_servers)
    control = ChandyTopics(topic_prefix).control
    try:
        for epoch, checkpoint_id in ((2, 10), (1, 11), (2, 12)):
            trigger = TriggerCheckpoint(job, epoch, checkpoint_id, 0)
            producer.produce(control, codec.encode(trigger.SCHEMA, trigger.to_avro()), job.encode())
        producer.flush(10)
        wait_for(lambda: len(worker.triggers) == 2, what="triggers")
        time.sleep(0.3)
        assert [t.checkpoint_id for t in worker.triggers] == [10, 12]
        assert worker.participant.dropped_stale == 1
    finally:
        worker.close()


def test_a_second_coordinator_fences_the_first(kafka_bootstrap_servers, topic_prefix, job, tmp_path):
    first = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path), {"src": 1}, prefix=topic_prefix).start()
    worker = Worker(kafka_bootstrap_servers, job, topic_prefix, "src", 0).start()
    try:
        assert first.trigger_checkpoint().result(30).checkpoint_id == 1
        second = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path), {"src": 1}, prefix=topic_prefix).start()
        assert second.coordinator.epoch == 2
        # the first tries to write and finds itself fenced: it stops and writes nothing more
        try:
            first.trigger_checkpoint()
        except Exception:  # noqa: BLE001 - it may already have stopped
            pass
        wait_for(first.stopped.is_set, what="the first coordinator to stop")
        assert first.fenced.is_set()
        assert second.trigger_checkpoint().result(30).checkpoint_id == 2
        logged = list(read_log(kafka_bootstrap_servers, ChandyTopics(topic_prefix).coordinator_log, job_id=job))
        epoch_2_at = next(i for i, r in enumerate(logged) if isinstance(r.record, CoordinatorEpochRecord) and r.record.epoch == 2)
        after = [r.record for r in logged[epoch_2_at:]]
        assert all(getattr(r, "epoch", 2) == 2 for r in after), "the fenced coordinator wrote after the new epoch"
        assert not any(isinstance(r, CheckpointRecord) and r.epoch == 1 and r.checkpoint_id >= 2 for r in after)
        second.stop()
    finally:
        worker.close()
        first.stop()


def test_sigkill_mid_checkpoint_then_restart_aborts_it_restores_and_continues_ids(
        kafka_bootstrap_servers, topic_prefix, job, tmp_path):
    from chandy.coordinator.kafka.topics import ensure_topics

    checkpoint_dir = f"file://{tmp_path}/chk"
    ensure_topics(kafka_config.admin_client(kafka_bootstrap_servers), ChandyTopics(topic_prefix))
    worker = Worker(kafka_bootstrap_servers, job, topic_prefix, "src", 0, hold={3}).start()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.procs.run_coordinator", kafka_bootstrap_servers, job, topic_prefix,
         checkpoint_dir, "200", "src=1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        assert json.loads(process.stdout.readline())["started"]
        # checkpoints 1 and 2 complete; 3 is triggered and held by the worker: mid-checkpoint
        wait_for(lambda: any(t.checkpoint_id == 3 for t in worker.triggers), what="checkpoint 3 triggered")
        wait_for(lambda: worker.completed[-1:] == [2], what="checkpoint 2 completed")
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
    finally:
        if process.poll() is None:
            process.kill()
    worker.release.set()  # the ack for 3 now goes to a dead coordinator
    hook = RecordingHook()
    service = CoordinatorService(
        job, kafka_bootstrap_servers, CheckpointingOptions(interval_ms=0, checkpoint_dir=checkpoint_dir),
        {"src": 1}, master_hooks=[hook], prefix=topic_prefix).start(periodic=False)
    try:
        state = service.snapshot_state()
        assert state.epoch == 2
        assert state.checkpoints[3].status == "ABORTED"
        assert state.checkpoints[3].failure_reason == "CHECKPOINT_COORDINATOR_SHUTDOWN"
        assert CompletedCheckpointStore.latest(state).checkpoint_id == 2
        assert hook.restored == [(2, {"checkpoint": 2})] and hook.resets == 0
        # the restored checkpoint's completion is notified again, under the new epoch
        wait_for(lambda: worker.completed[-1:] == [2] and len(worker.completed) >= 3, what="re-notification")
        assert 3 in worker.aborted
        record = service.trigger_checkpoint().result(30)
        assert record.checkpoint_id == 4  # no ID reused
        assert not (tmp_path / "chk" / job / "chk-3").exists()
    finally:
        worker.close()
        service.stop()


def test_loading_an_empty_or_marker_ended_log_does_not_hang(kafka_bootstrap_servers, topic_prefix, job, tmp_path):
    from chandy.coordinator.kafka.topics import ensure_topics

    topics = ChandyTopics(topic_prefix)
    ensure_topics(kafka_config.admin_client(kafka_bootstrap_servers), topics)
    started = time.monotonic()
    state, stats = load_state(kafka_bootstrap_servers, topics.coordinator_log, job, timeout_s=10)
    assert stats.applied == 0 and state.next_checkpoint_id == 1
    assert time.monotonic() - started < 10
    # an aborted transaction leaves only a marker at the end of the partition
    producer = kafka_config.producer(kafka_bootstrap_servers, transactional_id=f"t-{job}")
    producer.init_transactions(10)
    producer.begin_transaction()
    from chandy.coordinator.kafka.log import partition_for

    count = len(kafka_config.admin_client(kafka_bootstrap_servers).list_topics(topics.coordinator_log, timeout=10)
                .topics[topics.coordinator_log].partitions)
    producer.produce(topics.coordinator_log, b"never committed", b"k", partition=partition_for(job, count))  # the job's partition
    producer.flush(10)
    producer.abort_transaction(10)
    # the broker writes the abort marker after EndTxn returns: wait until the partition holds it
    consumer = kafka_config.consumer(kafka_bootstrap_servers)
    deadline = time.monotonic() + 10
    while consumer.get_watermark_offsets(TopicPartition(topics.coordinator_log, partition_for(job, count)),
                                         timeout=5, cached=False)[1] < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    consumer.close()
    started = time.monotonic()
    state, stats = load_state(kafka_bootstrap_servers, topics.coordinator_log, job, timeout_s=10)
    assert stats.applied == 0 and stats.end_offset >= 2
    assert time.monotonic() - started < 10


def test_loading_decodes_only_the_newest_record_of_each_key(kafka_bootstrap_servers, topic_prefix, job):
    """load_state reads as compaction would leave the log: a superseded record is never decoded
    (even unreadable bytes), and the newest one of each key is (an unreadable newest one fails)."""
    from chandy.coordinator.kafka.log import LogRecordCorruptError, encode_record, partition_for
    from chandy.coordinator.kafka.topics import ensure_topics
    from chandy.coordinator.records import Tombstone

    topics = ChandyTopics(topic_prefix)
    admin = kafka_config.admin_client(kafka_bootstrap_servers)
    ensure_topics(admin, topics)
    partitions = len(admin.list_topics(topics.coordinator_log, timeout=10).topics[topics.coordinator_log].partitions)
    partition = partition_for(job, partitions)
    codec = SingleObjectCodec()
    producer = kafka_config.producer(kafka_bootstrap_servers)

    def checkpoint(checkpoint_id: int, status: str) -> CheckpointRecord:
        return CheckpointRecord(job, checkpoint_id, "CHECKPOINT", status, 1, 1_000, 2_000, 2,
                                2 if status == "COMPLETED" else 0, 10,
                                f"file:///chk/chk-{checkpoint_id}" if status == "COMPLETED" else None)

    def send(key: bytes, value: bytes | None) -> None:
        producer.produce(topics.coordinator_log, value, key, partition=partition)

    key_1, _ = encode_record(codec, checkpoint(1, "PENDING"))
    send(key_1, b"\x00 not an Avro record")          # superseded below: never decoded
    send(*encode_record(codec, checkpoint(1, "COMPLETED")))
    send(*encode_record(codec, checkpoint(2, "PENDING")))
    send(*encode_record(codec, Tombstone(checkpoint(2, "PENDING").key())))  # checkpoint 2 deleted
    send(*encode_record(codec, CoordinatorEpochRecord(job, 3, "coordinator-x", "host-a", 5_000)))
    producer.flush(10)
    state, stats = load_state(kafka_bootstrap_servers, topics.coordinator_log, job, timeout_s=10)
    assert (stats.read, stats.applied, stats.tombstones) == (5, 2, 1)
    assert sorted(state.checkpoints) == [1] and state.checkpoints[1].status == "COMPLETED"
    assert state.epoch == 3 and state.next_checkpoint_id == 2

    send(*encode_record(codec, checkpoint(3, "PENDING"))[:1], b"\x00 unreadable newest")
    producer.flush(10)
    with pytest.raises(LogRecordCorruptError, match="cannot be read"):
        load_state(kafka_bootstrap_servers, topics.coordinator_log, job, timeout_s=10)

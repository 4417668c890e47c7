"""Recovery on a real broker, as Flink 1.15+ and Kafka's coordinator loader: a restart restores
the latest checkpoint and never a later intermediate savepoint; an ID a master hook has seen is
never handed out again, even after a SIGKILL at that very moment; a log record that cannot be
read fails the load, one of an unknown kind is skipped.

Run as a module, it is the coordinator process the SIGKILL test starts:
``python -m tests.coordinator.kafka.test_coordinator_recovery_kafka BOOTSTRAP JOB PREFIX CHECKPOINT_DIR SEEN_FILE``.
"""

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

from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.log import (
    KEY_SCHEMA,
    LoadStats,
    LogRecordCorruptError,
    partition_for,
    read_log,
)
from chandy.coordinator.kafka.runtime import CoordinatorService
from chandy.coordinator.kafka.topics import ChandyTopics, ensure_topics
from chandy.coordinator.options import CheckpointingOptions
from chandy.coordinator.records import LogKey
from chandy.schemas.codec import SingleObjectCodec
from tests.fixtures import REPO_ROOT
from tests.fixtures.workers import Worker, options, wait_for
from tests.procs.common import RecordingHook

pytestmark = pytest.mark.integration

ROOT = REPO_ROOT


@pytest.fixture
def job() -> str:
    return uuid.uuid4().hex


def test_restart_restores_the_checkpoint_not_a_later_intermediate_savepoint(
        kafka_bootstrap_servers, topic_prefix, job, tmp_path):
    service = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path), {"src": 1},
                                 master_hooks=[RecordingHook()], prefix=topic_prefix).start(periodic=False)
    worker = Worker(kafka_bootstrap_servers, job, topic_prefix, "src", 0).start()
    try:
        assert service.trigger_checkpoint().result(30).checkpoint_id == 1
        savepoint = service.trigger_savepoint()
        assert savepoint.checkpoint_id == 2
        assert Path(savepoint.result(30).removeprefix("file://"), "_metadata").exists()
        wait_for(lambda: worker.completed == [1], what="notification of checkpoint 1")
        time.sleep(0.5)
        assert worker.completed == [1]  # the intermediate savepoint notified no one
    finally:
        service.stop()
    hook = RecordingHook()
    restarted = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path), {"src": 1},
                                   master_hooks=[hook], prefix=topic_prefix).start(periodic=False)
    try:
        assert hook.restored == [(1, {"checkpoint": 1})]
        wait_for(lambda: worker.completed == [1, 1], what="re-notification of checkpoint 1")
        assert restarted.trigger_checkpoint().result(30).checkpoint_id == 3
    finally:
        worker.close()
        restarted.stop()


class KillingHook(RecordingHook):
    """Writes the checkpoint ID it is given to a file, then SIGKILLs its own process: the ID has
    reached an external system, and the coordinator dies before the trigger goes out."""

    def __init__(self, seen_file: str) -> None:
        super().__init__()
        self.seen_file = seen_file

    def trigger_checkpoint(self, checkpoint_id, timestamp, executor):
        with open(self.seen_file, "a", encoding="utf-8") as out:
            out.write(f"{checkpoint_id}\n")
            out.flush()
            os.fsync(out.fileno())
        os.kill(os.getpid(), signal.SIGKILL)


def _child() -> None:
    bootstrap, job_id, prefix, checkpoint_dir, seen_file = sys.argv[1:6]
    service = CoordinatorService(
        job_id, bootstrap, CheckpointingOptions(interval_ms=0, checkpoint_dir=checkpoint_dir), {"src": 1},
        master_hooks=[KillingHook(seen_file)], prefix=prefix).start(periodic=False)
    Worker(bootstrap, job_id, prefix, "src", 0).start()  # the subtask runs: triggers wait for it
    print(json.dumps({"started": True}), flush=True)
    service.trigger_checkpoint()
    time.sleep(60)


def test_an_id_a_hook_has_seen_is_never_handed_out_again_after_sigkill(
        kafka_bootstrap_servers, topic_prefix, job, tmp_path):
    ensure_topics(kafka_config.admin_client(kafka_bootstrap_servers), ChandyTopics(topic_prefix))
    checkpoint_dir = f"file://{tmp_path}/chk"
    seen_file = tmp_path / "seen"
    for _ in range(2):  # twice: the second restart starts from a log the first restart wrote
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.coordinator.kafka.test_coordinator_recovery_kafka", kafka_bootstrap_servers, job, topic_prefix,
             checkpoint_dir, str(seen_file)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            assert json.loads(process.stdout.readline())["started"]
            assert process.wait(60) == -signal.SIGKILL
        finally:
            if process.poll() is None:
                process.kill()
    seen = [int(line) for line in seen_file.read_text().split()]
    assert len(seen) == 2 and seen[1] > seen[0]
    hook = RecordingHook()
    service = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path), {"src": 1}, master_hooks=[hook],
                                 prefix=topic_prefix).start(periodic=False)
    worker = Worker(kafka_bootstrap_servers, job, topic_prefix, "src", 0).start()
    try:
        state = service.snapshot_state()
        assert all(state.checkpoints[i].status == "ABORTED" for i in seen)
        result = service.trigger_checkpoint()
        assert result.checkpoint_id not in seen and result.checkpoint_id > max(seen)
        assert result.result(30).checkpoint_id == result.checkpoint_id
        assert {t.checkpoint_id for t in worker.triggers}.isdisjoint(seen)
    finally:
        worker.close()
        service.stop()


def _produce_raw(servers: str, prefix: str, job: str, kind: str, value: bytes) -> None:
    topics = ChandyTopics(prefix)
    admin = kafka_config.admin_client(servers)
    ensure_topics(admin, topics)
    partitions = len(admin.list_topics(topics.coordinator_log, timeout=10).topics[topics.coordinator_log].partitions)
    codec = SingleObjectCodec()
    key = codec.encode(KEY_SCHEMA, LogKey(job, kind, "1").to_avro())
    producer = kafka_config.producer(servers)
    producer.produce(topics.coordinator_log, value, key, partition=partition_for(job, partitions))
    producer.flush(10)


def test_a_record_that_cannot_be_read_fails_the_load_but_replay_skips_and_reports_it(
        kafka_bootstrap_servers, topic_prefix, job, tmp_path):
    service = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path), {"src": 1},
                                 prefix=topic_prefix).start(periodic=False)
    worker = Worker(kafka_bootstrap_servers, job, topic_prefix, "src", 0).start()
    try:
        assert service.trigger_checkpoint().result(30).checkpoint_id == 1
    finally:
        worker.close()
        service.stop()
    # a corrupt value under a known kind: skipping it could restore an older checkpoint
    _produce_raw(kafka_bootstrap_servers, topic_prefix, job, "checkpoint", b"\xc3\x01" + b"\x99" * 20)
    restarted = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path), {"src": 1}, prefix=topic_prefix)
    try:
        with pytest.raises(LogRecordCorruptError, match="cannot be read"):
            restarted.start(periodic=False)
    finally:
        restarted.stop()
    stats = LoadStats()
    records = list(read_log(kafka_bootstrap_servers, ChandyTopics(topic_prefix).coordinator_log, job_id=job,
                            stats=stats))
    assert records and stats.skipped_bad == 1  # chandy log replay: lenient, and it says what it skipped


def test_a_record_of_an_unknown_kind_is_skipped_with_a_warning(kafka_bootstrap_servers, topic_prefix, job, tmp_path,
                                                              caplog):
    _produce_raw(kafka_bootstrap_servers, topic_prefix, job, "from-the-future", b"\xc3\x01" + b"\x42" * 20)
    service = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path), {"src": 1},
                                 prefix=topic_prefix).start(periodic=False)
    try:
        assert service.load_stats.skipped_unknown == 1
        assert "unknown kind 'from-the-future'" in caplog.text
    finally:
        service.stop()


if __name__ == "__main__":
    _child()

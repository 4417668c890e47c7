"""Control requests over Kafka on a real broker: trigger checkpoint, trigger savepoint, stop with
savepoint, cancel; at-most-once application (sent twice, and across a SIGKILL of the coordinator);
the CLI; and a standby that takes over when the active coordinator is killed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest

from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.requests import (
    ControlRequest,
    ControlRequestType,
    JobNotRunningError,
    RequestRecord,
    RequestStatus,
    send_request,
)
from chandy.coordinator.kafka.runtime import CoordinatorService
from chandy.coordinator.kafka.topics import ChandyTopics, ensure_topics
from chandy.coordinator.records import CheckpointStatus, JobStatus
from chandy.schemas.codec import SingleObjectCodec
from tests.fixtures import REPO_ROOT
from tests.fixtures.workers import Worker, options, read_events, wait_for

pytestmark = pytest.mark.integration

ROOT = REPO_ROOT
T = ControlRequestType


@pytest.fixture
def job() -> str:
    return uuid.uuid4().hex


@pytest.fixture
def running(kafka_bootstrap_servers, topic_prefix, job, tmp_path):
    """A coordinator of ``job`` with one worker subtask, both on the real broker."""
    service = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path), {"src": 1},
                                 prefix=topic_prefix).start(periodic=False)
    worker = Worker(kafka_bootstrap_servers, job, topic_prefix, "src", 0).start()
    yield service, worker
    worker.close()
    service.stop()


def _send(servers: str, prefix: str, job: str, kind: ControlRequestType, **kw):
    return send_request(servers, job, kind, prefix=prefix, timeout_s=60, **kw)


def test_a_checkpoint_request_is_answered_with_the_completed_checkpoint(kafka_bootstrap_servers, topic_prefix, job,
                                                                        running) -> None:
    service, worker = running
    accepted = []
    answer = _send(kafka_bootstrap_servers, topic_prefix, job, T.TRIGGER_CHECKPOINT,
                   on_accepted=lambda: accepted.append(True))
    assert answer.status is RequestStatus.COMPLETED, answer.failure_message
    assert accepted == [True]
    assert answer.checkpoint_id == 1 and answer.external_pointer and answer.external_pointer.endswith("chk-1")
    wait_for(lambda: worker.completed == [1], what="the worker notified of checkpoint 1")
    record = service.snapshot_state().records_of(RequestRecord.KIND)[answer.request_id]
    assert (record.status, record.checkpoint_id) == (RequestStatus.COMPLETED, 1)
    print(f"request round trip: {answer.round_trip_ms:.0f} ms")


def test_a_savepoint_request_writes_to_the_target_directory_and_a_resent_request_is_not_applied_twice(
        kafka_bootstrap_servers, topic_prefix, job, running, tmp_path) -> None:
    service, worker = running
    target = f"file://{tmp_path}/my-savepoints"
    first = _send(kafka_bootstrap_servers, topic_prefix, job, T.TRIGGER_SAVEPOINT, target_directory=target,
                  request_id="sp-request-1")
    assert first.status is RequestStatus.COMPLETED, first.failure_message
    assert first.external_pointer.startswith(target) and os.path.exists(first.external_pointer[len("file://"):]
                                                                        + "/_metadata")
    again = _send(kafka_bootstrap_servers, topic_prefix, job, T.TRIGGER_SAVEPOINT, target_directory=target,
                  request_id="sp-request-1")
    assert (again.status, again.checkpoint_id, again.external_pointer) == (
        RequestStatus.COMPLETED, first.checkpoint_id, first.external_pointer)
    state = service.snapshot_state()
    assert [c.checkpoint_id for c in state.completed(savepoints=True)] == [first.checkpoint_id]  # one savepoint
    assert service.requests is not None and service.requests.applied == 1 and service.requests.answered_again == 1
    assert worker.completed == []  # an intermediate savepoint notifies no one (Flink 1.15+)


def test_stop_with_savepoint_finishes_the_job_and_a_later_request_is_refused(
        kafka_bootstrap_servers, topic_prefix, job, running) -> None:
    service, worker = running
    answer = _send(kafka_bootstrap_servers, topic_prefix, job, T.STOP_WITH_SAVEPOINT)
    assert answer.status is RequestStatus.COMPLETED, answer.failure_message
    wait_for(lambda: worker.completed == [answer.checkpoint_id], what="the stop-with-savepoint notification")
    assert service.snapshot_state().job_status is JobStatus.FINISHED
    refused = _send(kafka_bootstrap_servers, topic_prefix, job, T.TRIGGER_CHECKPOINT)
    assert refused.status is RequestStatus.FAILED and "FINISHED, not RUNNING" in refused.failure_message
    topic = ChandyTopics(topic_prefix).checkpoint_events
    changes = wait_for(lambda: [e.job_status for e in read_events(kafka_bootstrap_servers, topic, job, expected=100,
                                                                  timeout_s=2) if e.event_type == "JOB_STATUS_CHANGED"],
                       what="the JOB_STATUS_CHANGED event")
    assert changes == ["FINISHED"]


def test_cancel_aborts_the_pending_checkpoint_and_the_job_is_canceled(kafka_bootstrap_servers, topic_prefix, job,
                                                                      tmp_path) -> None:
    service = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path), {"src": 1},
                                 prefix=topic_prefix).start(periodic=False)
    worker = Worker(kafka_bootstrap_servers, job, topic_prefix, "src", 0, hold={1}).start()
    try:
        pending = service.trigger_checkpoint()
        wait_for(lambda: worker.triggers, what="the trigger of checkpoint 1")
        answer = _send(kafka_bootstrap_servers, topic_prefix, job, T.CANCEL)
        assert answer.status is RequestStatus.COMPLETED, answer.failure_message
        with pytest.raises(Exception, match="canceled|CANCELED|shut"):
            pending.future.result(10)
        state = service.snapshot_state()
        assert state.job_status is JobStatus.CANCELED
        assert state.checkpoints[1].status is CheckpointStatus.ABORTED
    finally:
        worker.close()
        service.stop()


def test_expired_requests_are_skipped_and_unsupported_ones_refused_with_a_reason(
        kafka_bootstrap_servers, topic_prefix, job, running) -> None:
    service, _ = running
    native = _send(kafka_bootstrap_servers, topic_prefix, job, T.TRIGGER_SAVEPOINT)
    assert native.status is RequestStatus.COMPLETED
    producer = kafka_config.producer(kafka_bootstrap_servers)
    codec = SingleObjectCodec()
    now = int(time.time() * 1000)
    for request in (
        ControlRequest("expired", job, T.TRIGGER_CHECKPOINT, timestamp=now - 10_000, deadline=now - 5_000),
        ControlRequest("native", job, T.TRIGGER_SAVEPOINT, savepoint_format="NATIVE", timestamp=now,
                       deadline=now + 60_000),
    ):
        producer.produce(ChandyTopics(topic_prefix).requests, codec.encode(ControlRequest.SCHEMA, request.to_avro()),
                         job.encode())
    producer.flush(10)
    records = wait_for(lambda: (lambda r: r if "native" in r else None)(
        service.snapshot_state().records_of(RequestRecord.KIND)), what="the refusal in the log")
    assert records["native"].status is RequestStatus.FAILED and "NATIVE" in records["native"].failure_message
    wait_for(lambda: service.requests is not None and service.requests.expired == 1, what="the expired request skipped")
    assert "expired" not in service.snapshot_state().records_of(RequestRecord.KIND)  # not applied, not recorded
    assert len(service.snapshot_state().completed(savepoints=True)) == 1  # neither took a savepoint
    assert 2 not in service.snapshot_state().checkpoints


def test_a_request_to_a_job_that_is_not_running_fails_at_once(kafka_bootstrap_servers, topic_prefix, job) -> None:
    ensure_topics(kafka_config.admin_client(kafka_bootstrap_servers), ChandyTopics(topic_prefix))
    started = time.monotonic()
    with pytest.raises(JobNotRunningError, match=f"job {job} is not running"):
        _send(kafka_bootstrap_servers, topic_prefix, job, T.TRIGGER_SAVEPOINT)
    assert time.monotonic() - started < 30  # a clear error, not a wait for the answer timeout


def _coordinator_process(servers: str, job: str, prefix: str, checkpoint_dir: str) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.procs.run_coordinator", servers, job, prefix, checkpoint_dir, "0", "src=1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert json.loads(process.stdout.readline())["started"]
    return process


def test_a_request_accepted_before_a_sigkill_is_never_applied_again(kafka_bootstrap_servers, topic_prefix, job,
                                                                    tmp_path) -> None:
    process = _coordinator_process(kafka_bootstrap_servers, job, topic_prefix, f"file://{tmp_path}/chk")
    worker = Worker(kafka_bootstrap_servers, job, topic_prefix, "src", 0, hold={1}).start()
    try:
        accepted = threading.Event()

        def send() -> None:
            try:
                _send(kafka_bootstrap_servers, topic_prefix, job, T.TRIGGER_CHECKPOINT, request_id="held",
                      on_accepted=accepted.set)
            except Exception:  # noqa: BLE001 - the coordinator is killed before it answers
                pass

        threading.Thread(target=send, daemon=True).start()
        assert accepted.wait(30) and wait_for(lambda: worker.triggers, what="the held trigger")
        process.send_signal(signal.SIGKILL)
        process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
        worker.close()
    service = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path), {"src": 1},
                                 prefix=topic_prefix).start(periodic=False)
    worker = Worker(kafka_bootstrap_servers, job, topic_prefix, "src", 0).start()
    try:
        again = _send(kafka_bootstrap_servers, topic_prefix, job, T.TRIGGER_CHECKPOINT, request_id="held")
        assert again.status is RequestStatus.FAILED and "not applied again" in again.failure_message
        state = service.snapshot_state()
        assert state.checkpoints[1].status is CheckpointStatus.ABORTED  # aborted by the restart
        assert 2 not in state.checkpoints  # the resent request took no checkpoint
        fresh = _send(kafka_bootstrap_servers, topic_prefix, job, T.TRIGGER_CHECKPOINT)
        assert fresh.status is RequestStatus.COMPLETED and fresh.checkpoint_id == 2
    finally:
        worker.close()
        service.stop()


def test_a_standby_takes_over_when_the_active_coordinator_is_killed(kafka_bootstrap_servers, topic_prefix, job,
                                                                    tmp_path) -> None:
    process = _coordinator_process(kafka_bootstrap_servers, job, topic_prefix, f"file://{tmp_path}/chk")
    standby = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path), {"src": 1}, prefix=topic_prefix,
                                 standby=True)
    started = threading.Event()
    errors: list[BaseException] = []

    def run_standby() -> None:
        try:
            standby.start(periodic=False)
            started.set()
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threading.Thread(target=run_standby, daemon=True).start()
    worker = Worker(kafka_bootstrap_servers, job, topic_prefix, "src", 0).start()
    try:
        first = _send(kafka_bootstrap_servers, topic_prefix, job, T.TRIGGER_CHECKPOINT)
        assert first.status is RequestStatus.COMPLETED and first.checkpoint_id == 1
        assert not started.is_set() and not errors  # the standby waits while the active one lives
        killed = time.monotonic()
        process.send_signal(signal.SIGKILL)
        assert started.wait(60), errors
        print(f"take-over after SIGKILL: {time.monotonic() - killed:.1f} s")
        assert standby.epoch == 2  # the standby fenced the dead leader
        second = _send(kafka_bootstrap_servers, topic_prefix, job, T.TRIGGER_CHECKPOINT)
        assert second.status is RequestStatus.COMPLETED and second.checkpoint_id == 2
        wait_for(lambda: 2 in worker.completed, what="the worker notified by the new leader")
    finally:
        if process.poll() is None:
            process.kill()
        worker.close()
        standby.stop()


def test_the_cli_triggers_a_savepoint_and_lists_the_job(kafka_bootstrap_servers, topic_prefix, job, running,
                                                        tmp_path) -> None:
    cli = [sys.executable, "-m", "chandy.cli"]
    env = {**os.environ, "CHANDY_BOOTSTRAP_SERVERS": kafka_bootstrap_servers}
    done = subprocess.run([*cli, "savepoint", "trigger", "--job", job, "--prefix", topic_prefix, "--dir",
                           f"file://{tmp_path}/cli-sp"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"file://{tmp_path}/cli-sp" in done.stdout
    listed = subprocess.run([*cli, "job", "list", "--prefix", topic_prefix, "--format", "json"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    (entry,) = [j for j in map(json.loads, listed.stdout.splitlines()) if j["job_id"] == job]
    assert entry["coordinator_running"] is True and entry["last_savepoint"].startswith(f"file://{tmp_path}/cli-sp")
    assert entry["name"] == job  # a job without --job-name is named by its ID, as the savepoint's TRIGGERED said
    missing = subprocess.run([*cli, "job", "cancel", "--job", "0" * 32, "--prefix", topic_prefix], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 1 and "is not running" in missing.stderr and "Traceback" not in missing.stderr


def test_a_standby_does_not_restart_a_canceled_job(kafka_bootstrap_servers, topic_prefix, job, tmp_path) -> None:
    from chandy.coordinator.kafka.runtime import CoordinatorStoppedError

    active = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path), {"src": 1},
                                prefix=topic_prefix).start(periodic=False)
    standby = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path), {"src": 1}, prefix=topic_prefix,
                                 standby=True)
    outcome: list[BaseException | str] = []

    def run_standby() -> None:
        try:
            standby.start(periodic=False)
            outcome.append("started")
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            outcome.append(exc)

    thread = threading.Thread(target=run_standby, daemon=True)
    thread.start()
    try:
        answer = _send(kafka_bootstrap_servers, topic_prefix, job, T.CANCEL)
        assert answer.status is RequestStatus.COMPLETED, answer.failure_message
        active.stop()  # leaves the election group: the standby leads at once
        thread.join(60)
        (result,) = outcome
        assert isinstance(result, CoordinatorStoppedError) and "ended (CANCELED" in str(result)
    finally:
        active.stop()
        standby.stop()


def test_a_standby_that_joined_first_does_not_fence_a_running_active(kafka_bootstrap_servers, topic_prefix) -> None:
    """Issue 36 (found by benchmarks/takeover.py): a standby started at the same moment as the
    active run joined the election group first and owned its partition, then started and fenced
    the healthy active run. A standby leads only once no active run is a member of the group."""
    from chandy.coordinator.kafka.election import LeaderElection

    topics = ChandyTopics(topic_prefix)
    ensure_topics(kafka_config.admin_client(kafka_bootstrap_servers), topics)
    job = uuid.uuid4().hex
    standby = LeaderElection(kafka_bootstrap_servers, topics, job, standby=True).join()
    active = None
    try:
        assert standby.is_leader.wait(30)  # it owns the partition: the first member
        active = LeaderElection(kafka_bootstrap_servers, topics, job).join()
        assert active.joined.wait(30)
        assert not standby.wait_until_leader(timeout_s=5)  # an active run is a member: no take-over
        active.close()
        active = None
        assert standby.wait_until_leader(timeout_s=30)  # gone: the standby leads
    finally:
        for election in (active, standby):
            if election is not None:
                election.close()

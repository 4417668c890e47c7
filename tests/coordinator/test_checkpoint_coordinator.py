"""The CheckpointCoordinator's Flink semantics, pure: a manual clock and an in-memory log stand in
for the runtime, real fsspec storage in a temporary directory holds the checkpoints."""

from __future__ import annotations

import concurrent.futures
import os
from pathlib import Path

import pytest

from chandy.coordinator.checkpoint_coordinator import CheckpointCoordinator, RestoreError
from chandy.coordinator.completed_checkpoint_store import CompletedCheckpointStore
from chandy.coordinator.failure import CheckpointException
from chandy.coordinator.hooks import HookRestoreError
from chandy.coordinator.messages import (
    COORDINATOR_ELECTED_EVENT,
    AcknowledgeCheckpoint,
    DeclineCheckpoint,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    OperatorEventMessage,
    SubtaskAttemptReady,
    TriggerCheckpoint,
)
from chandy.coordinator.operator_coordinator import NO_CHECKPOINT, OperatorEvent
from chandy.coordinator.pending import AckResult
from chandy.coordinator.records import CheckpointRecord, JobStatusRecord, Tombstone
from chandy.coordinator.state import replay
from tests.fixtures.coordinator import JOB, OPERATORS, ack, make, ready_all
from tests.fixtures.manual_env import ManualEnvironment


def ack_all(cc: CheckpointCoordinator, checkpoint_id: int) -> None:
    for op, n in OPERATORS.items():
        for i in range(n):
            assert ack(cc, checkpoint_id, op, i) is AckResult.SUCCESS


def trigger(cc: CheckpointCoordinator, **kw) -> concurrent.futures.Future:
    future = cc.trigger_checkpoint(**kw)
    cc.env.run()
    return future


def test_trigger_then_all_acks_completes_and_notifies_listeners(tmp_path: Path) -> None:
    cc, env, listener = make(tmp_path)
    future = trigger(cc)
    (trig,) = env.control_of(TriggerCheckpoint)
    assert trig.checkpoint_id == 1 and trig.epoch == 1
    assert not future.done()
    ack_all(cc, 1)
    record = future.result(timeout=0)
    assert record.status == "COMPLETED" and record.num_acknowledged == 3 and record.state_size == 30
    assert listener.completed == [1]
    assert [m.checkpoint_id for m in env.control_of(NotifyCheckpointComplete)] == [1]
    assert os.path.exists(f"{tmp_path}/chk/{JOB}/chk-1/_metadata")
    assert [e.event_type for e in env.events] == ["TRIGGERED", "COMPLETED"]


def test_one_decline_aborts_and_notifies_abort(tmp_path: Path) -> None:
    cc, env, listener = make(tmp_path, tolerable_failed=5)
    future = trigger(cc)
    ack(cc, 1, "src", 0)
    cc.receive_decline(DeclineCheckpoint(JOB, 1, 1, "sink", 0, 0, "CHECKPOINT_DECLINED", "disk full"))
    env.run()
    with pytest.raises(CheckpointException) as raised:
        future.result(timeout=0)
    assert raised.value.reason.value == "CHECKPOINT_DECLINED" and "disk full" in str(raised.value)
    assert listener.aborted == [1] and listener.completed == []
    (aborted,) = env.control_of(NotifyCheckpointAborted)
    assert (aborted.checkpoint_id, aborted.reason) == (1, "CHECKPOINT_DECLINED")
    assert not os.path.exists(f"{tmp_path}/chk/{JOB}/chk-1")


def test_timeout_aborts_with_checkpoint_expired(tmp_path: Path) -> None:
    cc, env, listener = make(tmp_path, timeout_ms=500, tolerable_failed=5)
    future = trigger(cc)
    ack(cc, 1, "src", 0)
    env.advance(499)
    assert not future.done()
    env.advance(1)
    assert future.exception(timeout=0).reason.value == "CHECKPOINT_EXPIRED"
    assert listener.aborted == [1]
    assert cc.state.checkpoints[1].failure_reason == "CHECKPOINT_EXPIRED"
    # an ack arriving after the expiry is late and changes nothing
    assert ack(cc, 1, "src", 1) is AckResult.LATE


def test_max_concurrent_checkpoints_respected(tmp_path: Path) -> None:
    cc, env, _ = make(tmp_path, interval_ms=100, max_concurrent=2, random_initial_delay=False)
    cc.start_periodic_scheduler()
    env.advance(1_000)
    assert sorted(cc.pending) == [1, 2]
    assert [m.checkpoint_id for m in env.control_of(TriggerCheckpoint)] == [1, 2]
    # a user request beyond max_concurrent is queued, not refused (Flink's CheckpointRequestDecider)
    queued = trigger(cc)
    assert queued.checkpoint_id is None and not queued.done()
    assert cc.state.next_checkpoint_id == 3  # a queued request takes no ID yet
    forced = trigger(cc, forced=True)
    assert forced.checkpoint_id == 3 and sorted(cc.pending) == [1, 2, 3]
    # the forced checkpoint counts as pending: completing 1 leaves 2 and 3, still the limit
    ack_all(cc, 1)
    env.advance(1)
    assert sorted(cc.pending) == [2, 3]
    # completing 2 frees a slot: the queued user request runs before the queued periodic one
    ack_all(cc, 2)
    env.run()
    assert sorted(cc.pending) == [3, 4]
    ack_all(cc, 4)
    assert queued.result(timeout=0).checkpoint_id == 4


def test_min_pause_between_checkpoints_respected(tmp_path: Path) -> None:
    cc, env, _ = make(tmp_path, interval_ms=100, min_pause_ms=1_000, random_initial_delay=False)
    cc.start_periodic_scheduler()
    env.advance(1_000)
    assert list(cc.pending) == [1]
    ack_all(cc, 1)
    completed_at = env.now
    env.advance(999)
    assert cc.pending == {}  # periodic checkpoints wait for the min pause ...
    env.advance(1)
    assert list(cc.pending) == [2]
    trigger_2 = next(r for r in env.log if isinstance(r, CheckpointRecord) and r.checkpoint_id == 2)
    assert trigger_2.trigger_timestamp - completed_at >= 1_000


def test_a_user_requested_checkpoint_does_not_wait_for_the_min_pause(tmp_path: Path) -> None:
    """Flink's CheckpointRequestDecider.chooseRequestToExecute applies the min pause to periodic
    requests only."""
    cc, env, _ = make(tmp_path, interval_ms=100, min_pause_ms=1_000, random_initial_delay=False)
    cc.start_periodic_scheduler()
    env.advance(100)
    ack_all(cc, 1)
    env.advance(10)
    user = trigger(cc)
    assert user.checkpoint_id == 2 and list(cc.pending) == [2]
    ack_all(cc, 2)
    assert user.result(timeout=0).status == "COMPLETED"
    # the periodic trigger still keeps its pause after the user's checkpoint completed
    completed_at = env.now
    env.advance(999)
    assert cc.pending == {}
    env.advance(1)
    assert list(cc.pending) == [3]
    assert cc.state.checkpoints[3].trigger_timestamp - completed_at >= 1_000


def test_completing_n_subsumes_pending_below_but_not_a_pending_savepoint(tmp_path: Path) -> None:
    cc, env, listener = make(tmp_path, max_concurrent=5)
    first = trigger(cc)
    savepoint = cc.trigger_savepoint()
    env.run()
    third = trigger(cc)
    ack_all(cc, 3)
    assert third.result(timeout=0).checkpoint_id == 3
    assert first.exception(timeout=0).reason.value == "CHECKPOINT_SUBSUMED"
    assert not savepoint.done() and 2 in cc.pending
    assert listener.completed == [3] and listener.aborted == [1]
    ack_all(cc, 2)
    pointer = savepoint.result(timeout=0)
    assert Path(pointer.removeprefix("file://")).name.startswith(f"savepoint-{JOB[:6]}-")
    assert cc.state.checkpoints[2].status == "COMPLETED" and cc.state.checkpoints[2].is_savepoint


def test_tolerable_failed_checkpoints_exceeded_fails_the_job(tmp_path: Path) -> None:
    statuses = []
    cc, env, _ = make(tmp_path, tolerable_failed=1, timeout_ms=100, start=False)
    cc.on_job_status = lambda status, why: statuses.append((status, why))
    cc.start()
    env.run()
    ready_all(cc)
    trigger(cc)
    env.advance(100)
    assert cc.job_status == "RUNNING" and cc.state.continuous_failures == 1
    trigger(cc)
    cc.receive_decline(DeclineCheckpoint(JOB, 1, 2, "src", 0, 0, "CHECKPOINT_DECLINED"))
    env.run()
    assert cc.job_status == "FAILED"
    assert statuses and statuses[0][0] == "FAILED" and "tolerable failure threshold" in statuses[0][1]
    assert any(isinstance(r, JobStatusRecord) and r.status == "FAILED" for r in env.log)
    # the public event goes out with the status, as for every other terminal status
    changed = [e for e in env.events if e.event_type == "JOB_STATUS_CHANGED"]
    assert [(e.job_status, "tolerable failure threshold" in e.failure_message) for e in changed] == [("FAILED", True)]
    assert trigger(cc).exception(timeout=0).reason.value == "NOT_ALL_REQUIRED_TASKS_RUNNING"


def test_fail_job_ends_the_job_failed_with_its_event_and_aborts_the_pending_checkpoint(tmp_path: Path) -> None:
    """``fail_job`` (the pipeline gave up on Kafka, issue 36): FAILED in the log, a
    JOB_STATUS_CHANGED event with the reason, the pending checkpoint aborted, and a second call
    refused because the job is no longer RUNNING."""
    cc, env, _ = make(tmp_path)
    pending = trigger(cc)
    failed = cc.fail_job("watermarks unreadable for 180 s")
    env.run()
    assert failed.result(timeout=0).status == "FAILED" and cc.job_status == "FAILED"
    assert pending.exception(timeout=0) is not None
    assert [(r.status, r.reason) for r in env.log if isinstance(r, JobStatusRecord)][-1] == (
        "FAILED", "watermarks unreadable for 180 s")
    changed = [e for e in env.events if e.event_type == "JOB_STATUS_CHANGED"]
    assert [(e.job_status, e.failure_message) for e in changed] == [("FAILED", "watermarks unreadable for 180 s")]
    again = cc.fail_job("twice")
    env.run()
    assert "FAILED, not RUNNING" in str(again.exception(timeout=0))


def test_uncounted_failures_do_not_fail_the_job(tmp_path: Path) -> None:
    cc, env, _ = make(tmp_path, tolerable_failed=0, max_concurrent=5)
    trigger(cc)
    trigger(cc)
    ack_all(cc, 2)  # checkpoint 1 is subsumed: not a counted failure
    assert cc.job_status == "RUNNING" and cc.state.continuous_failures == 0


def test_completion_resets_the_continuous_failure_count(tmp_path: Path) -> None:
    cc, env, _ = make(tmp_path, tolerable_failed=1, timeout_ms=100)
    trigger(cc)
    env.advance(100)
    trigger(cc)
    ack_all(cc, 2)
    trigger(cc)
    env.advance(100)
    assert cc.job_status == "RUNNING" and cc.state.continuous_failures == 1


def test_late_duplicate_stale_and_unknown_acks_change_nothing(tmp_path: Path) -> None:
    cc, env, _ = make(tmp_path, max_concurrent=2)
    for idx, attempt in (("src", 0), 1), (("src", 1), 2), (("sink", 0), 0):
        cc.attempt_ready(SubtaskAttemptReady(JOB, idx[0], idx[1], attempt))
    first = trigger(cc)
    assert ack(cc, 1, "src", 0, attempt=1) is AckResult.SUCCESS
    before = (dict(cc.state.checkpoints), cc.pending[1].num_acknowledged, len(env.log), len(env.control))
    assert ack(cc, 1, "src", 0, attempt=1) is AckResult.DUPLICATE
    assert ack(cc, 1, "src", 1, attempt=1) is AckResult.STALE  # attempt 2 is current
    assert ack(cc, 99, "src", 1, attempt=2) is AckResult.UNKNOWN
    assert ack(cc, 1, "nosuch", 0) is AckResult.UNKNOWN
    assert (dict(cc.state.checkpoints), cc.pending[1].num_acknowledged, len(env.log), len(env.control)) == before
    assert ack(cc, 1, "src", 1, attempt=2) is AckResult.SUCCESS
    assert ack(cc, 1, "sink", 0) is AckResult.SUCCESS
    assert first.result(timeout=0).checkpoint_id == 1
    log_size = len(env.log)
    assert ack(cc, 1, "sink", 0) is AckResult.LATE
    assert len(env.log) == log_size
    assert cc.ack_counts[AckResult.DUPLICATE] == 1 and cc.ack_counts[AckResult.STALE] == 1
    assert cc.ack_counts[AckResult.UNKNOWN] == 2 and cc.ack_counts[AckResult.LATE] == 1


def test_retained_checkpoints_beyond_the_number_are_deleted_from_storage(tmp_path: Path) -> None:
    cc, env, _ = make(tmp_path, num_retained=2)
    for checkpoint_id in (1, 2, 3, 4):
        trigger(cc)
        ack_all(cc, checkpoint_id)
    job_dir = tmp_path / "chk" / JOB
    assert sorted(p.name for p in job_dir.iterdir() if p.name.startswith("chk-")) == ["chk-3", "chk-4"]
    assert [c.checkpoint_id for c in cc.state.completed()] == [3, 4]
    tombstoned = sorted(int(r.key().entity_id) for r in env.log if isinstance(r, Tombstone))
    assert tombstoned == [1, 2]


class DictHook:
    """A master hook storing a dict, version 2 of its serializer."""

    def __init__(self, identifier: str, data: dict | None = None) -> None:
        self.identifier = identifier
        self.data = data
        self.restored: list = []
        self.resets = 0

    def get_identifier(self) -> str:
        return self.identifier

    def trigger_checkpoint(self, checkpoint_id, timestamp, executor):
        return executor.submit(lambda: {**(self.data or {}), "checkpoint": checkpoint_id})

    def restore_checkpoint(self, checkpoint_id, checkpoint_data) -> None:
        self.restored.append((checkpoint_id, checkpoint_data))

    def reset(self) -> None:
        self.resets += 1

    def close(self) -> None:
        pass

    def create_checkpoint_data_serializer(self):
        return self

    def get_version(self) -> int:
        return 2

    def serialize(self, obj) -> bytes:
        return repr(sorted(obj.items())).encode()

    def deserialize(self, version: int, serialized: bytes):
        assert version == 2
        return dict(eval(serialized.decode()))


def test_hook_data_round_trips_through_metadata_and_restore(tmp_path: Path) -> None:
    hook = DictHook("kafka-offsets", {"offset": 42})
    cc, env, _ = make(tmp_path, hooks=[hook])
    assert hook.resets == 1  # a new job: no checkpoint to restore
    assert cc.add_master_hook(DictHook("kafka-offsets")) is False  # duplicate identifier dropped
    trigger(cc)
    ack_all(cc, 1)
    # a restarted coordinator (same log) restores the hook's data from _metadata
    restarted_hook = DictHook("kafka-offsets")
    make(tmp_path, env=ManualEnvironment(), state=replay(JOB, env.log), hooks=[restarted_hook])
    assert restarted_hook.restored == [(1, {"offset": 42, "checkpoint": 1})]
    assert restarted_hook.resets == 0


def test_the_checkpoint_id_is_durable_no_later_than_anyone_sees_it(tmp_path: Path) -> None:
    """Flink's CheckpointIDCounter: the counter and PENDING are durable before a hook, an operator
    coordinator or a task sees the ID. With only tasks, they go in the trigger's own transaction
    (tasks read committed); with a hook, in a transaction committed before the hook runs."""
    batches: list = []

    def recording(env: ManualEnvironment) -> ManualEnvironment:
        append = env.append

        def record(batch, on_committed=None):
            batches.append(batch)
            append(batch, on_committed)

        env.append = record
        return env

    def kinds(batch) -> set[str]:
        return ({type(r).__name__ for r in batch.records} | {type(m).__name__ for m in batch.control}
                | {e.event_type for e in batch.events})

    cc, env, _ = make(tmp_path / "tasks", env=recording(ManualEnvironment()))
    batches.clear()
    trigger(cc)
    assert [kinds(b) for b in batches] == [{"CheckpointIdCounterRecord", "CheckpointRecord", "TriggerCheckpoint",
                                           "TRIGGERED"}]
    assert cc.pending[1].trigger_sent and cc.state.checkpoints[1].status == "PENDING"

    hook = DictHook("h", {"offset": 1})
    cc, env, _ = make(tmp_path / "hook", env=recording(ManualEnvironment()), hooks=[hook])
    batches.clear()
    trigger(cc)
    assert [kinds(b) for b in batches] == [{"CheckpointIdCounterRecord", "CheckpointRecord", "TRIGGERED"},
                                           {"TriggerCheckpoint"}]


def test_reset_is_called_when_no_checkpoint_exists(tmp_path: Path) -> None:
    hook = DictHook("h")
    coordinator = RecordingCoordinator("src")
    cc, env, _ = make(tmp_path, hooks=[hook], providers=[coordinator])
    assert hook.resets == 1 and hook.restored == []
    assert coordinator.calls[:2] == [("start",), ("reset_to_checkpoint", NO_CHECKPOINT, None)]


class RecordingCoordinator:
    """An operator coordinator that logs its calls; it is its own provider."""

    def __init__(self, operator_id: str) -> None:
        self.operator_id = operator_id
        self.calls: list[tuple] = []
        self.gateways: dict[int, object] = {}
        self.state = b"coordinator-state"
        self.future = None

    def create(self, context):
        self.context = context
        return self

    def start(self):
        self.calls.append(("start",))

    def close(self):
        self.calls.append(("close",))

    def handle_event_from_operator(self, subtask, attempt_number, event):
        self.calls.append(("event", subtask, attempt_number, event))

    def checkpoint_coordinator(self, checkpoint_id, result_future):
        self.calls.append(("checkpoint", checkpoint_id))
        self.future = result_future

    def notify_checkpoint_complete(self, checkpoint_id):
        self.calls.append(("complete", checkpoint_id))

    def notify_checkpoint_aborted(self, checkpoint_id):
        self.calls.append(("aborted", checkpoint_id))

    def reset_to_checkpoint(self, checkpoint_id, checkpoint_data):
        self.calls.append(("reset_to_checkpoint", checkpoint_id, checkpoint_data))

    def subtask_reset(self, subtask, checkpoint_id):
        self.calls.append(("subtask_reset", subtask, checkpoint_id))

    def execution_attempt_failed(self, subtask, attempt_number, reason):
        self.calls.append(("failed", subtask, attempt_number))

    def execution_attempt_ready(self, subtask, attempt_number, gateway):
        self.calls.append(("ready", subtask, attempt_number))
        self.gateways[subtask] = gateway


def test_operator_coordinator_events_before_and_after_the_checkpoint_future(tmp_path: Path) -> None:
    coordinator = RecordingCoordinator("src")
    cc, env, _ = make(tmp_path, providers=[coordinator])
    cc.attempt_ready(SubtaskAttemptReady(JOB, "src", 0, 0))
    gateway = coordinator.gateways[0]
    trigger(cc)
    assert ("checkpoint", 1) in coordinator.calls
    gateway.send_event(OperatorEvent("split", b"before"))
    coordinator.future.set_result(coordinator.state)  # the moment of the coordinator's checkpoint
    gateway.send_event(OperatorEvent("split", b"after"))
    env.run()
    order = [("trigger", m.checkpoint_id) if isinstance(m, TriggerCheckpoint) else ("event", m.payload)
             for m in env.control if isinstance(m, (TriggerCheckpoint, OperatorEventMessage))
             and getattr(m, "event_type", None) != COORDINATOR_ELECTED_EVENT]
    assert order == [("event", b"before"), ("trigger", 1), ("event", b"after")]
    ack_all(cc, 1)
    assert ("complete", 1) in coordinator.calls
    # the coordinator's state is in the checkpoint and comes back on restore
    restarted = RecordingCoordinator("src")
    make(tmp_path, env=ManualEnvironment(), state=replay(JOB, env.log), providers=[restarted])
    assert ("reset_to_checkpoint", 1, b"coordinator-state") in restarted.calls
    # restoring implies completion: it is notified again
    assert restarted.calls.index(("reset_to_checkpoint", 1, b"coordinator-state")) < restarted.calls.index(("complete", 1))


def test_events_to_a_failed_attempt_fail(tmp_path: Path) -> None:
    from chandy.coordinator.messages import SubtaskAttemptFailed
    from chandy.coordinator.operator_coordinator_holder import SubtaskAttemptGoneError

    coordinator = RecordingCoordinator("src")
    cc, env, _ = make(tmp_path, providers=[coordinator])
    cc.attempt_ready(SubtaskAttemptReady(JOB, "src", 1, 0))
    gateway = coordinator.gateways[1]
    cc.attempt_failed(SubtaskAttemptFailed(JOB, "src", 1, 0, "killed"))
    future = gateway.send_event(OperatorEvent("split", b"x"))
    env.run()
    assert isinstance(future.exception(timeout=0), SubtaskAttemptGoneError)
    assert ("failed", 1, 0) in coordinator.calls and ("subtask_reset", 1, NO_CHECKPOINT) in coordinator.calls


def test_savepoints_share_the_id_counter_and_stop_with_savepoint_finishes(tmp_path: Path) -> None:
    statuses = []
    cc, env, listener = make(tmp_path, interval_ms=100, random_initial_delay=False, start=False)
    cc.on_job_status = lambda status, why: statuses.append(status)
    cc.start()
    ready_all(cc)
    cc.start_periodic_scheduler()
    env.advance(100)
    ack_all(cc, 1)
    env.run()
    assert list(cc.pending) == [2]  # the periodic request that waited for 1
    pointer = cc.trigger_savepoint(terminate=True)
    env.run()
    # Flink's stopCheckpointScheduler aborts the pending checkpoint (not a counted failure)
    assert cc.state.checkpoints[2].failure_reason == "CHECKPOINT_COORDINATOR_SUSPEND"
    (sp_id,) = cc.pending
    assert sp_id == pointer.checkpoint_id == 3
    ack_all(cc, 3)
    assert pointer.result(timeout=0).startswith("file://")
    assert statuses == ["FINISHED"] and cc.job_status == "FINISHED"
    # stop-with-savepoint is synchronous: it notifies workers, listeners and coordinators
    assert listener.completed == [1, 3]
    assert [m.checkpoint_id for m in env.control_of(NotifyCheckpointComplete)] == [1, 3]
    env.advance(1_000)
    assert cc.pending == {}  # periodic checkpoints stopped


def test_restore_from_savepoint_checks_operators(tmp_path: Path) -> None:
    cc, env, _ = make(tmp_path)
    savepoint = cc.trigger_savepoint()
    env.run()
    ack_all(cc, 1)
    pointer = savepoint.result(timeout=0)
    with pytest.raises(RestoreError, match="sink"):
        make(tmp_path / "other", restore_from=pointer, operators={"src": 2})
    cc2, env2, listener = make(tmp_path / "other2", restore_from=pointer, allow=True, operators={"src": 2})
    assert listener.completed == [1]
    assert cc2.state.next_checkpoint_id == 2  # IDs continue after the savepoint's
    future = trigger(cc2)
    assert cc2.pending and 2 in cc2.pending and not future.done()


def test_restore_with_unclaimed_hook_state_is_an_error(tmp_path: Path) -> None:
    cc, env, _ = make(tmp_path, hooks=[DictHook("a")])
    savepoint = cc.trigger_savepoint()
    env.run()
    ack_all(cc, 1)
    with pytest.raises(HookRestoreError, match="a"):
        make(tmp_path / "o", restore_from=savepoint.result(timeout=0), hooks=[DictHook("b")])


def test_restart_aborts_pending_and_continues_ids(tmp_path: Path) -> None:
    cc, env, _ = make(tmp_path, max_concurrent=3)
    trigger(cc)
    ack_all(cc, 1)
    trigger(cc)
    ack(cc, 2, "src", 0)
    cc2, env2, listener = make(tmp_path, env=ManualEnvironment(), state=replay(JOB, env.log))
    assert cc2.epoch == 2
    assert cc2.state.checkpoints[2].status == "ABORTED"
    assert cc2.state.checkpoints[2].failure_reason == "CHECKPOINT_COORDINATOR_SHUTDOWN"
    assert listener.completed == [1]
    assert [m.checkpoint_id for m in env2.control_of(NotifyCheckpointComplete)] == [1]
    trigger(cc2)
    assert list(cc2.pending) == [3]


def test_corrupt_latest_metadata_falls_back_to_an_older_checkpoint(tmp_path: Path) -> None:
    cc, env, _ = make(tmp_path, num_retained=2)
    for checkpoint_id in (1, 2):
        trigger(cc)
        ack_all(cc, checkpoint_id)
    (tmp_path / "chk" / JOB / "chk-2" / "_metadata").write_bytes(b"CHKM\x00")
    _, env2, listener = make(tmp_path, env=ManualEnvironment(), state=replay(JOB, env.log))
    assert listener.completed == [1]
    (tmp_path / "chk" / JOB / "chk-1" / "_metadata").unlink()
    with pytest.raises(RestoreError, match="refusing to start from scratch"):
        make(tmp_path, env=ManualEnvironment(), state=replay(JOB, env.log))


def test_stats_json_is_shaped_like_flinks_checkpoints_endpoint(tmp_path: Path) -> None:
    cc, env, _ = make(tmp_path, tolerable_failed=3)
    trigger(cc)
    env.advance(25)
    ack_all(cc, 1)
    trigger(cc)
    cc.receive_decline(DeclineCheckpoint(JOB, 1, 2, "src", 0, 0, "CHECKPOINT_DECLINED"))
    env.run()
    stats = cc.stats.to_json()
    assert stats["counts"] == {"restored": 0, "total": 2, "in_progress": 0, "completed": 1, "failed": 1}
    assert stats["summary"]["end_to_end_duration"]["max"] == 25
    assert stats["latest"]["completed"]["num_acknowledged_subtasks"] == 3
    assert stats["latest"]["failed"]["failure_reason"] == "CHECKPOINT_DECLINED"
    assert [h["id"] for h in stats["history"]] == [2, 1]


# -- found in review ------------------------------------------------------------------------------
def test_acks_for_another_epoch_are_stale(tmp_path: Path) -> None:
    cc, env, _ = make(tmp_path)
    trigger(cc)
    stale = AcknowledgeCheckpoint(JOB, cc.epoch + 1, 1, "src", 1, 0)  # a newer coordinator's checkpoint 1
    assert cc.receive_acknowledge(stale) is AckResult.STALE
    assert cc.receive_decline(DeclineCheckpoint(JOB, cc.epoch + 1, 1, "src", 1, 0, "CHECKPOINT_DECLINED")) is AckResult.STALE
    assert 1 in cc.pending and cc.pending[1].num_acknowledged == 0


def test_acks_that_arrive_before_the_trigger_goes_out_count_and_complete_it_then(tmp_path: Path) -> None:
    """Flink's receiveAcknowledgeMessage takes an ack for any pending checkpoint. The pipeline's
    Spark tasks ack as soon as their offset ranges are fixed, which may be before the trigger went
    out (a slow location or operator coordinator: hundreds of ms on S3). Found by the standby test
    on S3: the acks were dropped as stale and the checkpoint hung until its timeout."""
    hook = DictHook("slow")
    slow: concurrent.futures.Future = concurrent.futures.Future()
    hook.trigger_checkpoint = lambda checkpoint_id, timestamp, executor: slow
    cc, env, _ = make(tmp_path, hooks=[hook])
    result = trigger(cc)
    assert not cc.pending[1].trigger_sent  # the hook is slow
    ack_all(cc, 1)
    assert 1 in cc.pending and not result.done()
    slow.set_result({"x": 1})
    env.run()
    assert 1 not in cc.pending and cc.state.checkpoints[1].status == "COMPLETED"
    assert result.result(0).checkpoint_id == 1


def test_a_decline_before_the_trigger_goes_out_aborts_the_checkpoint(tmp_path: Path) -> None:
    hook = DictHook("slow")
    hook.trigger_checkpoint = lambda checkpoint_id, timestamp, executor: concurrent.futures.Future()
    cc, env, _ = make(tmp_path, hooks=[hook])
    result = trigger(cc)
    assert cc.receive_decline(DeclineCheckpoint(JOB, cc.epoch, 1, "src", 0, 0, "CHECKPOINT_DECLINED")) is AckResult.SUCCESS
    env.run()
    assert 1 not in cc.pending and result.done() and result.exception(0) is not None


def test_a_snapshot_the_job_was_restored_from_is_never_deleted(tmp_path: Path) -> None:
    cc, env, _ = make(tmp_path)
    first = trigger(cc)
    ack_all(cc, 1)
    pointer = first.result(timeout=0).external_pointer  # another job's retained checkpoint
    cc2, env2, _ = make(tmp_path / "new-job", restore_from=pointer, num_retained=1)
    for checkpoint_id in (2, 3):
        trigger(cc2)
        ack_all(cc2, checkpoint_id)
    assert [c.checkpoint_id for c in cc2.state.completed()] == [3]  # fell out of retention ...
    assert Path(pointer.removeprefix("file://"), "_metadata").exists()  # ... but is not deleted


def test_overlapping_triggers_keep_ids_and_events_in_order(tmp_path: Path) -> None:
    coordinator = RecordingCoordinator("src")
    slow: concurrent.futures.Future = concurrent.futures.Future()
    hook = DictHook("slow")
    hook.trigger_checkpoint = lambda checkpoint_id, timestamp, executor: slow if checkpoint_id == 1 else None
    cc, env, _ = make(tmp_path, providers=[coordinator], hooks=[hook], max_concurrent=3)
    cc.attempt_ready(SubtaskAttemptReady(JOB, "src", 0, 0))
    gateway = coordinator.gateways[0]
    trigger(cc)
    coordinator.future.set_result(b"s1")
    gateway.send_event(OperatorEvent("e", b"after-1"))
    env.run()
    savepoint = cc.trigger_savepoint()  # queued: checkpoint 1 is still triggering
    env.run()
    assert sorted(cc.pending) == [1] and not savepoint.done()
    slow.set_result({"x": 1})
    env.run()
    coordinator.future.set_result(b"s2")
    gateway.send_event(OperatorEvent("e", b"after-2"))
    env.run()
    order = [("trigger", m.checkpoint_id) if isinstance(m, TriggerCheckpoint) else ("event", m.payload)
             for m in env.control if isinstance(m, (TriggerCheckpoint, OperatorEventMessage))
             and getattr(m, "event_type", None) != COORDINATOR_ELECTED_EVENT]
    assert order == [("trigger", 1), ("event", b"after-1"), ("trigger", 2), ("event", b"after-2")]


def test_a_newer_attempt_fails_the_old_one_first_and_aborts_pending(tmp_path: Path) -> None:
    coordinator = RecordingCoordinator("src")
    cc, env, _ = make(tmp_path, providers=[coordinator], tolerable_failed=0)  # every subtask ready: attempt 0
    pending = trigger(cc)
    coordinator.future.set_result(b"")
    env.run()
    cc.attempt_ready(SubtaskAttemptReady(JOB, "src", 0, 1))  # the old attempt died silently
    env.run()
    calls = [c for c in coordinator.calls if c[0] in ("failed", "subtask_reset", "ready") and c[1] == 0]
    assert calls == [("ready", 0, 0), ("failed", 0, 0), ("subtask_reset", 0, NO_CHECKPOINT), ("ready", 0, 1)]
    assert pending.exception(timeout=0).reason.value == "TASK_FAILURE"
    assert cc.job_status == "RUNNING"  # TASK_FAILURE does not count
    cc.attempt_ready(SubtaskAttemptReady(JOB, "src", 7, 0))  # no such subtask: ignored, no crash
    cc.attempt_ready(SubtaskAttemptReady(JOB, "nosuch", 0, 0))


def test_a_declined_stop_with_savepoint_fails_the_job_and_periodic_checkpoints_stay_stopped(tmp_path: Path) -> None:
    """Flink's CheckpointFailureManager.handleTaskLevelCheckpointException: a synchronous
    savepoint declined by a task fails the job, however many failures are tolerable."""
    statuses = []
    cc, env, _ = make(tmp_path, interval_ms=100, random_initial_delay=False, tolerable_failed=5, start=False)
    cc.on_job_status = lambda status, why: statuses.append((status, why))
    cc.start()
    ready_all(cc)
    cc.start_periodic_scheduler()
    env.advance(1)
    ack_all(cc, 1)
    pointer = cc.trigger_savepoint(terminate=True)
    env.run()
    (savepoint_id,) = cc.pending
    cc.receive_decline(DeclineCheckpoint(JOB, cc.epoch, savepoint_id, "src", 0, 0, "CHECKPOINT_DECLINED"))
    env.run()
    assert pointer.exception(timeout=0).reason.value == "CHECKPOINT_DECLINED"
    assert cc.job_status == "FAILED" and statuses[0][0] == "FAILED"
    assert f"stop-with-savepoint {savepoint_id} failed" in statuses[0][1]
    assert any(isinstance(r, JobStatusRecord) and r.status == "FAILED" for r in env.log)
    env.advance(500)
    assert cc.pending == {} and not any(r.checkpoint_id > savepoint_id for r in cc.state.completed())


def test_an_expired_stop_with_savepoint_fails_the_job(tmp_path: Path) -> None:
    cc, env, _ = make(tmp_path, interval_ms=100, random_initial_delay=False, tolerable_failed=5, timeout_ms=300)
    cc.start_periodic_scheduler()
    env.advance(1)
    ack_all(cc, 1)
    pointer = cc.trigger_savepoint(terminate=True)
    env.advance(300)
    assert pointer.exception(timeout=0).reason.value == "CHECKPOINT_EXPIRED"
    assert cc.job_status == "FAILED"
    env.advance(1_000)
    assert cc.pending == {}  # periodic checkpoints did not silently resume


def test_a_stop_with_savepoint_failing_on_the_coordinator_restarts_periodic_checkpoints(tmp_path: Path) -> None:
    """A coordinator-side failure (a master hook) leaves the job running and restarts periodic
    checkpoints, as Flink's StopWithSavepointTerminationHandlerImpl."""
    hook = DictHook("flaky")
    calls = []

    def flaky(checkpoint_id, timestamp, executor):
        calls.append(checkpoint_id)
        future: concurrent.futures.Future = concurrent.futures.Future()
        if checkpoint_id == 2:
            future.set_exception(RuntimeError("hook down"))
        else:
            future.set_result({})
        return future

    hook.trigger_checkpoint = flaky
    cc, env, _ = make(tmp_path, interval_ms=100, random_initial_delay=False, tolerable_failed=0, hooks=[hook])
    cc.start_periodic_scheduler()
    env.advance(1)
    ack_all(cc, 1)
    pointer = cc.trigger_savepoint(terminate=True)
    env.run()
    assert pointer.exception(timeout=0).reason.value == "TRIGGER_CHECKPOINT_FAILURE"
    assert cc.job_status == "RUNNING"
    env.advance(500)
    assert cc.pending or any(r.checkpoint_id > 2 for r in cc.state.completed())


def test_a_compacted_log_counts_aborted_checkpoints_like_the_live_one() -> None:
    from chandy.coordinator.records import CheckpointRecord as Rec

    aborted = [Rec(JOB, i, "CHECKPOINT", "ABORTED", 1, 0, 0, 1, failure_reason="CHECKPOINT_EXPIRED") for i in (1, 2)]
    live = replay(JOB, [Rec(JOB, 1, "CHECKPOINT", "PENDING", 1, 0, 0, 1), aborted[0],
                        Rec(JOB, 2, "CHECKPOINT", "PENDING", 1, 0, 0, 1), aborted[1]])
    compacted = replay(JOB, aborted)  # compaction kept only the latest record per checkpoint
    assert live.continuous_failures == compacted.continuous_failures == 2


def test_abort_checkpoint_aborts_a_pending_checkpoint_at_once(tmp_path: Path) -> None:
    from chandy.coordinator.failure import CheckpointFailureReason

    cc, env, listener = make(tmp_path, tolerable_failed=5)
    future = trigger(cc)
    assert cc.abort_checkpoint(1, CheckpointFailureReason.CHECKPOINT_DECLINED, "Spark job failed") is True
    env.run()
    assert future.exception(timeout=0).reason.value == "CHECKPOINT_DECLINED"
    assert "Spark job failed" in str(future.exception(timeout=0))
    assert listener.aborted == [1] and cc.state.checkpoints[1].status == "ABORTED"
    assert cc.abort_checkpoint(1, CheckpointFailureReason.CHECKPOINT_DECLINED, "again") is False  # no longer pending


# -- issue 11: savepoints, requests, failures and IDs as Flink 1.15+ -------------------------------
def test_an_intermediate_savepoint_notifies_no_one_but_stop_with_savepoint_does(tmp_path: Path) -> None:
    """FLINK-25191 (Flink's CheckpointCoordinator.cleanupAfterCompletedCheckpoint): no
    NotifyCheckpointComplete for a savepoint that does not stop the job."""
    coordinator = RecordingCoordinator("src")
    outputs: list[int] = []
    cc, env, listener = make(tmp_path, providers=[coordinator])
    cc.completion_outputs = lambda metadata: outputs.append(metadata.checkpoint_id) or []
    savepoint = cc.trigger_savepoint()
    env.run()
    coordinator.future.set_result(b"")
    env.run()
    ack_all(cc, 1)
    assert savepoint.result(timeout=0).startswith("file://")
    assert env.control_of(NotifyCheckpointComplete) == []
    assert listener.completed == [] and not any(c[0] == "complete" for c in coordinator.calls)
    assert outputs == []
    stop = cc.trigger_savepoint(terminate=True)
    env.run()
    coordinator.future.set_result(b"")
    env.run()
    ack_all(cc, 2)
    assert stop.done() and listener.completed == [2] and ("complete", 2) in coordinator.calls
    assert [m.checkpoint_id for m in env.control_of(NotifyCheckpointComplete)] == [2] and outputs == [2]


def test_restart_restores_the_latest_checkpoint_never_a_later_intermediate_savepoint(tmp_path: Path) -> None:
    hook = DictHook("h")
    cc, env, _ = make(tmp_path, hooks=[hook])
    trigger(cc)
    ack_all(cc, 1)
    savepoint = cc.trigger_savepoint()
    env.run()
    ack_all(cc, 2)
    assert savepoint.done() and cc.state.checkpoints[2].status == "COMPLETED"
    assert CompletedCheckpointStore.latest(cc.state).checkpoint_id == 1
    restarted = DictHook("h")
    cc2, _env2, listener = make(tmp_path, env=ManualEnvironment(), state=replay(JOB, env.log), hooks=[restarted])
    assert restarted.restored == [(1, {"checkpoint": 1})]
    assert listener.completed == [1]
    assert trigger(cc2).checkpoint_id == 3  # IDs still continue after the savepoint's


def test_a_job_started_from_a_savepoint_restores_it(tmp_path: Path) -> None:
    cc, env, _ = make(tmp_path, hooks=[DictHook("h")])
    savepoint = cc.trigger_savepoint()
    env.run()
    ack_all(cc, 1)
    restored = DictHook("h")
    _cc2, env2, listener = make(tmp_path / "new", restore_from=savepoint.result(timeout=0), hooks=[restored])
    assert restored.restored == [(1, {"checkpoint": 1})] and listener.completed == [1]
    # and a restart of that job restores it again: it is in the completed checkpoint store
    again = DictHook("h")
    make(tmp_path / "new", env=ManualEnvironment(), state=replay(JOB, env2.log), hooks=[again])
    assert again.restored == [(1, {"checkpoint": 1})]


def test_a_pending_savepoint_counts_towards_max_concurrent(tmp_path: Path) -> None:
    """Flink passes pendingCheckpoints.size(), savepoints included, to the request decider."""
    cc, env, _ = make(tmp_path, interval_ms=100, max_concurrent=1, random_initial_delay=False)
    savepoint = cc.trigger_savepoint()
    env.run()
    cc.start_periodic_scheduler()
    env.advance(500)
    assert list(cc.pending) == [1]  # the periodic checkpoint waits for the savepoint
    user = trigger(cc)
    assert user.checkpoint_id is None and not user.done()  # queued, not refused
    ack_all(cc, 1)
    assert savepoint.done()
    env.run()
    assert list(cc.pending) == [2]  # the user request first, the periodic one after it
    ack_all(cc, 2)
    assert user.result(timeout=0).checkpoint_id == 2
    env.run()
    assert list(cc.pending) == [3]


def test_user_requests_beyond_the_queue_limit_are_refused(tmp_path: Path) -> None:
    from chandy.coordinator.request_decider import CheckpointRequestDecider

    cc, _env, _ = make(tmp_path, max_concurrent=1)
    cc.decider = CheckpointRequestDecider(1, 0, max_queued=2)
    first = trigger(cc)
    queued = [trigger(cc), trigger(cc)]
    refused = trigger(cc)
    assert first.checkpoint_id == 1 and all(not q.done() for q in queued)
    assert refused.exception(timeout=0).reason.value == "TOO_MANY_CHECKPOINT_REQUESTS"
    ack_all(cc, 1)
    ack_all(cc, 2)
    ack_all(cc, 3)
    assert [q.result(timeout=0).checkpoint_id for q in queued] == [2, 3]


def test_a_completed_savepoint_resets_the_failure_count(tmp_path: Path) -> None:
    """Flink's CheckpointFailureManager.handleCheckpointSuccess runs for savepoints too."""
    cc, env, _ = make(tmp_path, tolerable_failed=1, timeout_ms=100)
    trigger(cc)
    env.advance(100)
    assert cc.state.continuous_failures == 1
    savepoint = cc.trigger_savepoint()
    env.run()
    ack_all(cc, 2)
    assert savepoint.done() and cc.state.continuous_failures == 0
    trigger(cc)
    env.advance(100)
    assert cc.job_status == "RUNNING" and cc.state.continuous_failures == 1


def test_a_savepoint_declined_by_a_task_counts_but_an_expired_one_does_not(tmp_path: Path) -> None:
    """Flink's handleTaskLevelCheckpointException counts a declined savepoint;
    handleJobLevelCheckpointException ignores savepoints."""
    cc, env, _ = make(tmp_path, tolerable_failed=1, timeout_ms=100)
    expired = cc.trigger_savepoint()
    env.advance(100)
    assert expired.exception(timeout=0).reason.value == "CHECKPOINT_EXPIRED"
    assert cc.state.continuous_failures == 0
    for _ in range(2):
        declined = cc.trigger_savepoint()
        env.run()
        (savepoint_id,) = cc.pending
        cc.receive_decline(DeclineCheckpoint(JOB, cc.epoch, savepoint_id, "src", 0, 0, "CHECKPOINT_DECLINED"))
        env.run()
        assert declined.exception(timeout=0).reason.value == "CHECKPOINT_DECLINED"
    assert cc.state.continuous_failures == 2 and cc.job_status == "FAILED"
    assert cc.state.checkpoints[savepoint_id].properties["declined_by"] == "src[0]#0"
    assert replay(JOB, env.log) == cc.state


class DeferredCommitEnvironment(ManualEnvironment):
    """A log writer that commits only when told: what is appended is not durable until then."""

    def __init__(self) -> None:
        super().__init__()
        self.uncommitted: list = []

    def append(self, batch, on_committed=None) -> None:
        self.uncommitted.append((batch, on_committed))

    def commit(self) -> None:
        while self.uncommitted:
            batch, on_committed = self.uncommitted.pop(0)
            super().append(batch, on_committed)
        self.run()


def test_an_id_is_durable_before_a_hook_or_coordinator_sees_it(tmp_path: Path) -> None:
    """Flink's CheckpointIDCounter.getAndIncrement precedes the master hooks and coordinators."""
    from chandy.coordinator.records import CheckpointIdCounterRecord

    seen: list[tuple[int, int]] = []
    env = DeferredCommitEnvironment()
    hook = DictHook("h")
    original = hook.trigger_checkpoint

    def recording(checkpoint_id, timestamp, executor):
        durable = max((r.next_checkpoint_id for r in env.log if isinstance(r, CheckpointIdCounterRecord)), default=1)
        seen.append((checkpoint_id, durable))
        return original(checkpoint_id, timestamp, executor)

    hook.trigger_checkpoint = recording
    coordinator = RecordingCoordinator("src")
    cc, env, _ = make(tmp_path, env=env, hooks=[hook], providers=[coordinator], start=False)
    cc.start()
    env.commit()
    ready_all(cc)
    result = cc.trigger_checkpoint()
    env.run()
    assert result.checkpoint_id == 1
    assert seen == [] and ("checkpoint", 1) not in coordinator.calls  # nothing durable yet
    assert env.control_of(TriggerCheckpoint) == []
    env.commit()
    assert seen == [(1, 2)] and ("checkpoint", 1) in coordinator.calls  # the counter was durable first
    coordinator.future.set_result(b"")
    env.run()
    env.commit()
    # the trigger goes out after PENDING
    (trig,) = env.control_of(TriggerCheckpoint)
    pending_at = next(i for i, r in enumerate(env.log) if isinstance(r, CheckpointRecord) and r.status == "PENDING")
    assert trig.checkpoint_id == 1 and pending_at >= 0


def test_no_trigger_before_every_subtask_runs_and_a_skipped_period_is_no_failure(tmp_path: Path) -> None:
    """Flink's pre-flight check (issue 36): a trigger before every subtask has reported a running
    attempt takes no ID, is not a failed checkpoint (not counted toward tolerable failures), and
    the periodic scheduler tries again next period. An explicit request made meanwhile is held and
    runs, first, once the last subtask reports."""
    cc, env, _ = make(tmp_path, interval_ms=100, random_initial_delay=False, tolerable_failed=0, ready=False)
    assert cc.options.wait_for_running_subtasks  # the default
    held = trigger(cc)
    cc.start_periodic_scheduler()
    env.advance(350)  # three periods, each skipped
    assert not held.done() and held.checkpoint_id is None and cc.is_held(held.held)
    assert cc.state.next_checkpoint_id == 1 and cc.state.continuous_failures == 0 and cc.job_status == "RUNNING"
    assert env.control_of(TriggerCheckpoint) == []
    assert not any(isinstance(r, CheckpointRecord) for r in env.log)  # no ID taken, nothing failed
    ready_all(cc)  # the held request runs at once
    assert [m.checkpoint_id for m in env.control_of(TriggerCheckpoint)] == [1]
    assert not cc.is_held(held.held) and held.held.checkpoint_id == 1  # what CoordinatorService waits for
    for op, n in OPERATORS.items():
        for i in range(n):
            ack(cc, 1, op, i)
    env.run()
    assert held.result(timeout=0).checkpoint_id == 1
    env.advance(100)  # the next period triggers checkpoint 2
    assert [m.checkpoint_id for m in env.control_of(TriggerCheckpoint)] == [1, 2]


def test_an_explicit_request_before_readiness_fails_after_the_checkpoint_timeout_uncounted(tmp_path: Path) -> None:
    """A request held for readiness that never comes fails with NOT_ALL_REQUIRED_TASKS_RUNNING
    after ``timeout_ms``, without an ID and without counting toward the tolerable failures."""
    cc, env, _ = make(tmp_path, timeout_ms=1_000, tolerable_failed=0, ready=False)
    (op, n), *_ = OPERATORS.items()
    cc.attempt_ready(SubtaskAttemptReady(JOB, op, 0, 0))  # one subtask of several
    held = trigger(cc)
    env.advance(999)
    assert not held.done()
    env.advance(1)
    assert held.exception(timeout=0).reason.value == "NOT_ALL_REQUIRED_TASKS_RUNNING"
    assert "within 1000 ms" in str(held.exception(timeout=0))
    assert cc.state.next_checkpoint_id == 1 and cc.state.continuous_failures == 0 and cc.job_status == "RUNNING"
    assert env.control_of(TriggerCheckpoint) == []


def test_a_starting_coordinator_announces_its_epoch_to_the_running_attempts(tmp_path: Path) -> None:
    """Each start (a restart, a take-over) sends one operator event of the new epoch to no subtask:
    participants report their running attempts ready again on a newer epoch."""
    cc, env, _ = make(tmp_path, ready=False)
    (announced,) = [m for m in env.control_of(OperatorEventMessage) if m.event_type == COORDINATOR_ELECTED_EVENT]
    assert (announced.epoch, announced.operator_id, announced.subtask_index, announced.attempt_number) == (
        cc.state.epoch, "", -1, -1)
    assert announced.epoch == 1


class _FailingOnComplete(RecordingCoordinator):
    """Its ``notify_checkpoint_complete`` raises ``error`` (a lake commit that failed)."""

    def __init__(self, operator_id: str, error: BaseException) -> None:
        super().__init__(operator_id)
        self.error = error

    def checkpoint_coordinator(self, checkpoint_id, result_future):
        result_future.set_result(self.state)

    def notify_checkpoint_complete(self, checkpoint_id):
        raise self.error


def _failover_coordinator(tmp_path: Path, error: BaseException, **options):
    failovers: list[str] = []
    cc, env, _ = make(tmp_path, providers=[_FailingOnComplete("src", error)], start=False, **options)
    cc.on_failover = failovers.append
    cc.start()
    env.run()
    ready_all(cc)
    return cc, env, failovers


def test_with_a_restart_strategy_a_global_failure_is_handed_over_not_recorded_as_failed(tmp_path: Path) -> None:
    """Issue 44, item 5 (Flink's global failover): a failing operator coordinator's notification
    hands its reason to the host's restart strategy once; the job is not FAILED in the log, no new
    checkpoint starts, and the shutdown that follows records SUSPENDED with the reason."""
    from chandy.connectors.lake.sink import LakeCommitError

    cc, env, failovers = _failover_coordinator(tmp_path, LakeCommitError("S3 answered 503"))
    trigger(cc)
    ack_all(cc, 1)
    assert failovers == ["LakeCommitError: S3 answered 503"]
    assert cc.job_status == "RUNNING"
    assert not any(isinstance(r, JobStatusRecord) and r.status == "FAILED" for r in env.log)
    cc.shutdown()
    env.run()
    suspended = [r for r in env.log if isinstance(r, JobStatusRecord) and r.status == "SUSPENDED"]
    assert suspended and "restarting: LakeCommitError: S3 answered 503" in (suspended[-1].reason or "")


def test_a_failure_a_restart_would_meet_again_fails_the_job_at_once(tmp_path: Path) -> None:
    """A SuppressRestartsError (Flink's SuppressRestartsException: a schema that does not fit the
    table) is FAILED at once, restart strategy or not."""
    from chandy.connectors.lake.sink import LakeSchemaError

    cc, env, failovers = _failover_coordinator(tmp_path, LakeSchemaError("column x is string in the table"))
    trigger(cc)
    ack_all(cc, 1)
    assert failovers == [] and cc.job_status == "FAILED"


def test_tolerable_failed_checkpoints_exceeded_is_a_global_failure_for_the_restart_strategy(tmp_path: Path) -> None:
    cc, env, failovers = _failover_coordinator(tmp_path, RuntimeError("unused"), tolerable_failed=0, timeout_ms=100)
    trigger(cc)
    env.advance(100)
    assert len(failovers) == 1 and "tolerable failure threshold" in failovers[0]
    assert cc.job_status == "RUNNING"
    assert not any(isinstance(r, JobStatusRecord) and r.status == "FAILED" for r in env.log)

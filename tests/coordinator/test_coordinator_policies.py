"""The coordinator's policy collaborators on their own, without Kafka or a coordinator: Flink's
CheckpointRequestDecider, CheckpointFailureManager and CompletedCheckpointStore."""

from __future__ import annotations

from chandy.coordinator.completed_checkpoint_store import CompletedCheckpointStore
from chandy.coordinator.failure_manager import (
    CheckpointFailureManager,
    counts_towards_tolerable,
)
from chandy.coordinator.records import CheckpointRecord, CheckpointStatus, CheckpointType
from chandy.coordinator.request_decider import (
    CheckpointRequestDecider,
    CheckpointTriggerRequest,
)
from chandy.coordinator.state import CoordinatorState, apply

JOB = "job"
CP, SP, STOP = CheckpointType.CHECKPOINT, CheckpointType.SAVEPOINT, CheckpointType.SAVEPOINT_TERMINATE


def request(kind=CP, at=0, periodic=False, forced=False) -> CheckpointTriggerRequest:
    return CheckpointTriggerRequest(kind, at, periodic=periodic, forced=forced)


# -- CheckpointRequestDecider --------------------------------------------------------------------
def test_a_request_runs_when_nothing_is_pending() -> None:
    decider = CheckpointRequestDecider(max_concurrent=1, min_pause_ms=0)
    r = request()
    assert decider.choose_request_to_execute(r, is_triggering=False, pending=0, last_completion_ms=None, now_ms=0).execute is r


def test_requests_wait_while_triggering_or_at_max_concurrent_but_forced_ones_do_not() -> None:
    decider = CheckpointRequestDecider(max_concurrent=1, min_pause_ms=0)
    user = request()
    assert decider.choose_request_to_execute(user, is_triggering=True, pending=0, last_completion_ms=None,
                                             now_ms=0).execute is None
    assert decider.choose_queued_request_to_execute(is_triggering=False, pending=1, last_completion_ms=None,
                                                    now_ms=0).execute is None
    savepoint = request(SP, at=5)
    decision = decider.choose_request_to_execute(savepoint, is_triggering=False, pending=1, last_completion_ms=None, now_ms=5)
    assert decision.execute is savepoint  # forced: bypasses max_concurrent, and sorts first
    assert decider.queued == [user] and not user.future.done()


def test_queue_order_is_savepoints_forced_user_then_periodic() -> None:
    decider = CheckpointRequestDecider(max_concurrent=1, min_pause_ms=0)
    periodic, user, forced, savepoint = request(at=1, periodic=True), request(at=2), request(at=3, forced=True), request(SP, at=4)
    for r in (periodic, user, forced, savepoint):
        decider.choose_request_to_execute(r, is_triggering=True, pending=0, last_completion_ms=None, now_ms=4)
    assert decider.queued == [savepoint, forced, user, periodic]


def test_min_pause_applies_to_periodic_requests_only() -> None:
    decider = CheckpointRequestDecider(max_concurrent=1, min_pause_ms=1_000)
    periodic = request(periodic=True, at=1_200)
    decision = decider.choose_request_to_execute(periodic, is_triggering=False, pending=0, last_completion_ms=1_000,
                                                 now_ms=1_200)
    assert decision.execute is None and decision.reschedule_periodic_ms == 800
    assert periodic.future.exception(timeout=0).reason.value == "MINIMUM_TIME_BETWEEN_CHECKPOINTS"
    user = request(at=1_200)
    assert decider.choose_request_to_execute(user, is_triggering=False, pending=0, last_completion_ms=1_000,
                                             now_ms=1_200).execute is user


def test_a_full_queue_refuses_new_user_requests_and_drops_periodic_ones_first() -> None:
    decider = CheckpointRequestDecider(max_concurrent=1, min_pause_ms=0, max_queued=2)
    periodic = request(periodic=True)
    decider.choose_request_to_execute(periodic, is_triggering=True, pending=0, last_completion_ms=None, now_ms=0)
    users = [request(at=i) for i in (1, 2)]
    for r in users:
        decider.choose_request_to_execute(r, is_triggering=True, pending=0, last_completion_ms=None, now_ms=0)
    assert periodic.future.exception(timeout=0).reason.value == "TOO_MANY_CHECKPOINT_REQUESTS"
    refused = request(at=3)
    decider.choose_request_to_execute(refused, is_triggering=True, pending=0, last_completion_ms=None, now_ms=0)
    assert refused.future.exception(timeout=0).reason.value == "TOO_MANY_CHECKPOINT_REQUESTS"
    assert decider.queued == users


def test_abort_all_fails_every_queued_request() -> None:
    from chandy.coordinator.failure import CheckpointFailureReason

    decider = CheckpointRequestDecider(max_concurrent=1, min_pause_ms=0)
    queued = [request(at=i) for i in range(3)]
    for r in queued:
        decider.choose_request_to_execute(r, is_triggering=True, pending=0, last_completion_ms=None, now_ms=0)
    decider.abort_all(CheckpointFailureReason.CHECKPOINT_COORDINATOR_SHUTDOWN, "bye")
    assert decider.queued == [] and all(r.future.exception(timeout=0) for r in queued)


# -- CheckpointFailureManager ----------------------------------------------------------------------
def aborted(checkpoint_id: int, kind: CheckpointType, reason: str, declined_by: str | None = None) -> CheckpointRecord:
    return CheckpointRecord(JOB, checkpoint_id, kind, CheckpointStatus.ABORTED, 1, 0, 0, 1, failure_reason=reason,
                            properties={"declined_by": declined_by} if declined_by else {})


def test_which_failures_count() -> None:
    assert counts_towards_tolerable(aborted(1, CP, "CHECKPOINT_EXPIRED"), -1)
    assert counts_towards_tolerable(aborted(1, CP, "CHECKPOINT_DECLINED", "src[0]#0"), -1)
    assert not counts_towards_tolerable(aborted(1, CP, "CHECKPOINT_SUBSUMED"), -1)
    assert not counts_towards_tolerable(aborted(1, CP, "TASK_FAILURE"), -1)
    assert not counts_towards_tolerable(aborted(1, SP, "CHECKPOINT_EXPIRED"), -1)  # job-level, savepoint
    assert counts_towards_tolerable(aborted(1, SP, "CHECKPOINT_DECLINED", "src[0]#0"), -1)  # task-level
    assert not counts_towards_tolerable(aborted(1, STOP, "CHECKPOINT_DECLINED", "src[0]#0"), -1)  # fails the job
    assert not counts_towards_tolerable(aborted(3, CP, "CHECKPOINT_EXPIRED"), 4)  # older than the last success


def test_what_fails_the_job() -> None:
    manager = CheckpointFailureManager(tolerable_failed=1)
    assert manager.job_failure(aborted(1, CP, "CHECKPOINT_EXPIRED"), 1) is None
    assert "tolerable failure threshold" in manager.job_failure(aborted(2, CP, "CHECKPOINT_EXPIRED"), 2)
    assert "stop-with-savepoint 3" in manager.job_failure(aborted(3, STOP, "CHECKPOINT_DECLINED", "src[0]#0"), 0)
    assert "stop-with-savepoint 3" in manager.job_failure(aborted(3, STOP, "CHECKPOINT_EXPIRED"), 0)
    assert manager.job_failure(aborted(3, STOP, "TRIGGER_CHECKPOINT_FAILURE"), 0) is None


# -- CompletedCheckpointStore ----------------------------------------------------------------------
def completed(checkpoint_id: int, kind: CheckpointType, **properties: str) -> CheckpointRecord:
    return CheckpointRecord(JOB, checkpoint_id, kind, CheckpointStatus.COMPLETED, 1, 0, 0, 1,
                            external_pointer=f"file:///c/{checkpoint_id}", properties=dict(properties))


def test_intermediate_savepoints_are_no_restore_candidates() -> None:
    state = CoordinatorState(JOB)
    for record in (completed(1, SP, restored_from="file:///sp"), completed(2, CP), completed(3, SP)):
        apply(state, record)
    assert [c.checkpoint_id for c in CompletedCheckpointStore.entries(state)] == [1, 2]
    assert CompletedCheckpointStore.latest(state).checkpoint_id == 2
    apply(state, completed(4, STOP))
    assert CompletedCheckpointStore.latest(state).checkpoint_id == 4


def test_retention_keeps_the_newest_and_never_deletes_savepoints_or_restored_snapshots() -> None:
    store = CompletedCheckpointStore(num_retained=1)
    state = CoordinatorState(JOB)
    for record in (completed(1, CP, restored_from="file:///other"), completed(2, SP), aborted(3, CP, "CHECKPOINT_EXPIRED"),
                   completed(4, CP)):
        apply(state, record)
    decision = store.retention(state, completed(5, CP))
    assert decision.tombstones == (1, 3, 4)  # the intermediate savepoint 2 is no entry: kept
    assert decision.directories_to_delete == ("file:///c/4",)  # not the restored snapshot 1
    assert store.retention(state, None).tombstones == (1, 3)

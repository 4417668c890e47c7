"""Which checkpoint failures count, and which fail the job: Flink's CheckpointFailureManager.

Flink's ``CheckpointFailureManager.handleCheckpointException`` tells failures apart by where they
happened and by what failed:

| failure                                   | checkpoint       | savepoint        | stop-with-savepoint |
| ----------------------------------------- | ---------------- | ---------------- | ------------------- |
| on the coordinator (expiry, I/O, hooks)   | counted          | ignored          | see below           |
| declined by a task                        | counted          | counted          | fails the job       |

"Counted" means: the reason is one of :data:`~chandy.coordinator.failure.COUNTED_REASONS`, the
checkpoint is newer than the last successful one (``checkFailureAgainstCounter``) and each
checkpoint counts once; the job fails when the count exceeds ``tolerable_failed``. Any successful
checkpoint *or savepoint* newer than the last success resets the count (``handleCheckpointSuccess``).

Stop-with-savepoint: a task's decline fails the job at once, as Flink's
``handleTaskLevelCheckpointException`` (a synchronous savepoint that cannot finish must not
leave the job hanging). Chandy also fails the job when stop-with-savepoint *expires*, because a
Chandy job is told to stop by that savepoint and nothing else would stop it; other
coordinator-side failures (a hook or the storage failing) leave the job running with periodic
checkpoints restarted, as Flink's ``StopWithSavepointTerminationHandlerImpl`` does.

The counting is part of the pure fold (:func:`chandy.coordinator.state.apply` calls
:func:`counts_towards_tolerable`), so a replayed log has exactly the live count; the decision to
fail the job is the coordinator's, written as a JobStatusRecord.
"""

from __future__ import annotations

import dataclasses

from chandy.coordinator.failure import COUNTED_REASONS, CheckpointFailureReason
from chandy.coordinator.records import CheckpointRecord, CheckpointStatus, CheckpointType

#: ``CheckpointRecord.properties`` key set when a task declined the checkpoint (its value names
#: the subtask attempt): Flink's ``executionAttemptID != null``, a task-level failure.
DECLINED_BY = "declined_by"

#: Flink's ``CheckpointFailureManager.EXCEEDED_CHECKPOINT_TOLERABLE_FAILURE_MESSAGE``.
EXCEEDED_MESSAGE = "Exceeded checkpoint tolerable failure threshold"


def is_task_failure(record: CheckpointRecord) -> bool:
    """Whether a task declined this aborted checkpoint (not the coordinator that aborted it)."""
    return DECLINED_BY in record.properties


def counts_towards_tolerable(record: CheckpointRecord, last_succeeded_checkpoint_id: int) -> bool:
    """Whether an ABORTED record adds one to the continuous-failure count (Flink's
    ``CheckpointFailureManager.handleCheckpointException`` → ``checkFailureAgainstCounter`` →
    ``checkFailureCounter``). Pure: the state fold calls it.

    Args:
        record: the checkpoint's first ABORTED record.
        last_succeeded_checkpoint_id: the newest completed checkpoint or savepoint (-1: none).
    """
    if record.status is not CheckpointStatus.ABORTED or not record.failure_reason:
        return False
    if record.checkpoint_type is CheckpointType.SAVEPOINT_TERMINATE:
        return False  # a declined one fails the job outright; coordinator-side failures never count
    if record.checkpoint_type is CheckpointType.SAVEPOINT and not is_task_failure(record):
        return False  # handleJobLevelCheckpointException ignores savepoints
    if record.checkpoint_id <= last_succeeded_checkpoint_id:
        return False
    try:
        return CheckpointFailureReason(record.failure_reason) in COUNTED_REASONS
    except ValueError:
        return False


@dataclasses.dataclass(frozen=True)
class CheckpointFailureManager:
    """Decides whether an aborted checkpoint fails the job (Flink's CheckpointFailureManager).

    Args:
        tolerable_failed: ``execution.checkpointing.tolerable-failed-checkpoints``.
    """

    tolerable_failed: int

    def job_failure(self, record: CheckpointRecord, continuous_failures: int) -> str | None:
        """Why the job must fail after ``record`` (an ABORTED record already folded into a state
        whose count is now ``continuous_failures``), or None when it goes on.

        As ``CheckpointFailureManager.handleTaskLevelCheckpointException`` (a declined
        stop-with-savepoint fails the job) and ``checkFailureAgainstCounter`` (the count exceeds
        the tolerable failures); see the module docstring for an expired stop-with-savepoint.
        """
        reason = record.failure_reason
        if record.checkpoint_type is CheckpointType.SAVEPOINT_TERMINATE and (
                is_task_failure(record) or reason == CheckpointFailureReason.CHECKPOINT_EXPIRED.value):
            return f"stop-with-savepoint {record.checkpoint_id} failed: {reason}: {record.failure_message or ''}".rstrip(": ")
        if continuous_failures > self.tolerable_failed:
            return (f"{EXCEEDED_MESSAGE}: {continuous_failures} consecutive failures, "
                    f"{self.tolerable_failed} tolerated (last: {reason})")
        return None

    @staticmethod
    def restarts_periodic_checkpoints(record: CheckpointRecord) -> bool:
        """Whether a failed stop-with-savepoint that left the job running restarts periodic
        checkpoints (Flink's ``StopWithSavepointTerminationHandlerImpl.handleSavepointCreationFailure``
        → ``startCheckpointScheduler``)."""
        return record.checkpoint_type is CheckpointType.SAVEPOINT_TERMINATE

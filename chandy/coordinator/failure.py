"""Why checkpoints fail: Flink's CheckpointFailureReason, and which failures count.

The names are those of Flink's ``org.apache.flink.runtime.checkpoint.CheckpointFailureReason``
and of the ``chandy.v1.CheckpointFailureReason`` Avro enum (the two lists are checked equal by a
test). :data:`COUNTED_REASONS` are the reasons Flink's ``CheckpointFailureManager`` counts
towards ``execution.checkpointing.tolerable-failed-checkpoints``; every other reason is ignored
by that count (a subsumed or too-early checkpoint is not a failure of the job).
"""

from __future__ import annotations

import enum

from chandy.coordinator.errors import ChandyError


class CheckpointFailureReason(str, enum.Enum):
    """Flink's CheckpointFailureReason, one member per name."""

    PERIODIC_SCHEDULER_SHUTDOWN = "PERIODIC_SCHEDULER_SHUTDOWN"
    TOO_MANY_CHECKPOINT_REQUESTS = "TOO_MANY_CHECKPOINT_REQUESTS"
    MINIMUM_TIME_BETWEEN_CHECKPOINTS = "MINIMUM_TIME_BETWEEN_CHECKPOINTS"
    NOT_ALL_REQUIRED_TASKS_RUNNING = "NOT_ALL_REQUIRED_TASKS_RUNNING"
    IO_EXCEPTION = "IO_EXCEPTION"
    BLOCKING_OUTPUT_EXIST = "BLOCKING_OUTPUT_EXIST"
    CHECKPOINT_ASYNC_EXCEPTION = "CHECKPOINT_ASYNC_EXCEPTION"
    CHANNEL_STATE_SHARED_STREAM_EXCEPTION = "CHANNEL_STATE_SHARED_STREAM_EXCEPTION"
    CHECKPOINT_EXPIRED = "CHECKPOINT_EXPIRED"
    CHECKPOINT_SUBSUMED = "CHECKPOINT_SUBSUMED"
    CHECKPOINT_DECLINED = "CHECKPOINT_DECLINED"
    CHECKPOINT_DECLINED_TASK_NOT_READY = "CHECKPOINT_DECLINED_TASK_NOT_READY"
    CHECKPOINT_DECLINED_TASK_CLOSING = "CHECKPOINT_DECLINED_TASK_CLOSING"
    CHECKPOINT_DECLINED_SUBSUMED = "CHECKPOINT_DECLINED_SUBSUMED"
    CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER = "CHECKPOINT_DECLINED_ON_CANCELLATION_BARRIER"
    CHECKPOINT_DECLINED_INPUT_END_OF_STREAM = "CHECKPOINT_DECLINED_INPUT_END_OF_STREAM"
    CHECKPOINT_COORDINATOR_SHUTDOWN = "CHECKPOINT_COORDINATOR_SHUTDOWN"
    CHECKPOINT_COORDINATOR_SUSPEND = "CHECKPOINT_COORDINATOR_SUSPEND"
    JOB_FAILOVER_REGION = "JOB_FAILOVER_REGION"
    TASK_FAILURE = "TASK_FAILURE"
    TASK_CHECKPOINT_FAILURE = "TASK_CHECKPOINT_FAILURE"
    UNKNOWN_TASK_CHECKPOINT_NOTIFICATION_FAILURE = "UNKNOWN_TASK_CHECKPOINT_NOTIFICATION_FAILURE"
    FINALIZE_CHECKPOINT_FAILURE = "FINALIZE_CHECKPOINT_FAILURE"
    TRIGGER_CHECKPOINT_FAILURE = "TRIGGER_CHECKPOINT_FAILURE"


#: Reasons counted towards the tolerable failed checkpoints, as Flink's
#: ``CheckpointFailureManager.checkFailureCounter`` (IO and async exceptions, declines, expiry,
#: finalization failures). Savepoint failures never count.
COUNTED_REASONS = frozenset(
    {
        CheckpointFailureReason.IO_EXCEPTION,
        CheckpointFailureReason.CHECKPOINT_ASYNC_EXCEPTION,
        CheckpointFailureReason.CHECKPOINT_DECLINED,
        CheckpointFailureReason.CHECKPOINT_EXPIRED,
        CheckpointFailureReason.FINALIZE_CHECKPOINT_FAILURE,
    }
)


class CheckpointException(ChandyError):
    """A checkpoint or savepoint failed; ``reason`` is its :class:`CheckpointFailureReason`
    (the result of a failed ``trigger_checkpoint`` / ``trigger_savepoint`` future)."""

    def __init__(self, reason: CheckpointFailureReason, message: str | None = None, checkpoint_id: int | None = None):
        self.reason = CheckpointFailureReason(reason)
        self.checkpoint_id = checkpoint_id
        self.detail = message
        where = f"checkpoint {checkpoint_id}" if checkpoint_id is not None else "checkpoint"
        super().__init__(f"{where} failed: {self.reason.value}" + (f": {message}" if message else ""))

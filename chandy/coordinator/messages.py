"""Typed control, ack and event messages: one frozen dataclass per Avro schema in ``schemas/``.

Times are ms since the Unix epoch, sizes bytes. ``epoch`` is the coordinator epoch: workers drop
control messages from an epoch older than the newest they have seen, and the coordinator treats
acks for a trigger of an older epoch as late.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from chandy.coordinator import serde


class _Message(serde.AvroMapped):
    SCHEMA: ClassVar[str]
    job_id: str


@dataclasses.dataclass(frozen=True)
class StateHandle:
    """A handle to a piece of checkpointed state (Flink's StateObject): a file or directory URL
    (``path``), small ``inline_data``, or neither for empty state. ``state_size`` in bytes."""

    kind: str
    path: str | None = None
    inline_data: bytes | None = None
    state_size: int = 0
    properties: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class CheckpointMetrics:
    """What a subtask measured for its part of a checkpoint (Flink's CheckpointMetrics)."""

    sync_duration_ms: int = 0
    async_duration_ms: int = 0
    bytes_persisted: int = 0
    records_processed: int = 0


@dataclasses.dataclass(frozen=True)
class TriggerCheckpoint(_Message):
    """Coordinator → workers: take checkpoint ``checkpoint_id`` (the checkpoint barrier)."""

    SCHEMA: ClassVar[str] = "chandy.v1.TriggerCheckpoint"
    job_id: str
    epoch: int
    checkpoint_id: int
    timestamp: int
    checkpoint_type: str = "CHECKPOINT"
    target_location: bytes | None = None
    operator_ids: tuple[str, ...] = ()
    properties: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class AcknowledgeCheckpoint(_Message):
    """Worker → coordinator: a subtask attempt finished its part of a checkpoint."""

    SCHEMA: ClassVar[str] = "chandy.v1.AcknowledgeCheckpoint"
    job_id: str
    epoch: int
    checkpoint_id: int
    operator_id: str
    subtask_index: int
    attempt_number: int
    state_handles: tuple[StateHandle, ...] = ()
    metrics: CheckpointMetrics = dataclasses.field(default_factory=CheckpointMetrics)
    timestamp: int = 0


@dataclasses.dataclass(frozen=True)
class DeclineCheckpoint(_Message):
    """Worker → coordinator: a subtask attempt cannot take a checkpoint; aborts it."""

    SCHEMA: ClassVar[str] = "chandy.v1.DeclineCheckpoint"
    job_id: str
    epoch: int
    checkpoint_id: int
    operator_id: str
    subtask_index: int
    attempt_number: int
    reason: str
    message: str | None = None
    timestamp: int = 0


@dataclasses.dataclass(frozen=True)
class NotifyCheckpointComplete(_Message):
    """Coordinator → workers: checkpoint completed (and, by subsumption, all below it)."""

    SCHEMA: ClassVar[str] = "chandy.v1.NotifyCheckpointComplete"
    job_id: str
    epoch: int
    checkpoint_id: int
    checkpoint_type: str = "CHECKPOINT"
    timestamp: int = 0


@dataclasses.dataclass(frozen=True)
class NotifyCheckpointAborted(_Message):
    """Coordinator → workers: checkpoint aborted."""

    SCHEMA: ClassVar[str] = "chandy.v1.NotifyCheckpointAborted"
    job_id: str
    epoch: int
    checkpoint_id: int
    reason: str
    message: str | None = None
    timestamp: int = 0


@dataclasses.dataclass(frozen=True)
class OperatorEventMessage(_Message):
    """An operator event between a coordinator and one subtask attempt (Flink's OperatorEvent),
    on the control topic towards the subtask, on the acks topic from it."""

    SCHEMA: ClassVar[str] = "chandy.v1.OperatorEvent"
    job_id: str
    epoch: int
    operator_id: str
    subtask_index: int
    attempt_number: int
    event_type: str
    payload: bytes = b""
    timestamp: int = 0


#: ``event_type`` of the operator event a coordinator sends, to no subtask (operator ``""``,
#: subtask and attempt -1), when it starts leading a job with a new epoch. Workers ignore the event
#: itself; its newer epoch makes every running attempt report ``SubtaskAttemptReady`` again, which
#: the new coordinator waits for before it triggers (Flink's TaskExecutors re-register with a newly
#: elected JobMaster).
COORDINATOR_ELECTED_EVENT = "chandy.coordinator-elected"


@dataclasses.dataclass(frozen=True)
class SubtaskAttemptReady(_Message):
    """Worker → coordinator: an attempt is ready to receive events."""

    SCHEMA: ClassVar[str] = "chandy.v1.SubtaskAttemptReady"
    job_id: str
    operator_id: str
    subtask_index: int
    attempt_number: int
    host: str | None = None
    timestamp: int = 0


@dataclasses.dataclass(frozen=True)
class SubtaskAttemptFailed(_Message):
    """Worker → coordinator: an attempt failed or was cancelled."""

    SCHEMA: ClassVar[str] = "chandy.v1.SubtaskAttemptFailed"
    job_id: str
    operator_id: str
    subtask_index: int
    attempt_number: int
    reason: str | None = None
    timestamp: int = 0


@dataclasses.dataclass(frozen=True)
class OffsetRange:
    """Kafka offsets ``[start_offset, end_offset)`` of one topic partition (records)."""

    topic: str
    partition: int
    start_offset: int
    end_offset: int


@dataclasses.dataclass(frozen=True)
class PartitionEventTime:
    """The newest Kafka record timestamp (ms since the epoch) of one topic partition a job landed."""

    topic: str
    partition: int
    event_time_ms: int


@dataclasses.dataclass(frozen=True)
class IdlePartition:
    """A topic partition that received no record for the job's source idle timeout (Flink's
    ``WatermarkStrategy.withIdleness``), so it does not hold the completeness watermark back."""

    topic: str
    partition: int


@dataclasses.dataclass(frozen=True)
class OperatorParallelism:
    """An operator of a job (Flink's job vertex) and its number of subtasks."""

    operator_id: str
    parallelism: int


@dataclasses.dataclass(frozen=True)
class CheckpointEvent(_Message):
    """The public event of a trigger, completion, abort or savepoint, with its statistics; also
    the answer to a control request (``REQUEST_ACCEPTED`` / ``REQUEST_COMPLETED`` /
    ``REQUEST_FAILED``, with ``request_id``), a job status change (``JOB_STATUS_CHANGED``, with
    ``job_status``) and a lake commit (``LAKE_COMMITTED``: checkpoint ``checkpoint_id`` is
    visible in ``table_uri`` at ``table_version``, Delta's version or Iceberg's snapshot ID; the
    commit added ``records_added`` records in ``files_added`` files, read from ``offset_ranges``; the
    table holds every record read with a Kafka timestamp up to ``valid_through_ms``, the minimum of
    the per-partition ``event_times`` over every assigned partition but the ``idle_partitions``,
    the completeness watermark; None while an assigned partition that is not idle is unread;
    ``committed_with``: the sorted URIs of the tables the catalog was asked to apply together with
    this one, itself included, in one multi-table commit; None when it was committed alone).
    A ``TRIGGERED`` event also carries ``job_name``, the checkpointing configuration
    ``checkpoint_config`` (ms and counts) and the job's ``operators``.

    ``COMPLETED`` is Flink's checkpoint completion: durable, but the sinks commit after it (on
    ``notifyCheckpointComplete``); ``LAKE_COMMITTED`` follows it once the records are readable.
    Readers ignore event types they do not know."""

    SCHEMA: ClassVar[str] = "chandy.v1.CheckpointEvent"
    job_id: str
    checkpoint_id: int
    event_type: str
    checkpoint_type: str
    epoch: int
    timestamp: int
    trigger_timestamp: int
    end_to_end_duration_ms: int | None = None
    num_subtasks: int = 0
    num_acknowledged: int = 0
    state_size: int = 0
    failure_reason: str | None = None
    failure_message: str | None = None
    external_pointer: str | None = None
    request_id: str | None = None
    request_type: str | None = None
    job_status: str | None = None
    table_uri: str | None = None
    table_format: str | None = None
    table_version: int | None = None
    previous_table_version: int | None = None
    records_added: int | None = None
    files_added: int | None = None
    offset_ranges: tuple[OffsetRange, ...] | None = None
    job_name: str | None = None
    checkpoint_config: dict[str, int] | None = None
    operators: tuple[OperatorParallelism, ...] | None = None
    valid_through_ms: int | None = None
    event_times: tuple[PartitionEventTime, ...] | None = None
    idle_partitions: tuple[IdlePartition, ...] | None = None
    committed_with: tuple[str, ...] | None = None


#: Avro schema name -> message class, for decoding.
MESSAGE_TYPES: dict[str, type[serde.AvroMapped]] = {
    cls.SCHEMA: cls
    for cls in (TriggerCheckpoint, AcknowledgeCheckpoint, DeclineCheckpoint, NotifyCheckpointComplete,
                NotifyCheckpointAborted, OperatorEventMessage, SubtaskAttemptReady, SubtaskAttemptFailed,
                CheckpointEvent)
}

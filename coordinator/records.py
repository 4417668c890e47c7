"""The records of the coordinator's event-sourced log (``<prefix>.coordinator-log``).

Each record is a frozen dataclass mirroring its Avro schema in ``schemas/``; its :meth:`key`
is the compaction key (job id, record kind, entity id), so compaction keeps the latest state of
each checkpoint, split assignment, counter and epoch. A :class:`Tombstone` deletes a key (a
checkpoint that fell out of retention). Every value carries ``record_version`` (1 today).

Records are the only input of :func:`coordinator.state.apply`; decisions produce them, the
runtime appends them, and only appended records change the state.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, ClassVar

from coordinator import serde
from coordinator.errors import ChandyError

RECORD_VERSION = 1


class LogRecordError(ChandyError):
    """A log record's key and value disagree, or a record kind is not known."""


class CheckpointStatus(str, enum.Enum):
    """Where a checkpoint is in its life (the ``chandy.v1.CheckpointStatus`` Avro enum)."""

    PENDING = "PENDING"
    COMPLETED = "COMPLETED"
    ABORTED = "ABORTED"
    DISCARDED = "DISCARDED"

    def __str__(self) -> str:
        return self.value


class CheckpointType(str, enum.Enum):
    """What a checkpoint ID stands for, as Flink's ``SnapshotType`` (the ``chandy.v1.CheckpointType``
    Avro enum): a CHECKPOINT, an intermediate SAVEPOINT, or the synchronous SAVEPOINT_TERMINATE of
    stop-with-savepoint."""

    CHECKPOINT = "CHECKPOINT"
    SAVEPOINT = "SAVEPOINT"
    SAVEPOINT_TERMINATE = "SAVEPOINT_TERMINATE"

    def __str__(self) -> str:
        return self.value

    @property
    def is_savepoint(self) -> bool:
        """Flink's ``CheckpointProperties.isSavepoint``."""
        return self is not CheckpointType.CHECKPOINT

    @property
    def is_synchronous(self) -> bool:
        """Flink's ``CheckpointProperties.isSynchronous``: stop-with-savepoint."""
        return self is CheckpointType.SAVEPOINT_TERMINATE


class JobStatus(str, enum.Enum):
    """The job's status as the coordinator decides it (the ``chandy.v1.JobStatus`` Avro enum)."""

    CREATED = "CREATED"
    RUNNING = "RUNNING"
    FAILING = "FAILING"
    FAILED = "FAILED"
    FINISHED = "FINISHED"
    SUSPENDED = "SUSPENDED"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True, order=True)
class LogKey:
    """The compaction key of a log record: (job id, kind, entity id)."""

    job_id: str
    kind: str
    entity_id: str

    def to_avro(self) -> dict[str, str]:
        return {"job_id": self.job_id, "kind": self.kind, "entity_id": self.entity_id}

    @classmethod
    def from_avro(cls, value: dict[str, Any]) -> LogKey:
        return cls(value["job_id"], value["kind"], value["entity_id"])


class _Record(serde.AvroMapped):
    """Shared behaviour; subclasses set ``SCHEMA`` and ``KIND`` and define ``entity_id``."""

    SCHEMA: ClassVar[str]
    KIND: ClassVar[str]
    RECORD_VERSION: ClassVar[int] = RECORD_VERSION
    job_id: str

    @property
    def entity_id(self) -> str:  # pragma: no cover - every subclass overrides
        raise NotImplementedError

    def key(self) -> LogKey:
        return LogKey(self.job_id, self.KIND, self.entity_id)


@dataclasses.dataclass(frozen=True)
class CoordinatorEpochRecord(_Record):
    """A coordinator became active with ``epoch``, fencing all older ones (kind ``epoch``)."""

    SCHEMA: ClassVar[str] = "chandy.v1.CoordinatorEpochRecord"
    KIND: ClassVar[str] = "epoch"

    job_id: str
    epoch: int
    transactional_id: str
    host: str | None
    timestamp: int

    @property
    def entity_id(self) -> str:
        return "coordinator"


@dataclasses.dataclass(frozen=True)
class CheckpointRecord(_Record):
    """The latest state of one checkpoint or savepoint (kind ``checkpoint``, entity its ID).

    ``status`` is PENDING, COMPLETED or ABORTED; times are ms since the Unix epoch, ``state_size``
    bytes; ``failure_reason`` is a :class:`~coordinator.failure.CheckpointFailureReason` name.
    """

    SCHEMA: ClassVar[str] = "chandy.v1.CheckpointRecord"
    KIND: ClassVar[str] = "checkpoint"

    job_id: str
    checkpoint_id: int
    checkpoint_type: CheckpointType
    status: CheckpointStatus
    epoch: int
    trigger_timestamp: int
    status_timestamp: int
    num_subtasks: int
    num_acknowledged: int = 0
    state_size: int = 0
    external_pointer: str | None = None
    failure_reason: str | None = None
    failure_message: str | None = None
    properties: dict[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        # decoded records carry plain strings; live ones the enums (equal either way, typed always)
        object.__setattr__(self, "checkpoint_type", CheckpointType(self.checkpoint_type))
        object.__setattr__(self, "status", CheckpointStatus(self.status))

    @property
    def entity_id(self) -> str:
        return str(self.checkpoint_id)

    @property
    def is_savepoint(self) -> bool:
        return self.checkpoint_type.is_savepoint


@dataclasses.dataclass(frozen=True)
class CheckpointIdCounterRecord(_Record):
    """The next checkpoint ID (kind ``counter``); shared by checkpoints and savepoints."""

    SCHEMA: ClassVar[str] = "chandy.v1.CheckpointIdCounterRecord"
    KIND: ClassVar[str] = "counter"

    job_id: str
    next_checkpoint_id: int

    @property
    def entity_id(self) -> str:
        return "checkpoint-id"


@dataclasses.dataclass(frozen=True)
class JobStatusRecord(_Record):
    """The job's status as the coordinator decided it (kind ``job``)."""

    SCHEMA: ClassVar[str] = "chandy.v1.JobStatusRecord"
    KIND: ClassVar[str] = "job"

    job_id: str
    status: JobStatus
    epoch: int
    reason: str | None
    timestamp: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", JobStatus(self.status))

    @property
    def entity_id(self) -> str:
        return "status"


@dataclasses.dataclass(frozen=True)
class SplitAssignment:
    """One split and the reader subtask it is assigned to (-1: not yet assigned)."""

    split_id: str
    topic: str
    partition: int
    subtask_index: int
    starting_offset: int
    stopping_offset: int | None = None


@dataclasses.dataclass(frozen=True)
class SplitAssignmentRecord(_Record):
    """A source enumerator's split assignment (kind ``splits``, entity the operator ID)."""

    SCHEMA: ClassVar[str] = "chandy.v1.SplitAssignmentRecord"
    KIND: ClassVar[str] = "splits"

    job_id: str
    operator_id: str
    checkpoint_id: int
    splits: tuple[SplitAssignment, ...]
    timestamp: int

    @property
    def entity_id(self) -> str:
        return self.operator_id


@dataclasses.dataclass(frozen=True)
class TopicPartitionOffset:
    """A Kafka offset (the next record to read) of one topic partition."""

    topic: str
    partition: int
    offset: int


@dataclasses.dataclass(frozen=True)
class OffsetCommitRecord(_Record):
    """Offsets committed to a consumer group for a checkpoint (kind ``offsets``, entity the group)."""

    SCHEMA: ClassVar[str] = "chandy.v1.OffsetCommitRecord"
    KIND: ClassVar[str] = "offsets"

    job_id: str
    group_id: str
    checkpoint_id: int
    offsets: tuple[TopicPartitionOffset, ...]
    timestamp: int

    @property
    def entity_id(self) -> str:
        return self.group_id


@dataclasses.dataclass(frozen=True)
class Tombstone:
    """Deletes ``key`` from the state and, after compaction, from the log (a null value)."""

    key_: LogKey

    def key(self) -> LogKey:
        return self.key_


LogRecord = (
    CoordinatorEpochRecord | CheckpointRecord | CheckpointIdCounterRecord | JobStatusRecord
    | SplitAssignmentRecord | OffsetCommitRecord | Tombstone
)

#: Avro schema name -> record class, for decoding.
RECORD_TYPES: dict[str, type] = {
    cls.SCHEMA: cls
    for cls in (CoordinatorEpochRecord, CheckpointRecord, CheckpointIdCounterRecord, JobStatusRecord,
                SplitAssignmentRecord, OffsetCommitRecord)
}

#: The record kinds this version knows (a loader skips other kinds with a warning, as Kafka's
#: ``CoordinatorLoaderImpl`` skips unknown record types).
KNOWN_KINDS: frozenset[str] = frozenset({"checkpoint", "counter", "epoch", "job", "splits", "offsets"})

"""The records of the coordinator's event-sourced log (``<prefix>.coordinator-log``).

Each record is a frozen dataclass mirroring its Avro schema in ``schemas/``; its :meth:`key`
is the compaction key (job id, record kind, entity id), so compaction keeps the latest state of
each checkpoint, counter, epoch and connector entity. A :class:`Tombstone` deletes a key (a
checkpoint that fell out of retention). Every value carries ``record_version`` (1 today).

Records are the only input of :func:`chandy.coordinator.state.apply`; decisions produce them, the
runtime appends them, and only appended records change the state.

The log is generic over its record kinds: this module defines and registers the core's own
(epoch, checkpoint, counter, job); a connector defines its own kinds as :class:`LogRecordBase`
subclasses and registers them with :func:`register_record_kind` (the Kafka source's split
assignments and offset commits live in ``connectors/kafka/source/log_records.py``).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any, ClassVar

from chandy.coordinator import serde
from chandy.coordinator.errors import ChandyError

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
    CANCELED = "CANCELED"

    @property
    def is_terminal(self) -> bool:
        """Flink's ``JobStatus.isGloballyTerminalState``: the job will not run again."""
        return self in (JobStatus.FAILED, JobStatus.FINISHED, JobStatus.CANCELED)

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


class LogRecordBase(serde.AvroMapped):
    """The base of every log record: a frozen dataclass mirroring the Avro record ``SCHEMA``, with
    the compaction-key ``KIND`` and an ``entity_id``. Connectors subclass it for their own kinds
    and register them with :func:`register_record_kind`."""

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
class CoordinatorEpochRecord(LogRecordBase):
    """A coordinator became active with ``epoch``, fencing all older ones (kind ``epoch``).

    ``coordinator_id`` names the coordinator instance (a random ID per start; None in records
    written before it existed): two instances can claim one epoch number, and the log writer's
    proof after replacing a stuck producer tells them apart by it.
    """

    SCHEMA: ClassVar[str] = "chandy.v1.CoordinatorEpochRecord"
    KIND: ClassVar[str] = "epoch"

    job_id: str
    epoch: int
    transactional_id: str
    host: str | None
    timestamp: int
    coordinator_id: str | None = None

    @property
    def entity_id(self) -> str:
        return "coordinator"


@dataclasses.dataclass(frozen=True)
class CheckpointRecord(LogRecordBase):
    """The latest state of one checkpoint or savepoint (kind ``checkpoint``, entity its ID).

    ``status`` is PENDING, COMPLETED or ABORTED; times are ms since the Unix epoch, ``state_size``
    bytes; ``failure_reason`` is a :class:`~chandy.coordinator.failure.CheckpointFailureReason` name.
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
class CheckpointIdCounterRecord(LogRecordBase):
    """The next checkpoint ID (kind ``counter``); shared by checkpoints and savepoints."""

    SCHEMA: ClassVar[str] = "chandy.v1.CheckpointIdCounterRecord"
    KIND: ClassVar[str] = "counter"

    job_id: str
    next_checkpoint_id: int

    @property
    def entity_id(self) -> str:
        return "checkpoint-id"


@dataclasses.dataclass(frozen=True)
class JobStatusRecord(LogRecordBase):
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
class Tombstone:
    """Deletes ``key`` from the state and, after compaction, from the log (a null value)."""

    key_: LogKey

    def key(self) -> LogKey:
        return self.key_


LogRecord = LogRecordBase | Tombstone
"""A record of the coordinator log: a record of a registered kind, or a tombstone."""


# -- the registry of record kinds ------------------------------------------------------------

ExtensionFold = Callable[[dict[str, Any], Any], None]
"""Folds one record of an extension kind into that kind's entities (entity ID -> latest value)."""


def latest_per_entity(entities: dict[str, Any], record: Any) -> None:
    """The default fold of an extension kind: keep the latest record per entity, exactly what the
    compacted topic keeps, so replaying a compacted log gives the same state."""
    entities[record.entity_id] = record


@dataclasses.dataclass(frozen=True)
class RecordKind:
    """A kind of coordinator-log record: its key ``kind``, its record class (whose ``SCHEMA`` is
    the Avro name of its values), the fold for extension kinds (``None`` for the core's own
    kinds, which :func:`chandy.coordinator.state.apply` folds itself), and ``describe``, which turns a
    record into the fields of a replay timeline entry (``{"event": ..., ...}``)."""

    kind: str
    record_type: type[LogRecordBase]
    fold: ExtensionFold | None = None
    describe: Callable[[Any], dict[str, Any]] | None = None

    @property
    def is_extension(self) -> bool:
        return self.fold is not None


_KINDS: dict[str, RecordKind] = {}
_BY_SCHEMA: dict[str, type[LogRecordBase]] = {}


def register_record_kind(record_type: type[LogRecordBase], *, fold: ExtensionFold | None = latest_per_entity,
                         describe: Callable[[Any], dict[str, Any]] | None = None) -> type[LogRecordBase]:
    """Register a connector's log-record kind, as Kafka's coordinator runtime is generic over its
    record type: the loader then decodes it, :func:`chandy.coordinator.state.apply` folds it with
    ``fold`` into ``state.extensions[kind]``, and ``chandy log replay`` shows it with ``describe``.

    Registering the same class again is a no-op (modules may be imported twice).

    Raises:
        LogRecordError: the kind or Avro name is already registered by another class.
    """
    kind, schema = record_type.KIND, record_type.SCHEMA
    existing = _KINDS.get(kind)
    if existing is not None:
        if existing.record_type is record_type:
            return record_type
        raise LogRecordError(f"log record kind {kind!r} is already registered by {existing.record_type.__name__}")
    if schema in _BY_SCHEMA:
        raise LogRecordError(f"log record schema {schema} is already registered by {_BY_SCHEMA[schema].__name__}")
    _KINDS[kind] = RecordKind(kind, record_type, fold, describe)
    _BY_SCHEMA[schema] = record_type
    return record_type


def record_kind(kind: str) -> RecordKind | None:
    """The registered kind ``kind``, or None (a loader skips such records with a warning, as
    Kafka's ``CoordinatorLoaderImpl`` skips unknown record types)."""
    return _KINDS.get(kind)


def record_type_for(schema_name: str) -> type[LogRecordBase] | None:
    """The record class whose values have the Avro name ``schema_name``, or None."""
    return _BY_SCHEMA.get(schema_name)


def known_kinds() -> frozenset[str]:
    """The record kinds registered in this process (the core's and the imported connectors')."""
    return frozenset(_KINDS)


for _core in (CoordinatorEpochRecord, CheckpointRecord, CheckpointIdCounterRecord, JobStatusRecord):
    register_record_kind(_core, fold=None)

"""The control request on the wire: :class:`ControlRequest` (Avro ``chandy.v1.ControlRequest`` on
``<prefix>.requests``, keyed by job ID), its :class:`ControlRequestType` and the
:class:`RequestStatus` of its answer. What happens to a request is
:mod:`chandy.coordinator.kafka.requests`'; who reads it, :mod:`chandy.coordinator.kafka.election`'."""

from __future__ import annotations

import dataclasses
import enum
from typing import ClassVar

from chandy.coordinator.records import CheckpointType
from chandy.coordinator.serde import AvroMapped


class ControlRequestType(str, enum.Enum):
    """What a request asks (the ``chandy.v1.ControlRequestType`` Avro enum)."""

    UNKNOWN = "UNKNOWN"
    TRIGGER_CHECKPOINT = "TRIGGER_CHECKPOINT"
    TRIGGER_SAVEPOINT = "TRIGGER_SAVEPOINT"
    STOP_WITH_SAVEPOINT = "STOP_WITH_SAVEPOINT"
    CANCEL = "CANCEL"

    def __str__(self) -> str:
        return self.value

    @property
    def checkpoint_type(self) -> CheckpointType:
        """The type of the checkpoint the request takes (CHECKPOINT for cancel: none)."""
        return {ControlRequestType.TRIGGER_SAVEPOINT: CheckpointType.SAVEPOINT,
                ControlRequestType.STOP_WITH_SAVEPOINT: CheckpointType.SAVEPOINT_TERMINATE}.get(
                    self, CheckpointType.CHECKPOINT)


class RequestStatus(str, enum.Enum):
    """A request's outcome in the log (the ``chandy.v1.RequestStatus`` Avro enum)."""

    ACCEPTED = "ACCEPTED"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class ControlRequest(AvroMapped):
    """One request (``chandy.v1.ControlRequest``); times in ms since the Unix epoch."""

    SCHEMA: ClassVar[str] = "chandy.v1.ControlRequest"
    RECORD_VERSION: ClassVar[int] = 1

    request_id: str
    job_id: str
    request_type: ControlRequestType
    target_directory: str | None = None
    savepoint_format: str | None = None
    drain: bool = False
    timestamp: int = 0
    deadline: int = 0
    requester: str | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "request_type", ControlRequestType(self.request_type))
        except ValueError:
            object.__setattr__(self, "request_type", ControlRequestType.UNKNOWN)

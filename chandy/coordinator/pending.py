"""A checkpoint in flight: Flink's PendingCheckpoint (volatile, never in the log).

It tracks which subtasks are still to acknowledge, which operator coordinators and master hooks
are still to deliver their state, and whether the trigger has gone out to the workers. It is
*fully acknowledged* when all three are done; then the coordinator writes ``_metadata`` and
completes it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import enum
from typing import Any

from chandy.coordinator.environment import Cancellable
from chandy.coordinator.messages import AcknowledgeCheckpoint
from chandy.coordinator.records import CheckpointType
from chandy.coordinator.storage import (
    CheckpointStorageLocation,
    MasterState,
    OperatorState,
    SubtaskState,
)


class AckResult(enum.Enum):
    """What happened to an acknowledgement (Flink's TaskAcknowledgeResult, plus LATE and STALE)."""

    SUCCESS = "success"
    DUPLICATE = "duplicate"  # this subtask already acknowledged this checkpoint
    UNKNOWN = "unknown"  # no such checkpoint was ever triggered, or no such subtask
    LATE = "late"  # the checkpoint already completed or was aborted
    STALE = "stale"  # from an attempt older than the subtask's current one
    DISCARDED = "discarded"  # the checkpoint is being disposed


@dataclasses.dataclass
class PendingCheckpoint:
    """One checkpoint or savepoint between trigger and completion/abort. Times in ms."""

    checkpoint_id: int
    checkpoint_type: CheckpointType
    trigger_timestamp: int
    expected: frozenset[tuple[str, int]]
    attempts: dict[tuple[str, int], int]
    result: concurrent.futures.Future
    location: CheckpointStorageLocation | None = None
    acknowledged: dict[tuple[str, int], AcknowledgeCheckpoint] = dataclasses.field(default_factory=dict)
    coordinators_pending: set[str] = dataclasses.field(default_factory=set)
    coordinator_states: dict[str, bytes | None] = dataclasses.field(default_factory=dict)
    hooks_pending: set[str] = dataclasses.field(default_factory=set)
    master_states: list[MasterState] = dataclasses.field(default_factory=list)
    trigger_sent: bool = False
    finalizing: bool = False
    disposed: bool = False
    timeout: Cancellable | None = None
    logged: bool = False  # PENDING and the ID counter are durable: hooks and coordinators may see the ID
    properties: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.checkpoint_type = CheckpointType(self.checkpoint_type)

    @property
    def is_savepoint(self) -> bool:
        return self.checkpoint_type.is_savepoint

    @property
    def num_acknowledged(self) -> int:
        return len(self.acknowledged)

    @property
    def is_fully_acknowledged(self) -> bool:
        return (
            self.trigger_sent and not self.coordinators_pending and not self.hooks_pending
            and len(self.acknowledged) == len(self.expected)
        )

    def acknowledge(self, ack: AcknowledgeCheckpoint) -> AckResult:
        """Record ``ack`` if it is the first from the current attempt of an expected subtask."""
        if self.disposed:
            return AckResult.DISCARDED
        subtask = (ack.operator_id, ack.subtask_index)
        if subtask not in self.expected:
            return AckResult.UNKNOWN
        if ack.attempt_number < self.attempts.get(subtask, 0):
            return AckResult.STALE
        if subtask in self.acknowledged:
            return AckResult.DUPLICATE
        self.acknowledged[subtask] = ack
        return AckResult.SUCCESS

    @property
    def state_size(self) -> int:
        """Bytes of acknowledged state handles, coordinator and master states."""
        size = sum(h.state_size for a in self.acknowledged.values() for h in a.state_handles)
        size += sum(len(s or b"") for s in self.coordinator_states.values())
        return size + sum(len(m.data) for m in self.master_states)

    def operator_states(self) -> tuple[OperatorState, ...]:
        """The acknowledged state, grouped by operator, for ``_metadata``."""
        operators = sorted({op for op, _ in self.expected} | set(self.coordinator_states))
        result = []
        for op in operators:
            subtasks = tuple(
                SubtaskState(idx, ack.attempt_number, ack.state_handles)
                for (o, idx), ack in sorted(self.acknowledged.items()) if o == op
            )
            result.append(OperatorState(op, self.coordinator_states.get(op), subtasks))
        return tuple(result)

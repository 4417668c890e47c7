"""The coordinator's state as a pure fold over its log: ``state = apply(state, record)``.

:class:`CoordinatorState` is everything the coordinator must know after a restart: the epoch,
the checkpoint ID counter, every checkpoint still in the log (pending, completed, aborted), the
job status, the continuous-failure count, and the latest record of each entity of the kinds that
connectors registered (``extensions``: the Kafka source's split assignments and offset commits,
for instance). ``apply`` does
no I/O and reads no clock, so replaying the log rebuilds exactly the state the live coordinator
had (a property test checks ``replay(log) == live state``), as the state machines of Kafka's own
group and transaction coordinators.

What is *not* here is volatile: acknowledgements of a pending checkpoint live in
:class:`~chandy.coordinator.pending.PendingCheckpoint` only, since a restart aborts pending checkpoints.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from typing import Any, NamedTuple

from chandy.coordinator.failure_manager import counts_towards_tolerable
from chandy.coordinator.records import (
    CheckpointIdCounterRecord,
    CheckpointRecord,
    CheckpointStatus,
    CoordinatorEpochRecord,
    JobStatus,
    JobStatusRecord,
    LogRecord,
    Tombstone,
    record_kind,
)

log = logging.getLogger(__name__)

#: The checkpoint ID passed to restore methods when no completed checkpoint exists yet (Flink's
#: ``OperatorCoordinator.NO_CHECKPOINT``).
NO_CHECKPOINT = -1
#: The checkpoint ID used in batch scenarios (Flink's ``OperatorCoordinator.BATCH_CHECKPOINT_ID``).
BATCH_CHECKPOINT_ID = 2**63 - 1


class EpochClaim(NamedTuple):
    """Which coordinator instance the newest epoch record of a job's log names: its ``epoch``
    and its ``coordinator_id`` (:class:`CoordinatorEpochRecord`; ``(0, None)`` before any)."""

    epoch: int
    coordinator_id: str | None


@dataclasses.dataclass
class CoordinatorState:
    """The durable state of one job's coordinator (mutated only by :func:`apply`).

    ``checkpoints`` maps checkpoint ID to its latest :class:`CheckpointRecord`;
    ``continuous_failures`` counts aborted checkpoints that Flink's CheckpointFailureManager
    counts (:func:`~chandy.coordinator.failure_manager.counts_towards_tolerable`) since the last
    successful checkpoint or savepoint (``last_succeeded_checkpoint_id``) or the last epoch change.
    ``extensions`` maps a connector's record kind to its entities (entity ID -> what the kind's
    registered fold keeps, by default the latest record).
    ``epoch_owner`` is the ``coordinator_id`` of the newest epoch record in log order.
    """

    job_id: str
    epoch: int = 0
    epoch_owner: str | None = None
    next_checkpoint_id: int = 1
    job_status: JobStatus = JobStatus.CREATED
    job_status_reason: str | None = None
    continuous_failures: int = 0
    last_succeeded_checkpoint_id: int = -1
    checkpoints: dict[int, CheckpointRecord] = dataclasses.field(default_factory=dict)
    extensions: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    records_applied: int = 0

    # -- queries (pure) ----------------------------------------------------------------------
    @property
    def claim(self) -> EpochClaim:
        """The newest epoch record's claim: ``(epoch, epoch_owner)``."""
        return EpochClaim(self.epoch, self.epoch_owner)

    def pending(self) -> list[CheckpointRecord]:
        """Pending checkpoints and savepoints, by ID."""
        return [c for _, c in sorted(self.checkpoints.items()) if c.status is CheckpointStatus.PENDING]

    def completed(self, *, savepoints: bool | None = None) -> list[CheckpointRecord]:
        """Completed checkpoints (and/or savepoints, per ``savepoints``), oldest first."""
        return [
            c for _, c in sorted(self.checkpoints.items())
            if c.status is CheckpointStatus.COMPLETED and (savepoints is None or c.is_savepoint == savepoints)
        ]

    def records_of(self, kind: str) -> dict[str, Any]:
        """The entities of the extension kind ``kind`` (entity ID -> folded value; empty if none)."""
        return self.extensions.get(kind, {})

    def equals_ignoring_counters(self, other: CoordinatorState) -> bool:
        """Equality of everything but ``records_applied`` (which differs for a compacted log)."""
        return dataclasses.replace(self, records_applied=0) == dataclasses.replace(other, records_applied=0)


def apply(state: CoordinatorState, record: LogRecord) -> CoordinatorState:
    """Fold one log record into ``state`` and return it. No I/O, no clock: deterministic.

    Records of another job are ignored (the log is shared by jobs). A checkpoint record can only
    move a checkpoint forward (PENDING → COMPLETED | ABORTED); a stale one is ignored with a
    warning, so replaying an old record twice is harmless.
    """
    if record.key().job_id != state.job_id:
        return state
    state.records_applied += 1
    if isinstance(record, Tombstone):
        _apply_tombstone(state, record)
    elif isinstance(record, CheckpointRecord):
        _apply_checkpoint(state, record)
    elif isinstance(record, CheckpointIdCounterRecord):
        state.next_checkpoint_id = max(state.next_checkpoint_id, record.next_checkpoint_id)
    elif isinstance(record, CoordinatorEpochRecord):
        if record.epoch >= state.epoch:  # later in log order: from the producer that fenced the earlier one's
            if record.epoch > state.epoch:
                state.continuous_failures = 0  # a new coordinator starts its failure count afresh, as a new JobMaster
            state.epoch, state.epoch_owner = record.epoch, record.coordinator_id
    elif isinstance(record, JobStatusRecord):
        state.job_status = record.status
        state.job_status_reason = record.reason
    else:
        kind = record_kind(record.KIND)
        if kind is None or kind.fold is None:
            log.warning("skipping log record of unregistered kind %r", record.KIND)
        else:
            kind.fold(state.extensions.setdefault(kind.kind, {}), record)
    return state


_ORDER = {CheckpointStatus.PENDING: 0, CheckpointStatus.COMPLETED: 1, CheckpointStatus.ABORTED: 1,
          CheckpointStatus.DISCARDED: 2}


def _apply_checkpoint(state: CoordinatorState, record: CheckpointRecord) -> None:
    previous = state.checkpoints.get(record.checkpoint_id)
    if previous is not None and _ORDER[record.status] < _ORDER[previous.status]:
        log.warning("ignoring %s record of checkpoint %d already %s", record.status, record.checkpoint_id, previous.status)
        return
    state.checkpoints[record.checkpoint_id] = record
    state.next_checkpoint_id = max(state.next_checkpoint_id, record.checkpoint_id + 1)
    if record.status is CheckpointStatus.COMPLETED:
        # Flink's CheckpointFailureManager.handleCheckpointSuccess: checkpoints and savepoints alike
        if record.checkpoint_id > state.last_succeeded_checkpoint_id:
            state.last_succeeded_checkpoint_id = record.checkpoint_id
            state.continuous_failures = 0
    elif (record.status is CheckpointStatus.ABORTED
          and (previous is None or previous.status is CheckpointStatus.PENDING)
          and counts_towards_tolerable(record, state.last_succeeded_checkpoint_id)):
        # counted once per checkpoint; "previous is None" is a compacted log, whose PENDING record is gone
        state.continuous_failures += 1


def _apply_tombstone(state: CoordinatorState, record: Tombstone) -> None:
    key = record.key()
    if key.kind == "checkpoint":
        state.checkpoints.pop(int(key.entity_id), None)
    elif key.kind in state.extensions:
        state.extensions[key.kind].pop(key.entity_id, None)
        if not state.extensions[key.kind]:
            del state.extensions[key.kind]


def replay(job_id: str, records: Iterable[LogRecord]) -> CoordinatorState:
    """The state after applying ``records`` in order to an empty state of ``job_id``."""
    state = CoordinatorState(job_id)
    for record in records:
        apply(state, record)
    return state

"""Which completed checkpoints a job keeps and restores: Flink's CompletedCheckpointStore.

The store is a view over :class:`~chandy.coordinator.state.CoordinatorState` (the log is where its
entries live), with the rules of Flink's ``DefaultCompletedCheckpointStore`` and of
``CheckpointCoordinator.completePendingCheckpoint``:

- **Entries** (restore candidates): completed checkpoints, the snapshot a job was started from
  (``restoreSavepoint`` adds it to the store), and stop-with-savepoints. Intermediate savepoints
  are never entries (Flink 1.15+, FLINK-25191: ``if (!props.isSavepoint())
  addCompletedCheckpointToStoreAndSubsumeOldest``): they commit no side effects, so restoring
  one would roll the job back past side effects that later checkpoints committed.

  Stop-with-savepoint departs from Flink here on purpose: Flink keeps it out of the store, since
  a stopped Flink job is resumed by submitting it again from the savepoint path. A Chandy job
  resumes from its own log under the same job id, and the stop-with-savepoint notified its
  completion (its side effects are committed), so it is the only safe place to resume from.
- **Retention** (``addCheckpointAndSubsumeOldestOne``): the newest ``num_retained`` entries stay;
  older ones are tombstoned in the log, with aborted checkpoints older than the oldest retained.
- **Never deleted** (``CompletedCheckpoint.shouldBeDiscardedOnSubsume`` / NO_CLAIM restore mode):
  savepoints of any kind (the user owns them) and the snapshot a job was restored from (another
  job, or the user, owns it). Only the job's own checkpoints' directories are deleted.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from chandy.coordinator.records import CheckpointRecord, CheckpointStatus, CheckpointType

if TYPE_CHECKING:  # the state imports this module
    from chandy.coordinator.state import CoordinatorState

#: ``CheckpointRecord.properties`` key of a snapshot the job was started from (its pointer).
RESTORED_FROM = "restored_from"


@dataclasses.dataclass(frozen=True)
class RetentionDecision:
    """What falls out of retention: checkpoint IDs to tombstone and directories to delete."""

    tombstones: tuple[int, ...] = ()
    directories_to_delete: tuple[str, ...] = ()


class CompletedCheckpointStore:
    """Flink's ``DefaultCompletedCheckpointStore`` as pure queries over the coordinator state.

    Args:
        num_retained: ``state.checkpoints.num-retained`` (>= 1).
    """

    def __init__(self, num_retained: int) -> None:
        if num_retained < 1:
            raise ValueError(f"num_retained must be >= 1, got {num_retained}")
        self.num_retained = num_retained

    @staticmethod
    def is_entry(record: CheckpointRecord) -> bool:
        """Whether a completed record belongs to the store (is a restore candidate)."""
        if record.status is not CheckpointStatus.COMPLETED:
            return False
        return (record.checkpoint_type is not CheckpointType.SAVEPOINT
                or RESTORED_FROM in record.properties)

    @staticmethod
    def owns_files(record: CheckpointRecord) -> bool:
        """Whether the job may delete this entry's directory when it leaves retention (its own
        checkpoint; never a savepoint, never a snapshot it was restored from)."""
        return (record.checkpoint_type is CheckpointType.CHECKPOINT and RESTORED_FROM not in record.properties
                and bool(record.external_pointer))

    @classmethod
    def entries(cls, state: CoordinatorState) -> list[CheckpointRecord]:
        """The store's entries, oldest first (Flink's ``getAllCheckpoints``)."""
        return [c for _, c in sorted(state.checkpoints.items()) if cls.is_entry(c)]

    @classmethod
    def latest(cls, state: CoordinatorState) -> CheckpointRecord | None:
        """The newest entry (Flink's ``getLatestCheckpoint``): what a restart restores."""
        entries = cls.entries(state)
        return entries[-1] if entries else None

    def retention(self, state: CoordinatorState, new_entry: CheckpointRecord | None) -> RetentionDecision:
        """What leaves the store once ``new_entry`` (None: an intermediate savepoint, which is no
        entry) is added (Flink's ``addCheckpointAndSubsumeOldestOne``)."""
        entries = {c.checkpoint_id: c for c in self.entries(state)}
        if new_entry is not None and self.is_entry(new_entry):
            entries[new_entry.checkpoint_id] = new_entry
        ordered = sorted(entries)
        excess = ordered[:-self.num_retained] if len(ordered) > self.num_retained else []
        if not excess:
            return RetentionDecision()
        oldest_retained = ordered[len(excess)]
        tombstones = list(excess)
        tombstones += [i for i, c in sorted(state.checkpoints.items())
                       if c.status is CheckpointStatus.ABORTED and i < oldest_retained]
        directories = tuple(pointer for i in excess
                            if self.owns_files(entries[i]) and (pointer := entries[i].external_pointer))
        return RetentionDecision(tuple(sorted(tombstones)), directories)

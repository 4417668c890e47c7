"""Starting a coordinator and restoring a checkpoint (Flink's
``restoreLatestCheckpointedStateInternal`` and ``restoreSavepoint``): a mixin of
:class:`~chandy.coordinator.checkpoint_coordinator.CheckpointCoordinator`, whose state it uses."""

from __future__ import annotations

import logging
import socket

from chandy.coordinator.completed_checkpoint_store import (
    RESTORED_FROM,
)
from chandy.coordinator.coordinator_core import CoordinatorCore
from chandy.coordinator.environment import Batch
from chandy.coordinator.errors import ChandyError, SuppressRestartsError
from chandy.coordinator.failure import CheckpointFailureReason
from chandy.coordinator.messages import (
    COORDINATOR_ELECTED_EVENT,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    OperatorEventMessage,
)
from chandy.coordinator.records import (
    CheckpointIdCounterRecord,
    CheckpointRecord,
    CheckpointStatus,
    CheckpointType,
    CoordinatorEpochRecord,
    JobStatus,
    JobStatusRecord,
)
from chandy.coordinator.state import NO_CHECKPOINT
from chandy.coordinator.storage import (
    CheckpointMetadata,
    CheckpointStorageError,
    resolve_checkpoint_pointer,
)

log = logging.getLogger(__name__)

R = CheckpointFailureReason


class RestoreError(ChandyError):
    """A checkpoint or savepoint cannot be restored into this job."""


class CheckpointRestore(CoordinatorCore):
    """The checkpoint restore part of the checkpoint coordinator."""

    def start(self, *, restore_from: str | None = None, allow_non_restored_state: bool = False,
              checkpoint_id_floor: int | None = None) -> None:
        """Become the job's coordinator: new epoch, abort leftovers, restore, notify, start coordinators.

        Run once after the state was replayed from the log (docs/design.md, "Event sourcing": restart):

        1. append the new epoch (the log writer already fenced every older coordinator);
        2. abort every checkpoint the log still shows as pending (CHECKPOINT_COORDINATOR_SHUTDOWN);
        3. start the operator coordinators;
        4. restore the latest entry of the completed checkpoint store (a checkpoint, never a later
           intermediate savepoint: Flink's ``restoreLatestCheckpointedStateInternal`` reads the
           CompletedCheckpointStore, which savepoints never enter) into hooks and coordinators
           and notify its completion again; with none, restore ``restore_from`` (a savepoint
           path) if given, else reset hooks and coordinators to ``NO_CHECKPOINT``.

        ``checkpoint_id_floor``: the next checkpoint ID is at least this, written to the log with
        the new epoch (Flink's ``CheckpointIDCounter.setCount`` on restore). External systems
        that key their commits by checkpoint ID (a lake table's app transaction) may already hold
        IDs this log never saw, after the log was lost or recreated.

        Raises:
            RestoreError: the savepoint holds state for an operator this job lacks (unless
                ``allow_non_restored_state``), or no retained checkpoint's ``_metadata`` is readable.
        """
        now = self.env.now_ms()
        batch = Batch()
        batch.records.append(CoordinatorEpochRecord(
            self.job_id, self.state.epoch + 1, self.transactional_id, socket.gethostname(), now, self.coordinator_id))
        batch.records.append(JobStatusRecord(self.job_id, JobStatus.RUNNING, self.state.epoch + 1, None, now))
        if checkpoint_id_floor is not None and checkpoint_id_floor > self.state.next_checkpoint_id:
            log.info("job %s: checkpoint IDs continue at %d (was %d)", self.job_id, checkpoint_id_floor,
                     self.state.next_checkpoint_id)
            batch.records.append(CheckpointIdCounterRecord(self.job_id, checkpoint_id_floor))
        leftovers = self.state.pending()
        for record in leftovers:
            batch.records.append(CheckpointRecord(
                job_id=self.job_id, checkpoint_id=record.checkpoint_id, checkpoint_type=record.checkpoint_type,
                status=CheckpointStatus.ABORTED, epoch=self.state.epoch + 1, trigger_timestamp=record.trigger_timestamp,
                status_timestamp=now, num_subtasks=record.num_subtasks, num_acknowledged=record.num_acknowledged,
                failure_reason=R.CHECKPOINT_COORDINATOR_SHUTDOWN.value,
                failure_message="the coordinator that triggered it is gone",
            ))
        self._commit(batch)  # applies the epoch first, so the messages below carry the new one
        # the new epoch, announced: running attempts report ready again to this coordinator
        self.env.append(Batch(control=[OperatorEventMessage(self.job_id, self.state.epoch, "", -1, -1,
                                                            COORDINATOR_ELECTED_EVENT, b"", now)]))
        for record in leftovers:
            self.env.append(Batch(
                control=[NotifyCheckpointAborted(self.job_id, self.state.epoch, record.checkpoint_id,
                                                 R.CHECKPOINT_COORDINATOR_SHUTDOWN.value, None, now)],
                events=[self._event(record, "ABORTED", now, failure_reason=R.CHECKPOINT_COORDINATOR_SHUTDOWN.value)],
            ))
            self._dispose_directory(self.storage.checkpoint_directory(record.checkpoint_id))
        for holder in self.holders.values():
            holder.coordinator.start()
        self._restore_latest(restore_from, allow_non_restored_state)

    def _restore_latest(self, restore_from: str | None, allow_non_restored_state: bool) -> None:
        candidates = list(reversed(self.store.entries(self.state)))
        for record in candidates:
            try:
                directory, metadata = resolve_checkpoint_pointer(record.external_pointer or "", self.storage.storage_options)
            except CheckpointStorageError as exc:
                log.error("cannot restore checkpoint %d from %s: %s; trying an older one",
                          record.checkpoint_id, record.external_pointer, exc)
                continue
            self._restore(metadata, directory, allow_non_restored_state=True)
            return
        if candidates:
            raise RestoreError(
                f"none of the completed checkpoints {[r.checkpoint_id for r in candidates]} of job {self.job_id} "
                "has a readable _metadata; refusing to start from scratch (that would duplicate output)"
            )
        if restore_from:
            directory, metadata = resolve_checkpoint_pointer(restore_from, self.storage.storage_options)
            self._restore(metadata, directory, allow_non_restored_state=allow_non_restored_state, from_savepoint=True)
            return
        self.hooks.reset()
        try:
            for holder in self.holders.values():
                holder.coordinator.reset_to_checkpoint(NO_CHECKPOINT, None)
        except Exception as exc:
            if self.on_failover is None or isinstance(exc, SuppressRestartsError):
                raise
            log.error("job %s: resetting its operator coordinators failed: %s", self.job_id, exc)
            self._fail_job(exc)  # a global failure: the restart strategy decides (see _restore)

    def _restore(self, metadata: CheckpointMetadata, directory: str, *, allow_non_restored_state: bool,
                 from_savepoint: bool = False) -> None:
        """Restore hooks and coordinators from ``metadata``; re-notify its completion (restoring
        implies completion, per Flink's OperatorCoordinator javadoc)."""
        unknown = sorted(o.operator_id for o in metadata.operator_states
                         if o.operator_id not in self.operators and o.operator_id not in self.holders
                         and (o.coordinator_state or o.subtask_states))
        if unknown and not allow_non_restored_state:
            raise RestoreError(
                f"{directory} holds state for operator(s) {', '.join(unknown)} that job {self.job_id} does not have "
                "(allow non-restored state to skip it)"
            )
        self.hooks.restore(metadata.checkpoint_id, metadata.master_states, allow_non_restored_state=allow_non_restored_state)
        self._restoring = (metadata.checkpoint_id, directory)
        try:
            for operator_id, holder in self.holders.items():
                op = metadata.operator(operator_id)
                holder.coordinator.reset_to_checkpoint(metadata.checkpoint_id, op.coordinator_state if op else None)
        except Exception as exc:
            if self.on_failover is None or isinstance(exc, SuppressRestartsError):
                raise
            # with a restart strategy, a failed restore (the lake unreachable while it commits the
            # restored checkpoint) is one more global failure: the coordinators after it are not
            # reset (the Kafka source would commit offsets past what the lake holds), nothing is
            # notified, and the strategy restarts the job again or fails it
            log.error("job %s: restoring checkpoint %d failed: %s", self.job_id, metadata.checkpoint_id, exc)
            self._fail_job(exc)
            return
        finally:
            self._restoring = None
        now = self.env.now_ms()
        batch = Batch(control=[NotifyCheckpointComplete(
            self.job_id, self.state.epoch, metadata.checkpoint_id, metadata.checkpoint_type, now)])
        if from_savepoint:
            # the restored savepoint becomes this job's latest completed checkpoint, and IDs continue after it
            batch.records.append(CheckpointIdCounterRecord(
                self.job_id, max(self.state.next_checkpoint_id, metadata.checkpoint_id + 1)))
            batch.records.append(CheckpointRecord(
                job_id=self.job_id, checkpoint_id=metadata.checkpoint_id,
                checkpoint_type=CheckpointType(metadata.checkpoint_type),
                status=CheckpointStatus.COMPLETED, epoch=self.state.epoch, trigger_timestamp=metadata.trigger_timestamp,
                status_timestamp=now, num_subtasks=0, state_size=metadata.state_size,
                external_pointer=directory, properties={RESTORED_FROM: directory},
            ))
        self.stats.report_restored(metadata.checkpoint_id, directory, now)
        checkpoint_id = metadata.checkpoint_id
        def notify() -> None:
            self._notify_complete(checkpoint_id)  # a failed notification already failed the job

        self._commit(batch, notify)
        self._last_completion_ms = now

    # -- triggering ------------------------------------------------------------------------------

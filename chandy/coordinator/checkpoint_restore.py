"""Starting a coordinator and restoring a checkpoint (Flink's
``restoreLatestCheckpointedStateInternal`` and ``restoreSavepoint``): :class:`CheckpointRestorer`,
a collaborator of :class:`~chandy.coordinator.checkpoint_coordinator.CheckpointCoordinator`."""

from __future__ import annotations

import logging
import socket

from chandy.coordinator.checkpoint_completion import CheckpointCompletion
from chandy.coordinator.completed_checkpoint_store import (
    RESTORED_FROM,
)
from chandy.coordinator.coordinator_context import CoordinatorContext
from chandy.coordinator.environment import Batch
from chandy.coordinator.errors import ChandyError, SuppressRestartsError
from chandy.coordinator.failure import CheckpointFailureReason
from chandy.coordinator.job_lifecycle import JobLifecycle
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


class CheckpointRestorer:
    """Starts a coordinator: a new epoch in the log, leftover pending checkpoints aborted, the
    operator coordinators started, and the latest completed checkpoint (or a savepoint) restored
    into the master hooks and operator coordinators (Flink's
    ``CheckpointCoordinator.restoreLatestCheckpointedStateInternal`` and ``restoreSavepoint``).

    Args:
        context: the coordinator's shared state.
        completion: re-notifies a restored checkpoint's completion and deletes the directories of
            leftover checkpoints.
        lifecycle: fails the job when resetting an operator coordinator fails (with a restart
            strategy: a global failure).
    """

    def __init__(self, context: CoordinatorContext, completion: CheckpointCompletion, lifecycle: JobLifecycle) -> None:
        self._context = context
        self._completion = completion
        self._lifecycle = lifecycle

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
        c = self._context
        now = c.env.now_ms()
        batch = Batch()
        batch.records.append(CoordinatorEpochRecord(
            c.job_id, c.state.epoch + 1, c.transactional_id, socket.gethostname(), now, c.coordinator_id))
        batch.records.append(JobStatusRecord(c.job_id, JobStatus.RUNNING, c.state.epoch + 1, None, now))
        if checkpoint_id_floor is not None and checkpoint_id_floor > c.state.next_checkpoint_id:
            log.info("job %s: checkpoint IDs continue at %d (was %d)", c.job_id, checkpoint_id_floor,
                     c.state.next_checkpoint_id)
            batch.records.append(CheckpointIdCounterRecord(c.job_id, checkpoint_id_floor))
        leftovers = c.state.pending()
        for record in leftovers:
            batch.records.append(CheckpointRecord(
                job_id=c.job_id, checkpoint_id=record.checkpoint_id, checkpoint_type=record.checkpoint_type,
                status=CheckpointStatus.ABORTED, epoch=c.state.epoch + 1, trigger_timestamp=record.trigger_timestamp,
                status_timestamp=now, num_subtasks=record.num_subtasks, num_acknowledged=record.num_acknowledged,
                failure_reason=R.CHECKPOINT_COORDINATOR_SHUTDOWN.value,
                failure_message="the coordinator that triggered it is gone",
            ))
        c.commit(batch)  # applies the epoch first, so the messages below carry the new one
        # the new epoch, announced: running attempts report ready again to this coordinator
        c.env.append(Batch(control=[OperatorEventMessage(c.job_id, c.state.epoch, "", -1, -1,
                                                         COORDINATOR_ELECTED_EVENT, b"", now)]))
        for record in leftovers:
            c.env.append(Batch(
                control=[NotifyCheckpointAborted(c.job_id, c.state.epoch, record.checkpoint_id,
                                                 R.CHECKPOINT_COORDINATOR_SHUTDOWN.value, None, now)],
                events=[c.event(record, "ABORTED", now, failure_reason=R.CHECKPOINT_COORDINATOR_SHUTDOWN.value)],
            ))
            self._completion.dispose_directory(c.storage.checkpoint_directory(record.checkpoint_id))
        for holder in c.holders.values():
            holder.coordinator.start()
        self._restore_latest(restore_from, allow_non_restored_state)

    def _restore_latest(self, restore_from: str | None, allow_non_restored_state: bool) -> None:
        c = self._context
        candidates = list(reversed(c.store.entries(c.state)))
        for record in candidates:
            try:
                directory, metadata = resolve_checkpoint_pointer(record.external_pointer or "", c.storage.storage_options)
            except CheckpointStorageError as exc:
                log.error("cannot restore checkpoint %d from %s: %s; trying an older one",
                          record.checkpoint_id, record.external_pointer, exc)
                continue
            self._restore(metadata, directory, allow_non_restored_state=True)
            return
        if candidates:
            raise RestoreError(
                f"none of the completed checkpoints {[r.checkpoint_id for r in candidates]} of job {c.job_id} "
                "has a readable _metadata; refusing to start from scratch (that would duplicate output)"
            )
        if restore_from:
            directory, metadata = resolve_checkpoint_pointer(restore_from, c.storage.storage_options)
            self._restore(metadata, directory, allow_non_restored_state=allow_non_restored_state, from_savepoint=True)
            return
        c.hooks.reset()
        try:
            for holder in c.holders.values():
                holder.coordinator.reset_to_checkpoint(NO_CHECKPOINT, None)
        except Exception as exc:
            if c.on_failover is None or isinstance(exc, SuppressRestartsError):
                raise
            log.error("job %s: resetting its operator coordinators failed: %s", c.job_id, exc)
            self._lifecycle.handle_global_failure(exc)  # a global failure: the restart strategy decides (see _restore)

    def _restore(self, metadata: CheckpointMetadata, directory: str, *, allow_non_restored_state: bool,
                 from_savepoint: bool = False) -> None:
        """Restore hooks and coordinators from ``metadata``; re-notify its completion (restoring
        implies completion, per Flink's OperatorCoordinator javadoc)."""
        c = self._context
        unknown = sorted(o.operator_id for o in metadata.operator_states
                         if o.operator_id not in c.operators and o.operator_id not in c.holders
                         and (o.coordinator_state or o.subtask_states))
        if unknown and not allow_non_restored_state:
            raise RestoreError(
                f"{directory} holds state for operator(s) {', '.join(unknown)} that job {c.job_id} does not have "
                "(allow non-restored state to skip it)"
            )
        c.hooks.restore(metadata.checkpoint_id, metadata.master_states, allow_non_restored_state=allow_non_restored_state)
        c.restoring = (metadata.checkpoint_id, directory)
        try:
            for operator_id, holder in c.holders.items():
                op = metadata.operator(operator_id)
                holder.coordinator.reset_to_checkpoint(metadata.checkpoint_id, op.coordinator_state if op else None)
        except Exception as exc:
            if c.on_failover is None or isinstance(exc, SuppressRestartsError):
                raise
            # with a restart strategy, a failed restore (the lake unreachable while it commits the
            # restored checkpoint) is one more global failure: the coordinators after it are not
            # reset (the Kafka source would commit offsets past what the lake holds), nothing is
            # notified, and the strategy restarts the job again or fails it
            log.error("job %s: restoring checkpoint %d failed: %s", c.job_id, metadata.checkpoint_id, exc)
            self._lifecycle.handle_global_failure(exc)
            return
        finally:
            c.restoring = None
        now = c.env.now_ms()
        batch = Batch(control=[NotifyCheckpointComplete(
            c.job_id, c.state.epoch, metadata.checkpoint_id, metadata.checkpoint_type, now)])
        if from_savepoint:
            # the restored savepoint becomes this job's latest completed checkpoint, and IDs continue after it
            batch.records.append(CheckpointIdCounterRecord(
                c.job_id, max(c.state.next_checkpoint_id, metadata.checkpoint_id + 1)))
            batch.records.append(CheckpointRecord(
                job_id=c.job_id, checkpoint_id=metadata.checkpoint_id,
                checkpoint_type=CheckpointType(metadata.checkpoint_type),
                status=CheckpointStatus.COMPLETED, epoch=c.state.epoch, trigger_timestamp=metadata.trigger_timestamp,
                status_timestamp=now, num_subtasks=0, state_size=metadata.state_size,
                external_pointer=directory, properties={RESTORED_FROM: directory},
            ))
        c.stats.report_restored(metadata.checkpoint_id, directory, now)
        checkpoint_id = metadata.checkpoint_id
        def notify() -> None:
            self._completion.notify_complete(checkpoint_id)  # a failed notification already failed the job

        c.commit(batch, notify)
        c.last_completion_ms = now

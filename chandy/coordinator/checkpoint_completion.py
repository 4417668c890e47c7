"""Acknowledgements, declines, completion and aborts of a pending checkpoint (Flink's
``receiveAcknowledgeMessage``, ``receiveDeclineMessage``, ``completePendingCheckpoint`` and
``abortPendingCheckpoint``): :class:`CheckpointCompletion`, a collaborator of
:class:`~chandy.coordinator.checkpoint_coordinator.CheckpointCoordinator`."""

from __future__ import annotations

import concurrent.futures
import functools
import logging
from collections.abc import Callable, Sequence

from chandy.coordinator.coordinator_context import CoordinatorContext
from chandy.coordinator.environment import Batch, OutboundMessage
from chandy.coordinator.failure import CheckpointException, CheckpointFailureReason
from chandy.coordinator.failure_manager import DECLINED_BY
from chandy.coordinator.faults import crash_point
from chandy.coordinator.job_lifecycle import JobLifecycle
from chandy.coordinator.messages import (
    AcknowledgeCheckpoint,
    DeclineCheckpoint,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
)
from chandy.coordinator.pending import AckResult, PendingCheckpoint
from chandy.coordinator.records import (
    CheckpointRecord,
    CheckpointStatus,
    CheckpointType,
    JobStatus,
    JobStatusRecord,
    LogKey,
    Tombstone,
)
from chandy.coordinator.state import apply
from chandy.coordinator.storage import (
    CheckpointMetadata,
)

log = logging.getLogger(__name__)

R = CheckpointFailureReason


class CheckpointCompletion:
    """Finalises and aborts pending checkpoints: acks and declines, ``_metadata``, COMPLETED or
    ABORTED in the log, subsumption, retention, notifications, disposal of directories (Flink's
    ``CheckpointCoordinator`` from ``receiveAcknowledgeMessage`` to ``completePendingCheckpoint``,
    ``abortPendingCheckpoint`` and the ``CheckpointsCleaner``).

    Args:
        context: the coordinator's shared state.
        lifecycle: what an abort or a completion changes of the job (a failure the
            :class:`~chandy.coordinator.failure_manager.CheckpointFailureManager` does not
            tolerate, a finished stop-with-savepoint, the periodic scheduler restarted).
        execute_queued: runs the queued trigger requests the decider now allows, once a pending
            checkpoint left (the coordinator's ``executeQueuedRequest``); posted to the mailbox.
    """

    def __init__(self, context: CoordinatorContext, lifecycle: JobLifecycle, *,
                 execute_queued: Callable[[], None]) -> None:
        self._context = context
        self._lifecycle = lifecycle
        self._execute_queued = execute_queued

    def receive_acknowledge(self, ack: AcknowledgeCheckpoint) -> AckResult:
        """Handle an ack (Flink's ``receiveAcknowledgeMessage``). Never raises on bad input:
        late, duplicate, stale and unknown acks are counted, logged and change nothing.

        As in Flink, an ack of the current epoch counts for any pending checkpoint, also before
        its trigger went out: the pipeline's driver starts its Spark tasks as soon as the offset
        ranges are fixed, and their acks may arrive while the trigger still waits for the
        checkpoint's location or an operator coordinator (on an object store, hundreds of ms);
        the checkpoint completes once the trigger is out (``_maybe_send_trigger`` finalizes)."""
        c = self._context
        if ack.job_id != c.job_id:
            return AckResult.UNKNOWN
        pending = c.pending.get(ack.checkpoint_id)
        if pending is None:
            result = AckResult.LATE if ack.checkpoint_id < c.state.next_checkpoint_id else AckResult.UNKNOWN
        elif ack.epoch != c.state.epoch:
            # answers a trigger of another coordinator epoch (possibly the same ID): not ours
            result = AckResult.STALE
        else:
            result = pending.acknowledge(ack)
        c.ack_counts[result] += 1
        if result is not AckResult.SUCCESS or pending is None:
            log.info("%s ack for checkpoint %d from %s[%d] attempt %d: ignored", result.value, ack.checkpoint_id,
                     ack.operator_id, ack.subtask_index, ack.attempt_number)
            return result
        c.stats.report_ack(ack.checkpoint_id, c.env.now_ms(), sum(h.state_size for h in ack.state_handles))
        self.maybe_finalize(pending)
        return result

    def receive_decline(self, decline: DeclineCheckpoint) -> AckResult:
        """Handle a decline (Flink's ``receiveDeclineMessage``): it aborts a pending checkpoint
        with the given reason; declines for checkpoints no longer pending change nothing."""
        c = self._context
        if decline.job_id != c.job_id:
            return AckResult.UNKNOWN
        pending = c.pending.get(decline.checkpoint_id)
        if pending is None:
            result = AckResult.LATE if decline.checkpoint_id < c.state.next_checkpoint_id else AckResult.UNKNOWN
            log.info("%s decline for checkpoint %d: ignored", result.value, decline.checkpoint_id)
            return result
        subtask = (decline.operator_id, decline.subtask_index)
        if decline.epoch != c.state.epoch:
            log.info("decline for checkpoint %d from epoch %d (current %d): ignored", decline.checkpoint_id,
                     decline.epoch, c.state.epoch)
            return AckResult.STALE
        if subtask in pending.expected and decline.attempt_number < pending.attempts.get(subtask, 0):
            log.info("stale decline for checkpoint %d from %s attempt %d: ignored", decline.checkpoint_id, subtask,
                     decline.attempt_number)
            return AckResult.STALE
        try:
            reason = R(decline.reason)
        except ValueError:
            reason = R.CHECKPOINT_DECLINED
        self.abort(pending, reason, f"declined by {decline.operator_id}[{decline.subtask_index}] attempt "
                                    f"{decline.attempt_number}: {decline.message or reason.value}",
                   declined_by=f"{decline.operator_id}[{decline.subtask_index}]#{decline.attempt_number}")
        return AckResult.SUCCESS

    # -- completion ---------------------------------------------------------------------------------

    def maybe_finalize(self, pending: PendingCheckpoint) -> None:
        """Once ``pending`` is fully acknowledged (trigger sent, coordinators, hooks and every
        subtask in) and not finalizing yet: write its ``_metadata`` (and, but for an intermediate
        savepoint, compute its ``completion_outputs``) on the I/O executor, then complete it on the
        mailbox (Flink's ``completePendingCheckpoint`` → ``finalizeCheckpoint``). Otherwise nothing."""
        c = self._context
        if pending.finalizing or not pending.is_fully_acknowledged or pending.location is None:
            return  # (the location is initialized before the trigger is sent)
        crash_point("before-complete", pending.checkpoint_id)
        pending.finalizing = True
        metadata = CheckpointMetadata(
            job_id=c.job_id, checkpoint_id=pending.checkpoint_id, checkpoint_type=pending.checkpoint_type,
            trigger_timestamp=pending.trigger_timestamp, completion_timestamp=c.env.now_ms(),
            master_states=tuple(pending.master_states), operator_states=pending.operator_states(),
            properties={CheckpointMetadata.COORDINATOR_LOG: writer} if (writer := c.coordinator_log()) else {},
        )
        location = pending.location
        outputs = c.completion_outputs if pending.checkpoint_type is not CheckpointType.SAVEPOINT else None

        def finalize() -> list[OutboundMessage]:
            c.storage.write_metadata(location, metadata)
            return list(outputs(metadata)) if outputs is not None else []

        future = c.env.io_executor.submit(finalize)
        future.add_done_callback(lambda f: c.env.execute(lambda: self._metadata_written(pending, f)))

    def _metadata_written(self, pending: PendingCheckpoint, future: concurrent.futures.Future) -> None:
        c = self._context
        if c.pending.get(pending.checkpoint_id) is not pending:
            # aborted (timeout, decline) while _metadata was being written: that file must go
            self.dispose_directory(pending.location.directory if pending.location else None)
            return
        if future.exception() is not None:
            self.abort(pending, R.FINALIZE_CHECKPOINT_FAILURE, f"finalizing failed: {future.exception()}")
            return
        self._complete(pending, future.result())

    def _complete(self, pending: PendingCheckpoint, outputs: Sequence[OutboundMessage] = ()) -> None:
        """Flink's ``completePendingCheckpoint`` and ``cleanupAfterCompletedCheckpoint``.

        A checkpoint or stop-with-savepoint: COMPLETED, subsume older pending checkpoints, add it
        to the completed checkpoint store (retention), NotifyCheckpointComplete. An intermediate
        savepoint: COMPLETED only: no notification to workers, listeners or operator
        coordinators, no subsumption, not in the store (``if (!props.isSavepoint() ||
        props.isSynchronous())``, FLINK-25191). Either resets the failure count (the fold).
        """
        c = self._context
        now = c.env.now_ms()
        checkpoint_id = pending.checkpoint_id
        self._remove_pending(pending)
        state_size = pending.state_size
        pointer = pending.location.external_pointer if pending.location else None
        notifies = pending.checkpoint_type is not CheckpointType.SAVEPOINT
        record = c.record(pending, CheckpointStatus.COMPLETED, now, state_size=state_size, external_pointer=pointer)
        batch = Batch(
            records=[record],
            events=[c.event(pending, "SAVEPOINT_COMPLETED" if pending.is_savepoint else "COMPLETED", now,
                            end_to_end_duration_ms=now - pending.trigger_timestamp, state_size=state_size,
                            external_pointer=pointer)],
            outputs=list(outputs),
        )
        subsumed: list[PendingCheckpoint] = []
        discarded: tuple[str, ...] = ()
        if notifies:
            batch.control.append(NotifyCheckpointComplete(c.job_id, c.state.epoch, checkpoint_id,
                                                          pending.checkpoint_type, now))
            # Flink's dropSubsumedCheckpoints: savepoints are never subsumed
            subsumed = [other for other in sorted(c.pending.values(), key=lambda p: p.checkpoint_id)
                        if other.checkpoint_id < checkpoint_id and not other.is_savepoint]
            for other in subsumed:
                self._abort_into(batch, other, R.CHECKPOINT_SUBSUMED, f"subsumed by checkpoint {checkpoint_id}", now)
            discarded = self._retention(batch, record)
        finished = pending.checkpoint_type is CheckpointType.SAVEPOINT_TERMINATE
        if finished:
            batch.records.append(JobStatusRecord(c.job_id, JobStatus.FINISHED, c.state.epoch,
                                                 f"stop-with-savepoint {checkpoint_id}", now))
        c.stats.report_completed(checkpoint_id, now, state_size, pointer)
        c.last_completion_ms = now

        def after_commit() -> None:
            if notifies and not self.notify_complete(checkpoint_id) and finished:
                # stop-with-savepoint whose commit (the lake's) failed: the job did not stop cleanly
                # at the savepoint; say so rather than report a clean stop
                if not pending.result.done():
                    pending.result.set_exception(CheckpointException(
                        R.FINALIZE_CHECKPOINT_FAILURE,
                        f"stop-with-savepoint {checkpoint_id} completed, but committing it failed: the job failed",
                        checkpoint_id))
            for other in subsumed:
                self._after_abort(other, R.CHECKPOINT_SUBSUMED, f"subsumed by checkpoint {checkpoint_id}")
            for directory in discarded:
                self.dispose_directory(directory)
            if not pending.result.done():
                pending.result.set_result(record)
            if finished:
                self._lifecycle.job_status_changed(JobStatus.FINISHED, f"stop-with-savepoint {checkpoint_id}")

        c.commit(batch, after_commit)

    def _retention(self, batch: Batch, new_entry: CheckpointRecord) -> tuple[str, ...]:
        """Tombstones for what leaves the completed checkpoint store once ``new_entry`` joins it
        (:meth:`CompletedCheckpointStore.retention`); returns the directories to delete."""
        c = self._context
        decision = c.store.retention(c.state, new_entry)
        for checkpoint_id in decision.tombstones:
            batch.records.append(Tombstone(LogKey(c.job_id, "checkpoint", str(checkpoint_id))))
        return decision.directories_to_delete

    def notify_complete(self, checkpoint_id: int) -> bool:
        """Notify the operator coordinators, then the listeners, of checkpoint ``checkpoint_id``'s
        completion (Flink's ``sendAcknowledgeMessages``: ``OperatorCoordinator`` and
        ``CheckpointListener.notifyCheckpointComplete``); False when a coordinator's notification
        failed (it failed the job). A listener's exception is logged, never raised."""
        c = self._context
        # in registration order; a coordinator whose notification failed (and failed the job)
        # stops the later ones: the pipeline's offset commit must never follow a failed lake commit
        notified = True
        for holder in c.holders.values():
            if not holder.call("notify_checkpoint_complete", checkpoint_id):
                notified = False
                break
        for listener in c.listeners:
            try:
                listener.notify_checkpoint_complete(checkpoint_id)
            except Exception:  # does not revoke the checkpoint (Flink's CheckpointListener javadoc)
                log.exception("listener failed on notify_checkpoint_complete(%d)", checkpoint_id)
        return notified

    # -- aborts ----------------------------------------------------------------------------------------

    def abort_checkpoint(self, checkpoint_id: int, reason: CheckpointFailureReason, message: str) -> bool:
        """Abort pending checkpoint ``checkpoint_id`` now (Flink's ``abortPendingCheckpoint``), for a
        failure the coordinator learns of outside the acks, such as a failed Spark job. Returns
        False when it is not pending. The reason counts towards the tolerable failures as any."""
        c = self._context
        pending = c.pending.get(checkpoint_id)
        if pending is None:
            return False
        self.abort(pending, CheckpointFailureReason(reason), message)
        return True

    def abort_if_pending(self, checkpoint_id: int, reason: CheckpointFailureReason, message: str) -> None:
        """:meth:`abort` checkpoint ``checkpoint_id`` if it is still pending (its timeout, Flink's
        ``CheckpointCanceller``); otherwise nothing."""
        c = self._context
        pending = c.pending.get(checkpoint_id)
        if pending is not None:
            self.abort(pending, reason, message)

    def _remove_pending(self, pending: PendingCheckpoint) -> None:
        c = self._context
        c.pending.pop(pending.checkpoint_id, None)
        if not pending.result.done():
            # its completion or abort is being committed: until then the future is in flight
            c.deciding.add(pending.result)
            pending.result.add_done_callback(c.deciding.discard)
        if pending.timeout is not None:
            pending.timeout.cancel()
        if not pending.trigger_sent and pending.logged:
            for holder in c.holders.values():
                holder.open_valve()
        # a slot is free: queued requests may run (Flink's scheduleTriggerRequest)
        c.env.execute(self._execute_queued)

    def _abort_into(self, batch: Batch, pending: PendingCheckpoint, reason: CheckpointFailureReason,
                    message: str, now: int, declined_by: str | None = None) -> CheckpointRecord:
        c = self._context
        self._remove_pending(pending)
        pending.disposed = True
        record = c.record(pending, CheckpointStatus.ABORTED, now, failure_reason=reason.value,
                          failure_message=message, properties={DECLINED_BY: declined_by} if declined_by else {})
        batch.records.append(record)
        batch.control.append(NotifyCheckpointAborted(c.job_id, c.state.epoch, pending.checkpoint_id,
                                                     reason.value, message, now))
        batch.events.append(c.event(pending, "SAVEPOINT_FAILED" if pending.is_savepoint else "ABORTED", now,
                                    end_to_end_duration_ms=now - pending.trigger_timestamp,
                                    failure_reason=reason.value, failure_message=message))
        c.stats.report_failed(pending.checkpoint_id, now, reason.value, message)
        return record

    def abort(self, pending: PendingCheckpoint, reason: CheckpointFailureReason, message: str,
              declined_by: str | None = None) -> None:
        """Abort one pending checkpoint (Flink's ``abortPendingCheckpoint``), then ask the
        :class:`CheckpointFailureManager` whether the job fails (``handleCheckpointException``).
        ``declined_by`` names the subtask attempt that declined it (a task-level failure). Once
        the abort is durable: notify coordinators and listeners, delete its directory, fail its
        future with a :class:`CheckpointException`, then fail the job (or fail over) if the
        failure manager said so, else restart the periodic scheduler where Flink does."""
        c = self._context
        now = c.env.now_ms()
        batch = Batch()
        record = self._abort_into(batch, pending, reason, message, now, declined_by)
        for r in batch.records:
            apply(c.state, r)
        batch.pre_applied.update(id(r) for r in batch.records)
        why = None
        if c.state.job_status == JobStatus.RUNNING:
            why = c.failure_manager.job_failure(record, c.state.continuous_failures)
        failover = why is not None and c.on_failover is not None  # the restart strategy decides, not this abort
        if why is not None and not failover:
            job_record = JobStatusRecord(c.job_id, JobStatus.FAILED, c.state.epoch, why, now)
            apply(c.state, job_record)
            batch.records.append(job_record)
            batch.pre_applied.add(id(job_record))
        restart_periodic = (why is None and c.failure_manager.restarts_periodic_checkpoints(record)
                            and reason not in (R.CHECKPOINT_COORDINATOR_SHUTDOWN, R.CHECKPOINT_COORDINATOR_SUSPEND))

        def after_commit() -> None:
            self._after_abort(pending, reason, message)
            if failover and why is not None:
                self._lifecycle.failover(why)
            elif why is not None:
                self._lifecycle.job_status_changed(JobStatus.FAILED, why)
            elif restart_periodic and c.state.job_status == JobStatus.RUNNING:
                # Flink's StopWithSavepointTerminationHandlerImpl restarts the checkpoint scheduler
                self._lifecycle.start_periodic_scheduler()

        # through commit: a FAILED job status also publishes its JOB_STATUS_CHANGED event
        c.commit(batch, after_commit)

    def _after_abort(self, pending: PendingCheckpoint, reason: CheckpointFailureReason, message: str) -> None:
        c = self._context
        for holder in c.holders.values():
            holder.call("notify_checkpoint_aborted", pending.checkpoint_id)
        for listener in c.listeners:
            try:
                listener.notify_checkpoint_aborted(pending.checkpoint_id)
            except Exception:  # a listener cannot undo an abort
                log.exception("listener failed on notify_checkpoint_aborted(%d)", pending.checkpoint_id)
        if pending.location is not None and not pending.finalizing:
            self.dispose_directory(pending.location.directory)
        if not pending.result.done():
            pending.result.set_exception(CheckpointException(reason, message, pending.checkpoint_id))

    def dispose_directory(self, directory: str | None) -> None:
        """Delete a checkpoint's directory (URL) on the I/O executor, only if this coordinator's
        log wrote it (``owner``); None or empty: nothing. A failure is logged, never raised
        (Flink's ``CheckpointsCleaner``)."""
        c = self._context
        if directory:
            future = c.env.io_executor.submit(c.storage.dispose_location, directory, owner=c.coordinator_log())
            future.add_done_callback(functools.partial(_log_failed_disposal, directory))


def _log_failed_disposal(directory: str, future: concurrent.futures.Future) -> None:
    """Done-callback of a directory disposal: a failure is logged, never raised (Flink's
    ``CheckpointsCleaner`` logs and goes on)."""
    exc = future.exception()
    if exc is not None:
        log.warning("could not delete %s: %s", directory, exc)

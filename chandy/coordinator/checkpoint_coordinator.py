"""The CheckpointCoordinator: Flink's checkpoint and savepoint protocol, event-sourced.

Every method runs on the mailbox thread. A decision never does I/O itself: it builds a
:class:`~chandy.coordinator.environment.Batch` of log records, control messages and public events,
applies the records to :class:`~chandy.coordinator.state.CoordinatorState` (the pure fold) and hands the
batch to the environment, which commits it in one Kafka transaction. Side effects that must only
follow a durable decision (listener notifications, deleting subsumed checkpoints, completing
futures) run in the batch's ``on_committed`` callback. If a batch cannot be committed the
coordinator stops, and the next one rebuilds the state from the log.

The life of a checkpoint (Flink's ``triggerCheckpoint`` … ``completePendingCheckpoint``):

0. request: every trigger request goes through the
   :class:`~chandy.coordinator.request_decider.CheckpointRequestDecider` (queue, forced requests,
   ``max_concurrent`` counting pending savepoints, ``min_pause`` for periodic requests only);
1. trigger: check the job runs; take the next ID; append the counter + PENDING + TRIGGERED and
   wait until that transaction is **committed** (Flink's ``CheckpointIDCounter.getAndIncrement``
   comes before any hook or coordinator sees the ID: external systems key transactions by it);
2. ask the operator coordinators (``checkpoint_coordinator``) and the master hooks for their
   state, and create the storage location, concurrently;
3. when all three are done, send TriggerCheckpoint to the workers, then release the events the
   coordinators sent after their future completed (they belong to the next checkpoint);
4. collect acks (late, duplicate, stale and unknown acks are told apart and change nothing);
   one decline aborts; the timeout aborts with CHECKPOINT_EXPIRED;
5. fully acknowledged: write ``_metadata`` once, atomically (I/O executor);
6. complete: append COMPLETED, abort pending checkpoints below it as CHECKPOINT_SUBSUMED
   (never savepoints), tombstone checkpoints beyond ``num_retained``, NotifyCheckpointComplete;
   after commit notify listeners and coordinators, delete subsumed checkpoints' files. An
   intermediate savepoint does none of this (Flink 1.15+, FLINK-25191): it only completes.

Policy lives in collaborators, as in Flink: the request decider (what runs when), the
:class:`~chandy.coordinator.failure_manager.CheckpointFailureManager` (what fails the job) and the
:class:`~chandy.coordinator.completed_checkpoint_store.CompletedCheckpointStore` (retention and restore
candidates). This class orchestrates.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import logging
import random
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from chandy.coordinator.completed_checkpoint_store import (
    RESTORED_FROM,
    CompletedCheckpointStore,
)
from chandy.coordinator.environment import Batch, Cancellable, CoordinatorEnvironment, OutboundMessage
from chandy.coordinator.errors import ChandyError
from chandy.coordinator.failure import CheckpointException, CheckpointFailureReason
from chandy.coordinator.failure_manager import DECLINED_BY, CheckpointFailureManager
from chandy.coordinator.faults import crash_point
from chandy.coordinator.hooks import MasterHooks, MasterTriggerRestoreHook
from chandy.coordinator.listener import CheckpointListener
from chandy.coordinator.messages import (
    COORDINATOR_ELECTED_EVENT,
    AcknowledgeCheckpoint,
    CheckpointEvent,
    DeclineCheckpoint,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    OperatorEventMessage,
    SubtaskAttemptFailed,
    SubtaskAttemptReady,
    TriggerCheckpoint,
)
from chandy.coordinator.operator_coordinator import OperatorCoordinatorProvider, OperatorEvent
from chandy.coordinator.operator_coordinator_holder import OperatorCoordinatorHolder
from chandy.coordinator.options import CheckpointingOptions
from chandy.coordinator.pending import AckResult, PendingCheckpoint
from chandy.coordinator.records import (
    CheckpointIdCounterRecord,
    CheckpointRecord,
    CheckpointStatus,
    CheckpointType,
    CoordinatorEpochRecord,
    JobStatus,
    JobStatusRecord,
    LogKey,
    Tombstone,
)
from chandy.coordinator.request_decider import (
    CheckpointRequestDecider,
    CheckpointTriggerRequest,
    RequestDecision,
)
from chandy.coordinator.state import NO_CHECKPOINT, CoordinatorState, apply
from chandy.coordinator.stats import CheckpointStats, CheckpointStatsTracker
from chandy.coordinator.storage import (
    CheckpointMetadata,
    CheckpointStorage,
    CheckpointStorageError,
    resolve_checkpoint_pointer,
)
from chandy.coordinator.trigger_result import CheckpointTriggerResult

log = logging.getLogger(__name__)

R = CheckpointFailureReason


class RestoreError(ChandyError):
    """A checkpoint or savepoint cannot be restored into this job."""


class CheckpointCoordinator:
    """Coordinates checkpoints and savepoints of one job (see the module docstring).

    Args:
        job_id: the job's ID.
        options: interval, timeout, min pause, max concurrent, tolerable failures, retention.
        env: mailbox, clock, I/O executor and log writer.
        storage: where checkpoints and savepoints live.
        operators: operator ID -> parallelism of every operator whose subtasks acknowledge.
        coordinator_providers: operator coordinators to host (their operator must be in ``operators``
            or they checkpoint only their own state).
        state: the state replayed from the log (a fresh one for a new job).
        transactional_id: the log writer's ``transactional.id``, recorded with the epoch.
        on_job_status: called with (status, reason) when the job fails or finishes.
    """

    def __init__(
        self,
        job_id: str,
        options: CheckpointingOptions,
        env: CoordinatorEnvironment,
        storage: CheckpointStorage,
        operators: Mapping[str, int],
        *,
        coordinator_providers: Iterable[OperatorCoordinatorProvider] = (),
        state: CoordinatorState | None = None,
        transactional_id: str = "",
        on_job_status: Callable[[JobStatus, str | None], None] | None = None,
        completion_outputs: Callable[[CheckpointMetadata], Sequence[OutboundMessage]] | None = None,
    ) -> None:
        """Args (beyond the obvious):
            completion_outputs: called on the I/O executor once a checkpoint's ``_metadata`` is
                written, before it completes; the messages it returns are published in the same
                Kafka transaction as the checkpoint's COMPLETED record, so they become visible
                exactly when (and only if) the checkpoint completes. An exception aborts the
                checkpoint with FINALIZE_CHECKPOINT_FAILURE. Not called for intermediate
                savepoints, which commit no side effects (Flink 1.15+, FLINK-25191).
        """
        self.job_id = job_id
        self.completion_outputs = completion_outputs
        self.options = options
        self.env = env
        self.storage = storage
        self.operators = dict(operators)
        self.state = state or CoordinatorState(job_id)
        self.transactional_id = transactional_id
        self.on_job_status = on_job_status
        self.hooks = MasterHooks()
        self.listeners: list[CheckpointListener] = []
        self.stats = CheckpointStatsTracker()
        self.pending: dict[int, PendingCheckpoint] = {}
        self.current_attempts: dict[tuple[str, int], int] = {}
        self.ack_counts: collections.Counter[AckResult] = collections.Counter()
        self.holders: dict[str, OperatorCoordinatorHolder] = {}
        for provider in coordinator_providers:
            parallelism = getattr(provider, "parallelism", None) or self.operators.get(provider.operator_id, 1)
            self.holders[provider.operator_id] = OperatorCoordinatorHolder(
                provider, parallelism, env, job_id, lambda: self.state.epoch, self._fail_job,
                lambda record: self._commit(Batch(records=[record])), self.checkpoint_pointer,
                append_batch=self._commit,
            )
        self.decider = CheckpointRequestDecider(options.max_concurrent, options.min_pause_ms)
        self.failure_manager = CheckpointFailureManager(options.tolerable_failed)
        self.store = CompletedCheckpointStore(options.num_retained)
        self._periodic_timer: Any = None
        self._periodic_running = False
        #: explicit requests made before every subtask reported a running attempt, each with its
        #: timeout: they run once the last one does (:meth:`_await_readiness`)
        self._awaiting_readiness: list[tuple[CheckpointTriggerRequest, Cancellable]] = []
        self._last_completion_ms: int | None = None
        self._shutdown = False
        self._restoring: tuple[int, str] | None = None
        #: futures of checkpoints whose completion or abort is being committed (a log writer that
        #: dies meanwhile never runs their commit callback; the runtime fails them instead)
        self.deciding: set[concurrent.futures.Future] = set()

    # -- registration --------------------------------------------------------------------------
    def add_master_hook(self, hook: MasterTriggerRestoreHook[Any]) -> bool:
        """Register a master hook; False when one with the same identifier exists (dropped)."""
        return self.hooks.add(hook)

    def add_listener(self, listener: CheckpointListener) -> None:
        """Register a :class:`CheckpointListener` for completions and aborts."""
        self.listeners.append(listener)

    @property
    def epoch(self) -> int:
        return self.state.epoch

    @property
    def job_status(self) -> JobStatus:
        return self.state.job_status

    # -- the log ---------------------------------------------------------------------------------
    def _commit(self, batch: Batch, on_committed: Callable[[], None] | None = None) -> None:
        """Apply the batch's records to the state and hand the batch to the log writer. A job
        status record that ends or suspends the job also publishes a ``JOB_STATUS_CHANGED`` event
        in the same transaction."""
        now = None
        for record in batch.records:
            if id(record) not in batch.pre_applied:
                apply(self.state, record)
            if isinstance(record, JobStatusRecord) and record.status is not JobStatus.RUNNING:
                now = now if now is not None else self.env.now_ms()
                batch.events.append(CheckpointEvent(
                    job_id=self.job_id, checkpoint_id=self.state.last_succeeded_checkpoint_id,
                    event_type="JOB_STATUS_CHANGED", checkpoint_type=CheckpointType.CHECKPOINT.value,
                    epoch=record.epoch, timestamp=now, trigger_timestamp=record.timestamp,
                    failure_message=record.reason, job_status=record.status.value))
        self.env.append(batch, on_committed)

    def checkpoint_pointer(self, checkpoint_id: int) -> str | None:
        """The directory URL of checkpoint or savepoint ``checkpoint_id``: of the one being
        restored, of a pending one (its storage location), or of one in the log; None if unknown."""
        if self._restoring is not None and self._restoring[0] == checkpoint_id:
            return self._restoring[1]
        pending = self.pending.get(checkpoint_id)
        if pending is not None and pending.location is not None:
            return pending.location.directory
        record = self.state.checkpoints.get(checkpoint_id)
        return record.external_pointer if record is not None else None

    def commit_batch(self, batch: Batch, on_committed: Callable[[], None] | None = None) -> None:
        """Apply ``batch``'s log records to the state and append the batch (records, control
        messages, events) as one transaction; ``on_committed`` runs on the mailbox once durable.

        For extensions of the coordinator that keep their own records in its log (the control
        requests of :mod:`chandy.coordinator.kafka.requests`); mailbox thread only.
        """
        self._commit(batch, on_committed)

    def cancel_job(self, reason: str) -> concurrent.futures.Future:
        """Cancel the job (Flink's ``JobMaster.cancel``): it becomes CANCELED, periodic checkpoints
        stop and pending ones abort (CHECKPOINT_COORDINATOR_SHUTDOWN). Returns a future done once
        the CANCELED status is durable. Mailbox thread only.

        Raises (through the future):
            CheckpointException: the job is not RUNNING (it already ended or failed).
        """
        return self._end_job(JobStatus.CANCELED, reason)

    def fail_job(self, reason: str) -> concurrent.futures.Future:
        """Fail the job for good (Flink: a global failure once the restart strategy gives up):
        it becomes FAILED, a globally terminal status no standby or plain restart resumes, and
        its ``JOB_STATUS_CHANGED`` event says ``reason``. Returns a future done once FAILED is
        durable. Mailbox thread only.

        Raises (through the future):
            CheckpointException: the job is not RUNNING (it already ended or failed).
        """
        return self._end_job(JobStatus.FAILED, reason)

    def _end_job(self, status: JobStatus, reason: str) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        if self.state.job_status != JobStatus.RUNNING:
            future.set_exception(CheckpointException(
                R.NOT_ALL_REQUIRED_TASKS_RUNNING, f"job {self.job_id} is {self.state.job_status.value}, not RUNNING"))
            return future
        record = JobStatusRecord(self.job_id, status, self.state.epoch, reason, self.env.now_ms())

        def after_commit() -> None:
            self._job_status_changed(status, reason)
            future.set_result(record)

        self._commit(Batch(records=[record]), after_commit)
        return future

    def _record(self, pending: PendingCheckpoint, status: CheckpointStatus, now: int, **extra: Any) -> CheckpointRecord:
        return CheckpointRecord(
            job_id=self.job_id, checkpoint_id=pending.checkpoint_id, checkpoint_type=pending.checkpoint_type,
            status=status, epoch=self.state.epoch, trigger_timestamp=pending.trigger_timestamp,
            status_timestamp=now, num_subtasks=len(pending.expected), num_acknowledged=pending.num_acknowledged,
            **extra,
        )

    def _event(self, pending_or_record: Any, event_type: str, now: int, **extra: Any) -> CheckpointEvent:
        p = pending_or_record
        return CheckpointEvent(
            job_id=self.job_id, checkpoint_id=p.checkpoint_id, event_type=event_type,
            checkpoint_type=p.checkpoint_type, epoch=self.state.epoch, timestamp=now,
            trigger_timestamp=p.trigger_timestamp,
            num_subtasks=len(p.expected) if isinstance(p, PendingCheckpoint) else p.num_subtasks,
            num_acknowledged=p.num_acknowledged, **extra,
        )

    # -- start / recovery -------------------------------------------------------------------------
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
            self.job_id, self.state.epoch + 1, self.transactional_id, socket.gethostname(), now))
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
        for holder in self.holders.values():
            holder.coordinator.reset_to_checkpoint(NO_CHECKPOINT, None)

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
    def trigger_checkpoint(self, *, forced: bool = False) -> CheckpointTriggerResult:
        """Request a checkpoint now (a user request; Flink's ``triggerCheckpoint(isPeriodic=false)``).

        Returns a :class:`CheckpointTriggerResult`: the ID when it was taken at once (None when
        the request is queued behind ``max_concurrent`` pending checkpoints or savepoints, or
        refused), and a future of the completed :class:`~chandy.coordinator.records.CheckpointRecord`
        that fails with a :class:`CheckpointException` (TOO_MANY_CHECKPOINT_REQUESTS only when
        the request queue is full, CHECKPOINT_DECLINED, ...). A user request never waits for
        ``min_pause``; ``forced`` also bypasses ``max_concurrent`` (Flink's CheckpointRequestDecider).
        """
        return self._request(CheckpointType.CHECKPOINT, periodic=False, forced=forced)

    def trigger_savepoint(self, target: str | None = None, *, terminate: bool = False) -> CheckpointTriggerResult:
        """Trigger a savepoint into ``target`` (or ``state.savepoints.dir``); the result's future
        gives its pointer (directory URL). Flink's ``triggerSavepoint`` /
        ``triggerSynchronousSavepoint``.

        Savepoints share the ID counter, are forced (they bypass ``max_concurrent`` and
        ``min_pause``, yet count as pending for other requests) and are never subsumed. An
        intermediate savepoint notifies no one of its completion and is no restore candidate
        (Flink 1.15+, FLINK-25191). With ``terminate`` (stop-with-savepoint) periodic checkpoints
        stop first; on success it notifies like a checkpoint and the job FINISHES; declined or
        expired, it fails the job (:class:`~chandy.coordinator.failure_manager.CheckpointFailureManager`).
        """
        if terminate and self._preflight() is None:
            # Flink's stopCheckpointScheduler: periodic checkpoints stop, pending and queued
            # checkpoints are aborted (CHECKPOINT_COORDINATOR_SUSPEND, not a counted failure)
            self.stop_periodic_scheduler()
            self.decider.abort_all(R.CHECKPOINT_COORDINATOR_SUSPEND, "stop-with-savepoint")
            for pending in sorted(self.pending.values(), key=lambda p: p.checkpoint_id):
                self._abort(pending, R.CHECKPOINT_COORDINATOR_SUSPEND, "stop-with-savepoint")
        result = self._request(CheckpointType.SAVEPOINT_TERMINATE if terminate else CheckpointType.SAVEPOINT,
                               periodic=False, forced=True, target=target)
        pointer: concurrent.futures.Future = concurrent.futures.Future()

        def done(f: concurrent.futures.Future) -> None:
            if f.exception() is not None:
                pointer.set_exception(f.exception())
            else:
                pointer.set_result(f.result().external_pointer)

        result.future.add_done_callback(done)
        return CheckpointTriggerResult(result.checkpoint_id, pointer)

    def _preflight(self) -> CheckpointFailureReason | None:
        """Flink's pre-flight checks: a request the coordinator refuses before it takes an ID."""
        if self._shutdown:
            return R.CHECKPOINT_COORDINATOR_SHUTDOWN
        if self.state.job_status != JobStatus.RUNNING:
            return R.NOT_ALL_REQUIRED_TASKS_RUNNING
        if self._subtasks_not_ready():
            return R.NOT_ALL_REQUIRED_TASKS_RUNNING  # Flink: "Not all required tasks are currently running"
        return None

    def _subtasks_not_ready(self) -> bool:
        """Some subtask has not reported a running attempt, and triggers wait for readiness."""
        return self.options.wait_for_running_subtasks and any(
            (op, i) not in self.current_attempts for op, n in self.operators.items() for i in range(n))

    def _await_readiness(self, request: CheckpointTriggerRequest) -> None:
        """Hold an explicit request (a user's checkpoint or savepoint) made before every subtask
        reported a running attempt, e.g. right after the job started or a coordinator took over:
        it runs when the last one reports (:meth:`attempt_ready`), or fails with
        NOT_ALL_REQUIRED_TASKS_RUNNING after ``timeout_ms``. Flink refuses such a request at once;
        holding it spares the caller a retry loop, and nothing is triggered before readiness."""
        def expire() -> None:
            for i, (waiting, _) in enumerate(self._awaiting_readiness):
                if waiting is request:
                    del self._awaiting_readiness[i]
                    request.fail(R.NOT_ALL_REQUIRED_TASKS_RUNNING,
                                 f"not every subtask reported a running attempt within {self.options.timeout_ms} ms")
                    return

        self._awaiting_readiness.append((request, self.env.schedule(self.options.timeout_ms, expire)))

    def _release_awaiting_readiness(self) -> None:
        """Every subtask is running: hand the held requests to the decider, oldest first."""
        held, self._awaiting_readiness = self._awaiting_readiness, []
        for request, timer in held:
            timer.cancel()
            if request.future.done():
                continue
            decision = self.decider.choose_request_to_execute(
                request, is_triggering=self._is_triggering(), pending=len(self.pending),
                last_completion_ms=self._last_completion_ms, now_ms=self.env.now_ms())
            self._act(decision)

    def _fail_awaiting_readiness(self, reason: CheckpointFailureReason, message: str) -> None:
        held, self._awaiting_readiness = self._awaiting_readiness, []
        for request, timer in held:
            timer.cancel()
            request.fail(reason, message)

    def _is_triggering(self) -> bool:
        """A checkpoint is still collecting coordinator and hook state (Flink's ``isTriggering``):
        starting another now could send its trigger first and mix up which operator events
        belong to which checkpoint."""
        return any(not p.trigger_sent for p in self.pending.values())

    def _request(self, checkpoint_type: CheckpointType, *, periodic: bool, forced: bool,
                 target: str | None = None) -> CheckpointTriggerResult:
        """Hand a request to the decider and run what it chooses (Flink's ``triggerCheckpoint``
        → ``chooseRequestToExecute``)."""
        now = self.env.now_ms()
        request = CheckpointTriggerRequest(checkpoint_type, now, periodic=periodic, forced=forced, target=target)
        refused = self._preflight()
        if refused is not None and not periodic and self.state.job_status == JobStatus.RUNNING \
                and not self._shutdown and self._subtasks_not_ready():
            self._await_readiness(request)
            return CheckpointTriggerResult(None, request.future)
        if refused is not None:
            request.fail(refused, "checkpoint request refused")
            if periodic and self._periodic_running:
                # a skipped period is neither a failure nor an ID: the next one tries again
                self._schedule_periodic(self.options.interval_ms)
            return CheckpointTriggerResult(None, request.future)
        decision = self.decider.choose_request_to_execute(
            request, is_triggering=self._is_triggering(), pending=len(self.pending),
            last_completion_ms=self._last_completion_ms, now_ms=now)
        self._act(decision)
        return CheckpointTriggerResult(request.checkpoint_id, request.future)

    def _execute_queued(self) -> None:
        """Run queued requests the decider now allows (Flink's ``executeQueuedRequest``)."""
        while True:
            decision = self.decider.choose_queued_request_to_execute(
                is_triggering=self._is_triggering(), pending=len(self.pending),
                last_completion_ms=self._last_completion_ms, now_ms=self.env.now_ms())
            self._act(decision)
            if decision.execute is not None or decision.reschedule_periodic_ms is None:
                return

    def _act(self, decision: RequestDecision) -> None:
        if decision.reschedule_periodic_ms is not None and self._periodic_running:
            self._schedule_periodic(decision.reschedule_periodic_ms)
        if decision.execute is not None:
            self._start_trigger(decision.execute)

    def _start_trigger(self, request: CheckpointTriggerRequest) -> None:
        """Step 1: take the ID and make it durable; step 2 starts once it is (Flink's
        ``startTriggeringCheckpoint``: ``checkpointIdCounter.getAndIncrement()``, then
        ``createPendingCheckpoint``, then the coordinators and master hooks)."""
        now = self.env.now_ms()
        refused = self._preflight()
        if refused is not None:
            # a pre-flight failure: no ID is taken, nothing is written (Flink's isPreFlight reasons)
            request.fail(refused, "checkpoint request refused")
            return
        if request.future.done():  # failed meanwhile (the coordinator was fenced)
            return
        checkpoint_id = self.state.next_checkpoint_id
        request.checkpoint_id = checkpoint_id
        checkpoint_type = request.checkpoint_type
        expected = frozenset((op, i) for op, n in self.operators.items() for i in range(n))
        pending = PendingCheckpoint(
            checkpoint_id=checkpoint_id, checkpoint_type=checkpoint_type, trigger_timestamp=now,
            expected=expected, attempts={k: v for k, v in self.current_attempts.items() if k in expected},
            result=request.future, coordinators_pending=set(self.holders), properties={"target": request.target},
        )
        self.pending[checkpoint_id] = pending
        self.stats.report_pending(CheckpointStats(checkpoint_id, checkpoint_type, now, len(expected)))
        if request.periodic and self._periodic_running:
            self._schedule_periodic(self.options.interval_ms)
        if not self.holders and not len(self.hooks):
            # only tasks take part: the location first, then one transaction makes the ID durable
            # and sends the trigger (workers read committed, so none sees the ID before the counter
            # and PENDING are durable); one transaction less per checkpoint
            location_future = self.env.io_executor.submit(self._initialize_location, checkpoint_id, checkpoint_type,
                                                          request.target)
            location_future.add_done_callback(lambda f: self.env.execute(lambda: self._location_done(checkpoint_id, f)))
        else:
            # the counter and PENDING are durable before any hook, coordinator or worker sees the
            # ID (Flink's CheckpointIDCounter): after a crash, a new coordinator never hands it out again
            self._commit(Batch(records=[CheckpointIdCounterRecord(self.job_id, checkpoint_id + 1),
                                        self._record(pending, CheckpointStatus.PENDING, now)],
                               events=[self._event(pending, "TRIGGERED", now)]),
                         lambda: self._trigger_masters(pending))
        pending.timeout = self.env.schedule(
            self.options.timeout_ms, lambda: self._abort_if_pending(checkpoint_id, R.CHECKPOINT_EXPIRED,
                                                                    f"not completed within {self.options.timeout_ms} ms"))

    def _trigger_masters(self, pending: PendingCheckpoint) -> None:
        """Step 2, once the ID is durable: coordinators, hooks and the storage location, concurrently."""
        if self.pending.get(pending.checkpoint_id) is not pending:
            return  # aborted (expired, shut down) before its PENDING record was committed
        pending.logged = True
        checkpoint_id, now = pending.checkpoint_id, pending.trigger_timestamp
        for operator_id, holder in self.holders.items():
            holder.checkpoint(checkpoint_id, functools.partial(self._coordinator_done, checkpoint_id, operator_id))
        for identifier, future in self.hooks.trigger(checkpoint_id, now, self.env.io_executor).items():
            pending.hooks_pending.add(identifier)
            future.add_done_callback(functools.partial(self._on_hook_future, checkpoint_id, identifier))
        location_future = self.env.io_executor.submit(self._initialize_location, checkpoint_id,
                                                      pending.checkpoint_type, pending.properties.get("target"))
        location_future.add_done_callback(lambda f: self.env.execute(lambda: self._location_done(checkpoint_id, f)))

    def _initialize_location(self, checkpoint_id: int, checkpoint_type: CheckpointType, target: str | None):
        if checkpoint_type is CheckpointType.CHECKPOINT:
            return self.storage.initialize_location_for_checkpoint(checkpoint_id)
        return self.storage.initialize_location_for_savepoint(checkpoint_id, target)

    def _location_done(self, checkpoint_id: int, future: concurrent.futures.Future) -> None:
        pending = self.pending.get(checkpoint_id)
        if pending is None:
            return
        if future.exception() is not None:
            self._abort(pending, R.IO_EXCEPTION, f"could not create the checkpoint location: {future.exception()}")
            return
        pending.location = future.result()
        self._maybe_send_trigger(pending)

    def _coordinator_done(self, checkpoint_id: int, operator_id: str, data: bytes | None, exc: BaseException | None) -> None:
        pending = self.pending.get(checkpoint_id)
        if pending is None:
            self.holders[operator_id].open_valve()
            return
        if exc is not None:
            self._abort(pending, R.TRIGGER_CHECKPOINT_FAILURE, f"operator coordinator {operator_id} declined: {exc!r}")
            return
        pending.coordinators_pending.discard(operator_id)
        pending.coordinator_states[operator_id] = data
        self._maybe_send_trigger(pending)

    def _on_hook_future(self, checkpoint_id: int, identifier: str, future: concurrent.futures.Future) -> None:
        """A hook's future is done (on whatever thread finished it): handle it on the mailbox."""
        self.env.execute(lambda: self._hook_done(checkpoint_id, identifier, future))

    def _hook_done(self, checkpoint_id: int, identifier: str, future: concurrent.futures.Future) -> None:
        pending = self.pending.get(checkpoint_id)
        if pending is None:
            return
        if future.exception() is not None:
            self._abort(pending, R.TRIGGER_CHECKPOINT_FAILURE, f"master hook {identifier} failed: {future.exception()!r}")
            return
        try:
            state = self.hooks.serialize(identifier, future.result())
        except Exception as exc:  # noqa: BLE001 - a hook's bug fails this checkpoint only
            self._abort(pending, R.TRIGGER_CHECKPOINT_FAILURE, f"master hook {identifier} data did not serialize: {exc!r}")
            return
        if state is not None:
            pending.master_states.append(state)
        pending.hooks_pending.discard(identifier)
        self._maybe_send_trigger(pending)

    def _maybe_send_trigger(self, pending: PendingCheckpoint) -> None:
        if pending.trigger_sent or pending.location is None or pending.coordinators_pending or pending.hooks_pending:
            return
        pending.trigger_sent = True
        now = self.env.now_ms()
        trigger = TriggerCheckpoint(
            self.job_id, self.state.epoch, pending.checkpoint_id, pending.trigger_timestamp,
            pending.checkpoint_type, pending.location.reference, tuple(sorted(self.operators)), {},
        )
        if pending.logged:
            self.env.append(Batch(control=[trigger]))
        else:  # tasks only (see _start_trigger): the ID becomes durable with its trigger
            pending.logged = True
            self._commit(Batch(records=[CheckpointIdCounterRecord(self.job_id, pending.checkpoint_id + 1),
                                        self._record(pending, CheckpointStatus.PENDING, pending.trigger_timestamp)],
                               control=[trigger], events=[self._event(pending, "TRIGGERED", pending.trigger_timestamp)]))
        # events sent after the coordinators' futures completed go out after the trigger
        for holder in self.holders.values():
            holder.open_valve()
        self._execute_queued()
        log.debug("checkpoint %d triggered at %d (%d ms after request)", pending.checkpoint_id, now,
                  now - pending.trigger_timestamp)
        self._maybe_finalize(pending)

    # -- acks and declines -------------------------------------------------------------------------
    def receive_acknowledge(self, ack: AcknowledgeCheckpoint) -> AckResult:
        """Handle an ack (Flink's ``receiveAcknowledgeMessage``). Never raises on bad input:
        late, duplicate, stale and unknown acks are counted, logged and change nothing."""
        if ack.job_id != self.job_id:
            return AckResult.UNKNOWN
        pending = self.pending.get(ack.checkpoint_id)
        if pending is None:
            result = AckResult.LATE if ack.checkpoint_id < self.state.next_checkpoint_id else AckResult.UNKNOWN
        elif ack.epoch != self.state.epoch or not pending.trigger_sent:
            # answers a trigger of another coordinator epoch (possibly the same ID): not ours
            result = AckResult.STALE
        else:
            result = pending.acknowledge(ack)
        self.ack_counts[result] += 1
        if result is not AckResult.SUCCESS or pending is None:
            log.info("%s ack for checkpoint %d from %s[%d] attempt %d: ignored", result.value, ack.checkpoint_id,
                     ack.operator_id, ack.subtask_index, ack.attempt_number)
            return result
        self.stats.report_ack(ack.checkpoint_id, self.env.now_ms(), sum(h.state_size for h in ack.state_handles))
        self._maybe_finalize(pending)
        return result

    def receive_decline(self, decline: DeclineCheckpoint) -> AckResult:
        """Handle a decline (Flink's ``receiveDeclineMessage``): it aborts a pending checkpoint
        with the given reason; declines for checkpoints no longer pending change nothing."""
        if decline.job_id != self.job_id:
            return AckResult.UNKNOWN
        pending = self.pending.get(decline.checkpoint_id)
        if pending is None:
            result = AckResult.LATE if decline.checkpoint_id < self.state.next_checkpoint_id else AckResult.UNKNOWN
            log.info("%s decline for checkpoint %d: ignored", result.value, decline.checkpoint_id)
            return result
        subtask = (decline.operator_id, decline.subtask_index)
        if decline.epoch != self.state.epoch or not pending.trigger_sent:
            log.info("decline for checkpoint %d from epoch %d (current %d): ignored", decline.checkpoint_id,
                     decline.epoch, self.state.epoch)
            return AckResult.STALE
        if subtask in pending.expected and decline.attempt_number < pending.attempts.get(subtask, 0):
            log.info("stale decline for checkpoint %d from %s attempt %d: ignored", decline.checkpoint_id, subtask,
                     decline.attempt_number)
            return AckResult.STALE
        try:
            reason = R(decline.reason)
        except ValueError:
            reason = R.CHECKPOINT_DECLINED
        self._abort(pending, reason, f"declined by {decline.operator_id}[{decline.subtask_index}] attempt "
                                     f"{decline.attempt_number}: {decline.message or reason.value}",
                    declined_by=f"{decline.operator_id}[{decline.subtask_index}]#{decline.attempt_number}")
        return AckResult.SUCCESS

    # -- completion ---------------------------------------------------------------------------------
    def _maybe_finalize(self, pending: PendingCheckpoint) -> None:
        if pending.finalizing or not pending.is_fully_acknowledged or pending.location is None:
            return  # (the location is initialized before the trigger is sent)
        crash_point("before-complete", pending.checkpoint_id)
        pending.finalizing = True
        metadata = CheckpointMetadata(
            job_id=self.job_id, checkpoint_id=pending.checkpoint_id, checkpoint_type=pending.checkpoint_type,
            trigger_timestamp=pending.trigger_timestamp, completion_timestamp=self.env.now_ms(),
            master_states=tuple(pending.master_states), operator_states=pending.operator_states(),
        )
        location = pending.location
        outputs = self.completion_outputs if pending.checkpoint_type is not CheckpointType.SAVEPOINT else None

        def finalize() -> list[OutboundMessage]:
            self.storage.write_metadata(location, metadata)
            return list(outputs(metadata)) if outputs is not None else []

        future = self.env.io_executor.submit(finalize)
        future.add_done_callback(lambda f: self.env.execute(lambda: self._metadata_written(pending, f)))

    def _metadata_written(self, pending: PendingCheckpoint, future: concurrent.futures.Future) -> None:
        if self.pending.get(pending.checkpoint_id) is not pending:
            # aborted (timeout, decline) while _metadata was being written: that file must go
            self._dispose_directory(pending.location.directory if pending.location else None)
            return
        if future.exception() is not None:
            self._abort(pending, R.FINALIZE_CHECKPOINT_FAILURE, f"finalizing failed: {future.exception()}")
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
        now = self.env.now_ms()
        checkpoint_id = pending.checkpoint_id
        self._remove_pending(pending)
        state_size = pending.state_size
        pointer = pending.location.external_pointer if pending.location else None
        notifies = pending.checkpoint_type is not CheckpointType.SAVEPOINT
        record = self._record(pending, CheckpointStatus.COMPLETED, now, state_size=state_size, external_pointer=pointer)
        batch = Batch(
            records=[record],
            events=[self._event(pending, "SAVEPOINT_COMPLETED" if pending.is_savepoint else "COMPLETED", now,
                                end_to_end_duration_ms=now - pending.trigger_timestamp, state_size=state_size,
                                external_pointer=pointer)],
            outputs=list(outputs),
        )
        subsumed: list[PendingCheckpoint] = []
        discarded: tuple[str, ...] = ()
        if notifies:
            batch.control.append(NotifyCheckpointComplete(self.job_id, self.state.epoch, checkpoint_id,
                                                          pending.checkpoint_type, now))
            # Flink's dropSubsumedCheckpoints: savepoints are never subsumed
            subsumed = [other for other in sorted(self.pending.values(), key=lambda p: p.checkpoint_id)
                        if other.checkpoint_id < checkpoint_id and not other.is_savepoint]
            for other in subsumed:
                self._abort_into(batch, other, R.CHECKPOINT_SUBSUMED, f"subsumed by checkpoint {checkpoint_id}", now)
            discarded = self._retention(batch, record)
        finished = pending.checkpoint_type is CheckpointType.SAVEPOINT_TERMINATE
        if finished:
            batch.records.append(JobStatusRecord(self.job_id, JobStatus.FINISHED, self.state.epoch,
                                                 f"stop-with-savepoint {checkpoint_id}", now))
        self.stats.report_completed(checkpoint_id, now, state_size, pointer)
        self._last_completion_ms = now

        def after_commit() -> None:
            if notifies and not self._notify_complete(checkpoint_id) and finished:
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
                self._dispose_directory(directory)
            if not pending.result.done():
                pending.result.set_result(record)
            if finished:
                self._job_status_changed(JobStatus.FINISHED, f"stop-with-savepoint {checkpoint_id}")

        self._commit(batch, after_commit)

    def _retention(self, batch: Batch, new_entry: CheckpointRecord) -> tuple[str, ...]:
        """Tombstones for what leaves the completed checkpoint store once ``new_entry`` joins it
        (:meth:`CompletedCheckpointStore.retention`); returns the directories to delete."""
        decision = self.store.retention(self.state, new_entry)
        for checkpoint_id in decision.tombstones:
            batch.records.append(Tombstone(LogKey(self.job_id, "checkpoint", str(checkpoint_id))))
        return decision.directories_to_delete

    def _notify_complete(self, checkpoint_id: int) -> bool:
        """Notify the coordinators, then the listeners; False when a coordinator's notification
        failed (it failed the job)."""
        # in registration order; a coordinator whose notification failed (and failed the job)
        # stops the later ones: the pipeline's offset commit must never follow a failed lake commit
        notified = True
        for holder in self.holders.values():
            if not holder.call("notify_checkpoint_complete", checkpoint_id):
                notified = False
                break
        for listener in self.listeners:
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
        pending = self.pending.get(checkpoint_id)
        if pending is None:
            return False
        self._abort(pending, CheckpointFailureReason(reason), message)
        return True

    def _abort_if_pending(self, checkpoint_id: int, reason: CheckpointFailureReason, message: str) -> None:
        pending = self.pending.get(checkpoint_id)
        if pending is not None:
            self._abort(pending, reason, message)

    def _remove_pending(self, pending: PendingCheckpoint) -> None:
        self.pending.pop(pending.checkpoint_id, None)
        if not pending.result.done():
            # its completion or abort is being committed: until then the future is in flight
            self.deciding.add(pending.result)
            pending.result.add_done_callback(self.deciding.discard)
        if pending.timeout is not None:
            pending.timeout.cancel()
        if not pending.trigger_sent and pending.logged:
            for holder in self.holders.values():
                holder.open_valve()
        # a slot is free: queued requests may run (Flink's scheduleTriggerRequest)
        self.env.execute(self._execute_queued)

    def _abort_into(self, batch: Batch, pending: PendingCheckpoint, reason: CheckpointFailureReason,
                    message: str, now: int, declined_by: str | None = None) -> CheckpointRecord:
        self._remove_pending(pending)
        pending.disposed = True
        record = self._record(pending, CheckpointStatus.ABORTED, now, failure_reason=reason.value,
                              failure_message=message, properties={DECLINED_BY: declined_by} if declined_by else {})
        batch.records.append(record)
        batch.control.append(NotifyCheckpointAborted(self.job_id, self.state.epoch, pending.checkpoint_id,
                                                     reason.value, message, now))
        batch.events.append(self._event(pending, "SAVEPOINT_FAILED" if pending.is_savepoint else "ABORTED", now,
                                        end_to_end_duration_ms=now - pending.trigger_timestamp,
                                        failure_reason=reason.value, failure_message=message))
        self.stats.report_failed(pending.checkpoint_id, now, reason.value, message)
        return record

    def _abort(self, pending: PendingCheckpoint, reason: CheckpointFailureReason, message: str,
               declined_by: str | None = None) -> None:
        """Abort one pending checkpoint (Flink's ``abortPendingCheckpoint``), then ask the
        :class:`CheckpointFailureManager` whether the job fails (``handleCheckpointException``).
        ``declined_by`` names the subtask attempt that declined it (a task-level failure)."""
        now = self.env.now_ms()
        batch = Batch()
        record = self._abort_into(batch, pending, reason, message, now, declined_by)
        for r in batch.records:
            apply(self.state, r)
        batch.pre_applied.update(id(r) for r in batch.records)
        why = None
        if self.state.job_status == JobStatus.RUNNING:
            why = self.failure_manager.job_failure(record, self.state.continuous_failures)
        if why is not None:
            job_record = JobStatusRecord(self.job_id, JobStatus.FAILED, self.state.epoch, why, now)
            apply(self.state, job_record)
            batch.records.append(job_record)
            batch.pre_applied.add(id(job_record))
        restart_periodic = (why is None and self.failure_manager.restarts_periodic_checkpoints(record)
                            and reason not in (R.CHECKPOINT_COORDINATOR_SHUTDOWN, R.CHECKPOINT_COORDINATOR_SUSPEND))

        def after_commit() -> None:
            self._after_abort(pending, reason, message)
            if why is not None:
                self._job_status_changed(JobStatus.FAILED, why)
            elif restart_periodic and self.state.job_status == JobStatus.RUNNING:
                # Flink's StopWithSavepointTerminationHandlerImpl restarts the checkpoint scheduler
                self.start_periodic_scheduler()

        # through _commit: a FAILED job status also publishes its JOB_STATUS_CHANGED event
        self._commit(batch, after_commit)

    def _after_abort(self, pending: PendingCheckpoint, reason: CheckpointFailureReason, message: str) -> None:
        for holder in self.holders.values():
            holder.call("notify_checkpoint_aborted", pending.checkpoint_id)
        for listener in self.listeners:
            try:
                listener.notify_checkpoint_aborted(pending.checkpoint_id)
            except Exception:  # a listener cannot undo an abort
                log.exception("listener failed on notify_checkpoint_aborted(%d)", pending.checkpoint_id)
        if pending.location is not None and not pending.finalizing:
            self._dispose_directory(pending.location.directory)
        if not pending.result.done():
            pending.result.set_exception(CheckpointException(reason, message, pending.checkpoint_id))

    def _dispose_directory(self, directory: str | None) -> None:
        if directory:
            future = self.env.io_executor.submit(self.storage.dispose_location, directory)
            future.add_done_callback(functools.partial(_log_failed_disposal, directory))

    # -- subtasks and operator events --------------------------------------------------------------------
    def _valid_subtask(self, job_id: str, operator_id: str, subtask_index: int) -> bool:
        parallelism = self.operators.get(operator_id)
        if parallelism is None and operator_id in self.holders:
            parallelism = self.holders[operator_id].current_parallelism()
        if job_id != self.job_id or parallelism is None or not 0 <= subtask_index < parallelism:
            self.ack_counts[AckResult.UNKNOWN] += 1
            log.warning("message for unknown subtask %s[%d] of job %s: ignored", operator_id, subtask_index, job_id)
            return False
        return True

    def attempt_ready(self, message: SubtaskAttemptReady) -> None:
        """A subtask attempt is ready (OperatorCoordinator.executionAttemptReady). A newer attempt
        whose predecessor never reported failing fails the predecessor first, keeping the order of Flink's OperatorCoordinator contract."""
        if not self._valid_subtask(message.job_id, message.operator_id, message.subtask_index):
            return
        key = (message.operator_id, message.subtask_index)
        current = self.current_attempts.get(key, -1)
        if message.attempt_number < current:
            log.info("ignoring ready of stale attempt %d of %s", message.attempt_number, key)
            return
        if current >= 0 and message.attempt_number > current:
            self.attempt_failed(SubtaskAttemptFailed(self.job_id, key[0], key[1], current,
                                                     f"superseded by attempt {message.attempt_number}"))
        self.current_attempts[key] = message.attempt_number
        holder = self.holders.get(message.operator_id)
        if holder is not None:
            holder.attempt_ready(message.subtask_index, message.attempt_number)
        if self._awaiting_readiness and not self._subtasks_not_ready():
            self._release_awaiting_readiness()

    def attempt_failed(self, message: SubtaskAttemptFailed) -> None:
        """A subtask attempt failed: tell its coordinator (``execution_attempt_failed`` then
        ``subtask_reset`` to the latest completed checkpoint) and abort the pending checkpoints
        still waiting for that subtask with TASK_FAILURE."""
        if not self._valid_subtask(message.job_id, message.operator_id, message.subtask_index):
            return
        key = (message.operator_id, message.subtask_index)
        if message.attempt_number < self.current_attempts.get(key, -1):
            return
        latest = CompletedCheckpointStore.latest(self.state)
        holder = self.holders.get(message.operator_id)
        if holder is not None:
            holder.attempt_failed(message.subtask_index, message.attempt_number, RuntimeError(message.reason or "failed"),
                                  latest.checkpoint_id if latest else NO_CHECKPOINT)
        # a failover resets the subtask to the latest completed checkpoint: no pending checkpoint can
        # complete consistently with that any more (Flink aborts them all; TASK_FAILURE is not counted)
        for pending in list(self.pending.values()):
            if not pending.is_savepoint:
                self._abort(pending, R.TASK_FAILURE, f"{key[0]}[{key[1]}] attempt {message.attempt_number} failed: "
                                                     f"{message.reason}")

    def receive_operator_event(self, message: OperatorEventMessage) -> None:
        """An operator event from a subtask, for its operator's coordinator."""
        if message.job_id != self.job_id:
            return
        holder = self.holders.get(message.operator_id)
        if holder is not None and holder.current_attempts.get(message.subtask_index) != message.attempt_number:
            log.info("operator event from a non-current attempt %d of %s[%d]: ignored", message.attempt_number,
                     message.operator_id, message.subtask_index)
            return
        if holder is None:
            log.warning("operator event %s for %s, which has no coordinator: ignored", message.event_type, message.operator_id)
            return
        holder.handle_event(message.subtask_index, message.attempt_number, OperatorEvent(message.event_type, message.payload))

    # -- periodic scheduling -------------------------------------------------------------------------------
    def start_periodic_scheduler(self) -> None:
        """Start periodic checkpoints: the first after a random delay within the interval
        (Flink's ``getRandomInitDelay``: between ``min_pause`` and ``interval``)."""
        if not self.options.periodic or self._periodic_running:
            return
        self._periodic_running = True
        low = min(self.options.min_pause_ms, self.options.interval_ms)
        delay = random.randint(low, self.options.interval_ms) if self.options.random_initial_delay else low
        self._schedule_periodic(delay)

    def stop_periodic_scheduler(self) -> None:
        """Stop periodic checkpoints; queued periodic requests are dropped (Flink's
        ``stopCheckpointScheduler``). Pending checkpoints go on."""
        self._periodic_running = False
        if self._periodic_timer is not None:
            self._periodic_timer.cancel()
            self._periodic_timer = None
        self.decider.remove_periodic(R.PERIODIC_SCHEDULER_SHUTDOWN, "periodic checkpoints stopped")

    def _schedule_periodic(self, delay_ms: int) -> None:
        if self._periodic_timer is not None:
            self._periodic_timer.cancel()
        self._periodic_timer = self.env.schedule(max(0, delay_ms), self._periodic_trigger)

    def _periodic_trigger(self) -> None:
        """A periodic request (Flink's ``ScheduledTrigger``). It runs, waits in the decider's queue
        (the next periodic trigger is scheduled when it runs), or is dropped for the min pause
        (the decider reschedules it)."""
        self._periodic_timer = None
        if not self._periodic_running or self.decider.has_queued_periodic():
            return
        self._request(CheckpointType.CHECKPOINT, periodic=True, forced=False)

    # -- job status ------------------------------------------------------------------------------------------
    def _fail_job(self, cause: BaseException) -> None:
        # FINISHED too: a stop-with-savepoint whose notification (the lake commit) fails has not finished
        if self.state.job_status not in (JobStatus.RUNNING, JobStatus.FINISHED):
            return
        now = self.env.now_ms()
        reason = f"{type(cause).__name__}: {cause}"
        self._commit(Batch(records=[JobStatusRecord(self.job_id, JobStatus.FAILED, self.state.epoch, reason, now)]),
                     lambda: self._job_status_changed(JobStatus.FAILED, reason))

    def _job_status_changed(self, status: JobStatus, reason: str | None) -> None:
        self.stop_periodic_scheduler()
        self.decider.abort_all(R.NOT_ALL_REQUIRED_TASKS_RUNNING, f"job {status.value.lower()}")
        self._fail_awaiting_readiness(R.NOT_ALL_REQUIRED_TASKS_RUNNING, f"job {status.value.lower()}")
        for pending in list(self.pending.values()):
            self._abort(pending, R.CHECKPOINT_COORDINATOR_SHUTDOWN, f"job {status.lower()}")
        if self.on_job_status is not None:
            self.on_job_status(status, reason)

    def shutdown(self) -> None:
        """Stop scheduling, abort pending checkpoints (CHECKPOINT_COORDINATOR_SHUTDOWN), close
        coordinators and hooks. Writes the aborts only while the log writer still accepts them."""
        if self._shutdown:
            return
        self.stop_periodic_scheduler()
        self.decider.abort_all(R.CHECKPOINT_COORDINATOR_SHUTDOWN, "coordinator shut down")
        self._fail_awaiting_readiness(R.CHECKPOINT_COORDINATOR_SHUTDOWN, "coordinator shut down")
        for pending in list(self.pending.values()):
            self._abort(pending, R.CHECKPOINT_COORDINATOR_SHUTDOWN, "coordinator shut down")
        if self.state.job_status == JobStatus.RUNNING:
            # a clean stop, told apart in the log from a coordinator that was fenced or died
            self._commit(Batch(records=[JobStatusRecord(self.job_id, JobStatus.SUSPENDED, self.state.epoch,
                                                        "coordinator stopped", self.env.now_ms())]))
        self._shutdown = True
        for holder in self.holders.values():
            holder.close()
        self.hooks.close()


def _log_failed_disposal(directory: str, future: concurrent.futures.Future) -> None:
    """Done-callback of a directory disposal: a failure is logged, never raised (Flink's
    ``CheckpointsCleaner`` logs and goes on)."""
    exc = future.exception()
    if exc is not None:
        log.warning("could not delete %s: %s", directory, exc)

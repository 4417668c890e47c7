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
candidates). So do the other parts of the protocol, each a field of the coordinator:
:class:`~chandy.coordinator.checkpoint_completion.CheckpointCompletion` (steps 4 to 6 and aborts),
:class:`~chandy.coordinator.checkpoint_restore.CheckpointRestorer` (start and restore),
:class:`~chandy.coordinator.subtask_attempts.SubtaskAttempts` (which attempts run, requests held
until they all do) and :class:`~chandy.coordinator.job_lifecycle.JobLifecycle` (periodic scheduler,
job status, global failures, shutdown). What they share is one
:class:`~chandy.coordinator.coordinator_context.CoordinatorContext`. This class triggers (steps 0
to 3) and orchestrates; its public methods are the coordinator's whole interface.
"""

from __future__ import annotations

import collections
import concurrent.futures
import functools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from chandy.coordinator.checkpoint_completion import CheckpointCompletion
from chandy.coordinator.checkpoint_restore import CheckpointRestorer, RestoreError
from chandy.coordinator.completed_checkpoint_store import CompletedCheckpointStore
from chandy.coordinator.coordinator_context import CoordinatorContext
from chandy.coordinator.environment import Batch, CoordinatorEnvironment, OutboundMessage
from chandy.coordinator.failure import CheckpointFailureReason
from chandy.coordinator.failure_manager import CheckpointFailureManager
from chandy.coordinator.hooks import MasterHooks, MasterTriggerRestoreHook
from chandy.coordinator.job_lifecycle import JobLifecycle
from chandy.coordinator.listener import CheckpointListener
from chandy.coordinator.messages import (
    AcknowledgeCheckpoint,
    DeclineCheckpoint,
    OperatorEventMessage,
    SubtaskAttemptFailed,
    SubtaskAttemptReady,
    TriggerCheckpoint,
)
from chandy.coordinator.operator_coordinator import OperatorCoordinatorProvider
from chandy.coordinator.operator_coordinator_holder import OperatorCoordinatorHolder
from chandy.coordinator.options import CheckpointingOptions
from chandy.coordinator.pending import AckResult, PendingCheckpoint
from chandy.coordinator.records import (
    CheckpointIdCounterRecord,
    CheckpointStatus,
    CheckpointType,
    JobStatus,
)
from chandy.coordinator.request_decider import (
    CheckpointRequestDecider,
    CheckpointTriggerRequest,
    RequestDecision,
)
from chandy.coordinator.state import CoordinatorState
from chandy.coordinator.stats import CheckpointStats, CheckpointStatsTracker
from chandy.coordinator.storage import CheckpointMetadata, CheckpointStorage
from chandy.coordinator.subtask_attempts import SubtaskAttempts
from chandy.coordinator.trigger_result import CheckpointTriggerResult

__all__ = ["CheckpointCoordinator", "RestoreError"]

log = logging.getLogger(__name__)

R = CheckpointFailureReason


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
        completion_outputs: called on the I/O executor once a checkpoint's ``_metadata`` is
            written, before it completes; the messages it returns are published in the same
            Kafka transaction as the checkpoint's COMPLETED record, so they become visible
            exactly when (and only if) the checkpoint completes. An exception aborts the
            checkpoint with FINALIZE_CHECKPOINT_FAILURE. Not called for intermediate
            savepoints, which commit no side effects (Flink 1.15+, FLINK-25191).
        job_name: the job's name (Flink's), published with the ``JOB_STARTED`` event.
        on_failover: with a restart strategy in the host: called once with the reason of a global
            failure (a failing operator coordinator, more failed checkpoints than tolerated)
            instead of recording FAILED; the host restarts the job or fails it.
        coordinator_id: this coordinator instance's ID in its epoch record (default: a random
            one; :class:`~chandy.coordinator.records.CoordinatorEpochRecord`).
    """

    #: the state the collaborators share
    context: CoordinatorContext
    #: the periodic scheduler, the job's status, global failures, shutdown
    lifecycle: JobLifecycle
    #: acks, declines, completion and aborts of pending checkpoints
    completion: CheckpointCompletion
    #: the readiness of subtask attempts, held requests, operator events
    attempts: SubtaskAttempts
    #: start and restore
    restorer: CheckpointRestorer

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
        job_name: str | None = None,
        on_failover: Callable[[str], None] | None = None,
        coordinator_id: str | None = None,
    ) -> None:
        context = self.context = CoordinatorContext(
            job_id, options, env, storage, operators, state=state, transactional_id=transactional_id,
            on_job_status=on_job_status, completion_outputs=completion_outputs, job_name=job_name,
            on_failover=on_failover, coordinator_id=coordinator_id)
        # the collaborators call one another: an abort may end the job, and the job's end aborts
        # every pending checkpoint. The lifecycle comes first; it reaches the completion and the
        # subtask attempts, built after it, through these two callbacks
        self.lifecycle = JobLifecycle(
            context, request=self._request,
            abort=lambda pending, reason, message: self.completion.abort(pending, reason, message),
            fail_awaiting_readiness=lambda reason, message: self.attempts.fail_awaiting_readiness(reason, message))
        self.completion = CheckpointCompletion(context, self.lifecycle, execute_queued=self._execute_queued)
        self.attempts = SubtaskAttempts(context, self.completion, is_triggering=self._is_triggering, act=self._act)
        self.restorer = CheckpointRestorer(context, self.completion, self.lifecycle)
        for provider in coordinator_providers:
            parallelism = getattr(provider, "parallelism", None) or context.operators.get(provider.operator_id, 1)
            context.holders[provider.operator_id] = OperatorCoordinatorHolder(
                provider, parallelism, env, job_id, lambda: context.state.epoch, self.lifecycle.handle_global_failure,
                lambda record: context.commit(Batch(records=[record])), context.checkpoint_pointer,
                append_batch=context.commit, state_of=lambda: context.state, event_of=context.checkpoint_event,
                log_of=context.coordinator_log,
            )

    # -- the shared state, as attributes -----------------------------------------------------------

    @property
    def job_id(self) -> str:
        """The job's ID (Flink's JobID)."""
        return self.context.job_id

    @property
    def job_name(self) -> str | None:
        """The job's name (Flink's); None: events name the job by its ID."""
        return self.context.job_name

    @property
    def options(self) -> CheckpointingOptions:
        """Interval, timeout, min pause (ms), max concurrent, tolerable failures, retention."""
        return self.context.options

    @property
    def env(self) -> CoordinatorEnvironment:
        """Mailbox, clock, I/O executor and log writer."""
        return self.context.env

    @property
    def storage(self) -> CheckpointStorage:
        """Where checkpoints and savepoints live."""
        return self.context.storage

    @property
    def operators(self) -> dict[str, int]:
        """Operator ID -> parallelism of every operator whose subtasks acknowledge."""
        return self.context.operators

    @property
    def state(self) -> CoordinatorState:
        """The state folded from the log (:mod:`chandy.coordinator.state`)."""
        return self.context.state

    @property
    def transactional_id(self) -> str:
        """The log writer's ``transactional.id``, recorded with the epoch (empty: none)."""
        return self.context.transactional_id

    @property
    def coordinator_id(self) -> str:
        """This coordinator instance's ID in its epoch record."""
        return self.context.coordinator_id

    @property
    def failover_reason(self) -> str | None:
        """The reason of the global failure handed to ``on_failover`` (None before one)."""
        return self.context.failover_reason

    @property
    def hooks(self) -> MasterHooks:
        """The registered master hooks (:meth:`add_master_hook`)."""
        return self.context.hooks

    @property
    def listeners(self) -> list[CheckpointListener]:
        """The registered listeners (:meth:`add_listener`), notified in this order."""
        return self.context.listeners

    @property
    def stats(self) -> CheckpointStatsTracker:
        """Checkpoint statistics (Flink's ``CheckpointStatsTracker``)."""
        return self.context.stats

    @property
    def pending(self) -> dict[int, PendingCheckpoint]:
        """Checkpoint ID -> pending checkpoint or savepoint."""
        return self.context.pending

    @property
    def current_attempts(self) -> dict[tuple[str, int], int]:
        """(operator ID, subtask index) -> the attempt number it last reported running."""
        return self.context.current_attempts

    @property
    def ack_counts(self) -> collections.Counter[AckResult]:
        """How many acks (and messages of unknown subtasks) ended in each :class:`AckResult`."""
        return self.context.ack_counts

    @property
    def holders(self) -> dict[str, OperatorCoordinatorHolder]:
        """Operator ID -> the holder of its operator coordinator."""
        return self.context.holders

    @property
    def failure_manager(self) -> CheckpointFailureManager:
        """Decides which failed checkpoints fail the job (Flink's ``CheckpointFailureManager``)."""
        return self.context.failure_manager

    @property
    def store(self) -> CompletedCheckpointStore:
        """Retention and restore candidates (Flink's ``CompletedCheckpointStore``)."""
        return self.context.store

    @property
    def deciding(self) -> set[concurrent.futures.Future]:
        """Futures of checkpoints whose completion or abort is being committed."""
        return self.context.deciding

    @property
    def decider(self) -> CheckpointRequestDecider:
        """Decides which trigger request runs when (Flink's ``CheckpointRequestDecider``); replaceable."""
        return self.context.decider

    @decider.setter
    def decider(self, decider: CheckpointRequestDecider) -> None:
        self.context.decider = decider

    @property
    def on_job_status(self) -> Callable[[JobStatus, str | None], None] | None:
        """Called with (status, reason) when the job fails or finishes; replaceable."""
        return self.context.on_job_status

    @on_job_status.setter
    def on_job_status(self, callback: Callable[[JobStatus, str | None], None] | None) -> None:
        self.context.on_job_status = callback

    @property
    def on_failover(self) -> Callable[[str], None] | None:
        """With a restart strategy in the host: called once with the reason of a global failure; replaceable."""
        return self.context.on_failover

    @on_failover.setter
    def on_failover(self, callback: Callable[[str], None] | None) -> None:
        self.context.on_failover = callback

    @property
    def completion_outputs(self) -> Callable[[CheckpointMetadata], Sequence[OutboundMessage]] | None:
        """Messages published with a checkpoint's COMPLETED record (see the class docstring); replaceable."""
        return self.context.completion_outputs

    @completion_outputs.setter
    def completion_outputs(self, callback: Callable[[CheckpointMetadata], Sequence[OutboundMessage]] | None) -> None:
        self.context.completion_outputs = callback

    @property
    def epoch(self) -> int:
        """The current coordinator epoch (the log's newest epoch record)."""
        return self.state.epoch

    @property
    def job_status(self) -> JobStatus:
        """The job's status in the log."""
        return self.state.job_status

    # -- registration and the log ------------------------------------------------------------------

    def add_master_hook(self, hook: MasterTriggerRestoreHook[Any]) -> bool:
        """Register a master hook; False when one with the same identifier exists (dropped)."""
        return self.hooks.add(hook)

    def add_listener(self, listener: CheckpointListener) -> None:
        """Register a :class:`CheckpointListener` for completions and aborts."""
        self.listeners.append(listener)

    def coordinator_log(self) -> str | None:
        """The coordinator log this coordinator writes, as its ``_metadata`` files name it
        (``<transactional id>@<log incarnation>``; None without a transactional ID); see
        :meth:`CoordinatorContext.coordinator_log`."""
        return self.context.coordinator_log()

    def checkpoint_pointer(self, checkpoint_id: int) -> str | None:
        """The directory URL of checkpoint or savepoint ``checkpoint_id``: of the one being
        restored, of a pending one (its storage location), or of one in the log; None if unknown."""
        return self.context.checkpoint_pointer(checkpoint_id)

    def commit_batch(self, batch: Batch, on_committed: Callable[[], None] | None = None) -> None:
        """Apply ``batch``'s log records to the state and append the batch (records, control
        messages, events) as one transaction; ``on_committed`` runs on the mailbox once durable.

        For extensions of the coordinator that keep their own records in its log (the control
        requests of :mod:`chandy.coordinator.kafka.requests`); mailbox thread only.
        """
        self.context.commit(batch, on_committed)

    # -- start and restore (CheckpointRestorer) ----------------------------------------------------

    def start(self, *, restore_from: str | None = None, allow_non_restored_state: bool = False,
              checkpoint_id_floor: int | None = None) -> None:
        """Become the job's coordinator: new epoch, abort leftovers, restore, notify, start
        coordinators (:meth:`CheckpointRestorer.start`, which says how).

        Raises:
            RestoreError: the savepoint holds state for an operator this job lacks (unless
                ``allow_non_restored_state``), or no retained checkpoint's ``_metadata`` is readable.
        """
        self.restorer.start(restore_from=restore_from, allow_non_restored_state=allow_non_restored_state,
                            checkpoint_id_floor=checkpoint_id_floor)

    # -- acks, declines and aborts (CheckpointCompletion) --------------------------------------------

    def receive_acknowledge(self, ack: AcknowledgeCheckpoint) -> AckResult:
        """Handle an ack (Flink's ``receiveAcknowledgeMessage``; :meth:`CheckpointCompletion.receive_acknowledge`).
        Never raises on bad input: late, duplicate, stale and unknown acks are counted, logged and
        change nothing."""
        return self.completion.receive_acknowledge(ack)

    def receive_decline(self, decline: DeclineCheckpoint) -> AckResult:
        """Handle a decline (Flink's ``receiveDeclineMessage``; :meth:`CheckpointCompletion.receive_decline`):
        it aborts a pending checkpoint with the given reason; declines for checkpoints no longer
        pending change nothing."""
        return self.completion.receive_decline(decline)

    def abort_checkpoint(self, checkpoint_id: int, reason: CheckpointFailureReason, message: str) -> bool:
        """Abort pending checkpoint ``checkpoint_id`` now (Flink's ``abortPendingCheckpoint``), for a
        failure the coordinator learns of outside the acks, such as a failed Spark job. Returns
        False when it is not pending. The reason counts towards the tolerable failures as any."""
        return self.completion.abort_checkpoint(checkpoint_id, reason, message)

    # -- subtask attempts and operator events (SubtaskAttempts) ----------------------------------------

    def is_held(self, request: CheckpointTriggerRequest) -> bool:
        """Whether ``request`` still waits for every subtask to report a running attempt."""
        return self.attempts.is_held(request)

    def attempt_ready(self, message: SubtaskAttemptReady) -> None:
        """A subtask attempt is ready (OperatorCoordinator.executionAttemptReady;
        :meth:`SubtaskAttempts.attempt_ready`)."""
        self.attempts.attempt_ready(message)

    def attempt_failed(self, message: SubtaskAttemptFailed) -> None:
        """A subtask attempt failed: tell its coordinator and abort the pending checkpoints still
        waiting for that subtask with TASK_FAILURE (:meth:`SubtaskAttempts.attempt_failed`)."""
        self.attempts.attempt_failed(message)

    def receive_operator_event(self, message: OperatorEventMessage) -> None:
        """An operator event from a subtask, for its operator's coordinator."""
        self.attempts.receive_operator_event(message)

    # -- the job and the periodic scheduler (JobLifecycle) -------------------------------------------

    def cancel_job(self, reason: str) -> concurrent.futures.Future:
        """Cancel the job (Flink's ``JobMaster.cancel``; :meth:`JobLifecycle.cancel_job`). Returns a
        future done once the CANCELED status is durable. Mailbox thread only.

        Raises (through the future):
            CheckpointException: the job is not RUNNING (it already ended or failed).
        """
        return self.lifecycle.cancel_job(reason)

    def fail_job(self, reason: str) -> concurrent.futures.Future:
        """Fail the job for good (:meth:`JobLifecycle.fail_job`). Returns a future done once FAILED
        is durable. Mailbox thread only.

        Raises (through the future):
            CheckpointException: the job is not RUNNING (it already ended or failed).
        """
        return self.lifecycle.fail_job(reason)

    def start_periodic_scheduler(self) -> None:
        """Start periodic checkpoints (Flink's ``startCheckpointScheduler``; :meth:`JobLifecycle.start_periodic_scheduler`)."""
        self.lifecycle.start_periodic_scheduler()

    def stop_periodic_scheduler(self) -> None:
        """Stop periodic checkpoints; queued periodic requests are dropped (Flink's
        ``stopCheckpointScheduler``). Pending checkpoints go on."""
        self.lifecycle.stop_periodic_scheduler()

    def shutdown(self) -> None:
        """Stop scheduling, abort pending checkpoints (CHECKPOINT_COORDINATOR_SHUTDOWN), close
        coordinators and hooks (:meth:`JobLifecycle.shutdown`). Writes the aborts only while the
        log writer still accepts them."""
        self.lifecycle.shutdown()

    # -- triggering --------------------------------------------------------------------------------

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
            self.lifecycle.stop_periodic_scheduler()
            self.decider.abort_all(R.CHECKPOINT_COORDINATOR_SUSPEND, "stop-with-savepoint")
            for pending in sorted(self.pending.values(), key=lambda p: p.checkpoint_id):
                self.completion.abort(pending, R.CHECKPOINT_COORDINATOR_SUSPEND, "stop-with-savepoint")
        result = self._request(CheckpointType.SAVEPOINT_TERMINATE if terminate else CheckpointType.SAVEPOINT,
                               periodic=False, forced=True, target=target)
        pointer: concurrent.futures.Future = concurrent.futures.Future()

        def done(f: concurrent.futures.Future) -> None:
            if f.exception() is not None:
                pointer.set_exception(f.exception())
            else:
                pointer.set_result(f.result().external_pointer)

        result.future.add_done_callback(done)
        return CheckpointTriggerResult(result.checkpoint_id, pointer, held=result.held)

    def _preflight(self) -> CheckpointFailureReason | None:
        """Flink's pre-flight checks: a request the coordinator refuses before it takes an ID."""
        if self.lifecycle.shut_down:
            return R.CHECKPOINT_COORDINATOR_SHUTDOWN
        if self.state.job_status != JobStatus.RUNNING:
            return R.NOT_ALL_REQUIRED_TASKS_RUNNING
        if self.attempts.subtasks_not_ready():
            return R.NOT_ALL_REQUIRED_TASKS_RUNNING  # Flink: "Not all required tasks are currently running"
        return None

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
                and not self.lifecycle.shut_down and self.attempts.subtasks_not_ready():
            self.attempts.await_readiness(request)
            return CheckpointTriggerResult(None, request.future, held=request)
        if refused is not None:
            request.fail(refused, "checkpoint request refused")
            if periodic and self.lifecycle.periodic_running:
                # a skipped period is neither a failure nor an ID: the next one tries again
                self.lifecycle.schedule_periodic(self.options.interval_ms)
            return CheckpointTriggerResult(None, request.future)
        decision = self.decider.choose_request_to_execute(
            request, is_triggering=self._is_triggering(), pending=len(self.pending),
            last_completion_ms=self.context.last_completion_ms, now_ms=now)
        self._act(decision)
        return CheckpointTriggerResult(request.checkpoint_id, request.future)

    def _execute_queued(self) -> None:
        """Run queued requests the decider now allows (Flink's ``executeQueuedRequest``)."""
        while True:
            decision = self.decider.choose_queued_request_to_execute(
                is_triggering=self._is_triggering(), pending=len(self.pending),
                last_completion_ms=self.context.last_completion_ms, now_ms=self.env.now_ms())
            self._act(decision)
            if decision.execute is not None or decision.reschedule_periodic_ms is None:
                return

    def _act(self, decision: RequestDecision) -> None:
        if decision.reschedule_periodic_ms is not None and self.lifecycle.periodic_running:
            self.lifecycle.schedule_periodic(decision.reschedule_periodic_ms)
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
        if request.periodic and self.lifecycle.periodic_running:
            self.lifecycle.schedule_periodic(self.options.interval_ms)
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
            c = self.context
            c.commit(Batch(records=[CheckpointIdCounterRecord(self.job_id, checkpoint_id + 1),
                                    c.record(pending, CheckpointStatus.PENDING, now)],
                           events=[c.event(pending, "TRIGGERED", now, **c.job_fields())]),
                     lambda: self._trigger_masters(pending))
        pending.timeout = self.env.schedule(
            self.options.timeout_ms, lambda: self.completion.abort_if_pending(checkpoint_id, R.CHECKPOINT_EXPIRED,
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
            self.completion.abort(pending, R.IO_EXCEPTION, f"could not create the checkpoint location: {future.exception()}")
            return
        pending.location = future.result()
        self._maybe_send_trigger(pending)

    def _coordinator_done(self, checkpoint_id: int, operator_id: str, data: bytes | None, exc: BaseException | None) -> None:
        pending = self.pending.get(checkpoint_id)
        if pending is None:
            self.holders[operator_id].open_valve()
            return
        if exc is not None:
            self.completion.abort(pending, R.TRIGGER_CHECKPOINT_FAILURE, f"operator coordinator {operator_id} declined: {exc!r}")
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
            self.completion.abort(pending, R.TRIGGER_CHECKPOINT_FAILURE, f"master hook {identifier} failed: {future.exception()!r}")
            return
        try:
            state = self.hooks.serialize(identifier, future.result())
        except Exception as exc:  # noqa: BLE001 - a hook's bug fails this checkpoint only
            self.completion.abort(pending, R.TRIGGER_CHECKPOINT_FAILURE, f"master hook {identifier} data did not serialize: {exc!r}")
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
            c = self.context
            c.commit(Batch(records=[CheckpointIdCounterRecord(self.job_id, pending.checkpoint_id + 1),
                                    c.record(pending, CheckpointStatus.PENDING, pending.trigger_timestamp)],
                           control=[trigger], events=[c.event(pending, "TRIGGERED", pending.trigger_timestamp, **c.job_fields())]))
        # events sent after the coordinators' futures completed go out after the trigger
        for holder in self.holders.values():
            holder.open_valve()
        self._execute_queued()
        log.debug("checkpoint %d triggered at %d (%d ms after request)", pending.checkpoint_id, now,
                  now - pending.trigger_timestamp)
        self.completion.maybe_finalize(pending)

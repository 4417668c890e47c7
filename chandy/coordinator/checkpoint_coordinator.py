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

import concurrent.futures
import functools
import logging
from collections.abc import Callable
from typing import Any

from chandy.coordinator.checkpoint_completion import CheckpointCompletion
from chandy.coordinator.checkpoint_restore import CheckpointRestore, RestoreError
from chandy.coordinator.environment import Batch
from chandy.coordinator.failure import CheckpointFailureReason
from chandy.coordinator.hooks import MasterTriggerRestoreHook
from chandy.coordinator.job_lifecycle import JobLifecycle
from chandy.coordinator.listener import CheckpointListener
from chandy.coordinator.messages import (
    TriggerCheckpoint,
)
from chandy.coordinator.pending import PendingCheckpoint
from chandy.coordinator.records import (
    CheckpointIdCounterRecord,
    CheckpointStatus,
    CheckpointType,
    JobStatus,
)
from chandy.coordinator.request_decider import (
    CheckpointTriggerRequest,
    RequestDecision,
)
from chandy.coordinator.stats import CheckpointStats
from chandy.coordinator.subtask_attempts import SubtaskAttempts
from chandy.coordinator.trigger_result import CheckpointTriggerResult

__all__ = ["CheckpointCoordinator", "RestoreError"]

log = logging.getLogger(__name__)

R = CheckpointFailureReason


class CheckpointCoordinator(CheckpointRestore, SubtaskAttempts, JobLifecycle, CheckpointCompletion):
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
        on_failover: with a restart strategy in the host: called once with the reason of a global
            failure (a failing operator coordinator, more failed checkpoints than tolerated)
            instead of recording FAILED; the host restarts the job or fails it.
    """

    def add_master_hook(self, hook: MasterTriggerRestoreHook[Any]) -> bool:
        """Register a master hook; False when one with the same identifier exists (dropped)."""
        return self.hooks.add(hook)

    def add_listener(self, listener: CheckpointListener) -> None:
        """Register a :class:`CheckpointListener` for completions and aborts."""
        self.listeners.append(listener)

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
        return CheckpointTriggerResult(result.checkpoint_id, pointer, held=result.held)

    def _preflight(self) -> CheckpointFailureReason | None:
        """Flink's pre-flight checks: a request the coordinator refuses before it takes an ID."""
        if self._shutdown:
            return R.CHECKPOINT_COORDINATOR_SHUTDOWN
        if self.state.job_status != JobStatus.RUNNING:
            return R.NOT_ALL_REQUIRED_TASKS_RUNNING
        if self._subtasks_not_ready():
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
                and not self._shutdown and self._subtasks_not_ready():
            self._await_readiness(request)
            return CheckpointTriggerResult(None, request.future, held=request)
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
                               events=[self._event(pending, "TRIGGERED", now, **self._job_fields())]),
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
                               control=[trigger], events=[self._event(pending, "TRIGGERED", pending.trigger_timestamp, **self._job_fields())]))
        # events sent after the coordinators' futures completed go out after the trigger
        for holder in self.holders.values():
            holder.open_valve()
        self._execute_queued()
        log.debug("checkpoint %d triggered at %d (%d ms after request)", pending.checkpoint_id, now,
                  now - pending.trigger_timestamp)
        self._maybe_finalize(pending)

    # -- acks and declines -------------------------------------------------------------------------

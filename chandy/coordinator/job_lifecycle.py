"""A job's status and its periodic scheduler (Flink's ``JobMaster.cancel``, a global failure,
``startCheckpointScheduler`` / ``stopCheckpointScheduler``, shutdown): :class:`JobLifecycle`, a
collaborator of :class:`~chandy.coordinator.checkpoint_coordinator.CheckpointCoordinator`."""

from __future__ import annotations

import concurrent.futures
import logging
import random
from collections.abc import Callable
from typing import Protocol

from chandy.coordinator.coordinator_context import CoordinatorContext
from chandy.coordinator.environment import Batch, Cancellable
from chandy.coordinator.errors import SuppressRestartsError
from chandy.coordinator.failure import CheckpointException, CheckpointFailureReason
from chandy.coordinator.pending import PendingCheckpoint
from chandy.coordinator.records import (
    CheckpointType,
    JobStatus,
    JobStatusRecord,
)
from chandy.coordinator.trigger_result import CheckpointTriggerResult

log = logging.getLogger(__name__)

R = CheckpointFailureReason


class CheckpointRequester(Protocol):
    """Hands a trigger request to the request decider and runs what it chooses (the coordinator's
    triggering: Flink's ``CheckpointCoordinator.triggerCheckpoint``)."""

    def __call__(self, checkpoint_type: CheckpointType, *, periodic: bool, forced: bool,
                 target: str | None = None) -> CheckpointTriggerResult: ...


class JobLifecycle:
    """The job's status (cancel, fail, finish, fail over), the periodic checkpoint scheduler and
    the coordinator's shutdown (Flink: ``CheckpointCoordinator``'s scheduler methods, its
    ``CheckpointCoordinatorDeActivator`` and the scheduler's ``handleGlobalFailure``).

    Args:
        context: the coordinator's shared state.
        request: the coordinator's triggering, for periodic requests.
        abort: aborts one pending checkpoint
            (:meth:`~chandy.coordinator.checkpoint_completion.CheckpointCompletion.abort`).
        fail_awaiting_readiness: fails every request held for subtask readiness
            (:meth:`~chandy.coordinator.subtask_attempts.SubtaskAttempts.fail_awaiting_readiness`).
    """

    def __init__(self, context: CoordinatorContext, *, request: CheckpointRequester,
                 abort: Callable[[PendingCheckpoint, CheckpointFailureReason, str], None],
                 fail_awaiting_readiness: Callable[[CheckpointFailureReason, str], None]) -> None:
        self._context = context
        self._request = request
        self._abort = abort
        self._fail_awaiting_readiness = fail_awaiting_readiness
        self._periodic_timer: Cancellable | None = None
        self._periodic_running = False
        self._shut_down = False

    @property
    def periodic_running(self) -> bool:
        """Periodic checkpoints are on (between :meth:`start_periodic_scheduler` and
        :meth:`stop_periodic_scheduler`)."""
        return self._periodic_running

    @property
    def shut_down(self) -> bool:
        """:meth:`shutdown` ran: the coordinator takes no more requests (Flink's ``shutdown`` flag,
        CHECKPOINT_COORDINATOR_SHUTDOWN)."""
        return self._shut_down

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
        c = self._context
        future: concurrent.futures.Future = concurrent.futures.Future()
        if c.state.job_status != JobStatus.RUNNING:
            future.set_exception(CheckpointException(
                R.NOT_ALL_REQUIRED_TASKS_RUNNING, f"job {c.job_id} is {c.state.job_status.value}, not RUNNING"))
            return future
        record = JobStatusRecord(c.job_id, status, c.state.epoch, reason, c.env.now_ms())

        def after_commit() -> None:
            self.job_status_changed(status, reason)
            future.set_result(record)

        c.commit(Batch(records=[record]), after_commit)
        return future

    # -- periodic scheduling -------------------------------------------------------------------------------

    def start_periodic_scheduler(self) -> None:
        """Start periodic checkpoints: the first after a random delay within the interval
        (Flink's ``startCheckpointScheduler`` and ``getRandomInitDelay``: between ``min_pause``
        and ``interval``, ms). Does nothing when checkpoints are not periodic or already run."""
        options = self._context.options
        if not options.periodic or self._periodic_running:
            return
        self._periodic_running = True
        low = min(options.min_pause_ms, options.interval_ms)
        delay = random.randint(low, options.interval_ms) if options.random_initial_delay else low
        self.schedule_periodic(delay)

    def stop_periodic_scheduler(self) -> None:
        """Stop periodic checkpoints; queued periodic requests are dropped (Flink's
        ``stopCheckpointScheduler``). Pending checkpoints go on."""
        self._periodic_running = False
        if self._periodic_timer is not None:
            self._periodic_timer.cancel()
            self._periodic_timer = None
        self._context.decider.remove_periodic(R.PERIODIC_SCHEDULER_SHUTDOWN, "periodic checkpoints stopped")

    def schedule_periodic(self, delay_ms: int) -> None:
        """(Re)schedule the next periodic request ``delay_ms`` ms from now (at least 0), replacing
        the one scheduled (Flink's ``rescheduleTrigger``)."""
        if self._periodic_timer is not None:
            self._periodic_timer.cancel()
        self._periodic_timer = self._context.env.schedule(max(0, delay_ms), self._periodic_trigger)

    def _periodic_trigger(self) -> None:
        """A periodic request (Flink's ``ScheduledTrigger``). It runs, waits in the decider's queue
        (the next periodic trigger is scheduled when it runs), or is dropped for the min pause
        (the decider reschedules it)."""
        self._periodic_timer = None
        if not self._periodic_running or self._context.decider.has_queued_periodic():
            return
        self._request(CheckpointType.CHECKPOINT, periodic=True, forced=False)

    # -- job status ------------------------------------------------------------------------------------------

    def handle_global_failure(self, cause: BaseException) -> None:
        """Fail the job for ``cause`` (an operator coordinator's ``Context.failJob``, a failed
        restore): with a restart strategy in charge (``on_failover``) and a RUNNING job, a
        :meth:`failover` (unless ``cause`` is a :class:`SuppressRestartsError`); otherwise FAILED
        in the log. Flink's ``SchedulerNG.handleGlobalFailure``. Does nothing unless the job is
        RUNNING or FINISHED."""
        c = self._context
        # FINISHED too: a stop-with-savepoint whose notification (the lake commit) fails has not finished
        if c.state.job_status not in (JobStatus.RUNNING, JobStatus.FINISHED):
            return
        now = c.env.now_ms()
        reason = f"{type(cause).__name__}: {cause}"
        if (c.state.job_status == JobStatus.RUNNING and c.on_failover is not None
                and not isinstance(cause, SuppressRestartsError)):
            self.failover(reason)
            return
        c.commit(Batch(records=[JobStatusRecord(c.job_id, JobStatus.FAILED, c.state.epoch, reason, now)]),
                 lambda: self.job_status_changed(JobStatus.FAILED, reason))

    def failover(self, reason: str) -> None:
        """A global failure with a restart strategy in charge (Flink's ``handleGlobalFailure``):
        nothing is decided in the log now; periodic checkpoints stop, pending ones abort, and
        ``on_failover`` tells the host, which stops this coordinator (SUSPENDED, with ``reason``)
        and restarts the job from its latest completed checkpoint, or records FAILED once its
        restart strategy gives up. Once per coordinator; ``on_failover`` must be set."""
        c = self._context
        if c.failover_reason is not None:
            return
        c.failover_reason = reason
        log.warning("job %s: global failure, the restart strategy decides: %s", c.job_id, reason)
        self.stop_periodic_scheduler()
        c.decider.abort_all(R.CHECKPOINT_COORDINATOR_SUSPEND, f"job failing over: {reason}")
        for pending in list(c.pending.values()):
            self._abort(pending, R.CHECKPOINT_COORDINATOR_SUSPEND, f"job failing over: {reason}")
        assert c.on_failover is not None
        c.on_failover(reason)

    def job_status_changed(self, status: JobStatus, reason: str | None) -> None:
        """The job left RUNNING for ``status`` (durable in the log): stop periodic checkpoints,
        fail queued and held requests (NOT_ALL_REQUIRED_TASKS_RUNNING), abort pending checkpoints
        (CHECKPOINT_COORDINATOR_SHUTDOWN), then tell ``on_job_status``. Flink's
        ``CheckpointCoordinatorDeActivator.jobStatusChanges``."""
        c = self._context
        self.stop_periodic_scheduler()
        c.decider.abort_all(R.NOT_ALL_REQUIRED_TASKS_RUNNING, f"job {status.value.lower()}")
        self._fail_awaiting_readiness(R.NOT_ALL_REQUIRED_TASKS_RUNNING, f"job {status.value.lower()}")
        for pending in list(c.pending.values()):
            self._abort(pending, R.CHECKPOINT_COORDINATOR_SHUTDOWN, f"job {status.lower()}")
        if c.on_job_status is not None:
            c.on_job_status(status, reason)

    def shutdown(self) -> None:
        """Stop scheduling, abort pending checkpoints (CHECKPOINT_COORDINATOR_SHUTDOWN), close
        coordinators and hooks (Flink's ``CheckpointCoordinator.shutdown``). Writes the aborts only
        while the log writer still accepts them. Once: later calls do nothing."""
        c = self._context
        if self._shut_down:
            return
        self.stop_periodic_scheduler()
        c.decider.abort_all(R.CHECKPOINT_COORDINATOR_SHUTDOWN, "coordinator shut down")
        self._fail_awaiting_readiness(R.CHECKPOINT_COORDINATOR_SHUTDOWN, "coordinator shut down")
        for pending in list(c.pending.values()):
            self._abort(pending, R.CHECKPOINT_COORDINATOR_SHUTDOWN, "coordinator shut down")
        if c.state.job_status == JobStatus.RUNNING:
            # a clean stop, told apart in the log from a coordinator that was fenced or died
            why = "coordinator stopped" if c.failover_reason is None else f"restarting: {c.failover_reason}"
            c.commit(Batch(records=[JobStatusRecord(c.job_id, JobStatus.SUSPENDED, c.state.epoch, why,
                                                    c.env.now_ms())]))
        self._shut_down = True
        for holder in c.holders.values():
            holder.close()
        c.hooks.close()

"""A job's status and its periodic scheduler (Flink's ``JobMaster.cancel``, a global failure,
``startCheckpointScheduler`` / ``stopCheckpointScheduler``, shutdown): a mixin of
:class:`~chandy.coordinator.checkpoint_coordinator.CheckpointCoordinator`, whose state it uses."""

from __future__ import annotations

import concurrent.futures
import logging
import random

from chandy.coordinator.coordinator_core import CoordinatorCore
from chandy.coordinator.environment import Batch
from chandy.coordinator.errors import SuppressRestartsError
from chandy.coordinator.failure import CheckpointException, CheckpointFailureReason
from chandy.coordinator.records import (
    CheckpointType,
    JobStatus,
    JobStatusRecord,
)

log = logging.getLogger(__name__)

R = CheckpointFailureReason


class JobLifecycle(CoordinatorCore):
    """The job lifecycle part of the checkpoint coordinator."""

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
        if (self.state.job_status == JobStatus.RUNNING and self.on_failover is not None
                and not isinstance(cause, SuppressRestartsError)):
            self._failover(reason)
            return
        self._commit(Batch(records=[JobStatusRecord(self.job_id, JobStatus.FAILED, self.state.epoch, reason, now)]),
                     lambda: self._job_status_changed(JobStatus.FAILED, reason))

    def _failover(self, reason: str) -> None:
        """A global failure with a restart strategy in charge (Flink's ``handleGlobalFailure``):
        nothing is decided in the log now; periodic checkpoints stop, pending ones abort, and
        ``on_failover`` tells the host, which stops this coordinator (SUSPENDED, with ``reason``)
        and restarts the job from its latest completed checkpoint, or records FAILED once its
        restart strategy gives up. Once per coordinator."""
        if self.failover_reason is not None:
            return
        self.failover_reason = reason
        log.warning("job %s: global failure, the restart strategy decides: %s", self.job_id, reason)
        self.stop_periodic_scheduler()
        self.decider.abort_all(R.CHECKPOINT_COORDINATOR_SUSPEND, f"job failing over: {reason}")
        for pending in list(self.pending.values()):
            self._abort(pending, R.CHECKPOINT_COORDINATOR_SUSPEND, f"job failing over: {reason}")
        assert self.on_failover is not None
        self.on_failover(reason)

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
            why = "coordinator stopped" if self.failover_reason is None else f"restarting: {self.failover_reason}"
            self._commit(Batch(records=[JobStatusRecord(self.job_id, JobStatus.SUSPENDED, self.state.epoch, why,
                                                        self.env.now_ms())]))
        self._shutdown = True
        for holder in self.holders.values():
            holder.close()
        self.hooks.close()

"""The pipeline's restarts (Flink's global failover under a restart strategy): which failures a
restart can cure, how long to wait, and what a run counts over its attempts. A mixin of
:class:`~chandy.connectors.spark.pipeline.Pipeline`, whose ``run`` loops over attempts; the
strategies themselves are :mod:`chandy.coordinator.restart_strategy`."""

from __future__ import annotations

from chandy.connectors.spark.cluster import root_cause
from chandy.connectors.spark.driver_core import PipelineCore
from chandy.connectors.spark.options import PipelineError, PipelineFailoverError, PipelineFencedError


class Restart(Exception):  # a decision, not an error
    """The attempt failed with ``reason``; the restart strategy restarts the job after ``delay_s``."""

    def __init__(self, reason: str, delay_s: float) -> None:
        super().__init__(reason)
        self.reason, self.delay_s = reason, delay_s


class RunTotals:
    """A run's records landed, checkpoints completed and failed, over its attempts, and its restarts."""

    def __init__(self) -> None:
        self.landed = self.completed = self.failed = self.restarts = 0

    def add(self, landed: int, completed: int, failed: int) -> None:
        self.landed += landed
        self.completed += completed
        self.failed += failed


class PipelineRestarts(PipelineCore):
    """The restart part of :class:`~chandy.connectors.spark.pipeline.Pipeline`."""

    def _restart_delay_s(self, reason: str) -> float | None:
        """Tell the restart strategy of a failure: the seconds to wait before the restart, or None
        when it gives up (the job then fails)."""
        strategy = self._restart_strategy
        strategy.notify_failure()
        if not strategy.can_restart():
            return None
        return strategy.backoff_time_ms() / 1000

    def _gave_up(self, reason: str, restarts: int) -> str:
        return (f"{reason} (the {self.options.restart_strategy_options.type} restart strategy gave up after "
                f"{restarts} restart(s))")

    def _restart_after(self, restart: Restart, totals: RunTotals) -> bool:
        """Wait the restart's delay, then reconcile the table and the log again for the next
        attempt; False when a stop was requested meanwhile.

        Raises:
            PipelineError: the reconciliation found something a restart cannot cure.
        """
        delay = restart.delay_s
        while True:
            totals.restarts += 1
            self._notice(f"job {self.job_id}: restarting (restart {totals.restarts}) in {delay:.1f} s from its "
                         f"latest completed checkpoint: {restart.reason}")
            self._stop.wait(delay)
            if self._stop.is_set():
                return False
            self.election = None  # the stopped service left the election group: the next one joins again
            try:
                self._reconcile()
                return True
            except PipelineError:
                raise
            except Exception as exc:  # Kafka or the table still unreachable: a failed restart
                reason = f"restart {totals.restarts} failed before starting: {root_cause(exc)}"
                next_delay = self._restart_delay_s(reason)
                if next_delay is None:
                    raise PipelineError(f"job {self.job_id} failed: {self._gave_up(reason, totals.restarts)}") from exc
                restart, delay = Restart(reason, next_delay), next_delay

    def _failover_reason(self, exc: BaseException) -> str | None:
        """Why the attempt failed, when a restart can cure it: a :class:`PipelineFailoverError`, a
        global failure the coordinator handed to the restart strategy, or a coordinator that
        stopped without being fenced or failed (its log unwritable); None otherwise."""
        service = self.service
        if isinstance(exc, PipelineFencedError) or (service is not None and service.fenced.is_set()):
            return None
        if service is not None and service.failover_reason is not None:
            return service.failover_reason
        if isinstance(exc, PipelineFailoverError):
            return str(exc)
        if (service is not None and service.stopped.is_set() and service.job_status != "FAILED"
                and not self._stop.is_set()):
            return f"the coordinator stopped: {service.failure_reason() or root_cause(exc)}"
        return None

"""The pipeline's restarts (Flink's global failover under a restart strategy): which failures a
restart can cure, how long to wait, and what a run counts over its attempts. The driver
(:class:`~chandy.connectors.spark.driver.pipeline.Pipeline`) loops over attempts; the strategies
themselves are :mod:`chandy.coordinator.restart_strategy`."""

from __future__ import annotations

from collections.abc import Callable

from chandy.connectors.spark.driver.failures import root_cause
from chandy.connectors.spark.driver.state import DriverState
from chandy.connectors.spark.options import PipelineError, PipelineFailoverError, PipelineFencedError
from chandy.coordinator.restart_strategy import RestartBackoffTimeStrategy, create_restart_strategy


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
        """Count an attempt's records landed and checkpoints completed and failed."""
        self.landed += landed
        self.completed += completed
        self.failed += failed


class Restarts:
    """The run's restart strategy (Flink's, from ``--restart-strategy`` and ``-D
    restart-strategy.*``) and the decisions it makes. ``reconcile`` reconciles the table and the
    coordinator log again before an attempt (the preflight's
    :meth:`~chandy.connectors.spark.driver.preflight.Preflight.reconcile`).

    Raises:
        PipelineError: the restart strategy's options are unknown or disagree.
    """

    def __init__(self, state: DriverState, reconcile: Callable[[], None]) -> None:
        self.state = state
        self.reconcile = reconcile
        self.strategy: RestartBackoffTimeStrategy = create_restart_strategy(state.options.restart_strategy_options)

    def reset(self) -> None:
        """A fresh strategy for a run (its failure counts start over)."""
        self.strategy = create_restart_strategy(self.state.options.restart_strategy_options)

    def delay_s(self, reason: str) -> float | None:
        """Tell the restart strategy of a failure (``reason``): the seconds to wait before the
        restart, or None when it gives up (the job then fails)."""
        strategy = self.strategy
        strategy.notify_failure()
        if not strategy.can_restart():
            return None
        return strategy.backoff_time_ms() / 1000

    def gave_up(self, reason: str, restarts: int) -> str:
        """The job's failure once the strategy gave up after ``restarts`` restarts."""
        return (f"{reason} (the {self.state.options.restart_strategy_options.type} restart strategy gave up after "
                f"{restarts} restart(s))")

    def failed_restart(self, reason: str, restarts: int) -> Restart | PipelineError:
        """What a restart that failed before its attempt ran (``reason``) raises: another
        :class:`Restart` after the strategy's delay, or, once it gives up, the job's
        :class:`PipelineError`. The caller raises it from the failure."""
        delay = self.delay_s(reason)
        if delay is None:
            return PipelineError(f"job {self.state.job_id} failed: {self.gave_up(reason, restarts)}")
        return Restart(reason, delay)

    def restart_after(self, restart: Restart, totals: RunTotals) -> bool:
        """Wait the restart's delay, then reconcile the table and the log again for the next
        attempt; False when a stop was requested meanwhile. Counts each restart in ``totals``.

        Raises:
            PipelineError: the reconciliation found something a restart cannot cure, or it kept
                failing until the strategy gave up.
        """
        state = self.state
        delay = restart.delay_s
        while True:
            totals.restarts += 1
            state.notice(f"job {state.job_id}: restarting (restart {totals.restarts}) in {delay:.1f} s from its "
                         f"latest completed checkpoint: {restart.reason}")
            state.stop.wait(delay)
            if state.stop.is_set():
                return False
            state.election = None  # the stopped service left the election group: the next one joins again
            try:
                self.reconcile()
                return True
            except PipelineError:
                raise
            except Exception as exc:  # Kafka or the table still unreachable: a failed restart
                reason = f"restart {totals.restarts} failed before starting: {root_cause(exc)}"
                decision = self.failed_restart(reason, totals.restarts)
                if isinstance(decision, PipelineError):
                    raise decision from exc
                restart, delay = decision, decision.delay_s

    def failover_reason(self, exc: BaseException) -> str | None:
        """Why the attempt failed with ``exc``, when a restart can cure it: a
        :class:`PipelineFailoverError`, a global failure the coordinator handed to the restart
        strategy, or a coordinator that stopped without being fenced or failed (its log
        unwritable); None otherwise (fenced, FAILED, a stop that was asked for)."""
        state = self.state
        service = state.service
        if isinstance(exc, PipelineFencedError) or (service is not None and service.fenced.is_set()):
            return None
        if service is not None and service.failover_reason is not None:
            return service.failover_reason
        if isinstance(exc, PipelineFailoverError):
            return str(exc)
        if (service is not None and service.stopped.is_set() and service.job_status != "FAILED"
                and not state.stop.is_set()):
            return f"the coordinator stopped: {service.failure_reason() or root_cause(exc)}"
        return None

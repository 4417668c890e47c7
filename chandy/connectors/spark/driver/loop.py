"""The driver loop of one attempt (:class:`CheckpointLoop`): checkpoint N is micro-batch N.

Each pass checks that the coordinator still runs and leads, takes the next control request
(:mod:`~chandy.connectors.spark.driver.requests`), reads the lag, and either waits (no lag, or
fewer records than ``--min-records-per-checkpoint``: Spark's ``minOffsetsPerTrigger``, up to
``--max-trigger-delay``) or triggers checkpoint N, runs its micro-batch and waits for it to
complete. A failed or aborted checkpoint commits nothing; the next one reads its ranges again,
after an exponential back-off (Flink's exponential-delay strategy). A failure no restart can cure
(:mod:`~chandy.connectors.spark.driver.failures`) makes the job FAILED; a failure a restart can
cure ends the attempt with a :class:`~chandy.connectors.spark.driver.restarts.Restart`."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from chandy.connectors.kafka.source.split import KafkaPartitionSplit
from chandy.connectors.spark.driver.coordinator import JobCoordinator, checkpoint_phases
from chandy.connectors.spark.driver.failures import ACK_TOO_LARGE_REMEDY, fatal_failure, names_ack_too_large, root_cause
from chandy.connectors.spark.driver.metrics import PipelineMetricsCollector
from chandy.connectors.spark.driver.micro_batch import MicroBatchRunner
from chandy.connectors.spark.driver.requests import Request, RequestExecutor, fail_request
from chandy.connectors.spark.driver.restarts import Restart, Restarts, RunTotals
from chandy.connectors.spark.driver.session import KEEP_WARM_S, SparkSessionManager
from chandy.connectors.spark.driver.source import SourceOffsets
from chandy.connectors.spark.driver.state import DriverState
from chandy.connectors.spark.options import (
    PipelineError,
    PipelineFailoverError,
    PipelineFencedError,
    PipelineProgress,
    PipelineSummary,
)
from chandy.coordinator.errors import ChandyError
from chandy.coordinator.failure import CheckpointException, CheckpointFailureReason
from chandy.coordinator.kafka.log_writer import CoordinatorFencedError
from chandy.coordinator.kafka.requests import ControlRequestType, RequestOutcome

log = logging.getLogger(__name__)

#: seconds between two reads of the source's end offsets while the job has nothing to read (each
#: read asks the partitions' leaders for their last stable offsets)
IDLE_POLL_S = 0.1
#: seconds the source's partition discovery may take before the attempt fails
DISCOVERY_TIMEOUT_S = 60.0


@dataclasses.dataclass
class Attempt:
    """One attempt of the run as the loop goes (driver thread only): what it reports to, its
    checkpoints completed and failed, and why it ends."""

    #: time.monotonic() when the run (not this attempt) started
    started: float
    #: the run's counts over its earlier attempts (this one's are added when it ends)
    totals: RunTotals
    #: called with each checkpoint's progress
    on_progress: Callable[[PipelineProgress], None] | None = None
    #: the pipeline's Prometheus collector (``--metrics-port``), updated with each checkpoint's progress
    metrics: PipelineMetricsCollector | None = None
    completed: int = 0
    failed: int = 0
    #: checkpoints failed in a row (the back-off grows with them)
    consecutive: int = 0
    first_failure: str | None = None
    stopped_because: str = "stopped"
    canceled: bool = False
    #: the control request of the round in flight, answered with an error if the attempt ends first
    request: Request | None = None
    #: time.monotonic() of the last trigger
    last_trigger: float = 0.0


@dataclasses.dataclass
class Round:
    """One checkpoint's micro-batch as the loop times it: times in ms since the epoch unless said;
    ``message`` says why it failed, ``fatal`` why the job fails (a failure no restart cures)."""

    checkpoint_id: int
    request: Request | None
    #: time.monotonic() of the trigger
    batch_started: float
    started_ms: float
    records: int = 0
    message: str | None = None
    fatal: str | None = None
    spark_job_ms: float = 0.0
    ranges_ms: float = 0.0
    job_ended_ms: float = 0.0
    #: when the completion was handed over (None: the checkpoint did not complete)
    done_ms: float | None = None


class CheckpointLoop:
    """Checkpoints until the attempt ends (see the module docstring), with the run's
    collaborators: the control requests, the source's offsets, the micro-batches, the
    coordinator, the Spark session (to keep its Python workers warm) and the restart strategy."""

    def __init__(self, state: DriverState, requests: RequestExecutor, source: SourceOffsets,
                 micro_batches: MicroBatchRunner, coordinator: JobCoordinator, session: SparkSessionManager,
                 restarts: Restarts) -> None:
        self.state = state
        self.requests = requests
        self.source = source
        self.micro_batches = micro_batches
        self.coordinator = coordinator
        self.session = session
        self.restarts = restarts

    def run(self, spark: Any, attempt: Attempt) -> PipelineSummary:
        """Checkpoint on ``spark`` with the attempt's running coordinator until the run is
        drained (``--until-drained``, ``--ending-offsets``), has ``--max-checkpoints``, is stopped
        or canceled, or fails; then answer the requests left, stop the coordinator and sum up.

        Raises:
            Restart: a failure a restart can cure, and the restart strategy allows a restart.
            PipelineFencedError: a newer coordinator of the job took over.
            PipelineError: a failure no restart cures, or the restart strategy gave up (the job
                is FAILED first, if this coordinator still runs).
        """
        state = self.state
        if state.election is not None and state.election.became_leader_at is not None:
            state.takeover_s = time.monotonic() - state.election.became_leader_at
            state.notice(f"standby of job {state.job_id} leads: coordinator started {state.takeover_s:.1f} s after "
                         "the election")
        try:
            self._await_partitions()
            attempt.last_trigger = time.monotonic()
            while self._step(spark, attempt):
                pass
        except ChandyError as exc:
            replacement = self._after_failure(exc, attempt.totals)
            if replacement is None:
                raise
            raise replacement from exc
        finally:
            self._end(attempt)
        totals = attempt.totals
        return PipelineSummary(state.options.table_uri, state.job_id, totals.landed, totals.completed, totals.failed,
                               time.monotonic() - attempt.started, stopped_because=attempt.stopped_because,
                               bad_records=state.bad_records, dead_lettered=state.dead_lettered,
                               tombstones_skipped=state.tombstones_skipped, signal=state.stop_signal,
                               notices=tuple(state.notices), canceled=attempt.canceled, restarts=totals.restarts,
                               offsets_lost=state.offsets_lost)

    def _await_partitions(self) -> None:
        """Wait until the source's enumerator discovered the job's partitions.

        Raises:
            PipelineError: none within :data:`DISCOVERY_TIMEOUT_S`.
        """
        deadline = time.monotonic() + DISCOVERY_TIMEOUT_S
        while not self.state.enumerator_call(lambda e: len(e.splits)):
            if time.monotonic() > deadline:
                raise PipelineError("partition discovery found no partitions within 60 s")
            time.sleep(0.05)

    def _step(self, spark: Any, attempt: Attempt) -> bool:
        """One pass of the loop: wait, or run one checkpoint and pause after it; False when the
        attempt ends (``attempt.stopped_because`` says why)."""
        ended = self._ended(attempt)
        if ended is not None:
            attempt.stopped_because = ended
            return False
        attempt.request = request = self.requests.next_request()
        if request is not None and request[0].request_type is ControlRequestType.CANCEL:
            self.requests.cancel(request)
            attempt.stopped_because = f"canceled by request {request[0].request_id}"
            attempt.canceled = True
            return False
        lag = sum(self.source.lag().values())
        if (request is not None and request[0].request_type is ControlRequestType.STOP_WITH_SAVEPOINT
                and request[0].drain and lag > 0):
            self.requests.draining, request = request, None  # land what is available first (Flink's --drain)
            attempt.request = None
        if request is None and self._holding_back(lag, attempt.last_trigger):
            self._idle_warm(spark)  # Spark's minOffsetsPerTrigger: wait for more, up to maxTriggerDelay
            return True
        if request is None and lag == 0:
            drained = self._drained()
            if drained is not None:
                attempt.stopped_because = drained
                return False
            # the interval since the last trigger has passed (the pause after it did that):
            # look for new records often, so the first one after an idle spell waits little
            self._idle_warm(spark)
            return True
        round_ = self._checkpoint(spark, request, attempt)
        pause = self.state.options.checkpoint_interval_ms / 1000 - (time.monotonic() - round_.batch_started)
        if attempt.consecutive:
            pause = max(pause, self.micro_batches.backoff_s(attempt.consecutive))
        if self.state.stop.is_set() and attempt.stopped_because.startswith("stopped with savepoint"):
            return False
        if pause > 0:
            self.requests.idle(pause)
        return True

    def _ended(self, attempt: Attempt) -> str | None:
        """Why the attempt ends before its next round (a stop, ``--max-checkpoints``), or None.

        Raises:
            PipelineFencedError: a newer coordinator took over.
            PipelineFailoverError: the coordinator handed a global failure to the restart strategy.
            PipelineError: the job is FAILED, or the coordinator stopped.
        """
        state, opts = self.state, self.state.options
        service = state.running()
        if state.stop.is_set():
            return "stopped by " + signal.Signals(state.stop_signal).name if state.stop_signal else "stopped on request"
        if service.fenced.is_set():
            raise PipelineFencedError(self.coordinator.fenced_message())
        cause = f"; first failure: {attempt.first_failure}" if attempt.first_failure else ""
        if service.failover_reason is not None:  # a global failure: the restart strategy decides
            raise PipelineFailoverError(f"job {state.job_id} failed: {service.failover_reason}{cause}")
        if service.job_status == "FAILED" or service.stopped.is_set():
            reason = service.failure_reason() or "the coordinator stopped"
            raise PipelineError(f"job {state.job_id} failed: {reason}{cause}")
        if opts.max_checkpoints is not None and attempt.totals.completed + attempt.completed >= opts.max_checkpoints:
            return f"{opts.max_checkpoints} checkpoints done"
        return None

    def _holding_back(self, lag: int, last_trigger: float) -> bool:
        """Whether a periodic checkpoint waits for more records (Spark's ``minOffsetsPerTrigger``
        with ``maxTriggerDelay``): some are there (``lag`` records), fewer than
        ``--min-records-per-checkpoint``, and the last trigger (``last_trigger``, monotonic s) is
        less than ``--max-trigger-delay`` ago; never in a bounded run nor while a stop with
        ``--drain`` lands what is there."""
        opts = self.state.options
        if opts.min_records_per_checkpoint is None or lag == 0 or opts.stop_when_drained or opts.ending_offsets \
                or self.requests.draining is not None:
            return False
        return lag < opts.min_records_per_checkpoint and \
            time.monotonic() - last_trigger < opts.max_trigger_delay_ms / 1000

    def _drained(self) -> str | None:
        """Why a run without lag ends (it reached ``--ending-offsets``, or ``--until-drained``), or None."""
        opts = self.state.options
        if self.source.reached_ending_offsets():
            return f"reached --ending-offsets {opts.ending_offsets}"
        if opts.stop_when_drained:
            return "drained"
        return None

    def _idle_warm(self, spark: Any) -> None:
        """Wait :data:`IDLE_POLL_S` (less when a request or a stop arrives), first warming the
        Python workers when no Spark job ran for :data:`KEEP_WARM_S` (a long wait must not go cold:
        Spark stops them after a minute)."""
        if time.monotonic() - self.state.last_spark_job > KEEP_WARM_S:
            self.session.warm_python_workers(spark, with_sink=True)
        self.requests.idle(IDLE_POLL_S)

    def _checkpoint(self, spark: Any, request: Request | None, attempt: Attempt) -> Round:
        """Trigger a checkpoint (or what ``request`` asks for), run its micro-batch, wait for it,
        answer the request, and report the progress.

        Raises:
            PipelineFencedError: a newer coordinator took over meanwhile.
            PipelineError: a failure no restart cures (the job is FAILED first).
        """
        batch_started = attempt.last_trigger = time.monotonic()
        started_ms = time.time() * 1000
        trigger = self.requests.trigger_for(request)
        round_ = Round(trigger.checkpoint_id or -1, request, batch_started, started_ms)  # -1: refused before an ID
        try:
            result = self._micro_batch(spark, trigger, round_)
            attempt.completed += 1
            attempt.consecutive = 0
            attempt.first_failure = None
            self._answer(round_, result, attempt)
        except CoordinatorFencedError as exc:
            fail_request(request, exc)
            raise PipelineFencedError(self.coordinator.fenced_message()) from exc
        except CheckpointException as exc:
            fail_request(request, exc)
            self._checkpoint_failed(exc, round_, attempt)
        if round_.fatal is not None:
            # deterministic: a restart would fail the same way, so the job FAILED (Flink's
            # state once its restart strategy gives up), not SUSPENDED (lost leadership)
            self.coordinator.record_failure(f"checkpoint {round_.checkpoint_id} failed: {round_.fatal}")
            raise PipelineError(f"checkpoint {round_.checkpoint_id} failed: {round_.fatal}")
        self._report(round_, attempt)
        return round_

    def _micro_batch(self, spark: Any, trigger: Any, round_: Round) -> Any:
        """The round's ranges, its Spark job (a failed job aborts the checkpoint at once), and
        the checkpoint's result (a completed checkpoint, or a savepoint's location).

        Raises:
            CheckpointException: the checkpoint failed (declined, aborted, expired).
            CoordinatorFencedError, PipelineError: as :meth:`MicroBatchRunner.wait`.
        """
        timeout_s = self.state.options.checkpoint_timeout_ms / 1000
        ranges: dict[tuple[str, int], KafkaPartitionSplit] = self.micro_batches.ranges(round_.checkpoint_id, trigger,
                                                                                         timeout_s)
        round_.records = sum(r.num_records for r in ranges.values())
        job_started = time.monotonic()
        round_.ranges_ms = time.time() * 1000
        try:
            self.micro_batches.run(spark, round_.checkpoint_id, ranges)
        except Exception as exc:  # noqa: BLE001 - any failure of the Spark job aborts the checkpoint now, not at its timeout
            self._spark_job_failed(exc, round_)
        round_.spark_job_ms = (time.monotonic() - job_started) * 1000
        self.state.last_spark_job = time.monotonic()
        round_.job_ended_ms = time.time() * 1000
        result = self.micro_batches.wait(trigger, timeout_s + 10)
        round_.done_ms = time.time() * 1000
        return result

    def _spark_job_failed(self, exc: Exception, round_: Round) -> None:
        """Say why the round's Spark job failed (its root cause; a module missing in the
        executors' Python names the fix), whether a restart can cure it, and abort the checkpoint
        now rather than at its timeout."""
        message = root_cause(exc)
        if message.startswith("ModuleNotFoundError"):
            message += (f" in the executors' Python ({os.environ.get('PYSPARK_PYTHON', 'python3')}): "
                        "install Chandy there, or its dependencies with --ship-code "
                        "(docs/cluster.md)")
        round_.message = message
        round_.fatal = fatal_failure(message)
        log.error("checkpoint %d: Spark job failed: %s", round_.checkpoint_id, message)
        self.state.running().abort_checkpoint(round_.checkpoint_id, CheckpointFailureReason.CHECKPOINT_DECLINED,
                                              f"Spark job failed: {message}"[:1000])

    def _answer(self, round_: Round, result: Any, attempt: Attempt) -> None:
        """Answer the round's control request with its completed checkpoint or savepoint; an
        intermediate savepoint's ranges are read again, a stop-with-savepoint stops the run."""
        request = round_.request
        if request is None:
            return
        if request[0].request_type is ControlRequestType.TRIGGER_SAVEPOINT:
            self.coordinator.release_savepoint_ranges(round_.checkpoint_id)
        request[1].set_result(RequestOutcome(round_.checkpoint_id, result if isinstance(result, str)
                                             else getattr(result, "external_pointer", None)))
        if request[0].request_type is ControlRequestType.STOP_WITH_SAVEPOINT:
            attempt.stopped_because = f"stopped with savepoint {result}"
            self.state.stop.set()

    def _checkpoint_failed(self, exc: CheckpointException, round_: Round, attempt: Attempt) -> None:
        """Count a failed checkpoint and say why; an acknowledgement too large for Kafka fails
        the job (the same ranges give the same ack: a restart would too)."""
        attempt.failed += 1
        attempt.consecutive += 1
        message = round_.message = round_.message or root_cause(exc)
        attempt.first_failure = attempt.first_failure or f"checkpoint {round_.checkpoint_id}: {message}"
        log.warning("checkpoint %d failed: %s", round_.checkpoint_id, message)
        if names_ack_too_large(str(exc)):
            round_.fatal = round_.fatal or f"{message} ({ACK_TOO_LARGE_REMEDY})"

    def _report(self, round_: Round, attempt: Attempt) -> None:
        """The round's :class:`PipelineProgress` to ``on_progress`` and the metrics, if either."""
        if attempt.on_progress is None and attempt.metrics is None:
            return
        state, totals = self.state, attempt.totals
        # the attempt's committer counts from its start, the commit of a restored checkpoint
        # included: records a crashed attempt or run wrote land in the table now, and count here
        landed = self.coordinator.committed_records() + totals.landed
        phases = ({} if round_.message is not None or round_.done_ms is None else
                  checkpoint_phases(state.running(), round_.checkpoint_id, round_.started_ms, round_.ranges_ms,
                                    round_.job_ended_ms, round_.done_ms))
        progress = PipelineProgress(
            round_.checkpoint_id, round_.message is None, round_.records, landed, totals.completed + attempt.completed,
            totals.failed + attempt.failed,
            (time.monotonic() - round_.batch_started) * 1000, time.monotonic() - attempt.started,
            self.source.lag(), round_.message, round_.spark_job_ms, state.bad_records, state.dead_lettered,
            state.tombstones_skipped, phases)
        if attempt.metrics is not None:
            attempt.metrics.update(progress)
        if attempt.on_progress is not None:
            attempt.on_progress(progress)

    def _after_failure(self, exc: ChandyError, totals: RunTotals) -> BaseException | None:
        """What the attempt raises after ``exc``: the fenced error when a newer coordinator took
        over; a :class:`Restart` when a restart can cure it and the strategy allows one; once the
        strategy gives up, the job's error (the job FAILED first, while this coordinator runs);
        None to raise ``exc`` itself (no restart cures it)."""
        service = self.state.running()
        if service.fenced.is_set() and not isinstance(exc, PipelineFencedError):
            return PipelineFencedError(self.coordinator.fenced_message())
        failover = self.restarts.failover_reason(exc)
        if failover is None:
            return None
        delay = self.restarts.delay_s(failover)
        if delay is not None:
            return Restart(failover, delay)
        # the restart strategy gave up: FAILED (Flink's state once it does), recorded while this
        # coordinator still runs, if it does
        gave_up = self.restarts.gave_up(str(exc), totals.restarts)
        if not service.stopped.is_set():
            self.coordinator.record_failure(gave_up)
        error_type = type(exc) if isinstance(exc, PipelineError) else PipelineError
        return error_type(gave_up)

    def _end(self, attempt: Attempt) -> None:
        """However the attempt ends: add its counts to the run's, answer the requests it did not
        apply, close the lag client, take the last data loss in, and stop the coordinator."""
        landed = self.coordinator.safe_committed_records()
        attempt.totals.add(landed, attempt.completed, attempt.failed)
        not_applied = "the pipeline stopped before the request was applied"
        fail_request(attempt.request, PipelineError(not_applied))
        self.requests.fail_all(not_applied)
        self.source.close_lag_client()
        with contextlib.suppress(ChandyError, TimeoutError):  # the last checkpoint's data loss, if any
            self.source.sync_data_loss()
        self.state.running().stop()

"""The main job: an exactly-once Kafka-to-lake pipeline on Spark, driven by Chandy's checkpoints.

Checkpoint N is micro-batch N. The driver runs the checkpoint coordinator with two operator
coordinators, the lake committer (operator ``lake-sink``) and the Kafka source enumerator
(``kafka-source``), and loops:

1. while there is lag, trigger checkpoint N; the enumerator fixes each reader subtask's offset
   ranges [end of N-1, last stable offset) (capped by ``max.records.per.checkpoint``);
2. run one Spark job over those ranges (``chandy_kafka_ranges``), decode values, apply the
   user's transform, and write (``chandy_lake_files``): each Spark task is subtask *i* of
   ``lake-sink``; it writes its Parquet files into the table location, invisible, and
   acknowledges N with them (or declines, on its last allowed attempt);
3. wait for N to complete: the coordinator writes ``_metadata``, logs COMPLETED, then the lake
   committer commits N's files in one Delta commit with app transaction (job id, N), and only
   then the enumerator commits the ranges' ends to the consumer group.

A failed or aborted checkpoint commits nothing; the next one reads its ranges again, after an
exponential back-off (Flink's exponential-delay restart strategy). After a crash anywhere, the next
start replays the coordinator log, restores the latest completed checkpoint (committing it to the
table if it was not yet: restoring implies completion; a repeated commit is skipped by its app
transaction), deletes unreferenced files, and continues from that checkpoint's ends: every record
lands exactly once. The table is the truth about what landed: before Spark starts, the preflight
(:mod:`~chandy.connectors.spark.driver.preflight`) checks the brokers, the Kafka settings, the
table's location and schema, and reconciles the table with the coordinator log and the group.

:class:`Pipeline` orchestrates; each part of the driver is a collaborator it holds, sharing one
:class:`~chandy.connectors.spark.driver.state.DriverState`:

=======================  =====================================================================
``checks``               :class:`~.preflight.Preflight`: the checks and the reconciliation
``decoders``             :class:`~.decoders.DecoderFactory`: the value decoder and output schema
``session``              :class:`~.session.SparkSessionManager`: the Spark session, warm workers
``requests``             :class:`~.requests.RequestExecutor`: control requests, in order
``coordinator``          :class:`~.coordinator.JobCoordinator`: the coordinator service
``source``               :class:`~.source.SourceOffsets`: lag, data loss, ``--ending-offsets``
``micro_batches``        :class:`~.micro_batch.MicroBatchRunner`: one checkpoint's Spark job
``restarts``             :class:`~.restarts.Restarts`: Flink's restart strategy
``loop``                 :class:`~.loop.CheckpointLoop`: one attempt's driver loop
=======================  =====================================================================
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Mapping
from typing import Any

from chandy.connectors.lake.committer import OffsetRanges
from chandy.connectors.lake.sink import TP
from chandy.connectors.lake.tables import LakeSink
from chandy.connectors.spark.classic import spark_master
from chandy.connectors.spark.cluster import default_parallelism
from chandy.connectors.spark.driver.coordinator import JobCoordinator, checkpoint_phases, fenced_message, offsets_of
from chandy.connectors.spark.driver.decoders import DecoderFactory
from chandy.connectors.spark.driver.failures import root_cause
from chandy.connectors.spark.driver.loop import Attempt, CheckpointLoop
from chandy.connectors.spark.driver.metrics import PipelineMetricsCollector
from chandy.connectors.spark.driver.micro_batch import MicroBatchRunner
from chandy.connectors.spark.driver.preflight import Preflight
from chandy.connectors.spark.driver.requests import Request, RequestExecutor
from chandy.connectors.spark.driver.restarts import Restart, Restarts, RunTotals
from chandy.connectors.spark.driver.session import (
    SparkSessionManager,
    install_signal_handlers,
    restore_signal_handlers,
    stop_spark,
)
from chandy.connectors.spark.driver.source import SourceOffsets
from chandy.connectors.spark.driver.state import DriverState
from chandy.connectors.spark.options import (
    SINK_OPERATOR,
    SOURCE_OPERATOR,
    PipelineError,
    PipelineFencedError,
    PipelineOptions,
    PipelineProgress,
    PipelineSummary,
)
from chandy.coordinator.kafka.requests import ControlRequest
from chandy.coordinator.kafka.runtime import CoordinatorService, JobTerminatedError
from chandy.coordinator.storage import CheckpointMetadata
from chandy.formats.decoder import ValueDecoder


class Pipeline:
    """One run of the pipeline (see the module docstring). Not reusable after :meth:`run`.

    ``spark``: a session to run on, kept as it is (the run neither changes its settings nor stops
    it); without one the run starts its own from the options and stops it when it ends. Making a
    pipeline opens the table's sink and reads nothing else.

    Raises:
        PipelineError: ``--transform`` cannot be imported, or the restart strategy's options are bad.
    """

    def __init__(self, options: PipelineOptions, *, spark: Any = None) -> None:
        self.state: DriverState = DriverState.open(options)
        self.decoders: DecoderFactory = DecoderFactory(self.state)
        self.checks: Preflight = Preflight(self.state, self.decoders)
        self.session: SparkSessionManager = SparkSessionManager(self.state, spark)
        self.requests: RequestExecutor = RequestExecutor(self.state)
        self.coordinator: JobCoordinator = JobCoordinator(self.state)
        self.source: SourceOffsets = SourceOffsets(self.state, self.coordinator)
        self.micro_batches: MicroBatchRunner = MicroBatchRunner(self.state, self.decoders, self.coordinator)
        self.restarts: Restarts = Restarts(self.state, self.checks.reconcile)
        self.loop: CheckpointLoop = CheckpointLoop(self.state, self.requests, self.source, self.micro_batches,
                                                   self.coordinator, self.session, self.restarts)

    # -- what callers read of the run (the CLI, the benchmarks, the tests) --------------------------

    @property
    def options(self) -> PipelineOptions:
        """The run's options."""
        return self.state.options

    @property
    def job_id(self) -> str:
        """The job's ID (``--job-id``, else derived from the table and the topics)."""
        return self.state.job_id

    @property
    def sink(self) -> LakeSink:
        """The job's table (``--table``)."""
        return self.state.sink

    @property
    def service(self) -> CoordinatorService | None:
        """The running (or last) attempt's coordinator; None before the first attempt starts."""
        return self.state.service

    @property
    def decoder(self) -> ValueDecoder | None:
        """How the tasks decode keys and values (None: raw Kafka columns, or JSON not inferred yet)."""
        return self.state.decoder

    @property
    def parallelism(self) -> int:
        """Subtasks of ``lake-sink``, one Spark task each (0 before the run starts)."""
        return self.state.parallelism

    @property
    def notices(self) -> list[str]:
        """What the run did that the user should know, one line each."""
        return self.state.notices

    @property
    def offsets_lost(self) -> int:
        """Offsets the run skipped with ``--no-fail-on-data-loss`` (see :attr:`DriverState.offsets_lost`)."""
        return self.state.offsets_lost

    @property
    def restarting_ms(self) -> float:
        """Flink's restartingTime: the run's last restart, from its failure to the new coordinator running, in ms."""
        return self.state.restarting_ms

    def request_stop(self, signum: int | None = None) -> None:
        """Finish (or abort) the checkpoint in flight and stop; callable from any thread or signal handler."""
        self.state.request_stop(signum)

    def preflight(self) -> None:
        """The checks and the reconciliation before Spark starts (:meth:`Preflight.run`), once.

        Raises:
            PipelineError: see :meth:`~chandy.connectors.spark.driver.preflight.Preflight.run`.
        """
        self.checks.run()

    def check_static(self) -> None:
        """The checks a ``--standby`` runs before it waits (:meth:`Preflight.check_static`), once.

        Raises:
            PipelineError: see :meth:`~chandy.connectors.spark.driver.preflight.Preflight.run`.
        """
        self.checks.check_static()

    def offsets_of(self, metadata: CheckpointMetadata) -> OffsetRanges:
        """The offset ranges checkpoint ``metadata`` covers (:func:`~.coordinator.offsets_of`; reads
        nothing of the pipeline)."""
        return offsets_of(metadata)

    # -- the run -------------------------------------------------------------------------------------

    def run(self, on_progress: Callable[[PipelineProgress], None] | None = None, *,
            handle_signals: bool = False) -> PipelineSummary:
        """Run until drained (``stop_when_drained``), ``max_checkpoints``, :meth:`request_stop`, a
        signal (with ``handle_signals``), or a failure. A failure a restart can cure
        (:class:`PipelineFailoverError`) restarts the job from its latest completed checkpoint, in
        this process, after the delay the restart strategy gives (Flink's global failover); the
        job ends FAILED once the strategy gives up. ``on_progress`` gets each checkpoint's progress.

        Raises:
            PipelineError: a preflight check failed, a record or schema the job cannot land, or
                the job failed and its restart strategy gave up; the message names the root cause.
            PipelineFencedError: a newer coordinator of the job took over.
        """
        state, opts = self.state, self.state.options
        started = time.monotonic()
        if opts.standby and not self._stand_by():
            return PipelineSummary(opts.table_uri, state.job_id, 0, 0, 0, time.monotonic() - started,
                                   stopped_because="stopped while standing by", signal=state.stop_signal)
        self.checks.run()
        self.source.resolve_ending_offsets()
        spark = self.session.get_or_create()
        state.parallelism = opts.parallelism or default_parallelism(
            len(state.partitions), spark_master(spark), lambda: self.session.spark_default_parallelism(spark))
        if not self.session.given and "spark.sql.shuffle.partitions" not in opts.spark_conf:
            spark.conf.set("spark.sql.shuffle.partitions", str(state.parallelism))  # a transform's shuffles
        previous_handlers = install_signal_handlers(state) if handle_signals else {}
        try:
            self.session.register_data_sources(spark)
            self.session.warm_python_workers(spark, with_sink=True)  # RUNNING means warm: the first checkpoint costs no more
            self.restarts.reset()
            totals = RunTotals()
            while True:
                try:
                    if totals.restarts:
                        spark = self._renew_session(spark, totals.restarts)
                    return self._run_attempt(spark, on_progress, started, totals)
                except Restart as restart:
                    state.restart_began = time.monotonic()
                    if not self.restarts.restart_after(restart, totals):
                        return PipelineSummary(
                            opts.table_uri, state.job_id, totals.landed, totals.completed, totals.failed,
                            time.monotonic() - started, stopped_because="stopped while restarting",
                            signal=state.stop_signal, notices=tuple(state.notices), restarts=totals.restarts)
        finally:
            if not self.session.given:
                stop_spark(spark)
            restore_signal_handlers(previous_handlers)

    def _stand_by(self) -> bool:
        """``--standby``: the static checks (a misconfigured standby fails now, not at its
        take-over), a warm Spark session (Spark is up before it leads), then wait in the job's
        election group; False when stopped while waiting (the session it started is stopped).

        Raises:
            PipelineError: a static check failed.
        """
        self.state.parallelism = self.options.parallelism or 1
        self.checks.check_static()
        warm = self.session.get_or_create()
        self.session.register_data_sources(warm)
        self.session.warm_python_workers(warm)
        if self.coordinator.stand_by():
            return True
        if not self.session.given:
            stop_spark(warm)
        return False

    def _renew_session(self, spark: Any, restart: int) -> Any:
        """Before restart ``restart``'s attempt under Spark Connect: a new session, warmed
        (:meth:`SparkSessionManager.renew`); the same ``spark`` otherwise.

        Raises:
            Restart: the server cannot be reached yet, and the restart strategy allows another attempt.
            PipelineError: it cannot, and the restart strategy gave up.
        """
        if not self.session.renews(spark):
            return spark
        try:
            renewed = self.session.renew(spark)
        except Exception as exc:  # the server still down: a failed restart, retried as one
            reason = f"restart {restart} could not open a Spark Connect session: {root_cause(exc)}"
            raise self.restarts.failed_restart(reason, restart) from exc
        self.session.warm_python_workers(renewed, with_sink=True)
        return renewed

    def _run_attempt(self, spark: Any, on_progress: Callable[[PipelineProgress], None] | None,
                     started: float, totals: RunTotals) -> PipelineSummary:
        """One attempt of the job: start the coordinator (restoring the latest completed
        checkpoint), then checkpoint until the run ends (:meth:`CheckpointLoop.run`).

        Raises:
            Restart: a failure a restart can cure, and the restart strategy allows a restart.
            PipelineError, PipelineFencedError: as :meth:`run`.
        """
        state, opts = self.state, self.state.options
        try:
            service = state.service = self.coordinator.start(self.requests.execute)
            self.source.new_attempt()  # a new source enumerator
            if state.restart_began is not None:
                state.restarting_ms, state.restart_began = (time.monotonic() - state.restart_began) * 1000, None
        except JobTerminatedError as exc:  # a standby of a job that ended: it says why and exits 0
            state.notice(str(exc))
            return PipelineSummary(opts.table_uri, state.job_id, totals.landed, totals.completed, totals.failed,
                                   time.monotonic() - started, stopped_because=str(exc), signal=state.stop_signal,
                                   notices=tuple(state.notices), restarts=totals.restarts)
        except PipelineError as exc:
            if not totals.restarts or isinstance(exc, PipelineFencedError):
                raise
            reason = f"restart {totals.restarts} could not start the coordinator: {exc}"
            raise self.restarts.failed_restart(reason, totals.restarts) from exc
        attempt = Attempt(started, totals, on_progress, self._metrics(service))
        return self.loop.run(spark, attempt)

    def _metrics(self, service: CoordinatorService) -> PipelineMetricsCollector | None:
        """With ``--metrics-port``: the pipeline's gauges (:mod:`~chandy.connectors.spark.driver.metrics`),
        registered on the attempt's metrics server; they read the lake committer at scrape time."""
        if service.metrics_server is None:
            return None
        state = self.state

        def committer(read: Callable[[Any], Any]) -> Callable[[], Any]:
            return lambda: service.call_operator_coordinator(SINK_OPERATOR, read, timeout_s=5.0)

        metrics = PipelineMetricsCollector(
            state.metric_scope, SOURCE_OPERATOR, SINK_OPERATOR,
            read_commit_ms=committer(lambda c: c.last_commit_ms),
            read_fetch_lag_ms=committer(lambda c: dict(c.fetch_event_time_lag_ms)),
            read_restarting_ms=lambda: state.restarting_ms,
            read_bytes=committer(lambda c: c.bytes_read),
            read_fetches=committer(lambda c: (c.fetch_requests, c.records_fetched)))
        service.metrics_server.register(metrics)
        return metrics

    def check_values(self) -> Any:
        """``--verify``'s value check (:func:`chandy.connectors.spark.verify.check_values`) after a run:
        each landed row's value columns against its source record decoded again; None when
        there is nothing to compare (raw Kafka columns, or a ``--transform`` that reshapes rows).

        Returns:
            :class:`chandy.connectors.spark.verify.ValueCheck` or None.
        """
        state = self.state
        if state.decoder is None or state.transform is not None:
            return None
        from chandy.connectors.spark.verify import check_values

        return check_values(state.sink, state.options.bootstrap_servers, state.decoder, state.topic_names,
                            state.options.consumer_overrides)

    # -- the driver's parts under the names earlier tests reach for (delegating) -----------------------

    def _execute_request(self, request: ControlRequest) -> concurrent.futures.Future:
        """:meth:`RequestExecutor.execute`."""
        return self.requests.execute(request)

    def _next_request(self) -> Request | None:
        """:meth:`RequestExecutor.next_request`."""
        return self.requests.next_request()

    @property
    def _draining(self) -> Request | None:
        """:attr:`RequestExecutor.draining`."""
        return self.requests.draining

    @_draining.setter
    def _draining(self, request: Request | None) -> None:
        self.requests.draining = request

    def _spark_session(self) -> Any:
        """:meth:`SparkSessionManager.get_or_create`."""
        return self.session.get_or_create()

    def _check_planner_python(self, python: str) -> None:
        """:meth:`SparkSessionManager.check_planner_python`."""
        self.session.check_planner_python(python)

    @property
    def _restart_began(self) -> float | None:
        """:attr:`DriverState.restart_began`."""
        return self.state.restart_began

    def _rewind_group_past_table(self, table_offsets: Mapping[TP, int]) -> None:
        """:meth:`Preflight.rewind_group_past_table`."""
        self.checks.rewind_group_past_table(table_offsets)

    def _fenced_message(self) -> str:
        """:func:`~.coordinator.fenced_message` of this run's coordinator (reads ``options``,
        ``job_id`` and ``service`` only)."""
        assert self.service is not None
        return fenced_message(self.options, self.job_id, self.service)

    def _phases(self, checkpoint_id: int, started_ms: float, ranges_ms: float, job_ended_ms: float,
                done_ms: float) -> dict[str, float]:
        """:func:`~.coordinator.checkpoint_phases` of this run's coordinator (reads ``service`` only)."""
        assert self.service is not None
        return checkpoint_phases(self.service, checkpoint_id, started_ms, ranges_ms, job_ended_ms, done_ms)

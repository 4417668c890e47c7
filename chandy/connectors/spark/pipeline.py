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
lands exactly once.

The table is the truth about what landed. Before Spark starts, :meth:`Pipeline.preflight` checks
the brokers, the Kafka settings, the table's location and schema, and reconciles:

1. the table's commits record, per job, the end offset of every (topic, partition) they cover;
   another job that landed one of this job's partitions into the table is an error;
2. the coordinator log is read (read-only); when it holds no completed checkpoint at or after the
   table's (lost, recreated, or a new Kafka cluster with the same topics), the job resumes from
   the table's offsets and says so in one line (``resume_from_table=False`` refuses instead);
3. checkpoint IDs continue above the table's newest (Flink's ``CheckpointIDCounter.setCount``),
   no range starts below the table's offsets (the source's ``offset_floor``), and a consumer group
   ahead of the table is moved back to it: offsets are never committed past what the table holds.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from chandy.connectors.kafka.source import offsets as offsets_module
from chandy.connectors.kafka.source.enumerator import (
    KafkaSourceCoordinatorProvider,
    KafkaSourceEnumeratorState,
    KafkaSourceOptions,
)
from chandy.connectors.lake.committer import LakeCommitterProvider, OffsetRanges
from chandy.connectors.lake.sink import coordinator_log_id
from chandy.connectors.lake.sinks import LakeSink, open_sink
from chandy.connectors.spark.classic import spark_master
from chandy.connectors.spark.cluster import (
    default_parallelism,
    root_cause,
)
from chandy.connectors.spark.decoding import PipelineDecoding
from chandy.connectors.spark.micro_batch import PipelineMicroBatch
from chandy.connectors.spark.options import (
    DETERMINISTIC_ERRORS,
    SINK_OPERATOR,
    SOURCE_OPERATOR,
    PipelineError,
    PipelineFailoverError,
    PipelineFencedError,
    PipelineProgress,
    PipelineSummary,
)
from chandy.connectors.spark.preflight import PipelinePreflight
from chandy.connectors.spark.request_executor import PipelineRequestExecutor
from chandy.connectors.spark.restarts import PipelineRestarts, Restart, RunTotals
from chandy.connectors.spark.session import KEEP_WARM_S, PipelineSession, stop_spark
from chandy.coordinator.environment import OutboundMessage
from chandy.coordinator.errors import ChandyError
from chandy.coordinator.failure import CheckpointException, CheckpointFailureReason
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.election import LeaderElection
from chandy.coordinator.kafka.log_writer import CoordinatorFencedError
from chandy.coordinator.kafka.requests import ControlRequest, ControlRequestType, RequestOutcome
from chandy.coordinator.kafka.runtime import CoordinatorService, JobTerminatedError
from chandy.coordinator.kafka.topics import ChandyTopics, ensure_topics
from chandy.coordinator.options import CheckpointingOptions
from chandy.coordinator.restart_strategy import create_restart_strategy
from chandy.coordinator.storage import CheckpointMetadata, CheckpointStorage

log = logging.getLogger(__name__)

#: seconds between two reads of the source's end offsets while the job has nothing to read (each
#: read asks the partitions' leaders for their last stable offsets)
IDLE_POLL_S = 0.1


class Pipeline(PipelinePreflight, PipelineDecoding, PipelineSession, PipelineRequestExecutor, PipelineMicroBatch,
               PipelineRestarts):
    """One run of the pipeline (see the module docstring). Not reusable after :meth:`run`."""

    def offsets_of(self, metadata: CheckpointMetadata) -> OffsetRanges:
        """The offset ranges checkpoint ``metadata`` covers, from the Kafka source's state in it."""
        operator = metadata.operator(SOURCE_OPERATOR)
        if operator is None or operator.coordinator_state is None:
            return {}
        state = KafkaSourceEnumeratorState.deserialize(operator.coordinator_state)
        return {r.topic_partition: (r.starting_offset, r.stopping_offset) for r in state.ranges
                if r.stopping_offset is not None}

    def completion_outputs(self, metadata: CheckpointMetadata) -> list[OutboundMessage]:
        """On the I/O executor, before checkpoint N completes: its bad records, as dead letters
        published in N's completion transaction (see :mod:`chandy.connectors.spark.task.dead_letters`)."""
        from chandy.connectors.spark.task.dead_letters import delete_dead_letters_before, read_dead_letters, to_messages

        opts = self.options
        if opts.value_format is None:
            return []
        checkpoint_dir, checkpoint_id = opts.resolved_checkpoint_dir, metadata.checkpoint_id
        bad, skipped = read_dead_letters(checkpoint_dir, self.job_id, checkpoint_id, opts.storage_options)
        delete_dead_letters_before(checkpoint_dir, self.job_id, checkpoint_id, opts.storage_options)
        self.tombstones_skipped += skipped
        if bad.num_rows == 0:
            return []
        first = bad.slice(0, 1).to_pylist()[0]
        self.bad_records += bad.num_rows
        where = "published to " + opts.dead_letter_topic if opts.dead_letter_topic else "skipped"
        log.warning("checkpoint %d: %d bad record(s) %s; first: topic %s partition %d offset %d: %s: %s",
                    checkpoint_id, bad.num_rows, where, first["topic"], first["partition"], first["offset"],
                    first["error_class"], first["error_message"])
        if not opts.dead_letter_topic:
            return []
        self.dead_lettered += bad.num_rows
        return to_messages(bad, opts.dead_letter_topic, f"chandy-{self.job_id}")

    def _start_coordinator(self) -> CoordinatorService:
        opts = self.options
        initializer = offsets_module.parse_offsets_spec(opts.starting_offsets, "--starting-offsets")
        floor = dict(self.table_progress.offsets) if self.table_progress is not None else {}
        source = KafkaSourceOptions(
            opts.bootstrap_servers, topics=tuple(opts.topics), topic_pattern=opts.topic_pattern,
            group_id=opts.resolved_group_id, starting_offsets=initializer,
            max_records_per_checkpoint=opts.max_records_per_checkpoint, consumer_overrides=dict(opts.consumer_overrides),
            offset_floor=floor, stopping_offsets=dict(self.ending_offsets or {}),
            # Spark's failOnDataLoss; the table refuses a range that does not continue its offsets
            fail_on_data_loss=opts.fail_on_data_loss, sink_holds_offsets=True)
        savepoint_dir = f"{opts.resolved_checkpoint_dir.rstrip('/')}/savepoints"
        storage = CheckpointStorage(opts.resolved_checkpoint_dir, self.job_id, savepoint_dir=savepoint_dir,
                                    storage_options=dict(opts.storage_options))
        service = CoordinatorService(
            self.job_id, opts.bootstrap_servers,
            CheckpointingOptions(interval_ms=0, timeout_ms=opts.checkpoint_timeout_ms, max_concurrent=1,
                                 tolerable_failed=opts.tolerable_failed_checkpoints, num_retained=2,
                                 checkpoint_dir=opts.resolved_checkpoint_dir, savepoint_dir=savepoint_dir,
                                 # the driver starts the subtasks (Spark tasks) for each checkpoint
                                 wait_for_running_subtasks=False),
            {SINK_OPERATOR: self.parallelism},
            # order matters: the lake commit happens before the offset commit (notification order)
            coordinator_providers=[LakeCommitterProvider(SINK_OPERATOR, self.sink, storage, offsets_of=self.offsets_of,
                                                         cluster_id=self.cluster_id, optimize_every=opts.optimize_every,
                                                         optimize_target_size=opts.optimize_target_size,
                                                         open_table=self._routed_table if opts.routes else None,
                                                         changes=opts.cdc is not None, vacuum_every=opts.vacuum_every,
                                                         vacuum_retention_hours=opts.vacuum_retention_hours,
                                                         vacuum_retain_last=opts.vacuum_retain_last,
                                                         log_id=coordinator_log_id(opts.prefix, self.job_id),
                                                         source_idle_timeout_ms=opts.source_idle_timeout_ms),
                                   KafkaSourceCoordinatorProvider(SOURCE_OPERATOR, source, parallelism=self.parallelism)],
            prefix=opts.prefix, producer_overrides=opts.driver_producer_overrides,
            consumer_overrides=dict(opts.consumer_overrides), storage_options=dict(opts.storage_options),
            completion_outputs=self.completion_outputs, checkpoint_id_floor=self._checkpoint_id_floor,
            restore_from=opts.from_savepoint, request_executor=self._execute_request, election=self.election,
            metrics_port=opts.metrics_port, metrics_scope=self.metric_scope, standby=opts.standby,
            retry_timeout_s=opts.kafka_retry_timeout_ms / 1000, restart_strategy=True,
        )
        try:
            return service.start(periodic=False)
        except JobTerminatedError as exc:
            service.stop()
            if opts.standby:
                raise  # run() ends the standby's run with it: nothing to take over
            raise PipelineError(str(exc)) from exc
        except ChandyError as exc:
            service.stop()
            raise PipelineError(f"job {self.job_id} cannot start: {exc}") from exc

    def _routed_table(self, table_uri: str) -> LakeSink:
        """The sink of a table ``--route`` names (created at its first commit, with ``--partition-by``)."""
        opts = self.options
        return open_sink(table_uri, partition_by=tuple(opts.partition_by), storage_options=dict(opts.storage_options),
                         catalog_properties=dict(opts.catalog_properties), add_columns=self.add_columns,
                         table_properties=opts.table_properties)

    def _release_savepoint_ranges(self, checkpoint_id: int) -> None:
        """An intermediate savepoint's ranges are read again by the next checkpoint (nobody is
        notified of a savepoint's completion, so nothing commits its offsets)."""
        self._enumerator_call(lambda e: e.release_ranges(checkpoint_id))

    def _fenced_message(self) -> str:
        """The line a fenced run ends with, naming the newer epoch the log holds (read for up to 10 s).

        Raises:
            PipelineKafkaError: Kafka is unreachable, so whether a newer coordinator leads cannot be known.
        """
        from chandy.connectors.spark.options import PipelineKafkaError
        from chandy.coordinator.kafka.log import LogUnreachableError, load_state

        assert self.service is not None
        mine = self.service.epoch
        newer = mine
        deadline = time.monotonic() + 10
        while newer <= mine and time.monotonic() < deadline:
            try:
                state, _ = load_state(self.options.bootstrap_servers, ChandyTopics(self.options.prefix).coordinator_log,
                                      self.job_id, consumer_overrides=dict(self.options.consumer_overrides), timeout_s=10)
                newer = state.epoch
            except LogUnreachableError as exc:  # not fencing: nobody can tell whether a newer coordinator exists
                raise PipelineKafkaError(f"job {self.job_id}: this coordinator stopped writing ({self.service.stop_reason}), "
                                         f"and whether a newer coordinator took over cannot be known: {exc}") from None
            except ChandyError:
                break
            if newer <= mine:
                time.sleep(0.5)
        epoch = f"epoch {newer}" if newer > mine else f"an epoch above {mine}"
        return f"job {self.job_id}: fenced by a newer coordinator ({epoch}); this run stopped writing"

    def run(self, on_progress: Callable[[PipelineProgress], None] | None = None, *,
            handle_signals: bool = False) -> PipelineSummary:
        """Run until drained (``stop_when_drained``), ``max_checkpoints``, :meth:`request_stop`, a
        signal (with ``handle_signals``), or a failure. A failure a restart can cure
        (:class:`PipelineFailoverError`) restarts the job from its latest completed checkpoint, in
        this process, after the delay the restart strategy gives (Flink's global failover); the
        job ends FAILED once the strategy gives up.

        Raises:
            PipelineError: a preflight check failed, a record or schema the job cannot land, or
                the job failed and its restart strategy gave up; the message names the root cause.
            PipelineFencedError: a newer coordinator of the job took over.
        """
        opts = self.options
        started = time.monotonic()
        if opts.standby:
            self.parallelism = opts.parallelism or 1
            self.check_static()  # a misconfigured standby fails now, not at its take-over
            warm = self._spark_session()  # a warm standby: Spark is up before it leads
            self._register_data_sources(warm)
            self._warm_python_workers(warm)
            if not self._stand_by():
                if self._spark is None:
                    stop_spark(warm)
                return PipelineSummary(opts.table_uri, self.job_id, 0, 0, 0, time.monotonic() - started,
                                       stopped_because="stopped while standing by", signal=self.stop_signal)
        self.preflight()
        self.resolve_ending_offsets()
        spark = self._spark_session()
        self.parallelism = opts.parallelism or default_parallelism(
            len(self.partitions), spark_master(spark), lambda: self._default_parallelism(spark))
        if self._spark is None and "spark.sql.shuffle.partitions" not in opts.spark_conf:
            spark.conf.set("spark.sql.shuffle.partitions", str(self.parallelism))  # a transform's shuffles
        previous_handlers = self._install_signal_handlers() if handle_signals else {}
        try:
            self._register_data_sources(spark)
            self._warm_python_workers(spark, with_sink=True)  # RUNNING means warm: the first checkpoint costs no more
            self._restart_strategy = create_restart_strategy(opts.restart_strategy_options)
            totals = RunTotals()
            while True:
                try:
                    if totals.restarts:
                        spark = self._renew_connect_session(spark, totals.restarts)
                    return self._run_attempt(spark, on_progress, started, totals)
                except Restart as restart:
                    self._restart_began = time.monotonic()
                    if not self._restart_after(restart, totals):
                        return PipelineSummary(
                            opts.table_uri, self.job_id, totals.landed, totals.completed, totals.failed,
                            time.monotonic() - started, stopped_because="stopped while restarting",
                            signal=self.stop_signal, notices=tuple(self.notices), restarts=totals.restarts)
        finally:
            if self._spark is None:
                stop_spark(spark)
            self._restore_signal_handlers(previous_handlers)

    def _run_attempt(self, spark: Any, on_progress: Callable[[PipelineProgress], None] | None,
                     started: float, totals: RunTotals) -> PipelineSummary:
        """One attempt of the job: start the coordinator (restoring the latest completed
        checkpoint), then checkpoint until the run ends.

        Raises:
            Restart: a failure a restart can cure, and the restart strategy allows a restart.
            PipelineError, PipelineFencedError: as :meth:`run`.
        """
        opts = self.options
        try:
            self.service = self._start_coordinator()
            self._offsets_lost_before, self._data_loss_seen = self.offsets_lost, 0  # a new source enumerator
            if self._restart_began is not None:
                self.restarting_ms, self._restart_began = (time.monotonic() - self._restart_began) * 1000, None
        except JobTerminatedError as exc:  # a standby of a job that ended: it says why and exits 0
            self._notice(str(exc))
            return PipelineSummary(opts.table_uri, self.job_id, totals.landed, totals.completed, totals.failed,
                                   time.monotonic() - started, stopped_because=str(exc), signal=self.stop_signal,
                                   notices=tuple(self.notices), restarts=totals.restarts)
        except PipelineError as exc:
            if not totals.restarts or isinstance(exc, PipelineFencedError):
                raise
            reason = f"restart {totals.restarts} could not start the coordinator: {exc}"
            delay = self._restart_delay_s(reason)
            if delay is None:
                raise PipelineError(f"job {self.job_id} failed: {self._gave_up(reason, totals.restarts)}") from exc
            raise Restart(reason, delay) from exc
        metrics = None
        if self.service.metrics_server is not None:
            from chandy.connectors.spark.metrics import PipelineMetricsCollector

            service = self.service
            metrics = PipelineMetricsCollector(
                self.metric_scope, SOURCE_OPERATOR, SINK_OPERATOR,
                read_commit_ms=lambda: service.call_operator_coordinator(SINK_OPERATOR, lambda c: c.last_commit_ms,
                                                                         timeout_s=5.0),
                read_fetch_lag_ms=lambda: service.call_operator_coordinator(
                    SINK_OPERATOR, lambda c: dict(c.fetch_event_time_lag_ms), timeout_s=5.0),
                read_restarting_ms=lambda: self.restarting_ms,
                read_bytes=lambda: service.call_operator_coordinator(SINK_OPERATOR, lambda c: c.bytes_read,
                                                                     timeout_s=5.0),
                read_fetches=lambda: service.call_operator_coordinator(
                    SINK_OPERATOR, lambda c: (c.fetch_requests, c.records_fetched), timeout_s=5.0))
            self.service.metrics_server.register(metrics)
        completed = failed = consecutive = 0
        first_failure: str | None = None
        landed_before = self._committed_records()
        if self.election is not None and self.election.became_leader_at is not None:
            self.takeover_s = time.monotonic() - self.election.became_leader_at
            self._notice(f"standby of job {self.job_id} leads: coordinator started {self.takeover_s:.1f} s after "
                         "the election")
        stopped_because = "stopped"
        canceled = False
        request: tuple[ControlRequest, concurrent.futures.Future] | None = None
        try:
            deadline = time.monotonic() + 60
            while not self._enumerator_call(lambda e: len(e.splits)):
                if time.monotonic() > deadline:
                    raise PipelineError("partition discovery found no partitions within 60 s")
                time.sleep(0.05)
            last_trigger = time.monotonic()
            while True:
                if self._stop.is_set():
                    stopped_because = ("stopped by " + signal.Signals(self.stop_signal).name if self.stop_signal
                                       else "stopped on request")
                    break
                if self.service.fenced.is_set():
                    raise PipelineFencedError(self._fenced_message())
                if self.service.failover_reason is not None:  # a global failure: the restart strategy decides
                    cause = f"; first failure: {first_failure}" if first_failure else ""
                    raise PipelineFailoverError(f"job {self.job_id} failed: {self.service.failover_reason}{cause}")
                if self.service.job_status == "FAILED" or self.service.stopped.is_set():
                    reason = self.service.failure_reason() or "the coordinator stopped"
                    cause = f"; first failure: {first_failure}" if first_failure else ""
                    raise PipelineError(f"job {self.job_id} failed: {reason}{cause}")
                if opts.max_checkpoints is not None and totals.completed + completed >= opts.max_checkpoints:
                    stopped_because = f"{opts.max_checkpoints} checkpoints done"
                    break
                request = self._next_request()
                if request is not None and request[0].request_type is ControlRequestType.CANCEL:
                    self._cancel(request)
                    stopped_because = f"canceled by request {request[0].request_id}"
                    canceled = True
                    break
                lag = self.lag()
                if (request is not None and request[0].request_type is ControlRequestType.STOP_WITH_SAVEPOINT
                        and request[0].drain and sum(lag.values()) > 0):
                    self._draining, request = request, None  # land what is available first (Flink's --drain)
                if request is None and self._holding_back(sum(lag.values()), last_trigger):
                    if time.monotonic() - self.last_spark_job > KEEP_WARM_S:
                        self._warm_python_workers(spark, with_sink=True)  # a long wait must not go cold
                    self._idle(IDLE_POLL_S)  # Spark's minOffsetsPerTrigger: wait for more, up to maxTriggerDelay
                    continue
                if request is None and sum(lag.values()) == 0:
                    if self.reached_ending_offsets():
                        stopped_because = f"reached --ending-offsets {opts.ending_offsets}"
                        break
                    if opts.stop_when_drained:
                        stopped_because = "drained"
                        break
                    if time.monotonic() - self.last_spark_job > KEEP_WARM_S:
                        self._warm_python_workers(spark, with_sink=True)  # before Spark stops them
                    # the interval since the last trigger has passed (the pause after it did that):
                    # look for new records often, so the first one after an idle spell waits little
                    self._idle(IDLE_POLL_S)
                    continue
                batch_started = last_trigger = time.monotonic()
                started_ms = time.time() * 1000
                trigger = self._trigger_for(request)
                checkpoint_id = trigger.checkpoint_id or -1  # None: refused before it got an ID
                message = None
                fatal = None
                records = 0
                spark_job_ms = 0.0
                done_ms = None  # set once the checkpoint completed: its phases are read then
                try:
                    ranges = self._ranges(checkpoint_id, trigger, opts.checkpoint_timeout_ms / 1000)
                    records = sum(r.num_records for r in ranges.values())
                    job_started = time.monotonic()
                    ranges_ms = time.time() * 1000
                    try:
                        self._run_micro_batch(spark, checkpoint_id, ranges)
                    except Exception as exc:  # noqa: BLE001 - any failure of the Spark job aborts the checkpoint now, not at its timeout
                        message = root_cause(exc)
                        if message.startswith("ModuleNotFoundError"):
                            message += (f" in the executors' Python ({os.environ.get('PYSPARK_PYTHON', 'python3')}): "
                                        "install Chandy there, or its dependencies with --ship-code "
                                        "(README, Running on a cluster)")
                        fatal = message if message.split(":")[0] in DETERMINISTIC_ERRORS else None
                        log.error("checkpoint %d: Spark job failed: %s", checkpoint_id, message)
                        self.service.abort_checkpoint(checkpoint_id, CheckpointFailureReason.CHECKPOINT_DECLINED,
                                                      f"Spark job failed: {message}"[:1000])
                    spark_job_ms = (time.monotonic() - job_started) * 1000
                    self.last_spark_job = time.monotonic()
                    job_ended_ms = time.time() * 1000
                    result = self._await(trigger, opts.checkpoint_timeout_ms / 1000 + 10)
                    done_ms = time.time() * 1000
                    completed += 1
                    consecutive = 0
                    first_failure = None
                    if request is not None and request[0].request_type is ControlRequestType.TRIGGER_SAVEPOINT:
                        self._release_savepoint_ranges(checkpoint_id)
                    if request is not None:
                        request[1].set_result(RequestOutcome(checkpoint_id, result if isinstance(result, str)
                                                             else getattr(result, "external_pointer", None)))
                        if request[0].request_type is ControlRequestType.STOP_WITH_SAVEPOINT:
                            stopped_because = f"stopped with savepoint {result}"
                            self._stop.set()
                except CoordinatorFencedError as exc:
                    self._fail_request(request, exc)
                    raise PipelineFencedError(self._fenced_message()) from exc
                except CheckpointException as exc:
                    self._fail_request(request, exc)
                    failed += 1
                    consecutive += 1
                    message = message or root_cause(exc)
                    first_failure = first_failure or f"checkpoint {checkpoint_id}: {message}"
                    log.warning("checkpoint %d failed: %s", checkpoint_id, message)
                    if "AckTooLargeError" in str(exc):  # the same ranges give the same ack: a restart would too
                        fatal = fatal or f"{message} (lower --max-records-per-checkpoint or raise --write-buffer-bytes)"
                if fatal is not None:
                    # deterministic: a restart would fail the same way, so the job FAILED (Flink's
                    # state once its restart strategy gives up), not SUSPENDED (lost leadership)
                    self._record_failure(f"checkpoint {checkpoint_id} failed: {fatal}")
                    raise PipelineError(f"checkpoint {checkpoint_id} failed: {fatal}")
                if on_progress is not None or metrics is not None:
                    landed = self._committed_records() - landed_before + totals.landed
                    phases = ({} if message is not None or done_ms is None else
                              self._phases(checkpoint_id, started_ms, ranges_ms, job_ended_ms, done_ms))
                    progress = PipelineProgress(
                        checkpoint_id, message is None, records, landed, totals.completed + completed,
                        totals.failed + failed,
                        (time.monotonic() - batch_started) * 1000, time.monotonic() - started,
                        self.lag(), message, spark_job_ms, self.bad_records, self.dead_lettered,
                        self.tombstones_skipped, phases)
                    if metrics is not None:
                        metrics.update(progress)
                    if on_progress is not None:
                        on_progress(progress)
                pause = opts.checkpoint_interval_ms / 1000 - (time.monotonic() - batch_started)
                if consecutive:
                    pause = max(pause, self._backoff_s(consecutive))
                if self._stop.is_set() and stopped_because.startswith("stopped with savepoint"):
                    break
                if pause > 0:
                    self._idle(pause)
        except ChandyError as exc:
            if self.service.fenced.is_set() and not isinstance(exc, PipelineFencedError):
                raise PipelineFencedError(self._fenced_message()) from exc
            failover = self._failover_reason(exc)
            if failover is None:
                raise
            delay = self._restart_delay_s(failover)
            if delay is not None:
                raise Restart(failover, delay) from exc
            # the restart strategy gave up: FAILED (Flink's state once it does), recorded while this
            # coordinator still runs, if it does
            gave_up = self._gave_up(str(exc), totals.restarts)
            if not self.service.stopped.is_set():
                self._record_failure(gave_up)
            error_type = type(exc) if isinstance(exc, PipelineError) else PipelineError
            raise error_type(gave_up) from exc
        finally:
            landed_total = self._safe_committed_records() - landed_before
            totals.add(landed_total, completed, failed)
            self._fail_request(request, PipelineError("the pipeline stopped before the request was applied"))
            while (queued := self._next_request()) is not None:
                self._fail_request(queued, PipelineError("the pipeline stopped before the request was applied"))
            self.close_lag_client()
            with contextlib.suppress(ChandyError, TimeoutError):  # the last checkpoint's data loss, if any
                self.sync_data_loss()
            self.service.stop()
        return PipelineSummary(opts.table_uri, self.job_id, totals.landed, totals.completed, totals.failed,
                               time.monotonic() - started, stopped_because=stopped_because,
                               bad_records=self.bad_records, dead_lettered=self.dead_lettered,
                               tombstones_skipped=self.tombstones_skipped, signal=self.stop_signal,
                               notices=tuple(self.notices), canceled=canceled, restarts=totals.restarts,
                               offsets_lost=self.offsets_lost)

    def _phases(self, checkpoint_id: int, started_ms: float, ranges_ms: float, job_ended_ms: float,
                done_ms: float) -> dict[str, float]:
        """Where a completed checkpoint's time went (:data:`~chandy.connectors.spark.options.CHECKPOINT_PHASES`),
        from the driver's clocks (ms since the epoch: the round's start, its ranges fixed, the
        Spark job's return, the completion's hand-over), the coordinator's checkpoint statistics
        and the lake committer's own timing; empty when the statistics are gone or the coordinator
        stopped meanwhile (the loop then says why)."""
        assert self.service is not None
        try:
            stats = self.service.checkpoint_stats(checkpoint_id)
            lake_ended = self.service.call_operator_coordinator(SINK_OPERATOR, lambda c: c.last_commit_ended_ms)
        except ChandyError:
            return {}
        if stats is None or stats.latest_ack_timestamp is None or stats.end_to_end_duration_ms is None:
            return {}
        acked = max(ranges_ms, float(stats.latest_ack_timestamp))
        completed = max(acked, float(stats.trigger_timestamp + stats.end_to_end_duration_ms))
        committed = min(done_ms, max(completed, lake_ended or completed))
        job_end = max(0.0, job_ended_ms - committed)
        phases = {"trigger": ranges_ms - started_ms, "tasks": acked - ranges_ms, "finalize": completed - acked,
                  "lake_commit": committed - completed, "notify": done_ms - committed - job_end, "job_end": job_end}
        return {k: round(max(0.0, v), 1) for k, v in phases.items()}

    def _holding_back(self, lag: int, last_trigger: float) -> bool:
        """Whether a periodic checkpoint waits for more records (Spark's ``minOffsetsPerTrigger``
        with ``maxTriggerDelay``): some are there, fewer than ``--min-records-per-checkpoint``,
        and the last trigger is less than ``--max-trigger-delay`` ago; never in a bounded run nor
        while a stop with ``--drain`` lands what is there."""
        opts = self.options
        if opts.min_records_per_checkpoint is None or lag == 0 or opts.stop_when_drained or opts.ending_offsets \
                or self._draining is not None:
            return False
        return lag < opts.min_records_per_checkpoint and \
            time.monotonic() - last_trigger < opts.max_trigger_delay_ms / 1000

    def _record_failure(self, reason: str) -> None:
        """Make the job FAILED in the log and on the events topic before the run exits (issue 36:
        Kafka gave up). The brokers may be the reason, so this waits 10 s at most, then says it
        could not."""
        assert self.service is not None
        try:
            self.service.fail_job(reason).result(10)
        except (ChandyError, concurrent.futures.TimeoutError) as exc:  # the run exits with its own error either way
            log.error("job %s: could not record FAILED (%s); the job's last status stays in the log", self.job_id,
                      root_cause(exc))

    def _stand_by(self) -> bool:
        """Join the job's election group and wait until this process leads (True) or is stopped
        (False). Nothing of the table or the log is read before: the active process changes them."""
        opts = self.options
        topics = ChandyTopics(opts.prefix)
        ensure_topics(kafka_config.admin_client(opts.bootstrap_servers, kafka_config.security_settings(opts.consumer_overrides)), topics)
        self.election = LeaderElection(opts.bootstrap_servers, topics, self.job_id,
                                       consumer_overrides=dict(opts.consumer_overrides), standby=True).join()
        log.warning("standby for job %s: waiting until the active coordinator stops (group %s)", self.job_id,
                    self.election.group_id)
        if self.election.wait_until_leader(stop=self._stop):
            return True
        self.election.close()
        return False

    def check_values(self) -> Any:
        """``--verify``'s value check (:func:`chandy.connectors.spark.verify.check_values`) after a run:
        each landed row's value columns against its source record decoded again; None when
        there is nothing to compare (raw Kafka columns, or a ``--transform`` that reshapes rows).

        Returns:
            :class:`chandy.connectors.spark.verify.ValueCheck` or None.
        """
        if self.decoder is None or self._transform is not None:
            return None
        from chandy.connectors.spark.verify import check_values

        return check_values(self.sink, self.options.bootstrap_servers, self.decoder, self.topic_names,
                            self.options.consumer_overrides)


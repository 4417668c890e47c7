"""The job's coordinator as the pipeline runs it (:class:`JobCoordinator`): a
:class:`~chandy.coordinator.kafka.runtime.CoordinatorService` with two operator coordinators, the
lake committer (``lake-sink``, notified first) and the Kafka source's enumerator
(``kafka-source``), no periodic trigger (the driver loop triggers each checkpoint), at most one
checkpoint at a time, and Flink's restart strategy in the host. Around it: a standby's wait for
the lead, the dead letters each completion publishes, the job's FAILED record, and the line a
fenced run ends with."""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Callable

from chandy.connectors.kafka.source import offsets as offsets_module
from chandy.connectors.kafka.source.enumerator import (
    KafkaSourceCoordinatorProvider,
    KafkaSourceEnumeratorState,
    KafkaSourceOptions,
)
from chandy.connectors.lake.committer import LakeCommitterProvider, OffsetRanges
from chandy.connectors.lake.sink import coordinator_log_id
from chandy.connectors.lake.tables import LakeSink, open_sink
from chandy.connectors.spark.driver.failures import root_cause
from chandy.connectors.spark.driver.state import DriverState
from chandy.connectors.spark.options import SINK_OPERATOR, SOURCE_OPERATOR, PipelineError, PipelineOptions
from chandy.coordinator.environment import OutboundMessage
from chandy.coordinator.errors import ChandyError
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.election import LeaderElection
from chandy.coordinator.kafka.requests import ControlRequest
from chandy.coordinator.kafka.runtime import CoordinatorService, JobTerminatedError
from chandy.coordinator.kafka.topics import ChandyTopics, ensure_topics
from chandy.coordinator.options import CheckpointingOptions
from chandy.coordinator.storage import CheckpointMetadata, CheckpointStorage

log = logging.getLogger(__name__)

#: the coordinator's request executor: takes an accepted control request, returns its answer's future
RequestExecutorFn = Callable[[ControlRequest], concurrent.futures.Future]


def offsets_of(metadata: CheckpointMetadata) -> OffsetRanges:
    """The offset ranges checkpoint ``metadata`` covers, from the Kafka source's state in it:
    (topic, partition) -> (start, stop), offsets, stop exclusive; empty without the source's state."""
    operator = metadata.operator(SOURCE_OPERATOR)
    if operator is None or operator.coordinator_state is None:
        return {}
    state = KafkaSourceEnumeratorState.deserialize(operator.coordinator_state)
    return {r.topic_partition: (r.starting_offset, r.stopping_offset) for r in state.ranges
            if r.stopping_offset is not None}


def fenced_message(options: PipelineOptions, job_id: str, service: CoordinatorService) -> str:
    """The line a fenced run ends with, naming the newer epoch the log holds (read for up to 10 s).

    Raises:
        PipelineKafkaError: Kafka is unreachable, so whether a newer coordinator leads cannot be known.
    """
    from chandy.connectors.spark.options import PipelineKafkaError
    from chandy.coordinator.kafka.log import LogUnreachableError, load_state

    mine = service.epoch
    newer = mine
    deadline = time.monotonic() + 10
    while newer <= mine and time.monotonic() < deadline:
        try:
            state, _ = load_state(options.bootstrap_servers, ChandyTopics(options.prefix).coordinator_log,
                                  job_id, consumer_overrides=dict(options.consumer_overrides), timeout_s=10)
            newer = state.epoch
        except LogUnreachableError as exc:  # not fencing: nobody can tell whether a newer coordinator exists
            raise PipelineKafkaError(f"job {job_id}: this coordinator stopped writing ({service.stop_reason}), "
                                     f"and whether a newer coordinator took over cannot be known: {exc}") from None
        except ChandyError:
            break
        if newer <= mine:
            time.sleep(0.5)
    epoch = f"epoch {newer}" if newer > mine else f"an epoch above {mine}"
    return f"job {job_id}: fenced by a newer coordinator ({epoch}); this run stopped writing"


def checkpoint_phases(service: CoordinatorService, checkpoint_id: int, started_ms: float, ranges_ms: float,
                      job_ended_ms: float, done_ms: float) -> dict[str, float]:
    """Where a completed checkpoint's time went (:data:`~chandy.connectors.spark.options.CHECKPOINT_PHASES`,
    in ms), from the driver's clocks (ms since the epoch: the round's start, its ranges fixed, the
    Spark job's return, the completion's hand-over), the coordinator's checkpoint statistics and
    the lake committer's own timing; empty when the statistics are gone or the coordinator stopped
    meanwhile (the loop then says why)."""
    try:
        stats = service.checkpoint_stats(checkpoint_id)
        lake_ended = service.call_operator_coordinator(SINK_OPERATOR, lambda c: c.last_commit_ended_ms)
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


class JobCoordinator:
    """The run's coordinator service (one per attempt, :attr:`DriverState.service`) and what the
    driver asks of it beyond the checkpoints themselves (see the module docstring)."""

    def __init__(self, state: DriverState) -> None:
        self.state = state
        self._last_committed = 0  # the lake committer's records committed, as last read

    def start(self, request_executor: RequestExecutorFn) -> CoordinatorService:
        """Start an attempt's coordinator (Flink's JobMaster start): fence older ones, replay the
        log, restore the latest completed checkpoint (committing it to the table if it was not
        yet), with the preflight's checkpoint ID floor and offsets floor; control requests go to
        ``request_executor``. Blocks until it serves checkpoints.

        Raises:
            JobTerminatedError: a ``--standby`` took over a job that ended meanwhile.
            PipelineError: it cannot start (``job ... cannot start: ...``), or the job ended.
        """
        state, opts = self.state, self.state.options
        source = self._source_options()
        savepoint_dir = f"{opts.resolved_checkpoint_dir.rstrip('/')}/savepoints"
        storage = CheckpointStorage(opts.resolved_checkpoint_dir, state.job_id, savepoint_dir=savepoint_dir,
                                    storage_options=state.storage_options)
        service = CoordinatorService(
            state.job_id, opts.bootstrap_servers,
            CheckpointingOptions(interval_ms=0, timeout_ms=opts.checkpoint_timeout_ms, max_concurrent=1,
                                 tolerable_failed=opts.tolerable_failed_checkpoints, num_retained=2,
                                 checkpoint_dir=opts.resolved_checkpoint_dir, savepoint_dir=savepoint_dir,
                                 # the driver starts the subtasks (Spark tasks) for each checkpoint
                                 wait_for_running_subtasks=False),
            {SINK_OPERATOR: state.parallelism},
            # order matters: the lake commit happens before the offset commit (notification order)
            coordinator_providers=[self._lake_committer(storage),
                                   KafkaSourceCoordinatorProvider(SOURCE_OPERATOR, source, parallelism=state.parallelism)],
            prefix=opts.prefix, producer_overrides=opts.driver_producer_overrides,
            consumer_overrides=dict(opts.consumer_overrides), storage_options=state.storage_options,
            completion_outputs=self.completion_outputs, checkpoint_id_floor=state.checkpoint_id_floor,
            restore_from=opts.from_savepoint, request_executor=request_executor, election=state.election,
            metrics_port=opts.metrics_port, metrics_scope=state.metric_scope, standby=opts.standby,
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
            raise PipelineError(f"job {state.job_id} cannot start: {exc}") from exc

    def _source_options(self) -> KafkaSourceOptions:
        """The Kafka source's settings: the topics, the starting offsets (below the table's
        offsets no range starts), the bounded run's ends, Spark's ``failOnDataLoss``."""
        state, opts = self.state, self.state.options
        initializer = offsets_module.parse_offsets_spec(opts.starting_offsets, "--starting-offsets")
        floor = dict(state.table_progress.offsets) if state.table_progress is not None else {}
        return KafkaSourceOptions(
            opts.bootstrap_servers, topics=tuple(opts.topics), topic_pattern=opts.topic_pattern,
            group_id=opts.resolved_group_id, starting_offsets=initializer,
            max_records_per_checkpoint=opts.max_records_per_checkpoint, consumer_overrides=dict(opts.consumer_overrides),
            offset_floor=floor, stopping_offsets=dict(state.ending_offsets or {}),
            # Spark's failOnDataLoss; the table refuses a range that does not continue its offsets
            fail_on_data_loss=opts.fail_on_data_loss, sink_holds_offsets=True)

    def _lake_committer(self, storage: CheckpointStorage) -> LakeCommitterProvider:
        """The lake committer of ``lake-sink``: commits each completed checkpoint's files, with
        the table maintenance the options ask for (``--optimize-every``, ``--vacuum-every``)."""
        state, opts = self.state, self.state.options
        return LakeCommitterProvider(SINK_OPERATOR, state.sink, storage, offsets_of=offsets_of,
                                     cluster_id=state.cluster_id, optimize_every=opts.optimize_every,
                                     optimize_target_size=opts.optimize_target_size,
                                     open_table=self.routed_table if opts.routes else None,
                                     changes=opts.cdc is not None, vacuum_every=opts.vacuum_every,
                                     vacuum_retention_hours=opts.vacuum_retention_hours,
                                     vacuum_retain_last=opts.vacuum_retain_last,
                                     log_id=coordinator_log_id(opts.prefix, state.job_id),
                                     source_idle_timeout_ms=opts.source_idle_timeout_ms,
                                     commit_threads=opts.commit_threads)

    def routed_table(self, table_uri: str) -> LakeSink:
        """The sink of a table ``--route`` names (created at its first commit, with ``--partition-by``)."""
        state, opts = self.state, self.state.options
        sink = state.routed_sinks[table_uri] = open_sink(
            table_uri, partition_by=tuple(opts.partition_by), storage_options=dict(opts.storage_options),
            catalog_properties=dict(opts.catalog_properties), add_columns=state.add_columns,
            table_properties=opts.table_properties)
        return sink

    def completion_outputs(self, metadata: CheckpointMetadata) -> list[OutboundMessage]:
        """On the I/O executor, before checkpoint N completes: its bad records, as dead letters
        published in N's completion transaction (see :mod:`chandy.connectors.spark.task.dead_letters`);
        counted in :attr:`DriverState.bad_records` and ``dead_lettered``."""
        from chandy.connectors.spark.task.dead_letters import delete_dead_letters_before, read_dead_letters, to_messages

        state, opts = self.state, self.state.options
        if opts.value_format is None:
            return []
        checkpoint_dir, checkpoint_id = opts.resolved_checkpoint_dir, metadata.checkpoint_id
        storage_options = state.storage_options()
        bad, skipped = read_dead_letters(checkpoint_dir, state.job_id, checkpoint_id, storage_options)
        delete_dead_letters_before(checkpoint_dir, state.job_id, checkpoint_id, storage_options)
        state.tombstones_skipped += skipped
        if bad.num_rows == 0:
            return []
        first = bad.slice(0, 1).to_pylist()[0]
        state.bad_records += bad.num_rows
        where = "published to " + opts.dead_letter_topic if opts.dead_letter_topic else "skipped"
        log.warning("checkpoint %d: %d bad record(s) %s; first: topic %s partition %d offset %d: %s: %s",
                    checkpoint_id, bad.num_rows, where, first["topic"], first["partition"], first["offset"],
                    first["error_class"], first["error_message"])
        if not opts.dead_letter_topic:
            return []
        state.dead_lettered += bad.num_rows
        return to_messages(bad, opts.dead_letter_topic, f"chandy-{state.job_id}")

    def stand_by(self) -> bool:
        """Join the job's election group and wait until this process leads (True) or is stopped
        (False). Nothing of the table or the log is read before: the active process changes them."""
        state, opts = self.state, self.state.options
        topics = ChandyTopics(opts.prefix)
        ensure_topics(kafka_config.admin_client(opts.bootstrap_servers, kafka_config.security_settings(opts.consumer_overrides)), topics)
        state.election = LeaderElection(opts.bootstrap_servers, topics, state.job_id,
                                        consumer_overrides=dict(opts.consumer_overrides), standby=True).join()
        log.warning("standby for job %s: waiting until the active coordinator stops (group %s)", state.job_id,
                    state.election.group_id)
        if state.election.wait_until_leader(stop=state.stop):
            return True
        state.election.close()
        return False

    def committed_records(self) -> int:
        """Records the lake committer committed since this attempt's coordinator started.

        Raises:
            ChandyError: the coordinator stopped.
        """
        self._last_committed = self.state.running().call_operator_coordinator(SINK_OPERATOR, lambda c: c.records_committed)
        return self._last_committed

    def safe_committed_records(self) -> int:
        """:meth:`committed_records`, or what it last said when the coordinator cannot answer (stopped, fenced)."""
        try:
            return self.committed_records()
        except Exception:  # noqa: BLE001 - a stopped (fenced) coordinator: what it last said
            return self._last_committed

    def release_savepoint_ranges(self, checkpoint_id: int) -> None:
        """An intermediate savepoint's ranges are read again by the next checkpoint (nobody is
        notified of a savepoint's completion, so nothing commits its offsets)."""
        self.state.enumerator_call(lambda e: e.release_ranges(checkpoint_id))

    def record_failure(self, reason: str) -> None:
        """Make the job FAILED in the log and on the events topic before the run exits (issue 36:
        Kafka gave up). The brokers may be the reason, so this waits 10 s at most, then says it
        could not."""
        try:
            self.state.running().fail_job(reason).result(10)
        except (ChandyError, concurrent.futures.TimeoutError) as exc:  # the run exits with its own error either way
            log.error("job %s: could not record FAILED (%s); the job's last status stays in the log", self.state.job_id,
                      root_cause(exc))

    def fenced_message(self) -> str:
        """:func:`fenced_message` of the running attempt's coordinator.

        Raises:
            PipelineKafkaError: Kafka is unreachable (see :func:`fenced_message`).
        """
        return fenced_message(self.state.options, self.state.job_id, self.state.running())

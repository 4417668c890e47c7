"""One run of the pipeline (a process) in the simulated world: the real
:class:`~chandy.coordinator.checkpoint_coordinator.CheckpointCoordinator`, with the real
:class:`~chandy.connectors.lake.committer.LakeCommitter` and
:class:`~chandy.connectors.kafka.source.enumerator.KafkaSourceEnumerator` as its operator
coordinators and the real :class:`~chandy.coordinator.kafka.log_writer.LogWriter` (its
transactions, its stuck-producer replacement) writing the coordinator log through
:class:`~tests.simulation.kafka.FakeProducer`, restarted from the log by the real
:func:`~chandy.coordinator.kafka.log.load_state`.

What is a thin stand-in here, each following the real code's steps in the real order:

- :class:`Process` runs ``CoordinatorService._start`` (``init_transactions``, load the log,
  refuse a terminated job, create the coordinator, start it on the mailbox within 60 s),
  ``_on_writer_failed`` / ``_halt`` (a fenced or failed writer stops the process, dropping its
  queued mails) and ``stop``; the reconciliation of ``Preflight.reconcile`` (chandy.connectors.spark.driver.preflight) (the table's
  offsets as the source's ``offset_floor``, checkpoint IDs above the table's); and the driver loop
  of ``Pipeline.run`` (lag, trigger, wait for the ranges, run the micro-batch, await the
  checkpoint, back off after a failure; a fenced or stopped coordinator ends the run, and the
  process exits). Not modelled: the preflight's rewind of a consumer group that is ahead of the
  table (the checker reports such a group as a violation instead), control requests, the
  election group (``still_leading`` is the schedule's choice: a fenced coordinator's own view of
  the election may be stale), savepoints and routing.
- the LogWriter runs without its thread: :meth:`SimLogWriter.step` is one turn of
  ``LogWriter._run`` around the real ``_commit``, and ``_send_offsets`` calls the producer in
  place of a watchdog thread (a hang longer than ``SEND_OFFSETS_STUCK_S`` raises the writer's own
  ``_ProducerStuck``, which the real ``_commit`` handles by replacing the producer).
- a Spark task writes one file of its ranges into the table's location and acknowledges the
  checkpoint with it (declining on its last attempt), as ``write_and_acknowledge``; its ack reaches
  every running coordinator of its prefix (the acks topic), as the AckReader delivers it.
"""

from __future__ import annotations

import concurrent.futures
import inspect
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from chandy.connectors.kafka.source import offsets as offsets_module
from chandy.connectors.kafka.source.enumerator import KafkaSourceCoordinatorProvider, KafkaSourceOptions
from chandy.connectors.kafka.source.reader import KafkaDataLossError
from chandy.connectors.lake.committer import LakeCommitterProvider
from chandy.connectors.lake.sink import SOURCE_METRICS_KIND, LakeCommitError, coordinator_log_id, offsets_to_json
from chandy.connectors.spark.options import SINK_OPERATOR, SOURCE_OPERATOR
from chandy.connectors.spark.pipeline import Pipeline
from chandy.coordinator.checkpoint_coordinator import CheckpointCoordinator
from chandy.coordinator.completed_checkpoint_store import CompletedCheckpointStore
from chandy.coordinator.environment import Batch, SourceOffsets
from chandy.coordinator.errors import ChandyError
from chandy.coordinator.failure import CheckpointException, CheckpointFailureReason
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka import log_writer as log_writer_module
from chandy.coordinator.kafka.log import load_state
from chandy.coordinator.kafka.log_writer import CoordinatorFencedError, LogWriter, transactional_id_for
from chandy.coordinator.kafka.topics import ChandyTopics, check_same_incarnation, log_incarnation
from chandy.coordinator.messages import AcknowledgeCheckpoint, DeclineCheckpoint, StateHandle
from chandy.coordinator.options import CheckpointingOptions
from chandy.coordinator.records import JobStatus
from chandy.coordinator.state import EpochClaim
from chandy.coordinator.storage import CheckpointStorage
from chandy.schemas.codec import SingleObjectCodec
from tests.simulation.kafka import SimCluster
from tests.simulation.kernel import CallTimedOut, Killed, Lane, World
from tests.simulation.table import SimSink, SimTable

JOB_ID = "5151a7e0c0ffee4a60a1b2c3d4e5f607"
GROUP_ID = f"chandy-{JOB_ID}"
BOOTSTRAP = "sim:9092"
CLUSTER_ID = "sim-cluster"
CHECKPOINT_TIMEOUT_MS = 60_000
#: the keyword arguments the runtime gives its LogWriter to prove, after replacing a stuck
#: producer, that no newer coordinator exists (issue 44, item 2), when this LogWriter has them
_PROVES_EPOCH = "newest_epoch" in inspect.signature(LogWriter.__init__).parameters
#: the proof compares the epoch records' owners and the log's key versions too (a mutation turns
#: that off: epoch numbers only, as before issue 44's simulation found the gap)
_PROVES_OWNER = True


def _as_proved(claim: EpochClaim) -> EpochClaim:
    return claim if _PROVES_OWNER else EpochClaim(claim.epoch, None)


class SimExecutor(concurrent.futures.Executor):
    """The I/O executor: each call is a work item of the process's I/O lane."""

    def __init__(self, lane: Lane) -> None:
        self.lane = lane

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
        future: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except Killed:
                raise
            except BaseException as exc:  # noqa: BLE001 - delivered through the future, as an executor does
                future.set_exception(exc)
            else:
                future.set_result(result)

        if not self.lane.submit(run, getattr(fn, "__name__", "io")):
            raise RuntimeError("cannot schedule new futures after shutdown")
        return future


class SimEnvironment:
    """The CoordinatorEnvironment of one process (what ``CoordinatorService`` provides)."""

    transactional_offsets = True

    def __init__(self, process: Process) -> None:
        self.process = process
        self.log_incarnation: str | None = None  # CoordinatorService.log_incarnation
        self.io_executor = SimExecutor(process.io)

    def now_ms(self) -> int:
        return self.process.world.now_ms()

    def execute(self, action: Callable[[], None]) -> None:
        self.process.mailbox.submit(action, getattr(action, "__name__", "mail"))

    def schedule(self, delay_ms: int, action: Callable[[], None]):
        return self.process.world.schedule(delay_ms, action, self.process.mailbox)

    def append(self, batch: Batch, on_committed: Callable[[], None] | None = None) -> None:
        if self.process.writer is not None:
            self.process.writer.submit(batch, on_committed)


class SimLogWriter(LogWriter):
    """The real LogWriter without its thread (see the module docstring)."""

    def __init__(self, process: Process, *args: Any, **kwargs: Any) -> None:
        self.process = process
        self._step_queued = False
        super().__init__(*args, **kwargs)

    def init(self, timeout_s: float = 60.0) -> None:
        self.producer.init_transactions(timeout_s)

    def submit(self, batch: Batch, on_committed: Callable[[], None] | None = None) -> None:
        super().submit(batch, on_committed)
        if self._queue and not self._step_queued and self.failed is None:
            self._step_queued = self.process.writer_lane.submit(self.step, "commit")

    def _produce(self, batch: Batch) -> None:
        super()._produce(batch)
        self.producer.note_batch(batch)

    def _send_offsets(self, committed: SourceOffsets) -> None:
        offsets = [TopicPartition(t, p, o) for t, p, o in committed.offsets]
        metadata = self._group_metadata(committed.group_id)
        producer = self.producer

        def send() -> None:
            try:
                producer.send_offsets_to_transaction(offsets, metadata, 30.0)
            except CallTimedOut:
                raise log_writer_module._ProducerStuck(
                    f"send_offsets_to_transaction did not return within {log_writer_module.SEND_OFFSETS_STUCK_S:.0f} s"
                ) from None

        self._call_retrying(send)

    def step(self) -> None:
        """One turn of ``LogWriter._run``: the queued batches in one transaction."""
        self._step_queued = False
        if not self._queue or self.failed is not None:
            return
        group, self._queue = self._queue, []
        try:
            self._commit(group)
        except Killed:
            raise
        except BaseException as exc:  # noqa: BLE001 - fenced or fatal: stop writing for good, as _run
            self.failed = exc
            self._queue.clear()
            self.on_fatal(exc)
            return
        self.transactions += 1
        for batch, _ in group:
            self._batch_versions.pop(id(batch), None)
        for _, on_committed in group:
            if on_committed is not None:
                self.post(on_committed)
        if self._queue and not self._step_queued:
            self._step_queued = self.process.writer_lane.submit(self.step, "commit")


def offsets_of(metadata: Any) -> Any:
    """The pipeline's own ``Pipeline.offsets_of`` (it reads nothing of the pipeline)."""
    return Pipeline.offsets_of(None, metadata)  # type: ignore[arg-type]


class Process:
    """One run of the pipeline (see the module docstring)."""

    def __init__(self, sim: Any, name: str, prefix: str, *, parallelism: int, starting_offsets: str,
                 max_records: int | None, task_attempts: int, thinks_it_leads: bool) -> None:
        self.sim = sim
        self.world: World = sim.world
        self.cluster: SimCluster = sim.cluster
        self.table: SimTable = sim.table
        self.name = name
        self.prefix = prefix
        self.topics = ChandyTopics(prefix)
        self.transactional_id = transactional_id_for(prefix, JOB_ID)
        self.parallelism = parallelism
        self.starting_offsets = starting_offsets
        self.max_records = max_records
        self.task_attempts = task_attempts
        self.thinks_it_leads = thinks_it_leads
        w = self.world
        self.mailbox = Lane(w, f"{name}.mailbox", self, on_error=self._on_mailbox_error)
        self.io = Lane(w, f"{name}.io", self, limit=4)
        self.writer_lane = Lane(w, f"{name}.writer", self)
        self.driver = Lane(w, f"{name}.driver", self)
        self.tasks = Lane(w, f"{name}.tasks", self, limit=parallelism)
        self.lanes = (self.mailbox, self.io, self.writer_lane, self.driver, self.tasks)
        self.env = SimEnvironment(self)
        self.log_id = coordinator_log_id(prefix, JOB_ID)  # with this run's log incarnation once started
        self.split_starts: dict[tuple[str, int], int] = {}  # the checker's: where this run's splits began
        self.sink = SimSink(self.table, name, prefix)
        #: the sinks of every table the job writes (the job's own and the routed ones), by URI
        self.sinks = {t.table_uri: SimSink(t, name, prefix) if t is not self.table else self.sink for t in sim.tables}
        self.storage = CheckpointStorage(sim.checkpoint_dir, JOB_ID, savepoint_dir=f"{sim.checkpoint_dir}/savepoints")
        self.writer: SimLogWriter | None = None
        self.cc: CheckpointCoordinator | None = None
        self.acks_open = False
        self.fenced = False
        self.stopped = False
        self.exited = False
        self.status = "starting"
        self.stop_reason: str | None = None
        self.completed = 0
        self.driver.submit(self.run, "run")

    def __repr__(self) -> str:
        return self.name

    # -- the runtime ------------------------------------------------------------------------------------
    @property
    def enumerator(self) -> Any:
        assert self.cc is not None
        return self.cc.holders[SOURCE_OPERATOR].coordinator

    @property
    def epoch(self) -> int:
        return self.cc.state.epoch if self.cc is not None else -1

    @property
    def producer_epoch(self) -> int | None:
        return self.writer.producer.epoch if self.writer is not None else None

    def _newest_epoch(self) -> tuple[EpochClaim, dict[Any, int]]:
        state, stats = load_state(BOOTSTRAP, self.topics.coordinator_log, JOB_ID, timeout_s=30.0)
        if not _PROVES_OWNER:  # whatever the log holds, as if this one's replay had found it
            return _as_proved(state.claim), dict(self.writer._replayed_versions) if self.writer is not None else {}
        return state.claim, stats.next_key_versions

    def _own_claim(self) -> EpochClaim:
        return _as_proved(self.cc.state.claim if self.cc is not None else EpochClaim(0, None))

    def _new_writer(self) -> SimLogWriter:
        extra: dict[str, Any] = {}
        if _PROVES_EPOCH:
            extra = {"epoch": self._own_claim, "newest_epoch": self._newest_epoch}
        return SimLogWriter(self, BOOTSTRAP, self.topics, JOB_ID, SingleObjectCodec(), self.transactional_id,
                            self.env.execute, self._on_writer_failed, {}, 1, retry_timeout_s=180.0,
                            still_leading=lambda: self.thinks_it_leads or self.sim.leads(self), **extra)

    def _on_writer_failed(self, exc: BaseException) -> None:
        self.world.note(f"{self.name}: log writer stopped: {exc}")
        if isinstance(exc, CoordinatorFencedError):
            self.fenced = True
        self.stop_reason = str(exc)
        self._fail_pending(exc)
        self._halt()

    def _fail_pending(self, exc: BaseException) -> None:
        cc = self.cc
        if cc is None:
            return
        futures = [p.result for p in list(cc.pending.values())]
        futures += [request.future for request in cc.decider.queued]
        futures += list(cc.deciding)
        for future in futures:
            if not future.done():
                try:
                    future.set_exception(exc)
                except concurrent.futures.InvalidStateError:
                    pass

    def _on_mailbox_error(self, exc: BaseException) -> None:
        self.world.note(f"{self.name}: mailbox action failed: {type(exc).__name__}: {exc}")
        self.stop_reason = f"{type(exc).__name__}: {exc}"
        self._halt()

    def _halt(self) -> None:
        self.acks_open = False
        self.mailbox.close(discard=True)
        self.io.close(discard=True)
        self.stopped = True
        self.status = "halted"

    def _on_job_status(self, status: Any, reason: str | None) -> None:
        self.world.note(f"{self.name}: job {status}: {reason}")

    def mailbox_call(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except Killed:
                raise
            except BaseException as exc:  # noqa: BLE001 - delivered to the caller
                future.set_exception(exc)

        if not self.mailbox.submit(run, "call"):
            future.set_exception(ChandyError(f"{self.name}'s mailbox is closed"))
        return future

    def wait(self, condition: Callable[[], bool], timeout_ms: int) -> bool:
        """Park the driver until ``condition`` holds (True) or ``timeout_ms`` passed (False)."""
        deadline = self.world.now + timeout_ms
        while not condition():
            if self.world.now >= deadline:
                return False
            self.world.park(until=deadline, condition=condition)
        return True

    def stop(self) -> None:
        """``CoordinatorService.stop``: shut the coordinator down (writing its aborts unless
        fenced), close the mailbox, let the writer commit what is queued, let the I/O finish."""
        if self.stopped:
            return
        self.status = "stopping"
        if self.cc is not None and not self.fenced:
            done = self.mailbox_call(self.cc.shutdown)
            self.wait(done.done, 30_000)
        self.acks_open = False
        self.mailbox.close(discard=False)
        self.wait(lambda: self.mailbox.idle() and self.writer_lane.idle()
                  and (self.writer is None or not self.writer._queue or self.writer.failed is not None), 30_000)
        self.io.close(discard=False)
        self.wait(self.io.idle, 600_000)
        self.stopped = True

    def exit(self) -> None:
        """The process ends: whatever still runs in it dies with it."""
        if self.exited:
            return
        self.exited = True
        self.acks_open = False
        self.status = "exited" if self.status != "killed" else "killed"
        for lane in self.lanes:
            self.world.kill_lane(lane)
        self.world.note(f"{self.name}: exited ({self.stop_reason or 'no reason'})")

    def kill(self) -> None:
        """SIGKILL."""
        self.status = "killed"
        self.stop_reason = self.stop_reason or "killed"
        self.exit()

    # -- the driver ------------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            if self._start():
                self._loop()
        except Killed:
            raise
        except ChandyError as exc:  # the run stops cleanly (Pipeline.run's finally: service.stop())
            self.stop_reason = self.stop_reason or f"{type(exc).__name__}: {exc}"
            self.stop()
        except (TimeoutError, KafkaException) as exc:  # escapes the run: the process dies with a traceback
            self.stop_reason = self.stop_reason or f"{type(exc).__name__}: {exc}"
        self.exit()

    def _reconcile(self) -> tuple[dict, int | None]:
        """``Preflight.reconcile`` (chandy.connectors.spark.driver.preflight): the table's offsets and checkpoint ID floor."""
        progress = self.sink.progress(JOB_ID)
        if progress.checkpoint_id is None:
            return {}, None
        state, _ = load_state(BOOTSTRAP, self.topics.coordinator_log, JOB_ID, timeout_s=60)
        completed = state.completed(savepoints=False)
        latest = completed[-1].checkpoint_id if completed else None
        if latest is None or latest < progress.checkpoint_id:
            self.world.note(f"{self.name}: the log ends at checkpoint {latest}, the table holds "
                            f"{progress.checkpoint_id}: resuming from the table's offsets")
        return dict(progress.offsets), progress.checkpoint_id + 1

    def _start(self) -> bool:
        """``JobCoordinator.start`` (chandy.connectors.spark.driver.coordinator) and ``CoordinatorService._start``; False: the run ends."""
        floor, id_floor = self._reconcile()
        initializer = {"earliest": offsets_module.earliest(), "latest": offsets_module.latest()}[self.starting_offsets]
        source = KafkaSourceOptions(BOOTSTRAP, topics=(self.cluster.source_topic,), group_id=GROUP_ID,
                                    starting_offsets=initializer, max_records_per_checkpoint=self.max_records,
                                    offset_floor=floor, fail_on_data_loss=True, sink_holds_offsets=True)
        # the log's incarnation before its replay, as CoordinatorService._start asks it
        incarnation = log_incarnation(kafka_config.admin_client(BOOTSTRAP), self.topics.coordinator_log, timeout_s=60.0)
        self.env.log_incarnation = incarnation.topic_id
        self.log_id = coordinator_log_id(self.prefix, JOB_ID, incarnation.topic_id)  # what TaskOptions.log_id carries
        self.writer = self._new_writer()
        self.writer.init(60.0)  # fences older coordinators of this job
        state, stats = load_state(BOOTSTRAP, self.topics.coordinator_log, JOB_ID, timeout_s=60.0)
        check_same_incarnation(kafka_config.admin_client(BOOTSTRAP), self.topics.coordinator_log, incarnation, timeout_s=60.0)
        self.writer.seed_key_versions(stats.next_key_versions)
        restore_from = None
        if state.job_status.is_terminal:
            # CoordinatorService refuses a terminated job; the operator then restores its latest
            # checkpoint (--from-savepoint, as the refusal says), or can do nothing
            latest = CompletedCheckpointStore.latest(state)
            if latest is None or not latest.external_pointer:
                self.stop_reason = f"job {state.job_status.value}, nothing to restore"
                return False
            restore_from = latest.external_pointer
        options = CheckpointingOptions(interval_ms=0, timeout_ms=CHECKPOINT_TIMEOUT_MS, max_concurrent=1,
                                       tolerable_failed=3, num_retained=2, checkpoint_dir=self.sim.checkpoint_dir,
                                       savepoint_dir=f"{self.sim.checkpoint_dir}/savepoints",
                                       wait_for_running_subtasks=False)
        self.cc = CheckpointCoordinator(
            JOB_ID, options, self.env, self.storage, {SINK_OPERATOR: self.parallelism},
            coordinator_providers=[
                LakeCommitterProvider(SINK_OPERATOR, self.sink, self.storage, offsets_of=offsets_of,  # type: ignore[arg-type]
                                      cluster_id=CLUSTER_ID, log_id=coordinator_log_id(self.prefix, JOB_ID),
                                      open_table=self.sinks.__getitem__ if len(self.sinks) > 1 else None,
                                      changes=self.sim.config.cdc),
                KafkaSourceCoordinatorProvider(SOURCE_OPERATOR, source, parallelism=self.parallelism)],
            state=state, transactional_id=self.transactional_id, on_job_status=self._on_job_status,
            coordinator_id=self.name)
        self.acks_open = True  # acks from now on are ours (the reader is positioned at the end)
        self.storage.initialize_base_locations()
        cc = self.cc
        started = self.mailbox_call(lambda: cc.start(restore_from=restore_from, checkpoint_id_floor=id_floor))
        if not self.wait(started.done, 60_000):
            raise TimeoutError(f"{self.name}: the coordinator did not start within 60 s")
        started.result()  # ChandyError: the run stops
        self.status = "running"
        self.world.note(f"{self.name}: started (epoch {cc.state.epoch}, producer epoch {self.producer_epoch}, "
                        f"next checkpoint {cc.state.next_checkpoint_id})")
        if not self.wait(lambda: self.stopped or bool(self.enumerator.splits), 60_000):
            raise ChandyError("partition discovery found no partitions within 60 s")
        # where this run's splits begin (discovered, restored or from the table), kept after it exits
        self.split_starts = {tp: split.starting_offset for tp, split in self.enumerator.splits.items()}
        return not self.stopped

    def lag(self) -> int:
        ends = dict(self.enumerator.committed_end)
        return sum(max(0, self.cluster.source_end[tp] - start) for tp, start in ends.items())

    def _loop(self) -> None:
        cc = self.cc
        assert cc is not None
        consecutive = 0
        while True:
            if self.fenced or self.stopped:
                return
            if cc.state.job_status is JobStatus.FAILED:
                raise ChandyError(f"job {JOB_ID} failed: {cc.state.job_status_reason}")
            if self.lag() == 0:
                self.wait(lambda: self.fenced or self.stopped or self.lag() > 0, 10_000)
                continue
            triggered = self.mailbox_call(cc.trigger_checkpoint)
            if not self.wait(lambda triggered=triggered: triggered.done() or self.stopped, 30_000) or self.stopped:
                continue
            trigger = triggered.result()
            checkpoint_id = trigger.checkpoint_id or -1
            future = trigger.future
            if not self.wait(lambda n=checkpoint_id, f=future: bool(self.enumerator.ranges_of(n)) or f.done()
                             or self.stopped, CHECKPOINT_TIMEOUT_MS):
                raise ChandyError(f"the offset ranges of checkpoint {checkpoint_id} were not fixed in time")
            ranges = self.enumerator.ranges_of(checkpoint_id)
            if ranges:
                self._micro_batch(checkpoint_id, ranges)
            if not self.wait(lambda f=future: f.done() or self.fenced or self.stopped, CHECKPOINT_TIMEOUT_MS + 10_000):
                raise TimeoutError(f"checkpoint {checkpoint_id} did not end in time")
            if not future.done():
                continue  # fenced or stopped: the loop's first check ends the run
            error = future.exception()
            if error is None:
                self.completed += 1
                consecutive = 0
                continue
            if isinstance(error, CoordinatorFencedError):
                return
            if not isinstance(error, CheckpointException):
                raise ChandyError(f"checkpoint {checkpoint_id}: {error}")
            consecutive += 1
            self.world.park(until=self.world.now + min(60_000, 1_000 * 2 ** (consecutive - 1)),
                            condition=lambda: self.fenced or self.stopped)

    def _micro_batch(self, checkpoint_id: int, ranges: dict) -> None:
        """The Spark job: one task per subtask; a failed task (its last attempt) aborts the checkpoint."""
        assignment = self.enumerator.assignment()
        epoch = self.epoch
        results: dict[int, bool] = {}
        for subtask in range(self.parallelism):
            mine = tuple((s.topic, s.partition, ranges[s.topic_partition].starting_offset,
                          ranges[s.topic_partition].stopping_offset)
                         for s in assignment.get(subtask, []) if s.topic_partition in ranges
                         and ranges[s.topic_partition].num_records > 0)
            self.tasks.submit(lambda subtask=subtask, mine=mine: results.__setitem__(
                subtask, self._task(checkpoint_id, epoch, subtask, mine)), f"task-{checkpoint_id}-{subtask}")
        self.wait(lambda: len(results) == self.parallelism or self.stopped, CHECKPOINT_TIMEOUT_MS)
        if self.stopped or all(results.values()):
            return
        cc = self.cc
        assert cc is not None
        aborted = self.mailbox_call(lambda: cc.abort_checkpoint(
            checkpoint_id, CheckpointFailureReason.CHECKPOINT_DECLINED, "Spark job failed"))
        self.wait(aborted.done, 30_000)

    def _source_metrics(self, ranges: tuple) -> tuple[StateHandle, ...]:
        """The task's ``source-metrics`` handle (``SubtaskSourceMetrics.state_handle``): per
        partition read, the Kafka timestamp of its newest record read (none when nothing was)."""
        times = self.cluster.source_times
        read = {(topic, partition): times[(topic, partition)][end - 1]
                for topic, partition, start, end in ranges if end > start}
        if not read:
            return ()
        return (StateHandle(SOURCE_METRICS_KIND, None, None, 0, {
            "event_time_ms": str(max(read.values())), "fetch_time_ms": str(self.world.now_ms()),
            "partition_event_time_ms": offsets_to_json(read)}),)

    def _task(self, checkpoint_id: int, epoch: int, subtask: int, ranges: tuple) -> bool:
        """``write_and_acknowledge`` for each attempt Spark gives the task."""
        log_id = self.log_id  # TaskOptions.log_id, fixed when the checkpoint's tasks were made
        for attempt in range(self.task_attempts):
            try:
                gone = [(t, p, s) for t, p, s, e in ranges if e > s and s < self.cluster.source_start[(t, p)]]
                if gone:  # KafkaRangeReader: OFFSET_OUT_OF_RANGE below the log start fails the task (failOnDataLoss)
                    raise KafkaDataLossError(f"offsets of {gone} are no longer in Kafka")
                files = []
                for table in self.sim.tables:  # the routed tables' files carry their table (DataFile.table_uri)
                    mine = tuple(r for r in ranges if self.sim.table_of(r[1]) is table)
                    routed = None if table is self.table else table.table_uri
                    files += self.sinks[table.table_uri].write_ranges(JOB_ID, checkpoint_id, subtask, attempt, mine,
                                                                      table_uri=routed, log_id=log_id)
                ack = AcknowledgeCheckpoint(JOB_ID, epoch, checkpoint_id, SINK_OPERATOR, subtask, attempt,
                                            (*(f.to_state_handle() for f in files), *self._source_metrics(ranges)))
                self.world.call("ack.send", lambda ack=ack: self.sim.deliver(self.prefix, ack),
                                lambda: ChandyError("sending the ack failed"), allowed=("ok", "fail", "fail_after", "delay"))
                return True
            except (ChandyError, LakeCommitError):
                if attempt + 1 >= self.task_attempts:
                    decline = DeclineCheckpoint(JOB_ID, epoch, checkpoint_id, SINK_OPERATOR, subtask, attempt,
                                                CheckpointFailureReason.CHECKPOINT_DECLINED.value, "task failed")
                    try:
                        self.world.call("ack.send", lambda decline=decline: self.sim.deliver(self.prefix, decline),
                                        lambda: ChandyError("sending the decline failed"), allowed=("ok", "fail"))
                    except ChandyError:
                        pass
        return False

    def receive(self, message: Any) -> None:
        """The AckReader's dispatch of one message, on the mailbox."""
        cc = self.cc
        if cc is None:
            return
        if isinstance(message, AcknowledgeCheckpoint):
            cc.receive_acknowledge(message)
        elif isinstance(message, DeclineCheckpoint):
            cc.receive_decline(message)


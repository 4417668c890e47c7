"""The coordinator runtime over Kafka: mailbox, transactional log writer, ack reader, recovery.

:class:`CoordinatorService` is what a user starts for a job. Starting it:

1. creates/checks Chandy's topics;
2. opens a transactional producer with ``transactional.id = <prefix>-coordinator-<job id>``
   and calls ``init_transactions()``: this fences every older coordinator of the job (their
   next transactional write fails and they stop) and aborts their open transaction;
3. replays ``<prefix>.coordinator-log`` to its end (read_committed): the state;
4. starts the ack reader at the current end of ``<prefix>.acks``;
5. starts the :class:`~chandy.coordinator.checkpoint_coordinator.CheckpointCoordinator` on the
   mailbox (new epoch, abort leftovers, restore the latest completed checkpoint, notify it);
6. starts periodic checkpoints.

Every state transition runs on the mailbox thread; Kafka writes run on the log writer thread,
storage and hook I/O on an executor, and both report back through the mailbox. The log writer
commits each batch (log records, control messages, public events) in one Kafka transaction, in
order, grouping the batches queued meanwhile into one transaction. A fenced or fatally failed
writer stops the service: nothing more is written.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from chandy.coordinator.checkpoint_coordinator import CheckpointCoordinator
from chandy.coordinator.completed_checkpoint_store import CompletedCheckpointStore
from chandy.coordinator.environment import Batch, Mailbox
from chandy.coordinator.errors import ChandyError
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.ack_reader import AckReader
from chandy.coordinator.kafka.election import LeaderElection, election_group, group_has_members
from chandy.coordinator.kafka.log import LoadStats, load_state
from chandy.coordinator.kafka.log_writer import CoordinatorFencedError, LogWriter, transactional_id_for
from chandy.coordinator.kafka.metrics import CheckpointMetricsCollector, MetricScope, MetricsServer
from chandy.coordinator.kafka.requests import RequestExecutor, RequestHandler
from chandy.coordinator.kafka.service_errors import CoordinatorStoppedError, JobTerminatedError, RestoreTimeoutError
from chandy.coordinator.kafka.topics import ChandyTopics, check_same_incarnation, ensure_topics, log_incarnation
from chandy.coordinator.messages import (
    AcknowledgeCheckpoint,
    DeclineCheckpoint,
    OperatorEventMessage,
    SubtaskAttemptFailed,
    SubtaskAttemptReady,
)
from chandy.coordinator.operator_coordinator import OperatorCoordinatorProvider
from chandy.coordinator.options import CheckpointingOptions
from chandy.coordinator.records import LogKey
from chandy.coordinator.state import CoordinatorState, EpochClaim
from chandy.coordinator.stats import CheckpointStats
from chandy.coordinator.storage import CheckpointStorage
from chandy.coordinator.trigger_result import CheckpointTriggerResult
from chandy.schemas.codec import Codec, SingleObjectCodec

#: the log writer's and the ack reader's names stay importable from here, where they were defined
__all__ = ["AckReader", "CoordinatorFencedError", "CoordinatorService", "CoordinatorStoppedError", "JobTerminatedError",
           "LogWriter", "RestoreTimeoutError", "transactional_id_for"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

#: while :meth:`CoordinatorService.start` waits for the coordinator's start (its restore), a line
#: every this many seconds says how long it has run and what it is doing
RESTORE_PROGRESS_INTERVAL_S = 30.0



class CoordinatorService:
    """One job's checkpoint coordinator on Kafka (see the module docstring).

    Args:
        job_id: the job's ID (a 32-hex string like Flink's JobID is conventional).
        bootstrap_servers: Kafka ``bootstrap.servers``.
        options: checkpointing options (``checkpoint_dir`` is required).
        operators: operator ID -> parallelism of the operators whose subtasks acknowledge.
        coordinator_providers: operator coordinators to host.
        master_hooks: master hooks to register (duplicates by identifier are dropped).
        listeners: checkpoint listeners.
        prefix: topic prefix (default ``chandy``).
        restore_from: a savepoint/checkpoint pointer to start from when the log has no checkpoint.
        allow_non_restored_state: skip state for operators or hooks this job lacks.
        schema_registry: ``SchemaRegistryClient`` settings for the Confluent wire format.
        producer_overrides / consumer_overrides: librdkafka settings under their own names.
        storage_options: fsspec options for the checkpoint storage, or a function that gives them
            (:class:`~chandy.coordinator.storage.CheckpointStorage`).
        dead_letter_topic: where undecodable acks are copied, if set.
        completion_outputs: messages to publish in each checkpoint's completion transaction
            (see :class:`~chandy.coordinator.checkpoint_coordinator.CheckpointCoordinator`).
        checkpoint_id_floor: the next checkpoint ID is at least this (Flink's
            ``CheckpointIDCounter.setCount``), written to the log at start.
        metrics_port: serve Prometheus metrics (Flink's checkpoint metric names, see
            :mod:`chandy.coordinator.kafka.metrics`) on this port from :meth:`start` to :meth:`stop`;
            0 picks a free port (read :attr:`metrics_server`), None (default) serves none.
        metrics_address: the address the metrics server binds (default all interfaces).
        metrics_scope: the metrics' job name, task name and whether Chandy 0.1's bare names are
            served too (default: the job ID as its name, Flink's names only).
        standby: :meth:`start` first waits until this process leads the job's election group
            (a standby that takes over when the active coordinator dies; see
            :mod:`chandy.coordinator.kafka.requests`).
        accept_requests: join the election group and apply control requests from
            ``<prefix>.requests`` (default True).
        request_executor: applies accepted requests (default: directly on the coordinator,
            :func:`~chandy.coordinator.kafka.requests.default_executor`).
        election: an election already joined (a pipeline that stood by before starting);
            the service then closes it on :meth:`stop`.
        retry_timeout_s: how long the coordinator log's transactions retry retriable errors (a
            broker's death, a leader election) before the coordinator stops (default 180 s).
        restart_strategy: the host applies a restart strategy: a global failure (a failing
            operator coordinator, more failed checkpoints than tolerated) is not recorded as
            FAILED but sets :attr:`failover_reason`; the host stops this service and restarts the
            job, or records FAILED with :meth:`fail_job` once its strategy gives up.
    """

    def __init__(
        self,
        job_id: str,
        bootstrap_servers: str,
        options: CheckpointingOptions,
        operators: Mapping[str, int],
        *,
        coordinator_providers: Iterable[OperatorCoordinatorProvider] = (),
        master_hooks: Iterable[Any] = (),
        listeners: Iterable[Any] = (),
        prefix: str = "chandy",
        restore_from: str | None = None,
        allow_non_restored_state: bool = False,
        schema_registry: Mapping[str, Any] | None = None,
        producer_overrides: Mapping[str, Any] | None = None,
        consumer_overrides: Mapping[str, Any] | None = None,
        storage_options: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
        dead_letter_topic: str | None = None,
        io_threads: int = 4,
        completion_outputs: Callable[[Any], Any] | None = None,
        checkpoint_id_floor: int | None = None,
        metrics_port: int | None = None,
        metrics_address: str = "0.0.0.0",
        metrics_scope: MetricScope | None = None,
        standby: bool = False,
        accept_requests: bool = True,
        request_executor: RequestExecutor | None = None,
        election: LeaderElection | None = None,
        retry_timeout_s: float = 180.0,
        restart_strategy: bool = False,
    ) -> None:
        if not options.checkpoint_dir:
            raise ChandyError("a checkpoint directory (state.checkpoints.dir) is required")
        from chandy.schemas.codec import codec_for

        self.job_id = job_id
        self.bootstrap_servers = bootstrap_servers
        self.options = options
        self.operators = dict(operators)
        self.topics = ChandyTopics(prefix)
        self.transactional_id = transactional_id_for(prefix, job_id)
        self.codec: Codec = codec_for(schema_registry) if schema_registry else SingleObjectCodec()
        self._providers = list(coordinator_providers)
        self._hooks = list(master_hooks)
        self._listeners = list(listeners)
        self._restore_from = restore_from
        self._allow_non_restored_state = allow_non_restored_state
        self._producer_overrides = dict(producer_overrides or {})
        self._consumer_overrides = dict(consumer_overrides or {})
        self._dead_letter_topic = dead_letter_topic
        self._completion_outputs = completion_outputs
        self._checkpoint_id_floor = checkpoint_id_floor
        self.storage = CheckpointStorage(options.checkpoint_dir, job_id, savepoint_dir=options.savepoint_dir,
                                         storage_options=storage_options)
        self.io_executor = concurrent.futures.ThreadPoolExecutor(io_threads, thread_name_prefix=f"chandy-io-{job_id[:8]}")
        self.mailbox = Mailbox(f"chandy-mailbox-{job_id[:8]}", on_error=self._on_mailbox_error)
        self.stopped = threading.Event()
        self.fenced = threading.Event()
        self.stop_reason: BaseException | str | None = None
        self.job_status: str | None = None
        self._restart_strategy = restart_strategy
        #: the reason of a global failure the host's restart strategy decides (``restart_strategy``)
        self.failover_reason: str | None = None
        self.load_stats: LoadStats | None = None
        #: the coordinator log topic's Kafka topic ID when this run started (a log lost, deleted
        #: and created again, has another): operator coordinators read it through their context
        #: (``OperatorCoordinatorContext.log_incarnation``); None before the start
        self.log_incarnation: str | None = None
        self.coordinator: CheckpointCoordinator | None = None
        self._writer: LogWriter | None = None
        self._acks: AckReader | None = None
        self._metrics_port = metrics_port
        self._retry_timeout_s = retry_timeout_s
        self._metrics_address = metrics_address
        self._metrics_scope = metrics_scope or MetricScope(job_id)
        self.metrics_server: MetricsServer | None = None
        self._standby = standby
        self._accept_requests = accept_requests
        self._request_executor = request_executor
        self.election: LeaderElection | None = election
        self.requests: RequestHandler | None = None

    # -- CoordinatorEnvironment ------------------------------------------------------------------
    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def execute(self, action: Callable[[], None]) -> None:
        self.mailbox.execute(action)

    def schedule(self, delay_ms: int, action: Callable[[], None]):
        return self.mailbox.schedule(delay_ms, action)

    #: offset commits go into the coordinator log's transactions (``Batch.source_offsets``)
    transactional_offsets = True

    def append(self, batch: Batch, on_committed: Callable[[], None] | None = None) -> None:
        if self._writer is not None:
            self._writer.submit(batch, on_committed)

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, *, periodic: bool = True, timeout_s: float = 60.0,
              restore_timeout_s: float | None = None) -> CoordinatorService:
        """Start (the numbered steps of the module docstring). Returns self.

        ``timeout_s`` (seconds) bounds each Kafka step of the start (the topics, the producer's
        ``init_transactions``, the log's replay, the ack reader's assignment). The coordinator's own
        start in step 5, whose restore runs every operator coordinator's ``reset_to_checkpoint``
        (the lake committer's commit of the restored checkpoint and its cleanup grow with the
        table), is bounded only by ``restore_timeout_s`` (seconds; None, the default: no bound, as
        Flink puts none on ``resetToCheckpoint``); a line every ``RESTORE_PROGRESS_INTERVAL_S``
        (30 s) says how long it has run and what it is doing.

        Raises:
            TopicError: the topics are missing and cannot be created, or the log is not compacted.
            RestoreError, MetadataFormatError, CheckpointPointerError: nothing restorable.
            MetricsError: ``metrics_port`` cannot be bound (checked first).
            RestoreTimeoutError: the coordinator's start outlasted ``restore_timeout_s``; the
                service stopped (see :meth:`_wait_started`).
            CoordinatorStoppedError: the service stopped while the coordinator started.
        """
        if self._metrics_port is not None and self.metrics_server is None:
            self.metrics_server = MetricsServer(self._metrics_port, self._metrics_address)
            self.metrics_server.register(CheckpointMetricsCollector(
                self._metrics_scope, lambda: self._call(lambda cc: cc.stats.to_json(), timeout_s=5.0), self.operators,
                read_epoch=lambda: self.epoch, read_status=self._status_for_metrics))
        try:
            return self._start(periodic=periodic, timeout_s=timeout_s, restore_timeout_s=restore_timeout_s)
        except BaseException:
            self._close_metrics()
            raise

    def _start(self, *, periodic: bool, timeout_s: float, restore_timeout_s: float | None = None) -> CoordinatorService:
        # the same principal as the log writer and the ack reader (security.protocol, sasl.*, ssl.*)
        admin = kafka_config.admin_client(self.bootstrap_servers, kafka_config.security_settings(self._consumer_overrides))
        ensure_topics(admin, self.topics)
        predecessor = False
        if self.election is None and (self._accept_requests or self._standby):
            # a predecessor (a dead coordinator, until its session times out) keeps the group
            # non-empty, so `chandy job ...` finds the job running while this process joins
            predecessor = group_has_members(admin, election_group(self.topics.prefix, self.job_id), timeout_s)
            self.election = LeaderElection(self.bootstrap_servers, self.topics, self.job_id,
                                           consumer_overrides=self._consumer_overrides, codec=self.codec,
                                           standby=self._standby).join()
        if self._standby and self.election is not None:
            log.info("job %s: standing by until this process leads group %s", self.job_id, self.election.group_id)
            if not self.election.wait_until_leader(stop=self.stopped):
                raise CoordinatorStoppedError(f"the standby coordinator of job {self.job_id} stopped before leading")
        # the log's incarnation, before its replay: what this run replays and writes is that topic's
        incarnation = log_incarnation(admin, self.topics.coordinator_log, timeout_s=timeout_s)
        self.log_incarnation, log_partitions = incarnation.topic_id, incarnation.partitions
        self._writer = LogWriter(self.bootstrap_servers, self.topics, self.job_id, self.codec, self.transactional_id,
                                 self.mailbox.execute, self._on_writer_failed, self._producer_overrides, log_partitions,
                                 retry_timeout_s=self._retry_timeout_s, still_leading=self._still_leading,
                                 epoch=lambda: self._state().claim, newest_epoch=self._newest_epoch)
        self._writer.init(timeout_s)  # fences older coordinators of this job
        state, load_stats = load_state(self.bootstrap_servers, self.topics.coordinator_log, self.job_id,
                                       codec=self.codec, consumer_overrides=self._consumer_overrides,
                                       timeout_s=timeout_s)
        self.load_stats = load_stats
        # the same incarnation after the replay: one lost (deleted and created again) meanwhile
        # was not the log that was replayed, and its coordinators' checkpoint IDs are unknown here
        check_same_incarnation(admin, self.topics.coordinator_log, incarnation, timeout_s=timeout_s)
        self._writer.seed_key_versions(load_stats.next_key_versions)
        log.info("job %s: replayed %d log records in %.2f s (epoch %d, next checkpoint %d)", self.job_id,
                 load_stats.applied, load_stats.seconds, state.epoch, state.next_checkpoint_id)
        if state.job_status.is_terminal and (self._standby or self._restore_from is None):
            # the job was canceled, stopped with a savepoint or failed: it does not run again (Flink's
            # HA does not restart a globally terminated job; a new submission restores a savepoint)
            ended = f"job {self.job_id} ended ({state.job_status.value}: {state.job_status_reason or 'no reason given'})"
            latest = CompletedCheckpointStore.latest(state)
            pointer = (f"PATH (a savepoint or retained checkpoint; the latest: {latest.external_pointer})"
                       if latest is not None and latest.external_pointer else "PATH (a savepoint or retained checkpoint)")
            why = (f"{ended}; the standby does not restart it" if self._standby else
                   f"{ended}; a finished, canceled or failed job does not run again: restore it with "
                   f"--from-savepoint {pointer} or start a new job with --job-id")
            self.stop()
            raise JobTerminatedError(why, state.job_status.value)
        coordinator = self.coordinator = CheckpointCoordinator(
            self.job_id, self.options, self, self.storage, self.operators,
            coordinator_providers=self._providers, state=state, transactional_id=self.transactional_id,
            on_job_status=self._on_job_status, completion_outputs=self._completion_outputs,
            job_name=self._metrics_scope.job_name, on_failover=self._on_failover if self._restart_strategy else None,
        )
        for hook in self._hooks:
            coordinator.add_master_hook(hook)
        for listener in self._listeners:
            coordinator.add_listener(listener)
        self._acks = AckReader(self.bootstrap_servers, self.topics, self.job_id, self.codec, self._dispatch,
                               self._consumer_overrides, self._dead_letter_topic)
        self._acks.assign(timeout_s)  # acks from now on are ours, but are read only once started
        self.storage.initialize_base_locations()
        self.mailbox.start()
        started = self.mailbox.call(lambda: coordinator.start(
            restore_from=self._restore_from, allow_non_restored_state=self._allow_non_restored_state,
            checkpoint_id_floor=self._checkpoint_id_floor))
        self._wait_started(started, restore_timeout_s)
        self._acks.start()
        if self.election is not None and self._accept_requests:
            self.requests = RequestHandler(coordinator, self.mailbox.execute, self._request_executor)
            self.election.attach(self.requests.submit)
            self.election.coordinator_epoch = lambda: self.epoch  # a lost election compares the log's epoch with ours
            # a new group answers a join at once; with a predecessor the first rebalance waits for
            # its session to time out (ELECTION_SESSION_TIMEOUT_MS), which checkpoints need not wait
            # for: requests sent meanwhile are read from the group's committed offset once joined
            if not predecessor and not self.election.joined.wait(timeout_s):
                log.warning("job %s: not yet a member of group %s after %.0f s; control requests wait",
                            self.job_id, self.election.group_id, timeout_s)
        if periodic:
            self.mailbox.execute(coordinator.start_periodic_scheduler)
        return self

    def _wait_started(self, started: concurrent.futures.Future, restore_timeout_s: float | None) -> None:
        """Wait for the coordinator's start on the mailbox (its restore) up to ``restore_timeout_s``
        seconds (None: no bound), logging every ``RESTORE_PROGRESS_INTERVAL_S`` seconds how long
        it has run and what the mailbox thread is doing (:meth:`Mailbox.activity`).

        Raises:
            RestoreTimeoutError: the time ran out. The service stops first, as a fenced one does
                (:meth:`_halt`), and its log writer commits what it was given and closes: nothing
                more is written. The restore itself, a call on the mailbox thread, cannot be
                interrupted: it goes on in the background until it ends or the process exits.
            CoordinatorStoppedError: the service stopped meanwhile (fenced, or its log writer failed).
        """
        began = time.monotonic()
        while True:
            elapsed = time.monotonic() - began
            wait_s = RESTORE_PROGRESS_INTERVAL_S
            if restore_timeout_s is not None:
                wait_s = min(wait_s, max(0.0, restore_timeout_s - elapsed))
            try:
                started.result(wait_s)
                if elapsed >= RESTORE_PROGRESS_INTERVAL_S:
                    log.info("job %s: the coordinator started (its restore took %.0f s)", self.job_id,
                             time.monotonic() - began)
                return
            except concurrent.futures.TimeoutError:
                pass
            elapsed = time.monotonic() - began
            if self.stopped.is_set():
                raise CoordinatorStoppedError(f"the coordinator of job {self.job_id} stopped while it started "
                                              f"({self.stop_reason})")
            if restore_timeout_s is not None and elapsed >= restore_timeout_s:
                error = RestoreTimeoutError(
                    f"job {self.job_id}: the coordinator's start (its restore) did not finish within "
                    f"{restore_timeout_s:.0f} s; it was in {self.mailbox.activity()}. The coordinator stopped; "
                    "start the job again with a larger restore timeout, or none")
                log.error("%s", error)
                self.stop_reason = error
                self._halt(mailbox_wait_s=0.0)  # the mailbox thread is busy with the restore
                if self._writer is not None:
                    self._writer.close(5.0)
                raise error
            log.info("job %s: the coordinator's start (its restore) has run %.0f s; it is in %s", self.job_id,
                     elapsed, self.mailbox.activity())

    def _dispatch(self, messages: list[Any]) -> None:
        """Post a batch of decoded acks-topic messages to the mailbox as one action; each is
        handled in order as Flink's ``receiveAcknowledgeMessage`` / ``receiveDeclineMessage`` /
        ... would be, and an unknown type is logged and skipped."""
        cc = self.coordinator
        if cc is None:  # the ack reader starts after the coordinator exists
            return
        handlers: dict[type, Callable[[Any], Any]] = {
            AcknowledgeCheckpoint: cc.receive_acknowledge,
            DeclineCheckpoint: cc.receive_decline,
            SubtaskAttemptReady: cc.attempt_ready,
            SubtaskAttemptFailed: cc.attempt_failed,
            OperatorEventMessage: cc.receive_operator_event,
        }

        def handle() -> None:
            for message in messages:
                handler = handlers.get(type(message))
                if handler is None:
                    log.warning("ignoring %s on the acks topic", type(message).__name__)
                    continue
                handler(message)

        self.mailbox.execute(handle)

    def _on_writer_failed(self, exc: BaseException) -> None:
        log.error("job %s: coordinator log writer stopped (%s); this coordinator stops", self.job_id, exc)
        if isinstance(exc, CoordinatorFencedError):
            self.fenced.set()  # a newer coordinator leads; anything else (Kafka gone too long) only stops this one
        self.stop_reason = exc
        self._fail_pending(exc)
        threading.Thread(target=self._halt, name="chandy-halt", daemon=True).start()

    def _fail_pending(self, exc: BaseException) -> None:
        """A fenced coordinator decides nothing more: fail the futures of its pending and queued
        checkpoints at once, so callers learn it now rather than at the checkpoint timeout."""
        coordinator = self.coordinator
        if coordinator is None:
            return
        futures = [p.result for p in list(coordinator.pending.values())]
        futures += [request.future for request in coordinator.decider.queued]
        futures += list(coordinator.deciding)
        for future in futures:
            if not future.done():
                try:
                    future.set_exception(exc)
                except concurrent.futures.InvalidStateError:
                    pass

    def _on_mailbox_error(self, exc: BaseException) -> None:
        if self.stopped.is_set():  # e.g. a restore that outlived its timeout, failing in the background
            log.warning("job %s: a mailbox action of the stopped coordinator failed: %s", self.job_id, exc)
            return
        self.stop_reason = exc
        threading.Thread(target=self._halt, name="chandy-halt", daemon=True).start()

    def _newest_epoch(self) -> tuple[EpochClaim, dict[LogKey, int]]:
        """The job's log read now (read committed, to its end): the claim of its newest epoch
        record and its key versions (``LoadStats.next_key_versions``).

        Raises:
            LogLoadError: the log cannot be read.
        """
        state, stats = load_state(self.bootstrap_servers, self.topics.coordinator_log, self.job_id, codec=self.codec,
                                  consumer_overrides=self._consumer_overrides, timeout_s=30.0)
        return state.claim, stats.next_key_versions

    def _state(self) -> CoordinatorState:
        """This coordinator's state (a fresh one before its coordinator exists)."""
        return self.coordinator.state if self.coordinator is not None else CoordinatorState(self.job_id)

    def _still_leading(self) -> bool:
        """Whether this coordinator still leads its job: it owns the election group's partition
        (waiting up to 10 s for it: a broker's restart moves the group and its partition for a
        moment), or it runs without an election (then only a new start of the job fences it)."""
        return self.election is None or self.election.wait_until_leader(timeout_s=10.0)

    def _status_for_metrics(self) -> str:
        """The job's status: the last change this coordinator made, else RUNNING once it leads."""
        if self.job_status is not None:
            return self.job_status
        return "RUNNING" if self.coordinator is not None else "CREATED"

    def _on_failover(self, reason: str) -> None:
        self.failover_reason = reason

    def _on_job_status(self, status: str, reason: str | None) -> None:
        self.job_status = status
        log.warning("job %s is %s: %s", self.job_id, status, reason)

    def _halt(self, *, mailbox_wait_s: float = 10.0) -> None:
        """Stop everything without writing (fenced or broken), waiting up to ``mailbox_wait_s``
        seconds for the mailbox thread to end its current action."""
        if self._acks is not None:
            self._acks.close()
        if self.election is not None:
            self.election.close()  # a fenced coordinator must not keep the requests partition
        self.mailbox.close(mailbox_wait_s, discard=True)
        self.io_executor.shutdown(wait=False, cancel_futures=True)
        self._close_metrics()
        self.stopped.set()

    def _close_metrics(self) -> None:
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop cleanly: abort pending checkpoints (written while still the active coordinator),
        close coordinators and hooks, commit what is queued, close clients."""
        if self.stopped.is_set():
            return
        if self.coordinator is not None and not self.fenced.is_set():
            with _suppress_timeout():
                self.mailbox.call(self.coordinator.shutdown).result(timeout_s)
        if self._acks is not None:
            self._acks.close()
        if self.election is not None:
            self.election.close()  # leave the group: a standby leads at once
        self.mailbox.close()
        if self._writer is not None:
            self._writer.close(timeout_s)
        self.io_executor.shutdown(wait=True)
        self._close_metrics()
        self.stopped.set()

    # -- API (any thread) --------------------------------------------------------------------------------
    def _call(self, func: Callable[[CheckpointCoordinator], _T], timeout_s: float = 30.0) -> _T:
        """``func(coordinator)`` on the mailbox thread, waited for up to ``timeout_s`` seconds.

        Raises:
            CoordinatorStoppedError: the service is stopped or was never started.
        """
        coordinator = self.coordinator
        if self.stopped.is_set() or coordinator is None:
            state = "stopped" if self.stopped.is_set() else "not started"
            raise CoordinatorStoppedError(f"the coordinator of job {self.job_id} is {state} ({self.stop_reason})")
        return self.mailbox.call(lambda: func(coordinator)).result(timeout_s)

    def trigger_checkpoint(self, *, forced: bool = False) -> CheckpointTriggerResult:
        """Request a checkpoint now: its ID (None while queued) and future; see
        :meth:`CheckpointCoordinator.trigger_checkpoint`."""
        return self._with_checkpoint_id(self._call(lambda cc: cc.trigger_checkpoint(forced=forced)))

    def trigger_savepoint(self, target: str | None = None, *, terminate: bool = False) -> CheckpointTriggerResult:
        """Trigger a savepoint; the result's future gives its pointer. See
        :meth:`CheckpointCoordinator.trigger_savepoint`."""
        return self._with_checkpoint_id(self._call(lambda cc: cc.trigger_savepoint(target, terminate=terminate)))

    def _with_checkpoint_id(self, result: CheckpointTriggerResult) -> CheckpointTriggerResult:
        """A request made before every subtask reported a running attempt (right after a start or
        a take-over) is held by the coordinator and takes its ID once they have: wait for that here
        (up to the checkpoint timeout), so the caller gets the ID with the result, as it would a
        moment later; the future is the same either way."""
        request = result.held
        if request is None:
            return result
        deadline = time.monotonic() + self.options.timeout_ms / 1000
        while not result.done() and time.monotonic() < deadline and self._call(lambda cc: cc.is_held(request)):
            time.sleep(0.01)
        return CheckpointTriggerResult(request.checkpoint_id, result.future)

    def abort_checkpoint(self, checkpoint_id: int, reason: Any, message: str) -> bool:
        """Abort a pending checkpoint (e.g. the driver saw its Spark job fail); see
        :meth:`CheckpointCoordinator.abort_checkpoint`."""
        return self._call(lambda cc: cc.abort_checkpoint(checkpoint_id, reason, message))

    def cancel_job(self, reason: str) -> concurrent.futures.Future:
        """Cancel the job (see :meth:`CheckpointCoordinator.cancel_job`); the future is done once
        the CANCELED status is durable."""
        return self._call(lambda cc: cc.cancel_job(reason))

    def fail_job(self, reason: str) -> concurrent.futures.Future:
        """Fail the job for good (see :meth:`CheckpointCoordinator.fail_job`): FAILED, with a
        ``JOB_STATUS_CHANGED`` event on the events topic; the future is done once that is durable."""
        return self._call(lambda cc: cc.fail_job(reason))

    @property
    def epoch(self) -> int:
        """This coordinator's epoch (control messages carry it; workers drop older ones)."""
        return self.coordinator.state.epoch if self.coordinator is not None else 0

    def call_operator_coordinator(self, operator_id: str, func: Callable[[Any], Any], timeout_s: float = 60.0) -> Any:
        """Run ``func(coordinator)`` on the mailbox thread with operator ``operator_id``'s
        operator coordinator and return its result: the one safe way to read or drive an
        operator coordinator from another thread (its methods run on the mailbox only).

        Raises:
            CoordinatorStoppedError: the service is stopped; KeyError: no such operator coordinator.
        """
        return self._call(lambda cc: func(cc.holders[operator_id].coordinator), timeout_s)

    def failure_reason(self) -> str | None:
        """Why the job failed or the coordinator stopped, in one line (None while running)."""
        if self.coordinator is not None and self.coordinator.state.job_status_reason and self.job_status == "FAILED":
            return self.coordinator.state.job_status_reason
        return None if self.stop_reason is None else str(self.stop_reason).splitlines()[0]

    def stats(self) -> dict[str, Any]:
        """Checkpoint statistics shaped like Flink's ``/jobs/:jobid/checkpoints``."""
        return self._call(lambda cc: cc.stats.to_json())

    def checkpoint_stats(self, checkpoint_id: int) -> CheckpointStats | None:
        """A copy of one checkpoint's statistics (trigger, latest ack and completion times in ms
        since the epoch), None when the tracker no longer holds it."""
        def copy(cc: Any) -> CheckpointStats | None:
            found = cc.stats.get(checkpoint_id)
            return None if found is None else dataclasses.replace(found)

        return self._call(copy)

    def snapshot_state(self) -> CoordinatorState:
        """A copy of the coordinator's durable state (for comparing with a replay)."""
        import copy

        return self._call(lambda cc: copy.deepcopy(cc.state))


class _suppress_timeout:
    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type, exc, tb) -> bool:
        return exc_type is not None and issubclass(exc_type, (concurrent.futures.TimeoutError, ChandyError))

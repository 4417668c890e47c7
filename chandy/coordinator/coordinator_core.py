"""The state every part of the checkpoint coordinator shares: what :class:`CoordinatorCore` holds
(the replayed state, pending checkpoints, operator coordinators, hooks, current attempts), how it
commits a decision (:meth:`CoordinatorCore._commit`: apply, then hand the batch to the environment)
and how it describes a checkpoint in the log and on the events topic. The parts
(:mod:`~chandy.coordinator.checkpoint_coordinator` triggering,
:mod:`~chandy.coordinator.checkpoint_completion`, :mod:`~chandy.coordinator.checkpoint_restore`,
:mod:`~chandy.coordinator.subtask_attempts`, :mod:`~chandy.coordinator.job_lifecycle`) each add
their methods; the declarations at the end name what one part calls of another."""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from chandy.coordinator.completed_checkpoint_store import (
    CompletedCheckpointStore,
)
from chandy.coordinator.environment import Batch, Cancellable, CoordinatorEnvironment, OutboundMessage
from chandy.coordinator.failure import CheckpointFailureReason
from chandy.coordinator.failure_manager import CheckpointFailureManager
from chandy.coordinator.hooks import MasterHooks
from chandy.coordinator.listener import CheckpointListener
from chandy.coordinator.messages import (
    CheckpointEvent,
    OperatorParallelism,
)
from chandy.coordinator.operator_coordinator import OperatorCoordinatorProvider
from chandy.coordinator.operator_coordinator_holder import OperatorCoordinatorHolder
from chandy.coordinator.options import CheckpointingOptions
from chandy.coordinator.pending import AckResult, PendingCheckpoint
from chandy.coordinator.records import (
    CheckpointRecord,
    CheckpointStatus,
    CheckpointType,
    JobStatus,
    JobStatusRecord,
)
from chandy.coordinator.request_decider import (
    CheckpointRequestDecider,
    CheckpointTriggerRequest,
    RequestDecision,
)
from chandy.coordinator.state import CoordinatorState, apply
from chandy.coordinator.stats import CheckpointStatsTracker
from chandy.coordinator.storage import (
    CheckpointMetadata,
    CheckpointStorage,
)
from chandy.coordinator.trigger_result import CheckpointTriggerResult

log = logging.getLogger(__name__)

R = CheckpointFailureReason


class CoordinatorCore:
    """The shared state of :class:`~chandy.coordinator.checkpoint_coordinator.CheckpointCoordinator`."""

    def __init__(
        self,
        job_id: str,
        options: CheckpointingOptions,
        env: CoordinatorEnvironment,
        storage: CheckpointStorage,
        operators: Mapping[str, int],
        *,
        coordinator_providers: Iterable[OperatorCoordinatorProvider] = (),
        state: CoordinatorState | None = None,
        transactional_id: str = "",
        on_job_status: Callable[[JobStatus, str | None], None] | None = None,
        completion_outputs: Callable[[CheckpointMetadata], Sequence[OutboundMessage]] | None = None,
        job_name: str | None = None,
        on_failover: Callable[[str], None] | None = None,
        coordinator_id: str | None = None,
    ) -> None:
        """Args (beyond the obvious):
            coordinator_id: this coordinator instance's ID in its epoch record (default: a random
                one; :class:`~chandy.coordinator.records.CoordinatorEpochRecord`).
            job_name: the job's name (Flink's), published with the ``JOB_STARTED`` event.
            completion_outputs: called on the I/O executor once a checkpoint's ``_metadata`` is
                written, before it completes; the messages it returns are published in the same
                Kafka transaction as the checkpoint's COMPLETED record, so they become visible
                exactly when (and only if) the checkpoint completes. An exception aborts the
                checkpoint with FINALIZE_CHECKPOINT_FAILURE. Not called for intermediate
                savepoints, which commit no side effects (Flink 1.15+, FLINK-25191).
        """
        self.job_id = job_id
        self.job_name = job_name
        self.completion_outputs = completion_outputs
        self.options = options
        self.env = env
        self.storage = storage
        self.operators = dict(operators)
        self.state = state or CoordinatorState(job_id)
        self.transactional_id = transactional_id
        self.coordinator_id = coordinator_id or uuid.uuid4().hex
        self.on_job_status = on_job_status
        #: a restart strategy decides global failures (a failing operator coordinator, too many
        #: failed checkpoints): called once with the reason instead of recording FAILED
        self.on_failover = on_failover
        self.failover_reason: str | None = None
        self.hooks = MasterHooks()
        self.listeners: list[CheckpointListener] = []
        self.stats = CheckpointStatsTracker()
        self.pending: dict[int, PendingCheckpoint] = {}
        self.current_attempts: dict[tuple[str, int], int] = {}
        self.ack_counts: collections.Counter[AckResult] = collections.Counter()
        self.holders: dict[str, OperatorCoordinatorHolder] = {}
        for provider in coordinator_providers:
            parallelism = getattr(provider, "parallelism", None) or self.operators.get(provider.operator_id, 1)
            self.holders[provider.operator_id] = OperatorCoordinatorHolder(
                provider, parallelism, env, job_id, lambda: self.state.epoch, self._fail_job,
                lambda record: self._commit(Batch(records=[record])), self.checkpoint_pointer,
                append_batch=self._commit, state_of=lambda: self.state, event_of=self._checkpoint_event,
                log_of=self.coordinator_log,
            )
        self.decider = CheckpointRequestDecider(options.max_concurrent, options.min_pause_ms)
        self.failure_manager = CheckpointFailureManager(options.tolerable_failed)
        self.store = CompletedCheckpointStore(options.num_retained)
        self._periodic_timer: Any = None
        self._periodic_running = False
        #: explicit requests made before every subtask reported a running attempt, each with its
        #: timeout: they run once the last one does (:meth:`_await_readiness`)
        self._awaiting_readiness: list[tuple[CheckpointTriggerRequest, Cancellable]] = []
        self._last_completion_ms: int | None = None
        self._shutdown = False
        self._restoring: tuple[int, str] | None = None
        #: futures of checkpoints whose completion or abort is being committed (a log writer that
        #: dies meanwhile never runs their commit callback; the runtime fails them instead)
        self.deciding: set[concurrent.futures.Future] = set()

    # -- registration --------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self.state.epoch

    @property
    def job_status(self) -> JobStatus:
        return self.state.job_status

    # -- the log ---------------------------------------------------------------------------------

    def _commit(self, batch: Batch, on_committed: Callable[[], None] | None = None) -> None:
        """Apply the batch's records to the state and hand the batch to the log writer. A job
        status record that ends or suspends the job also publishes a ``JOB_STATUS_CHANGED`` event
        in the same transaction."""
        now = None
        for record in batch.records:
            if id(record) not in batch.pre_applied:
                apply(self.state, record)
            if isinstance(record, JobStatusRecord) and record.status is not JobStatus.RUNNING:
                now = now if now is not None else self.env.now_ms()
                batch.events.append(CheckpointEvent(
                    job_id=self.job_id, checkpoint_id=self.state.last_succeeded_checkpoint_id,
                    event_type="JOB_STATUS_CHANGED", checkpoint_type=CheckpointType.CHECKPOINT.value,
                    epoch=record.epoch, timestamp=now, trigger_timestamp=record.timestamp,
                    failure_message=record.reason, job_status=record.status.value))
        self.env.append(batch, on_committed)

    def _record(self, pending: PendingCheckpoint, status: CheckpointStatus, now: int, **extra: Any) -> CheckpointRecord:
        return CheckpointRecord(
            job_id=self.job_id, checkpoint_id=pending.checkpoint_id, checkpoint_type=pending.checkpoint_type,
            status=status, epoch=self.state.epoch, trigger_timestamp=pending.trigger_timestamp,
            status_timestamp=now, num_subtasks=len(pending.expected), num_acknowledged=pending.num_acknowledged,
            **extra,
        )

    def _job_fields(self) -> dict[str, Any]:
        """What a ``TRIGGERED`` event carries about the job besides its checkpoint: what Flink's
        REST serves that the events topic does not otherwise say (the job's name,
        ``/jobs/:jobid/checkpoints/config``, its vertices)."""
        o = self.options
        config = {"interval_ms": o.interval_ms, "timeout_ms": o.timeout_ms, "min_pause_ms": o.min_pause_ms,
                  "max_concurrent": o.max_concurrent, "tolerable_failed": o.tolerable_failed,
                  "num_retained": o.num_retained}
        return {"job_name": self.job_name or self.job_id, "checkpoint_config": config,
                "operators": tuple(OperatorParallelism(op, n) for op, n in self.operators.items())}

    def _checkpoint_event(self, checkpoint_id: int, event_type: str, **fields: Any) -> CheckpointEvent:
        """An event of ``event_type`` about checkpoint ``checkpoint_id`` now, for an operator
        coordinator (:meth:`OperatorCoordinatorHolder.publish_event`): type, trigger time and
        subtask counts from the checkpoint's record in the log (if it is still there)."""
        record = self.state.checkpoints.get(checkpoint_id)
        if record is not None:
            return self._event(record, event_type, self.env.now_ms(), **fields)
        now = self.env.now_ms()
        return CheckpointEvent(job_id=self.job_id, checkpoint_id=checkpoint_id, event_type=event_type,
                               checkpoint_type=CheckpointType.CHECKPOINT.value, epoch=self.state.epoch, timestamp=now,
                               trigger_timestamp=now, **fields)

    def _event(self, pending_or_record: Any, event_type: str, now: int, **extra: Any) -> CheckpointEvent:
        p = pending_or_record
        return CheckpointEvent(
            job_id=self.job_id, checkpoint_id=p.checkpoint_id, event_type=event_type,
            checkpoint_type=p.checkpoint_type, epoch=self.state.epoch, timestamp=now,
            trigger_timestamp=p.trigger_timestamp,
            num_subtasks=len(p.expected) if isinstance(p, PendingCheckpoint) else p.num_subtasks,
            num_acknowledged=p.num_acknowledged, **extra,
        )

    # -- start / recovery -------------------------------------------------------------------------

    # -- what one part calls of another ----------------------------------------------------------
    def _abort(self, pending: PendingCheckpoint, reason: CheckpointFailureReason, message: str,
               declined_by: str | None = None) -> None:
        raise NotImplementedError  # :mod:`chandy.coordinator.checkpoint_completion`

    def _abort_if_pending(self, checkpoint_id: int, reason: CheckpointFailureReason, message: str) -> None:
        raise NotImplementedError  # :mod:`chandy.coordinator.checkpoint_completion`

    def _act(self, decision: RequestDecision) -> None:
        raise NotImplementedError  # :mod:`chandy.coordinator.checkpoint_coordinator`

    def _await_readiness(self, request: CheckpointTriggerRequest) -> None:
        raise NotImplementedError  # :mod:`chandy.coordinator.subtask_attempts`

    def _dispose_directory(self, directory: str | None) -> None:
        raise NotImplementedError  # :mod:`chandy.coordinator.checkpoint_completion`

    def _fail_awaiting_readiness(self, reason: CheckpointFailureReason, message: str) -> None:
        raise NotImplementedError  # :mod:`chandy.coordinator.subtask_attempts`

    def _is_triggering(self) -> bool:
        raise NotImplementedError  # :mod:`chandy.coordinator.checkpoint_coordinator`

    def _job_status_changed(self, status: JobStatus, reason: str | None) -> None:
        raise NotImplementedError  # :mod:`chandy.coordinator.job_lifecycle`

    def _failover(self, reason: str) -> None:
        raise NotImplementedError  # :mod:`chandy.coordinator.job_lifecycle`

    def _maybe_finalize(self, pending: PendingCheckpoint) -> None:
        raise NotImplementedError  # :mod:`chandy.coordinator.checkpoint_completion`

    def _notify_complete(self, checkpoint_id: int) -> bool:
        raise NotImplementedError  # :mod:`chandy.coordinator.checkpoint_completion`

    def _request(self, checkpoint_type: CheckpointType, *, periodic: bool, forced: bool,
                 target: str | None = None) -> CheckpointTriggerResult:
        raise NotImplementedError  # :mod:`chandy.coordinator.checkpoint_coordinator`

    def _schedule_periodic(self, delay_ms: int) -> None:
        raise NotImplementedError  # :mod:`chandy.coordinator.job_lifecycle`

    def _subtasks_not_ready(self) -> bool:
        raise NotImplementedError  # :mod:`chandy.coordinator.subtask_attempts`

    def start_periodic_scheduler(self) -> None:
        raise NotImplementedError  # :mod:`chandy.coordinator.job_lifecycle`

    def stop_periodic_scheduler(self) -> None:
        raise NotImplementedError  # :mod:`chandy.coordinator.job_lifecycle`

    def _execute_queued(self) -> None:
        raise NotImplementedError  # :mod:`chandy.coordinator.checkpoint_coordinator`

    def _fail_job(self, cause: BaseException) -> None:
        raise NotImplementedError  # :mod:`chandy.coordinator.job_lifecycle`

    def coordinator_log(self) -> str | None:
        """The coordinator log this coordinator writes, as its ``_metadata`` files name it
        (``<transactional id>@<log incarnation>``; None without a transactional ID). Two logs of
        one job (two topic prefixes) or two incarnations of one log (a lost log created again)
        hand out the same checkpoint IDs into the same checkpoint directory: a coordinator tells
        its own ``chk-N/_metadata`` from another log's by this."""
        if not self.transactional_id:
            return None
        return f"{self.transactional_id}@{getattr(self.env, 'log_incarnation', None) or '-'}"

    def checkpoint_pointer(self, checkpoint_id: int) -> str | None:
        raise NotImplementedError  # :mod:`chandy.coordinator.checkpoint_coordinator`

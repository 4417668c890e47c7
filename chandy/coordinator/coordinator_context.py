"""The state every collaborator of the checkpoint coordinator shares: :class:`CoordinatorContext`.

:class:`~chandy.coordinator.checkpoint_coordinator.CheckpointCoordinator` orchestrates; it holds
its collaborators as fields, as Flink's ``CheckpointCoordinator`` holds its
``CheckpointRequestDecider``, ``CheckpointFailureManager`` and ``CompletedCheckpointStore``:

- :class:`~chandy.coordinator.checkpoint_completion.CheckpointCompletion`: acks, declines,
  completion and aborts of pending checkpoints, notifications, disposal of their directories;
- :class:`~chandy.coordinator.checkpoint_restore.CheckpointRestorer`: starting a coordinator and
  restoring the latest checkpoint or a savepoint;
- :class:`~chandy.coordinator.subtask_attempts.SubtaskAttempts`: the readiness of subtask
  attempts, held requests, operator events;
- :class:`~chandy.coordinator.job_lifecycle.JobLifecycle`: the periodic scheduler, the job's
  status, global failures and shutdown;

and triggering itself. What they all read and change lives here, in one object each of them is
handed: the replayed :class:`~chandy.coordinator.state.CoordinatorState`, the pending checkpoints,
the operator coordinators, hooks, listeners and the policies, with how a decision is committed
(:meth:`CoordinatorContext.commit`: apply, then hand the batch to the environment) and how a
checkpoint is described in the log and on the events topic.
"""

from __future__ import annotations

import collections
import concurrent.futures
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from chandy.coordinator.completed_checkpoint_store import CompletedCheckpointStore
from chandy.coordinator.environment import Batch, CoordinatorEnvironment, OutboundMessage
from chandy.coordinator.failure_manager import CheckpointFailureManager
from chandy.coordinator.hooks import MasterHooks
from chandy.coordinator.listener import CheckpointListener
from chandy.coordinator.messages import CheckpointEvent, OperatorParallelism
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
from chandy.coordinator.request_decider import CheckpointRequestDecider
from chandy.coordinator.state import CoordinatorState, apply
from chandy.coordinator.stats import CheckpointStatsTracker
from chandy.coordinator.storage import CheckpointMetadata, CheckpointStorage


class CoordinatorContext:
    """The shared state of one :class:`~chandy.coordinator.checkpoint_coordinator.CheckpointCoordinator`
    and its collaborators (the fields of Flink's ``CheckpointCoordinator`` its parts use).

    Mailbox thread only, like everything of the coordinator. The collaborators read the
    replaceable fields (``decider``, ``on_job_status``, ``on_failover``, ``completion_outputs``)
    here each time they need them, never keep their own copy: the coordinator's setters of the
    same name replace them here.

    Args: those of :class:`~chandy.coordinator.checkpoint_coordinator.CheckpointCoordinator`
    (``state`` None: a fresh :class:`CoordinatorState` of ``job_id``; ``coordinator_id`` None: a
    random one). ``holders`` starts empty: the coordinator adds one
    :class:`OperatorCoordinatorHolder` per operator coordinator once its collaborators exist.
    """

    def __init__(
        self,
        job_id: str,
        options: CheckpointingOptions,
        env: CoordinatorEnvironment,
        storage: CheckpointStorage,
        operators: Mapping[str, int],
        *,
        state: CoordinatorState | None,
        transactional_id: str,
        on_job_status: Callable[[JobStatus, str | None], None] | None,
        completion_outputs: Callable[[CheckpointMetadata], Sequence[OutboundMessage]] | None,
        job_name: str | None,
        on_failover: Callable[[str], None] | None,
        coordinator_id: str | None,
    ) -> None:
        self.job_id = job_id
        self.job_name = job_name
        self.completion_outputs = completion_outputs
        self.options = options
        self.env = env
        self.storage = storage
        #: operator ID -> parallelism of every operator whose subtasks acknowledge
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
        #: (operator ID, subtask index) -> the attempt number it last reported running
        self.current_attempts: dict[tuple[str, int], int] = {}
        self.ack_counts: collections.Counter[AckResult] = collections.Counter()
        self.holders: dict[str, OperatorCoordinatorHolder] = {}
        self.decider = CheckpointRequestDecider(options.max_concurrent, options.min_pause_ms)
        self.failure_manager = CheckpointFailureManager(options.tolerable_failed)
        self.store = CompletedCheckpointStore(options.num_retained)
        #: when the latest checkpoint completed or was restored (ms), for ``min_pause``
        self.last_completion_ms: int | None = None
        #: (checkpoint ID, directory) of the checkpoint being restored into the coordinators
        self.restoring: tuple[int, str] | None = None
        #: futures of checkpoints whose completion or abort is being committed (a log writer that
        #: dies meanwhile never runs their commit callback; the runtime fails them instead)
        self.deciding: set[concurrent.futures.Future] = set()

    # -- the log ---------------------------------------------------------------------------------

    def commit(self, batch: Batch, on_committed: Callable[[], None] | None = None) -> None:
        """Apply the batch's records to the state and hand the batch to the log writer. A job
        status record that ends or suspends the job also publishes a ``JOB_STATUS_CHANGED`` event
        in the same transaction. ``on_committed`` runs on the mailbox once the batch is durable
        (Flink: what follows a successful ``CompletedCheckpointStore.addCheckpoint``)."""
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

    def record(self, pending: PendingCheckpoint, status: CheckpointStatus, now: int, **extra: Any) -> CheckpointRecord:
        """The log record of ``pending`` with ``status`` at ``now`` (ms) in the current epoch;
        ``extra`` sets further :class:`CheckpointRecord` fields (state size, pointer, failure)."""
        return CheckpointRecord(
            job_id=self.job_id, checkpoint_id=pending.checkpoint_id, checkpoint_type=pending.checkpoint_type,
            status=status, epoch=self.state.epoch, trigger_timestamp=pending.trigger_timestamp,
            status_timestamp=now, num_subtasks=len(pending.expected), num_acknowledged=pending.num_acknowledged,
            **extra,
        )

    def job_fields(self) -> dict[str, Any]:
        """What a ``TRIGGERED`` event carries about the job besides its checkpoint: what Flink's
        REST serves that the events topic does not otherwise say (the job's name,
        ``/jobs/:jobid/checkpoints/config``, its vertices)."""
        o = self.options
        config = {"interval_ms": o.interval_ms, "timeout_ms": o.timeout_ms, "min_pause_ms": o.min_pause_ms,
                  "max_concurrent": o.max_concurrent, "tolerable_failed": o.tolerable_failed,
                  "num_retained": o.num_retained}
        return {"job_name": self.job_name or self.job_id, "checkpoint_config": config,
                "operators": tuple(OperatorParallelism(op, n) for op, n in self.operators.items())}

    def checkpoint_event(self, checkpoint_id: int, event_type: str, **fields: Any) -> CheckpointEvent:
        """An event of ``event_type`` about checkpoint ``checkpoint_id`` now, for an operator
        coordinator (:meth:`OperatorCoordinatorHolder.publish_event`): type, trigger time and
        subtask counts from the checkpoint's record in the log (if it is still there)."""
        record = self.state.checkpoints.get(checkpoint_id)
        if record is not None:
            return self.event(record, event_type, self.env.now_ms(), **fields)
        now = self.env.now_ms()
        return CheckpointEvent(job_id=self.job_id, checkpoint_id=checkpoint_id, event_type=event_type,
                               checkpoint_type=CheckpointType.CHECKPOINT.value, epoch=self.state.epoch, timestamp=now,
                               trigger_timestamp=now, **fields)

    def event(self, pending_or_record: PendingCheckpoint | CheckpointRecord, event_type: str, now: int,
              **extra: Any) -> CheckpointEvent:
        """The public event ``event_type`` (``TRIGGERED``, ``COMPLETED``, ``ABORTED``, ...) of a
        pending checkpoint or of a checkpoint's log record at ``now`` (ms), in the current epoch;
        ``extra`` sets further :class:`CheckpointEvent` fields."""
        p = pending_or_record
        return CheckpointEvent(
            job_id=self.job_id, checkpoint_id=p.checkpoint_id, event_type=event_type,
            checkpoint_type=p.checkpoint_type, epoch=self.state.epoch, timestamp=now,
            trigger_timestamp=p.trigger_timestamp,
            num_subtasks=len(p.expected) if isinstance(p, PendingCheckpoint) else p.num_subtasks,
            num_acknowledged=p.num_acknowledged, **extra,
        )

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
        """The directory URL of checkpoint or savepoint ``checkpoint_id``: of the one being
        restored, of a pending one (its storage location), or of one in the log; None if unknown."""
        if self.restoring is not None and self.restoring[0] == checkpoint_id:
            return self.restoring[1]
        pending = self.pending.get(checkpoint_id)
        if pending is not None and pending.location is not None:
            return pending.location.directory
        record = self.state.checkpoints.get(checkpoint_id)
        return record.external_pointer if record is not None else None

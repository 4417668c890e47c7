"""Subtask attempts and operator events (Flink's ``executionAttemptReady`` / ``executionAttemptFailed``
and the pre-flight readiness check): :class:`SubtaskAttempts`, a collaborator of
:class:`~chandy.coordinator.checkpoint_coordinator.CheckpointCoordinator`."""

from __future__ import annotations

import logging
from collections.abc import Callable

from chandy.coordinator.checkpoint_completion import CheckpointCompletion
from chandy.coordinator.completed_checkpoint_store import (
    CompletedCheckpointStore,
)
from chandy.coordinator.coordinator_context import CoordinatorContext
from chandy.coordinator.environment import Cancellable
from chandy.coordinator.failure import CheckpointFailureReason
from chandy.coordinator.messages import (
    OperatorEventMessage,
    SubtaskAttemptFailed,
    SubtaskAttemptReady,
)
from chandy.coordinator.operator_coordinator import OperatorEvent
from chandy.coordinator.pending import AckResult
from chandy.coordinator.request_decider import (
    CheckpointTriggerRequest,
    RequestDecision,
)
from chandy.coordinator.state import NO_CHECKPOINT

log = logging.getLogger(__name__)

R = CheckpointFailureReason


class SubtaskAttempts:
    """The readiness of subtask attempts: which attempt of each subtask runs, what a new or failed
    attempt tells the operator coordinators and the pending checkpoints, explicit requests held
    until every subtask runs, and operator events from subtasks (Flink's
    ``OperatorCoordinatorHolder.executionAttemptReady`` / ``executionAttemptFailed`` and the
    ``CheckpointCoordinator``'s "not all required tasks are currently running" pre-flight check).

    Args:
        context: the coordinator's shared state (``current_attempts``, ``ack_counts``, ...).
        completion: aborts the pending checkpoints a failed attempt cannot complete.
        is_triggering: a checkpoint is still collecting coordinator and hook state (the
            coordinator's ``isTriggering``), for the request decider.
        act: runs what the request decider chose (the coordinator's triggering).
    """

    def __init__(self, context: CoordinatorContext, completion: CheckpointCompletion, *,
                 is_triggering: Callable[[], bool], act: Callable[[RequestDecision], None]) -> None:
        self._context = context
        self._completion = completion
        self._is_triggering = is_triggering
        self._act = act
        #: explicit requests made before every subtask reported a running attempt, each with its
        #: timeout: they run once the last one does (:meth:`await_readiness`)
        self._awaiting_readiness: list[tuple[CheckpointTriggerRequest, Cancellable]] = []

    def subtasks_not_ready(self) -> bool:
        """Some subtask has not reported a running attempt, and triggers wait for readiness
        (``wait_for_running_subtasks``; Flink's pre-flight check "Not all required tasks are
        currently running")."""
        c = self._context
        return c.options.wait_for_running_subtasks and any(
            (op, i) not in c.current_attempts for op, n in c.operators.items() for i in range(n))

    def is_held(self, request: CheckpointTriggerRequest) -> bool:
        """Whether ``request`` still waits for every subtask to report a running attempt
        (:meth:`await_readiness`)."""
        return any(waiting is request for waiting, _ in self._awaiting_readiness)

    def await_readiness(self, request: CheckpointTriggerRequest) -> None:
        """Hold an explicit request (a user's checkpoint or savepoint) made before every subtask
        reported a running attempt, e.g. right after the job started or a coordinator took over:
        it runs when the last one reports (:meth:`attempt_ready`), or fails with
        NOT_ALL_REQUIRED_TASKS_RUNNING after ``timeout_ms``. Flink refuses such a request at once;
        holding it spares the caller a retry loop, and nothing is triggered before readiness."""
        c = self._context

        def expire() -> None:
            for i, (waiting, _) in enumerate(self._awaiting_readiness):
                if waiting is request:
                    del self._awaiting_readiness[i]
                    request.fail(R.NOT_ALL_REQUIRED_TASKS_RUNNING,
                                 f"not every subtask reported a running attempt within {c.options.timeout_ms} ms")
                    return

        self._awaiting_readiness.append((request, c.env.schedule(c.options.timeout_ms, expire)))

    def _release_awaiting_readiness(self) -> None:
        """Every subtask is running: hand the held requests to the decider, oldest first."""
        c = self._context
        held, self._awaiting_readiness = self._awaiting_readiness, []
        for request, timer in held:
            timer.cancel()
            if request.future.done():
                continue
            decision = c.decider.choose_request_to_execute(
                request, is_triggering=self._is_triggering(), pending=len(c.pending),
                last_completion_ms=c.last_completion_ms, now_ms=c.env.now_ms())
            self._act(decision)

    def fail_awaiting_readiness(self, reason: CheckpointFailureReason, message: str) -> None:
        """Fail every held request (:meth:`await_readiness`) with ``reason`` and ``message`` and
        cancel its timeout: the job ended or the coordinator shuts down (as Flink's
        ``CheckpointRequestDecider.abortAll`` fails the queued ones)."""
        held, self._awaiting_readiness = self._awaiting_readiness, []
        for request, timer in held:
            timer.cancel()
            request.fail(reason, message)

    def _valid_subtask(self, job_id: str, operator_id: str, subtask_index: int) -> bool:
        c = self._context
        parallelism = c.operators.get(operator_id)
        if parallelism is None and operator_id in c.holders:
            parallelism = c.holders[operator_id].current_parallelism()
        if job_id != c.job_id or parallelism is None or not 0 <= subtask_index < parallelism:
            c.ack_counts[AckResult.UNKNOWN] += 1
            log.warning("message for unknown subtask %s[%d] of job %s: ignored", operator_id, subtask_index, job_id)
            return False
        return True

    def attempt_ready(self, message: SubtaskAttemptReady) -> None:
        """A subtask attempt is ready (OperatorCoordinator.executionAttemptReady). A newer attempt
        whose predecessor never reported failing fails the predecessor first, keeping the order of Flink's OperatorCoordinator contract."""
        c = self._context
        if not self._valid_subtask(message.job_id, message.operator_id, message.subtask_index):
            return
        key = (message.operator_id, message.subtask_index)
        current = c.current_attempts.get(key, -1)
        if message.attempt_number < current:
            log.info("ignoring ready of stale attempt %d of %s", message.attempt_number, key)
            return
        if current >= 0 and message.attempt_number > current:
            self.attempt_failed(SubtaskAttemptFailed(c.job_id, key[0], key[1], current,
                                                     f"superseded by attempt {message.attempt_number}"))
        c.current_attempts[key] = message.attempt_number
        holder = c.holders.get(message.operator_id)
        if holder is not None:
            holder.attempt_ready(message.subtask_index, message.attempt_number)
        if self._awaiting_readiness and not self.subtasks_not_ready():
            self._release_awaiting_readiness()

    def attempt_failed(self, message: SubtaskAttemptFailed) -> None:
        """A subtask attempt failed: tell its coordinator (``execution_attempt_failed`` then
        ``subtask_reset`` to the latest completed checkpoint) and abort the pending checkpoints
        still waiting for that subtask with TASK_FAILURE (Flink's
        ``OperatorCoordinator.executionAttemptFailed`` and ``subtaskReset``; savepoints go on).
        Attempts older than the current one change nothing."""
        c = self._context
        if not self._valid_subtask(message.job_id, message.operator_id, message.subtask_index):
            return
        key = (message.operator_id, message.subtask_index)
        if message.attempt_number < c.current_attempts.get(key, -1):
            return
        latest = CompletedCheckpointStore.latest(c.state)
        holder = c.holders.get(message.operator_id)
        if holder is not None:
            holder.attempt_failed(message.subtask_index, message.attempt_number, RuntimeError(message.reason or "failed"),
                                  latest.checkpoint_id if latest else NO_CHECKPOINT)
        # a failover resets the subtask to the latest completed checkpoint: no pending checkpoint can
        # complete consistently with that any more (Flink aborts them all; TASK_FAILURE is not counted)
        for pending in list(c.pending.values()):
            if not pending.is_savepoint:
                self._completion.abort(pending, R.TASK_FAILURE, f"{key[0]}[{key[1]}] attempt {message.attempt_number} failed: "
                                                                f"{message.reason}")

    def receive_operator_event(self, message: OperatorEventMessage) -> None:
        """An operator event from a subtask, for its operator's coordinator (Flink's
        ``OperatorCoordinatorHolder.handleEventFromOperator``); events of another job, of a
        non-current attempt or for an operator without a coordinator are logged and dropped."""
        c = self._context
        if message.job_id != c.job_id:
            return
        holder = c.holders.get(message.operator_id)
        if holder is not None and holder.current_attempts.get(message.subtask_index) != message.attempt_number:
            log.info("operator event from a non-current attempt %d of %s[%d]: ignored", message.attempt_number,
                     message.operator_id, message.subtask_index)
            return
        if holder is None:
            log.warning("operator event %s for %s, which has no coordinator: ignored", message.event_type, message.operator_id)
            return
        holder.handle_event(message.subtask_index, message.attempt_number, OperatorEvent(message.event_type, message.payload))

"""Subtask attempts and operator events (Flink's ``executionAttemptReady`` / ``executionAttemptFailed``
and the pre-flight readiness check): a mixin of
:class:`~chandy.coordinator.checkpoint_coordinator.CheckpointCoordinator`, whose state it uses."""

from __future__ import annotations

import logging

from chandy.coordinator.completed_checkpoint_store import (
    CompletedCheckpointStore,
)
from chandy.coordinator.coordinator_core import CoordinatorCore
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
)
from chandy.coordinator.state import NO_CHECKPOINT

log = logging.getLogger(__name__)

R = CheckpointFailureReason


class SubtaskAttempts(CoordinatorCore):
    """The subtask attempts part of the checkpoint coordinator."""

    def _subtasks_not_ready(self) -> bool:
        """Some subtask has not reported a running attempt, and triggers wait for readiness."""
        return self.options.wait_for_running_subtasks and any(
            (op, i) not in self.current_attempts for op, n in self.operators.items() for i in range(n))

    def is_held(self, request: CheckpointTriggerRequest) -> bool:
        """Whether ``request`` still waits for every subtask to report a running attempt."""
        return any(waiting is request for waiting, _ in self._awaiting_readiness)

    def _await_readiness(self, request: CheckpointTriggerRequest) -> None:
        """Hold an explicit request (a user's checkpoint or savepoint) made before every subtask
        reported a running attempt, e.g. right after the job started or a coordinator took over:
        it runs when the last one reports (:meth:`attempt_ready`), or fails with
        NOT_ALL_REQUIRED_TASKS_RUNNING after ``timeout_ms``. Flink refuses such a request at once;
        holding it spares the caller a retry loop, and nothing is triggered before readiness."""
        def expire() -> None:
            for i, (waiting, _) in enumerate(self._awaiting_readiness):
                if waiting is request:
                    del self._awaiting_readiness[i]
                    request.fail(R.NOT_ALL_REQUIRED_TASKS_RUNNING,
                                 f"not every subtask reported a running attempt within {self.options.timeout_ms} ms")
                    return

        self._awaiting_readiness.append((request, self.env.schedule(self.options.timeout_ms, expire)))

    def _release_awaiting_readiness(self) -> None:
        """Every subtask is running: hand the held requests to the decider, oldest first."""
        held, self._awaiting_readiness = self._awaiting_readiness, []
        for request, timer in held:
            timer.cancel()
            if request.future.done():
                continue
            decision = self.decider.choose_request_to_execute(
                request, is_triggering=self._is_triggering(), pending=len(self.pending),
                last_completion_ms=self._last_completion_ms, now_ms=self.env.now_ms())
            self._act(decision)

    def _fail_awaiting_readiness(self, reason: CheckpointFailureReason, message: str) -> None:
        held, self._awaiting_readiness = self._awaiting_readiness, []
        for request, timer in held:
            timer.cancel()
            request.fail(reason, message)

    def _valid_subtask(self, job_id: str, operator_id: str, subtask_index: int) -> bool:
        parallelism = self.operators.get(operator_id)
        if parallelism is None and operator_id in self.holders:
            parallelism = self.holders[operator_id].current_parallelism()
        if job_id != self.job_id or parallelism is None or not 0 <= subtask_index < parallelism:
            self.ack_counts[AckResult.UNKNOWN] += 1
            log.warning("message for unknown subtask %s[%d] of job %s: ignored", operator_id, subtask_index, job_id)
            return False
        return True

    def attempt_ready(self, message: SubtaskAttemptReady) -> None:
        """A subtask attempt is ready (OperatorCoordinator.executionAttemptReady). A newer attempt
        whose predecessor never reported failing fails the predecessor first, keeping the order of Flink's OperatorCoordinator contract."""
        if not self._valid_subtask(message.job_id, message.operator_id, message.subtask_index):
            return
        key = (message.operator_id, message.subtask_index)
        current = self.current_attempts.get(key, -1)
        if message.attempt_number < current:
            log.info("ignoring ready of stale attempt %d of %s", message.attempt_number, key)
            return
        if current >= 0 and message.attempt_number > current:
            self.attempt_failed(SubtaskAttemptFailed(self.job_id, key[0], key[1], current,
                                                     f"superseded by attempt {message.attempt_number}"))
        self.current_attempts[key] = message.attempt_number
        holder = self.holders.get(message.operator_id)
        if holder is not None:
            holder.attempt_ready(message.subtask_index, message.attempt_number)
        if self._awaiting_readiness and not self._subtasks_not_ready():
            self._release_awaiting_readiness()

    def attempt_failed(self, message: SubtaskAttemptFailed) -> None:
        """A subtask attempt failed: tell its coordinator (``execution_attempt_failed`` then
        ``subtask_reset`` to the latest completed checkpoint) and abort the pending checkpoints
        still waiting for that subtask with TASK_FAILURE."""
        if not self._valid_subtask(message.job_id, message.operator_id, message.subtask_index):
            return
        key = (message.operator_id, message.subtask_index)
        if message.attempt_number < self.current_attempts.get(key, -1):
            return
        latest = CompletedCheckpointStore.latest(self.state)
        holder = self.holders.get(message.operator_id)
        if holder is not None:
            holder.attempt_failed(message.subtask_index, message.attempt_number, RuntimeError(message.reason or "failed"),
                                  latest.checkpoint_id if latest else NO_CHECKPOINT)
        # a failover resets the subtask to the latest completed checkpoint: no pending checkpoint can
        # complete consistently with that any more (Flink aborts them all; TASK_FAILURE is not counted)
        for pending in list(self.pending.values()):
            if not pending.is_savepoint:
                self._abort(pending, R.TASK_FAILURE, f"{key[0]}[{key[1]}] attempt {message.attempt_number} failed: "
                                                     f"{message.reason}")

    def receive_operator_event(self, message: OperatorEventMessage) -> None:
        """An operator event from a subtask, for its operator's coordinator."""
        if message.job_id != self.job_id:
            return
        holder = self.holders.get(message.operator_id)
        if holder is not None and holder.current_attempts.get(message.subtask_index) != message.attempt_number:
            log.info("operator event from a non-current attempt %d of %s[%d]: ignored", message.attempt_number,
                     message.operator_id, message.subtask_index)
            return
        if holder is None:
            log.warning("operator event %s for %s, which has no coordinator: ignored", message.event_type, message.operator_id)
            return
        holder.handle_event(message.subtask_index, message.attempt_number, OperatorEvent(message.event_type, message.payload))

    # -- periodic scheduling -------------------------------------------------------------------------------

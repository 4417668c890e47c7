"""Which checkpoint request runs, waits or is refused: Flink's CheckpointRequestDecider.

Every trigger request (periodic, user, forced, savepoint) goes through one queue, ordered as
Flink's ``CheckpointRequestDecider`` orders it: savepoints first, then forced requests, then
user requests, then periodic ones, each by request time. A request runs when (Flink's
``chooseRequestToExecute``):

1. no other checkpoint is still *triggering* (collecting coordinator and hook state): one at a
   time, so the event order of the OperatorCoordinator contract holds;
2. fewer than ``max_concurrent`` checkpoints **or savepoints** are pending (Flink passes
   ``pendingCheckpoints.size()``), or the first queued request is forced (savepoints are);
3. for a periodic, non-forced request: ``min_pause`` has passed since the last completion; if
   not, that request is dropped (MINIMUM_TIME_BETWEEN_CHECKPOINTS) and the periodic trigger is
   rescheduled for when the pause ends. User requests never wait for the pause.

A request that cannot run yet waits in the queue and runs when a pending checkpoint ends. Only a
full queue (``max_queued``, Flink's 1,000) refuses a request with TOO_MANY_CHECKPOINT_REQUESTS:
the new one if every queued request is a user request, else the last periodic one.

The decider does no I/O, reads no clock and owns no timer: the coordinator passes in what it
needs and acts on the :class:`RequestDecision`. Refused requests' futures are failed here, as
Flink's decider completes them exceptionally.
"""

from __future__ import annotations

import bisect
import concurrent.futures
import dataclasses
import itertools

from chandy.coordinator.failure import CheckpointException, CheckpointFailureReason
from chandy.coordinator.records import CheckpointType

#: Flink's ``CheckpointRequestDecider.DEFAULT_MAX_QUEUED_REQUESTS``.
DEFAULT_MAX_QUEUED_REQUESTS = 1000

_sequence = itertools.count()


@dataclasses.dataclass(eq=False)
class CheckpointTriggerRequest:
    """One request to trigger a checkpoint or savepoint (Flink's ``CheckpointTriggerRequest``).

    ``timestamp`` is when it was made (ms); ``future`` gives the completed
    :class:`~chandy.coordinator.records.CheckpointRecord` or fails with a
    :class:`~chandy.coordinator.failure.CheckpointException`.
    """

    checkpoint_type: CheckpointType
    timestamp: int
    periodic: bool = False
    forced: bool = False
    target: str | None = None
    future: concurrent.futures.Future = dataclasses.field(default_factory=concurrent.futures.Future)
    #: set by the coordinator when the request runs and takes its ID
    checkpoint_id: int | None = None
    sequence: int = dataclasses.field(default_factory=lambda: next(_sequence))

    @property
    def is_force(self) -> bool:
        """Flink's ``isForce``: forced checkpoints and savepoints bypass ``max_concurrent``."""
        return self.forced or self.checkpoint_type.is_savepoint

    def sort_key(self) -> tuple[bool, bool, bool, int, int]:
        """Flink's ``CheckpointRequestDecider.compare``: savepoints, forced, user, periodic; then by time."""
        return (not self.checkpoint_type.is_savepoint, not self.is_force, self.periodic, self.timestamp, self.sequence)

    def fail(self, reason: CheckpointFailureReason, message: str) -> None:
        """Complete the future exceptionally (once)."""
        if not self.future.done():
            self.future.set_exception(CheckpointException(reason, message))


@dataclasses.dataclass(frozen=True)
class RequestDecision:
    """What the coordinator does now: run ``execute`` (or nothing), and reschedule the periodic
    trigger in ``reschedule_periodic_ms`` when set (the min pause has not passed)."""

    execute: CheckpointTriggerRequest | None = None
    reschedule_periodic_ms: int | None = None


class CheckpointRequestDecider:
    """Flink's ``CheckpointRequestDecider`` (see the module docstring).

    Args:
        max_concurrent: ``execution.checkpointing.max-concurrent-checkpoints``.
        min_pause_ms: ``execution.checkpointing.min-pause``; when > 0 at most one checkpoint runs
            at a time, as Flink documents for ``setMinPauseBetweenCheckpoints``.
        max_queued: the queue's capacity (Flink: 1,000).
    """

    def __init__(self, max_concurrent: int, min_pause_ms: int, max_queued: int = DEFAULT_MAX_QUEUED_REQUESTS) -> None:
        self.max_concurrent = 1 if min_pause_ms > 0 else max_concurrent
        self.min_pause_ms = min_pause_ms
        self.max_queued = max_queued
        self._queue: list[CheckpointTriggerRequest] = []

    @property
    def queued(self) -> list[CheckpointTriggerRequest]:
        """The queued requests, in the order they would run."""
        return list(self._queue)

    def has_queued_periodic(self) -> bool:
        return any(r.periodic for r in self._queue)

    def choose_request_to_execute(self, request: CheckpointTriggerRequest, *, is_triggering: bool,
                                  pending: int, last_completion_ms: int | None, now_ms: int) -> RequestDecision:
        """Queue ``request``, then pick what runs now (Flink's ``chooseRequestToExecute(newRequest, ...)``).

        Args:
            is_triggering: a checkpoint is still collecting coordinator and hook state.
            pending: checkpoints and savepoints pending now.
            last_completion_ms: when the last checkpoint or savepoint completed (None: never).
        """
        if len(self._queue) >= self.max_queued and not self._queue[-1].periodic:
            # only user requests are queued: keep them, refuse the new one
            request.fail(CheckpointFailureReason.TOO_MANY_CHECKPOINT_REQUESTS,
                         f"{len(self._queue)} checkpoint requests are already queued")
            return RequestDecision()
        bisect.insort(self._queue, request, key=CheckpointTriggerRequest.sort_key)
        if len(self._queue) > self.max_queued:
            self._queue.pop().fail(CheckpointFailureReason.TOO_MANY_CHECKPOINT_REQUESTS,
                                   f"more than {self.max_queued} checkpoint requests queued")
        return self.choose_queued_request_to_execute(is_triggering=is_triggering, pending=pending,
                                                     last_completion_ms=last_completion_ms, now_ms=now_ms)

    def choose_queued_request_to_execute(self, *, is_triggering: bool, pending: int, last_completion_ms: int | None,
                                         now_ms: int) -> RequestDecision:
        """Pick the queued request that runs now, if any (Flink's ``chooseQueuedRequestToExecute``)."""
        if is_triggering or not self._queue:
            return RequestDecision()
        first = self._queue[0]
        if pending >= self.max_concurrent:
            return RequestDecision(self._queue.pop(0)) if first.is_force else RequestDecision()
        if first.periodic and not first.is_force and last_completion_ms is not None:
            delay = last_completion_ms + self.min_pause_ms - now_ms
            if delay > 0:
                self._queue.pop(0).fail(CheckpointFailureReason.MINIMUM_TIME_BETWEEN_CHECKPOINTS,
                                        f"{delay} ms of the minimum pause left")
                return RequestDecision(reschedule_periodic_ms=delay)
        return RequestDecision(self._queue.pop(0))

    def abort_all(self, reason: CheckpointFailureReason, message: str) -> list[CheckpointTriggerRequest]:
        """Fail and drop every queued request (Flink's ``abortAll``); returns them."""
        dropped, self._queue = self._queue, []
        for request in dropped:
            request.fail(reason, message)
        return dropped

    def remove_periodic(self, reason: CheckpointFailureReason, message: str) -> None:
        """Fail and drop the queued periodic requests (the periodic scheduler stopped)."""
        kept = []
        for request in self._queue:
            if request.periodic:
                request.fail(reason, message)
            else:
                kept.append(request)
        self._queue = kept

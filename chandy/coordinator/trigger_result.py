"""What triggering a checkpoint or savepoint returns: its ID (when it has one) and its future.

Flink's ``CheckpointCoordinator.triggerCheckpoint`` returns a future of the completed checkpoint;
a caller that must key work by the checkpoint ID (a micro-batch) also needs the ID the moment it
is taken. :class:`CheckpointTriggerResult` carries both, typed, instead of an attribute set on a
Future.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class CheckpointTriggerResult:
    """The result of a trigger request.

    Attributes:
        checkpoint_id: the ID the request took, durable in the log before any hook, operator
            coordinator or worker sees it; None when the request was queued (it takes an ID when
            it runs) or refused before it took one.
        future: completes with the :class:`~chandy.coordinator.records.CheckpointRecord` (checkpoints) or
            the savepoint's pointer (savepoints), or fails with a
            :class:`~chandy.coordinator.failure.CheckpointException`.

    ``result``, ``exception`` and ``done`` delegate to ``future``, so code written against the
    bare future keeps working.
    """

    checkpoint_id: int | None
    future: concurrent.futures.Future
    #: the request, while it waits for every subtask to report a running attempt (it takes its
    #: ID once they have): what ``CoordinatorService`` waits on to hand its caller that ID
    held: Any = dataclasses.field(default=None, compare=False, repr=False)

    def result(self, timeout: float | None = None) -> Any:
        """``future.result(timeout)``."""
        return self.future.result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """``future.exception(timeout)``."""
        return self.future.exception(timeout)

    def done(self) -> bool:
        """``future.done()``."""
        return self.future.done()

    def add_done_callback(self, fn: Any) -> None:
        """``future.add_done_callback(fn)`` (``fn`` gets the future)."""
        self.future.add_done_callback(fn)

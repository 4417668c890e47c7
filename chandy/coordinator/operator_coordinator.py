"""Operator coordinators: Flink's OperatorCoordinator, its Context and SubtaskGateway, in Python.

An operator coordinator runs in the checkpoint coordinator's process, beside the operator's
parallel subtasks (workers), and talks to them with :class:`OperatorEvent`\\ s. It is the home of,
for example, the Kafka source enumerator and the lake committer.

Threading and order (Flink's OperatorCoordinator contract): every method is called on the coordinator's mailbox
thread, in this order per subtask attempt: ``execution_attempt_ready`` → (events) →
``execution_attempt_failed`` → ``subtask_reset`` (partial failover) or ``reset_to_checkpoint``
(global failover) → ``execution_attempt_ready`` of the new attempt. ``start`` comes first and
``close`` last.

Exactly-once around checkpoints: the moment the future given to :meth:`checkpoint_coordinator`
completes is the moment of the coordinator's checkpoint. Events sent through a gateway *before*
that moment are delivered to subtasks before the checkpoint's trigger; events sent *after* it
are held back and delivered after the trigger, so they belong to the next checkpoint. The
coordinator must order "send event" and "complete future" itself (same thread, or a lock).

Restoring implies completion: after ``reset_to_checkpoint(N, data)`` it is safe to commit side
effects predicated on N having completed, even if ``notify_checkpoint_complete(N)`` never came.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from chandy.coordinator.environment import SourceOffsets
from chandy.coordinator.state import BATCH_CHECKPOINT_ID, NO_CHECKPOINT

__all__ = [
    "BATCH_CHECKPOINT_ID",
    "NO_CHECKPOINT",
    "OperatorCoordinator",
    "OperatorCoordinatorContext",
    "OperatorCoordinatorProvider",
    "OperatorEvent",
    "SubtaskGateway",
]


@dataclasses.dataclass(frozen=True)
class OperatorEvent:
    """An event between a coordinator and a subtask: a type name and opaque bytes."""

    event_type: str
    payload: bytes = b""


@runtime_checkable
class SubtaskGateway(Protocol):
    """Sends events to one execution attempt of one subtask (Flink's SubtaskGateway)."""

    @property
    def subtask(self) -> int:
        """The subtask index."""
        ...

    @property
    def attempt_number(self) -> int:
        """The execution attempt this gateway is bound to."""
        ...

    def send_event(self, event: OperatorEvent) -> concurrent.futures.Future[None]:
        """Send ``event`` to the attempt. The future completes once the event is durably on the
        control topic, and fails if the attempt is no longer running. Callable from any thread."""
        ...


@runtime_checkable
class OperatorCoordinatorContext(Protocol):
    """What the runtime gives a coordinator (Flink's OperatorCoordinator.Context)."""

    @property
    def operator_id(self) -> str:
        ...

    @property
    def job_id(self) -> str:
        ...

    def current_parallelism(self) -> int:
        """Number of parallel subtasks of the operator."""
        ...

    def fail_job(self, cause: BaseException) -> None:
        """Fail the whole job (global failover)."""
        ...

    def run_in_coordinator_thread(self, action: Callable[[], None]) -> None:
        """Run ``action`` on the mailbox thread (to come back from an executor)."""
        ...

    def call_async(self, call: Callable[[], Any], handler: Callable[[Any, BaseException | None], None],
                   initial_delay_ms: int = 0, period_ms: int = 0) -> None:
        """Run ``call`` on the I/O executor, then ``handler(result, error)`` on the mailbox thread;
        repeated every ``period_ms`` when > 0 (Flink's SplitEnumeratorContext.callAsync)."""
        ...

    def append_log_record(self, record: Any) -> None:
        """Append a record (e.g. a split assignment) to the coordinator's event-sourced log."""
        ...

    def commit_source_offsets(self, record: Any, offsets: SourceOffsets) -> bool:
        """Append ``record`` and commit ``offsets`` to their consumer group in one transaction of
        the coordinator log (Kafka's ``sendOffsetsToTransaction``), so a coordinator fenced by a
        newer one commits neither and never moves the group back. Transactions commit in the
        order they are asked for. Returns False, doing nothing, when the runtime has no such
        transactions (the caller then commits the offsets itself)."""
        ...

    def checkpoint_pointer(self, checkpoint_id: int) -> str | None:
        """The directory URL of checkpoint or savepoint ``checkpoint_id`` (completed, pending, or
        being restored), or None when unknown: where its ``_metadata`` is."""
        ...

    def log_records(self, kind: str) -> Mapping[str, Any]:
        """The entities of a connector's log-record ``kind`` as replayed from the coordinator log
        and appended since (entity ID -> the kind's folded value, by default its latest record)."""
        ...

    def newest_checkpoint_id(self) -> int:
        """The newest checkpoint ID the coordinator's log has handed out (``NO_CHECKPOINT`` for
        none): every checkpoint up to it is completed, aborted or pending in this coordinator, and
        a coordinator of the job started later takes only higher IDs."""
        ...

    def coordinator_log(self) -> str | None:
        """The coordinator log this coordinator writes, as the ``_metadata`` files it writes name it
        (``CheckpointMetadata.coordinator_log``), or None when the runtime has no such log. A
        ``chk-N/_metadata`` naming another log is another coordinator's checkpoint N (two logs of
        one job, or a lost log's old incarnation, share the checkpoint directory and the IDs)."""
        ...

    def log_incarnation(self) -> str | None:
        """Which incarnation of the coordinator log this coordinator replayed and writes (the
        Kafka runtime: the log topic's topic ID, new when the log was lost and created again), or
        None when the runtime cannot tell. Checkpoint IDs order the coordinators of one
        incarnation only: after a lost log a new run may hand out an ID a coordinator of the old
        log still uses, so what must never be taken for another coordinator's (the data files a
        cleanup deletes) carries the incarnation."""
        ...

    def when_logged(self, action: Callable[[], Any]) -> None:
        """Run ``action`` on the mailbox thread once everything this coordinator has appended to
        its log so far is durable (its transactions committed, in order); never, when the log
        writer stops first (fenced by a newer coordinator, or failed). An action that destroys
        what another coordinator of the job may use (deleting data files) waits for this: a
        coordinator whose start is in its log was not fenced when it started, so a coordinator
        started later replayed a log holding this one's start and every checkpoint ID it knew
        of, and takes higher ones."""
        ...

    def publish_event(self, checkpoint_id: int, event_type: str, *, records: Sequence[Any] = (),
                      **fields: Any) -> None:
        """Publish a ``CheckpointEvent`` of ``event_type`` about checkpoint ``checkpoint_id`` on
        the public events topic (epoch, checkpoint type and trigger time filled in by the
        runtime; ``fields`` the event's other fields) in one transaction with ``records``
        appended to the coordinator log: a record saying the event was published is durable
        exactly when the event is, so a successor publishes what is missing and nothing twice.
        Transactions commit in the order they are asked for, after every earlier one (so after
        the checkpoint's COMPLETED event)."""
        ...


@runtime_checkable
class OperatorCoordinator(Protocol):
    """Flink's OperatorCoordinator in snake_case (see the module docstring for order and threads).

    Exceptions from ``start``, ``handle_event_from_operator`` and ``checkpoint_coordinator`` fail
    the job; from ``close`` they are logged.
    """

    def start(self) -> None:
        """Called once, before any other method."""
        ...

    def close(self) -> None:
        """Release resources; called once, last."""
        ...

    def handle_event_from_operator(self, subtask: int, attempt_number: int, event: OperatorEvent) -> None:
        """An event from attempt ``attempt_number`` of ``subtask``."""
        ...

    def checkpoint_coordinator(self, checkpoint_id: int, result_future: concurrent.futures.Future[bytes]) -> None:
        """Snapshot the coordinator: complete ``result_future`` with the state bytes, or with an
        exception to decline. It must be completed in some way, or the checkpoint never ends."""
        ...

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """As :class:`~chandy.coordinator.listener.CheckpointListener` (subsuming contract)."""
        ...

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """As :class:`~chandy.coordinator.listener.CheckpointListener`."""
        ...

    def reset_to_checkpoint(self, checkpoint_id: int, checkpoint_data: bytes | None) -> None:
        """Global failover: reset to checkpoint ``checkpoint_id`` (``NO_CHECKPOINT`` and None
        data when there is none, or when it held no state for this coordinator)."""
        ...

    def subtask_reset(self, subtask: int, checkpoint_id: int) -> None:
        """Partial failover of ``subtask`` back to ``checkpoint_id``."""
        ...

    def execution_attempt_failed(self, subtask: int, attempt_number: int, reason: BaseException | None) -> None:
        """Attempt ``attempt_number`` of ``subtask`` failed or was cancelled."""
        ...

    def execution_attempt_ready(self, subtask: int, attempt_number: int, gateway: SubtaskGateway) -> None:
        """Attempt ``attempt_number`` of ``subtask`` is ready; ``gateway`` reaches exactly it."""
        ...


class OperatorCoordinatorProvider(Protocol):
    """Creates an operator's coordinator (Flink's OperatorCoordinator.Provider)."""

    @property
    def operator_id(self) -> str:
        """The operator whose coordinator this creates."""
        ...

    def create(self, context: OperatorCoordinatorContext) -> OperatorCoordinator:
        ...

"""Runs one operator coordinator for the checkpoint coordinator (Flink's OperatorCoordinatorHolder).

It is the coordinator's :class:`~chandy.coordinator.operator_coordinator.OperatorCoordinatorContext`,
hands out :class:`SubtaskGateway`\\ s bound to attempts, and keeps the event/checkpoint order of
Flink's OperatorCoordinator javadoc with a *valve* per operator: once the coordinator's checkpoint future has completed, events
it sends are held until the checkpoint's trigger is on its way to the workers, then released
after it. All methods run on the mailbox thread; the gateways and the future may be used from any
thread, and come back through the mailbox.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from chandy.coordinator.environment import Batch, CoordinatorEnvironment, SourceOffsets
from chandy.coordinator.errors import ChandyError
from chandy.coordinator.messages import CheckpointEvent, OperatorEventMessage
from chandy.coordinator.operator_coordinator import OperatorCoordinator, OperatorCoordinatorProvider, OperatorEvent
from chandy.coordinator.state import CoordinatorState

log = logging.getLogger(__name__)


class SubtaskAttemptGoneError(ChandyError):
    """An event was sent through a gateway whose attempt is no longer running."""


class _Gateway:
    """A SubtaskGateway bound to (operator, subtask, attempt)."""

    def __init__(self, holder: OperatorCoordinatorHolder, subtask: int, attempt_number: int) -> None:
        self._holder = holder
        self._subtask = subtask
        self._attempt = attempt_number

    @property
    def subtask(self) -> int:
        return self._subtask

    @property
    def attempt_number(self) -> int:
        return self._attempt

    def send_event(self, event: OperatorEvent) -> concurrent.futures.Future[None]:
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._holder.env.execute(lambda: self._holder._send(self._subtask, self._attempt, event, future))
        return future


class OperatorCoordinatorHolder:
    """Hosts one :class:`OperatorCoordinator` (see the module docstring).

    Args:
        provider: creates the coordinator with this holder as its context.
        parallelism: number of subtasks of the operator.
        env: the runtime environment (mailbox, log writer).
        job_id: the job's ID; ``epoch`` is read through ``epoch_of()`` at send time.
        fail_job: called with the cause when the coordinator fails the job.
        log_of: the coordinator log this coordinator writes (``coordinator_log``), or None.
    """

    def __init__(
        self,
        provider: OperatorCoordinatorProvider,
        parallelism: int,
        env: CoordinatorEnvironment,
        job_id: str,
        epoch_of: Callable[[], int],
        fail_job: Callable[[BaseException], None],
        append_record: Callable[[Any], None] | None = None,
        pointer_of: Callable[[int], str | None] | None = None,
        append_batch: Callable[[Batch], None] | None = None,
        state_of: Callable[[], CoordinatorState] | None = None,
        event_of: Callable[..., CheckpointEvent] | None = None,
        log_of: Callable[[], str | None] | None = None,
    ) -> None:
        self.operator_id = provider.operator_id
        self._parallelism = parallelism
        self.env = env
        self._job_id = job_id
        self._epoch_of = epoch_of
        self._fail_job = fail_job
        self._append_record = append_record or (lambda record: None)
        self._pointer_of = pointer_of or (lambda checkpoint_id: None)
        self._append_batch = append_batch
        self._state_of = state_of
        self._event_of = event_of
        self._log_of = log_of or (lambda: None)
        self._closed = False
        self.current_attempts: dict[int, int] = {}
        self._valve_closed = False
        self._held: list[tuple[int, int, OperatorEvent, concurrent.futures.Future[None]]] = []
        self.coordinator: OperatorCoordinator = provider.create(self)

    # -- Context -------------------------------------------------------------------------------
    @property
    def job_id(self) -> str:
        return self._job_id

    def current_parallelism(self) -> int:
        return self._parallelism

    def fail_job(self, cause: BaseException) -> None:
        self.env.execute(lambda: self._fail_job(cause))

    def run_in_coordinator_thread(self, action: Callable[[], None]) -> None:
        self.env.execute(action)

    def call_async(
        self,
        call: Callable[[], Any],
        handler: Callable[[Any, BaseException | None], None],
        initial_delay_ms: int = 0,
        period_ms: int = 0,
    ) -> None:
        """Run ``call`` on the I/O executor and ``handler(result, error)`` on the mailbox, after
        ``initial_delay_ms`` and then every ``period_ms`` (> 0) after the previous handler ran,
        until the coordinator is closed (Flink's SplitEnumeratorContext.callAsync)."""

        def submit() -> None:
            if self._closed:
                return
            future = self.env.io_executor.submit(call)
            future.add_done_callback(lambda f: self.env.execute(lambda: done(f)))

        def done(future: concurrent.futures.Future) -> None:
            if self._closed:
                return
            error = future.exception()
            try:
                handler(None if error is not None else future.result(), error)
            except Exception as exc:  # like any coordinator failure: fail the job
                log.exception("operator coordinator %s failed in an async handler", self.operator_id)
                self._fail_job(exc)
            if period_ms > 0:
                self.env.schedule(period_ms, submit)

        if initial_delay_ms > 0:
            self.env.schedule(initial_delay_ms, submit)
        else:
            self.env.execute(submit)

    def append_log_record(self, record: Any) -> None:
        """Append a record to the coordinator log (applied to the coordinator state at once),
        e.g. a split assignment or an offset commit, so a log replay shows it."""
        self._append_record(record)

    def commit_source_offsets(self, record: Any, offsets: SourceOffsets) -> bool:
        """See :meth:`OperatorCoordinatorContext.commit_source_offsets`: with an environment
        whose ``transactional_offsets`` is true (the Kafka runtime), one batch carries both."""
        if self._append_batch is None or not getattr(self.env, "transactional_offsets", False):
            return False
        self._append_batch(Batch(records=[record], source_offsets=[offsets]))
        return True

    def checkpoint_pointer(self, checkpoint_id: int) -> str | None:
        """The directory URL of checkpoint or savepoint ``checkpoint_id`` (see the Context)."""
        return self._pointer_of(checkpoint_id)

    def newest_checkpoint_id(self) -> int:
        """See :meth:`OperatorCoordinatorContext.newest_checkpoint_id`."""
        return -1 if self._state_of is None else self._state_of().next_checkpoint_id - 1

    def coordinator_log(self) -> str | None:
        """See :meth:`OperatorCoordinatorContext.coordinator_log`."""
        return self._log_of()

    def log_incarnation(self) -> str | None:
        """See :meth:`OperatorCoordinatorContext.log_incarnation`: the environment's
        ``log_incarnation`` (None for an environment without one)."""
        incarnation = getattr(self.env, "log_incarnation", None)
        return incarnation if isinstance(incarnation, str) else None

    def when_logged(self, action: Callable[[], Any]) -> None:
        """See :meth:`OperatorCoordinatorContext.when_logged`: an empty batch after everything
        appended so far (the log writer commits transactions in order and runs their callbacks
        on the mailbox, or stops for good)."""
        self.env.append(Batch(), lambda: None if self._closed else action())

    def log_records(self, kind: str) -> Mapping[str, Any]:
        """See :meth:`OperatorCoordinatorContext.log_records` (empty without a coordinator state)."""
        return {} if self._state_of is None else self._state_of().records_of(kind)

    def publish_event(self, checkpoint_id: int, event_type: str, *, records: Sequence[Any] = (),
                      **fields: Any) -> None:
        """See :meth:`OperatorCoordinatorContext.publish_event`.

        Raises:
            RuntimeError: the holder was made without a way to append batches or build events.
        """
        if self._append_batch is None or self._event_of is None:
            raise RuntimeError(f"operator coordinator {self.operator_id} cannot publish events here")
        self._append_batch(Batch(records=list(records), events=[self._event_of(checkpoint_id, event_type, **fields)]))

    # -- events ----------------------------------------------------------------------------------
    def _send(self, subtask: int, attempt: int, event: OperatorEvent, future: concurrent.futures.Future[None]) -> None:
        if self.current_attempts.get(subtask) != attempt:
            future.set_exception(SubtaskAttemptGoneError(
                f"attempt {attempt} of subtask {subtask} of {self.operator_id} is not running"))
            return
        if self._valve_closed:
            self._held.append((subtask, attempt, event, future))
            return
        message = OperatorEventMessage(
            self._job_id, self._epoch_of(), self.operator_id, subtask, attempt,
            event.event_type, event.payload, self.env.now_ms(),
        )
        self.env.append(Batch(control=[message]), lambda: future.set_result(None) if not future.done() else None)

    def close_valve(self) -> None:
        """Hold events from now on: the coordinator's checkpoint future has completed."""
        self._valve_closed = True

    def open_valve(self) -> None:
        """Release held events in order: the trigger has been appended before them."""
        self._valve_closed = False
        held, self._held = self._held, []
        for subtask, attempt, event, future in held:
            self._send(subtask, attempt, event, future)

    # -- lifecycle, called by the checkpoint coordinator on the mailbox ---------------------------
    def gateway(self, subtask: int, attempt_number: int) -> _Gateway:
        return _Gateway(self, subtask, attempt_number)

    def _guarded(self, method: str, *args: Any) -> None:
        try:
            getattr(self.coordinator, method)(*args)
        except Exception as exc:  # a coordinator failure fails the job, not the process
            log.exception("operator coordinator %s failed in %s", self.operator_id, method)
            self._fail_job(exc)

    def attempt_ready(self, subtask: int, attempt_number: int) -> None:
        self.current_attempts[subtask] = attempt_number
        self._guarded("execution_attempt_ready", subtask, attempt_number, self.gateway(subtask, attempt_number))

    def attempt_failed(self, subtask: int, attempt_number: int, reason: BaseException | None, restore_id: int) -> None:
        if self.current_attempts.get(subtask) == attempt_number:
            del self.current_attempts[subtask]
        self._guarded("execution_attempt_failed", subtask, attempt_number, reason)
        self._guarded("subtask_reset", subtask, restore_id)

    def checkpoint(self, checkpoint_id: int, on_done: Callable[[bytes | None, BaseException | None], None]) -> None:
        """Ask the coordinator for its state; ``on_done`` runs on the mailbox when the future is done."""
        future: concurrent.futures.Future[bytes] = concurrent.futures.Future()

        def done(f: concurrent.futures.Future[bytes]) -> None:
            exc = f.exception()
            data = None if exc is not None else f.result()

            def on_mailbox() -> None:
                self.close_valve()
                on_done(data, exc)

            self.env.execute(on_mailbox)

        future.add_done_callback(done)
        try:
            self.coordinator.checkpoint_coordinator(checkpoint_id, future)
        except Exception as exc:  # noqa: BLE001 - declines this checkpoint and, as Flink's OperatorCoordinator contract says, fails the job
            if not future.done():
                future.set_exception(exc)
            self._fail_job(exc)

    def handle_event(self, subtask: int, attempt_number: int, event: OperatorEvent) -> None:
        try:
            self.coordinator.handle_event_from_operator(subtask, attempt_number, event)
        except Exception as exc:  # an event handler's failure fails the job (Flink's OperatorCoordinatorHolder)
            log.exception("operator coordinator %s failed on an event", self.operator_id)
            self._fail_job(exc)

    def close(self) -> None:
        """Close the coordinator; async calls stop."""
        self._closed = True
        self.call("close")

    def call(self, method: str, *args: Any) -> bool:
        """Call a notification method, logging (not propagating) exceptions. Returns False when
        it raised. A failed ``notify_checkpoint_complete`` fails the job (Flink's
        OperatorCoordinatorHolder hands it to the global failure handler): a coordinator whose
        commit failed must not let the job go on as if it had succeeded."""
        try:
            getattr(self.coordinator, method)(*args)
            return True
        except Exception as exc:  # a failed notifyCheckpointComplete is a full job failure (Flink's OperatorCoordinator)
            log.exception("operator coordinator %s: %s%r failed", self.operator_id, method, args)
            if method == "notify_checkpoint_complete":
                self._fail_job(exc)
            return False

"""What the checkpoint coordinator needs from its runtime: a mailbox, a clock, an I/O executor
and a durable log writer. The coordinator is written against :class:`CoordinatorEnvironment`;
:mod:`chandy.coordinator.kafka.runtime` provides it over Kafka, and the unit tests provide a manual clock.

The contract of :meth:`CoordinatorEnvironment.append`: the records, control messages and events
of one :class:`Batch` are written in one Kafka transaction, batches in the order appended; once
it is committed, ``on_committed`` runs on the mailbox thread. A batch that cannot be committed
(the coordinator was fenced, or a fatal producer error) stops the coordinator: nothing after it
is written, and the log, which is the truth, is replayed by the next coordinator.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import heapq
import itertools
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from chandy.coordinator.errors import ChandyError
from chandy.coordinator.messages import CheckpointEvent
from chandy.coordinator.records import LogRecord

log = logging.getLogger(__name__)

Action = Callable[[], None]


class MailboxClosedError(ChandyError):
    """A call to a mailbox that is closed (its coordinator stopped or was fenced)."""


@dataclasses.dataclass(frozen=True)
class OutboundMessage:
    """A message published atomically with a decision, to a topic outside Chandy's own (for
    example a dead-letter topic): ``key`` and ``value`` are raw bytes (``None`` for a null),
    ``headers`` a list of (name, bytes) pairs, as Kafka's producer takes them."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclasses.dataclass
class Batch:
    """The output of one decision: log records, control messages, public events and outbound
    messages, all written in one Kafka transaction."""

    records: list[LogRecord] = dataclasses.field(default_factory=list)
    control: list[Any] = dataclasses.field(default_factory=list)
    events: list[CheckpointEvent] = dataclasses.field(default_factory=list)
    outputs: list[OutboundMessage] = dataclasses.field(default_factory=list)
    #: ids of records in ``records`` already applied to the state when they were decided
    pre_applied: set[int] = dataclasses.field(default_factory=set)
    #: consumer-group offsets committed in the same transaction (Kafka's
    #: ``sendOffsetsToTransaction``): (group id, ((topic, partition, offset), ...)); a fenced
    #: coordinator's transaction fails, so it never moves a group (see :class:`SourceOffsets`)
    source_offsets: list[SourceOffsets] = dataclasses.field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.records or self.control or self.events or self.outputs or self.source_offsets)


@dataclasses.dataclass(frozen=True)
class SourceOffsets:
    """Offsets of a consumer group committed atomically with a :class:`Batch`: ``offsets`` are
    (topic, partition, next offset to read) triples, as Kafka's ``OffsetAndMetadata``."""

    group_id: str
    offsets: tuple[tuple[str, int, int], ...]


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class CoordinatorEnvironment(Protocol):
    """The runtime services the coordinator uses (see the module docstring)."""

    @property
    def io_executor(self) -> concurrent.futures.Executor:
        """Where blocking I/O runs (storage, hooks), off the mailbox thread."""
        ...

    def now_ms(self) -> int:
        """Wall-clock time in ms since the Unix epoch."""
        ...

    def execute(self, action: Action) -> None:
        """Run ``action`` on the mailbox thread, after the mails already queued."""
        ...

    def schedule(self, delay_ms: int, action: Action) -> Cancellable:
        """Run ``action`` on the mailbox thread after ``delay_ms`` ms."""
        ...

    def append(self, batch: Batch, on_committed: Action | None = None) -> None:
        """Write ``batch`` durably (one transaction); then run ``on_committed`` on the mailbox.
        An environment that cannot commit ``batch.source_offsets`` in the transaction says so
        with :attr:`transactional_offsets` False, and is never given any."""
        ...


#: Timers in the heap before cancelled ones are first swept out (see ``Mailbox.schedule``).
_MIN_REBUILD = 64


class _Timer:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Mailbox:
    """One thread that runs every state transition, in order, plus timers (Flink's mailbox).

    ``execute`` is callable from any thread; actions run one at a time. An action that raises is
    logged and handed to ``on_error`` (the runtime fails the coordinator), so a bug cannot leave a
    half-applied transition unnoticed.
    """

    def __init__(self, name: str = "chandy-mailbox", on_error: Callable[[BaseException], None] | None = None) -> None:
        self._queue: queue.Queue[Action | None] = queue.Queue()
        self._timers: list[tuple[float, int, Action, _Timer]] = []
        # cancelled timers stay in the heap until popped; it is rebuilt without them once it has
        # doubled since the last rebuild, so a timeout cancelled per checkpoint (every checkpoint
        # completes long before its 10 min timeout) cannot pile up (amortised O(1) per schedule)
        self._rebuild_at = _MIN_REBUILD
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._closed = False
        self.discarding = False
        self._calls: set[concurrent.futures.Future] = set()
        self.on_error = on_error
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def thread_ident(self) -> int | None:
        """The mailbox thread's identifier (``threading.get_ident()`` on it), None before it starts."""
        return self._thread.ident

    def activity(self) -> str:
        """What the mailbox thread runs now, for a person: the innermost calls of Chandy's own
        code on its stack, outermost first (``Class.method``), the file and line of the innermost,
        and the library function it is in, if any."""
        frame = sys._current_frames().get(self.thread_ident or -1)
        if frame is None:
            return "nothing (the mailbox thread is not running)"
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # chandy/
        ours: list[Any] = []
        library = None
        while frame is not None:
            filename = os.path.abspath(frame.f_code.co_filename)
            if filename.startswith(package + os.sep):
                ours.append(frame)
            elif not ours and library is None:
                library = frame
            frame = frame.f_back
        if not ours:
            return "code outside Chandy"
        innermost = ours[0]
        calls = " > ".join(f.f_code.co_qualname for f in reversed(ours[:4]))
        where = f"{calls} ({os.path.relpath(innermost.f_code.co_filename, os.path.dirname(package))}:{innermost.f_lineno})"
        if library is not None:
            where += f", in {library.f_code.co_qualname} of {os.path.basename(library.f_code.co_filename)}"
        return where

    @property
    def is_mailbox_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def execute(self, action: Action) -> None:
        if not self._closed:
            self._queue.put(action)

    def call(self, func: Callable[[], Any]) -> concurrent.futures.Future:
        """Run ``func`` on the mailbox and return a future of its result (for API callers)."""
        future: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(func())
            except BaseException as exc:  # noqa: BLE001 - delivered to the caller
                future.set_exception(exc)

        if self.is_mailbox_thread:
            run()
        elif self._closed:
            future.set_exception(MailboxClosedError(f"{self._thread.name} is closed"))
        else:
            with self._lock:
                self._calls.add(future)
            future.add_done_callback(self._forget_call)
            self.execute(run)
        return future

    def _forget_call(self, future: concurrent.futures.Future) -> None:
        with self._lock:
            self._calls.discard(future)

    def schedule(self, delay_ms: int, action: Action) -> Cancellable:
        timer = _Timer()
        with self._lock:
            if len(self._timers) >= self._rebuild_at:
                self._timers = [entry for entry in self._timers if not entry[3].cancelled]
                heapq.heapify(self._timers)
                self._rebuild_at = max(_MIN_REBUILD, 2 * len(self._timers))
            heapq.heappush(self._timers, (time.monotonic() + max(0, delay_ms) / 1000.0, next(self._seq), action, timer))
        self._queue.put(lambda: None)  # wake the thread so it recomputes its wait
        return timer

    def close(self, timeout_s: float = 10.0, *, discard: bool = False) -> None:
        """Stop the thread; with ``discard`` the mails still queued never run (a fenced coordinator)."""
        self._closed = True
        self.discarding = discard
        if discard:
            with self._lock:
                self._timers.clear()
                calls = list(self._calls)
            while True:
                try:
                    self._queue.get_nowait()
                except queue.Empty:
                    break
            for future in calls:  # their mails were discarded: their callers must not wait forever
                if not future.done():
                    future.set_exception(MailboxClosedError(f"{self._thread.name} was closed before this call ran"))
        self._queue.put(None)
        if self._thread.is_alive() and not self.is_mailbox_thread:
            self._thread.join(timeout_s)

    def _due(self) -> tuple[list[Action], float | None]:
        now = time.monotonic()
        due: list[Action] = []
        with self._lock:
            while self._timers and self._timers[0][0] <= now:
                _, _, action, timer = heapq.heappop(self._timers)
                if not timer.cancelled:
                    due.append(action)
            wait = self._timers[0][0] - now if self._timers else None
        return due, wait

    def _run(self) -> None:
        while True:
            due, wait = self._due()
            for timer_action in due:
                self._run_one(timer_action)
            try:
                action = self._queue.get(timeout=wait if wait is not None else 0.5)
            except queue.Empty:
                continue
            if action is None:
                return
            self._run_one(action)

    def _run_one(self, action: Action) -> None:
        if self._closed and self.discarding:
            return
        try:
            action()
        except BaseException as exc:
            log.exception("mailbox action failed")
            if self.on_error is not None:
                self.on_error(exc)

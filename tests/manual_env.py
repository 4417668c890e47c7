"""A deterministic CoordinatorEnvironment for unit tests of the pure coordinator logic: a manual
clock, a queue drained on demand, an I/O executor that runs inline, and an in-memory log that
commits every batch at once. It stands in for the runtime, not for Kafka: the same coordinator
runs over the real broker in the integration tests."""

from __future__ import annotations

import collections
import concurrent.futures
import heapq
import itertools
from typing import Any

from coordinator.environment import Batch


class InlineExecutor(concurrent.futures.Executor):
    def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # noqa: BLE001
            future.set_exception(exc)
        return future


class _Timer:
    cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualEnvironment:
    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self.now = start_ms
        self.queue: collections.deque = collections.deque()
        self.timers: list = []
        self.seq = itertools.count()
        self.log: list[Any] = []
        self.control: list[Any] = []
        self.events: list[Any] = []
        self.io_executor = InlineExecutor()
        self.fail_appends = False

    def now_ms(self) -> int:
        return self.now

    def execute(self, action) -> None:
        self.queue.append(action)

    def schedule(self, delay_ms: int, action):
        timer = _Timer()
        heapq.heappush(self.timers, (self.now + max(0, delay_ms), next(self.seq), action, timer))
        return timer

    def append(self, batch: Batch, on_committed=None) -> None:
        self.log.extend(batch.records)
        self.control.extend(batch.control)
        self.events.extend(batch.events)
        if on_committed is not None:
            self.queue.append(on_committed)

    def run(self) -> None:
        while self.queue:
            self.queue.popleft()()

    def advance(self, ms: int) -> None:
        end = self.now + ms
        self.run()
        while self.timers and self.timers[0][0] <= end:
            due, _, action, timer = heapq.heappop(self.timers)
            self.now = max(self.now, due)
            if not timer.cancelled:
                action()
            self.run()
        self.now = end
        self.run()

    def control_of(self, cls: type) -> list[Any]:
        return [m for m in self.control if isinstance(m, cls)]

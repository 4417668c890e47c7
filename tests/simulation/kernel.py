"""The simulation's kernel: a seeded scheduler of cooperative fibers on a simulated clock.

Every concurrent activity of the simulated world (a coordinator's mailbox thread, its I/O
executor, its log writer, the pipeline's driver loop, a Spark task) is a :class:`Lane` that runs
work items one at a time (or up to a bound, as an executor's threads). Each item runs in a
*fiber* (a greenlet: the real code runs unchanged on it), and a fiber stops only where it calls
a stand-in (the log, the consumer group, the source topic, the table): :meth:`World.call` asks
the seeded schedule what that call does this time:

- ``ok``: its effect lands and it returns;
- ``fail``: it raises its error, nothing landed;
- ``fail_after``: its effect lands, then it raises (an ambiguous outcome: a lost response);
- ``delay``: the fiber parks for a while, then the effect lands and the call returns;
- ``late``: the effect lands, then the fiber parks before the call returns;
- ``hang``: the fiber parks and the call never returns (until the process is killed, or the
  call's own timeout, when it has one, fires and raises).

While a fiber is parked the others run, so a call's effect and its caller's next step can be
separated by any other steps of the world. Only one fiber runs at a time and every choice comes
from one ``random.Random(seed)``, so a seed replays exactly. ``greenlet`` comes with the test
dependencies (Playwright requires it).
"""

from __future__ import annotations

import collections
import heapq
import itertools
import random
from collections.abc import Callable
from typing import Any

from greenlet import greenlet

#: ms since the Unix epoch of the simulated clock's zero (what ``env.now_ms`` reports at the start)
EPOCH_MS = 1_700_000_000_000

KINDS = ("ok", "fail", "fail_after", "delay", "late", "hang")


class Killed(BaseException):
    """Thrown into a fiber whose process was killed (SIGKILL): what it was doing never finishes."""


class CallTimedOut(Exception):
    """A hung call's own timeout fired (raised to the caller as the call's timeout error)."""


class Fiber:
    """One work item of a lane, on its own greenlet."""

    __slots__ = ("condition", "fn", "glet", "killed", "lane", "name", "wake_at", "wake_reason")

    def __init__(self, lane: Lane, name: str, fn: Callable[[], None]) -> None:
        self.lane = lane
        self.name = name
        self.fn = fn
        self.glet: greenlet | None = None
        self.wake_at: int | None = None  # sim ms at which a parked fiber may go on (None: not by time)
        self.condition: Callable[[], bool] | None = None  # or once this holds
        self.wake_reason = "ready"  # what the park returns when woken by time
        self.killed = False

    def __repr__(self) -> str:
        return f"<{self.lane.name}:{self.name}>"


class Lane:
    """A serial (``limit`` 1: a mailbox, a log writer, a driver) or bounded (an I/O executor)
    runner of work items, owned by a simulated process."""

    def __init__(self, world: World, name: str, owner: Any = None, limit: int = 1,
                 on_error: Callable[[BaseException], None] | None = None) -> None:
        self.world = world
        self.name = name
        self.owner = owner
        self.limit = limit
        self.on_error = on_error
        self.queue: collections.deque[tuple[str, Callable[[], None]]] = collections.deque()
        self.running: list[Fiber] = []
        self.accepting = True  # new items are queued
        self.dead = False  # killed: nothing more runs
        world.lanes.append(self)

    def submit(self, fn: Callable[[], None], name: str = "") -> bool:
        if not self.accepting or self.dead:
            return False
        self.queue.append((name, fn))
        return True

    def startable(self) -> bool:
        return not self.dead and bool(self.queue) and len(self.running) < self.limit

    def close(self, *, discard: bool) -> None:
        """Accept nothing more; ``discard``: drop what is queued too (what runs goes on)."""
        self.accepting = False
        if discard:
            self.queue.clear()

    def idle(self) -> bool:
        return not self.queue and not self.running


class Timer:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class World:
    """The scheduler, the clock and the schedule's randomness (see the module docstring)."""

    def __init__(self, seed: int, fault_rates: dict[str, float] | None = None, trace_limit: int = 400) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0
        self.main = greenlet.getcurrent()
        self.current: Fiber | None = None
        self.lanes: list[Lane] = []
        self.parked: list[Fiber] = []
        self._timers: list[tuple[int, int, Callable[[], None], Lane, Timer]] = []
        self._seq = itertools.count()
        #: per call kind: probability of each outcome but ``ok`` (see KINDS)
        self.fault_rates = dict(fault_rates or {})
        self.faults_injected: collections.Counter[str] = collections.Counter()
        self.trace: collections.deque[str] = collections.deque(maxlen=trace_limit)
        self.steps = 0
        self._deferred: list[Callable[[], None]] = []

    # -- tracing -------------------------------------------------------------------------------------
    def note(self, text: str) -> None:
        self.trace.append(f"[{self.steps:5d} t={self.now:>8d}] {text}")

    # -- time ----------------------------------------------------------------------------------------
    def now_ms(self) -> int:
        return EPOCH_MS + self.now

    def schedule(self, delay_ms: int, action: Callable[[], None], lane: Lane) -> Timer:
        """Run ``action`` on ``lane`` once the clock reaches now + ``delay_ms``."""
        timer = Timer()
        heapq.heappush(self._timers, (self.now + max(0, delay_ms), next(self._seq), action, lane, timer))
        return timer

    def fire_due_timers(self) -> int:
        fired = 0
        while self._timers and self._timers[0][0] <= self.now:
            _, _, action, lane, timer = heapq.heappop(self._timers)
            if not timer.cancelled and lane.submit(action, "timer"):
                fired += 1
        return fired

    def timers_due(self) -> bool:
        while self._timers and (self._timers[0][4].cancelled or self._timers[0][3].dead):
            heapq.heappop(self._timers)
        return bool(self._timers) and self._timers[0][0] <= self.now

    def next_time(self) -> int | None:
        """The next moment something is due: a timer or a parked fiber's wake-up."""
        candidates = [t[0] for t in self._timers[:1] if t[0] > self.now]
        candidates += [f.wake_at for f in self.parked if f.wake_at is not None and f.wake_at > self.now]
        return min(candidates) if candidates else None

    def advance(self, to: int | None = None) -> None:
        target = to if to is not None else self.next_time()
        self.now = max(self.now + 1, target if target is not None else self.now + 100)

    # -- fibers -----------------------------------------------------------------------------------------
    def in_fiber(self) -> bool:
        return self.current is not None

    def park(self, *, until: int | None = None, condition: Callable[[], bool] | None = None,
             reason: str = "ready") -> str:
        """Stop the current fiber until the clock reaches ``until`` or ``condition`` holds (the
        scheduler decides when it goes on); returns why it was woken.

        Raises:
            Killed: its process was killed meanwhile.
        """
        fiber = self.current
        if fiber is None:
            raise RuntimeError("park() outside a fiber")
        if fiber.killed:
            raise Killed()
        fiber.wake_at, fiber.condition, fiber.wake_reason = until, condition, reason
        self.parked.append(fiber)
        woken = self.main.switch()
        if fiber.killed:
            raise Killed()
        return woken

    def sleep(self, ms: float) -> None:
        if self.current is None:
            self.now += int(ms)
            return
        self.park(until=self.now + max(1, int(ms)))

    def resumable(self, fiber: Fiber) -> bool:
        if fiber.wake_at is not None and fiber.wake_at <= self.now:
            return True
        return fiber.condition is not None and fiber.condition()

    def start(self, lane: Lane) -> None:
        name, fn = lane.queue.popleft()
        fiber = Fiber(lane, name, fn)
        lane.running.append(fiber)

        def body() -> None:
            try:
                fn()
            except Killed:
                pass
            except BaseException as exc:  # handed to the lane (a mailbox halts its process)
                if lane.on_error is None or fiber.killed:
                    if fiber.killed:
                        return
                    raise
                lane.on_error(exc)
            finally:
                if fiber in lane.running:
                    lane.running.remove(fiber)

        fiber.glet = greenlet(body, parent=self.main)
        self._switch(fiber)

    def resume(self, fiber: Fiber) -> None:
        self.parked.remove(fiber)
        reason = fiber.wake_reason if fiber.wake_at is not None and fiber.wake_at <= self.now else "ready"
        self._switch(fiber, reason)

    def _switch(self, fiber: Fiber, *value: Any) -> None:
        assert fiber.glet is not None
        self.current = fiber
        try:
            fiber.glet.switch(*value)
        finally:
            self.current = None

    def kill_lane(self, lane: Lane) -> None:
        """SIGKILL: nothing queued runs, every parked fiber of ``lane`` unwinds at once (from a
        fiber: once it parks or ends, as the scheduler runs :meth:`run_deferred`)."""
        if self.current is not None:
            lane.accepting = False
            lane.queue.clear()
            self._deferred.append(lambda: self.kill_lane(lane))
            return
        lane.dead = True
        lane.accepting = False
        lane.queue.clear()
        for fiber in list(lane.running):
            fiber.killed = True
            if fiber in self.parked:
                self.parked.remove(fiber)
            if fiber.glet is not None and not fiber.glet.dead:
                self.current = fiber
                try:
                    fiber.glet.throw(Killed())
                finally:
                    self.current = None
            if fiber in lane.running:
                lane.running.remove(fiber)

    def run_deferred(self) -> None:
        """What a fiber asked of the scheduler (killing lanes, its own process's included)."""
        while self._deferred:
            self._deferred.pop(0)()

    # -- calls of stand-ins ------------------------------------------------------------------------------
    def outcome(self, kind: str, allowed: tuple[str, ...] = KINDS) -> str:
        """What this call of a stand-in does (see the module docstring); ``kind`` names the
        call's class in ``fault_rates`` (e.g. ``"table.commit"``, ``"log.commit"``)."""
        rates = self.fault_rates.get(kind) or self.fault_rates.get(kind.split(".", 1)[0])
        if not rates:
            return "ok"
        draw = self.rng.random()
        for name, rate in rates.items():
            if draw < rate:
                if name not in allowed:
                    return "ok"
                if name in ("delay", "late", "hang") and self.current is None:
                    return "ok"
                self.faults_injected[f"{kind}:{name}"] += 1
                return name
            draw -= rate
        return "ok"

    def delay_ms(self) -> int:
        return self.rng.choice((1, 1, 5, 5, 20, 20, 100, 100, 500, 2_000, 15_000, 45_000))

    def call(self, kind: str, effect: Callable[[], Any], error: Callable[[], BaseException], *,
             allowed: tuple[str, ...] = KINDS, timeout_ms: int | None = None,
             timeout_error: Callable[[], BaseException] | None = None, outcome: str | None = None) -> Any:
        """One call of a stand-in: its effect under the schedule's outcome for it.

        Args:
            kind: the call's class, for the fault rates and the trace.
            effect: what the call does (reads or writes the stand-in's state) and returns.
            error: the exception a failed call raises.
            allowed: the outcomes this call can have.
            timeout_ms: a hung call's own timeout; then ``timeout_error`` is raised (None: it
                hangs until its process dies).
            outcome: the outcome, drawn before (with :meth:`outcome`) by a caller whose error
                depends on it.
        """
        fiber = self.current
        if fiber is not None and fiber.killed:
            raise Killed()
        outcome = outcome or self.outcome(kind, allowed)
        if outcome != "ok":
            self.note(f"{fiber.lane.name if fiber else 'main'}: {kind} -> {outcome}")
        if outcome == "fail":
            raise error()
        if outcome == "delay":
            self.park(until=self.now + self.delay_ms())
        elif outcome == "hang":
            if timeout_ms is None:
                self.park()  # never woken but by a kill
                raise Killed()
            self.park(until=self.now + timeout_ms, reason="timeout")
            raise (timeout_error or error)()
        result = effect()
        if outcome == "fail_after":
            raise error()
        if outcome == "late":
            self.park(until=self.now + self.delay_ms())
        return result


class SimClock:
    """The ``time`` module as the simulated clock (patched into the modules whose retries and
    back-offs sleep, so a retry takes simulated time, never real time)."""

    def __init__(self, world: World) -> None:
        self.world = world

    def monotonic(self) -> float:
        return self.world.now / 1000.0

    def perf_counter(self) -> float:
        return self.world.now / 1000.0

    def time(self) -> float:
        return self.world.now_ms() / 1000.0

    def sleep(self, seconds: float) -> None:
        self.world.sleep(seconds * 1000.0)

"""Flink's restart strategies: whether, and after how long, a failed job starts again.

A job failure that a restart can cure (a lake commit that failed, Kafka unreachable past its retry
timeout, the coordinator log unwritable, more failed checkpoints in a row than tolerated) is a
*global failover* in Flink: the job restarts from its latest completed checkpoint, after the
delay its restart strategy gives, and ends FAILED only once the strategy gives up
(``RestartBackoffTimeStrategy.canRestart()`` false). Deterministic failures (a schema that does not
fit, a bad record under ``errors.tolerance=none``, a fenced coordinator) are never restarted.

The options are Flink's, under Flink's names and defaults (Flink 1.19+, FLIP-364), durations in
Flink's syntax (``500 ms``, ``1 s``, ``2 min``, ``1 h``; a bare number is ms):

=====================================================  ======================  ===================
``restart-strategy.type``                              exponential-delay       also ``fixed-delay``,
                                                                               ``failure-rate``,
                                                                               ``none`` (``off``,
                                                                               ``disable``)
``restart-strategy.fixed-delay.attempts``              1
``restart-strategy.fixed-delay.delay``                 1 s
``restart-strategy.failure-rate.max-failures-per-interval``  1
``restart-strategy.failure-rate.failure-rate-interval``      1 min
``restart-strategy.failure-rate.delay``                1 s
``restart-strategy.exponential-delay.initial-backoff``  1 s
``restart-strategy.exponential-delay.max-backoff``     1 min
``restart-strategy.exponential-delay.backoff-multiplier``   1.5
``restart-strategy.exponential-delay.reset-backoff-threshold``  1 h
``restart-strategy.exponential-delay.jitter-factor``   0.1
``restart-strategy.exponential-delay.attempts-before-reset-backoff``  unlimited
=====================================================  ======================  ===================

Pure logic with an injected clock (ms); the pipeline (``chandy.connectors.spark.pipeline``)
applies it.
"""

from __future__ import annotations

import dataclasses
import random
import re
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from chandy.coordinator.errors import ChandyError

PREFIX = "restart-strategy."
_TYPES = {"none": "none", "off": "none", "disable": "none", "fixed-delay": "fixed-delay", "fixeddelay": "fixed-delay",
          "failure-rate": "failure-rate", "failurerate": "failure-rate", "exponential-delay": "exponential-delay",
          "exponentialdelay": "exponential-delay"}
_UNITS_MS = {"ms": 1, "milli": 1, "millis": 1, "millisecond": 1, "milliseconds": 1, "s": 1000, "sec": 1000,
             "secs": 1000, "second": 1000, "seconds": 1000, "min": 60_000, "m": 60_000, "minute": 60_000,
             "minutes": 60_000, "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000, "d": 86_400_000,
             "day": 86_400_000, "days": 86_400_000}
UNLIMITED = 2**31 - 1  # Flink's Integer.MAX_VALUE


class RestartStrategyConfigError(ChandyError):
    """A ``restart-strategy.*`` option is unknown or its value is not valid."""


def parse_duration_ms(text: str, key: str) -> int:
    """A Flink duration (``500 ms``, ``1 s``, ``2min``, ``1 h``; a bare number is ms) in ms.

    Raises:
        RestartStrategyConfigError: not a duration, or negative.
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or (unit and unit not in _UNITS_MS):
        raise RestartStrategyConfigError(f"{key}: {text!r} is not a duration (e.g. '500 ms', '1 s', '2 min', '1 h')")
    return int(float(match.group(1)) * _UNITS_MS.get(unit, 1))


@dataclasses.dataclass(frozen=True)
class RestartStrategyOptions:
    """The ``restart-strategy.*`` options (see the module docstring); times in ms."""

    type: str = "exponential-delay"
    fixed_delay_attempts: int = 1
    fixed_delay_delay_ms: int = 1_000
    failure_rate_max_failures_per_interval: int = 1
    failure_rate_interval_ms: int = 60_000
    failure_rate_delay_ms: int = 1_000
    initial_backoff_ms: int = 1_000
    max_backoff_ms: int = 60_000
    backoff_multiplier: float = 1.5
    reset_backoff_threshold_ms: int = 3_600_000
    jitter_factor: float = 0.1
    attempts_before_reset_backoff: int = UNLIMITED

    _KEYS = {  # Flink key (after "restart-strategy.") -> (field, kind)
        "type": ("type", "type"),
        "fixed-delay.attempts": ("fixed_delay_attempts", "count"),
        "fixed-delay.delay": ("fixed_delay_delay_ms", "duration"),
        "failure-rate.max-failures-per-interval": ("failure_rate_max_failures_per_interval", "count"),
        "failure-rate.failure-rate-interval": ("failure_rate_interval_ms", "duration"),
        "failure-rate.delay": ("failure_rate_delay_ms", "duration"),
        "exponential-delay.initial-backoff": ("initial_backoff_ms", "duration"),
        "exponential-delay.max-backoff": ("max_backoff_ms", "duration"),
        "exponential-delay.backoff-multiplier": ("backoff_multiplier", "float"),
        "exponential-delay.reset-backoff-threshold": ("reset_backoff_threshold_ms", "duration"),
        "exponential-delay.jitter-factor": ("jitter_factor", "float"),
        "exponential-delay.attempts-before-reset-backoff": ("attempts_before_reset_backoff", "count"),
    }

    @classmethod
    def from_flink_config(cls, config: Mapping[str, str]) -> RestartStrategyOptions:
        """The options set in ``config`` (Flink keys, e.g. ``restart-strategy.fixed-delay.attempts``),
        the rest at Flink's defaults.

        Raises:
            RestartStrategyConfigError: an unknown ``restart-strategy.*`` key or a bad value,
                naming the key.
        """
        values: dict[str, Any] = {}  # field name -> its parsed value (a str, int or float, per _KEYS)
        for key, raw in config.items():
            name = key[len(PREFIX):] if key.startswith(PREFIX) else None
            if name is None or name not in cls._KEYS:
                known = ", ".join(PREFIX + k for k in cls._KEYS)
                raise RestartStrategyConfigError(f"unknown restart strategy option {key!r}: the options are {known}")
            field, kind = cls._KEYS[name]
            text = str(raw).strip()
            try:
                if kind == "type":
                    if text.lower() not in _TYPES:
                        raise ValueError(f"one of {', '.join(sorted(set(_TYPES)))}")
                    values[field] = _TYPES[text.lower()]
                elif kind == "duration":
                    values[field] = parse_duration_ms(text, key)
                elif kind == "count":
                    count = int(text)
                    if count < 0:
                        raise ValueError("0 or more")
                    values[field] = count
                else:
                    number = float(text)
                    if number < 0 or (field == "backoff_multiplier" and number < 1) or \
                            (field == "jitter_factor" and number > 1):
                        raise ValueError("a multiplier >= 1" if field == "backoff_multiplier" else "between 0 and 1")
                    values[field] = number
            except ValueError as exc:
                raise RestartStrategyConfigError(f"{key}: {text!r} is not valid ({exc})") from exc
        return dataclasses.replace(cls(), **values)

    def describe(self) -> str:
        """One line, for logs and ``--help``: the strategy and its settings."""
        if self.type == "none":
            return "none (a failure fails the job)"
        if self.type == "fixed-delay":
            return f"fixed-delay ({self.fixed_delay_attempts} attempt(s), {self.fixed_delay_delay_ms} ms apart)"
        if self.type == "failure-rate":
            return (f"failure-rate (at most {self.failure_rate_max_failures_per_interval} failure(s) per "
                    f"{self.failure_rate_interval_ms} ms, {self.failure_rate_delay_ms} ms apart)")
        attempts = "unlimited" if self.attempts_before_reset_backoff >= UNLIMITED else self.attempts_before_reset_backoff
        return (f"exponential-delay ({self.initial_backoff_ms} ms x{self.backoff_multiplier} up to "
                f"{self.max_backoff_ms} ms, jitter {self.jitter_factor}, attempts {attempts})")


class RestartBackoffTimeStrategy(Protocol):
    """Flink's ``RestartBackoffTimeStrategy``: told of each failure, says whether the job may
    restart and after how long."""

    def notify_failure(self) -> None: ...

    def can_restart(self) -> bool: ...

    def backoff_time_ms(self) -> int: ...


class NoRestartStrategy:
    """``none``: every failure fails the job."""

    def notify_failure(self) -> None:
        pass

    def can_restart(self) -> bool:
        return False

    def backoff_time_ms(self) -> int:
        return 0


class FixedDelayRestartStrategy:
    """``fixed-delay``: at most ``attempts`` restarts over the job's life, ``delay_ms`` apart
    (Flink's ``FixedDelayRestartBackoffTimeStrategy``)."""

    def __init__(self, attempts: int, delay_ms: int) -> None:
        self.attempts, self.delay_ms, self.failures = attempts, delay_ms, 0

    def notify_failure(self) -> None:
        self.failures += 1

    def can_restart(self) -> bool:
        return self.failures <= self.attempts

    def backoff_time_ms(self) -> int:
        return self.delay_ms


class FailureRateRestartStrategy:
    """``failure-rate``: restarts ``delay_ms`` apart while at most ``max_failures`` failures fall
    within any ``interval_ms`` (Flink's ``FailureRateRestartBackoffTimeStrategy``)."""

    def __init__(self, max_failures: int, interval_ms: int, delay_ms: int, clock: Callable[[], int]) -> None:
        self.max_failures, self.interval_ms, self.delay_ms, self.clock = max_failures, interval_ms, delay_ms, clock
        self.failures: deque[int] = deque()

    def notify_failure(self) -> None:
        now = self.clock()
        self.failures.append(now)
        while self.failures and now - self.failures[0] > self.interval_ms:
            self.failures.popleft()

    def can_restart(self) -> bool:
        return len(self.failures) <= self.max_failures

    def backoff_time_ms(self) -> int:
        return self.delay_ms


class ExponentialDelayRestartStrategy:
    """``exponential-delay``: the first restart after ``initial_backoff_ms``, each next one's delay
    times ``multiplier`` up to ``max_backoff_ms``, with ± ``jitter_factor`` of it at random; a job
    that ran ``reset_threshold_ms`` past its last backoff without failing starts again at the
    initial delay (and its attempt count at 0); more than ``attempts_before_reset`` failures in a
    row fail the job (Flink's ``ExponentialDelayRestartBackoffTimeStrategy``)."""

    def __init__(self, options: RestartStrategyOptions, clock: Callable[[], int],
                 rng: random.Random | None = None) -> None:
        self.options, self.clock, self.rng = options, clock, rng or random.Random()
        self.current_backoff_ms = 0
        self.attempts = 0
        self.last_failure_ms: int | None = None

    def notify_failure(self) -> None:
        opts, now = self.options, self.clock()
        quiet = (self.last_failure_ms is not None
                 and now - self.last_failure_ms >= opts.reset_backoff_threshold_ms + self.current_backoff_ms)
        if self.last_failure_ms is None or quiet:
            self.current_backoff_ms, self.attempts = opts.initial_backoff_ms, 0
        else:
            self.current_backoff_ms = min(int(self.current_backoff_ms * opts.backoff_multiplier), opts.max_backoff_ms)
        self.attempts += 1
        self.last_failure_ms = now

    def can_restart(self) -> bool:
        return self.attempts <= self.options.attempts_before_reset_backoff

    def backoff_time_ms(self) -> int:
        jitter = self.current_backoff_ms * self.options.jitter_factor
        return max(0, int(self.current_backoff_ms + self.rng.uniform(-jitter, jitter)))


def create_restart_strategy(options: RestartStrategyOptions,
                            clock: Callable[[], int] = lambda: int(time.monotonic() * 1000)) -> RestartBackoffTimeStrategy:
    """The strategy ``options.type`` names, with ``clock`` (ms) for its time windows."""
    if options.type == "none":
        return NoRestartStrategy()
    if options.type == "fixed-delay":
        return FixedDelayRestartStrategy(options.fixed_delay_attempts, options.fixed_delay_delay_ms)
    if options.type == "failure-rate":
        return FailureRateRestartStrategy(options.failure_rate_max_failures_per_interval,
                                          options.failure_rate_interval_ms, options.failure_rate_delay_ms, clock)
    return ExponentialDelayRestartStrategy(options, clock)

"""Flink's restart strategies (chandy.coordinator.restart_strategy), as Flink's
``RestartBackoffTimeStrategy`` implementations and ``RestartStrategyOptions`` define them: their
options under Flink's keys and defaults, and when each gives up."""

from __future__ import annotations

import random

import pytest

from chandy.coordinator.restart_strategy import (
    UNLIMITED,
    ExponentialDelayRestartStrategy,
    FailureRateRestartStrategy,
    FixedDelayRestartStrategy,
    NoRestartStrategy,
    RestartStrategyConfigError,
    RestartStrategyOptions,
    create_restart_strategy,
    parse_duration_ms,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def test_the_default_is_flinks_exponential_delay() -> None:
    options = RestartStrategyOptions.from_flink_config({})
    assert options.type == "exponential-delay"
    assert (options.initial_backoff_ms, options.max_backoff_ms, options.backoff_multiplier) == (1_000, 60_000, 1.5)
    assert (options.reset_backoff_threshold_ms, options.jitter_factor) == (3_600_000, 0.1)
    assert options.attempts_before_reset_backoff == UNLIMITED
    assert isinstance(create_restart_strategy(options), ExponentialDelayRestartStrategy)


@pytest.mark.parametrize(("text", "ms"), [("500 ms", 500), ("1 s", 1000), ("2min", 120_000), ("1 h", 3_600_000),
                                          ("250", 250), ("1.5 s", 1500), ("3 seconds", 3000)])
def test_durations_in_flinks_syntax(text: str, ms: int) -> None:
    assert parse_duration_ms(text, "k") == ms


@pytest.mark.parametrize(("config", "error"), [
    ({"restart-strategy.fixed-delay.atempts": "3"}, r"unknown restart strategy option 'restart-strategy.fixed-delay."
                                                    r"atempts'"),
    ({"restart-strategy.type": "sometimes"}, r"restart-strategy.type: 'sometimes' is not valid"),
    ({"restart-strategy.fixed-delay.delay": "soon"}, r"restart-strategy.fixed-delay.delay: 'soon' is not a duration"),
    ({"restart-strategy.fixed-delay.attempts": "-1"}, r"attempts: '-1' is not valid \(0 or more\)"),
    ({"restart-strategy.exponential-delay.backoff-multiplier": "0.5"}, r"backoff-multiplier: '0.5' is not valid"),
])
def test_bad_options_name_the_key(config: dict[str, str], error: str) -> None:
    with pytest.raises(RestartStrategyConfigError, match=error):
        RestartStrategyOptions.from_flink_config(config)


def test_type_aliases_are_flinks() -> None:
    for alias, name in (("off", "none"), ("disable", "none"), ("fixeddelay", "fixed-delay"),
                        ("failurerate", "failure-rate"), ("exponentialdelay", "exponential-delay")):
        assert RestartStrategyOptions.from_flink_config({"restart-strategy.type": alias}).type == name


def test_none_never_restarts() -> None:
    strategy = NoRestartStrategy()
    strategy.notify_failure()
    assert not strategy.can_restart()


def test_fixed_delay_restarts_attempts_times_over_the_jobs_life() -> None:
    strategy = FixedDelayRestartStrategy(attempts=3, delay_ms=250)
    verdicts = []
    for _ in range(4):
        strategy.notify_failure()
        verdicts.append(strategy.can_restart())
    assert verdicts == [True, True, True, False]
    assert strategy.backoff_time_ms() == 250


def test_failure_rate_gives_up_on_too_many_failures_within_the_interval() -> None:
    clock = Clock()
    strategy = FailureRateRestartStrategy(max_failures=2, interval_ms=60_000, delay_ms=100, clock=clock)
    strategy.notify_failure()
    clock.now = 30_000
    strategy.notify_failure()
    assert strategy.can_restart()
    clock.now = 70_001  # the first failure left the interval: 2 within it
    strategy.notify_failure()
    assert strategy.can_restart()
    clock.now = 70_002  # three within one minute
    strategy.notify_failure()
    assert not strategy.can_restart()


def test_exponential_delay_grows_caps_and_resets_after_a_quiet_spell() -> None:
    clock = Clock()
    options = RestartStrategyOptions(initial_backoff_ms=1_000, max_backoff_ms=5_000, backoff_multiplier=2.0,
                                     reset_backoff_threshold_ms=60_000, jitter_factor=0.0)
    strategy = ExponentialDelayRestartStrategy(options, clock)
    delays = []
    for _ in range(5):
        strategy.notify_failure()
        assert strategy.can_restart()
        delays.append(strategy.backoff_time_ms())
        clock.now += 1_000
    assert delays == [1_000, 2_000, 4_000, 5_000, 5_000]
    clock.now += 60_000 + 5_000  # quiet for the threshold past the last backoff
    strategy.notify_failure()
    assert strategy.backoff_time_ms() == 1_000 and strategy.attempts == 1


def test_exponential_delay_jitter_stays_within_its_factor_and_attempts_end_it() -> None:
    options = RestartStrategyOptions(initial_backoff_ms=10_000, jitter_factor=0.1, attempts_before_reset_backoff=2)
    strategy = ExponentialDelayRestartStrategy(options, Clock(), random.Random(7))
    strategy.notify_failure()
    assert 9_000 <= strategy.backoff_time_ms() <= 11_000
    strategy.notify_failure()
    assert strategy.can_restart()
    strategy.notify_failure()
    assert not strategy.can_restart()

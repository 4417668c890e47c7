"""Checkpointing options, with Flink's names and meanings.

| field                         | Flink option                                          | default |
| ----------------------------- | ----------------------------------------------------- | ------- |
| ``interval_ms``               | ``execution.checkpointing.interval``                  | 10 s    |
| ``timeout_ms``                | ``execution.checkpointing.timeout``                   | 10 min  |
| ``min_pause_ms``              | ``execution.checkpointing.min-pause``                 | 0       |
| ``max_concurrent``            | ``execution.checkpointing.max-concurrent-checkpoints``| 1       |
| ``tolerable_failed``          | ``execution.checkpointing.tolerable-failed-checkpoints`` | 0    |
| ``num_retained``              | ``state.checkpoints.num-retained``                    | 1       |
| ``checkpoint_dir``            | ``state.checkpoints.dir`` (any fsspec URL)            | none    |
| ``savepoint_dir``             | ``state.savepoints.dir``                              | none    |
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from chandy.coordinator.errors import ChandyError

#: Flink option name -> field of :class:`CheckpointingOptions`.
FLINK_OPTION_NAMES = {
    "execution.checkpointing.interval": "interval_ms",
    "execution.checkpointing.timeout": "timeout_ms",
    "execution.checkpointing.min-pause": "min_pause_ms",
    "execution.checkpointing.max-concurrent-checkpoints": "max_concurrent",
    "execution.checkpointing.tolerable-failed-checkpoints": "tolerable_failed",
    "state.checkpoints.num-retained": "num_retained",
    "state.checkpoints.dir": "checkpoint_dir",
    "state.savepoints.dir": "savepoint_dir",
}


class InvalidOptionsError(ChandyError):
    """A checkpointing option has a value Flink would reject."""


@dataclasses.dataclass(frozen=True)
class CheckpointingOptions:
    """How the CheckpointCoordinator schedules and bounds checkpoints (times in ms).

    ``interval_ms <= 0`` disables periodic checkpoints (manual and forced triggers still work).
    The first periodic trigger comes after a random initial delay within the interval, as Flink's
    ``CheckpointCoordinator.getRandomInitDelay`` (set ``random_initial_delay=False`` to start
    after exactly one ``min_pause_ms``).
    """

    interval_ms: int = 10_000
    timeout_ms: int = 600_000
    min_pause_ms: int = 0
    max_concurrent: int = 1
    tolerable_failed: int = 0
    num_retained: int = 1
    checkpoint_dir: str | None = None
    savepoint_dir: str | None = None
    random_initial_delay: bool = True
    #: Flink's pre-flight check: no checkpoint is triggered (no ID taken, not a failure; a periodic
    #: trigger tries again next period) until every subtask of every operator has reported a running
    #: attempt (``SubtaskAttemptReady``) to this coordinator. A coordinator that starts leading a job
    #: announces its epoch (``COORDINATOR_ELECTED_EVENT``), and running attempts report ready again.
    #: Off only for a driver that launches its subtasks itself for each checkpoint (the Spark
    #: pipeline: its tasks exist only while the checkpoint they were started for runs)
    wait_for_running_subtasks: bool = True

    def __post_init__(self) -> None:
        if self.timeout_ms < 1:
            raise InvalidOptionsError(f"execution.checkpointing.timeout must be >= 1 ms, got {self.timeout_ms}")
        if self.min_pause_ms < 0:
            raise InvalidOptionsError(f"execution.checkpointing.min-pause must be >= 0, got {self.min_pause_ms}")
        if self.max_concurrent < 1:
            raise InvalidOptionsError(
                f"execution.checkpointing.max-concurrent-checkpoints must be >= 1, got {self.max_concurrent}"
            )
        if self.tolerable_failed < 0:
            raise InvalidOptionsError(
                f"execution.checkpointing.tolerable-failed-checkpoints must be >= 0, got {self.tolerable_failed}"
            )
        if self.num_retained < 1:
            raise InvalidOptionsError(f"state.checkpoints.num-retained must be >= 1, got {self.num_retained}")

    @property
    def periodic(self) -> bool:
        """Whether periodic checkpoints are enabled (``interval_ms > 0``)."""
        return self.interval_ms > 0

    @classmethod
    def from_flink(cls, settings: Mapping[str, Any]) -> CheckpointingOptions:
        """Options from Flink-named settings (values in ms / counts / URLs).

        Raises:
            InvalidOptionsError: an unknown name, or a value that is not a number where one is needed.
        """
        fields: dict[str, Any] = {}
        for name, value in settings.items():
            field = FLINK_OPTION_NAMES.get(name)
            if field is None:
                raise InvalidOptionsError(f"unknown checkpointing option {name!r}; known: {', '.join(FLINK_OPTION_NAMES)}")
            if field.endswith("_dir"):
                fields[field] = str(value)
            else:
                try:
                    fields[field] = int(value)
                except (TypeError, ValueError) as exc:
                    raise InvalidOptionsError(f"{name} must be an integer, got {value!r}") from exc
        return cls(**fields)

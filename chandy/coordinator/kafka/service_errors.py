"""Why a :class:`~chandy.coordinator.kafka.runtime.CoordinatorService` is not running (re-exported
by :mod:`chandy.coordinator.kafka.runtime`, where they were defined)."""

from __future__ import annotations

from chandy.coordinator.errors import ChandyError


class CoordinatorStoppedError(ChandyError):
    """The coordinator service is not running."""


class RestoreTimeoutError(CoordinatorStoppedError):
    """The coordinator's start (its restore: every operator coordinator's ``reset_to_checkpoint``)
    did not finish within the ``restore_timeout_s`` given to :meth:`CoordinatorService.start`;
    the message names what it was doing. The service stopped."""


class JobTerminatedError(CoordinatorStoppedError):
    """The job's log ends in a globally terminal status (FINISHED, CANCELED, FAILED: Flink's
    ``JobStatus.isGloballyTerminalState``): a standby does not restart it, and a new run needs an
    explicit restore (``restore_from``) or a new job ID. ``status`` is the status's name."""

    def __init__(self, message: str, status: str) -> None:
        super().__init__(message)
        self.status = status

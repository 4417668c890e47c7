"""The errors of :mod:`chandy.formats`: one family, :class:`FormatError`, under
:class:`~chandy.coordinator.errors.ChandyError`.

A format error is deterministic: the same bytes, schema or setting fail the same way on every
attempt, so no restart cures it (Flink's ``SuppressRestartsException``); the pipeline fails the
job with it, or routes the record to the dead letters when ``--errors-tolerance all`` says so.
The Schema Registry's own failures are not format errors: a registry that is down or refuses may
answer after a restart, so :class:`~chandy.formats.registry.RegistryError` is a plain
:class:`~chandy.coordinator.errors.ChandyError`.
"""

from __future__ import annotations

from chandy.coordinator.errors import SuppressRestartsError


class FormatError(SuppressRestartsError):
    """A key, value or schema that Chandy cannot turn into columns; a restart does not cure it."""

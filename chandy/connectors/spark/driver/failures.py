"""Why a Spark job failed, and whether a restart can cure it.

A Spark task's exception reaches the driver only as text (a Py4J error, or PySpark's
``PythonException`` carrying the task's traceback), so its class is known only by name.
:func:`root_cause` finds the one line that says why; :func:`error_class` resolves a class name in
it to Chandy's error class, and :func:`restart_cannot_cure` asks that class, as Flink asks a
failure whether it is a ``SuppressRestartsException``: a failure a restart would meet again (a
record, schema or setting that does not fit, data lost from Kafka, an acknowledgement too large
for Kafka) fails the job at once instead of being retried.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re
from collections.abc import Iterator

from chandy.coordinator.errors import ChandyError, SuppressRestartsError
from chandy.coordinator.kafka.participant import AckTooLargeError

#: Chandy's errors a restart cannot cure: :class:`SuppressRestartsError` (Flink's
#: ``SuppressRestartsException``) and its subclasses (``FormatError``, ``LakeSchemaError``,
#: ``KafkaDataLossError``, ``AckTooLargeError``: the same ranges make the same ack, ...)
RESTART_PROOF: tuple[type[ChandyError], ...] = (SuppressRestartsError,)
#: errors that are not Chandy's but that a restart cannot cure either, by name: a module missing in
#: the executors' Python survived Spark's own task retries, on any executor it tried
RESTART_PROOF_NAMES = frozenset({"ModuleNotFoundError"})
#: where the errors a Spark task raises are defined: imported before a name is resolved, since
#: the driver may not have imported them (packages are imported module by module)
ERROR_MODULES = ("chandy.formats", "chandy.connectors.lake.sink", "chandy.connectors.kafka.source.reader",
                 "chandy.connectors.spark.ddl")
#: what to change when an acknowledgement is too large for Kafka
ACK_TOO_LARGE_REMEDY = "lower --max-records-per-checkpoint or raise --write-buffer-bytes"

_CAUSE = re.compile(r"^(?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*(?:Error|Exception|Invalid)): (.+)$", re.MULTILINE)
_WRAPPERS = {"PythonException", "Py4JJavaError", "SparkException", "AnalysisException", "CheckpointException"}
_JAVA_CAUSE = re.compile(r"^Caused by: (?:[A-Za-z_][\w$]*\.)*([A-Za-z_][\w$]*): (.+)$", re.MULTILINE)
_ERROR_NAME = re.compile(r"\b([A-Za-z_]\w*(?:Error|Exception))\b")


@functools.cache
def _import_error_modules() -> None:
    for name in ERROR_MODULES:
        module = importlib.import_module(name)
        for found in pkgutil.iter_modules(getattr(module, "__path__", []), f"{name}."):
            importlib.import_module(found.name)


def _subclasses(cls: type[ChandyError]) -> Iterator[type[ChandyError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def error_class(name: str) -> type[ChandyError] | None:
    """Chandy's error class whose ``__name__`` is ``name`` (``BadRecordError``, as a Spark task's
    traceback names it without its module), found among :class:`ChandyError`'s subclasses once the
    modules of :data:`ERROR_MODULES` are imported; None when Chandy has no error of that name
    (Python's, a library's). Chandy's error names are unique."""
    _import_error_modules()
    return next((cls for cls in _subclasses(ChandyError) if cls.__name__ == name), None)


def restart_cannot_cure(name: str) -> bool:
    """Whether the error class called ``name`` fails the same way on every attempt: a subclass of
    :data:`RESTART_PROOF` (every ``SuppressRestartsError``: ``FormatError`` and its kin,
    ``LakeSchemaError``, ``KafkaDataLossError``, ``DdlError``, ...), or one of
    :data:`RESTART_PROOF_NAMES`."""
    if name in RESTART_PROOF_NAMES:
        return True
    cls = error_class(name)
    return cls is not None and issubclass(cls, RESTART_PROOF)


def root_cause(error: BaseException | str) -> str:
    """The one line that says why: the first error raised in a Spark task that a restart cannot
    cure (:func:`restart_cannot_cure`; its class and message), else the innermost Python error,
    else the outermost Java cause of a Py4J error (the first ``Caused by: ...`` that is not a
    wrapper), else the first line of ``error``."""
    text = str(error)
    found = [(m.group(1), m.group(2).strip()) for m in _CAUSE.finditer(text) if m.group(1) not in _WRAPPERS]
    for name, message in found:
        if restart_cannot_cure(name):
            return f"{name}: {message}"
    if found:
        name, message = found[-1]
        return f"{name}: {message}"
    java = [(m.group(1), m.group(2).strip()) for m in _JAVA_CAUSE.finditer(text) if m.group(1) not in _WRAPPERS]
    if java:
        name, message = java[0]
        return f"{name}: {message}"
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(error).__name__)
    return first


def fatal_failure(message: str) -> str | None:
    """``message`` (a root cause, ``<ErrorClass>: <text>``) as the job's failure when a restart
    cannot cure its error, with what to change when it is an acknowledgement too large for Kafka;
    None when a retry may succeed."""
    name = message.split(":")[0]
    if not restart_cannot_cure(name):
        return None
    cls = error_class(name)
    return f"{message} ({ACK_TOO_LARGE_REMEDY})" if cls is not None and issubclass(cls, AckTooLargeError) else message


def names_ack_too_large(text: str) -> bool:
    """Whether ``text`` (a failed checkpoint's reason: a subtask's decline names its error's
    class) names an :class:`AckTooLargeError`, which the same ranges would raise again."""
    return any((cls := error_class(name)) is not None and issubclass(cls, AckTooLargeError)
               for name in set(_ERROR_NAME.findall(text)))

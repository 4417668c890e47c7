"""A Spark task's failure reaches the driver as text; the driver resolves the error class it names
and asks the class whether a restart can cure it (chandy/connectors/spark/driver/failures.py; no
Spark: the functions alone)."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import chandy.formats
from chandy.connectors.spark.driver.failures import (
    ACK_TOO_LARGE_REMEDY,
    error_class,
    fatal_failure,
    names_ack_too_large,
    restart_cannot_cure,
    root_cause,
)
from chandy.coordinator.errors import SuppressRestartsError
from chandy.formats.errors import FormatError

#: the errors the driver failed the job on by name before it classified them by class
NAMED_BEFORE = ("BadRecordError", "LakeSchemaError", "DdlError", "AvroValueSchemaError", "SchemaChangeError",
                "KafkaDataLossError", "ProtobufSchemaError", "ModuleNotFoundError", "AckTooLargeError")


def _format_errors() -> list[type]:
    for found in pkgutil.iter_modules(chandy.formats.__path__, "chandy.formats."):
        importlib.import_module(found.name)
    pending, seen = [FormatError], []
    while pending:
        cls = pending.pop()
        seen.append(cls)
        pending.extend(cls.__subclasses__())
    return seen


@pytest.mark.parametrize("name", NAMED_BEFORE)
def test_every_error_that_failed_the_job_before_still_does(name: str) -> None:
    assert restart_cannot_cure(name)


def test_every_format_error_fails_the_job_by_its_class() -> None:
    errors = _format_errors()
    assert {"BadRecordError", "SchemaChangeError", "JsonSchemaError", "ProtobufSchemaError"} <= {e.__name__ for e in errors}
    for cls in errors:
        assert error_class(cls.__name__) is cls
        assert restart_cannot_cure(cls.__name__), cls


@pytest.mark.parametrize("name", ["ValueError", "KafkaException", "PipelineError", "LakeCommitError", "RangeReadError",
                                  "CheckpointException", "NoSuchError"])
def test_errors_a_restart_may_cure_are_retried(name: str) -> None:
    assert not restart_cannot_cure(name)


def test_ddl_errors_suppress_restarts_by_type() -> None:
    from chandy.connectors.spark.ddl import DdlError

    assert issubclass(DdlError, SuppressRestartsError)


def test_the_root_cause_is_the_first_error_no_restart_cures() -> None:
    text = ("pyspark.errors.exceptions.captured.PythonException: \n  An exception was thrown from the Python worker.\n"
            "Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
            "chandy.formats.decoder.BadRecordError: topic t partition 0 offset 7: not JSON\n"
            "\nDuring handling of the above exception, another exception occurred:\n\n"
            "ValueError: cleanup failed\n")
    assert root_cause(text) == "BadRecordError: topic t partition 0 offset 7: not JSON"
    assert root_cause("ValueError: a\nKeyError: b\n") == "KeyError: b"


def test_an_ack_too_large_fails_the_job_saying_what_to_change() -> None:
    message = "AckTooLargeError: the acknowledgement of checkpoint 3 is 2,000,000 bytes"
    assert fatal_failure(message) == f"{message} ({ACK_TOO_LARGE_REMEDY})"
    assert fatal_failure("BadRecordError: offset 7") == "BadRecordError: offset 7"
    assert fatal_failure("KafkaException: broker down") is None
    assert names_ack_too_large("checkpoint 3 failed: CHECKPOINT_DECLINED: AckTooLargeError: the acknowledgement ...")
    assert not names_ack_too_large("checkpoint 3 failed: CHECKPOINT_DECLINED: BadRecordError: offset 7")

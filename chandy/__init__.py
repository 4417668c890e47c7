"""Chandy: Apache Flink's checkpointing contract in Python, with Apache Kafka as its nervous
system and its memory, and an exactly-once Kafka-to-lake pipeline on Spark.

The public API, in one namespace::

    from chandy import CoordinatorService, CheckpointParticipant, CheckpointingOptions, Pipeline, subscribe
    from chandy import read_lake_commit, wait_for_lake_commit

This package is the application layer (the ``chandy`` command line, the demo, the embedded
broker tooling); the names below are re-exported from the layers beneath it (``schemas`` <-
``coordinator`` <- ``coordinator.kafka`` <- ``connectors``). Heavy modules (Spark) load lazily.
"""

from __future__ import annotations

from importlib import metadata as _metadata
from typing import TYPE_CHECKING, Any

try:
    __version__ = _metadata.version("chandy")
except _metadata.PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0"

_EXPORTS = {
    "CheckpointingOptions": "chandy.coordinator.options",
    "CheckpointFailureReason": "chandy.coordinator.failure",
    "CheckpointException": "chandy.coordinator.failure",
    "ChandyError": "chandy.coordinator.errors",
    "StateHandle": "chandy.coordinator.messages",
    "CoordinatorService": "chandy.coordinator.kafka.runtime",
    "CheckpointParticipant": "chandy.coordinator.kafka.participant",
    "subscribe": "chandy.coordinator.kafka.subscriber",
    "subscribe_async": "chandy.coordinator.kafka.subscriber",
    "Pipeline": "chandy.connectors.spark.pipeline",
    "PipelineOptions": "chandy.connectors.spark.options",
    "verify_table": "chandy.connectors.spark.verify",
    "read_lake_commit": "chandy.connectors.lake.tables",
    "wait_for_lake_commit": "chandy.coordinator.kafka.subscriber",
}

__all__ = ["__version__", *sorted(_EXPORTS)]

if TYPE_CHECKING:
    from chandy.connectors.lake.tables import read_lake_commit as read_lake_commit
    from chandy.connectors.spark.options import PipelineOptions as PipelineOptions
    from chandy.connectors.spark.pipeline import Pipeline as Pipeline
    from chandy.connectors.spark.verify import verify_table as verify_table
    from chandy.coordinator.errors import ChandyError as ChandyError
    from chandy.coordinator.failure import CheckpointException as CheckpointException
    from chandy.coordinator.failure import CheckpointFailureReason as CheckpointFailureReason
    from chandy.coordinator.kafka.participant import CheckpointParticipant as CheckpointParticipant
    from chandy.coordinator.kafka.runtime import CoordinatorService as CoordinatorService
    from chandy.coordinator.kafka.subscriber import subscribe as subscribe
    from chandy.coordinator.kafka.subscriber import subscribe_async as subscribe_async
    from chandy.coordinator.kafka.subscriber import wait_for_lake_commit as wait_for_lake_commit
    from chandy.coordinator.messages import StateHandle as StateHandle
    from chandy.coordinator.options import CheckpointingOptions as CheckpointingOptions


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'chandy' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)

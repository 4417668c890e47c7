"""Checkpoints end to end on one machine: a coordinator and N worker participants over Kafka.

Used by ``chandy checkpoint demo`` (part of ``make demo``) and by
``benchmarks/checkpoint_latency.py``. Each worker is a real
:class:`~coordinator.kafka.participant.CheckpointParticipant` with its own Kafka clients, acknowledging
every checkpoint with one small inline state handle.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from typing import Any

from coordinator.kafka.participant import CheckpointParticipant
from coordinator.kafka.runtime import CoordinatorService
from coordinator.messages import StateHandle
from coordinator.options import CheckpointingOptions
from coordinator.records import CheckpointRecord


@dataclasses.dataclass
class LocalRunResult:
    """Per timed checkpoint its record and end-to-end latency (ms, trigger call to completion),
    and the coordinator's statistics (Flink's ``/jobs/:jobid/checkpoints`` shape)."""

    job_id: str
    records: list[CheckpointRecord]
    latencies_ms: list[float]
    stats: dict[str, Any]


def run_checkpoints(
    bootstrap_servers: str,
    checkpoint_dir: str,
    *,
    subtasks: int = 4,
    checkpoints: int = 10,
    warmup: int = 0,
    prefix: str | None = None,
    on_checkpoint: Callable[[CheckpointRecord, float], None] | None = None,
    pause_ms: int = 0,
    metrics_port: int | None = None,
    on_started: Callable[[CoordinatorService], Any] | None = None,
) -> LocalRunResult:
    """Start a coordinator for a new job with ``subtasks`` participants, run ``warmup`` untimed
    and then ``checkpoints`` timed manual checkpoints one after the other (``pause_ms`` apart),
    and stop. ``metrics_port`` serves the coordinator's Prometheus metrics (see
    :mod:`coordinator.kafka.metrics`); ``on_started(service)`` is called once it runs."""
    job_id = uuid.uuid4().hex
    prefix = prefix or f"chandy-demo-{job_id[:6]}"
    service = CoordinatorService(job_id, bootstrap_servers,
                                 CheckpointingOptions(interval_ms=0, checkpoint_dir=checkpoint_dir),
                                 {"worker": subtasks}, prefix=prefix, metrics_port=metrics_port).start(periodic=False)
    if on_started is not None:
        on_started(service)
    handle = StateHandle("inline", None, b"x" * 64, 64)
    workers = [CheckpointParticipant(bootstrap_servers, job_id, "worker", i, snapshot=lambda cid, t: [handle],
                                     prefix=prefix).start() for i in range(subtasks)]
    records: list[CheckpointRecord] = []
    latencies: list[float] = []
    try:
        for _ in range(warmup):
            service.trigger_checkpoint().result(60)
        for n in range(checkpoints):
            if n and pause_ms:
                time.sleep(pause_ms / 1000)
            start = time.perf_counter()
            record = service.trigger_checkpoint().result(60)
            latency = (time.perf_counter() - start) * 1000
            records.append(record)
            latencies.append(latency)
            if on_checkpoint is not None:
                on_checkpoint(record, latency)
        stats = service.stats()
    finally:
        for worker in workers:
            worker.close()
        service.stop()
    return LocalRunResult(job_id, records, latencies, stats)

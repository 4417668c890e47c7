"""Checkpoints end to end on one machine: a coordinator and N worker participants over Kafka.

Used by ``chandy checkpoint demo`` (part of ``make demo``) and by
``benchmarks/checkpoint_latency.py``. Each worker is a real subtask attempt registered with one
:class:`~chandy.coordinator.kafka.host.ParticipantHost` (one control consumer and one acks producer for
all of them, as a Flink TaskExecutor hosts its tasks), acknowledging every checkpoint with one
small inline state handle.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.host import ParticipantHost
from chandy.coordinator.kafka.runtime import CoordinatorService
from chandy.coordinator.kafka.topics import ChandyTopics
from chandy.coordinator.messages import StateHandle
from chandy.coordinator.options import CheckpointingOptions
from chandy.coordinator.records import CheckpointRecord
from chandy.schemas.errors import ChandyError


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
    keep_topics: bool = False,
    keep_records: bool = True,
    worker_process: bool = False,
) -> LocalRunResult:
    """Start a coordinator for a new job with ``subtasks`` participants, run ``warmup`` untimed
    and then ``checkpoints`` timed manual checkpoints one after the other (``pause_ms`` apart),
    and stop. ``metrics_port`` serves the coordinator's Prometheus metrics (see
    :mod:`chandy.coordinator.kafka.metrics`); ``on_started(service)`` is called once it runs.

    Without ``prefix`` the run uses topics of its own (``chandy-demo-<job id[:6]>.*``) and
    deletes them when it ends (Kafka's DeleteTopics), unless ``keep_topics``; topics under a
    given ``prefix`` are never deleted. ``keep_records=False`` returns no records or latencies
    (``on_checkpoint`` still sees each), so a long run holds nothing per checkpoint.

    ``worker_process=True`` hosts the subtasks in a separate worker process (as Flink's
    TaskExecutors are processes of their own), so the coordinator and the workers do not share one
    interpreter's GIL; by default they share this process.

    Raises:
        ChandyError: the worker process exited, or did not register its subtasks within 120 s."""
    job_id = uuid.uuid4().hex
    own_topics = prefix is None and not keep_topics
    prefix = prefix or f"chandy-demo-{job_id[:6]}"
    service = CoordinatorService(job_id, bootstrap_servers,
                                 CheckpointingOptions(interval_ms=0, checkpoint_dir=checkpoint_dir),
                                 {"worker": subtasks}, prefix=prefix, metrics_port=metrics_port).start(periodic=False)
    if on_started is not None:
        on_started(service)
    # one process hosts every subtask over one consumer and one producer (a Flink TaskExecutor)
    if worker_process:
        context = multiprocessing.get_context("spawn")
        ready, stop = context.Event(), context.Event()
        worker = context.Process(target=_host_subtasks, args=(bootstrap_servers, prefix, job_id, subtasks, ready, stop),
                                 name="chandy-demo-worker", daemon=True)
        worker.start()
        deadline = time.monotonic() + 120
        while not ready.wait(0.2):
            if not worker.is_alive() or time.monotonic() > deadline:
                worker.kill()
                service.stop()
                why = (f"exited with code {worker.exitcode}" if worker.exitcode is not None
                       else "did not register them within 120 s")
                raise ChandyError(f"the demo's worker process for {subtasks} subtasks {why}")
        host: ParticipantHost | None = None
    else:
        host = _register_subtasks(bootstrap_servers, prefix, job_id, subtasks)
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
            if keep_records:
                records.append(record)
                latencies.append(latency)
            if on_checkpoint is not None:
                on_checkpoint(record, latency)
        stats = service.stats()
    finally:
        if host is not None:
            host.close()
        else:
            stop.set()
            worker.join(30)
        service.stop()
        if own_topics:
            delete_topics(bootstrap_servers, ChandyTopics(prefix))
    return LocalRunResult(job_id, records, latencies, stats)


def _register_subtasks(bootstrap_servers: str, prefix: str, job_id: str, subtasks: int) -> ParticipantHost:
    """A started host with ``subtasks`` subtask attempts of operator ``worker`` registered, each
    acknowledging with one 64-byte inline state handle; they see control messages from now on."""
    handle = StateHandle("inline", None, b"x" * 64, 64)
    host = ParticipantHost(bootstrap_servers, prefix=prefix).start()
    now = host.control_end_offsets()
    for i in range(subtasks):
        host.register(job_id, "worker", i, snapshot=lambda cid, t: [handle], report_ready=False, start_offsets=now)
    host.flush()
    return host


def _host_subtasks(bootstrap_servers: str, prefix: str, job_id: str, subtasks: int, ready: Any, stop: Any) -> None:
    """The worker process of ``run_checkpoints(worker_process=True)``: host the subtasks until ``stop``."""
    host = _register_subtasks(bootstrap_servers, prefix, job_id, subtasks)
    ready.set()
    try:
        stop.wait()
    finally:
        host.close()


def delete_topics(bootstrap_servers: str, topics: ChandyTopics, timeout_s: float = 30.0) -> list[str]:
    """Delete Chandy's topics under ``topics.prefix`` that exist (Kafka's DeleteTopics); returns
    the names deleted. A topic already gone is not an error."""
    admin = kafka_config.admin_client(bootstrap_servers)
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    names = [spec.name for spec in topics.specs() if spec.name in existing]
    deleted = []
    for name, future in (admin.delete_topics(names, operation_timeout=timeout_s).items() if names else ()):
        try:
            future.result()
            deleted.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise
    return deleted

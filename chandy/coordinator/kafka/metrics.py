"""Prometheus metrics of the coordinator's process, under Flink's checkpoint metric names.

The coordinator serves them itself (``CoordinatorService(..., metrics_port=9249)``,
``chandy pipeline run --metrics-port``, ``chandy checkpoint demo --metrics-port``) at
``http://host:port/metrics`` in Prometheus' text format, with prometheus-client.

Job-scoped gauges, labelled ``job_id``, as Flink's ``JobManager`` job metrics (see Flink's
"Metrics" page, section "Checkpointing"); times in ms since the Unix epoch, durations in ms,
sizes in bytes, and -1 where Flink reports -1 (nothing completed or restored yet):

==================================  =========================================================
``lastCheckpointDuration``          end-to-end duration of the latest completed checkpoint (ms)
``lastCheckpointSize``              its state size (bytes); ``lastCheckpointFullSize`` the same
                                    (Chandy's checkpoints are not incremental)
``lastCheckpointCompletedTimestamp`` when it completed
``lastCompletedCheckpointId``       its ID
``lastCheckpointRestoreTimestamp``  when the coordinator last restored a checkpoint
``numberOfCompletedCheckpoints``    completed since this coordinator started
``numberOfFailedCheckpoints``       failed (aborted, declined, expired) since then
``numberOfInProgressCheckpoints``   pending now
``totalNumberOfCheckpoints``        triggered since then (savepoints included)
==================================  =========================================================

Operator-scoped gauges carry ``job_id`` and ``operator``: ``numberOfSubtasks`` (the parallelism
whose acknowledgements a checkpoint waits for).

The values are read when Prometheus scrapes (as Flink's gauges are), from
``CoordinatorService.stats()`` on the coordinator's mailbox, so checkpoints pay nothing between
scrapes; ``benchmarks/metrics_overhead.py`` measures the cost while scraping. A stopped
coordinator's job keeps its last values. This module sits in the coordinator's Kafka runtime so
that connectors and the application can register their own collectors on the same server
(:meth:`MetricsServer.register`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from chandy.coordinator.errors import ChandyError

log = logging.getLogger(__name__)

#: (Flink metric name, help text) of the job-scoped checkpoint gauges, in exposition order.
CHECKPOINT_GAUGES: tuple[tuple[str, str], ...] = (
    ("lastCheckpointDuration", "End-to-end duration of the latest completed checkpoint in ms (-1: none yet)."),
    ("lastCheckpointSize", "State size of the latest completed checkpoint in bytes (-1: none yet)."),
    ("lastCheckpointFullSize", "Full state size of the latest completed checkpoint in bytes (-1: none yet)."),
    ("lastCheckpointCompletedTimestamp", "When the latest completed checkpoint completed, ms since the epoch (-1: none)."),
    ("lastCompletedCheckpointId", "ID of the latest completed checkpoint (-1: none yet)."),
    ("lastCheckpointRestoreTimestamp", "When the coordinator last restored a checkpoint, ms since the epoch (-1: never)."),
    ("numberOfCompletedCheckpoints", "Checkpoints completed since the coordinator started."),
    ("numberOfFailedCheckpoints", "Checkpoints failed since the coordinator started."),
    ("numberOfInProgressCheckpoints", "Checkpoints in progress."),
    ("totalNumberOfCheckpoints", "Checkpoints triggered since the coordinator started (savepoints included)."),
)


class MetricsError(ChandyError):
    """The metrics server cannot start (port taken, bad address)."""


def checkpoint_gauge_values(stats: Mapping[str, Any]) -> dict[str, float]:
    """Flink's checkpoint gauges from a ``/jobs/:jobid/checkpoints``-shaped ``stats`` dict
    (``CoordinatorService.stats()``): metric name -> value (see the module docstring)."""
    counts = stats.get("counts", {})
    latest = stats.get("latest", {})
    completed = latest.get("completed") or None
    restored = latest.get("restored") or None
    duration = completed.get("end_to_end_duration") if completed else None
    return {
        "lastCheckpointDuration": -1 if duration is None else duration,
        "lastCheckpointSize": completed.get("state_size", 0) if completed else -1,
        "lastCheckpointFullSize": completed.get("state_size", 0) if completed else -1,
        "lastCheckpointCompletedTimestamp": (completed["trigger_timestamp"] + duration
                                             if completed and duration is not None else -1),
        "lastCompletedCheckpointId": completed["id"] if completed else -1,
        "lastCheckpointRestoreTimestamp": restored.get("restore_timestamp", -1) if restored else -1,
        "numberOfCompletedCheckpoints": counts.get("completed", 0),
        "numberOfFailedCheckpoints": counts.get("failed", 0),
        "numberOfInProgressCheckpoints": counts.get("in_progress", 0),
        "totalNumberOfCheckpoints": counts.get("total", 0),
    }


class CheckpointMetricsCollector(Collector):
    """A prometheus-client collector of one job's checkpoint gauges, read at scrape time.

    Args:
        job_id: the ``job_id`` label.
        read_stats: returns the ``/jobs/:jobid/checkpoints``-shaped stats (may raise once the
            coordinator stopped: the last values read are exposed then).
        operators: operator ID -> parallelism, for ``numberOfSubtasks``.
    """

    def __init__(self, job_id: str, read_stats: Callable[[], Mapping[str, Any]],
                 operators: Mapping[str, int] | None = None) -> None:
        self.job_id = job_id
        self.read_stats = read_stats
        self.operators = dict(operators or {})
        self._last: dict[str, float] | None = None
        self._lock = threading.Lock()

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            values = checkpoint_gauge_values(self.read_stats())
            with self._lock:
                self._last = values
        except Exception as exc:  # noqa: BLE001 - a stopped coordinator keeps its last values
            log.debug("job %s: stats unavailable for metrics (%s)", self.job_id, exc)
            with self._lock:
                values = self._last or {}
        for name, help_text in CHECKPOINT_GAUGES:
            if name in values:
                family = GaugeMetricFamily(name, help_text, labels=["job_id"])
                family.add_metric([self.job_id], values[name])
                yield family
        if self.operators:
            family = GaugeMetricFamily("numberOfSubtasks", "Subtasks whose acknowledgements a checkpoint waits for.",
                                       labels=["job_id", "operator"])
            for operator, parallelism in sorted(self.operators.items()):
                family.add_metric([self.job_id, operator], parallelism)
            yield family


class MetricsServer:
    """Prometheus' ``/metrics`` endpoint on ``address:port`` (prometheus-client's
    ``start_http_server``, its own registry, so two servers in one process do not mix).

    ``port=0`` picks a free port; :attr:`port` is the one bound.

    Raises:
        MetricsError: the address cannot be bound (say, the port is in use).
    """

    def __init__(self, port: int, address: str = "0.0.0.0") -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        try:
            self._server, self._thread = start_http_server(port, addr=address, registry=self.registry)
        except OSError as exc:
            raise MetricsError(f"cannot serve metrics on {address}:{port}: {exc.strerror or exc}") from exc
        self.address = address
        self.port: int = self._server.server_port

    def register(self, collector: Collector) -> None:
        """Expose ``collector``'s metrics too (a connector's or the application's own)."""
        self.registry.register(collector)

    def unregister(self, collector: Collector) -> None:
        self.registry.unregister(collector)

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()

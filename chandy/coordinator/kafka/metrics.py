"""Prometheus metrics of the coordinator's process, under Flink's checkpoint metric names.

The coordinator serves them itself (``CoordinatorService(..., metrics_port=9249)``,
``chandy pipeline run --metrics-port``, ``chandy checkpoint demo --metrics-port``) at
``http://host:port/metrics`` in Prometheus' text format, with prometheus-client.

**Names and labels are those of Flink's Prometheus reporter** (``PrometheusReporter``: the
metric's logical scope joined with ``_`` after ``flink_``, the scope variables as labels), so the
published Grafana dashboards for Flink and the alerts written for them find Chandy's series.
Job-scoped gauges are ``flink_jobmanager_job_<metric>`` labelled ``job_id``, ``job_name`` and
``host``, as Flink's ``JobManager`` job metrics (Flink's "Metrics" page, sections
"Checkpointing" and "Availability"); times in ms since the Unix epoch, durations in ms, sizes in
bytes, and -1 where Flink reports -1 (nothing completed or restored yet):

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
``uptime``                          ms since this coordinator started leading the job
``runningTime``                     the same while the job is RUNNING, else 0 (Flink 1.17+'s name)
``numRestarts``                     times the job was started again after its first start
                                    (coordinator epochs after the first: restarts, take-overs)
``numRunningJobs``                  ``flink_jobmanager_numRunningJobs{host}``: 1 while this
                                    process's coordinator runs the job (RUNNING), else 0
``<status>State``                   1 for the job's status, 0 for the others (Flink's job
                                    status metrics, ``metrics.job.status.enable: STATE``):
                                    ``createdState``, ``runningState``, ``failingState``,
                                    ``failedState``, ``finishedState``, ``suspendedState``,
                                    ``canceledState``; a failed job is ``failedState`` 1
==================================  =========================================================

The operators' metrics (a connector's, such as the pipeline's Kafka source and lake sink) are
``flink_taskmanager_job_task_operator_<metric>`` labelled ``job_id``, ``job_name``, ``host``,
``task_name``, ``subtask_index`` and ``operator_name`` (:class:`MetricScope`). ``numberOfSubtasks``
of each operator (the parallelism whose acknowledgements a checkpoint waits for) is one of them.

``legacy_names=True`` (``--metrics-legacy-names``) also serves the bare names of Chandy 0.1
(``lastCheckpointDuration{job_id=...}``, ``numberOfSubtasks{job_id=..., operator=...}``), for
dashboards written against them.

The values are read when Prometheus scrapes (as Flink's gauges are), from
``CoordinatorService.stats()`` on the coordinator's mailbox, so checkpoints pay nothing between
scrapes; ``benchmarks/metrics_overhead.py`` measures the cost while scraping. A stopped
coordinator's job keeps its last values. This module sits in the coordinator's Kafka runtime so
that connectors and the application can register their own collectors on the same server
(:meth:`MetricsServer.register`).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
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


#: Flink's PrometheusReporter prefix of the job-scoped metrics (logical scope ``jobmanager.job``)
JOB_PREFIX = "flink_jobmanager_job_"
#: the JobManager's own scope (``flink_jobmanager_<metric>``, labelled ``host``)
JOBMANAGER_PREFIX = "flink_jobmanager_"
#: ... and of an operator's metrics (logical scope ``taskmanager.job.task.operator``)
OPERATOR_PREFIX = "flink_taskmanager_job_task_operator_"
#: ... and of a task's (logical scope ``taskmanager.job.task``)
TASK_PREFIX = "flink_taskmanager_job_task_"
JOB_LABELS = ("job_id", "job_name", "host")
#: the statuses of Flink's ``<status>State`` gauges that a Chandy job takes
JOB_STATUSES = ("CREATED", "RUNNING", "FAILING", "FAILED", "FINISHED", "SUSPENDED", "CANCELED")
OPERATOR_LABELS = (*JOB_LABELS, "task_name", "subtask_index", "operator_name")
TASK_LABELS = (*JOB_LABELS, "task_name", "subtask_index")


@dataclass(frozen=True)
class MetricScope:
    """The scope variables of a job's metrics, as Flink's reporter labels them.

    Attributes:
        job_id: ``job_id``.
        job_name: ``job_name`` (Flink's job name; Chandy's default is the job ID).
        host: ``host``, the coordinator's host name.
        task_name: ``task_name`` of operator metrics: the chained operators of the task, as
            Flink names a task (``Source: kafka-source -> lake-sink``).
        legacy_names: also expose Chandy 0.1's bare names.
    """

    job_id: str
    job_name: str = ""
    host: str = ""
    task_name: str = ""
    legacy_names: bool = False

    def __post_init__(self) -> None:
        if not self.job_name:
            object.__setattr__(self, "job_name", self.job_id)
        if not self.host:
            object.__setattr__(self, "host", socket.gethostname())

    @property
    def job_labels(self) -> list[str]:
        return [self.job_id, self.job_name, self.host]

    def operator_labels(self, operator_name: str, subtask_index: int | str = 0) -> list[str]:
        return [*self.job_labels, self.task_name or operator_name, str(subtask_index), operator_name]

    def task_labels(self, subtask_index: int | str = 0) -> list[str]:
        return [*self.job_labels, self.task_name, str(subtask_index)]

    def task_gauge(self, name: str, help_text: str) -> GaugeMetricFamily:
        """An empty ``flink_taskmanager_job_task_<name>`` gauge with the task labels."""
        return GaugeMetricFamily(TASK_PREFIX + name, help_text, labels=list(TASK_LABELS))

    def jobmanager_gauge(self, name: str, help_text: str) -> GaugeMetricFamily:
        """An empty ``flink_jobmanager_<name>`` gauge labelled ``host`` (the JobManager's own)."""
        return GaugeMetricFamily(JOBMANAGER_PREFIX + name, help_text, labels=["host"])

    def job_gauge(self, name: str, help_text: str) -> GaugeMetricFamily:
        """An empty ``flink_jobmanager_job_<name>`` gauge with the job labels."""
        return GaugeMetricFamily(JOB_PREFIX + name, help_text, labels=list(JOB_LABELS))

    def operator_gauge(self, name: str, help_text: str, extra_labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
        """An empty ``flink_taskmanager_job_task_operator_<name>`` gauge with the operator labels
        (and ``extra_labels`` after them)."""
        return GaugeMetricFamily(OPERATOR_PREFIX + name, help_text, labels=[*OPERATOR_LABELS, *extra_labels])


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
        job_id: the ``job_id`` label (or a :class:`MetricScope` with the job's name and host).
        read_stats: returns the ``/jobs/:jobid/checkpoints``-shaped stats (may raise once the
            coordinator stopped: the last values read are exposed then).
        operators: operator ID -> parallelism, for ``numberOfSubtasks``.
        read_epoch: the coordinator's epoch (1 for the job's first start, 0 before it leads; must
            not raise), for ``numRestarts``.
        read_status: the job's status (``JobStatus`` value), for the ``<status>State`` gauges.
    """

    def __init__(self, job_id: str | MetricScope, read_stats: Callable[[], Mapping[str, Any]],
                 operators: Mapping[str, int] | None = None, read_epoch: Callable[[], int] | None = None,
                 read_status: Callable[[], str] | None = None) -> None:
        self.scope = job_id if isinstance(job_id, MetricScope) else MetricScope(job_id)
        self.job_id = self.scope.job_id
        self.read_stats = read_stats
        self.read_epoch = read_epoch
        self.read_status = read_status
        self.operators = dict(operators or {})
        self.started = time.monotonic()
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
        scope = self.scope
        for name, help_text in CHECKPOINT_GAUGES:
            if name in values:
                family = scope.job_gauge(name, help_text)
                family.add_metric(scope.job_labels, values[name])
                yield family
        running_ms = (time.monotonic() - self.started) * 1000
        uptime = scope.job_gauge("uptime", "Time since this coordinator started leading the job, in ms.")
        uptime.add_metric(scope.job_labels, running_ms)
        yield uptime
        # Flink 1.17+'s name for the same (uptime is deprecated there); 0 unless RUNNING, as Flink's
        status_now = self.read_status() if self.read_status is not None else "RUNNING"
        running = scope.job_gauge("runningTime", "Time since the job started RUNNING under this coordinator, in ms "
                                                 "(0 unless RUNNING).")
        running.add_metric(scope.job_labels, running_ms if status_now == "RUNNING" else 0)
        yield running
        if self.read_epoch is not None:  # 0 before the coordinator leads: no restart yet
            restarts = scope.job_gauge("numRestarts", "Times the job was started again (restarts, take-overs).")
            restarts.add_metric(scope.job_labels, max(0, self.read_epoch() - 1))
            yield restarts
        if self.read_status is not None:
            status = self.read_status()
            jobs = scope.jobmanager_gauge("numRunningJobs", "Jobs RUNNING under this coordinator process (0 or 1).")
            jobs.add_metric([scope.host], 1 if status == "RUNNING" else 0)
            yield jobs
            for name in JOB_STATUSES:
                state = scope.job_gauge(f"{name.lower()}State", f"1 while the job is {name}, else 0.")
                state.add_metric(scope.job_labels, 1 if status == name else 0)
                yield state
        if self.operators:
            family = scope.operator_gauge("numberOfSubtasks", "Subtasks whose acknowledgements a checkpoint waits for.")
            for operator, parallelism in sorted(self.operators.items()):
                family.add_metric(scope.operator_labels(operator), parallelism)
            yield family
        if scope.legacy_names:
            yield from self._legacy(values)

    def _legacy(self, values: Mapping[str, float]) -> Iterator[GaugeMetricFamily]:
        """Chandy 0.1's bare names, labelled ``job_id`` (and ``operator``)."""
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

"""The pipeline's own Prometheus metrics, next to the coordinator's checkpoint gauges.

Registered on the coordinator's metrics server (``--metrics-port``) by the pipeline, updated after
every micro-batch (one checkpoint), read at scrape time. Names and labels are Flink's as its
Prometheus reporter exposes an operator's metrics: ``flink_taskmanager_job_task_operator_<name>``
labelled ``job_id``, ``job_name``, ``host``, ``task_name`` (``Source: kafka-source -> lake-sink``:
the source and the sink run chained in one Spark task), ``subtask_index`` and ``operator_name``
(``kafka-source`` or ``lake-sink``); see :class:`~chandy.coordinator.kafka.metrics.MetricScope`.

=================================  =============================================================
``numRecordsIn``                   records read by this run: landed and bad (source)
``numRecordsInPerSecond``          of those, per second since the run started (source)
``numRecordsInErrors``             bad records of this run, in completed checkpoints (source)
``pendingRecords``                 consumer lag after the micro-batch, in records (Flink's
                                   KafkaSource metric; source): one series per partition, with
                                   ``topic`` and ``partition`` labels and ``subtask_index`` the
                                   partition's index among the job's partitions; ``sum`` them
``numRecordsOut``                  records landed in the table by this run (sink)
``numRecordsOutPerSecond``         of those, per second since the run started (sink)
``KafkaSourceReader_KafkaConsumer_records_lag_max``
                                   the largest ``pendingRecords`` of a partition (source)
``KafkaSourceReader_KafkaConsumer_records_consumed_rate``
                                   ``numRecordsInPerSecond`` under the Kafka consumer's name
                                   (source)
``lastMicroBatchDuration``         the latest micro-batch, trigger to completion in ms: read,
                                   write, acknowledgements, the lake commit (sink; Chandy's own)
``lastSparkJobDuration``           of that, the Spark job in ms (read, transform, write, ack;
                                   sink; Chandy's own)
``lastLakeCommitDuration``         the latest lake commit (Delta/Iceberg commit of a completed
                                   checkpoint) in ms, read from the lake committer (sink;
                                   Chandy's own)
=================================  =============================================================

``currentFetchEventTimeLag``       per subtask (``subtask_index``), FetchTime - EventTime in ms
                                   of the newest record it fetched for the latest committed
                                   checkpoint (Kafka's record timestamp; source). Without a
                                   ``--transform`` only: with one, Spark reads and writes in
                                   separate Python workers and the fetch times do not reach the ack

In the task scope (``flink_taskmanager_job_task_<metric>``, labelled ``job_id``, ``job_name``,
``host``, ``task_name``, ``subtask_index``): ``numRecordsInPerSecond`` and
``numRecordsOutPerSecond`` of the task that runs the source and the sink chained.

``currentEmitEventTimeLag``        EmitTime - EventTime, the same values: the source and the
                                   sink run chained in one task, which emits a record to the
                                   writer as it fetches it
``sourceIdleTime``                 ms since the source last read a record (a micro-batch that
                                   read some), since the run started if none yet (source)
``KafkaSourceReader_commitsSucceeded``
                                   offset commits of this run (one per completed checkpoint:
                                   the offsets are committed inside its completion's Kafka
                                   transaction; source)
``KafkaSourceReader_commitsFailed``
                                   0: an offset commit that fails fails the checkpoint's
                                   completion (``numberOfFailedCheckpoints``) instead

The job's ``flink_jobmanager_job_restartingTime``: how long the last restart of this run took in
ms, from the failure to the new coordinator running (0 before any restart; Flink's "the time it
took to restart the job"). In the task scope, ``checkpointAlignmentTime`` is 0:
a micro-batch has no channels whose barriers need aligning.

``KafkaSourceReader_KafkaConsumer_bytes_consumed_rate``: the keys' and values' bytes of the
records this run's committed checkpoints read, per second since the run started (the records'
own bytes, not the fetch responses' as Kafka's consumer counts them; without ``--transform``, as
``currentFetchEventTimeLag``).

``KafkaSourceReader_KafkaConsumer_records_per_request_avg``: the records librdkafka received per
Fetch request it sent, for this run's committed checkpoints (``rxmsgs`` over the brokers'
``req.Fetch`` in the tasks' consumer statistics, every 100 ms; without ``--transform``).

With ``--metrics-legacy-names`` the bare names
of Chandy 0.1 (labels ``job_id``, ``operator``, and ``topic``/``partition`` for the lag) are
served too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol, TypeVar

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from chandy.coordinator.errors import ChandyError
from chandy.coordinator.kafka.metrics import MetricScope

log = logging.getLogger(__name__)


class MicroBatchProgress(Protocol):
    """What the collector reads of ``chandy.connectors.spark.options.PipelineProgress``."""

    @property
    def records_landed(self) -> int: ...
    @property
    def elapsed_s(self) -> float: ...
    @property
    def lag(self) -> Mapping[tuple[str, int], int]: ...
    @property
    def checkpoint_duration_ms(self) -> float: ...
    @property
    def spark_job_ms(self) -> float: ...
    @property
    def bad_records(self) -> int: ...
    @property
    def checkpoints_completed(self) -> int: ...


_T = TypeVar("_T")


def _scrape(read: Callable[[], _T] | None, what: str) -> _T | None:
    """``read()`` at scrape time (a value of the lake committer's, through the coordinator's
    mailbox), or None when there is no reader, or the coordinator stopped, has no such operator
    coordinator or did not answer in time: the gauge is then left out of this scrape."""
    if read is None:
        return None
    try:
        return read()
    except (ChandyError, KeyError, TimeoutError) as exc:
        log.debug("%s unavailable: %s", what, exc)
        return None


class PipelineMetricsCollector(Collector):
    """The pipeline's gauges (see the module docstring) from the latest micro-batch's progress;
    nothing is exposed before the first micro-batch ends. ``read_commit_ms`` returns the latest
    lake commit's duration in ms (None before the first), read at scrape time."""

    def __init__(self, scope: MetricScope | str, source_operator: str, sink_operator: str,
                 read_commit_ms: Callable[[], float | None] | None = None,
                 read_fetch_lag_ms: Callable[[], Mapping[int, int]] | None = None,
                 read_restarting_ms: Callable[[], float] | None = None,
                 read_bytes: Callable[[], int] | None = None,
                 read_fetches: Callable[[], tuple[int, int]] | None = None) -> None:
        self.scope = scope if isinstance(scope, MetricScope) else MetricScope(scope)
        self.job_id = self.scope.job_id
        self.read_commit_ms = read_commit_ms
        self.read_fetch_lag_ms = read_fetch_lag_ms
        self.read_restarting_ms = read_restarting_ms
        self.read_bytes = read_bytes
        self.read_fetches = read_fetches  # (Fetch requests, records fetched)
        self._last_read = time.monotonic()  # when the source last read records (sourceIdleTime)
        self.source = source_operator
        self.sink = sink_operator
        self._progress: MicroBatchProgress | None = None
        self._lock = threading.Lock()

    def update(self, progress: MicroBatchProgress) -> None:
        """Record the progress after a micro-batch (the pipeline's thread)."""
        with self._lock:
            before = self._progress
            if progress.records_landed + progress.bad_records > (
                    0 if before is None else before.records_landed + before.bad_records):
                self._last_read = time.monotonic()
            self._progress = progress

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            p = self._progress
        if p is None:
            return
        commit_ms = _scrape(self.read_commit_ms, "lake commit duration")
        read = p.records_landed + p.bad_records
        seconds = p.elapsed_s if p.elapsed_s > 0 else float("inf")
        gauges: list[tuple[str, str, str, float]] = [
            ("numRecordsIn", "Records read by this run (landed and bad).", self.source, read),
            ("numRecordsInPerSecond", "Records read per second since the run started.", self.source, read / seconds),
            ("numRecordsInErrors", "Bad records of this run, in completed checkpoints.", self.source, p.bad_records),
            ("numRecordsOut", "Records landed in the table by this run.", self.sink, p.records_landed),
            ("numRecordsOutPerSecond", "Records landed per second since the run started.", self.sink,
             p.records_landed / seconds),
            ("lastMicroBatchDuration", "Latest micro-batch, trigger to completion (lake commit included), in ms.",
             self.sink, p.checkpoint_duration_ms),
            ("lastSparkJobDuration", "Spark job of the latest micro-batch in ms.", self.sink, p.spark_job_ms),
        ]
        if commit_ms is not None:
            gauges.append(("lastLakeCommitDuration", "Latest lake commit of a completed checkpoint, in ms.", self.sink,
                           commit_ms))
        scope = self.scope
        for name, help_text, operator, value in gauges:
            family = scope.operator_gauge(name, help_text)
            family.add_metric(scope.operator_labels(operator), value)
            yield family
        fetch_lag = _scrape(self.read_fetch_lag_ms, "fetch lag")
        if fetch_lag:
            for name, what in (("currentFetchEventTimeLag", "FetchTime"), ("currentEmitEventTimeLag", "EmitTime")):
                family = scope.operator_gauge(name, f"{what} - EventTime of the newest record the subtask fetched for "
                                                    "the latest committed checkpoint, in ms.")
                for subtask, millis in sorted(fetch_lag.items()):
                    family.add_metric(scope.operator_labels(self.source, subtask), millis)
                yield family
        yield from self._availability(p)
        lag = scope.operator_gauge("pendingRecords", "Consumer lag per partition after the latest micro-batch, in records.",
                                   ("topic", "partition"))
        for index, ((topic, partition), records) in enumerate(sorted(p.lag.items())):
            lag.add_metric([*scope.operator_labels(self.source, index), topic, str(partition)], records)
        yield lag
        # the KafkaSourceReader's Kafka consumer metrics (Flink registers the consumer's own under
        # KafkaSourceReader.KafkaConsumer) that Flink dashboards plot for a Kafka source
        consumer = "KafkaSourceReader_KafkaConsumer_"
        lag_max = scope.operator_gauge(consumer + "records_lag_max", "The largest consumer lag of a partition after "
                                                                     "the latest micro-batch, in records.")
        lag_max.add_metric(scope.operator_labels(self.source), max(p.lag.values(), default=0))
        yield lag_max
        consumed = scope.operator_gauge(consumer + "records_consumed_rate", "Records read per second since the "
                                                                            "run started.")
        consumed.add_metric(scope.operator_labels(self.source), read / seconds)
        yield consumed
        read_bytes = _scrape(self.read_bytes, "bytes read")
        if read_bytes is not None:
            rate = scope.operator_gauge(consumer + "bytes_consumed_rate", "Record bytes (keys and values) read per "
                                                                          "second since the run started.")
            rate.add_metric(scope.operator_labels(self.source), read_bytes / seconds)
            yield rate
        fetches = _scrape(self.read_fetches, "fetch requests")
        if fetches is not None and fetches[0] > 0:
            per_request = scope.operator_gauge(consumer + "records_per_request_avg", "Records received per Fetch "
                                                                                     "request, over the run.")
            per_request.add_metric(scope.operator_labels(self.source), fetches[1] / fetches[0])
            yield per_request
        # the task's (the chained source and sink run as one task) record rates, in the task scope
        for name, help_text, value in (
                ("numRecordsInPerSecond", "Records read per second since the run started.", read / seconds),
                ("numRecordsOutPerSecond", "Records landed per second since the run started.",
                 p.records_landed / seconds)):
            family = scope.task_gauge(name, help_text)
            family.add_metric(scope.task_labels(), value)
            yield family
        if scope.legacy_names:
            yield from self._legacy(p, gauges)

    def _availability(self, p: MicroBatchProgress) -> Iterator[GaugeMetricFamily]:
        """``sourceIdleTime``, the KafkaSourceReader's offset commits, ``restartingTime`` and the
        task's ``checkpointAlignmentTime`` (see the module docstring)."""
        scope = self.scope
        idle = scope.operator_gauge("sourceIdleTime", "Time since the source last read a record, in ms.")
        idle.add_metric(scope.operator_labels(self.source), (time.monotonic() - self._last_read) * 1000)
        yield idle
        for name, help_text, value in (
                ("KafkaSourceReader_commitsSucceeded", "Offset commits of this run (one per completed checkpoint).",
                 p.checkpoints_completed),
                ("KafkaSourceReader_commitsFailed", "Offset commits that failed (always 0: one that fails fails its "
                                                    "checkpoint's completion).", 0)):
            family = scope.operator_gauge(name, help_text)
            family.add_metric(scope.operator_labels(self.source), value)
            yield family
        restarting = scope.job_gauge("restartingTime", "How long the last restart of this run took, in ms "
                                                       "(0: none yet).")
        restarting.add_metric(scope.job_labels, self.read_restarting_ms() if self.read_restarting_ms else 0.0)
        yield restarting
        alignment = scope.task_gauge("checkpointAlignmentTime", "Barrier alignment of the latest checkpoint, in ns "
                                                                "(0: a micro-batch has no channels to align).")
        alignment.add_metric(scope.task_labels(), 0)
        yield alignment

    def _legacy(self, p: MicroBatchProgress, gauges: list[tuple[str, str, str, float]]) -> Iterator[GaugeMetricFamily]:
        """Chandy 0.1's bare names, labelled ``job_id`` and ``operator``."""
        legacy = {"numRecordsOut", "numRecordsOutPerSecond", "numRecordsInErrors", "lastMicroBatchDuration",
                  "lastSparkJobDuration", "lastLakeCommitDuration"}
        for name, help_text, operator, value in gauges:
            if name in legacy:
                family = GaugeMetricFamily(name, help_text, labels=["job_id", "operator"])
                family.add_metric([self.job_id, operator], value)
                yield family
        lag = GaugeMetricFamily("pendingRecords", "Consumer lag per partition after the latest micro-batch, in records.",
                                labels=["job_id", "operator", "topic", "partition"])
        for (topic, partition), records in sorted(p.lag.items()):
            lag.add_metric([self.job_id, self.source, topic, str(partition)], records)
        yield lag

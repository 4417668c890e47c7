"""Every job's checkpoint view, read from the public ``<prefix>.checkpoint-events`` topic.

:class:`JobsViewReader` follows the topic from its beginning (``read_committed``, assigned
partitions, no consumer group and no commits: it never disturbs a coordinator or another
subscriber) and folds each job's events into a
:class:`~chandy.coordinator.checkpoint_view.JobCheckpointsView`, so Flink's REST bodies of every job can
be served from any machine that reaches the brokers (``chandy ui``). A record that does not decode
is counted in :attr:`JobsViewReader.skipped`, logged and skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from confluent_kafka import OFFSET_BEGINNING, KafkaError, TopicPartition

from chandy.coordinator.checkpoint_view import JobCheckpointsView
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.topics import ChandyTopics
from chandy.coordinator.messages import CheckpointEvent
from chandy.schemas.codec import SingleObjectCodec, WireFormatError, location_of

log = logging.getLogger(__name__)

_T = TypeVar("_T")


class JobsViewReader:
    """Reads the checkpoint events of every job in a background thread (see the module docstring).

    Args:
        bootstrap_servers: Kafka ``bootstrap.servers``.
        prefix: Chandy's topic prefix (the topic read is ``<prefix>.checkpoint-events``).
        history_size: checkpoints kept per job (Flink's ``web.checkpoints.history``).
        consumer_overrides: librdkafka consumer settings under their own names.
    """

    def __init__(self, bootstrap_servers: str, *, prefix: str = "chandy", history_size: int = 100,
                 consumer_overrides: Mapping[str, Any] | None = None) -> None:
        self.topic = ChandyTopics(prefix).checkpoint_events
        self.history_size = history_size
        self.codec = SingleObjectCodec()
        self.consumer = kafka_config.consumer(bootstrap_servers, overrides={"fetch.wait.max.ms": 100,
                                                                             **(consumer_overrides or {})})
        self.views: dict[str, JobCheckpointsView] = {}
        self.events_read = 0
        self.skipped = 0
        self.error: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._assigned = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chandy-jobs-view", daemon=True)

    def start(self) -> JobsViewReader:
        """Start reading; returns self."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop reading and close the consumer."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self.consumer.close()

    @property
    def reading(self) -> bool:
        """True once the topic's partitions are assigned and the reader thread runs."""
        return self._assigned.is_set() and self._thread.is_alive()

    # -- queries (any thread) ---------------------------------------------------------------------
    def jobs(self) -> list[dict[str, Any]]:
        """``GET /jobs``: one overview per job seen (``{"id", "status", "epoch",
        "last_event_timestamp", "counts"}``, see ``JobCheckpointsView.overview``), by job ID."""
        with self._lock:
            return [self.views[job].overview() for job in sorted(self.views)]

    def _of(self, job_id: str, read: Callable[[JobCheckpointsView], _T]) -> _T | None:
        """``read(view)`` of ``job_id``'s view under the lock, or None if no event of it was seen."""
        with self._lock:
            view = self.views.get(job_id)
            return None if view is None else read(view)

    def checkpoints(self, job_id: str) -> dict[str, Any] | None:
        """``GET /jobs/:jobid/checkpoints`` of ``job_id``, or None if no event of it was seen."""
        return self._of(job_id, lambda view: view.checkpointing_statistics())

    def job_details(self, job_id: str) -> dict[str, Any] | None:
        """``GET /jobs/:jobid`` (Flink's ``JobDetailsInfo`` shape), or None if no event of it was seen."""
        return self._of(job_id, lambda view: view.job_details(int(time.time() * 1000)))

    def checkpoint_config(self, job_id: str) -> dict[str, Any] | None:
        """``GET /jobs/:jobid/checkpoints/config`` (Flink's ``CheckpointConfigInfo`` shape), or None
        if the job is unknown or no TRIGGERED event of it said its configuration yet."""
        return self._of(job_id, lambda view: view.checkpoint_config())

    def lake_commits(self, job_id: str) -> dict[str, Any] | None:
        """Chandy's ``GET /jobs/:jobid/lake-commits``, or None if no event of the job was seen."""
        return self._of(job_id, lambda view: view.lake_commits())

    def has_job(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self.views

    def checkpoint_details(self, job_id: str, checkpoint_id: int) -> dict[str, Any] | None:
        """``GET /jobs/:jobid/checkpoints/details/:checkpointid``, or None if the job or the
        checkpoint is unknown (or left the history)."""
        return self._of(job_id, lambda view: view.checkpoint_details(checkpoint_id))

    # -- reading ------------------------------------------------------------------------------
    def _assign(self) -> bool:
        try:
            metadata = self.consumer.list_topics(self.topic, timeout=2)
        except Exception as exc:  # noqa: BLE001 - brokers unreachable for now: retry
            self.error = f"cannot list {self.topic}: {exc}"
            return False
        topic = metadata.topics.get(self.topic)
        if topic is None or topic.error is not None or not topic.partitions:
            self.error = f"topic {self.topic} does not exist (yet)"
            return False
        self.consumer.assign([TopicPartition(self.topic, p, OFFSET_BEGINNING) for p in sorted(topic.partitions)])
        self.error = None
        self._assigned.set()
        return True

    def _run(self) -> None:
        while not self._stop.is_set() and not self._assign():
            self._stop.wait(1.0)
        while not self._stop.is_set():
            message = self.consumer.poll(0.2)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("checkpoint events consumer: %s", error)
                continue
            try:
                event = CheckpointEvent.from_avro(self.codec.decode(message.value(), location_of(message)).value)
            except (WireFormatError, TypeError, KeyError) as exc:
                self.skipped += 1
                log.warning("skipping an undecodable checkpoint event: %s", exc)
                continue
            with self._lock:
                view = self.views.get(event.job_id)
                if view is None:
                    view = self.views[event.job_id] = JobCheckpointsView(event.job_id, self.history_size)
                view.apply(event)
                self.events_read += 1

    def wait_for_job(self, job_id: str, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds until an event of ``job_id`` was read."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.has_job(job_id):
                return True
            time.sleep(0.05)
        return False

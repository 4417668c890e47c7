"""Chandy's five topics: names, settings, creation and the start-up check.

| topic                          | cleanup | content                                          |
| ------------------------------ | ------- | ------------------------------------------------ |
| ``<prefix>.control``           | delete  | coordinator → workers: trigger, notify, events   |
| ``<prefix>.acks``              | delete  | workers → coordinator: ack, decline, events      |
| ``<prefix>.coordinator-log``   | compact | the coordinator's event-sourced state            |
| ``<prefix>.checkpoint-events`` | delete  | the public stream for external subscribers       |
| ``<prefix>.requests``          | delete  | operators → coordinator: control requests (1 p.) |

All five are keyed by job id (the log by job id, record kind and entity id), so one partition
holds one job's messages in order while many jobs share the topics (see docs/design.md, "Topics").
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from chandy.coordinator.errors import ChandyError

log = logging.getLogger(__name__)

#: Partitions of a new coordinator log, as Kafka's internal ``__consumer_offsets`` and
#: ``__transaction_state`` (``offsets.topic.num.partitions``): each job's records live in one
#: partition, and a coordinator replays only that one.
DEFAULT_LOG_PARTITIONS = 50

DEFAULT_PREFIX = "chandy"

#: ``min.compaction.lag.ms`` (and ``delete.retention.ms``) of a new coordinator log: 7 days, the
#: checkpoint-events topic's retention. Records younger than this are never compacted, so
#: ``chandy log replay --until`` is exact for (at least) the last 7 days; the price is a log that
#: keeps every record of that window, which a restarting coordinator reads (docs/replay.md).
DEFAULT_LOG_HISTORY_MS = 7 * 24 * 3600 * 1000


@dataclasses.dataclass(frozen=True)
class LogHistorySettings:
    """The coordinator log's settings that decide how far back a replay is exact (ms):
    ``min_compaction_lag_ms`` (records younger are never compacted), ``delete_retention_ms``
    (deletion markers are kept at least this long after compaction), ``segment_ms`` (a segment
    is compacted only once it rolled)."""

    topic: str
    min_compaction_lag_ms: int
    delete_retention_ms: int
    segment_ms: int

    def describe(self) -> str:
        """One line for a terminal."""
        return (f"{self.topic}: min.compaction.lag.ms={self.min_compaction_lag_ms} ({_duration(self.min_compaction_lag_ms)}: "
                f"records younger are never compacted), delete.retention.ms={self.delete_retention_ms} "
                f"({_duration(self.delete_retention_ms)}), segment.ms={self.segment_ms} ({_duration(self.segment_ms)})")


def _duration(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("min", 60_000), ("s", 1000)):
        if ms >= size:
            return f"{ms / size:g} {unit}"
    return f"{ms} ms"


class TopicError(ChandyError):
    """A Chandy topic is missing or has settings that break Chandy's guarantees."""


@dataclasses.dataclass(frozen=True)
class TopicSpec:
    """One topic Chandy owns: its full name, partitions and topic-level configs (standard names)."""

    name: str
    partitions: int
    config: Mapping[str, str]


@dataclasses.dataclass(frozen=True)
class ChandyTopics:
    """The names of Chandy's topics under one prefix (default ``chandy``)."""

    prefix: str = DEFAULT_PREFIX

    @property
    def control(self) -> str:
        return f"{self.prefix}.control"

    @property
    def acks(self) -> str:
        return f"{self.prefix}.acks"

    @property
    def coordinator_log(self) -> str:
        return f"{self.prefix}.coordinator-log"

    @property
    def checkpoint_events(self) -> str:
        return f"{self.prefix}.checkpoint-events"

    @property
    def requests(self) -> str:
        """Operators → coordinator: control requests; one partition, whose owner in the job's
        election group is the leader coordinator (:mod:`chandy.coordinator.kafka.requests`)."""
        return f"{self.prefix}.requests"

    def specs(
        self,
        *,
        partitions: int = 1,
        log_partitions: int | None = None,
        retention_ms: int = 7 * 24 * 3600 * 1000,
        min_compaction_lag_ms: int = DEFAULT_LOG_HISTORY_MS,
        replication_factor: int = 1,
    ) -> list[TopicSpec]:
        """The five topics with their settings.

        Args:
            partitions: partitions of the control, acks and events topics; a job always maps to one
                partition by its key.
            log_partitions: partitions of the coordinator log (default :data:`DEFAULT_LOG_PARTITIONS`,
                as Kafka's ``__consumer_offsets``): a coordinator replays only its job's partition,
                so a start does not grow with other jobs' history. Fixed once created: a job's
                partition is ``crc32(job id) mod`` the count (:func:`chandy.coordinator.kafka.log.partition_for`),
                so adding partitions would move jobs away from their history.
            retention_ms: retention of the delete-policy topics (default 7 days).
            min_compaction_lag_ms: how long a log record stays uncompacted, and a deletion marker
                after compaction (``delete.retention.ms``): the window in which ``chandy log
                replay --until`` is exact (default :data:`DEFAULT_LOG_HISTORY_MS`, 7 days).
            replication_factor: used for ``min.insync.replicas`` on clusters larger than one node.
        """
        min_isr = str(min(2, replication_factor))
        delete = {"cleanup.policy": "delete", "retention.ms": str(retention_ms), "min.insync.replicas": min_isr}
        log = {
            "cleanup.policy": "compact",
            "min.compaction.lag.ms": str(min_compaction_lag_ms),
            "delete.retention.ms": str(min_compaction_lag_ms),
            "segment.ms": str(3600 * 1000),
            "min.insync.replicas": min_isr,
        }
        return [
            TopicSpec(self.control, partitions, delete),
            TopicSpec(self.acks, partitions, delete),
            TopicSpec(self.coordinator_log, DEFAULT_LOG_PARTITIONS if log_partitions is None else log_partitions, log),
            TopicSpec(self.checkpoint_events, partitions, delete),
            # always one partition: the election gives it to exactly one coordinator per job
            TopicSpec(self.requests, 1, delete),
        ]


def ensure_topics(
    admin: AdminClient,
    topics: ChandyTopics,
    *,
    partitions: int = 1,
    log_partitions: int | None = None,
    replication_factor: int | None = None,
    timeout_s: float = 30.0,
    **spec_options: int,
) -> list[str]:
    """Create whichever of Chandy's topics are missing, then check all of them.

    ``replication_factor`` None (the default) picks it from the cluster: 3 replicas with
    ``min.insync.replicas`` 2 on a cluster of three brokers or more (one broker may die without
    stopping a write with ``acks=all``), else 1 (see :func:`default_replication_factor`).
    ``log_partitions``: see :meth:`ChandyTopics.specs` (an existing log keeps its count).

    Returns the names of the topics created by this call (empty when all existed).

    Raises:
        TopicError: a creation failed, or :func:`check_topics` found a wrong setting.
    """
    metadata = admin.list_topics(timeout=timeout_s)
    if replication_factor is None:
        replication_factor = default_replication_factor(len(metadata.brokers))
    specs = topics.specs(partitions=partitions, log_partitions=log_partitions, replication_factor=replication_factor,
                         **spec_options)
    existing = set(metadata.topics)
    missing = [spec for spec in specs if spec.name not in existing]
    created: list[str] = []
    if missing:
        futures = admin.create_topics(
            [NewTopic(s.name, s.partitions, replication_factor, config=dict(s.config)) for s in missing],
            operation_timeout=timeout_s,
            request_timeout=timeout_s,
        )
        for name, future in futures.items():
            try:
                future.result()
                created.append(name)
            except KafkaException as exc:
                code = exc.args[0].code()
                if code == KafkaError.TOPIC_ALREADY_EXISTS:  # another process won the race
                    continue
                if code in _NOT_AUTHORIZED and _becomes_visible(admin, name, min(timeout_s, 10.0)):
                    continue  # it exists: this principal's DESCRIBE grant had not reached the broker yet
                raise TopicError(f"could not create topic {name}: {exc.args[0].str()}"
                                 + (" (create Chandy's topics as an administrator: chandy topics ensure)"
                                    if code in _NOT_AUTHORIZED else "")) from exc
        _wait_for_metadata(admin, [spec.name for spec in specs], timeout_s)
    check_topics(admin, topics, timeout_s=timeout_s)
    return created


#: Errors a running client rides through while a broker dies or a leader moves (librdkafka's
#: local transport and timeout errors, and the broker's leadership errors).
_RETRIABLE = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                        KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
                        KafkaError._ALL_BROKERS_DOWN, KafkaError.REQUEST_TIMED_OUT, KafkaError.NOT_COORDINATOR,
                        KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                        KafkaError._WAIT_COORD, KafkaError.NETWORK_EXCEPTION, KafkaError.FENCED_LEADER_EPOCH,
                        KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.NOT_ENOUGH_REPLICAS,
                        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND, KafkaError.KAFKA_STORAGE_ERROR,
                        # a new leader whose high watermark has not caught up yet (KIP-207), after a restart
                        KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.REPLICA_NOT_AVAILABLE,
                        # the client's metadata misses the partition for a moment while brokers restart (a
                        # deleted topic is retried too, until the timeout)
                        KafkaError._UNKNOWN_PARTITION, KafkaError._UNKNOWN_TOPIC,
                        # the request's broker left the client's metadata (restarted) before it answered
                        KafkaError._DESTROY_BROKER})


def is_retriable(error: KafkaError) -> bool:
    """Whether a running client should retry after ``error`` (a broker's death, a leader
    election, a coordinator moving), as opposed to a fatal one (fenced, not authorized, a topic
    or group that is gone for good)."""
    return error.code() in _RETRIABLE or (error.retriable() and not error.fatal())


#: seconds one watermark request may take before it is asked again (of the leader metadata names then)
WATERMARK_REQUEST_S = 5.0


class OffsetsUnavailableError(TopicError):
    """A partition's watermark offsets could not be read (no leader in time, or an error);
    ``retriable``: the last error was one a later try may not meet (a broker's restart); ``code``:
    the last error's ``KafkaError`` code (None when unknown)."""

    def __init__(self, message: str, *, retriable: bool = False, code: int | None = None) -> None:
        super().__init__(message)
        self.retriable = retriable
        self.code = code


def watermark_offsets(consumer: Any, partition: TopicPartition, timeout_s: float = 30.0) -> tuple[int, int]:
    """(low, high) watermark offsets of ``partition`` asked of its leader (``cached=False``; high
    is the last stable offset for a read_committed consumer), retried with backoff (50 ms doubling
    to 1 s) on :func:`is_retriable` errors: a topic created a moment ago, or one whose leader just
    moved (a broker's death or restart), answers NOT_LEADER_FOR_PARTITION / LEADER_NOT_AVAILABLE
    or times out for a while. ``consumer`` is a
    confluent-kafka ``Consumer``; the wait is at most about ``timeout_s`` seconds.

    Raises:
        OffsetsUnavailableError: still failing after ``timeout_s`` seconds, or a non-retriable error.
    """
    deadline = time.monotonic() + timeout_s
    attempt = 0
    while True:
        try:
            # one request waits WATERMARK_REQUEST_S at most: a request to a broker that restarted
            # and left the client's metadata may never be answered, however long the timeout
            low, high = consumer.get_watermark_offsets(
                partition, timeout=max(0.1, min(WATERMARK_REQUEST_S, deadline - time.monotonic())), cached=False)
            return int(low), int(high)
        except KafkaException as exc:
            error = exc.args[0]
            if not is_retriable(error) or time.monotonic() > deadline:
                waited = f" (retried for {timeout_s:.0f} s)" if is_retriable(error) else ""
                raise OffsetsUnavailableError(
                    f"watermark offsets of {partition.topic}-{partition.partition}: {error.str()}{waited}",
                    retriable=is_retriable(error), code=error.code()) from exc
            attempt += 1
            with contextlib.suppress(KafkaException):  # the partition's leader, asked anew before the next try
                consumer.list_topics(partition.topic, timeout=max(0.1, min(WATERMARK_REQUEST_S, deadline - time.monotonic())))
            time.sleep(min(1.0, 0.05 * 2 ** min(attempt, 5)))


_NOT_AUTHORIZED = frozenset({KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.CLUSTER_AUTHORIZATION_FAILED})


@dataclasses.dataclass(frozen=True)
class LogIncarnation:
    """The coordinator log topic as it is now: its Kafka topic ID (KIP-516: a topic deleted and
    created again under the same name gets a new one, so the ID tells one incarnation of the log
    from the next; base64, as Kafka prints it) and its partition count."""

    topic_id: str
    partitions: int


def log_incarnation(admin: Any, topic: str, *, timeout_s: float = 30.0) -> LogIncarnation:
    """``topic``'s ID and partition count, from the cluster (Kafka's ``DescribeTopics``; the
    principal needs DESCRIBE on the topic, which READ and WRITE imply). A coordinator asks for
    them before it replays its log: a data file named with a log incarnation
    (:func:`~chandy.connectors.lake.sink.coordinator_log_id`) is then never taken for a file of
    another incarnation of the same log, whose checkpoint IDs the lost log no longer orders
    (docs/design.md §7, "Cleanup").

    A topic unknown to the broker asked (one just created, whose metadata has not reached every
    broker yet) or a retriable error is asked again, every 0.2 s, until ``timeout_s`` (seconds).

    Raises:
        TopicError: the topic cannot be described within ``timeout_s`` (it does not exist, the
            request failed or timed out), naming it and Kafka's last error.
    """
    from confluent_kafka import TopicCollection

    deadline = time.monotonic() + timeout_s
    while True:
        remaining = max(0.1, deadline - time.monotonic())
        try:
            description = admin.describe_topics(TopicCollection([topic]), request_timeout=remaining)[topic].result()
            return LogIncarnation(str(description.topic_id), len(description.partitions))
        except KafkaException as exc:
            error = exc.args[0]
            if time.monotonic() + 0.2 >= deadline or not (
                    error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART or is_retriable(error)):
                raise TopicError(f"describing topic {topic} (its ID and partitions) failed: {error.str()}") from exc
        time.sleep(0.2)


class LogReplacedError(TopicError):
    """The coordinator log topic was deleted and created again while a coordinator started (its
    topic ID changed between the start of its replay and the end): what it replayed is not the
    log it would write to. Starting again replays the new one."""


def check_same_incarnation(admin: Any, topic: str, before: LogIncarnation, *, timeout_s: float = 30.0) -> None:
    """Raise :class:`LogReplacedError` when ``topic``'s ID is no longer ``before.topic_id``.

    Raises:
        LogReplacedError: the topic has another ID now.
        TopicError: it cannot be described.
    """
    now = log_incarnation(admin, topic, timeout_s=timeout_s)
    if now.topic_id != before.topic_id:
        raise LogReplacedError(f"coordinator log {topic} was deleted and created again while it was replayed (topic "
                               f"ID {before.topic_id}, now {now.topic_id}): start the job again to replay the new log")


def _becomes_visible(admin: AdminClient, name: str, timeout_s: float) -> bool:
    """Whether topic ``name`` shows in ``admin``'s metadata within ``timeout_s`` (a principal
    sees only the topics it may DESCRIBE, and a new ACL takes a moment to reach every broker)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if name in admin.list_topics(timeout=timeout_s).topics:
            return True
        time.sleep(0.2)
    return False


def default_replication_factor(brokers: int) -> int:
    """Replicas of Chandy's topics on a cluster of ``brokers`` brokers: 3 from three brokers
    on (Kafka's usual production setting, with ``min.insync.replicas`` 2), else 1."""
    return 3 if brokers >= 3 else 1


def _wait_for_metadata(admin: AdminClient, names: list[str], timeout_s: float) -> None:
    """Wait until the broker's metadata lists ``names`` with leaders: a freshly created topic
    takes a moment to appear, and a producer or a check that runs first would miss it."""
    deadline = time.monotonic() + timeout_s
    while True:
        topics = admin.list_topics(timeout=timeout_s).topics
        if all(
            name in topics and topics[name].error is None
            and all(p.leader >= 0 for p in topics[name].partitions.values())
            for name in names
        ):
            return
        if time.monotonic() > deadline:
            raise TopicError(f"topics {', '.join(names)} did not appear in the metadata within {timeout_s} s")
        time.sleep(0.1)


def check_topics(admin: AdminClient, topics: ChandyTopics, *, timeout_s: float = 30.0) -> None:
    """Check that Chandy's topics exist and that the coordinator log is compacted.

    A coordinator log without ``cleanup.policy=compact`` would lose the state of old checkpoints
    to retention, so it is an error, not a warning. The other three must not be compacted: they
    are keyed by job id, and compaction would keep one message per job.

    Raises:
        TopicError: a topic is missing or has the wrong cleanup policy.
    """
    specs = {spec.name: spec for spec in topics.specs()}
    metadata = admin.list_topics(timeout=timeout_s)
    missing = sorted(name for name in specs if name not in metadata.topics)
    # a topic created a moment ago reaches every broker's metadata a little later (a cluster of
    # three answers from any of them): wait a few seconds before calling it missing
    deadline = time.monotonic() + min(timeout_s, 10.0)
    while missing and time.monotonic() < deadline:
        time.sleep(0.2)
        metadata = admin.list_topics(timeout=timeout_s)
        missing = sorted(name for name in specs if name not in metadata.topics)
    if missing:
        raise TopicError(f"missing Chandy topics: {', '.join(missing)} (create them with ensure_topics)")
    resources = [ConfigResource(ConfigResource.Type.TOPIC, name) for name in specs]
    brokers = len(metadata.brokers)
    for resource, entries in _describe_configs(admin, resources, timeout_s).items():
        policy = entries["cleanup.policy"].value if "cleanup.policy" in entries else "delete"
        wanted = specs[resource.name].config["cleanup.policy"]
        if set(policy.split(",")) != set(wanted.split(",")):
            raise TopicError(
                f"topic {resource.name} has cleanup.policy={policy}, Chandy needs cleanup.policy={wanted}"
            )
        if brokers >= 3 and resource.name == topics.coordinator_log:
            replicas = min(len(p.replicas) for p in metadata.topics[resource.name].partitions.values())
            min_isr = int(entries["min.insync.replicas"].value) if "min.insync.replicas" in entries else 1
            if replicas < 3 or min_isr < 2:
                log.warning("topic %s has %d replica(s) and min.insync.replicas=%d on a cluster of %d brokers: one "
                            "broker's death can stop or lose the coordinator's decisions (Chandy creates it with 3 and 2)",
                            resource.name, replicas, min_isr, brokers)


def log_history_settings(admin: AdminClient, topic: str, *, timeout_s: float = 30.0) -> LogHistorySettings:
    """The history settings of coordinator log ``topic``, as the brokers report them (a topic
    without its own value reports the broker's default).

    Raises:
        KafkaException: the topic's configuration cannot be described.
    """
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = _describe_configs(admin, [resource], timeout_s)[resource]

    def value(name: str, default: int) -> int:
        entry = entries.get(name)
        return default if entry is None or entry.value is None else int(entry.value)

    return LogHistorySettings(topic, value("min.compaction.lag.ms", 0), value("delete.retention.ms", 86_400_000),
                              value("segment.ms", 604_800_000))


def _describe_configs(admin: AdminClient, resources: list[ConfigResource], timeout_s: float) -> dict:
    """``describe_configs`` that waits out a young topic: on a cluster, the broker asked may not
    know a topic another broker just created (UNKNOWN_TOPIC_OR_PART) for a moment."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return {resource: future.result() for resource, future
                    in admin.describe_configs(resources, request_timeout=timeout_s).items()}
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART or time.monotonic() > deadline:
                raise
            time.sleep(0.2)

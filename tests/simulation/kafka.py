"""In-memory stand-ins of the Kafka the commit protocol uses: the coordinator log (a compacted,
transactional topic whose transactional ids have producer epochs), the consumer group, the source
topic, and the producer and consumer clients the real code makes through
:mod:`chandy.coordinator.kafka.config` (patched to hand out :class:`FakeProducer` and
:class:`FakeConsumer`).

- ``init_transactions`` bumps the transactional id's epoch: every older producer of the id is
  fenced, and its ``send_offsets_to_transaction``, ``commit_transaction`` and
  ``abort_transaction`` raise Kafka's fencing error (:meth:`SimCluster.fenced`: the rule the
  fencing mutation turns off);
- a transaction lands whole at ``commit_transaction``: its log records, its checkpoint events and
  its consumer-group offsets (``sendOffsetsToTransaction``), or nothing;
- :meth:`SimCluster.compact_log` keeps the newest record of each key (Kafka's cleaner), and
  :meth:`SimCluster.lose_log` deletes the log (a deleted and recreated topic: the transactional
  ids' epochs live in ``__transaction_state`` and survive it);
- the source topic's partitions hold offsets 0..end, and grow (:meth:`SimCluster.produce`).

Every call that talks to a broker goes through :meth:`~tests.simulation.kernel.World.call`, so
the schedule decides whether it succeeds, fails, fails after landing, is delayed or hangs.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
from typing import Any

from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, TopicPartition

from chandy.coordinator.environment import Batch
from chandy.coordinator.kafka.log_writer import SEND_OFFSETS_STUCK_S
from chandy.coordinator.messages import CheckpointEvent
from chandy.coordinator.records import CheckpointRecord, CheckpointStatus
from tests.simulation.kernel import CallTimedOut, World

TP = tuple[str, int]


def kafka_error(code: int, text: str, *, fatal: bool = False, retriable: bool = False,
                abortable: bool = False) -> KafkaException:
    return KafkaException(KafkaError(code, text, fatal=fatal, retriable=retriable, txn_requires_abort=abortable))


def fenced_error() -> KafkaException:
    return kafka_error(KafkaError._FENCED, "producer fenced by a newer producer of its transactional.id", fatal=True)


class Message:
    """A consumed message, as much of ``confluent_kafka.Message`` as the loader reads."""

    __slots__ = ("_error", "_headers", "_key", "_offset", "_partition", "_timestamp", "_topic", "_value")

    def __init__(self, topic: str, partition: int, offset: int, key: bytes | None = None, value: bytes | None = None,
                 headers: list | None = None, timestamp: int = 0, error: KafkaError | None = None) -> None:
        self._topic, self._partition, self._offset = topic, partition, offset
        self._key, self._value, self._headers, self._timestamp, self._error = key, value, headers, timestamp, error

    def error(self) -> KafkaError | None:
        return self._error

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> list | None:
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return (1, self._timestamp)


class TopicLog:
    """One partition of a topic: messages by offset (gaps after compaction), its end offset."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.messages: list[Message] = []
        self.end = 0
        self.incarnation = 0  # bumped when the topic is deleted and recreated

    def append(self, key: bytes | None, value: bytes | None, headers: list | None, timestamp: int) -> None:
        self.messages.append(Message(self.name, 0, self.end, key, value, headers, timestamp))
        self.end += 1

    def compact(self, *, drop_tombstones: bool) -> int:
        """Kafka's cleaner: the newest message of each key stays (a tombstone too, unless
        ``drop_tombstones``, as after ``delete.retention.ms``); the last message always stays
        (the active segment is never cleaned). Returns how many messages went."""
        newest: dict[bytes | None, int] = {}
        for i, message in enumerate(self.messages):
            newest[message.key()] = i
        keep = set(newest.values())
        if drop_tombstones:
            keep = {i for i in keep if self.messages[i].value() is not None}
        if self.messages:
            keep.add(len(self.messages) - 1)
        before = len(self.messages)
        self.messages = [m for i, m in enumerate(self.messages) if i in keep]
        return before - len(self.messages)

    def lose(self) -> None:
        self.messages = []
        self.end = 0
        self.incarnation += 1


class _Partition:
    def __init__(self, partition_id: int) -> None:
        self.id = partition_id


class _Topic:
    def __init__(self, name: str, partitions: int) -> None:
        self.topic = name
        self.partitions = {p: _Partition(p) for p in range(partitions)}
        self.error = None


class _Metadata:
    def __init__(self, topics: dict[str, _Topic]) -> None:
        self.topics = topics


@dataclasses.dataclass
class Transaction:
    messages: list[tuple[str, bytes | None, bytes | None, list | None]] = dataclasses.field(default_factory=list)
    batches: list[Batch] = dataclasses.field(default_factory=list)
    offsets: list[tuple[str, tuple[tuple[str, int, int], ...]]] = dataclasses.field(default_factory=list)
    committed: bool = False


@dataclasses.dataclass
class GroupCommit:
    """One commit of the consumer group: who made it (process name, transactional id, producer
    epoch) and what it set."""

    process: str
    transactional_id: str
    producer_epoch: int
    offsets: dict[TP, int]
    at_ms: int


class SimCluster:
    """One simulated Kafka cluster (see the module docstring)."""

    def __init__(self, world: World, source_topic: str, partitions: int, *, stuck_timeouts: bool = False) -> None:
        self.world = world
        self.source_topic = source_topic
        self.source_end: dict[TP, int] = {(source_topic, p): 0 for p in range(partitions)}
        self.source_times: dict[TP, list[int]] = {(source_topic, p): [] for p in range(partitions)}
        #: each source partition's log start offset (DeleteRecords or retention moves it up)
        self.source_start: dict[TP, int] = {(source_topic, p): 0 for p in range(partitions)}
        self.logs: dict[str, TopicLog] = {}
        self.txn_epochs: dict[str, int] = {}
        self.groups: dict[str, dict[TP, int]] = collections.defaultdict(dict)
        self.group_commits: dict[str, list[GroupCommit]] = collections.defaultdict(list)
        #: per events topic, the checkpoint events of committed transactions, in commit order
        self.events: dict[str, list[tuple[CheckpointEvent, str]]] = collections.defaultdict(list)
        #: (events topic's prefix, checkpoint ID) of every COMPLETED record a log accepted
        self.durable_completed: set[tuple[str, int]] = set()
        #: things that must never happen, noticed where they happen (the checker reports them)
        self.violations: list[tuple[str, str]] = []
        self.stuck_timeouts = stuck_timeouts  # a hung send_offsets_to_transaction times out (the writer replaces its producer)
        self.transactions = 0
        self.version = 0  # bumped at every change the checker looks at

    # -- the rules --------------------------------------------------------------------------------
    def fenced(self, producer: FakeProducer) -> bool:
        """Whether ``producer`` was fenced: a newer ``init_transactions`` of its transactional id
        (Kafka's producer-epoch check; the fencing mutation turns it off)."""
        return producer.epoch is None or producer.epoch < self.txn_epochs.get(producer.transactional_id, -1)

    # -- topics -----------------------------------------------------------------------------------
    def log(self, topic: str) -> TopicLog:
        if topic not in self.logs:
            self.logs[topic] = TopicLog(topic)
        return self.logs[topic]

    def produce(self, partition: int, count: int, timestamp_ms: int | None = None) -> None:
        """``count`` records into ``partition``, stamped ``timestamp_ms`` (CreateTime: a producer
        that buffered them), or by default with the clock when produced (LogAppendTime)."""
        tp = (self.source_topic, partition)
        self.source_end[tp] += count
        self.source_times[tp] += [self.world.now_ms() if timestamp_ms is None else timestamp_ms] * count
        self.version += 1  # the checker looks again: a new record may contradict a watermark claimed before

    def lose_log(self, topic: str) -> None:
        self.log(topic).lose()
        self.version += 1

    def compact_log(self, topic: str, *, drop_tombstones: bool) -> int:
        removed = self.log(topic).compact(drop_tombstones=drop_tombstones)
        self.version += 1
        return removed

    def metadata(self, topic: str | None) -> _Metadata:
        topics = {self.source_topic: _Topic(self.source_topic, len(self.source_end))}
        if topic is not None and topic != self.source_topic:
            self.log(topic)
            topics[topic] = _Topic(topic, 1)
        return _Metadata(topics)

    def truncate(self, partition: int, offset: int) -> None:
        """Kafka's DeleteRecords (or retention): the source partition's log starts at ``offset``
        (never moves back); the records below it are gone."""
        tp = (self.source_topic, partition)
        self.source_start[tp] = max(self.source_start[tp], min(offset, self.source_end[tp]))
        self.version += 1

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        if topic == self.source_topic:
            return self.source_start[(topic, partition)], self.source_end[(topic, partition)]
        return 0, self.log(topic).end

    # -- transactions --------------------------------------------------------------------------------
    def apply(self, txn: Transaction, producer: FakeProducer) -> None:
        """A committed transaction lands whole."""
        prefix = producer.prefix
        if producer.epoch is None or producer.epoch < self.txn_epochs.get(producer.transactional_id, -1):
            self.violations.append(("fenced-write", f"{producer.owner}: a transaction of fenced producer epoch "
                                                    f"{producer.epoch} of {producer.transactional_id} was committed"))
        log_topic = f"{prefix}.coordinator-log"
        for topic, key, value, headers in txn.messages:
            if topic == log_topic:
                self.log(topic).append(key, value, headers, self.world.now_ms())
        for batch in txn.batches:
            for event in batch.events:
                self.events[prefix].append((event, producer.owner))
            for record in batch.records:
                if isinstance(record, CheckpointRecord) and record.status is CheckpointStatus.COMPLETED:
                    self.durable_completed.add((prefix, record.checkpoint_id))
        for group_id, offsets in txn.offsets:
            self.commit_group(group_id, {(t, p): o for t, p, o in offsets}, producer)
        self.transactions += 1
        self.version += 1

    def commit_group(self, group_id: str, offsets: dict[TP, int], producer: FakeProducer) -> None:
        group = self.groups[group_id]
        for tp, offset in sorted(offsets.items()):
            if offset < group.get(tp, -1):
                self.violations.append(("group-moved-back", f"{producer.owner} (producer epoch {producer.epoch}) moved "
                                                            f"group {group_id} {tp[0]}-{tp[1]} back from {group[tp]} "
                                                            f"to {offset}"))
            group[tp] = offset
        self.group_commits[group_id].append(GroupCommit(producer.owner, producer.transactional_id, producer.epoch or 0,
                                                        dict(offsets), self.world.now))


class FakeProducer:
    """A transactional producer of the coordinator log (what ``LogWriter`` calls)."""

    def __init__(self, cluster: SimCluster, transactional_id: str, owner: str, prefix: str) -> None:
        self.cluster = cluster
        self.world = cluster.world
        self.transactional_id = transactional_id
        self.owner = owner
        self.prefix = prefix
        self.epoch: int | None = None
        self.txn: Transaction | None = None

    def _check_fenced(self) -> None:
        if self.cluster.fenced(self):
            raise fenced_error()

    def init_transactions(self, timeout: float | None = None) -> None:
        def effect() -> None:
            epoch = self.cluster.txn_epochs.get(self.transactional_id, -1) + 1
            self.cluster.txn_epochs[self.transactional_id] = epoch
            self.epoch = epoch
            self.txn = None
            self.cluster.version += 1
            self.world.note(f"{self.owner}: init_transactions -> producer epoch {epoch} of {self.transactional_id}")

        self.world.call("log.init", effect,
                        lambda: kafka_error(KafkaError._TIMED_OUT, "init_transactions timed out", retriable=True),
                        allowed=("ok", "fail", "fail_after", "delay"))

    def begin_transaction(self) -> None:
        if self.epoch is None:
            raise kafka_error(KafkaError._STATE, "begin_transaction before init_transactions")
        self.txn = Transaction()

    def produce(self, topic: str, value: bytes | None = None, key: bytes | None = None, partition: int = -1,
                headers: list | None = None, **_: Any) -> None:
        assert self.txn is not None, "produce outside a transaction"
        self.txn.messages.append((topic, key, value, headers))

    def note_batch(self, batch: Batch) -> None:
        """What the transaction carries, as objects (the checker reads events and records so)."""
        assert self.txn is not None
        self.txn.batches.append(batch)

    def send_offsets_to_transaction(self, offsets: list[TopicPartition], group_metadata: Any,
                                    timeout: float | None = None) -> None:
        txn = self.txn
        assert txn is not None

        def effect() -> None:
            self._check_fenced()
            txn.offsets.append((str(group_metadata), tuple((tp.topic, tp.partition, tp.offset) for tp in offsets)))

        stuck = int(SEND_OFFSETS_STUCK_S * 1000) if self.cluster.stuck_timeouts else None
        self.world.call("log.send_offsets", effect,
                        lambda: kafka_error(KafkaError._TRANSPORT, "send_offsets_to_transaction failed", abortable=True),
                        allowed=("ok", "fail", "delay", "hang"), timeout_ms=stuck,
                        timeout_error=lambda: CallTimedOut("send_offsets_to_transaction did not return"))

    def commit_transaction(self, timeout: float | None = None) -> None:
        txn = self.txn
        assert txn is not None
        if txn.committed:
            return  # a retried commit of a transaction that landed: librdkafka returns its outcome

        def effect() -> None:
            self._check_fenced()
            self.cluster.apply(txn, self)
            txn.committed = True

        def failed() -> KafkaException:  # nothing landed: retriable, abortable, or for good
            return self.world.rng.choice((
                lambda: kafka_error(KafkaError._TIMED_OUT, "commit_transaction timed out", retriable=True),
                lambda: kafka_error(KafkaError._TRANSPORT, "commit_transaction failed", abortable=True),
                lambda: kafka_error(KafkaError._TIMED_OUT, "commit_transaction failed for good"),
            ))()

        def timed_out() -> KafkaException:  # the outcome is unknown to the client: a retry completes it
            return kafka_error(KafkaError._TIMED_OUT, "commit_transaction timed out", retriable=True)

        outcome = self.world.outcome("log.commit")
        self.world.call("log.commit", effect, timed_out if outcome == "fail_after" else failed, timeout_ms=30_000,
                        timeout_error=timed_out, outcome=outcome)

    def abort_transaction(self, timeout: float | None = None) -> None:
        def effect() -> None:
            self._check_fenced()
            self.txn = None

        self.world.call("log.abort", effect, lambda: kafka_error(KafkaError._TIMED_OUT, "abort timed out", retriable=True),
                        allowed=("ok", "fail", "delay"))

    def flush(self, timeout: float | None = None) -> int:
        return 0

    def poll(self, timeout: float | None = None) -> int:
        return 0


class FakeAdmin:
    """An AdminClient: metadata only (what ``kafka_config.check_reachable`` asks)."""

    def __init__(self, cluster: SimCluster) -> None:
        self.cluster = cluster

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> _Metadata:
        return self.cluster.world.call("kafka.metadata", lambda: self.cluster.metadata(topic),
                                       lambda: kafka_error(KafkaError._TRANSPORT, "metadata request failed"),
                                       allowed=("ok", "fail", "delay"))


    def describe_topics(self, topics: Any, request_timeout: float = -1) -> dict[str, concurrent.futures.Future]:
        """Kafka's DescribeTopics: each topic's ID (a new one for each incarnation of a log: a
        lost log is a deleted and recreated topic) and partitions. Always answers, and draws
        nothing from the schedule's random numbers, so the seeds found before it replay as they
        did (the metadata request just before it, ``list_topics``, has the faults)."""
        futures: dict[str, concurrent.futures.Future] = {}
        for name in topics.topic_names:
            future: concurrent.futures.Future = concurrent.futures.Future()
            metadata = self.cluster.metadata(name)
            incarnation = self.cluster.log(name).incarnation
            future.set_result(TopicDescription(name, f"{name}#{incarnation}", list(metadata.topics[name].partitions)))
            futures[name] = future
        return futures


@dataclasses.dataclass
class TopicDescription:
    """confluent-kafka's ``TopicDescription``: the fields ``log_incarnation`` reads."""

    name: str
    topic_id: str
    partitions: list


class FakeConsumer:
    """A consumer: metadata, watermarks and committed offsets (the enumerator's), a read of the
    coordinator log (the loader's), the group's metadata (the log writer's)."""

    def __init__(self, cluster: SimCluster, group_id: str | None) -> None:
        self.cluster = cluster
        self.world = cluster.world
        self.group_id = group_id
        self._assigned: list[tuple[str, int, int, int]] = []
        self._delivered = False

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> _Metadata:
        return self.world.call("kafka.metadata", lambda: self.cluster.metadata(topic),
                               lambda: kafka_error(KafkaError._TRANSPORT, "metadata request failed"),
                               allowed=("ok", "fail", "delay"))

    def get_watermark_offsets(self, partition: TopicPartition, timeout: float | None = None,
                              cached: bool = False) -> tuple[int, int]:
        kind = "kafka.offsets" if partition.topic == self.cluster.source_topic else "log.read"
        return self.world.call(kind, lambda: self.cluster.watermarks(partition.topic, partition.partition),
                               lambda: kafka_error(KafkaError._TRANSPORT, "list offsets failed"),
                               allowed=("ok", "fail", "delay", "late"))

    def assign(self, partitions: list[TopicPartition]) -> None:
        self._assigned = [(tp.topic, tp.partition, max(0, tp.offset), self.cluster.log(tp.topic).incarnation)
                          for tp in partitions]
        self._delivered = False

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        if self._delivered:
            self.world.sleep(max(1.0, timeout * 1000))  # nothing more: the poll's timeout passes
            return []
        self._delivered = True
        out: list[Message] = []
        for topic, partition, start, incarnation in self._assigned:
            log = self.cluster.log(topic)
            if log.incarnation != incarnation:  # deleted and recreated since the read began
                return [Message(topic, partition, start, error=KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART))]
            out.extend(m for m in log.messages if m.offset() >= start)
            out.append(Message(topic, partition, log.end, error=KafkaError(KafkaError._PARTITION_EOF)))
        return out

    def committed(self, partitions: list[TopicPartition], timeout: float | None = None) -> list[TopicPartition]:
        group = self.cluster.groups.get(self.group_id or "", {})
        return [TopicPartition(tp.topic, tp.partition, group.get((tp.topic, tp.partition), OFFSET_INVALID))
                for tp in partitions]

    def commit(self, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("the simulation commits offsets in the coordinator log's transactions only")

    def consumer_group_metadata(self) -> str:
        return self.group_id or ""

    def close(self) -> None:
        pass

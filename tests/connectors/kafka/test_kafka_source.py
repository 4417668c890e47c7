"""The Kafka source coordinator against a real broker: Flink's owner rule, discovery, offset
ranges per checkpoint, offset commits only for completed checkpoints, restore without gap or
overlap (also across transaction markers and compacted gaps), subtask reset, exact range reads.

The checkpoint coordinator around the enumerator runs on the manual clock of the unit tests;
every Kafka call the enumerator and the readers make goes to the real broker."""

from __future__ import annotations

import concurrent.futures
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import NewPartitions, NewTopic

from chandy.connectors.kafka.source import offsets
from chandy.connectors.kafka.source.enumerator import (
    ADD_SPLITS,
    OFFSET_RANGES,
    KafkaSourceConfigError,
    KafkaSourceCoordinatorProvider,
    KafkaSourceOptions,
    SplitsEvent,
)
from chandy.connectors.kafka.source.reader import KafkaDataLossError, KafkaRangeReader
from chandy.connectors.kafka.source.split import KafkaPartitionSplit, java_string_hash, split_owner
from chandy.coordinator.checkpoint_coordinator import CheckpointCoordinator
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.messages import (
    AcknowledgeCheckpoint,
    DeclineCheckpoint,
    OperatorEventMessage,
    SubtaskAttemptFailed,
    SubtaskAttemptReady,
)
from chandy.coordinator.operator_coordinator import OperatorEvent
from chandy.coordinator.options import CheckpointingOptions
from chandy.coordinator.state import replay
from chandy.coordinator.storage import CheckpointStorage
from tests.fixtures.manual_env import ManualEnvironment

pytestmark = pytest.mark.integration

JOB = "5e1f00c0ffee4a60a1b2c3d4e5f60718"
OP = "kafka-source"


# -- the owner rule (pure) ------------------------------------------------------------------------
def test_java_string_hash_matches_java() -> None:
    assert java_string_hash("test") == 3556498
    assert java_string_hash("") == 0
    assert java_string_hash("polygenelubricants") == -(2**31)  # Integer.MIN_VALUE in Java
    assert java_string_hash("é") == 233
    assert java_string_hash("😀") == 1772899  # a surrogate pair: two UTF-16 code units (checked with jshell)


def test_owner_rule_is_flinks() -> None:
    for topic in ("orders", "payments", "polygenelubricants"):
        for n in (1, 3, 5, 8):
            start = ((java_string_hash(topic) * 31) & 0x7FFFFFFF) % n
            assert [split_owner(topic, p, n) for p in range(12)] == [(start + p) % n for p in range(12)]
    with pytest.raises(ValueError):
        split_owner("t", 0, 0)


def test_configuration_errors_are_typed() -> None:
    with pytest.raises(KafkaSourceConfigError, match="group.id"):
        KafkaSourceOptions("x:1", topics=("t",), commit_offsets_on_checkpoint=True)
    with pytest.raises(KafkaSourceConfigError, match="exactly one"):
        KafkaSourceOptions("x:1")
    with pytest.raises(KafkaSourceConfigError, match="not a regex"):
        KafkaSourceOptions("x:1", topic_pattern="orders-(")
    with pytest.raises(ValueError, match="reset strategy"):
        offsets.committed("middle")


# -- helpers ----------------------------------------------------------------------------------------
def create_topic(servers: str, name: str, partitions: int, **config: str) -> None:
    admin = kafka_config.admin_client(servers)
    admin.create_topics([NewTopic(name, partitions, 1, config=config)])[name].result()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        topic = admin.list_topics(name, timeout=10).topics.get(name)
        if topic and topic.error is None and len(topic.partitions) == partitions:
            return
        time.sleep(0.1)


def produce(servers: str, topic: str, partition: int, count: int, *, key: bytes | None = None, txn: str | None = None,
            abort: bool = False) -> None:
    producer = kafka_config.producer(servers, transactional_id=txn)
    if txn:
        producer.init_transactions(10)
        producer.begin_transaction()
    for i in range(count):
        producer.produce(topic, f"{topic}/{partition}/{i}/{uuid.uuid4().hex[:6]}".encode(), key or f"k{i}".encode(),
                         partition=partition)
    producer.flush(10)
    if txn:
        producer.abort_transaction(10) if abort else producer.commit_transaction(10)


def all_records(servers: str, topic: str, partition: int) -> list[tuple[int, bytes]]:
    consumer = kafka_config.consumer(servers)
    low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=10, cached=False)
    consumer.close()
    reader = KafkaRangeReader(servers)
    try:
        return [(m.offset(), m.value()) for m in reader.read(KafkaPartitionSplit(topic, partition, low, high))]
    finally:
        reader.close()


def group_offsets(servers: str, group: str) -> dict[tuple[str, int], int]:
    admin = kafka_config.admin_client(servers)
    result = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result()
    return {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions if tp.offset >= 0}


class Source:
    """A checkpoint coordinator (manual clock, real fsspec storage) hosting the Kafka enumerator."""

    def __init__(self, tmp_path: Path, servers: str, readers: int, state=None, **source_options) -> None:
        self.env = ManualEnvironment()
        self.readers = readers
        options = KafkaSourceOptions(servers, **{"partition_discovery_interval_ms": 1000, **source_options})
        storage = CheckpointStorage(f"file://{tmp_path}/chk", JOB)
        self.cc = CheckpointCoordinator(
            JOB, CheckpointingOptions(interval_ms=0, tolerable_failed=10), self.env, storage, {OP: readers},
            coordinator_providers=[KafkaSourceCoordinatorProvider(OP, options)], state=state)
        self.cc.start()
        self.env.run()
        self.enumerator = self.cc.holders[OP].coordinator

    def ready(self, subtask: int, attempt: int = 0) -> None:
        self.cc.attempt_ready(SubtaskAttemptReady(JOB, OP, subtask, attempt))
        self.env.run()

    def ready_all(self) -> None:
        for i in range(self.readers):
            self.ready(i)

    def events(self, event_type: str, subtask: int | None = None, attempt: int | None = None) -> list[SplitsEvent]:
        return [SplitsEvent.from_event(OperatorEvent(m.event_type, m.payload)) for m in self.env.control
                if isinstance(m, OperatorEventMessage) and m.event_type == event_type
                and (subtask is None or m.subtask_index == subtask) and (attempt is None or m.attempt_number == attempt)]

    def wait_for_discovery(self, partitions: int, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.enumerator.splits) < partitions:
            assert time.monotonic() < deadline, f"discovered {len(self.enumerator.splits)} of {partitions} partitions"
            self.env.advance(1000)
            time.sleep(0.05)

    def trigger(self):
        future = self.cc.trigger_checkpoint()
        self.env.run()
        return future

    def ack_all(self, checkpoint_id: int) -> None:
        for i in range(self.readers):
            self.cc.receive_acknowledge(AcknowledgeCheckpoint(JOB, self.cc.epoch, checkpoint_id, OP, i,
                                                              self.cc.current_attempts.get((OP, i), 0)))
            self.env.run()

    def ranges(self, checkpoint_id: int) -> dict[tuple[str, int], KafkaPartitionSplit]:
        return {(s.topic, s.partition): s for e in self.events(OFFSET_RANGES) if e.checkpoint_id == checkpoint_id
                for s in e.splits}


@pytest.fixture
def names(topic_prefix: str) -> tuple[str, str]:
    return f"{topic_prefix}-orders", f"{topic_prefix}-payments"


# -- assignment and discovery ---------------------------------------------------------------------------
def test_12_partitions_over_2_topics_and_5_readers_then_4_more_from_earliest(
        kafka_bootstrap_servers, names, tmp_path) -> None:
    orders, payments = names
    create_topic(kafka_bootstrap_servers, orders, 7)
    create_topic(kafka_bootstrap_servers, payments, 5)
    for p in range(7):
        produce(kafka_bootstrap_servers, orders, p, 3)
    source = Source(tmp_path, kafka_bootstrap_servers, 5, topics=(orders, payments), starting_offsets=offsets.latest())
    source.wait_for_discovery(12)
    source.ready_all()
    sent = {i: [s for e in source.events(ADD_SPLITS, i) for s in e.splits] for i in range(5)}
    every = [(s.topic, s.partition) for splits in sent.values() for s in splits]
    assert sorted(every) == sorted({(t, p) for t, n in ((orders, 7), (payments, 5)) for p in range(n)})
    assert len(every) == len(set(every)) == 12  # each partition exactly once
    for subtask, splits in sent.items():
        assert all(split_owner(s.topic, s.partition, 5) == subtask for s in splits)
    assert all(s.starting_offset == 3 for s in sent_splits(sent) if s.topic == orders)  # latest, the initializer
    # four new partitions, with records written before discovery sees them
    admin = kafka_config.admin_client(kafka_bootstrap_servers)  # kept alive until the future resolves
    admin.create_partitions([NewPartitions(payments, 9)])[payments].result()
    time.sleep(0.5)
    for p in range(5, 9):
        produce(kafka_bootstrap_servers, payments, p, 2)
    source.wait_for_discovery(16)
    added = [s for i in range(5) for e in source.events(ADD_SPLITS, i) for s in e.splits if s.topic == payments
             and s.partition >= 5]
    assert sorted(s.partition for s in added) == [5, 6, 7, 8]
    assert all(s.starting_offset == 0 for s in added)  # from earliest, not the initializer's latest
    for s in added:
        subtask = next(i for i in range(5) if s in [x for e in source.events(ADD_SPLITS, i) for x in e.splits])
        assert subtask == split_owner(payments, s.partition, 5)


def sent_splits(sent):
    return [s for splits in sent.values() for s in splits]


def test_subtask_reset_hands_the_splits_back_to_the_next_attempt(kafka_bootstrap_servers, names, tmp_path) -> None:
    orders, _ = names
    create_topic(kafka_bootstrap_servers, orders, 6)
    source = Source(tmp_path, kafka_bootstrap_servers, 3, topics=(orders,))
    source.wait_for_discovery(6)
    source.ready_all()
    first = sorted(s.partition for e in source.events(ADD_SPLITS, 1, attempt=0) for s in e.splits)
    assert first == sorted(p for p in range(6) if split_owner(orders, p, 3) == 1)
    source.cc.attempt_failed(SubtaskAttemptFailed(JOB, OP, 1, 0, "executor lost"))
    source.env.run()
    assert 1 not in source.enumerator.readers
    source.ready(1, attempt=1)
    again = sorted(s.partition for e in source.events(ADD_SPLITS, 1, attempt=1) for s in e.splits)
    assert again == first
    assert source.events(ADD_SPLITS, 0, attempt=0) and not source.events(ADD_SPLITS, 0, attempt=1)


# -- ranges and commits -----------------------------------------------------------------------------------
def test_offsets_are_committed_only_after_completion_and_never_for_an_aborted_checkpoint(
        kafka_bootstrap_servers, names, tmp_path) -> None:
    orders, _ = names
    group = f"g-{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap_servers, orders, 2)
    produce(kafka_bootstrap_servers, orders, 0, 10)
    produce(kafka_bootstrap_servers, orders, 1, 4)
    source = Source(tmp_path, kafka_bootstrap_servers, 2, topics=(orders,), group_id=group,
                    max_records_per_checkpoint=6)
    source.wait_for_discovery(2)
    source.ready_all()
    source.trigger()
    r1 = source.ranges(1)
    assert (r1[(orders, 0)].starting_offset, r1[(orders, 0)].stopping_offset) == (0, 6)  # capped at 6 records
    assert (r1[(orders, 1)].starting_offset, r1[(orders, 1)].stopping_offset) == (0, 4)
    assert group_offsets(kafka_bootstrap_servers, group) == {}  # pending: nothing committed
    source.ack_all(1)
    assert group_offsets(kafka_bootstrap_servers, group) == {(orders, 0): 6, (orders, 1): 4}
    # checkpoint 2 is declined: its ends (10, 4) are never committed, and 3 reads its range again
    source.trigger()
    assert source.ranges(2)[(orders, 0)].starting_offset == 6
    source.cc.receive_decline(DeclineCheckpoint(JOB, 1, 2, OP, 0, 0, "CHECKPOINT_DECLINED"))
    source.env.run()
    assert group_offsets(kafka_bootstrap_servers, group) == {(orders, 0): 6, (orders, 1): 4}
    produce(kafka_bootstrap_servers, orders, 1, 3)
    source.trigger()
    r3 = source.ranges(3)
    assert (r3[(orders, 0)].starting_offset, r3[(orders, 0)].stopping_offset) == (6, 10)
    assert (r3[(orders, 1)].starting_offset, r3[(orders, 1)].stopping_offset) == (4, 7)
    source.ack_all(3)
    assert group_offsets(kafka_bootstrap_servers, group) == {(orders, 0): 10, (orders, 1): 7}
    assert source.enumerator.commits_succeeded == 2 and source.enumerator.commits_failed == 0
    # the commits are in the coordinator log too
    from chandy.connectors.kafka.source.log_records import OffsetCommitRecord

    commits = [r for r in source.env.log if isinstance(r, OffsetCommitRecord)]
    assert [c.checkpoint_id for c in commits] == [1, 3]


def _one_partition_source(bootstrap: str, topic: str, tmp_path: Path, records: int) -> tuple[Source, str]:
    """A ready source over a new one-partition ``topic`` holding ``records`` records, committing to a
    new consumer group; returns the source and the group."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, 0, records)
    source = Source(tmp_path, bootstrap, 1, topics=(topic,), group_id=group)
    source.wait_for_discovery(1)
    source.ready_all()
    return source, group


def test_a_skipped_notification_is_covered_by_restore_and_the_next_checkpoint(
        kafka_bootstrap_servers, names, tmp_path) -> None:
    orders, _ = names
    source, group = _one_partition_source(kafka_bootstrap_servers, orders, tmp_path, records=5)
    source.trigger()
    source.cc.receive_acknowledge(AcknowledgeCheckpoint(JOB, 1, 1, OP, 0, 0))
    # the completion is durable, but the process dies before notify_checkpoint_complete runs
    while source.env.queue:
        action = source.env.queue.popleft()
        if "after_commit" in getattr(action, "__qualname__", ""):
            break
        action()
    assert source.cc.state.checkpoints[1].status == "COMPLETED"
    assert group_offsets(kafka_bootstrap_servers, group) == {}
    restarted = Source(tmp_path, kafka_bootstrap_servers, 1, state=replay(JOB, source.env.log), topics=(orders,),
                       group_id=group)
    assert group_offsets(kafka_bootstrap_servers, group) == {(orders, 0): 5}  # restore implies completion
    produce(kafka_bootstrap_servers, orders, 0, 2)
    restarted.wait_for_discovery(1)
    restarted.ready_all()
    restarted.trigger()
    assert restarted.ranges(2)[(orders, 0)].starting_offset == 5
    restarted.ack_all(2)
    assert group_offsets(kafka_bootstrap_servers, group) == {(orders, 0): 7}


class _HeldExecutor(concurrent.futures.Executor):
    """An I/O executor that holds the offset commits until the test runs them, in any order, and
    runs every other call (discovery, end offsets) inline."""

    def __init__(self) -> None:
        self.held: list[tuple[Any, concurrent.futures.Future]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        if getattr(fn, "__name__", "") != "commit":
            future.set_result(fn(*args, **kwargs))
            return future
        self.held.append((lambda: fn(*args, **kwargs), future))
        return future

    def run(self, index: int) -> None:
        call, future = self.held.pop(index)
        future.set_result(call())


def test_offset_commits_never_move_the_group_back_and_close_flushes_the_newest(
        kafka_bootstrap_servers, names, tmp_path) -> None:
    orders, _ = names
    source, group = _one_partition_source(kafka_bootstrap_servers, orders, tmp_path, records=5)
    held = source.env.io_executor = _HeldExecutor()
    source.trigger()
    source.ack_all(1)
    produce(kafka_bootstrap_servers, orders, 0, 3)
    source.trigger()
    source.ack_all(2)
    assert source.ranges(2)[(orders, 0)].stopping_offset == 8
    assert len(held.held) == 2 and group_offsets(kafka_bootstrap_servers, group) == {}
    # the I/O threads run checkpoint 2's commit before checkpoint 1's: the group stays at 2's ends
    held.run(1)
    held.run(0)
    source.env.run()
    assert group_offsets(kafka_bootstrap_servers, group) == {(orders, 0): 8}
    assert source.enumerator.commits_succeeded == 1
    # checkpoint 3 completes, its commit has not run when the job stops: closing commits it
    produce(kafka_bootstrap_servers, orders, 0, 2)
    source.trigger()
    source.ack_all(3)
    assert len(held.held) == 1 and group_offsets(kafka_bootstrap_servers, group) == {(orders, 0): 8}
    source.cc.shutdown()
    assert group_offsets(kafka_bootstrap_servers, group) == {(orders, 0): 10}
    held.run(0)  # the held call finds the enumerator closed and commits nothing more
    assert source.enumerator.commits_succeeded == 2


def test_no_group_id_means_no_commits(kafka_bootstrap_servers, names, tmp_path, caplog) -> None:
    orders, _ = names
    create_topic(kafka_bootstrap_servers, orders, 1)
    produce(kafka_bootstrap_servers, orders, 0, 3)
    with caplog.at_level("WARNING"):
        source = Source(tmp_path, kafka_bootstrap_servers, 1, topics=(orders,))
    assert sum("no group.id" in r.message for r in caplog.records) == 1
    source.wait_for_discovery(1)
    source.ready_all()
    source.trigger()
    source.ack_all(1)
    assert source.cc.state.checkpoints[1].status == "COMPLETED"
    assert source.enumerator.commits_succeeded == 0


def test_committed_offsets_without_a_fallback_fail_the_job_clearly(kafka_bootstrap_servers, names, tmp_path) -> None:
    orders, _ = names
    create_topic(kafka_bootstrap_servers, orders, 1)
    source = Source(tmp_path, kafka_bootstrap_servers, 1, topics=(orders,), group_id=f"g-{uuid.uuid4().hex[:8]}",
                    starting_offsets=offsets.committed())
    source.env.run()
    assert source.cc.job_status == "FAILED"
    assert "no committed offset" in source.cc.state.job_status_reason
    fallback = Source(tmp_path / "b", kafka_bootstrap_servers, 1, topics=(orders,), group_id=f"g-{uuid.uuid4().hex[:8]}",
                      starting_offsets=offsets.committed("earliest"))
    fallback.wait_for_discovery(1)
    assert fallback.enumerator.splits[(orders, 0)].starting_offset == 0


def test_restore_keeps_the_assignment_and_ranges_continue_across_markers_and_compaction(
        kafka_bootstrap_servers, names, tmp_path) -> None:
    orders, payments = names
    create_topic(kafka_bootstrap_servers, orders, 3)
    # payments is compacted, with segments small enough for the cleaner to leave gaps quickly
    create_topic(kafka_bootstrap_servers, payments, 1, **{
        "cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.001",
        "min.compaction.lag.ms": "0", "delete.retention.ms": "0"})
    for p in range(3):
        produce(kafka_bootstrap_servers, orders, p, 4, txn=f"tx-{uuid.uuid4().hex}")  # commit markers
    produce(kafka_bootstrap_servers, orders, 0, 3, txn=f"tx-{uuid.uuid4().hex}", abort=True)  # aborted + marker
    for _ in range(3):
        produce(kafka_bootstrap_servers, payments, 0, 5, key=b"same-key")
        time.sleep(0.2)
    source = Source(tmp_path, kafka_bootstrap_servers, 2, topics=(orders, payments))
    source.wait_for_discovery(4)
    source.ready_all()
    source.trigger()
    source.ack_all(1)
    r1 = source.ranges(1)
    assert r1[(orders, 0)].stopping_offset == 9  # 4 records + marker + 3 aborted + marker
    assignment = source.enumerator.assignment()
    # more data: committed and aborted transactions, and compaction that removes overwritten keys
    produce(kafka_bootstrap_servers, orders, 0, 2, txn=f"tx-{uuid.uuid4().hex}")
    produce(kafka_bootstrap_servers, orders, 1, 2, txn=f"tx-{uuid.uuid4().hex}", abort=True)
    produce(kafka_bootstrap_servers, payments, 0, 5, key=b"other-key")
    deadline = time.monotonic() + 40
    while [o for o, _ in all_records(kafka_bootstrap_servers, payments, 0)][:1] == [0] and time.monotonic() < deadline:
        produce(kafka_bootstrap_servers, payments, 0, 1, key=b"roll")  # rolls the segment so it can be cleaned
        time.sleep(1)
    payments_records = all_records(kafka_bootstrap_servers, payments, 0)
    offsets_seen = [o for o, _ in payments_records]
    assert offsets_seen != list(range(len(offsets_seen))), "compaction left no gap within the first range"

    restarted = Source(tmp_path, kafka_bootstrap_servers, 2, state=replay(JOB, source.env.log),
                       topics=(orders, payments))
    assert restarted.enumerator.assignment() == assignment
    restarted.ready_all()
    restarted.trigger()
    r2 = restarted.ranges(2)
    assert set(r2) == set(r1)
    for tp in r1:
        assert r2[tp].starting_offset == r1[tp].stopping_offset  # no gap, no overlap
    reader = KafkaRangeReader(kafka_bootstrap_servers)
    try:
        for tp in r2:
            # the cleaner may compact payments again while it is read: compare with a partition
            # that held the same records before and after the ranges were read
            for _ in range(10):
                content = all_records(kafka_bootstrap_servers, *tp)
                read = [(m.offset(), m.value()) for r in (r1[tp], r2[tp]) for m in reader.read(r)]
                if all_records(kafka_bootstrap_servers, *tp) == content:
                    break
            assert read == [(o, v) for o, v in content if o < r2[tp].stopping_offset]
    finally:
        reader.close()


def test_a_range_read_returns_exactly_the_records_of_the_range(kafka_bootstrap_servers, names) -> None:
    orders, _ = names
    create_topic(kafka_bootstrap_servers, orders, 1)
    produce(kafka_bootstrap_servers, orders, 0, 20)
    produce(kafka_bootstrap_servers, orders, 0, 5, txn=f"tx-{uuid.uuid4().hex}", abort=True)
    produce(kafka_bootstrap_servers, orders, 0, 5, txn=f"tx-{uuid.uuid4().hex}")
    content = all_records(kafka_bootstrap_servers, orders, 0)
    assert len(content) == 25  # aborted records are never read
    reader = KafkaRangeReader(kafka_bootstrap_servers)
    try:
        end = content[-1][0] + 2  # past the last commit marker
        for start, stop in ((0, 0), (0, 7), (5, 20), (19, 27), (20, 26), (0, end), (24, end)):
            got = [(m.offset(), m.value()) for m in reader.read(KafkaPartitionSplit(orders, 0, start, stop))]
            assert got == [(o, v) for o, v in content if start <= o < stop], (start, stop)
    finally:
        reader.close()


def test_offsets_gone_from_kafka_are_reported_never_jumped_over(kafka_bootstrap_servers, names) -> None:
    """Spark's failOnDataLoss: a range whose first offsets were deleted (DeleteRecords, as retention
    does) raises KafkaDataLossError naming the offsets gone and the log's bounds, instead of
    librdkafka's silent reset to the earliest offset; with fail_on_data_loss False the reader
    yields exactly the range's records still in the log; a range entirely gone yields nothing."""
    orders, _ = names
    create_topic(kafka_bootstrap_servers, orders, 1)
    produce(kafka_bootstrap_servers, orders, 0, 100)
    admin = kafka_config.admin_client(kafka_bootstrap_servers)
    admin.delete_records([TopicPartition(orders, 0, 60)])[TopicPartition(orders, 0, 60)].result(30)
    reader = KafkaRangeReader(kafka_bootstrap_servers, timeout_s=20)
    try:
        with pytest.raises(KafkaDataLossError, match=rf"{orders}-0: offsets \[10, 60\) of the range \[10, 80\) "
                                                      r"are no longer in Kafka \(the partition's log holds \[60, 100\)"):
            list(reader.read_batches(KafkaPartitionSplit(orders, 0, 10, 80)))
        # the reader is usable after the error, and reads what is still there
        assert [m.offset() for m in reader.read(KafkaPartitionSplit(orders, 0, 60, 70))] == list(range(60, 70))
        kept = [m.offset() for b in reader.read_batches(KafkaPartitionSplit(orders, 0, 10, 80), fail_on_data_loss=False)
                for m in b]
        assert kept == list(range(60, 80))
        assert [m.offset() for b in reader.read_batches(KafkaPartitionSplit(orders, 0, 20, 50), fail_on_data_loss=False)
                for m in b] == []
    finally:
        reader.close()


class _CountingConsumer:
    """A real consumer that records every ``consume`` call's count and what the broker returned."""

    def __init__(self, consumer: Any) -> None:
        self.consumer = consumer
        self.calls: list[tuple[int, list[int]]] = []

    def consume(self, num_messages: int, timeout: float) -> list:
        messages = self.consumer.consume(num_messages=num_messages, timeout=timeout)
        self.calls.append((num_messages, [m.offset() for m in messages if m.error() is None]))
        return messages

    def __getattr__(self, name: str) -> Any:
        return getattr(self.consumer, name)


def test_a_range_read_takes_no_record_past_its_end_from_the_consumer(kafka_bootstrap_servers, names) -> None:
    """Each consume asks for at most what the range still holds, so the records after it are
    neither waited for nor converted, in batches of at most ``batch_size``."""
    orders, _ = names
    create_topic(kafka_bootstrap_servers, orders, 1)
    produce(kafka_bootstrap_servers, orders, 0, 100)
    reader = KafkaRangeReader(kafka_bootstrap_servers)
    counting = reader.consumer = _CountingConsumer(reader.consumer)
    try:
        batches = list(reader.read_batches(KafkaPartitionSplit(orders, 0, 10, 47), batch_size=16))
        assert [m.offset() for batch in batches for m in batch] == list(range(10, 47))
        assert all(0 < len(batch) <= 16 for batch in batches)
        returned = [o for _, got in counting.calls for o in got]
        assert returned == list(range(10, 47))  # nothing past offset 46 left the consumer
        assert all(asked <= 16 for asked, _ in counting.calls)
        # the partition's end (100) is a range end too
        assert [m.offset() for batch in reader.read_batches(KafkaPartitionSplit(orders, 0, 90, 100))
                for m in batch] == list(range(90, 100))
    finally:
        reader.close()


@pytest.mark.parametrize("initializer", ["earliest", "latest", "committed"])
def test_the_sinks_offsets_win_over_every_starting_offsets_initializer(
        kafka_bootstrap_servers, names, tmp_path, initializer) -> None:
    """Issue 44, item 1: with no restored checkpoint (a lost coordinator log), a partition the sink
    holds starts exactly where the sink's records end, whatever the initializer says; a partition
    the sink has never seen follows the initializer."""
    orders, _ = names
    create_topic(kafka_bootstrap_servers, orders, 3)
    for p in range(3):
        produce(kafka_bootstrap_servers, orders, p, 10)
    group = f"g-{uuid.uuid4().hex[:8]}"
    if initializer == "committed":  # a group ahead of the table must not win either
        consumer = kafka_config.consumer(kafka_bootstrap_servers, group_id=group)
        consumer.commit(offsets=[TopicPartition(orders, p, 9) for p in range(3)], asynchronous=False)
        consumer.close()
    chosen = {"earliest": offsets.earliest(), "latest": offsets.latest(),
              "committed": offsets.committed("earliest")}[initializer]
    # the table holds partition 0 up to 4 and partition 1 up to 10; partition 2 is new to it
    source = Source(tmp_path, kafka_bootstrap_servers, 1, topics=(orders,), starting_offsets=chosen, group_id=group,
                    offset_floor={(orders, 0): 4, (orders, 1): 10})
    source.wait_for_discovery(3)
    source.ready_all()
    source.trigger()
    ranges = source.ranges(1)
    assert ranges[(orders, 0)].starting_offset == 4
    assert ranges[(orders, 1)].starting_offset == 10
    expected_new = {"earliest": 0, "latest": 10, "committed": 9}[initializer]
    assert ranges[(orders, 2)].starting_offset == expected_new
    assert all(r.stopping_offset == 10 for r in ranges.values())


def test_offsets_specs_in_sparks_and_flinks_forms() -> None:
    """Issue 47: --starting-offsets / --ending-offsets values, parsed without a broker."""
    from chandy.connectors.kafka.source.offsets import OffsetsSpecError, parse_offsets_spec, parse_timestamp_ms

    class Retriever:
        def earliest(self, partitions):
            return {tp: 5 for tp in partitions}

        def latest(self, partitions):
            return {tp: 50 for tp in partitions}

        def committed(self, partitions):
            return {tp: None for tp in partitions}

        def for_timestamp(self, partitions, timestamp_ms):
            return {tp: timestamp_ms // 1000 for tp in partitions}

    parts = [("a", 0), ("a", 1), ("b", 0)]
    def get(spec: str, ending: bool = False) -> dict:
        return parse_offsets_spec(spec, ending=ending).get_partition_offsets(parts, Retriever())

    assert get("earliest") == dict.fromkeys(parts, 5) and get("latest") == dict.fromkeys(parts, 50)
    assert get("committed") == dict.fromkeys(parts, 5)  # no group offsets: earliest
    assert get("timestamp:42000") == dict.fromkeys(parts, 42)
    assert parse_timestamp_ms("2026-11-27T10:00:00Z", "x") == parse_timestamp_ms("2026-11-27T10:00:00", "x") \
        == 1_795_773_600_000
    assert get('{"a": {"0": 23, "1": -2}, "b": {"0": -1}}') == {("a", 0): 23, ("a", 1): 5, ("b", 0): 50}
    assert get('{"a": {"0": 7}}') == {("a", 0): 7, ("a", 1): 5, ("b", 0): 5}  # not named: earliest (Flink)
    assert get('{"a": {"0": 7, "1": -1}, "b": {"0": 9}}', ending=True) == {("a", 0): 7, ("a", 1): 50, ("b", 0): 9}
    # issue 54, finding H: an ending map that leaves partitions out ended them at earliest (nothing
    # landed, exit 0); Spark's endingOffsets must name every partition, and names no other
    with pytest.raises(OffsetsSpecError, match=r"--ending-offsets names no offset for a-1, b-0: JSON offsets must "
                                               r"name every partition of the topics the job reads \(-1 for latest\)"):
        get('{"a": {"0": 7}}', ending=True)
    with pytest.raises(OffsetsSpecError, match=r"names a-2, which the job does not read"):
        get('{"a": {"0": 7, "1": 8, "2": 9}, "b": {"0": 9}}', ending=True)
    for spec, ending, error in [("earliest", True, "is not one of latest"), ("soon", False, "is not one of earliest"),
                                ('{"a": {"0": -2}}', True, r"a-0: -2 is not an offset"),
                                ('{"a": [1]}', False, "must map partitions to offsets"),
                                ("timestamp:yesterday", False, "neither ms since the epoch nor an ISO-8601")]:
        with pytest.raises(OffsetsSpecError, match=error):
            parse_offsets_spec(spec, ending=ending)

"""Spark's failOnDataLoss in the Kafka source enumerator (issue 54, finding B), against the real
broker: a partition whose log moved below the job's position (the topic deleted and created
again, records deleted before they were read, a topic gone) used to show no lag, read nothing and
say nothing, and once the new log grew past the old position every record below it was skipped
for good. By default the trigger that sees it ends the job (KafkaDataLossError, which suppresses
restarts), naming the partition and both offsets; with fail_on_data_loss False the job goes on
from the new log with a warning and counts the offsets lost."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from chandy.connectors.kafka.source.data_loss import END_BELOW, GONE, START_ABOVE, log_change
from chandy.connectors.kafka.source.enumerator import OFFSET_RANGES
from chandy.connectors.kafka.source.reader import KafkaDataLossError, KafkaRangeReader
from chandy.connectors.kafka.source.split import KafkaPartitionSplit
from chandy.coordinator.errors import SuppressRestartsError
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.messages import DeclineCheckpoint
from chandy.coordinator.state import replay
from tests.connectors.kafka.test_kafka_source import JOB, OP, Source, create_topic, produce
from tests.fixtures.kafka import create_again

pytestmark = pytest.mark.integration


# -- the rule (pure) ----------------------------------------------------------------------------------
def test_the_three_changes_spark_tells_apart_and_the_offsets_each_loses() -> None:
    assert log_change(("t", 0), 10, (0, 10)) is None and log_change(("t", 0), 0, (0, 0)) is None
    below = log_change(("t", 0), 10, (0, 3))
    assert below is not None and below.kind == END_BELOW and below.offsets_lost == 7
    assert below.describe().startswith("t-0: the log ends at offset 3, below the job's position 10 (offset was changed "
                                       "from 10 to 3): the topic was deleted and created again, or an unclean leader "
                                       "election truncated the log")
    above = log_change(("t", 0), 30, (60, 100))
    assert above is not None and above.kind == START_ABOVE and above.offsets_lost == 30
    assert "t-0: offsets [30, 60) are no longer in Kafka" in above.describe()
    assert "retention or DeleteRecords removed them before they were read" in above.describe()
    gone = log_change(("t", 1), 5, None)
    assert gone is not None and gone.kind == GONE and gone.offsets_lost == 0
    assert gone.describe().startswith("t-1 is gone")
    error = below.error()
    assert isinstance(error, SuppressRestartsError)  # a restart would meet the same log
    assert "\n" not in str(error) and "--no-fail-on-data-loss" in str(error)


# -- helpers ----------------------------------------------------------------------------------------------
def recreate(servers: str, topic: str, partitions: int = 1, *, deleted: bool = False) -> None:
    """Delete ``topic`` (unless ``deleted`` already) and create it again (the broker finishes a
    deletion in the background)."""
    admin = kafka_config.admin_client(servers)
    if not deleted:
        admin.delete_topics([topic])[topic].result(30)
    create_again(admin, topic, partitions)
    deadline = time.monotonic() + 60
    while True:  # until its metadata shows every partition
        metadata = admin.list_topics(topic, timeout=10).topics.get(topic)
        if metadata is not None and metadata.error is None and len(metadata.partitions) == partitions:
            return
        assert time.monotonic() < deadline, "the topic created again does not show"
        time.sleep(0.1)


def delete_records(servers: str, topic: str, before: int) -> None:
    admin = kafka_config.admin_client(servers)
    tp = TopicPartition(topic, 0, before)
    admin.delete_records([tp])[tp].result(30)


def started(tmp_path: Path, servers: str, topic: str, records: int, **options) -> Source:
    """A ready one-reader source over a new one-partition topic holding ``records`` records,
    whose first checkpoint read them all (completed)."""
    create_topic(servers, topic, 1)
    produce(servers, topic, 0, records)
    source = Source(tmp_path, servers, 1, topics=(topic,), **options)
    source.wait_for_discovery(1)
    source.ready_all()
    source.trigger()
    source.ack_all(1)
    assert source.enumerator.committed_end == {(topic, 0): records}
    return source


def read(servers: str, split: KafkaPartitionSplit) -> list[int]:
    reader = KafkaRangeReader(servers, timeout_s=20)
    try:
        return [m.offset() for b in reader.read_batches(split, fail_on_data_loss=False) for m in b]
    finally:
        reader.close()


def assert_failed(source: Source, checkpoint_id: int, pattern: str) -> None:
    assert source.cc.job_status == "FAILED"
    reason = source.cc.state.job_status_reason or ""
    assert reason.startswith("KafkaDataLossError: ") and pattern in reason, reason
    assert "\n" not in reason
    assert checkpoint_id not in source.enumerator.in_flight
    assert not [e for e in source.events(OFFSET_RANGES) if e.checkpoint_id == checkpoint_id]  # no reader got a range


# -- a topic deleted and created again: the log ends below the position ------------------------------------
def test_a_recreated_topic_fails_the_job_at_the_next_trigger_and_after_a_restore(
        kafka_bootstrap_servers, topic_prefix, tmp_path) -> None:
    topic = f"{topic_prefix}-orders"
    source = started(tmp_path, kafka_bootstrap_servers, topic, 10)
    before = list(source.env.log)  # the coordinator log up to checkpoint 1's completion
    recreate(kafka_bootstrap_servers, topic)
    produce(kafka_bootstrap_servers, topic, 0, 3)
    expected = (f"{topic}-0: the log ends at offset 3, below the job's position 10 (offset was changed from 10 to 3): "
                "the topic was deleted and created again, or an unclean leader election truncated the log")
    # between triggers (the driver's lag poll): the error, the job left to the caller
    with pytest.raises(KafkaDataLossError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        source.enumerator.check_log_ends({(topic, 0): (0, 3)})
    assert source.cc.job_status == "RUNNING"
    # today's code fixed the range [10, 10), said nothing, and skipped [0, 10) of the new log later
    source.trigger()
    assert_failed(source, 2, expected)
    assert source.enumerator.offsets_lost == 0 and source.enumerator.data_loss == []
    # a restart from checkpoint 1 meets the same log: its first trigger fails too
    restarted = Source(tmp_path, kafka_bootstrap_servers, 1, state=replay(JOB, before), topics=(topic,))
    restarted.ready_all()
    assert restarted.enumerator.committed_end == {(topic, 0): 10}
    restarted.trigger()
    assert_failed(restarted, 2, expected)


def test_without_fail_on_data_loss_a_recreated_topic_is_read_from_its_start(
        kafka_bootstrap_servers, topic_prefix, tmp_path) -> None:
    topic = f"{topic_prefix}-orders"
    source = started(tmp_path, kafka_bootstrap_servers, topic, 10, fail_on_data_loss=False)
    recreate(kafka_bootstrap_servers, topic)
    produce(kafka_bootstrap_servers, topic, 0, 3)
    source.trigger()
    r2 = source.ranges(2)[(topic, 0)]
    assert (r2.starting_offset, r2.stopping_offset) == (0, 3)  # the new log, from its start
    assert source.enumerator.offsets_lost == 7  # what is knowable: old position 10 - new end 3
    [warning] = source.enumerator.data_loss
    assert warning.startswith(f"{topic}-0: the log ends at offset 3, below the job's position 10 (offset was changed "
                              "from 10 to 3)") and "going on from offset 0, as --no-fail-on-data-loss asks" in warning
    assert read(kafka_bootstrap_servers, r2) == [0, 1, 2]
    source.ack_all(2)
    assert source.cc.job_status == "RUNNING" and source.cc.state.checkpoints[2].status == "COMPLETED"
    produce(kafka_bootstrap_servers, topic, 0, 20)
    source.trigger()
    r3 = source.ranges(3)[(topic, 0)]
    assert (r3.starting_offset, r3.stopping_offset) == (3, 23)
    assert source.enumerator.offsets_lost == 7 and len(source.enumerator.data_loss) == 1  # counted once


def test_a_sink_that_holds_the_offsets_keeps_the_position_until_the_new_log_reaches_it(
        kafka_bootstrap_servers, topic_prefix, tmp_path) -> None:
    """The pipeline's case: the lake table records each partition's offsets and refuses a range
    below them, so the job goes on from its position once the new log reaches it."""
    topic = f"{topic_prefix}-orders"
    source = started(tmp_path, kafka_bootstrap_servers, topic, 10, fail_on_data_loss=False, sink_holds_offsets=True)
    recreate(kafka_bootstrap_servers, topic)
    produce(kafka_bootstrap_servers, topic, 0, 3)
    assert source.enumerator.check_log_ends({(topic, 0): (0, 3)}) == {(topic, 0): 10}  # the lag poll sees it first
    assert source.enumerator.offsets_lost == 7
    source.trigger()
    r2 = source.ranges(2)[(topic, 0)]
    assert (r2.starting_offset, r2.stopping_offset) == (10, 10)
    source.ack_all(2)
    produce(kafka_bootstrap_servers, topic, 0, 12)
    source.trigger()
    r3 = source.ranges(3)[(topic, 0)]
    assert (r3.starting_offset, r3.stopping_offset) == (10, 15)
    [warning] = source.enumerator.data_loss
    assert "going on from offset 10 once the new log reaches it" in warning
    assert source.enumerator.offsets_lost == 7


# -- records deleted before they were read: the log start moved above the position ---------------------------
def test_records_deleted_before_they_were_read_fail_the_job(kafka_bootstrap_servers, topic_prefix, tmp_path) -> None:
    topic = f"{topic_prefix}-orders"
    source = started(tmp_path, kafka_bootstrap_servers, topic, 30)
    produce(kafka_bootstrap_servers, topic, 0, 70)
    delete_records(kafka_bootstrap_servers, topic, 60)
    source.trigger()
    # today's code fixed [30, 100): the reader failed on it, or, with librdkafka's reset, skipped [30, 60) unsaid
    assert_failed(source, 2, f"{topic}-0: offsets [30, 60) are no longer in Kafka (the log start offset moved above "
                             "the job's position 30 to 60; the log holds [60, 100)): retention or DeleteRecords removed "
                             "them before they were read")


@pytest.mark.parametrize("holds", [False, True], ids=["from-the-log-start", "sink-holds-offsets"])
def test_without_fail_on_data_loss_records_deleted_are_skipped_and_counted_once(
        kafka_bootstrap_servers, topic_prefix, tmp_path, holds) -> None:
    topic = f"{topic_prefix}-orders"
    source = started(tmp_path, kafka_bootstrap_servers, topic, 30, fail_on_data_loss=False, sink_holds_offsets=holds,
                     max_records_per_checkpoint=30)
    produce(kafka_bootstrap_servers, topic, 0, 70)
    delete_records(kafka_bootstrap_servers, topic, 60)
    source.trigger()
    r2 = source.ranges(2)[(topic, 0)]
    # the cap counts offsets the log holds: 30 records from the log start on
    assert (r2.starting_offset, r2.stopping_offset) == ((30 if holds else 60), 90)
    assert read(kafka_bootstrap_servers, r2) == list(range(60, 90))
    assert source.enumerator.offsets_lost == 30
    # declined: the next checkpoint fixes the same range, and counts nothing twice
    source.cc.receive_decline(DeclineCheckpoint(JOB, source.cc.epoch, 2, OP, 0, 0, "CHECKPOINT_DECLINED"))
    source.env.run()
    source.trigger()
    r3 = source.ranges(3)[(topic, 0)]
    assert (r3.starting_offset, r3.stopping_offset) == (r2.starting_offset, 90)
    source.ack_all(3)
    assert source.enumerator.committed_end == {(topic, 0): 90}
    assert source.enumerator.offsets_lost == 30 and len(source.enumerator.data_loss) == 1
    assert source.enumerator.data_loss[0].startswith(f"{topic}-0: offsets [30, 60) are no longer in Kafka")


# -- a topic deleted (not yet created again): its partitions are gone -----------------------------------------
def wait_until_missing(source: Source, tp: tuple[str, int], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while tp not in source.enumerator.missing:
        assert time.monotonic() < deadline, "discovery did not miss the deleted topic"
        source.env.advance(1000)
        time.sleep(0.05)


def test_a_deleted_topic_fails_the_job_or_without_fail_on_data_loss_waits_for_its_new_log(
        kafka_bootstrap_servers, topic_prefix, tmp_path) -> None:
    orders, payments = f"{topic_prefix}-orders", f"{topic_prefix}-payments"
    admin = kafka_config.admin_client(kafka_bootstrap_servers)
    failing = started(tmp_path / "a", kafka_bootstrap_servers, orders, 5)
    admin.delete_topics([orders])[orders].result(30)
    wait_until_missing(failing, (orders, 0))
    failing.trigger()
    assert_failed(failing, 2, f"{orders}-0 is gone (it is no longer in topic {orders}'s metadata), so records from the "
                              "job's position 5 on may have been missed")

    going_on = started(tmp_path / "b", kafka_bootstrap_servers, payments, 5, fail_on_data_loss=False)
    admin.delete_topics([payments])[payments].result(30)
    wait_until_missing(going_on, (payments, 0))
    going_on.trigger()
    assert going_on.ranges(2) == {}  # no range while it is gone; the checkpoint completes
    going_on.ack_all(2)
    assert going_on.cc.state.checkpoints[2].status == "COMPLETED"
    assert going_on.enumerator.committed_end == {(payments, 0): 5}
    assert [w.split(" is gone")[0] for w in going_on.enumerator.data_loss] == [f"{payments}-0"]
    # created again: the new log ends below the position, and is read from its start
    recreate(kafka_bootstrap_servers, payments, deleted=True)
    produce(kafka_bootstrap_servers, payments, 0, 2)
    deadline = time.monotonic() + 30
    while going_on.enumerator.missing:
        assert time.monotonic() < deadline, "discovery did not find the topic again"
        going_on.env.advance(1000)
        time.sleep(0.05)
    going_on.trigger()
    r3 = going_on.ranges(3)[(payments, 0)]
    assert (r3.starting_offset, r3.stopping_offset) == (0, 2)
    assert going_on.enumerator.offsets_lost == 3 and len(going_on.enumerator.data_loss) == 2

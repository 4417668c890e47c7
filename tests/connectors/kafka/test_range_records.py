"""The read path's pure parts on real ``confluent_kafka.Message`` objects: which records of a
``consume`` batch belong to a range (``reader._in_range``) and their Arrow form
(``records.to_record_batch``)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message

from chandy.connectors.kafka.source.reader import RangeReadError, _in_range
from chandy.formats.records import ARROW_SCHEMA, to_record_batch


def record(offset: int, **kwargs: Any) -> Message:
    return Message(topic="orders", partition=3, offset=offset, key=b"k%d" % offset, value=b"v%d" % offset,
                   timestamp=kwargs.pop("timestamp", (1, 1_700_000_000_000 + offset)), **kwargs)


def end_of_partition(offset: int) -> Message:
    return Message(topic="orders", partition=3, offset=offset, error=KafkaError(KafkaError._PARTITION_EOF))


def offsets(messages: list[Message]) -> list[int]:
    return [m.offset() for m in messages]


def test_records_below_the_range_end_are_kept_and_the_first_at_or_past_it_ends_the_range() -> None:
    kept, done = _in_range([record(5), record(6)], 10, "orders-3")
    assert (offsets(kept), done) == ([5, 6], False)
    kept, done = _in_range([record(8), record(9), record(10), record(11)], 10, "orders-3")
    assert (offsets(kept), done) == ([8, 9], True)
    # a gap (transaction marker, compaction) before the end: the next record past it ends the range
    kept, done = _in_range([record(7), record(12)], 10, "orders-3")
    assert (offsets(kept), done) == ([7], True)


def test_the_partition_end_ends_the_range_only_at_or_past_its_stop() -> None:
    kept, done = _in_range([record(8), end_of_partition(9)], 10, "orders-3")
    assert (offsets(kept), done) == ([8], False)  # more records come up to offset 10
    kept, done = _in_range([record(8), end_of_partition(10)], 10, "orders-3")
    assert (offsets(kept), done) == ([8], True)
    kept, done = _in_range([end_of_partition(9), record(9)], 10, "orders-3")  # produced after the end event
    assert (offsets(kept), done) == ([9], False)


def test_a_consumer_error_in_a_batch_is_a_typed_error_naming_the_split() -> None:
    broken = Message(topic="orders", partition=3, offset=4, error=KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    with pytest.raises(RangeReadError, match="orders-3.*TOPIC_AUTHORIZATION_FAILED"):
        _in_range([record(3), broken], 10, "orders-3")


def test_a_record_batch_holds_every_column_of_the_messages() -> None:
    messages = [record(0, headers=[("trace", b"t0"), ("tenant", b"a")]), record(1),
                record(2, timestamp=(0, -1))]  # TIMESTAMP_NOT_AVAILABLE
    batch = to_record_batch(messages)
    assert batch.schema == ARROW_SCHEMA
    rows = batch.to_pylist()
    assert [r["offset"] for r in rows] == [0, 1, 2]
    assert [r["key"] for r in rows] == [b"k0", b"k1", b"k2"] and rows[1]["value"] == b"v1"
    assert {r["topic"] for r in rows} == {"orders"} and {r["partition"] for r in rows} == {3}
    assert rows[0]["timestamp"] == datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.UTC)
    assert rows[1]["timestamp"] - rows[0]["timestamp"] == datetime.timedelta(milliseconds=1)
    assert rows[2]["timestamp"] is None
    assert [r["timestamp_type"] for r in rows] == [1, 1, 0]
    assert rows[0]["headers"] == [{"key": "trace", "value": b"t0"}, {"key": "tenant", "value": b"a"}]
    assert rows[1]["headers"] == [] and rows[2]["headers"] == []


def test_no_messages_make_an_empty_batch_of_the_schema() -> None:
    batch = to_record_batch([])
    assert batch.num_rows == 0 and batch.schema == ARROW_SCHEMA

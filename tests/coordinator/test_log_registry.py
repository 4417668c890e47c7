"""The coordinator log is generic over its record kinds: connectors register their own kinds and
folds, the core names none of them, and a kind nobody registered is skipped, not guessed."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, ClassVar

import pytest

from chandy.connectors.kafka.source.log_records import (
    OffsetCommitRecord,
    SplitAssignment,
    SplitAssignmentRecord,
    TopicPartitionOffset,
)
from chandy.coordinator.kafka.log import LoadStats, decode_message, encode_record
from chandy.coordinator.kafka.replay import replay as replay_timeline
from chandy.coordinator.records import (
    CheckpointIdCounterRecord,
    LogKey,
    LogRecordBase,
    LogRecordError,
    Tombstone,
    known_kinds,
    record_kind,
    record_type_for,
    register_record_kind,
)
from chandy.coordinator.state import CoordinatorState, apply, replay
from chandy.schemas.codec import SingleObjectCodec

JOB = "job-1"


@dataclasses.dataclass
class _Message:
    """The fields of a consumed Kafka message that the decoder reads (a plain value, no client)."""

    key_: bytes
    value_: bytes | None
    offset_: int = 7

    def key(self) -> bytes:
        return self.key_

    def value(self) -> bytes | None:
        return self.value_

    def topic(self) -> str:
        return "chandy.coordinator-log"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self.offset_

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_700_000_000_000)


def _splits(operator: str, checkpoint_id: int) -> SplitAssignmentRecord:
    return SplitAssignmentRecord(JOB, operator, checkpoint_id, (SplitAssignment("orders-0", "orders", 0, 1, 5, None),), 1)


def test_the_core_knows_its_own_kinds_and_the_source_registers_its_own() -> None:
    assert {"epoch", "checkpoint", "counter", "job"} <= known_kinds()
    assert {"splits", "offsets"} <= known_kinds()
    assert record_kind("checkpoint") is not None and not record_kind("checkpoint").is_extension
    splits = record_kind("splits")
    assert splits is not None and splits.is_extension and splits.record_type is SplitAssignmentRecord
    assert record_type_for("chandy.v1.OffsetCommitRecord") is OffsetCommitRecord


def test_a_connector_kind_folds_latest_per_entity_and_a_tombstone_deletes_it() -> None:
    offsets = OffsetCommitRecord(JOB, "group-a", 3, (TopicPartitionOffset("orders", 0, 42),), 1)
    log = [_splits("src", 1), _splits("src", 2), _splits("other", 2), offsets,
           Tombstone(LogKey(JOB, "splits", "other"))]
    state = replay(JOB, log)
    assert state.records_of("splits") == {"src": _splits("src", 2)}
    assert state.records_of("offsets") == {"group-a": offsets}
    assert state.records_of("never-registered") == {}
    # a record of another job leaves the state alone
    apply(state, SplitAssignmentRecord("job-2", "src", 9, (), 1))
    assert state.records_of("splits")["src"].checkpoint_id == 2


def test_a_registered_fold_decides_what_the_state_keeps() -> None:
    @dataclasses.dataclass(frozen=True)
    class Watermark(LogRecordBase):
        SCHEMA: ClassVar[str] = "test.v1.Watermark"
        KIND: ClassVar[str] = "test-watermark"

        job_id: str
        source: str
        watermark: int

        @property
        def entity_id(self) -> str:
            return self.source

    def keep_highest(entities: dict[str, Any], record: Any) -> None:
        previous = entities.get(record.entity_id)
        if previous is None or record.watermark > previous.watermark:
            entities[record.entity_id] = record

    register_record_kind(Watermark, fold=keep_highest, describe=lambda r: {"event": "watermark", "value": r.watermark})
    assert register_record_kind(Watermark, fold=keep_highest) is Watermark  # again: a no-op
    state = replay(JOB, [Watermark(JOB, "a", 10), Watermark(JOB, "a", 5)])
    assert state.records_of("test-watermark")["a"].watermark == 10


def test_a_kind_or_schema_registered_twice_by_different_classes_is_refused() -> None:
    @dataclasses.dataclass(frozen=True)
    class Impostor(LogRecordBase):
        SCHEMA: ClassVar[str] = "test.v1.Impostor"
        KIND: ClassVar[str] = "splits"
        job_id: str

        @property
        def entity_id(self) -> str:
            return "x"

    with pytest.raises(LogRecordError, match="'splits' is already registered by SplitAssignmentRecord"):
        register_record_kind(Impostor)

    @dataclasses.dataclass(frozen=True)
    class SameSchema(LogRecordBase):
        SCHEMA: ClassVar[str] = "chandy.v1.OffsetCommitRecord"
        KIND: ClassVar[str] = "test-same-schema"
        job_id: str

        @property
        def entity_id(self) -> str:
            return "x"

    with pytest.raises(LogRecordError, match="chandy.v1.OffsetCommitRecord is already registered"):
        register_record_kind(SameSchema)
    assert "test-same-schema" not in known_kinds()


def test_the_source_records_decode_from_the_wire_and_show_in_the_timeline() -> None:
    codec = SingleObjectCodec()
    record = _splits("src", 4)
    key, value = encode_record(codec, record)
    stats = LoadStats()
    logged = decode_message(codec, _Message(key, value), JOB, stats, strict=True)
    assert logged is not None and logged.record == record
    result = replay_timeline([logged], job_id=JOB)
    (entry,) = result.timeline
    assert entry["event"] == "splits_assigned" and entry["operator_id"] == "src"
    assert entry["splits"] == [{"split": "orders-0", "subtask": 1, "offset": 5}]
    assert result.states[JOB].records_of("splits") == {"src": record}


def test_a_record_of_an_unregistered_kind_is_skipped_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    codec = SingleObjectCodec()
    counter_key, counter_value = encode_record(codec, CheckpointIdCounterRecord(JOB, 5))
    unknown_key = codec.encode("chandy.v1.CoordinatorLogKey", {"job_id": JOB, "kind": "from-the-future", "entity_id": "e"})
    stats = LoadStats()
    with caplog.at_level(logging.WARNING):
        assert decode_message(codec, _Message(unknown_key, counter_value), JOB, stats, strict=True) is None
    assert stats.skipped_unknown == 1 and "from-the-future" in caplog.text
    state = CoordinatorState(JOB)
    logged = decode_message(codec, _Message(counter_key, counter_value), JOB, stats, strict=True)
    assert logged is not None
    apply(state, logged.record)
    assert state.next_checkpoint_id == 5 and state.extensions == {}

"""The Avro wire contract, without a broker: every schema round-trips, evolution works both ways,
and bytes that are not a Chandy message raise typed errors that say where they came from."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chandy.schemas import SCHEMA_DIR
from chandy.schemas.codec import (
    BadMagicError,
    ConfluentCodec,
    EncodeError,
    MessageLocation,
    Schema,
    SchemaNotFoundError,
    SchemaRepository,
    SingleObjectCodec,
    TruncatedMessageError,
    UnknownSchemaError,
    WireFormatError,
    codec_for,
    fingerprint,
    load_history,
    load_schemas,
)
from tests.fixtures.avro_values import example_value, values

SCHEMAS = load_schemas()
WHERE = MessageLocation("chandy.acks", 3, 1234)

#: Every message and log record of the wire contract (docs/design.md, "Wire format").
REQUIRED = {
    "TriggerCheckpoint", "AcknowledgeCheckpoint", "DeclineCheckpoint", "NotifyCheckpointComplete",
    "NotifyCheckpointAborted", "OperatorEvent", "SubtaskAttemptReady", "SubtaskAttemptFailed",
    "CoordinatorLogKey", "CoordinatorEpochRecord", "CheckpointRecord", "CheckpointIdCounterRecord",
    "JobStatusRecord", "SplitAssignmentRecord", "OffsetCommitRecord", "CheckpointEvent",
    "ControlRequest", "RequestRecord",
}


def test_every_designed_message_has_a_schema_in_the_chandy_v1_namespace() -> None:
    names = {name.removeprefix("chandy.v1.") for name in SCHEMAS}
    assert REQUIRED <= names
    assert all(name.startswith("chandy.v1.") for name in SCHEMAS)


def test_decline_reasons_are_flinks_checkpoint_failure_reason_names() -> None:
    enum = json.loads((SCHEMA_DIR / "chandy.v1.CheckpointFailureReason.avsc").read_text())
    for flink_name in ("CHECKPOINT_DECLINED", "CHECKPOINT_EXPIRED", "CHECKPOINT_SUBSUMED", "TASK_FAILURE",
                       "TOO_MANY_CHECKPOINT_REQUESTS", "MINIMUM_TIME_BETWEEN_CHECKPOINTS",
                       "CHECKPOINT_COORDINATOR_SHUTDOWN", "FINALIZE_CHECKPOINT_FAILURE"):
        assert flink_name in enum["symbols"]


def test_fingerprint_is_crc64_avro_little_endian() -> None:
    # Avro specification test vector: parsingFingerprint64("null") == 0x63dd24e7cc258f8a
    assert fingerprint("null") == (0x63DD24E7CC258F8A).to_bytes(8, "little")


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_single_object_frame_is_magic_fingerprint_then_avro(name: str) -> None:
    codec = SingleObjectCodec()
    value = example_value(SCHEMAS[name].definition)
    data = codec.encode(name, value)
    assert data[:2] == b"\xc3\x01"
    assert data[2:10] == SCHEMAS[name].fingerprint
    decoded = codec.decode(data, WHERE)
    assert (decoded.name, decoded.value) == (name, value)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), name=st.sampled_from(sorted(SCHEMAS)))
def test_any_valid_value_round_trips(data: st.DataObject, name: str) -> None:
    codec = SingleObjectCodec()
    value = data.draw(values(SCHEMAS[name].definition))
    assert codec.decode(codec.encode(name, value)).value == value


def _evolved(schema: Schema) -> Schema:
    """``schema`` plus a field with a default: what a newer Chandy version would write."""
    definition = copy.deepcopy(dict(schema.definition))
    definition["fields"] = [*definition["fields"], {"name": "added_in_v2", "type": "string", "default": "v1-default"}]
    return Schema.from_definition(definition)


def test_newer_writer_is_read_by_an_older_reader() -> None:
    old = SCHEMAS["chandy.v1.AcknowledgeCheckpoint"]
    new = _evolved(old)
    writer = SingleObjectCodec(SchemaRepository([new]))
    reader = SingleObjectCodec(SchemaRepository([old]))
    # the old reader must also know the new writer's fingerprint; it still reads with its own version
    reader.repository.register(new)
    value = example_value(old.definition)
    decoded = reader.decode(writer.encode(old.name, {**value, "added_in_v2": "only v2 knows"}), WHERE)
    assert decoded.value == value
    assert decoded.writer.fingerprint == new.fingerprint


def test_older_writer_is_read_by_a_newer_reader_with_defaults() -> None:
    old = SCHEMAS["chandy.v1.AcknowledgeCheckpoint"]
    new = _evolved(old)
    writer = SingleObjectCodec(SchemaRepository([old]))
    reader = SingleObjectCodec(SchemaRepository([old]))
    reader.repository.register(new, current=True)
    value = example_value(old.definition)
    decoded = reader.decode(writer.encode(old.name, value), WHERE)
    assert decoded.value == {**value, "added_in_v2": "v1-default"}


def test_unknown_enum_symbol_reads_as_the_enum_default() -> None:
    old = SCHEMAS["chandy.v1.DeclineCheckpoint"]
    definition = copy.deepcopy(dict(old.definition))
    reason = next(f for f in definition["fields"] if f["name"] == "reason")
    reason["type"]["symbols"].append("SOME_FUTURE_REASON")
    new = Schema.from_definition(definition)
    reader = SingleObjectCodec(SchemaRepository([old]))
    reader.repository.register(new)
    value = {**example_value(old.definition), "reason": "SOME_FUTURE_REASON"}
    decoded = reader.decode(SingleObjectCodec(SchemaRepository([new])).encode(old.name, value))
    assert decoded.value["reason"] == "TASK_CHECKPOINT_FAILURE"


HISTORY = load_history()


def test_the_shipped_history_holds_every_earlier_version_of_a_changed_schema() -> None:
    # CheckpointEvent changed three times (control requests, lake commits, the completeness
    # watermark), JobStatusRecord once
    names = sorted(s.name for s in HISTORY)
    assert names.count("chandy.v1.CheckpointEvent") >= 3 and "chandy.v1.JobStatusRecord" in names
    current = {s.fingerprint for s in SCHEMAS.values()}
    assert not current & {s.fingerprint for s in HISTORY}, "a current version is not history"


@pytest.mark.parametrize("old", HISTORY, ids=lambda s: f"{s.name}-{s.fingerprint.hex()}")
def test_records_of_every_earlier_version_decode_with_the_default_repository(old: Schema) -> None:
    # what an earlier Chandy left on a topic: written with its version, read by this one
    value = example_value(old.definition)
    data = SingleObjectCodec(SchemaRepository([old])).encode(old.name, value)
    decoded = SingleObjectCodec().decode(data, WHERE)
    assert decoded.writer.fingerprint == old.fingerprint
    current = SCHEMAS[old.name]
    for field in current.definition["fields"]:
        expected = value[field["name"]] if field["name"] in value else field["default"]
        assert decoded.value[field["name"]] == expected, field["name"]


@pytest.mark.parametrize("old", [s for s in HISTORY if s.name == "chandy.v1.CheckpointEvent"],
                         ids=lambda s: s.fingerprint.hex())
def test_an_earlier_reader_reads_a_lake_commit_event_as_unknown_and_keeps_the_fields_it_knows(old: Schema) -> None:
    """A reader from before lake commits reads LAKE_COMMITTED as UNKNOWN; one from before the
    completeness watermark (issue 47) reads the event without valid_through_ms and event_times;
    one from before idle partitions (issue 54) without idle_partitions; one from before multi-table
    commits (issue 56) without committed_with."""
    from chandy.coordinator.messages import CheckpointEvent, IdlePartition, OffsetRange, PartitionEventTime

    event = CheckpointEvent("job", 7, "LAKE_COMMITTED", "CHECKPOINT", 2, 1000, 900, table_uri="delta:/t",
                            table_format="delta", table_version=12, previous_table_version=11, records_added=5,
                            files_added=1, offset_ranges=(OffsetRange("t", 0, 10, 15),), job_name="orders",
                            valid_through_ms=1_790_000_000_000,
                            event_times=(PartitionEventTime("t", 0, 1_790_000_000_000),
                                         PartitionEventTime("t", 1, 1_790_000_500_000)),
                            idle_partitions=(IdlePartition("t", 2),),
                            committed_with=("iceberg://rest/lake.lines", "iceberg://rest/lake.orders"))
    data = SingleObjectCodec().encode(event.SCHEMA, event.to_avro())
    reader = SingleObjectCodec(SchemaRepository([old]))
    reader.repository.register(SCHEMAS[old.name])  # the old reader is given the new writer schema
    decoded = reader.decode(data, WHERE).value
    knows_lake_commits = any(f["name"] == "table_version" for f in old.definition["fields"])
    assert decoded["event_type"] == ("LAKE_COMMITTED" if knows_lake_commits else "UNKNOWN")
    assert (decoded["job_id"], decoded["checkpoint_id"], decoded["epoch"]) == ("job", 7, 2)
    assert ("table_version" in decoded) is knows_lake_commits
    knows_watermark = any(f["name"] == "valid_through_ms" for f in old.definition["fields"])
    assert ("valid_through_ms" in decoded) is knows_watermark and ("event_times" in decoded) is knows_watermark
    if knows_watermark:
        assert decoded["valid_through_ms"] == 1_790_000_000_000
    knows_idle = any(f["name"] == "idle_partitions" for f in old.definition["fields"])
    assert ("idle_partitions" in decoded) is knows_idle
    assert "committed_with" not in decoded
    assert CheckpointEvent.from_avro(SingleObjectCodec().decode(data, WHERE).value) == event


def test_a_history_file_named_for_another_fingerprint_is_refused(tmp_path) -> None:
    (tmp_path / "history").mkdir()
    old = HISTORY[0]
    (tmp_path / "history" / f"{old.name}.0000000000000000.avsc").write_text(old.json)
    with pytest.raises(SchemaNotFoundError, match=f"must be {old.name}.{old.fingerprint.hex()}.avsc"):
        load_history(tmp_path)


def _valid() -> bytes:
    name = "chandy.v1.TriggerCheckpoint"
    return SingleObjectCodec().encode(name, example_value(SCHEMAS[name].definition))


@pytest.mark.parametrize(
    ("data", "error", "says"),
    [
        (b"", TruncatedMessageError, "shorter than the magic"),
        (b"\xc3\x01\x00\x01", TruncatedMessageError, "ends inside its 10-byte single-object header"),
        (_valid()[:-3], TruncatedMessageError, "ends early"),
        (b"\x00\x01" + _valid()[2:], BadMagicError, "found 00 01"),
        (b"{\"json\": true}", BadMagicError, "expected the single-object magic"),
        (b"\xc3\x01" + b"\xde\xad\xbe\xef" * 2 + _valid()[10:], UnknownSchemaError, "deadbeefdeadbeef"),
        (_valid() + b"\x00", WireFormatError, "trailing bytes"),
    ],
    ids=["empty", "short-header", "truncated-body", "wrong-magic", "json", "unknown-fingerprint", "trailing"],
)
def test_bad_bytes_raise_typed_errors_naming_topic_partition_offset(data: bytes, error: type, says: str) -> None:
    with pytest.raises(error) as raised:
        SingleObjectCodec().decode(data, WHERE)
    message = str(raised.value)
    assert says in message
    assert "chandy.acks [partition 3] @ offset 1234" in message
    assert raised.value.location == WHERE


def test_encoding_an_unknown_schema_or_a_bad_value_is_a_typed_error() -> None:
    with pytest.raises(SchemaNotFoundError, match="NoSuchMessage"):
        SingleObjectCodec().encode("NoSuchMessage", {})
    with pytest.raises(EncodeError, match="TriggerCheckpoint"):
        SingleObjectCodec().encode("TriggerCheckpoint", {"job_id": "j"})


def test_confluent_framing_through_the_schema_registry_serializer() -> None:
    # confluent-kafka's in-process registry (mock:// URL): no Schema Registry server runs here
    codec = codec_for({"url": "mock://chandy-test"})
    assert isinstance(codec, ConfluentCodec)
    for name in ("chandy.v1.TriggerCheckpoint", "chandy.v1.AcknowledgeCheckpoint", "chandy.v1.CheckpointEvent"):
        value = example_value(SCHEMAS[name].definition)
        data = codec.encode(name, value, topic="chandy.control")
        assert data[0] == 0
        decoded = codec.decode(data, WHERE)
        assert (decoded.name, decoded.value) == (name, value)
    with pytest.raises(BadMagicError, match="Confluent magic"):
        codec.decode(b"\x07" + data[1:], WHERE)
    with pytest.raises(TruncatedMessageError, match="5-byte Confluent header"):
        codec.decode(data[:3], WHERE)
    with pytest.raises(UnknownSchemaError, match="schema id 999999"):
        codec.decode(b"\x00" + (999999).to_bytes(4, "big") + data[5:], WHERE)


def test_without_a_registry_the_codec_is_single_object() -> None:
    assert isinstance(codec_for(None), SingleObjectCodec)
    assert isinstance(codec_for({}), SingleObjectCodec)


def test_a_writer_version_the_reader_cannot_resolve_is_a_wire_format_error() -> None:
    current = SCHEMAS["chandy.v1.AcknowledgeCheckpoint"]
    definition = copy.deepcopy(dict(current.definition))
    definition["fields"] = [f for f in definition["fields"] if f["name"] != "metrics"]  # the reader has no default
    older = Schema.from_definition(definition)
    reader = SingleObjectCodec(SchemaRepository([current]))
    reader.repository.register(older)
    value = {k: v for k, v in example_value(current.definition).items() if k != "metrics"}
    data = SingleObjectCodec(SchemaRepository([older])).encode(current.name, value)
    with pytest.raises(WireFormatError, match="does not decode") as raised:
        reader.decode(data, WHERE)
    assert raised.value.location == WHERE

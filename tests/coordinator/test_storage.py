"""Checkpoint storage: Flink's directory layout on fsspec, pointer resolution, path references,
and a _metadata format that is written once and fails loudly when truncated or foreign."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from chandy.coordinator.failure import CheckpointFailureReason
from chandy.coordinator.messages import StateHandle
from chandy.coordinator.options import CheckpointingOptions, InvalidOptionsError
from chandy.coordinator.storage import (
    CheckpointMetadata,
    CheckpointPointerError,
    CheckpointStorage,
    CheckpointStorageError,
    MasterState,
    MetadataFormatError,
    OperatorState,
    PathReferenceError,
    SubtaskState,
    decode_path_from_reference,
    deserialize_metadata,
    encode_path_as_reference,
    serialize_metadata,
)
from chandy.schemas import SCHEMA_DIR

JOB = "a1b2c3d4e5f60718293a4b5c6d7e8f90"


def metadata(checkpoint_id: int = 7) -> CheckpointMetadata:
    handle = StateHandle("file", "file:///lake/part-0.parquet", None, 1234, {"records": "10"})
    return CheckpointMetadata(
        job_id=JOB, checkpoint_id=checkpoint_id, checkpoint_type="CHECKPOINT", trigger_timestamp=1, completion_timestamp=2,
        master_states=(MasterState("hook", 3, b"\x01\x02"),),
        operator_states=(OperatorState("src", b"enumerator", (SubtaskState(0, 1, (handle,)),)),),
    )


@pytest.mark.parametrize("scheme", ["file", "memory"])
def test_layout_is_flinks(tmp_path: Path, scheme: str) -> None:
    base = f"file://{tmp_path}/chk" if scheme == "file" else f"memory://chk-{tmp_path.name}"
    storage = CheckpointStorage(base, JOB, savepoint_dir=base.replace("chk", "sp"))
    storage.initialize_base_locations()
    location = storage.initialize_location_for_checkpoint(17)
    assert location.directory.endswith(f"/{JOB}/chk-17")
    assert location.metadata_file == location.directory + "/_metadata"
    assert storage.fs.isdir(storage.fs._strip_protocol(storage.shared_dir))
    assert storage.shared_dir.endswith(f"{JOB}/shared") and storage.task_owned_dir.endswith(f"{JOB}/taskowned")
    savepoint = storage.initialize_location_for_savepoint(18)
    assert re.fullmatch(rf"savepoint-{JOB[:6]}-[0-9a-f]{{12}}", savepoint.directory.rsplit("/", 1)[1])
    storage.write_metadata(location, metadata(17))
    for pointer in (location.directory, location.metadata_file, location.directory + "/"):
        directory, read = storage.resolve_checkpoint(pointer)
        assert read == metadata(17) and directory == location.directory


def test_metadata_is_written_once(tmp_path: Path) -> None:
    storage = CheckpointStorage(f"file://{tmp_path}", JOB)
    location = storage.initialize_location_for_checkpoint(1)
    storage.write_metadata(location, metadata(1))
    with pytest.raises(CheckpointStorageError, match="written once"):
        storage.write_metadata(location, metadata(1))
    assert [p.name for p in (tmp_path / JOB / "chk-1").iterdir()] == ["_metadata"]  # no temporary file left


def test_a_disposal_keeps_a_checkpoint_another_coordinator_log_wrote(tmp_path: Path) -> None:
    """Two coordinator logs of one job share ``chk-N``: a disposal by one log keeps a directory
    whose ``_metadata`` names the other (the ``coordinator-log`` property survives the file's
    round trip), and deletes its own, one without ``_metadata`` and one whose ``_metadata`` names
    no log."""
    import dataclasses

    storage = CheckpointStorage(f"file://{tmp_path}", JOB)
    theirs, ours, empty, unnamed = (storage.initialize_location_for_checkpoint(n) for n in (1, 2, 3, 4))
    for location, log in ((theirs, "b-coordinator@X"), (ours, "a-coordinator@Y")):
        written = dataclasses.replace(metadata(location.checkpoint_id), properties={CheckpointMetadata.COORDINATOR_LOG: log})
        storage.write_metadata(location, written)
        assert storage.resolve_checkpoint(location.directory)[1].coordinator_log == log
    storage.write_metadata(unnamed, metadata(4))
    assert storage.dispose_location(theirs.directory, owner="a-coordinator@Y") is False
    assert (tmp_path / JOB / "chk-1" / "_metadata").exists()
    for location in (ours, empty, unnamed):
        assert storage.dispose_location(location.directory, owner="a-coordinator@Y") is True
    assert sorted(p.name for p in (tmp_path / JOB).iterdir() if p.name.startswith("chk-")) == ["chk-1"]
    assert storage.dispose_location(theirs.directory) is True  # without an owner: as before


def test_savepoint_without_a_target_or_default_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointStorageError, match="state.savepoints.dir"):
        CheckpointStorage(f"file://{tmp_path}", JOB).initialize_location_for_savepoint(1)


@pytest.mark.parametrize(
    ("mangle", "says"),
    [
        (lambda b: b[:10], "truncated _metadata"),
        (lambda b: b[:-3], "truncated _metadata"),
        (lambda b: b"PK\x03\x04" + b[4:], "not a Chandy _metadata file"),
        (lambda b: b[:4] + (9).to_bytes(4, "big") + b[8:], "format version 9 is not supported"),
        (lambda b: b[:30] + bytes([b[30] ^ 0xFF]) + b[31:], "checksum mismatch"),
        (lambda b: b + b"\x00", "unexpected bytes"),
    ],
    ids=["header-cut", "body-cut", "foreign", "version", "corrupt", "trailing"],
)
def test_bad_metadata_files_raise_typed_errors_naming_the_file(tmp_path: Path, mangle, says: str) -> None:
    data = serialize_metadata(metadata())
    assert deserialize_metadata(data) == metadata()
    bad = tmp_path / "chk-7" / "_metadata"
    bad.parent.mkdir()
    bad.write_bytes(mangle(data))
    storage = CheckpointStorage(f"file://{tmp_path}", JOB)
    with pytest.raises(MetadataFormatError, match=says) as raised:
        storage.resolve_checkpoint(f"file://{bad.parent}")
    assert str(bad) in str(raised.value)


def test_bad_pointers_are_typed_errors(tmp_path: Path) -> None:
    storage = CheckpointStorage(f"file://{tmp_path}", JOB)
    (tmp_path / "empty-dir").mkdir()
    (tmp_path / "some-file").write_text("x")
    for pointer, says in ((f"file://{tmp_path}/nope", "does not exist"),
                          (f"file://{tmp_path}/empty-dir", "without _metadata"),
                          (f"file://{tmp_path}/some-file", "not a _metadata file"),
                          ("  ", "empty checkpoint pointer")):
        with pytest.raises(CheckpointPointerError, match=says):
            storage.resolve_checkpoint(pointer)


def test_path_references_carry_flinks_magic_number() -> None:
    reference = encode_path_as_reference("s3://bucket/chk/job/chk-3")
    assert reference[:4] == bytes([0x05, 0x5F, 0x3F, 0x18])
    assert decode_path_from_reference(reference) == "s3://bucket/chk/job/chk-3"
    for bad in (b"s3://bucket", b"\x05\x5f\x3f\x18", b"\x05\x5f\x3f\x18\xff\xfe"):
        with pytest.raises(PathReferenceError):
            decode_path_from_reference(bad)


def test_failure_reasons_match_the_avro_enum() -> None:
    enum = json.loads((SCHEMA_DIR / "chandy.v1.CheckpointFailureReason.avsc").read_text())
    assert [r.value for r in CheckpointFailureReason] == enum["symbols"]


def test_options_take_flinks_names_and_reject_bad_values() -> None:
    options = CheckpointingOptions.from_flink({
        "execution.checkpointing.interval": "5000", "execution.checkpointing.max-concurrent-checkpoints": 2,
        "state.checkpoints.num-retained": 3, "state.checkpoints.dir": "s3://b/chk",
    })
    assert (options.interval_ms, options.max_concurrent, options.num_retained, options.checkpoint_dir) == (
        5000, 2, 3, "s3://b/chk")
    with pytest.raises(InvalidOptionsError, match="unknown checkpointing option 'execution.checkpointing.intervall'"):
        CheckpointingOptions.from_flink({"execution.checkpointing.intervall": 1})
    with pytest.raises(InvalidOptionsError, match="must be an integer"):
        CheckpointingOptions.from_flink({"execution.checkpointing.timeout": "ten minutes"})
    with pytest.raises(InvalidOptionsError, match="max-concurrent-checkpoints must be >= 1"):
        CheckpointingOptions(max_concurrent=0)

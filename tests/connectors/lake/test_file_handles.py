"""The state handles of a checkpoint's data files (issue 44, item 8): each distinct Arrow schema
travels once per acknowledgement (a ``lake-schema`` handle keyed by its hash) instead of once per
file, and the inline form that earlier versions wrote into ``_metadata`` still decodes."""

from __future__ import annotations

import base64
import json

import pyarrow as pa
import pytest

from chandy.connectors.lake.sink import (
    FILE_KIND,
    SCHEMA_HASH,
    SCHEMA_KIND,
    DataFile,
    LakeCommitError,
    data_files_from_handles,
    data_files_to_handles,
    schema_hash,
    schema_to_b64,
)
from chandy.coordinator.messages import AcknowledgeCheckpoint, StateHandle
from chandy.coordinator.storage import (
    CheckpointMetadata,
    OperatorState,
    SubtaskState,
    deserialize_metadata,
    serialize_metadata,
)
from chandy.formats.records import ARROW_SCHEMA
from chandy.schemas.codec import SingleObjectCodec

WIDE = schema_to_b64(pa.schema(list(ARROW_SCHEMA) + [(f"field_{i}", pa.string()) for i in range(16)]
                               + [("day", pa.string())]))
NARROW = schema_to_b64(pa.schema([("offset", pa.int64()), ("day", pa.string())]))


def files(n: int, schema: str = WIDE, **extra) -> list[DataFile]:
    return [DataFile(f"day=2024-01-{1 + i % 28:02d}/part-chandy-3f2a9c1e-0000000007-00003-a0-{i:012x}.parquet",
                     4_000_000 + i, 20_000 + i, {"day": f"2024-01-{1 + i % 28:02d}"}, 1_700_000_000_000 + i, schema,
                     **extra) for i in range(n)]


def ack_bytes(handles: list[StateHandle]) -> int:
    message = AcknowledgeCheckpoint("3f2a9c1e5b7d4a60a1b2c3d4e5f60718", 1, 7, "lake-sink", 3, 0, tuple(handles))
    return len(SingleObjectCodec().encode(message.SCHEMA, message.to_avro()))


def test_each_schema_travels_once_and_every_file_comes_back() -> None:
    written = (files(3) + files(2, NARROW, table_uri="file:///lake/other")
               + files(1, NARROW, id_columns=("id", "region")))
    handles = data_files_to_handles(written)
    schemas = [h for h in handles if h.kind == SCHEMA_KIND]
    assert [base64.b64encode(h.inline_data or b"").decode() for h in schemas] == [WIDE, NARROW]
    assert all(h.state_size == 0 and h.properties[SCHEMA_HASH] == schema_hash(h.inline_data or b"") for h in schemas)
    file_handles = [h for h in handles if h.kind == FILE_KIND]
    assert len(file_handles) == 6 and all("schema" not in h.properties for h in file_handles)
    assert sum(h.state_size for h in handles) == sum(f.size for f in written)  # a checkpoint's size: its files
    assert data_files_from_handles(handles) == written


def test_the_inline_form_of_earlier_versions_still_decodes() -> None:
    # a handle exactly as Chandy wrote it before schemas were carried once per ack
    old = StateHandle(FILE_KIND, "day=2024-01-02/part-chandy-3f2a9c1e-0000000007-00003-a0-0123456789ab.parquet",
                      None, 1234, {"records": "10", "partition_values": json.dumps({"day": "2024-01-02"}),
                                   "modification_time": "1700000000000", "schema": WIDE})
    (decoded,) = data_files_from_handles([old])
    assert decoded == DataFile(old.path or "", 1234, 10, {"day": "2024-01-02"}, 1700000000000, WIDE)
    assert DataFile.from_state_handle(old) == decoded
    assert data_files_from_handles([f.to_state_handle() for f in files(3)]) == files(3)


def test_a_metadata_file_mixing_old_and_new_subtasks_decodes() -> None:
    """_metadata written by earlier versions holds inline handles; a checkpoint taken while workers
    are upgraded holds both forms, one per subtask."""
    old, new = files(2), files(3, NARROW)
    metadata = CheckpointMetadata(
        job_id="j", checkpoint_id=7, checkpoint_type="CHECKPOINT", trigger_timestamp=1, completion_timestamp=2,
        operator_states=(OperatorState("lake-sink", None, (
            SubtaskState(0, 0, tuple(f.to_state_handle() for f in old)),
            SubtaskState(1, 0, tuple(data_files_to_handles(new))))),))
    operator = deserialize_metadata(serialize_metadata(metadata)).operator("lake-sink")
    assert operator is not None
    assert data_files_from_handles(h for s in operator.subtask_states for h in s.state_handles) == old + new


def test_a_file_naming_a_schema_no_handle_carries_is_refused() -> None:
    handles = data_files_to_handles(files(2))
    with pytest.raises(LakeCommitError, match=r"data file day=2024-01-01/part-chandy-.* names schema [0-9a-f]{16}, "
                                              r"which no lake-schema handle of its checkpoint carries"):
        data_files_from_handles(h for h in handles if h.kind != SCHEMA_KIND)


def test_a_damaged_schema_handle_is_refused() -> None:
    schema, *rest = data_files_to_handles(files(2))
    damaged = StateHandle(SCHEMA_KIND, None, (schema.inline_data or b"")[:-1], 0, dict(schema.properties))
    with pytest.raises(LakeCommitError, match="lake-schema state handle is damaged"):
        data_files_from_handles([damaged, *rest])


def test_an_ack_of_10000_files_is_a_tenth_of_the_inline_form() -> None:
    many = files(10_000)
    inline, compact = ack_bytes([f.to_state_handle() for f in many]), ack_bytes(data_files_to_handles(many))
    assert inline > 20_000_000  # about 2.1 KB a file: its schema each time
    assert compact < 2_200_000 and compact * 9 < inline  # about 210 bytes a file

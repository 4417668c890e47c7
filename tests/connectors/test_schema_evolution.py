"""Schema evolution without servers: the decoder turns new JSON fields into columns (nested ones
as structs and lists), batches of different columns are joined or refused naming the field,
both types and the offsets, and both sinks add new columns in their commit (Delta: ADD COLUMN,
Iceberg: union_by_name) while refusing a changed type and landing nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from chandy.connectors.lake.sink import LakeSchemaError
from chandy.connectors.lake.tables import open_sink
from chandy.formats.decoder import BadRecordError, ValueDecoder
from chandy.formats.evolution import SchemaChangeError, concat_evolving
from chandy.formats.records import to_record_batch
from tests.fixtures.messages import FakeMessage

JOB = "00112233445566778899aabbccddeeff"


def Message(offset: int, value: dict) -> FakeMessage:
    """A consumed record whose value is ``value`` as JSON."""
    return FakeMessage(offset, json.dumps(value).encode())


def decoder(unknown_fields: str) -> ValueDecoder:
    return ValueDecoder("json", pa.schema([("id", pa.int64())]), ("id",), ("topic", "partition", "offset"),
                        unknown_fields=unknown_fields)


def test_new_fields_become_columns_with_nested_types() -> None:
    batch = to_record_batch([Message(0, {"id": 1}), Message(1, {"id": 2, "tags": ["a"], "d": {"x": 1.5}, "n": None})])
    decoded, bad, _ = decoder("add").decode(batch)
    assert bad is None
    assert decoded.schema.names == ["topic", "partition", "offset", "id", "tags", "d"]  # n: all null, no column
    assert decoded.schema.field("tags").type == pa.list_(pa.string())
    assert decoded.schema.field("d").type == pa.struct([("x", pa.float64())])
    assert decoded.column("d").to_pylist() == [None, {"x": 1.5}]


def test_a_new_field_of_two_types_in_one_batch_is_a_bad_record() -> None:
    batch = to_record_batch([Message(5, {"id": 1, "s": 1}), Message(6, {"id": 2, "s": "x"})])
    with pytest.raises(BadRecordError, match="topic t partition 0 offset 6: TypeMismatch: field s"):
        decoder("add").decode(batch)


def test_batches_of_different_columns_are_joined_or_refused() -> None:
    first, _, _ = decoder("add").decode(to_record_batch([Message(0, {"id": 1})]))
    second, _, _ = decoder("add").decode(to_record_batch([Message(1, {"id": 2, "s": 3})]))
    joined = concat_evolving([first, second])
    assert joined.column("s").to_pylist() == [None, 3]
    third, _, _ = decoder("add").decode(to_record_batch([Message(7, {"id": 3, "s": "x"}), Message(8, {"id": 4, "s": "y"})]))
    with pytest.raises(SchemaChangeError, match=r"field s changed type: int64 at t-0 offsets \[1, 1\] but string at "
                                                r"t-0 offsets \[7, 8\]"):
        concat_evolving([first, second, third])


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_sinks_add_columns_and_refuse_changed_types(tmp_path: Path, kind: str) -> None:
    uri = str(tmp_path / "t") if kind == "delta" else "iceberg://local/evo.t"
    sink = open_sink(uri, catalog_properties={"warehouse": str(tmp_path / "wh")}, add_columns=True)
    base = pa.table({"offset": pa.array([0, 1], pa.int64()), "id": pa.array([1, 2], pa.int64())})
    grown = pa.table({"offset": pa.array([2], pa.int64()), "id": pa.array([3], pa.int64()),
                      "d": pa.array([{"x": 1, "tags": ["a"]}])})
    assert sink.commit(JOB, 1, sink.write_files(base, job_id=JOB, checkpoint_id=1, subtask=0, attempt=0),
                       offsets={("t", 0): 2})
    assert sink.commit(JOB, 2, sink.write_files(grown, job_id=JOB, checkpoint_id=2, subtask=0, attempt=0),
                       offsets={("t", 0): 3})
    data = sink.read_table()
    assert "d" in data.schema.names
    assert sorted(data.select(["offset", "d"]).to_pylist(), key=lambda r: r["offset"])[2]["d"] == {"x": 1, "tags": ["a"]}
    changed = pa.table({"offset": pa.array([3], pa.int64()), "id": pa.array(["three"], pa.string())})
    with pytest.raises(LakeSchemaError, match="column id is string in the data but long in the table"):
        sink.commit(JOB, 3, sink.write_files(changed, job_id=JOB, checkpoint_id=3, subtask=0, attempt=0),
                    offsets={("t", 0): 4})
    assert sink.committed_checkpoint(JOB) == 2 and sink.read_table().num_rows == 3
    # without evolution a new column is refused
    strict = open_sink(uri, catalog_properties={"warehouse": str(tmp_path / "wh")})
    extra = pa.table({"offset": pa.array([4], pa.int64()), "e": pa.array([1.0])})
    with pytest.raises(LakeSchemaError, match=r"column e \(double\) is not in the table"):
        strict.commit(JOB, 4, strict.write_files(extra, job_id=JOB, checkpoint_id=4, subtask=0, attempt=0),
                      offsets={("t", 0): 5})

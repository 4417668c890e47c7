"""Issue 47 (upserts without Debezium): ``--cdc upsert`` decodes each value as the row itself,
keyed by the id columns; a tombstone deletes its key's row (plain keys of a compacted topic
included), and an operation field (Kafka Connect Iceberg sink's ``cdc-field``) may say D. No
servers: the decoder only (the merge into Delta and Iceberg is the ``--cdc debezium`` path's)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from chandy.connectors.lake.changes import OP_COLUMN
from chandy.connectors.spark.options import PipelineError, PipelineOptions
from chandy.formats.decoder import BadRecordError, ValueDecoder
from chandy.formats.records import to_record_batch
from tests.fixtures.messages import FakeMessage as Message

COLUMNS = pa.schema([("id", pa.int64()), ("name", pa.string()), ("op", pa.string())])


def _decoder(**extra) -> ValueDecoder:
    return ValueDecoder("json", COLUMNS, tuple(COLUMNS.names), ("offset",), cdc="upsert", id_columns=("id",), **extra)


def test_values_are_rows_tombstones_and_the_op_field_delete() -> None:
    batch = to_record_batch([
        Message(0, json.dumps({"id": 1, "name": "a"}).encode(), key=b"1"),
        Message(1, json.dumps({"id": 2, "name": "b", "op": "I"}).encode(), key=b'"2"'),
        Message(2, None, key=b"1"),  # a plain key: the one id column
        Message(3, json.dumps({"id": 2, "name": "b", "op": "d"}).encode(), key=b"2"),
        Message(4, None, key=json.dumps({"id": 3}).encode()),  # a JSON object key: its fields
        Message(5, json.dumps({"id": 4, "name": "c", "op": "U"}).encode(), key=b"4"),
    ])
    decoded, bad, _ = _decoder(op_field="op").decode(batch)
    assert bad is None
    assert [(r["id"], r["name"], r[OP_COLUMN]) for r in decoded.to_pylist()] == [
        (1, "a", "u"), (2, "b", "u"), (1, None, "d"), (2, "b", "d"), (3, None, "d"), (4, "c", "u")]
    # without an operation field the field is a column like any other and every value upserts
    decoded, _, _ = _decoder().decode(batch)
    assert decoded.column(OP_COLUMN).to_pylist() == ["u", "u", "d", "u", "d", "u"]


def test_what_cannot_be_an_upsert_is_a_bad_record_naming_why() -> None:
    batch = to_record_batch([Message(0, json.dumps({"id": 1, "op": "X"}).encode(), key=b"1"),
                             Message(1, json.dumps({"name": "no id"}).encode(), key=b"9")])
    _, bad, _ = _decoder(op_field="op", errors_tolerance="all").decode(batch)
    assert bad is not None and bad.column("error_class").to_pylist() == ["ChangeEventError"] * 2
    messages = bad.column("error_message").to_pylist()
    assert "field op is 'X': --cdc-op-field takes I, U, C, R (upsert) or D (delete)" in messages[0]
    assert "no value for key column(s) ['id']" in messages[1]
    with pytest.raises(BadRecordError, match="offset 0: ChangeEventError"):
        _decoder(op_field="op").decode(batch)


def test_the_options_of_upserts() -> None:
    base = dict(table_uri="t", bootstrap_servers="k:1", topics=("a",))
    options = PipelineOptions(**base, value_format="json", cdc="upsert", id_columns=("id",), cdc_op_field="op")
    assert options.id_columns == ("id",) and options.cdc_op_field == "op"
    with pytest.raises(PipelineError, match="--cdc-op-field names the operation field of --cdc upsert"):
        PipelineOptions(**base, value_format="json", cdc="debezium", cdc_op_field="op")
    with pytest.raises(PipelineError, match="--cdc upsert needs --value-format"):
        PipelineOptions(**base, cdc="upsert")

"""Avro at batch speed (issue 45): the batch path (:mod:`chandy.formats.avro_batch`) reads
a batch of Avro values into exactly the columns the record-by-record path (fastavro) gives, for
every type in every context and for random schemas (Hypothesis); a batch it cannot read alike (a
bad record anywhere, a map, an unexpected framing) goes record by record, so bad records are found
and never shift the next one. Without servers."""

from __future__ import annotations

import io
import json
import re
import struct

import fastavro
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chandy.formats.avro import avro_columns
from chandy.formats.avro_batch import decode_avro_batch
from chandy.formats.decoder import ValueDecoder
from chandy.formats.records import ARROW_SCHEMA
from chandy.schemas.codec import fingerprint
from tests.fixtures import value_schemas as vs


def _batch(values: list[bytes | None]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"key": None, "value": v, "topic": "t", "partition": 0, "offset": i, "timestamp": None, "timestamp_type": 0,
          "headers": []} for i, v in enumerate(values)], schema=ARROW_SCHEMA)


def _decoder(schema: dict, **kwargs) -> ValueDecoder:
    columns, names = avro_columns(schema)
    kwargs.setdefault("avro_framing", "raw")
    return ValueDecoder("avro", columns, names, ("offset",), avro_schema=json.dumps(schema), **kwargs)


def _has_map(schema: object) -> bool:
    return "'map'" in repr(schema)


def _same_both_ways(decoder: ValueDecoder, raws: list[bytes | None], *, batch_path: bool) -> None:
    """The batch path's columns (or its fallback) give what the record-by-record path gives: the
    same rows, types, bad records and tombstones skipped."""
    batch = _batch(raws)
    assert (decode_avro_batch(batch.column("value"), decoder) is not None) is batch_path
    fast, fast_bad, fast_skipped = decoder.decode(batch)
    slow, slow_bad, slow_skipped = decoder.decode(batch, vectorized=False)
    assert fast.schema == slow.schema
    assert repr(fast.to_pylist()) == repr(slow.to_pylist())  # repr: a NaN equals a NaN
    assert (fast_bad is None) == (slow_bad is None) and fast_skipped == slow_skipped
    assert _bad_rows(fast_bad) == _bad_rows(slow_bad)


def test_every_type_in_every_context_but_maps_is_read_by_the_batch_path_as_fastavro_reads_it() -> None:
    schema, records = vs.every_type_in_every_context()
    schema = {**schema, "fields": [f for f in schema["fields"] if "map" not in f["name"]]}
    records = [{k: v for k, v in r.items() if "map" not in k} for r in records]
    raws = [vs.encode(schema, r) for r in records]
    _same_both_ways(_decoder(schema), raws, batch_path=True)
    rows = _decoder(schema).decode(_batch(raws))[0].to_pylist()
    for row, raw in zip(rows, raws, strict=True):
        assert vs.differences(row, vs.decode(schema, raw), schema) == []


def test_a_schema_with_a_map_goes_record_by_record() -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "m", "type": {"type": "map", "values": "long"}}]}
    _same_both_ways(_decoder(schema), [vs.encode(schema, {"m": {"a": 1}})], batch_path=False)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(vs.schemas_and_records(max_records=8))
def test_random_schemas_are_read_by_the_batch_path_as_record_by_record(schema_and_records) -> None:
    schema, records = schema_and_records
    raws = [vs.encode(schema, r) for r in records]
    _same_both_ways(_decoder(schema), raws, batch_path=not _has_map(schema))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(vs.schemas_and_records(max_records=6), st.data())
def test_a_damaged_record_never_shifts_the_next_one(schema_and_records, data) -> None:
    """One record truncated, extended by trailing bytes, or with a byte changed: both paths find
    the same bad records and land the same good ones (a damaged batch goes record by record, or,
    when the damage still reads as a valid record, both read the same value)."""
    schema, records = schema_and_records
    raws: list[bytes | None] = [vs.encode(schema, r) for r in records]
    victim = data.draw(st.integers(0, len(raws) - 1))
    raw = raws[victim]
    assert raw is not None
    damage = data.draw(st.sampled_from(["truncate", "trail", "flip", "empty", "tombstone"]))
    if damage == "truncate" and len(raw) > 1:
        raws[victim] = raw[:data.draw(st.integers(1, len(raw) - 1))]
    elif damage == "trail":
        raws[victim] = raw + data.draw(st.binary(min_size=1, max_size=3))
    elif damage == "flip":
        at = data.draw(st.integers(0, len(raw) - 1))
        raws[victim] = raw[:at] + bytes([data.draw(st.integers(0, 255))]) + raw[at + 1:]
    elif damage == "empty":
        raws[victim] = b""
    elif damage == "tombstone":
        raws[victim] = None
    decoder = _decoder(schema, errors_tolerance="all", tombstones="skip")
    batch = _batch(raws)
    fast, fast_bad, fast_skipped = decoder.decode(batch)
    slow, slow_bad, slow_skipped = decoder.decode(batch, vectorized=False)
    assert repr(fast.to_pylist()) == repr(slow.to_pylist()) and fast_skipped == slow_skipped
    assert _bad_rows(fast_bad) == _bad_rows(slow_bad)


def _bad_rows(bad: pa.RecordBatch | None) -> str | None:
    """The bad records, without the addresses fastavro's messages name (``<_io.BytesIO object at 0x...>``)."""
    return None if bad is None else re.sub(r"0x[0-9a-f]+", "0x", repr(bad.to_pylist()))


SCHEMA = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "id", "type": "long"}, {"name": "qty", "type": "int"}, {"name": "note", "type": ["null", "string"]},
    {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
    {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "tags", "type": {"type": "array", "items": "string"}},
    {"name": "offset", "type": "long"}]}  # named like a Kafka column: lands as value_offset


def _orders(n: int) -> list[dict]:
    import datetime
    import decimal

    return [{"id": i, "qty": i % 7 - 3, "note": None if i % 3 else f"n{i}", "price": decimal.Decimal(i * 37 - 500) / 100,
             "at": datetime.datetime(2026, 11, 27, tzinfo=datetime.UTC) + datetime.timedelta(milliseconds=i * 1013),
             "tags": [f"t{j}" for j in range(i % 4)], "offset": -i} for i in range(n)]


def _body(schema: dict, record: dict) -> bytes:
    buffer = io.BytesIO()
    fastavro.schemaless_writer(buffer, fastavro.parse_schema(schema), record)
    return buffer.getvalue()


@pytest.mark.parametrize("framing", ["raw", "single-object", "confluent"])
def test_each_framing_is_read_by_the_batch_path_and_a_wrong_header_goes_record_by_record(framing) -> None:
    header = {"raw": b"", "single-object": b"\xc3\x01" + fingerprint(SCHEMA), "confluent": b"\x00" + struct.pack(">I", 7)}
    decoder = _decoder(SCHEMA, avro_framing=framing, avro_schema_id=7 if framing == "confluent" else None,
                       errors_tolerance="all")
    raws: list[bytes | None] = [header[framing] + _body(SCHEMA, r) for r in _orders(50)]
    _same_both_ways(decoder, raws, batch_path=True)
    assert decoder.decode(_batch(raws))[0].column("value_offset").to_pylist()[:3] == [0, -1, -2]
    if framing != "raw":
        wrong = bytearray(raws[10] or b"")
        wrong[len(header[framing]) - 1] ^= 0x01  # the fingerprint's or schema ID's last byte
        raws[10] = bytes(wrong)
        _same_both_ways(decoder, raws, batch_path=False)


def test_writer_schemas_from_the_registry_are_read_as_written_each_with_its_own() -> None:
    """``as_written``: records of two writer schemas in one batch (the later drops ``note``, the
    earlier writes ``qty`` as an int into a long column), in their order; a writer with a field the
    columns lack (evolution) goes record by record."""
    from confluent_kafka.schema_registry import Schema

    from chandy.formats.registry import registry_client

    url = {"url": "mock://chandy-avro-batch"}
    wide = {**SCHEMA, "fields": [SCHEMA["fields"][0], {"name": "qty", "type": "long"}, *SCHEMA["fields"][2:]]}
    narrow = {**SCHEMA, "fields": [f for f in wide["fields"] if f["name"] != "note"]}
    newer = {**wide, "fields": [*wide["fields"], {"name": "extra", "type": "int", "default": 0}]}
    client = registry_client(url)
    ids = [client.register_schema(f"orders-batch-{i}", Schema(json.dumps(s), "AVRO"))
           for i, s in enumerate((SCHEMA, narrow, newer))]
    columns, names = avro_columns(wide)
    decoder = ValueDecoder("avro", columns, names, ("offset",), avro_schema=json.dumps(wide), avro_framing="confluent",
                           schema_registry=tuple(sorted(url.items())), unknown_fields="add", as_written=True)
    orders = _orders(40)
    raws: list[bytes | None] = []
    for i, order in enumerate(orders):
        schema_id, schema = (ids[0], SCHEMA) if i % 2 else (ids[1], narrow)
        record = order if schema is SCHEMA else {k: v for k, v in order.items() if k != "note"}
        raws.append(b"\x00" + struct.pack(">I", schema_id) + _body(schema, record))
    _same_both_ways(decoder, raws, batch_path=True)
    decoded = decoder.decode(_batch(raws))[0]
    assert decoded.schema.field("qty").type == pa.int64()
    assert decoded.column("qty").to_pylist() == [o["qty"] for o in orders]
    assert decoded.column("note").to_pylist() == [o["note"] if i % 2 else None for i, o in enumerate(orders)]
    raws.append(b"\x00" + struct.pack(">I", ids[2]) + _body(newer, {**orders[0], "extra": 5}))
    _same_both_ways(decoder, raws, batch_path=False)
    assert decoder.decode(_batch(raws))[0].column("extra").to_pylist()[-2:] == [None, 5]

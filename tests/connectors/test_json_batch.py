"""JSON values decoded a batch at a time by Arrow's reader (issue 32) land exactly what the
record-by-record path lands: generated batches mixing good values with every kind of value the
type mapping treats specially (a fraction into an integer, a decimal with more digits than its
scale, a string into a number, a timestamp as seconds, a key given twice, a field without a
column), decoded both ways and compared field by field; a batch the fast path takes must be one
the other path finds no bad record in."""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import math

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.pandas.types import to_arrow_schema

from chandy.connectors.spark.ddl import parse_ddl
from chandy.formats.decoder import ValueDecoder
from chandy.formats.json_batch import decode_json_batch
from chandy.formats.records import ARROW_SCHEMA

DDL = ("id BIGINT, small INT, tiny TINYINT, price DECIMAL(10, 2), ratio DOUBLE, weight FLOAT, name STRING, "
       "active BOOLEAN, at TIMESTAMP, local TIMESTAMP_NTZ, day DATE, blob BINARY, "
       "address STRUCT<city: STRING, zip: INT, geo: STRUCT<lat: DOUBLE, lon: DOUBLE>>, tags ARRAY<STRING>, "
       "scores ARRAY<DECIMAL(5, 1)>")


def _decoder(**kwargs) -> ValueDecoder:
    arrow = to_arrow_schema(parse_ddl(DDL), timezone="UTC")
    return ValueDecoder("json", arrow, tuple(arrow.names), ("topic", "partition", "offset"),
                        errors_tolerance="all", **kwargs)


def _batch(values: list[bytes]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"key": None, "value": v, "topic": "t", "partition": 3, "offset": 100 + i, "timestamp": None,
          "timestamp_type": 0, "headers": []} for i, v in enumerate(values)], schema=ARROW_SCHEMA)


def _same(value):
    """A value with floats as their repr (NaN equals NaN, -0.0 differs from 0.0), at any depth."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict):
        return {k: _same(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_same(v) for v in value]
    return value


def _text(value) -> str:
    return json.dumps(value)


def _decimal_text(digits: int, scale: int, negative: bool) -> str:
    text = str(digits).rjust(scale + 1, "0")
    text = f"{text[:len(text) - scale]}.{text[len(text) - scale:]}" if scale else text
    return ("-" if negative else "") + text


decimals = st.builds(_decimal_text, st.integers(0, 10**11), st.integers(0, 4), st.booleans())
fitting_decimals = st.builds(_decimal_text, st.integers(0, 10**10 - 1), st.integers(0, 2), st.booleans())
instants = st.datetimes(datetime.datetime(1900, 1, 1), datetime.datetime(2200, 1, 1))
zoned = st.datetimes(datetime.datetime(1900, 1, 1), datetime.datetime(2200, 1, 1),
                     timezones=st.sampled_from([datetime.UTC, datetime.timezone(datetime.timedelta(hours=-7))]))
doubles = st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(_text), st.integers(-2**60, 2**60).map(str),
                    decimals)
#: per column: values the type mapping takes (most drawn), then values it treats specially
VALUES = {
    "id": (st.integers(-2**63, 2**63 - 1).map(str),
           st.sampled_from(["1.0", "1e3", '"5"', "true", "9223372036854775808", "-0"])),
    "small": (st.integers(-2**31, 2**31 - 1).map(str), st.sampled_from(["2147483648", "1.5", "null"])),
    "tiny": (st.integers(-128, 127).map(str), st.sampled_from(["128", "-129", "0.0"])),
    "price": (st.one_of(fitting_decimals, fitting_decimals.map(lambda d: f'"{d}"'), st.integers(-10**7, 10**7).map(str)),
              st.one_of(decimals, st.sampled_from(['"abc"', "1e2", '"NaN"', "100000000", '" 1.5"', "1.005"]))),
    "ratio": (doubles, st.sampled_from(['"NaN"', '"Infinity"', "1e400", "true"])),
    "weight": (doubles, st.sampled_from(["1e39", "-3.5e38", "3.4e38", "3.4028235677973366e38", '"-Infinity"'])),
    "name": (st.text().map(_text), st.sampled_from(["5", "true", '{"a": 1}', '"\\ud800"', '"\\u00e9"'])),
    "active": (st.sampled_from(["true", "false", "null"]), st.sampled_from(['"true"', "1"])),
    "at": (st.one_of(instants, zoned).map(lambda d: _text(d.isoformat())),
           st.one_of(st.integers(0, 2**33).map(str), st.just('"yesterday"'), st.just('"2024-01-01 10:00:00Z"'))),
    "local": (instants.map(lambda d: _text(d.isoformat())), zoned.map(lambda d: _text(d.isoformat()))),
    "day": (st.dates().map(lambda d: _text(d.isoformat())), st.just('"2024-02-30"')),
    "blob": (st.binary(max_size=8).map(lambda b: _text(base64.b64encode(b).decode())),
             st.sampled_from(['"not base64!"', "5"])),
    "address": (st.builds(lambda c, z, lat: f'{{"city": {_text(c)}, "zip": {z}, "geo": {{"lat": {lat}, "lon": 1.5}}}}',
                          st.text(max_size=5), st.integers(-2**31, 2**31 - 1), doubles),
                st.sampled_from(['{"city": "x", "extra": 1}', "[]", '"x"', '{"zip": 1.5}'])),
    "tags": (st.lists(st.one_of(st.none(), st.text(max_size=4))).map(_text), st.sampled_from(["[1]", '"a"'])),
    "scores": (st.lists(st.builds(_decimal_text, st.integers(0, 9999), st.integers(0, 1), st.booleans()),
                        max_size=3).map(lambda ds: "[" + ",".join(ds) + "]"),
               st.sampled_from(["[1.25]", "[100000]", '["x"]'])),
}


@st.composite
def records(draw) -> bytes:
    fields = draw(st.lists(st.sampled_from(sorted(VALUES)), unique=True))
    parts = [f'"{name}": {draw(VALUES[name][draw(st.integers(0, 15)) == 0])}' for name in fields]
    if draw(st.integers(0, 7)) == 0:
        parts.append('"unknown": [1, {"x": 2}]')
    if fields and draw(st.integers(0, 19)) == 0:
        parts.append(f'"{fields[0]}": null')  # a key given twice
    return ("{" + ", ".join(parts) + "}").encode()


def _good(i: int) -> bytes:
    return json.dumps({
        "id": i, "small": -i, "tiny": i % 100, "price": f"{i}.{i % 100:02d}", "ratio": i / 7, "weight": 0.1 * i,
        "name": f"name-{i}-é", "active": i % 2 == 0, "at": f"2024-03-0{1 + i % 9}T10:00:00.123456+02:00",
        "local": "2024-03-01T10:00:00", "day": "2024-03-01", "blob": "aGVsbG8=",
        "address": {"city": "Oslo", "zip": i, "geo": {"lat": 59.9, "lon": 10.75}}, "tags": ["a", "b"],
        "scores": [decimal.Decimal("1.5"), None]}, default=float).encode()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records(), min_size=1, max_size=6), st.sampled_from(["ignore", "error", "add"]))
def test_a_batch_arrow_reads_lands_what_the_record_by_record_path_lands(values, unknown_fields) -> None:
    decoder = _decoder(unknown_fields=unknown_fields)
    batch = _batch(values + [_good(i) for i in range(3)])
    fast = decode_json_batch(batch.column("value"), decoder.columns, decoder.source_names,
                             unknown_fields=unknown_fields, session_time_zone="UTC")
    slow, bad, _ = decoder.decode(batch, vectorized=False)
    landed, landed_bad, _ = decoder.decode(batch)
    if fast is None:  # decoded record by record: the same as the other path
        assert _same(landed.to_pylist()) == _same(slow.to_pylist())
        return
    assert bad is None, f"the fast path took a batch with a bad record: {bad.to_pylist()[0]}"
    assert landed_bad is None
    assert _same([dict(zip(decoder.columns.names, row, strict=True))
                  for row in zip(*(a.to_pylist() for a in fast), strict=True)]) == \
        _same(slow.select(decoder.columns.names).to_pylist())
    assert _same(landed.to_pylist()) == _same(slow.to_pylist())
    assert landed.schema == slow.schema


def test_a_batch_of_good_records_is_read_by_arrow_with_every_value_exact() -> None:
    decoder = _decoder()
    batch = _batch([_good(i) for i in range(500)])
    fast = decode_json_batch(batch.column("value"), decoder.columns, decoder.source_names,
                             unknown_fields="ignore", session_time_zone="UTC")
    assert fast is not None, "a batch of good records must take the batch path"
    rows = _decoder().decode(batch)[0].to_pylist()
    assert rows == _decoder().decode(batch, vectorized=False)[0].to_pylist()
    row = rows[123]
    assert row["offset"] == 223 and row["partition"] == 3
    assert row["price"] == decimal.Decimal("123.23") and row["weight"] == pytest.approx(12.3, rel=1e-6)
    assert row["at"] == datetime.datetime(2024, 3, 7, 8, 0, 0, 123456, tzinfo=datetime.UTC)
    assert row["local"] == datetime.datetime(2024, 3, 1, 10, 0) and row["day"] == datetime.date(2024, 3, 1)
    assert row["blob"] == b"hello" and row["name"] == "name-123-é" and row["active"] is False
    assert row["address"] == {"city": "Oslo", "zip": 123, "geo": {"lat": 59.9, "lon": 10.75}}
    assert row["scores"] == [decimal.Decimal("1.5"), None] and row["tags"] == ["a", "b"]
    assert math.isclose(row["ratio"], 123 / 7)


@pytest.mark.parametrize("value", [b'{"id": 1}\n', b'{"id": 1}{"id": 2}', b"   ", b"", None, b'{"id":\n1}',
                                   b'{"name": "\xff"}', b'\xef\xbb\xbf{"id": 1}'])
def test_what_arrow_would_not_read_alike_goes_record_by_record(value) -> None:
    """Not one JSON object on one line, a tombstone, invalid UTF-8, a byte-order mark."""
    decoder = _decoder()
    batch = _batch([b'{"id": 7}', value, b'{"id": 8}'])
    assert decode_json_batch(batch.column("value"), decoder.columns, decoder.source_names,
                             unknown_fields="ignore", session_time_zone="UTC") is None

"""Every value lands as produced (issue 31), at the decoder, without servers: each Avro type and
logical type in every context, random schemas (Hypothesis) compared field by field with what
fastavro reads from the same bytes, JSON numbers parsed exactly, values that do not fit refused as
bad records naming the field, and zoned timestamps normalized to UTC at every depth."""

from __future__ import annotations

import datetime
import decimal
import json
import math

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from pyspark.sql.pandas.types import to_arrow_schema

from chandy.connectors.spark.ddl import parse_ddl, value_struct
from chandy.formats.avro import AvroValueSchemaError
from chandy.formats.decoder import BadRecordError, ValueDecoder
from chandy.formats.records import ARROW_SCHEMA
from chandy.formats.type_mapping import AVRO_TYPES, JSON_TYPES, markdown_table, to_lake_types, utc_schema
from tests.fixtures import REPO_ROOT
from tests.fixtures import value_schemas as vs

ROOT = REPO_ROOT


def _batch(values: list[bytes | None]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"key": None, "value": v, "topic": "t", "partition": 0, "offset": i, "timestamp": None, "timestamp_type": 0,
          "headers": []} for i, v in enumerate(values)], schema=ARROW_SCHEMA)


def _avro_decoder(schema: dict, **kwargs) -> ValueDecoder:
    text = json.dumps(schema)
    arrow = to_arrow_schema(value_struct(text), timezone="UTC")
    return ValueDecoder("avro", arrow, tuple(arrow.names), ("offset",), avro_schema=text, avro_framing="raw", **kwargs)


def _json_decoder(ddl: str, **kwargs) -> ValueDecoder:
    arrow = to_arrow_schema(parse_ddl(ddl), timezone="UTC")
    return ValueDecoder("json", arrow, tuple(arrow.names), ("offset",), **kwargs)


def _landed_as_fastavro_reads(schema: dict, records: list[dict]) -> None:
    raws = [vs.encode(schema, r) for r in records]
    decoded, bad, _ = _avro_decoder(schema).decode(_batch(raws))
    assert bad is None
    rows = decoded.to_pylist()
    assert [r["offset"] for r in rows] == list(range(len(raws)))
    for row, raw in zip(rows, raws, strict=True):
        assert vs.differences(row, vs.decode(schema, raw), schema) == []


def test_every_avro_type_in_every_context_lands_as_fastavro_reads_it() -> None:
    schema, records = vs.every_type_in_every_context()
    _landed_as_fastavro_reads(schema, records)


@pytest.mark.parametrize("precision,scale", [(4, 0), (9, None), (10, 2), (18, 10), (38, 0), (38, 10)])
@pytest.mark.parametrize("kind", ["bytes", "fixed"])
@pytest.mark.parametrize("shape", ["required", "null_first", "null_last"])
def test_top_level_decimals_land_their_values_not_null(precision, scale, kind, shape) -> None:
    """Regression: every top-level Avro decimal landed NULL."""
    decimal_type = vs._dec(precision, scale, kind, name="D")
    field_type = decimal_type if shape == "required" else ["null", decimal_type] if shape == "null_first" \
        else [decimal_type, "null"]
    schema = {"type": "record", "name": "R", "fields": [{"name": "amount", "type": field_type}]}
    edges = vs._dec_edges(precision, scale or 0)
    decoded, bad, _ = _avro_decoder(schema).decode(_batch([vs.encode(schema, {"amount": e}) for e in edges]))
    assert bad is None
    assert decoded.column("amount").to_pylist() == edges
    assert decoded.schema.field("amount").type == pa.decimal128(precision, scale or 0)


def test_avro_times_land_as_from_avro_reads_them_and_unions_as_member_structs() -> None:
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "tu", "type": {"type": "long", "logicalType": "time-micros"}},
        {"name": "u", "type": ["null", "int", "string"]},
        {"name": "w", "type": ["int", "long"]},
    ]}
    struct = value_struct(json.dumps(schema))
    assert struct.simpleString() == "struct<tm:int,tu:bigint,u:struct<member0:int,member1:string>,w:bigint>"
    rows = [{"tm": datetime.time(1, 2, 3, 4000), "tu": datetime.time(23, 59, 59, 999999), "u": 7, "w": 3},
            {"tm": datetime.time(0, 0), "tu": datetime.time(0, 0, 0, 1), "u": "seven", "w": 2**40},
            {"tm": datetime.time(0, 0), "tu": datetime.time(0, 0), "u": None, "w": -1}]
    decoded, bad, _ = _avro_decoder(schema).decode(_batch([vs.encode(schema, r) for r in rows]))
    assert bad is None
    assert decoded.column("tm").to_pylist() == [3_723_004, 0, 0]
    assert decoded.column("tu").to_pylist() == [86_399_999_999, 1, 0]
    assert decoded.column("u").to_pylist() == [{"member0": 7, "member1": None}, {"member0": None, "member1": "seven"}, None]
    assert decoded.column("w").to_pylist() == [3, 2**40, -1]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(vs.schemas_and_records())
def test_random_avro_schemas_land_as_fastavro_reads_them(schema_and_records) -> None:
    schema, records = schema_and_records
    _landed_as_fastavro_reads(schema, records)


def _json_column(ddl: str, texts: list[str], **kwargs):
    decoder = _json_decoder(ddl, errors_tolerance="all", **kwargs)
    decoded, bad, _ = decoder.decode(_batch([t.encode() for t in texts]))
    return decoded, bad


def test_json_decimals_are_exact_as_numbers_and_as_strings_at_every_depth() -> None:
    """Regression: DECIMAL(38,10) went through a float64; decimals in maps and structs were bad records."""
    ddl = "d DECIMAL(38,10), m MAP<STRING, DECIMAL(20,4)>, s STRUCT<x: DECIMAL(10,2)>, a ARRAY<DECIMAL(38,10)>"
    texts = ['{"d": 12345678901234567890.1234567890, "m": {"x": "12.5", "y": 3}, "s": {"x": 1.005}, '
             '"a": [-9999999999999999999999999999.9999999999]}',
             '{"d": "-9999999999999999999999999999.9999999999", "m": {"z": 1e2}, "s": {"x": "0.004"}, "a": []}']
    decoded, bad = _json_column(ddl, texts)
    assert bad is None
    rows = decoded.to_pylist()
    D = decimal.Decimal
    assert rows[0]["d"] == D("12345678901234567890.1234567890")
    assert dict(rows[0]["m"]) == {"x": D("12.5000"), "y": D("3.0000")}
    assert rows[0]["s"] == {"x": D("1.01")}  # rounded half up to the scale, as from_json
    assert rows[0]["a"] == [D("-9999999999999999999999999999.9999999999")]
    assert rows[1]["d"] == D("-9999999999999999999999999999.9999999999")
    assert dict(rows[1]["m"]) == {"z": D("100.0000")} and rows[1]["s"] == {"x": D("0.00")}


@pytest.mark.parametrize("ddl,text,field", [
    ("n INT", '{"n": 1.5}', "field n: 1.5 is a number with a fraction"),
    ("n BIGINT", '{"n": 1.0}', "field n: 1.0 is a number with a fraction"),
    ("n ARRAY<BIGINT>", '{"n": [1, 2.5]}', "field n[1]: 2.5 is a number with a fraction"),
    ("n INT", '{"n": 2147483648}', "field n: 2147483648 is out of the range of a 32-bit integer"),
    ("n TINYINT", '{"n": -129}', "field n: -129 is out of the range of a 8-bit integer"),
    ("n STRUCT<x: INT>", '{"n": {"x": true}}', "field n.x: True is bool, not an integer"),
    ("n DECIMAL(4,2)", '{"n": 100}', "field n: 100 does not fit DECIMAL(4, 2)"),
    ("n MAP<STRING, DECIMAL(4,2)>", '{"n": {"k": "NaN"}}', "field n{k}: 'NaN' is not a finite decimal number"),
    ("n FLOAT", '{"n": 1e39}', "field n: 1E+39 is out of the range of a float"),
    ("n DOUBLE", '{"n": "abc"}', "field n: 'abc' is a string, not a number"),
    ("n TIMESTAMP_NTZ", '{"n": "2024-01-01T00:00:00+02:00"}', "has a UTC offset"),
])
def test_json_values_that_do_not_fit_are_bad_records_naming_the_field(ddl, text, field) -> None:
    """Regression: 1.5 landed as 1 in INT, BIGINT and ARRAY<BIGINT>."""
    decoded, bad = _json_column(ddl, [text, '{}'])
    assert decoded.num_rows == 1  # the other record lands
    assert bad is not None and bad.column("error_class").to_pylist() == ["TypeMismatch"]
    assert field in bad.column("error_message")[0].as_py()
    with pytest.raises(BadRecordError, match="topic t partition 0 offset 0"):
        _json_decoder(ddl).decode(_batch([text.encode()]))


def test_json_numbers_convert_as_from_json_does() -> None:
    """Integers into DOUBLE and FLOAT round to the nearest value (they were bad records beyond
    2^53 and 2^24); NaN and infinities as from_json's strings; JSON timestamps without an offset
    are in the session time zone; BINARY is base64."""
    ddl = "d DOUBLE, f FLOAT, t TIMESTAMP, b BINARY"
    texts = ['{"d": 9007199254740993, "f": 16777217, "t": "2024-01-01T00:00:00", "b": "AP8="}',
             '{"d": "NaN", "f": "-Infinity", "t": "2024-01-01T00:00:00+01:00", "b": ""}',
             '{"d": -0.0, "f": 0.1, "t": 1700000000, "b": null}']
    decoded, bad = _json_column(ddl, texts, session_time_zone="America/New_York")
    assert bad is None
    rows = decoded.to_pylist()
    assert rows[0]["d"] == 9007199254740992.0 and rows[0]["f"] == 16777216.0
    assert rows[0]["t"] == datetime.datetime(2024, 1, 1, 5, tzinfo=datetime.UTC) and rows[0]["b"] == b"\x00\xff"
    assert math.isnan(rows[1]["d"]) and rows[1]["f"] == -math.inf
    assert rows[1]["t"] == datetime.datetime(2023, 12, 31, 23, tzinfo=datetime.UTC)
    assert math.copysign(1, rows[2]["d"]) == -1 and rows[2]["t"] == datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.UTC)


def test_a_decimal_that_rounds_to_a_finite_float_lands_as_that_float() -> None:
    """Issue 54, finding I: ``3.4028235e38`` (Java's shortest text of Float.MAX_VALUE, as Jackson
    writes it) into a FLOAT was refused as out of range; Java's ``Float.parseFloat`` and Spark's
    JSON reader round it to Float.MAX_VALUE. Only a number that rounds to infinity is out of range
    (from (2 - 2^-24) * 2^127 on), in the batch and the record-by-record paths alike."""
    import numpy as np

    largest = float(np.finfo(np.float32).max)
    texts = ['{"f": 3.4028235e38}', '{"f": -3.4028235e38}', '{"f": 340282356779733661637539395458142568447}',
             '{"f": 3.4028234663852886e38}']
    decoded, bad = _json_column("f FLOAT", texts)
    assert bad is None
    assert decoded.column("f").to_pylist() == [largest, -largest, largest, largest]
    decoded, bad = _json_column("f FLOAT", [*texts, "{not json"])  # a bad record: the batch goes value by value
    assert decoded.column("f").to_pylist() == [largest, -largest, largest, largest]
    for text, shown in (('{"f": 3.5e38}', "3.5E+38"), ('{"f": 340282356779733661637539395458142568448}',
                                                       "340282356779733661637539395458142568448")):
        decoded, bad = _json_column("f FLOAT", [text, '{"f": 1.5}'])
        assert decoded.column("f").to_pylist() == [1.5]
        assert bad is not None and f"field f: {shown} is out of the range of a float" in bad.column("error_message")[0].as_py()


def test_zoned_timestamps_become_utc_at_every_depth() -> None:
    """Regression: a transform's nested timestamps in Spark's session zone ("Etc/UTC") failed the Delta commit."""
    zone = pa.timestamp("us", tz="Etc/UTC")
    moment = datetime.datetime(2024, 5, 6, 7, 8, 9, tzinfo=datetime.UTC)
    table = pa.table({"s": pa.array([{"t": moment}], pa.struct([("t", zone)])),
                      "a": pa.array([[moment]], pa.list_(zone)),
                      "m": pa.array([[("k", moment)]], pa.map_(pa.string(), zone)),
                      "n": pa.array([moment.replace(tzinfo=None)], pa.timestamp("us"))})
    landed = to_lake_types(table)
    assert landed.schema == utc_schema(table.schema)
    assert str(landed.schema.field("s").type) == "struct<t: timestamp[us, tz=UTC]>"
    assert str(landed.schema.field("m").type.item_type) == "timestamp[us, tz=UTC]"
    assert landed.schema.field("n").type == pa.timestamp("us")  # local timestamps keep no zone
    assert landed.to_pylist() == table.to_pylist()


def test_unsupported_types_are_refused_naming_the_field_and_type() -> None:
    with pytest.raises(AvroValueSchemaError, match=r"field R.a.member1: record R contains itself"):
        value_struct(json.dumps({"type": "record", "name": "R", "fields": [{"name": "a", "type": ["null", "int", "R"]}]}))
    from chandy.connectors.spark.ddl import DdlError

    with pytest.raises(DdlError, match="expected a Spark SQL type"):
        parse_ddl("a INTERVAL")


def test_the_mapping_table_in_the_docs_is_the_modules() -> None:
    text = (ROOT / "docs" / "type-mapping.md").read_text()
    assert markdown_table(AVRO_TYPES) in text and markdown_table(JSON_TYPES) in text

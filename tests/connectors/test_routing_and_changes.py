"""Routing rules, Debezium envelopes and the last-change-per-key rule, without servers."""

from __future__ import annotations

import datetime
import json

import pyarrow as pa
import pytest

from chandy.connectors.lake.changes import latest_changes
from chandy.connectors.lake.routing import RouteError, Router, RouteRule
from chandy.connectors.lake.sink import DataFile, LakeCommitError
from chandy.connectors.spark.options import PipelineError, PipelineOptions
from chandy.formats.decoder import KAFKA_COLUMNS, BadRecordError, ValueDecoder
from chandy.formats.records import ARROW_SCHEMA


def test_a_topic_template_names_the_table_from_the_match_groups() -> None:
    rule = RouteRule.parse(r"cdc\.sales\.(?P<table>.*)=delta:s3://lake/sales/${table}")
    assert rule.table == "s3://lake/sales/${table}"
    assert rule.table_for("cdc.sales.orders") == "s3://lake/sales/orders"
    assert rule.table_for("cdc.sales") is None  # the whole key must match
    assert RouteRule.parse(r"(\w+)\.(\w+)=iceberg://c/$1.$2").table_for("db.orders") == "iceberg://c/db.orders"


@pytest.mark.parametrize("value", ["a/b", "..", ".", "", "x?y", "a#b", "tab\there"])
def test_a_group_that_would_leave_its_place_in_the_table_name_does_not_route(value: str) -> None:
    assert RouteRule.parse(r"(.*)=lake/$1").table_for(value) is None


def test_the_first_matching_rule_wins_and_a_miss_is_unrouted() -> None:
    router = Router.parse(["eu=lake/eu", "([a-z]{2})=lake/other/$1"], field="region")
    assert router.table_for("eu") == "lake/eu"
    assert router.table_for("us") == "lake/other/us"
    assert router.table_for("moon") is None
    assert router.table_for(None) is None


@pytest.mark.parametrize("text, error", [
    ("no-equals", "PATTERN=TABLE"), ("([=lake/x", "not a regular expression"), ("(a)=lake/$2", "has 1 group"),
    ("(a)=lake/${name}", "no group of that name"), ("=lake/x", "PATTERN=TABLE")])
def test_a_bad_rule_says_what_is_wrong(text: str, error: str) -> None:
    with pytest.raises(RouteError, match=error.replace("(", r"\(")):
        RouteRule.parse(text)


def test_a_hive_style_table_path_splits_where_the_pattern_ends() -> None:
    """Issue 54, finding J: the split at the last ``=`` made ``([a-z]+)=lake/events/region=$1`` the
    pattern ``([a-z]+)=lake/events/region`` and the table ``$1``: the pattern never matched and
    every record landed in ``--table`` without a word. Every ``=`` is tried; the reading whose
    pattern is a route key (no ``/``) wins, and two readings are refused, naming both."""
    rule = RouteRule.parse("([a-z]+)=lake/events/region=$1")
    assert (rule.pattern, rule.table) == ("([a-z]+)", "lake/events/region=$1")
    assert rule.table_for("eu") == "lake/events/region=eu"
    assert RouteRule.parse("eu=s3://b/lake/events/region=eu/").table_for("eu") == "s3://b/lake/events/region=eu/"
    assert RouteRule.parse(r"a\=b=lake/x").table_for("a=b") == "lake/x"  # a literal '=' of the pattern, escaped
    with pytest.raises(RouteError, match=r"splits at more than one '=': pattern 'a' to table 'b=lake/x'; or pattern "
                                         r"'a=b' to table 'lake/x'; write a literal '=' of the pattern as '\\='"):
        RouteRule.parse("a=b=lake/x")
    router = Router.parse(["([a-z]+)=lake/events/region=$1"], field="region")
    assert [uri for uri, _ in router.split(pa.table({"region": ["eu", "us", "eu"]}))] == [
        Router.parse(["x=lake/events/region=eu"]).destination("x"), Router.parse(["x=lake/events/region=us"]).destination("x")]


def test_a_topic_rule_that_could_never_match_is_refused() -> None:
    """A rule routing by topic whose pattern needs '/' or '=' (no Kafka topic name holds either)
    would leave every record unrouted, in silence: refused at start."""
    with pytest.raises(RouteError, match=r"needs a '/' or '=', which no Kafka topic name holds"):
        Router.parse(["orders/eu=lake/eu"])
    assert Router.parse(["orders/eu=lake/eu"], field="path").table_for("orders/eu") == "lake/eu"  # a field's text may


def test_split_groups_rows_by_table_with_unrouted_rows_apart() -> None:
    router = Router.parse([r"t\.(a|b)=/lake/$1"])
    table = pa.table({"topic": ["t.a", "t.b", "t.c", "t.a", None], "n": [1, 2, 3, 4, 5]})
    parts = {uri: part["n"].to_pylist() for uri, part in router.split(table)}
    assert parts == {"file:///lake/a": [1, 4], "file:///lake/b": [2], None: [3, 5]}


def test_routing_by_a_field_of_another_type_routes_by_its_text() -> None:
    router = Router.parse(["1=/lake/one"], field="n")
    parts = {uri: part["n"].to_pylist() for uri, part in router.split(pa.table({"n": [1, 2, 1]}))}
    assert parts == {"file:///lake/one": [1, 1], None: [2]}
    with pytest.raises(RouteError, match="not a column"):
        Router.parse(["x=/l"], field="missing").split(pa.table({"n": [1]}))


def test_relative_tables_are_made_absolute_against_the_drivers_directory(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert Router.parse(["(.*)=lake/$1"]).resolved().rules[0].table == f"{tmp_path}/lake/$1"
    assert Router.parse(["(.*)=s3://b/$1"]).resolved().rules[0].table == "s3://b/$1"


def _changes(rows: list[tuple]) -> pa.Table:
    return pa.table({"id": pa.array([r[0] for r in rows], pa.int64()), "v": pa.array([r[1] for r in rows], pa.string()),
                     "__op": [r[2] for r in rows], "partition": pa.array([r[3] for r in rows], pa.int32()),
                     "offset": pa.array([r[4] for r in rows], pa.int64())})


def test_the_last_change_per_key_wins_by_partition_and_offset_whatever_the_file_order() -> None:
    changes = _changes([(1, "b", "u", 0, 5), (2, "x", "c", 1, 0), (1, "a", "c", 0, 1), (3, "y", "c", 0, 2),
                        (2, None, "d", 1, 3), (3, "z", "u", 0, 9), (4, "w", "d", 1, 4), (4, "q", "c", 1, 7)])
    result = latest_changes(changes, ["id"])
    assert sorted(result.upserts.select(["id", "v"]).to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "v": "b"}, {"id": 3, "v": "z"}, {"id": 4, "v": "q"}]
    assert result.deletes.to_pylist() == [{"id": 2}]
    assert "__op" not in result.upserts.column_names
    assert result.changes == 8


def test_a_change_without_its_key_is_refused() -> None:
    with pytest.raises(LakeCommitError, match="null key column id"):
        latest_changes(_changes([(None, "a", "c", 0, 1)]), ["id"])
    with pytest.raises(LakeCommitError, match="lack column"):
        latest_changes(_changes([(1, "a", "c", 0, 1)]).drop_columns(["offset"]), ["id"])


def test_a_data_file_keeps_its_table_and_key_through_its_state_handle() -> None:
    f = DataFile("p.parquet", 10, 3, {}, 1, "schema", "file:///lake/a", ("id", "region"))
    assert DataFile.from_state_handle(f.to_state_handle()) == f
    plain = DataFile("p.parquet", 10, 3, {}, 1, "schema")
    assert DataFile.from_state_handle(plain.to_state_handle()) == plain


def _kafka_batch(keys: list, values: list) -> pa.RecordBatch:
    n = len(values)
    now = datetime.datetime.now(datetime.UTC)
    return pa.RecordBatch.from_pydict({
        "key": keys, "value": values, "topic": ["t"] * n, "partition": [0] * n, "offset": list(range(n)),
        "timestamp": [now] * n, "timestamp_type": [0] * n, "headers": [[]] * n}, schema=ARROW_SCHEMA)


def _decoder(**extra) -> ValueDecoder:
    columns = pa.schema([("id", pa.int64()), ("name", pa.string())])
    settings = {"cdc": "debezium", "errors_tolerance": "all", **extra}
    return ValueDecoder("json", columns, ("id", "name"), tuple(c for c in KAFKA_COLUMNS if c != "value"), **settings)


def test_debezium_json_envelopes_and_tombstones_become_rows_with_their_operation() -> None:
    key = json.dumps({"schema": {}, "payload": {"id": 7}}).encode()
    values = [
        json.dumps({"before": None, "after": {"id": 7, "name": "a"}, "op": "r"}).encode(),
        json.dumps({"schema": {}, "payload": {"before": {"id": 7, "name": "a"}, "after": {"id": 7, "name": "b"},
                                              "op": "u"}}).encode(),
        json.dumps({"before": {"id": 7, "name": "b"}, "after": None, "op": "d"}).encode(),
        json.dumps({"before": None, "after": None, "op": "d"}).encode(),  # a delete whose before is null
        None,  # the tombstone
        json.dumps({"op": "t", "source": {}}).encode(),  # a truncate carries no row
        json.dumps({"before": None, "after": None, "op": "c"}).encode(),
    ]
    decoded, bad, skipped = _decoder().decode(_kafka_batch([key] * len(values), values))
    assert decoded.select(["id", "name", "__op", "offset"]).to_pylist() == [
        {"id": 7, "name": "a", "__op": "r", "offset": 0}, {"id": 7, "name": "b", "__op": "u", "offset": 1},
        {"id": 7, "name": "b", "__op": "d", "offset": 2}, {"id": 7, "name": None, "__op": "d", "offset": 3},
        {"id": 7, "name": None, "__op": "d", "offset": 4}]
    assert skipped == 0
    assert bad is not None and bad.column("offset").to_pylist() == [5, 6]
    assert "op 't'" in bad.column("error_message")[0].as_py()
    assert "without a after row" in bad.column("error_message")[1].as_py()


def test_a_tombstone_without_a_readable_key_is_a_bad_record_that_names_it() -> None:
    with pytest.raises(BadRecordError, match="offset 0: ChangeEventError: the key is not JSON"):
        _decoder(errors_tolerance="none").decode(_kafka_batch([b"\x01\x02"], [None]))


def test_the_key_columns_come_from_the_key_unless_named() -> None:
    key = json.dumps({"id": 1, "region": "eu"}).encode()
    assert _decoder().key_fields(key) == ("id", "region")
    assert _decoder(id_columns=("id",)).key_fields(key) == ("id",)


@pytest.mark.parametrize("extra, error", [
    ({"cdc": "debezium"}, "needs --value-format"),
    ({"cdc": "debezium", "value_format": "json", "transform": "m:f"}, "cannot take a --transform"),
    ({"id_columns": ("id",)}, "go with --cdc"),
    ({"routes": ("x=/l",), "route_field": "f"}, "--route-field needs a value format"),
    ({"route_field": "f", "value_format": "json"}, "needs --route rules"),
    ({"routes": ("x=/l",), "unrouted": "dead-letter"}, "needs a value format"),
    ({"routes": ("(x=/l",)}, "not a regular expression"),
])
def test_routing_and_cdc_options_that_do_not_go_together_are_refused(extra: dict, error: str) -> None:
    with pytest.raises(PipelineError, match=error.replace("(", r"\(")):
        PipelineOptions(table_uri="/tmp/t", bootstrap_servers="b:1", topics=("t",), **extra)


def test_an_avro_value_schema_that_is_no_envelope_and_a_bad_key_schema_are_refused() -> None:
    from chandy.formats.avro import AvroValueSchemaError

    plain = json.dumps({"type": "record", "name": "Row", "fields": [{"name": "id", "type": "long"}]})
    with pytest.raises(AvroValueSchemaError, match="not a Debezium envelope"):
        PipelineOptions(table_uri="/tmp/t", bootstrap_servers="b:1", topics=("t",), cdc="debezium",
                        value_format="avro", value_schema=plain)
    with pytest.raises(PipelineError, match="--key-schema: .*not JSON"):
        PipelineOptions(table_uri="/tmp/t", bootstrap_servers="b:1", topics=("t",), cdc="debezium",
                        value_format="json", key_schema="{not json")


def test_id_columns_may_be_given_comma_separated() -> None:
    options = PipelineOptions(table_uri="/tmp/t", bootstrap_servers="b:1", topics=("t",), cdc="debezium",
                              value_format="json", id_columns=("id, region", "flight"))
    assert options.id_columns == ("id", "region", "flight")


def test_the_json_converters_logical_types_are_read_as_their_schema_says() -> None:
    """Debezium's JSON converter with schemas: a Decimal is base64 of its unscaled bytes, a
    MicroTimestamp microseconds since the epoch, a Date days since it (Debezium's defaults)."""
    row_schema = {"type": "struct", "optional": True, "fields": [
        {"field": "id", "type": "int64", "optional": False},
        {"field": "price", "type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
         "version": 1, "parameters": {"scale": "2", "connect.decimal.precision": "10"}},
        {"field": "seen", "type": "int64", "optional": True, "name": "io.debezium.time.MicroTimestamp", "version": 1},
        {"field": "day", "type": "int32", "optional": True, "name": "io.debezium.time.Date", "version": 1},
        {"field": "loss", "type": "bytes", "optional": True, "name": "org.apache.kafka.connect.data.Decimal",
         "parameters": {"scale": "1"}}]}
    schema = {"type": "struct", "name": "db.public.t.Envelope", "fields": [
        {**row_schema, "field": "before"}, {**row_schema, "field": "after"}, {"field": "op", "type": "string"}]}
    after = {"id": 1, "price": "MDk=", "seen": 1_764_000_000_123_456, "day": 20_000, "loss": "/4U="}
    value = json.dumps({"schema": schema, "payload": {"before": None, "after": after, "op": "c"}}).encode()
    columns = pa.schema([("id", pa.int64()), ("price", pa.decimal128(10, 2)), ("seen", pa.timestamp("us", tz="UTC")),
                         ("day", pa.date32()), ("loss", pa.decimal128(10, 1))])
    decoder = ValueDecoder("json", columns, tuple(columns.names), ("key", "partition", "offset"), cdc="debezium")
    decoded, bad, _ = decoder.decode(_kafka_batch([b'{"id": 1}'], [value]))
    assert bad is None
    row = decoded.to_pylist()[0]
    assert str(row["price"]) == "123.45" and str(row["loss"]) == "-12.3"
    assert row["seen"] == datetime.datetime(2025, 11, 24, 16, 0, 0, 123456, tzinfo=datetime.UTC)
    assert row["day"] == datetime.date(2024, 10, 4)


def test_change_batches_read_by_arrow_equal_the_record_by_record_path() -> None:
    """The vectorized path of Debezium JSON (Arrow's reader) is taken for plain envelopes and
    lands every field as the record-by-record path does; what it cannot read goes that way."""
    from pyspark.sql.pandas.types import to_arrow_schema

    from chandy.connectors.spark.ddl import parse_ddl
    from chandy.formats.json_batch import decode_json_change_batch
    from tests.fixtures import debezium

    columns = to_arrow_schema(parse_ddl(debezium.ROW_DDL), timezone="UTC")
    decoder = ValueDecoder("json", columns, tuple(columns.names), tuple(c for c in KAFKA_COLUMNS if c != "value"),
                           cdc="debezium")
    events = debezium.change_stream(keys=60)
    messages = [debezium.json_message(i, row, op, with_schema=False) for i, row, op in events]
    batch = _kafka_batch([k for k, _ in messages], [v for _, v in messages])
    assert batch.column("value").null_count > 0  # tombstones too
    for id_columns in ((), ("id",)):
        keyed = ValueDecoder("json", columns, tuple(columns.names), decoder.keep, cdc="debezium",
                             id_columns=id_columns)
        assert decode_json_change_batch(batch.column("value"), columns, tuple(columns.names), session_time_zone="UTC",
                                        keys=batch.column("key"), id_columns=id_columns) is not None
        fast, bad, _ = keyed.decode(batch)
        slow, slow_bad, _ = keyed.decode(batch, vectorized=False)
        assert bad is None and slow_bad is None
        assert fast.to_pylist() == slow.to_pylist()
    assert {"c", "u", "r", "d"} <= set(fast.column("__op").to_pylist())
    deleted = [r for r, v in zip(fast.to_pylist(), batch.column("value").to_pylist(), strict=True)
               if r["__op"] == "d" and v is not None]
    assert deleted and all(r["carrier"] is not None for r in deleted)  # a delete lands its before row
    tombstone = next(r for r, v in zip(fast.to_pylist(), batch.column("value").to_pylist(), strict=True) if v is None)
    assert tombstone["id"] is not None and tombstone["carrier"] is None and tombstone["__op"] == "d"
    # a tombstone whose key has the converter's schema/payload wrapper: the record path unwraps it
    wrapped = [json.dumps({"schema": {}, "payload": {"id": 9}}).encode()]
    assert decode_json_change_batch(pa.array([None], pa.binary()), columns, tuple(columns.names),
                                    session_time_zone="UTC", keys=pa.array(wrapped, pa.binary())) is None
    assert decoder.decode(_kafka_batch(wrapped, [None]))[0].to_pylist()[0]["id"] == 9
    # a delete without its before row needs the key: the record path reads it
    gone = json.dumps({"before": None, "after": None, "op": "d"}).encode()
    assert decode_json_change_batch(pa.array([gone], pa.binary()), columns, tuple(columns.names),
                                    session_time_zone="UTC") is None
    row = decoder.decode(_kafka_batch([b'{"id": 5}'], [gone]))[0].to_pylist()[0]
    assert (row["id"], row["__op"]) == (5, "d")

"""Every value lands as produced, through the real pipeline (issue 31): records of every Avro type
and logical type in eight contexts, and random Avro schemas (Hypothesis), produced with fastavro
to a real broker, landed by Spark into Delta (with and without an identity ``--transform``, in two
Spark session time zones) and Iceberg, read back with ``deltalake`` and pyiceberg (readers Chandy
did not write) and compared field by field with fastavro's reading of the produced bytes. JSON
with a declared DDL is compared with an exact parse and with Spark's own ``from_json``.

Run under ``flock /tmp/chandy-spark.lock``; the larger Hypothesis run is marked ``slow``.
"""

from __future__ import annotations

import datetime
import decimal
import json
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, given, settings

from chandy.connectors.spark.options import PipelineOptions
from chandy.connectors.spark.pipeline import Pipeline
from tests.fixtures import value_schemas as vs
from tests.fixtures.lake_pipeline import make_topic

pytestmark = pytest.mark.integration

PATHS = [("delta", None, "Etc/UTC"), ("delta", "tests.transforms.flights:identity", "Etc/UTC"),
         ("delta", "tests.transforms.flights:identity", "America/New_York"), ("iceberg", None, "Etc/UTC")]


def _land(spark: Any, servers: str, root: Path, topic: str, sink: str, transform: str | None, zone: str,
          **value_options: Any) -> pa.Table:
    """Run the pipeline until drained; the table as read by deltalake or pyiceberg."""
    uri, catalog = str(root / "t"), {}
    if sink == "iceberg":
        uri, catalog = f"iceberg://local/values.t{uuid.uuid4().hex[:8]}", {"warehouse": str(root / "wh")}
    previous = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        options = PipelineOptions(table_uri=uri, bootstrap_servers=servers, topics=(topic,), stop_when_drained=True,
                                  prefix=f"v{uuid.uuid4().hex[:6]}", catalog_properties=catalog, transform=transform,
                                  **value_options)
        pipeline = Pipeline(options, spark=spark)
        summary = pipeline.run()
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous)
    assert summary.bad_records == 0
    if sink == "iceberg":
        return pipeline.sink.read_table()  # pyiceberg's scan
    from deltalake import DeltaTable

    return DeltaTable(uri).to_pyarrow_table()


def _compare_avro(table: pa.Table, schema: dict[str, Any], raws: list[bytes]) -> None:
    rows = sorted(table.to_pylist(), key=lambda r: (r["partition"], r["offset"]))
    assert len(rows) == len(raws)
    by_partition = [raws[0::2], raws[1::2]]  # make_topic produces round robin over two partitions
    problems = []
    for row in rows:
        raw = by_partition[row["partition"]][row["offset"]]
        problems += [f"partition {row['partition']} offset {row['offset']}: {d}"
                     for d in vs.differences(row, vs.decode(schema, raw), schema)]
    assert problems == []


@pytest.mark.parametrize(("sink", "transform", "zone"), PATHS)
def test_every_avro_type_in_every_context_lands_as_produced(lake_spark, kafka_bootstrap_servers, tmp_path,
                                                            sink, transform, zone) -> None:
    schema, records = vs.every_type_in_every_context()
    raws = [vs.encode(schema, r) for r in records]
    topic = make_topic(kafka_bootstrap_servers, list(raws), partitions=2, prefix="values")
    table = _land(lake_spark, kafka_bootstrap_servers, tmp_path, topic, sink, transform, zone,
                  value_format="avro", value_schema=json.dumps(schema), avro_framing="raw")
    _compare_avro(table, schema, raws)


def _random_schemas_land(spark: Any, servers: str, schema_and_records: Any, sink: str, transform: str | None,
                         zone: str) -> None:
    schema, records = schema_and_records
    raws = [vs.encode(schema, r) for r in records]
    topic = make_topic(servers, list(raws), partitions=2, prefix="random")
    with tempfile.TemporaryDirectory() as root:
        table = _land(spark, servers, Path(root), topic, sink, transform, zone, value_format="avro",
                      value_schema=json.dumps(schema), avro_framing="raw")
        _compare_avro(table, schema, raws)


@settings(max_examples=3, deadline=None, phases=[Phase.generate], derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
@given(vs.schemas_and_records(max_records=6))
def test_random_avro_schemas_land_as_produced(lake_spark, kafka_bootstrap_servers, schema_and_records) -> None:
    _random_schemas_land(lake_spark, kafka_bootstrap_servers, schema_and_records, "delta",
                         "tests.transforms.flights:identity", "America/New_York")


@pytest.mark.slow
@pytest.mark.parametrize(("sink", "transform", "zone"), PATHS)
def test_many_random_avro_schemas_land_as_produced(lake_spark, kafka_bootstrap_servers, sink, transform, zone) -> None:
    """The larger run: ``flock /tmp/chandy-spark.lock .venv/bin/pytest -m slow tests/pipeline/test_values_differential.py``."""

    @settings(max_examples=25, deadline=None, phases=[Phase.generate],
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(vs.schemas_and_records(max_records=6))
    def run(schema_and_records: Any) -> None:
        _random_schemas_land(lake_spark, kafka_bootstrap_servers, schema_and_records, sink, transform, zone)

    run()


JSON_DDL = ("id BIGINT, amount DECIMAL(38,10), price DECIMAL(10,2), prices MAP<STRING, DECIMAL(20,4)>, "
            "line STRUCT<qty: INT, total: DECIMAL(12,3)>, n BIGINT, ns ARRAY<BIGINT>, d DOUBLE, f FLOAT, "
            "t TIMESTAMP, day DATE, ok BOOLEAN, s STRING")
D = decimal.Decimal
JSON_CASES = [
    ('{"id": 0, "amount": 12345678901234567890.1234567890, "price": 19.99, "prices": {"a": 12.5, "b": "7"}, '
     '"line": {"qty": 3, "total": "59.970"}, "n": 9223372036854775807, "ns": [-9223372036854775808, 0], '
     '"d": 9007199254740993, "f": 0.1, "t": "2024-05-06T07:08:09.123456+02:00", "day": "1969-12-31", "ok": true, '
     '"s": "nul\\u0000 \\ud83d\\ude00"}',
     {"id": 0, "amount": D("12345678901234567890.1234567890"), "price": D("19.99"),
      "prices": {"a": D("12.5000"), "b": D("7.0000")}, "line": {"qty": 3, "total": D("59.970")},
      "n": 2**63 - 1, "ns": [-(2**63), 0], "d": 9007199254740992.0, "f": float(pa.scalar(0.1, pa.float32()).as_py()),
      "t": datetime.datetime(2024, 5, 6, 5, 8, 9, 123456, tzinfo=datetime.UTC), "day": datetime.date(1969, 12, 31),
      "ok": True, "s": "nul\x00 \U0001f600"}),
    ('{"id": 1, "amount": "-9999999999999999999999999999.9999999999", "price": 1.005, "prices": {}, '
     '"line": {"qty": -2147483648, "total": -0.0005}, "n": -1, "ns": [], "d": -0.0, "f": 16777217, '
     '"t": "1900-01-01T00:00:00Z", "day": "9999-12-31", "ok": false, "s": ""}',
     {"id": 1, "amount": D("-9999999999999999999999999999.9999999999"), "price": D("1.01"), "prices": {},
      "line": {"qty": -(2**31), "total": D("-0.001")}, "n": -1, "ns": [], "d": -0.0, "f": 16777216.0,
      "t": datetime.datetime(1900, 1, 1, tzinfo=datetime.UTC), "day": datetime.date(9999, 12, 31), "ok": False, "s": ""}),
    ('{"id": 2}', {"id": 2, "amount": None, "price": None, "prices": None, "line": None, "n": None, "ns": None,
                   "d": None, "f": None, "t": None, "day": None, "ok": None, "s": None}),
]


@pytest.mark.parametrize(("sink", "transform", "zone"), PATHS[:3] + [("iceberg", None, "Etc/UTC")])
def test_json_values_land_exactly_and_as_from_json_reads_them(lake_spark, kafka_bootstrap_servers, tmp_path,
                                                              sink, transform, zone) -> None:
    texts = [text for text, _ in JSON_CASES]
    topic = make_topic(kafka_bootstrap_servers, [t.encode() for t in texts], partitions=2, prefix="json")
    table = _land(lake_spark, kafka_bootstrap_servers, tmp_path, topic, sink, transform, zone,
                  value_format="json", value_schema=JSON_DDL)
    landed = {r["id"]: r for r in table.to_pylist()}
    assert set(landed) == {want["id"] for _, want in JSON_CASES}
    # Spark's own from_json on the same texts and DDL, in UTC, as Arrow (instants kept)
    from pyspark.sql import functions as F

    lake_spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark_rows = {r["v"]["id"]: r["v"] for r in lake_spark.createDataFrame([(t,) for t in texts], "text string")
                  .select(F.from_json("text", JSON_DDL).alias("v")).toArrow().to_pylist()}
    for _, want in JSON_CASES:
        got = landed[want["id"]]
        problems = [f"{k}: landed {got.get(k)!r}, expected {v!r}" for k, v in want.items() if not vs.same(got.get(k), v)]
        assert problems == []
        # every field equals what from_json reads, except the documented choices (none in these texts)
        theirs = spark_rows[want["id"]]
        problems = [f"{k}: landed {got.get(k)!r}, from_json {theirs.get(k)!r}" for k in want
                    if not vs.same(got.get(k), theirs.get(k))]
        assert problems == []


def test_verify_compares_values_and_names_the_first_differing_field(lake_spark, kafka_bootstrap_servers, tmp_path) -> None:
    """``--verify``'s value check: a run compares equal field by field; a landed value changed
    afterwards (with deltalake's own UPDATE) is reported by topic, partition, offset and field."""
    from deltalake import DeltaTable

    texts = [text for text, _ in JSON_CASES]
    topic = make_topic(kafka_bootstrap_servers, [t.encode() for t in texts], partitions=2, prefix="verify")
    options = PipelineOptions(table_uri=str(tmp_path / "t"), bootstrap_servers=kafka_bootstrap_servers, topics=(topic,),
                              stop_when_drained=True, prefix=f"v{uuid.uuid4().hex[:6]}", value_format="json",
                              value_schema=JSON_DDL)
    pipeline = Pipeline(options, spark=lake_spark)
    pipeline.run()
    check = pipeline.check_values()
    assert check is not None and (check.compared, check.first_difference) == (len(texts), None)
    DeltaTable(str(tmp_path / "t")).update(updates={"price": "NULL"}, predicate='"id" = 1')
    check = pipeline.check_values()
    assert check is not None and check.first_difference is not None
    assert check.first_difference.startswith(f"topic {topic} partition 1 offset 0 field price: landed NULL, source")

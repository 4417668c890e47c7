"""Nested Avro values round-trip to real Delta and Iceberg tables through a real broker and
Spark: records, arrays, maps, nullable unions, enums, fixed, decimal, date,
timestamp-millis/micros and uuid land as the matching Arrow types with their values intact,
read back with deltalake / pyiceberg (not the writer)."""

from __future__ import annotations

import datetime
import json
import uuid

import pytest

from chandy.connectors.spark.options import PipelineOptions
from chandy.connectors.spark.pipeline import Pipeline
from chandy.connectors.spark.verify import verify_table
from tests.fixtures.lake_pipeline import make_topic
from tests.fixtures.nested_avro import ARROW_TYPES, CREATED, SCHEMA, TRACE, confluent_bytes, value

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_nested_avro_record_round_trips_with_its_types(lake_spark, kafka_bootstrap_servers, tmp_path, kind) -> None:
    topic = make_topic(kafka_bootstrap_servers, [confluent_bytes(i) for i in range(40)], partitions=2, prefix="avro")
    uri, catalog = str(tmp_path / "t"), {}
    if kind == "iceberg":
        uri, catalog = f"iceberg://local/avro.t{uuid.uuid4().hex[:6]}", {"warehouse": str(tmp_path / "wh")}
    options = PipelineOptions(table_uri=uri, bootstrap_servers=kafka_bootstrap_servers, topics=(topic,),
                              stop_when_drained=True, prefix=f"av{uuid.uuid4().hex[:6]}", value_format="avro",
                              value_schema=json.dumps(SCHEMA), avro_framing="confluent", avro_schema_id=7,
                              max_records_per_checkpoint=15, catalog_properties=catalog)
    pipeline = Pipeline(options, spark=lake_spark)
    summary = pipeline.run()
    assert summary.records_landed == 40 and summary.bad_records == 0
    data = pipeline.sink.read_table()
    for name, arrow_type in ARROW_TYPES.items():
        found = data.schema.field(name).type
        assert _same(found, arrow_type), f"{name}: {found} in the table, expected {arrow_type}"
    rows = {r["id"]: r for r in data.to_pylist()}
    assert set(rows) == set(range(40))
    for i in (0, 1, 7):
        got, want = rows[i], value(i)
        assert got["customer"] == want["customer"]
        assert got["items"] == want["items"]
        assert dict(got["attributes"]) == want["attributes"]
        assert (got["status"], got["checksum"], got["note"], got["day"]) == (want["status"], want["checksum"],
                                                                             want["note"], want["day"])
        assert got["created_ms"] == CREATED and got["created_us"] == CREATED + datetime.timedelta(microseconds=456)
        assert got["trace"] == str(TRACE)
        assert got["billing"] == want["billing"]
    assert verify_table(pipeline.sink, kafka_bootstrap_servers, [topic]) == (40, 0, 0)


def _same(found, expected) -> bool:
    """Equal Arrow types, reading large strings/binaries/lists as their small forms (pyiceberg
    reads Iceberg strings as large_string) and ignoring field nullability and names of list items."""
    import pyarrow as pa

    def norm(t):
        if pa.types.is_large_string(t) or pa.types.is_string_view(t):
            return pa.string()
        if pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
            return pa.binary()
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            return ("list", norm(t.value_type))
        if pa.types.is_struct(t):
            return ("struct", tuple((t.field(i).name, norm(t.field(i).type)) for i in range(t.num_fields)))
        if pa.types.is_map(t):
            return ("map", norm(t.key_type), norm(t.item_type))
        if pa.types.is_timestamp(t):
            return ("timestamp", t.unit, "UTC" if t.tz in ("UTC", "+00:00", "Etc/UTC") else t.tz)
        return t

    return norm(found) == norm(expected)

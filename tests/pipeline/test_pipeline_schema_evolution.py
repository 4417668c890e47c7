"""Schema evolution on a real broker, real Spark, and real Delta and Iceberg tables: a field added
mid-stream to JSON values becomes a column (older rows read it as null), nested values land as
structs and lists; a field whose type then changes fails the micro-batch naming the field, both
types and the offset range, and lands nothing of it."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

from chandy.connectors.spark.options import PipelineError, PipelineOptions
from chandy.connectors.spark.pipeline import Pipeline
from chandy.connectors.spark.verify import verify_table
from tests.fixtures.lake_pipeline import all_offsets, make_topic

pytestmark = pytest.mark.integration


def table_uri(kind: str, tmp_path: Path) -> tuple[str, dict[str, str]]:
    if kind == "iceberg":
        return f"iceberg://local/evo.t{uuid.uuid4().hex[:6]}", {"warehouse": str(tmp_path / "wh")}
    return str(tmp_path / "t"), {}


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_an_added_field_becomes_a_column_and_a_changed_type_lands_nothing(
        lake_spark, kafka_bootstrap_servers, tmp_path, kind) -> None:
    values = ([json.dumps({"id": i, "name": f"n{i}"}).encode() for i in range(10)]
              + [json.dumps({"id": i, "name": f"n{i}", "score": i * 10, "tags": ["a", str(i)],
                             "detail": {"x": i, "y": "why"}}).encode() for i in range(10, 20)]
              + [json.dumps({"id": i, "name": f"n{i}", "score": f"high-{i}"}).encode() for i in range(20, 30)])
    topic = make_topic(kafka_bootstrap_servers, values, partitions=1, prefix="evo")
    uri, catalog = table_uri(kind, tmp_path)
    options = PipelineOptions(table_uri=uri, bootstrap_servers=kafka_bootstrap_servers, topics=(topic,),
                              stop_when_drained=True, prefix=f"ev{uuid.uuid4().hex[:6]}", value_format="json",
                              max_records_per_checkpoint=10, catalog_properties=catalog,
                              restart_backoff_initial_ms=100)
    pipeline = Pipeline(options, spark=lake_spark)
    with pytest.raises(PipelineError) as failure:
        pipeline.run()
    message = str(failure.value)
    assert "column score is string in the data but long in the table" in message, message
    assert f"{topic}-0 offsets [20, 29]" in message, message
    data = pipeline.sink.read_table()
    assert data.num_rows == 20  # checkpoints 1 and 2; nothing of checkpoint 3
    schema = data.schema
    assert schema.field("score").type == pa.int64()
    assert pa.types.is_list(schema.field("tags").type) or pa.types.is_large_list(schema.field("tags").type)  # pyiceberg reads large
    detail = schema.field("detail").type
    assert pa.types.is_struct(detail) and {detail.field(i).name for i in range(detail.num_fields)} == {"x", "y"}
    rows = sorted(data.select(["offset", "id", "score", "tags", "detail"]).to_pylist(), key=lambda r: r["offset"])
    assert rows[0] == {"offset": 0, "id": 0, "score": None, "tags": None, "detail": None}
    assert rows[12] == {"offset": 12, "id": 12, "score": 120, "tags": ["a", "12"], "detail": {"x": 12, "y": "why"}}
    assert verify_table(pipeline.sink, kafka_bootstrap_servers, [topic])[:2] == (20, 0)
    landed = {(topic, 0, r["offset"]) for r in rows}
    assert landed == {t for t in all_offsets(kafka_bootstrap_servers, topic, 1) if t[2] < 20}


def test_without_schema_evolution_a_new_field_is_a_bad_record(lake_spark, kafka_bootstrap_servers, tmp_path) -> None:
    values = [json.dumps({"id": 1}).encode(), json.dumps({"id": 2, "extra": True}).encode()]
    topic = make_topic(kafka_bootstrap_servers, values, partitions=1, prefix="evo")
    options = PipelineOptions(table_uri=str(tmp_path / "t"), bootstrap_servers=kafka_bootstrap_servers, topics=(topic,),
                              stop_when_drained=True, prefix=f"ev{uuid.uuid4().hex[:6]}", value_format="json",
                              max_records_per_checkpoint=1, schema_evolution=False, restart_backoff_initial_ms=100)
    with pytest.raises(PipelineError, match=rf"BadRecordError: topic {topic} partition 0 offset 1: UnknownField"):
        Pipeline(options, spark=lake_spark).run()

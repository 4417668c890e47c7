"""Issue 47: table properties when Chandy creates a table (Kafka Connect's
``iceberg.tables.auto-create-props.*``), read back with the formats' own readers (deltalake,
pyiceberg's catalog, pyarrow's Parquet metadata), on real local tables, without Kafka or Spark."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyiceberg.catalog import load_catalog

from chandy.connectors.lake.sink import parquet_write_options
from chandy.connectors.lake.tables import open_sink
from chandy.connectors.spark.options import PipelineError, PipelineOptions

JOB = "0123456789abcdef0123456789abcdef"


def _rows(n: int = 50) -> pa.Table:
    return pa.table({"topic": ["t"] * n, "partition": pa.array([0] * n, pa.int32()),
                     "offset": pa.array(range(n), pa.int64()), "v": [f"value-{i}" for i in range(n)]})


def _land(sink, checkpoint: int = 1) -> list[str]:
    files = sink.write_files(_rows(), job_id=JOB, checkpoint_id=checkpoint, subtask=0, attempt=0)
    assert sink.commit(JOB, checkpoint, files, offsets={("t", 0): 50}, cluster_id="c1")
    return [f"{sink.root}/{f.path}" for f in files]


def _codecs(paths: list[str]) -> set[str]:
    return {pq.ParquetFile(p).metadata.row_group(0).column(0).compression for p in paths}


def test_a_created_delta_table_has_the_properties_and_its_files_the_codec(tmp_path: Path) -> None:
    properties = {"delta.appendOnly": "true", "delta.logRetentionDuration": "interval 7 days",
                  "write.parquet.compression-codec": "snappy"}
    sink = open_sink(str(tmp_path / "orders"), table_properties=properties)
    paths = _land(sink)
    configuration = DeltaTable(str(tmp_path / "orders")).metadata().configuration
    # the codec is a setting of Chandy's writer, not a Delta property (delta-rs refuses other keys);
    # a log checkpoint every 10 commits unless set (Delta Lake's default; delta-rs's is 100)
    assert configuration == {"delta.checkpointInterval": "10", **{k: v for k, v in properties.items()
                                                                  if k.startswith("delta.")}}
    assert _codecs(paths) == {"SNAPPY"}
    # an existing table keeps its own properties: a later run given others creates nothing
    again = open_sink(str(tmp_path / "orders"), table_properties={"delta.appendOnly": "false"})
    _land(again, 2)
    assert DeltaTable(str(tmp_path / "orders")).metadata().configuration["delta.appendOnly"] == "true"


def test_a_delta_checkpoint_interval_given_is_the_tables(tmp_path: Path) -> None:
    """Issue 57: Chandy's default log checkpoint interval (10) gives way to the user's."""
    sink = open_sink(str(tmp_path / "orders"), table_properties={"delta.checkpointInterval": "50"})
    _land(sink)
    assert DeltaTable(str(tmp_path / "orders")).metadata().configuration == {"delta.checkpointInterval": "50"}
    sink = open_sink(str(tmp_path / "other"))
    _land(sink)
    assert DeltaTable(str(tmp_path / "other")).metadata().configuration == {"delta.checkpointInterval": "10"}


def test_a_created_iceberg_table_has_the_properties_and_its_files_the_codec(tmp_path: Path) -> None:
    properties = {"format-version": "1", "write.parquet.compression-codec": "gzip",
                  "write.metadata.previous-versions-max": "7", "commit.retry.num-retries": "9"}
    warehouse = tmp_path / "wh"
    sink = open_sink("iceberg://local/lake.orders", catalog_properties={"warehouse": str(warehouse)},
                     table_properties=properties)
    paths = _land(sink)
    table = load_catalog("local", type="sql", uri=f"sqlite:///{warehouse}/catalog.db",
                         warehouse=f"file://{warehouse}").load_table("lake.orders")
    assert table.format_version == 1
    assert {k: table.properties.get(k) for k in properties if k != "format-version"} == {
        k: v for k, v in properties.items() if k != "format-version"}
    assert _codecs([p.removeprefix("file://") for p in paths]) == {"GZIP"}


def test_the_default_codec_is_zstd_and_bad_codecs_are_refused_naming_the_property(tmp_path: Path) -> None:
    assert _codecs(_land(open_sink(str(tmp_path / "plain")))) == {"ZSTD"}
    assert parquet_write_options({"write.parquet.compression-codec": "ZSTD", "write.parquet.compression-level": "9"}) \
        == {"compression": "zstd", "compression_level": 9}
    assert parquet_write_options({"write.parquet.compression-codec": "uncompressed"})["compression"] == "none"
    for bad, why in (({"write.parquet.compression-codec": "lzo"}, "compression-codec=lzo: not one of zstd"),
                     ({"write.parquet.compression-level": "high"}, "compression-level=high: not an integer")):
        with pytest.raises(PipelineError, match=f"--table-property write.parquet.{why}"):
            PipelineOptions(table_uri=str(tmp_path / "t"), bootstrap_servers="k:1", topics=("a",), table_properties=bad)


def test_a_property_delta_rs_refuses_fails_at_start_not_at_the_first_commit(tmp_path: Path) -> None:
    """delta-rs creates tables only with the delta.* properties it knows: another key fails the
    options (before Spark, Kafka or the table are touched), naming it."""
    with pytest.raises(PipelineError, match=r"--table-property .*'owner'.*Delta takes the delta\.\* properties"):
        PipelineOptions(table_uri=str(tmp_path / "t"), bootstrap_servers="k:1", topics=("a",),
                        table_properties={"owner": "team-a"})
    assert not (tmp_path / "t").exists()
    PipelineOptions(table_uri="iceberg://local/lake.t", bootstrap_servers="k:1", topics=("a",),
                    table_properties={"owner": "team-a"})  # Iceberg takes any property

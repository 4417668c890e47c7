"""Issue 47 (a completeness watermark, as Kafka Connect's Iceberg sink's valid-through
timestamp): each commit records, per partition, the newest Kafka timestamp the job landed and
their minimum; read back with deltalake's history and pyiceberg's snapshot summaries (readers
Chandy does not write with), through ``progress`` after a restart, and with each commit."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable
from pyiceberg.catalog import load_catalog

from chandy.connectors.lake.tables import open_sink

JOB = "0123456789abcdef0123456789abcdef"
TIMES = {("orders", 0): 1_790_000_060_000, ("orders", 1): 1_790_000_000_500}  # 2026-09-21T14:13:20.500Z is the min


def _rows(n: int = 4) -> pa.Table:
    return pa.table({"topic": ["orders"] * n, "partition": pa.array([0] * n, pa.int32()),
                     "offset": pa.array(range(n), pa.int64())})


def _commit(sink, checkpoint: int, times) -> object:
    files = sink.write_files(_rows(), job_id=JOB, checkpoint_id=checkpoint, subtask=0, attempt=0)
    return sink.commit(JOB, checkpoint, files, offsets={("orders", 0): 4 * checkpoint, ("orders", 1): 0},
                       cluster_id="c1", event_times=times)


def test_delta_commits_record_the_watermark_and_a_restart_reads_it_back(tmp_path: Path) -> None:
    sink = open_sink(str(tmp_path / "t"))
    committed = _commit(sink, 1, TIMES)
    assert committed.event_times == TIMES
    newest = DeltaTable(str(tmp_path / "t")).history(1)[0]
    assert newest["chandy.valid_through_ms"] == "1790000000500"
    assert newest["chandy.event_time_ms"] == '{"orders":{"0":1790000060000,"1":1790000000500}}'
    assert open_sink(str(tmp_path / "t")).progress(JOB).event_times == TIMES  # what a restart reads
    _commit(sink, 2, None)  # a commit without timestamps (a --transform job) records none
    assert "chandy.valid_through_ms" not in DeltaTable(str(tmp_path / "t")).history(1)[0]
    assert [c.event_times for c in sink.commits_after(JOB, 0)] == [TIMES, None]


def test_iceberg_snapshots_carry_kafka_connects_valid_through_ts(tmp_path: Path) -> None:
    warehouse = tmp_path / "wh"
    sink = open_sink("iceberg://local/lake.orders", catalog_properties={"warehouse": str(warehouse)})
    assert _commit(sink, 1, TIMES).event_times == TIMES
    table = load_catalog("local", type="sql", uri=f"sqlite:///{warehouse}/catalog.db",
                         warehouse=f"file://{warehouse}").load_table("lake.orders")
    summary = table.current_snapshot().summary.additional_properties
    assert summary["kafka.connect.valid-through-ts"] == "2026-09-21T14:13:20.500Z"
    assert summary["chandy.valid_through_ms"] == "1790000000500"
    assert sink.progress(JOB).event_times == TIMES

"""The Iceberg sink on a real pyiceberg SQL catalog (SQLite) and local warehouse, without Kafka
or Spark: invisible files until the commit, idempotent commits recording (job, checkpoint,
offsets) in the snapshot summary and the table properties, cleanup of unreferenced files,
schema checks, compaction racing commits, and vacuum."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog

from chandy.connectors.lake.iceberg import IcebergSink, parse_iceberg_uri
from chandy.connectors.lake.sink import LakeSchemaError
from chandy.connectors.lake.sinks import open_sink
from chandy.connectors.lake.uri import TableUriError

JOB = "fedcba9876543210fedcba9876543210"
URI = "iceberg://local/lake.orders"


def rows(checkpoint: int, n: int = 4) -> pa.Table:
    return pa.table({"topic": ["t"] * n, "partition": pa.array([0] * n, pa.int32()),
                     "offset": pa.array([checkpoint * n + i for i in range(n)], pa.int64()),
                     "ts": pa.array([1_700_000_000_000_000] * n, pa.timestamp("us", tz="Etc/UTC"))})


def make_sink(tmp_path: Path) -> IcebergSink:
    sink = open_sink(URI, catalog_properties={"warehouse": str(tmp_path / "wh")})
    assert isinstance(sink, IcebergSink)
    return sink


def commit(sink: IcebergSink, checkpoint: int, n: int = 4) -> bool:
    files = sink.write_files(rows(checkpoint, n), job_id=JOB, checkpoint_id=checkpoint, subtask=0, attempt=0)
    return sink.commit(JOB, checkpoint, files, offsets={("t", 0): (checkpoint + 1) * n}, cluster_id="c1")


def test_uri_parsing() -> None:
    assert parse_iceberg_uri("iceberg://cat/a.b.t") == ("cat", ("a", "b"), "t")
    for bad in ("iceberg://cat/t", "iceberg:///a.t", "iceberg://cat/a."):
        with pytest.raises(TableUriError):
            parse_iceberg_uri(bad)


def test_commit_is_atomic_idempotent_and_recorded(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    assert not sink.exists() and sink.committed_checkpoint(JOB) is None
    files = sink.write_files(rows(1), job_id=JOB, checkpoint_id=1, subtask=0, attempt=0)
    assert not sink.exists()  # written, invisible
    assert sink.commit(JOB, 1, files, offsets={("t", 0): 8}, cluster_id="c1")
    assert not sink.commit(JOB, 1, files, offsets={("t", 0): 8})  # a repeated commit is skipped
    assert commit(sink, 2)
    table = load_catalog("local", type="sql", uri=f"sqlite:///{tmp_path}/wh/catalog.db",
                         warehouse=f"file://{tmp_path}/wh").load_table("lake.orders")
    summary = table.current_snapshot().summary.additional_properties
    assert summary["chandy.job_id"] == JOB and summary["chandy.checkpoint_id"] == "2"
    assert summary["chandy.offsets"] == '{"t":{"0":12}}'
    assert sorted(table.scan().to_arrow().column("offset").to_pylist()) == list(range(4, 12))
    progress = sink.progress(JOB)
    assert (progress.checkpoint_id, progress.offsets, progress.cluster_id) == (2, {("t", 0): 12}, "c1")
    assert sink.progress("other-job").other_jobs == {JOB: {("t", 0): 12}}
    # files of an aborted checkpoint are deleted, those in flight kept
    orphan = sink.write_files(rows(3), job_id=JOB, checkpoint_id=3, subtask=0, attempt=0)[0].path
    in_flight = sink.write_files(rows(4), job_id=JOB, checkpoint_id=4, subtask=0, attempt=0)[0].path
    assert sink.delete_unreferenced(JOB, keep_checkpoints_after=3) == [orphan]
    assert (Path(sink.root) / in_flight).exists()


def test_schema_mismatch_lands_nothing(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    assert commit(sink, 1)
    other = pa.table({"topic": [1], "partition": pa.array([0], pa.int32()), "offset": pa.array([99], pa.int64())})
    files = sink.write_files(other, job_id=JOB, checkpoint_id=2, subtask=0, attempt=0)
    with pytest.raises(LakeSchemaError, match="column topic is long in the data but string in the table"):
        sink.commit(JOB, 2, files, offsets={("t", 0): 100})
    assert sink.committed_checkpoint(JOB) == 1 and sink.read_table().num_rows == 4


def test_compaction_racing_commits_keeps_every_row_once(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    assert commit(sink, 1, n=3)
    stop = threading.Event()
    results: list[dict] = []
    errors: list[BaseException] = []

    def compact() -> None:
        other = make_sink(tmp_path)
        while not stop.is_set():
            try:
                results.append(other.optimize())
            except Exception as exc:  # noqa: BLE001 - any failure is reported by the assertion below
                errors.append(exc)
                return

    thread = threading.Thread(target=compact)
    thread.start()
    try:
        for checkpoint in range(2, 26):
            assert commit(sink, checkpoint, n=3)
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    assert sum(r["numFilesRemoved"] for r in results) > 0
    sink.optimize()
    assert sorted(sink.read_table().column("offset").to_pylist()) == list(range(3, 78))
    assert sink.committed_checkpoint(JOB) == 25 and sink.progress(JOB).offsets == {("t", 0): 78}
    assert len(sink.referenced_files()) == 1
    # vacuum: expire the old snapshots, delete what only they referenced; the table reads the same
    removed = sink.vacuum(retention_hours=0, dry_run=True)
    assert removed and all((Path(sink.root) / p).exists() for p in removed)
    assert sorted(sink.vacuum(retention_hours=0)) == sorted(removed)
    assert not any((Path(sink.root) / p).exists() for p in removed)
    assert sorted(sink.read_table().column("offset").to_pylist()) == list(range(3, 78))
    assert sink.committed_checkpoint(JOB) == 25  # the record is in the properties, not in expired snapshots


def test_a_partitioned_table_gets_one_file_per_partition_value(tmp_path: Path) -> None:
    sink = open_sink(URI, partition_by=("topic",), catalog_properties={"warehouse": str(tmp_path / "wh")})
    for checkpoint in (1, 2):
        data = pa.table({"topic": ["a", "b", "a", None], "partition": pa.array([0] * 4, pa.int32()),
                         "offset": pa.array([checkpoint * 4 + i for i in range(4)], pa.int64())})
        files = sink.write_files(data, job_id=JOB, checkpoint_id=checkpoint, subtask=0, attempt=0)
        assert sorted(f.path.split("/")[1] for f in files) == ["topic=a", "topic=b", "topic=null"]
        assert sink.commit(JOB, checkpoint, files, offsets={("t", 0): checkpoint * 4 + 4})
    table = load_catalog("local", type="sql", uri=f"sqlite:///{tmp_path}/wh/catalog.db",
                         warehouse=f"file://{tmp_path}/wh").load_table("lake.orders")
    assert [f.name for f in table.spec().fields] == ["topic"]
    assert sorted(table.scan(row_filter="topic == 'a'").to_arrow().column("offset").to_pylist()) == [4, 6, 8, 10]
    partitions = {r["partition"]["topic"]: r["record_count"] for r in table.inspect.partitions().to_pylist()}
    assert partitions == {"a": 4, "b": 2, None: 2}
    assert sink.optimize()["numFilesAdded"] == 3  # compaction keeps partitions apart
    assert sorted(sink.read_table().column("offset").to_pylist()) == list(range(4, 12))


def test_a_task_writes_files_without_the_catalog(tmp_path: Path) -> None:
    """Spark tasks get the table location from the driver: they write without contacting the
    catalog (here an unreachable REST catalog), and the driver's commit adds what they wrote."""
    unreachable = {"type": "rest", "uri": "http://127.0.0.1:9"}
    driver = make_sink(tmp_path)
    task = open_sink(URI, catalog_properties=unreachable, location=driver.root_url)
    files = task.write_files(rows(1), job_id=JOB, checkpoint_id=1, subtask=0, attempt=0)
    assert driver.commit(JOB, 1, files, offsets={("t", 0): 8})
    assert sorted(driver.read_table().column("offset").to_pylist()) == [4, 5, 6, 7]


def test_vacuum_racing_commits_retries_instead_of_failing(tmp_path: Path) -> None:
    """Regression: ``chandy lake vacuum`` on Iceberg failed with CommitFailedException when the
    pipeline committed at the same moment; it now reads the table again and retries."""
    sink = make_sink(tmp_path)
    assert commit(sink, 1, n=3)
    stop = threading.Event()
    vacuumed: list[list[str]] = []
    errors: list[BaseException] = []

    def vacuum() -> None:
        other = make_sink(tmp_path)
        while not stop.is_set():
            try:
                vacuumed.append(other.vacuum(retention_hours=0))
            except Exception as exc:  # noqa: BLE001 - any failure is reported by the assertion below
                errors.append(exc)
                return

    thread = threading.Thread(target=vacuum)
    thread.start()
    try:
        for checkpoint in range(2, 26):
            assert commit(sink, checkpoint, n=3)
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    assert len(vacuumed) > 1
    assert sorted(sink.read_table().column("offset").to_pylist()) == list(range(3, 78))
    assert sink.committed_checkpoint(JOB) == 25


def test_a_null_map_of_records_reads_back_null(tmp_path: Path) -> None:
    """The differential tests found it: pyiceberg 0.12's scan reads a NULL map<string, struct>
    as an empty map; the sink reads the snapshot's files with pyarrow and keeps the NULL."""
    sink = make_sink(tmp_path)
    kind = pa.map_(pa.string(), pa.struct([("f0", pa.int64())]))
    data = pa.table({"topic": ["t"] * 3, "partition": pa.array([0] * 3, pa.int32()), "offset": pa.array([0, 1, 2], pa.int64()),
                     "m": pa.array([None, [("a", {"f0": 1})], []], kind)})
    files = sink.write_files(data, job_id=JOB, checkpoint_id=1, subtask=0, attempt=0)
    assert sink.commit(JOB, 1, files, offsets={("t", 0): 3}, cluster_id="c1")
    assert sink.read_table().column("m").to_pylist() == [None, [("a", {"f0": 1})], []]

"""The Iceberg sink on a real pyiceberg SQL catalog (SQLite) and local warehouse, without Kafka
or Spark: invisible files until the commit, idempotent commits recording (job, checkpoint,
offsets) in the snapshot summary and the table properties, cleanup of unreferenced files,
schema checks, compaction racing commits, and vacuum."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog

from chandy.connectors.lake.iceberg import IcebergSink, parse_iceberg_uri
from chandy.connectors.lake.sink import LakeCommit, LakeSchemaError
from chandy.connectors.lake.tables import open_sink
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


def commit(sink: IcebergSink, checkpoint: int, n: int = 4) -> LakeCommit | None:
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


def commit_24_checkpoints_beside(tmp_path: Path, sink: IcebergSink, maintenance: Callable[[IcebergSink], Any]) -> list:
    """Commits checkpoints 2 to 25 (3 records each) while another sink on the same table runs
    ``maintenance`` again and again; returns its results. Fails if ``maintenance`` ever raised."""
    stop = threading.Event()
    results: list = []
    errors: list[BaseException] = []

    def run() -> None:
        other = make_sink(tmp_path)
        while not stop.is_set():
            try:
                results.append(maintenance(other))
            except Exception as exc:  # noqa: BLE001 - any failure is reported by the assertion below
                errors.append(exc)
                return

    thread = threading.Thread(target=run)
    thread.start()
    try:
        for checkpoint in range(2, 26):
            assert commit(sink, checkpoint, n=3)
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    return results


def test_compaction_racing_commits_keeps_every_row_once(tmp_path: Path) -> None:
    sink = make_sink(tmp_path)
    assert commit(sink, 1, n=3)
    results = commit_24_checkpoints_beside(tmp_path, sink, lambda other: other.optimize())
    assert sum(r["numFilesRemoved"] for r in results) > 0
    sink.optimize()
    assert sorted(sink.read_table().column("offset").to_pylist()) == list(range(3, 78))
    assert sink.committed_checkpoint(JOB) == 25 and sink.progress(JOB).offsets == {("t", 0): 78}


def test_vacuum_racing_commits_retries_instead_of_failing(tmp_path: Path) -> None:
    """Regression: ``chandy lake vacuum`` on Iceberg failed with CommitFailedException when the
    pipeline committed at the same moment; it now reads the table again and retries."""
    sink = make_sink(tmp_path)
    assert commit(sink, 1, n=3)
    vacuumed = commit_24_checkpoints_beside(tmp_path, sink, lambda other: other.vacuum(retention_hours=0))
    assert len(vacuumed) > 1
    assert sorted(sink.read_table().column("offset").to_pylist()) == list(range(3, 78))
    assert sink.committed_checkpoint(JOB) == 25


def test_vacuum_retains_the_last_snapshots_whatever_their_age(tmp_path: Path) -> None:
    """``retain_last`` (``--retain-last``, Iceberg's ``ExpireSnapshots.retainLast``): with a
    retention of 0 hours, the M newest snapshots stay, the older ones are expired, and the data
    files only expired snapshots referenced (compacted away) are deleted; the rows stay."""
    sink = make_sink(tmp_path)
    for checkpoint in range(1, 5):
        assert commit(sink, checkpoint, n=3)
    sink.optimize()  # five snapshots: four appends, then the compaction that removes their files
    catalog = load_catalog("local", type="sql", uri=f"sqlite:///{tmp_path}/wh/catalog.db",
                           warehouse=f"file://{tmp_path}/wh")
    assert len(catalog.load_table("lake.orders").snapshots()) == 5
    assert sink.vacuum(retention_hours=0, retain_last=3) == []  # the 3rd and 4th append still hold every file
    assert len(catalog.load_table("lake.orders").snapshots()) == 3
    removed = sink.vacuum(retention_hours=0, retain_last=1)
    assert len(removed) == 4 and not any((Path(sink.root) / path).exists() for path in removed)
    assert len(catalog.load_table("lake.orders").snapshots()) == 1
    assert sorted(sink.read_table().column("offset").to_pylist()) == list(range(3, 15))


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


def test_each_commit_is_found_and_read_back_alone(tmp_path: Path) -> None:
    """Issue 35: the snapshot of each checkpoint is found, and read_commit gives exactly its rows;
    a commit without data files makes no snapshot and is reported at the current one."""
    sink = make_sink(tmp_path)
    for checkpoint in (1, 2, 3):
        assert commit(sink, checkpoint)
    landed = sink.commit(JOB, 4, [], offsets={("t", 0): 16})  # progress without files
    assert landed is not None and landed.records == 0 and landed.table_version == landed.previous_table_version
    found = sink.commits_after(JOB, 1)
    assert [c.checkpoint_id for c in found] == [2, 3, 4]
    assert found[2].table_version == found[1].table_version  # no snapshot of its own
    assert found[1].previous_table_version == found[0].table_version
    for c in found[:2]:
        read = sink.read_commit(c.table_version, c.previous_table_version)
        assert sorted(read.column("offset").to_pylist()) == list(range(c.checkpoint_id * 4, c.checkpoint_id * 4 + 4))
        assert c.records == 4 and c.files == 1
    assert sink.read_commit(found[2].table_version, found[2].previous_table_version).num_rows == 0

"""Issue 44, item 4: a commit whose outcome is unknown never deletes what it wrote, and is checked
by reading the table again. A catalog's answer can be lost after the catalog swapped the table's
metadata (a REST catalog's 5xx is pyiceberg's ``CommitStateUnknownException``; a Glue or Hive
timeout): here pyiceberg's SQL catalog (SQLite, local warehouse) is wrapped so that one commit
lands and then raises that error, or raises it without landing. Delta's OPTIMIZE, whose files
delta-rs writes, is checked too: a failure after its commit deletes nothing. No Kafka, no Spark."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.exceptions import CommitStateUnknownException

from chandy.connectors.lake import iceberg_commits
from chandy.connectors.lake.changes import OP_COLUMN
from chandy.connectors.lake.delta import DeltaLakeSink
from chandy.connectors.lake.iceberg import IcebergSink
from chandy.connectors.lake.sink import LakeCommitError
from chandy.connectors.lake.tables import open_sink

JOB = "fedcba9876543210fedcba9876543210"
URI = "iceberg://local/lake.orders"


def rows(checkpoint: int, n: int = 3) -> pa.Table:
    return pa.table({"topic": ["t"] * n, "partition": pa.array([0] * n, pa.int32()),
                     "offset": pa.array([checkpoint * n + i for i in range(n)], pa.int64())})


def make_sink(tmp_path: Path) -> IcebergSink:
    sink = open_sink(URI, catalog_properties={"warehouse": str(tmp_path / "wh")})
    assert isinstance(sink, IcebergSink)
    return sink


def commit(sink: IcebergSink, checkpoint: int) -> Any:
    files = sink.write_files(rows(checkpoint), job_id=JOB, checkpoint_id=checkpoint, subtask=0, attempt=0)
    return sink.commit(JOB, checkpoint, files, offsets={("t", 0): (checkpoint + 1) * 3})


class LostAnswer:
    """Wraps ``sink``'s catalog so that its next commit lands (``land``) or not, and then raises
    CommitStateUnknownException, as a REST catalog does on a 5xx; later commits are left alone."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, sink: IcebergSink, *, land: bool) -> None:
        self.land = land
        self.calls = 0
        catalog = sink.catalog
        self.real = catalog.commit_table
        monkeypatch.setattr(catalog, "commit_table", self.commit_table)

    def commit_table(self, table: Any, requirements: Any, updates: Any) -> Any:
        self.calls += 1
        if self.calls > 1:
            return self.real(table, requirements, updates)
        if self.land:
            self.real(table, requirements, updates)
        raise CommitStateUnknownException("500 Internal Server Error: the gateway lost the catalog's answer")


def data_files_on_disk(sink: IcebergSink) -> set[str]:
    return {str(p.relative_to(sink.root)) for p in Path(sink.root, "data").rglob("*.parquet")}


def referenced_exist(sink: IcebergSink) -> None:
    """Every data file of every snapshot is on storage, and pyiceberg reads the table."""
    table = sink._load()
    paths = table.inspect.all_data_files().column("file_path").to_pylist()
    missing = [p for p in paths if not Path(sink.root, sink._relative(p)).exists()]
    assert not missing, f"the table references deleted files: {missing}"


def offsets_read(sink: IcebergSink) -> list[int]:
    """The rows as pyiceberg's own scan reads them (a reader other than the sink's)."""
    return sorted(sink._load().scan().to_arrow().column("offset").to_pylist())


@pytest.fixture(autouse=True)
def no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(iceberg_commits, "STATUS_CHECK_WAIT_S", 0.0)


def test_an_optimize_that_landed_before_its_answer_was_lost_deletes_nothing_and_reports_it(tmp_path, monkeypatch):
    sink = make_sink(tmp_path)
    for checkpoint in (1, 2, 3):
        assert commit(sink, checkpoint)
    lost = LostAnswer(monkeypatch, sink, land=True)
    metrics = sink.optimize()
    assert lost.calls == 1
    assert metrics == {"numFilesRemoved": 3, "numFilesAdded": 1, "commitOutcomeChecked": True}
    table = sink._load()
    assert table.current_snapshot().summary.additional_properties["chandy.operation"] == "compaction"
    compacted = [p for p in table.inspect.data_files().column("file_path").to_pylist() if "compacted-" in p]
    assert len(compacted) == 1 and Path(sink.root, sink._relative(compacted[0])).exists()
    referenced_exist(sink)
    assert offsets_read(sink) == list(range(3, 12))
    assert sorted(sink.read_table().column("offset").to_pylist()) == list(range(3, 12))
    assert commit(sink, 4)  # the table goes on
    assert offsets_read(sink) == list(range(3, 15))


def test_an_optimize_that_did_not_land_deletes_its_new_files_and_leaves_the_table_unchanged(tmp_path, monkeypatch):
    sink = make_sink(tmp_path)
    for checkpoint in (1, 2, 3):
        assert commit(sink, checkpoint)
    before = sink._load()
    on_disk = data_files_on_disk(sink)
    LostAnswer(monkeypatch, sink, land=False)
    with pytest.raises(LakeCommitError, match=r"optimizing .* failed \(attempt 1\): 500 Internal Server Error"):
        sink.optimize()
    after = sink._load()
    assert after.current_snapshot().snapshot_id == before.current_snapshot().snapshot_id
    assert after.metadata_location == before.metadata_location
    assert data_files_on_disk(sink) == on_disk  # the compacted file is gone, nothing else
    referenced_exist(sink)
    assert offsets_read(sink) == list(range(3, 12))


def test_an_optimize_whose_outcome_nobody_can_check_keeps_its_files(tmp_path, monkeypatch):
    sink = make_sink(tmp_path)
    for checkpoint in (1, 2, 3):
        assert commit(sink, checkpoint)
    on_disk = data_files_on_disk(sink)
    LostAnswer(monkeypatch, sink, land=True)
    real_load = sink._load
    loads = {"n": 0}

    def load() -> Any:  # the optimize's own read works; every read after the lost answer fails
        loads["n"] += 1
        if loads["n"] > 1:
            raise OSError("catalog unreachable")
        return real_load()

    monkeypatch.setattr(sink, "_load", load)
    with pytest.raises(LakeCommitError, match=r"leaves the outcome unknown, and 3 reads of the table to check it "
                                              r"failed .*catalog unreachable.*may have landed, so what it wrote is kept"):
        sink.optimize()
    monkeypatch.setattr(sink, "_load", real_load)
    added = data_files_on_disk(sink) - on_disk
    assert len(added) == 1 and "compacted-" in next(iter(added))  # kept: the table references it
    referenced_exist(sink)
    assert offsets_read(sink) == list(range(3, 12))


def test_a_checkpoint_commit_that_landed_before_its_answer_was_lost_is_a_success(tmp_path, monkeypatch):
    sink = make_sink(tmp_path)
    assert commit(sink, 1)
    files = sink.write_files(rows(2), job_id=JOB, checkpoint_id=2, subtask=0, attempt=0)
    LostAnswer(monkeypatch, sink, land=True)
    landed = sink.commit(JOB, 2, files, offsets={("t", 0): 9})
    assert landed is not None and landed.checkpoint_id == 2 and landed.files == 1
    assert landed.table_version == sink._load().current_snapshot().snapshot_id
    assert sink.committed_checkpoint(JOB) == 2 and sink.missing_files(files) == []
    referenced_exist(sink)
    assert offsets_read(sink) == list(range(3, 9))


def test_a_checkpoint_commit_that_did_not_land_keeps_its_files_for_the_next_try(tmp_path, monkeypatch):
    sink = make_sink(tmp_path)
    assert commit(sink, 1)
    files = sink.write_files(rows(2), job_id=JOB, checkpoint_id=2, subtask=0, attempt=0)
    LostAnswer(monkeypatch, sink, land=False)
    with pytest.raises(LakeCommitError, match=r"committing checkpoint 2 to .* failed \(attempt 1\): "
                                              r"CommitStateUnknownException"):
        sink.commit(JOB, 2, files, offsets={("t", 0): 9})
    assert sink.committed_checkpoint(JOB) == 1 and sink.missing_files(files) == []
    assert sink.commit(JOB, 2, files, offsets={("t", 0): 9})  # a restart commits it
    assert offsets_read(sink) == list(range(3, 9))


def test_a_change_set_that_landed_before_its_answer_was_lost_is_a_success(tmp_path, monkeypatch):
    """``--cdc``: the change files are deleted only once applied, and they were."""
    sink = make_sink(tmp_path)
    changes = pa.table({"id": pa.array([1, 2], pa.int64()), "name": ["a", "b"], OP_COLUMN: ["c", "c"],
                        "partition": pa.array([0, 0], pa.int32()), "offset": pa.array([0, 1], pa.int64())})
    files = [dataclasses.replace(f, id_columns=("id",)) for f in
             sink.write_files(changes, job_id=JOB, checkpoint_id=1, subtask=0, attempt=0, partitioned=False)]
    assert sink.commit_changes(JOB, 1, files, offsets={("t", 0): 2})  # creates the table
    update = pa.table({"id": pa.array([2], pa.int64()), "name": ["b2"], OP_COLUMN: ["u"],
                       "partition": pa.array([0], pa.int32()), "offset": pa.array([2], pa.int64())})
    files = [dataclasses.replace(f, id_columns=("id",)) for f in
             sink.write_files(update, job_id=JOB, checkpoint_id=2, subtask=0, attempt=0, partitioned=False)]
    LostAnswer(monkeypatch, sink, land=True)
    landed = sink.commit_changes(JOB, 2, files, offsets={("t", 0): 3})
    assert landed is not None and landed.checkpoint_id == 2
    assert sink.committed_checkpoint(JOB) == 2
    assert sink.missing_files(files) == [f.path for f in files]  # applied, so deleted
    referenced_exist(sink)
    assert sorted((r["id"], r["name"]) for r in sink._load().scan().to_arrow().to_pylist()) == [(1, "a"), (2, "b2")]


def test_a_delta_optimize_that_fails_after_its_commit_deletes_nothing(tmp_path, monkeypatch):
    """delta-rs writes the compacted files and commits them; an error after that (a lost answer)
    fails the optimize, and nothing deletes the files the table now references."""
    from deltalake.table import TableOptimizer

    sink = DeltaLakeSink(str(tmp_path / "d"))
    for checkpoint in (1, 2, 3):
        files = sink.write_files(rows(checkpoint), job_id=JOB, checkpoint_id=checkpoint, subtask=0, attempt=0)
        assert sink.commit(JOB, checkpoint, files, offsets={("t", 0): (checkpoint + 1) * 3})
    real = TableOptimizer.compact

    def compact(self: Any, *args: Any, **kwargs: Any) -> Any:
        real(self, *args, **kwargs)
        raise OSError("connection reset by peer after the commit")

    monkeypatch.setattr(TableOptimizer, "compact", compact)
    with pytest.raises(LakeCommitError, match="connection reset"):
        sink.optimize()
    assert len(sink.referenced_files()) == 1 and len(sink.removed_files()) == 3
    assert all(Path(sink.root, p).exists() for p in sink.referenced_files() | sink.removed_files())
    assert sorted(sink.read_table().column("offset").to_pylist()) == list(range(3, 12))
    assert sink.delete_unreferenced(JOB) == []  # the compacted file is not the job's, the removed ones stay

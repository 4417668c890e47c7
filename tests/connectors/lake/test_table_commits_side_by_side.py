"""Issue 57: a checkpoint's routed tables commit side by side (``LakeCommitter(commit_threads=N)``,
the pipeline's ``--commit-threads``), each through its own guarded commit, and ``--table``
commits only once every routed table has. Real Delta tables (delta-rs), no Kafka: the committer
is driven as the coordinator drives it, and each table is read back with deltalake."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from chandy.connectors.lake.committer import LakeCommitter
from chandy.connectors.lake.sink import DataFile, LakeCommitError
from chandy.connectors.lake.tables import open_sink
from chandy.coordinator.storage import CheckpointMetadata, CheckpointStorage, OperatorState, SubtaskState
from tests.fixtures.lake_committer import JOB, CommitterContext

ROUTED = 4


class Watched:
    """A table's sink whose commits are recorded (start and end, monotonic s) and can wait on a
    barrier all routed tables' commits must reach together, or fail."""

    def __init__(self, sink: Any, calls: list[tuple[str, float, float]], barrier: threading.Barrier | None,
                 fail: bool = False) -> None:
        self._sink, self._calls, self._barrier, self._fail = sink, calls, barrier, fail

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        if self._barrier is not None:
            self._barrier.wait(timeout=20)  # broken (BrokenBarrierError) unless every routed commit runs at once
        if self._fail:
            raise LakeCommitError(f"{self._sink.table_uri}: the store refused the commit")
        try:
            return self._sink.commit(*args, **kwargs)
        finally:
            self._calls.append((self._sink.table_uri, started, time.monotonic()))


def rows(start: int, end: int) -> pa.Table:
    return pa.table({"topic": ["t"] * (end - start), "partition": pa.array([0] * (end - start), pa.int32()),
                     "offset": pa.array(range(start, end), pa.int64())})


def write_checkpoint(storage: CheckpointStorage, sinks: list[Any]) -> None:
    """Checkpoint 1's data files (offsets [10 i, 10 i + 10) into the i-th of ``sinks``, each file
    naming its table) and its ``_metadata``, as the tasks and the coordinator leave them."""
    files: list[DataFile] = []
    for i, sink in enumerate(sinks):
        written = sink.write_files(rows(10 * i, 10 * i + 10), job_id=JOB, checkpoint_id=1, subtask=0, attempt=0)
        files += [dataclasses.replace(f, table_uri=sink.table_uri) for f in written]
    storage.write_metadata(storage.initialize_location_for_checkpoint(1), CheckpointMetadata(
        job_id=JOB, checkpoint_id=1, checkpoint_type="CHECKPOINT", trigger_timestamp=1, completion_timestamp=2,
        operator_states=(OperatorState("lake", None, (SubtaskState(0, 0, tuple(f.to_state_handle() for f in files)),)),)))


def run_checkpoint(tmp_path: Path, threads: int, *, barrier: bool, fail: str | None = None
                   ) -> tuple[LakeCommitter, list[tuple[str, float, float]], list[str], Path]:
    """Checkpoint 1 of a job whose records go to ``ROUTED`` routed tables and ``--table``
    (offsets [0, 50) split over them), completed with ``threads`` commit threads."""
    calls: list[tuple[str, float, float]] = []
    wait = threading.Barrier(ROUTED) if barrier else None
    lake = tmp_path / "lake"
    own = Watched(open_sink(str(lake / "all")), calls, None)
    sinks = {sink.table_uri: sink for sink in (open_sink(str(lake / f"r{i}")) for i in range(ROUTED))}
    routed = list(sinks)
    storage = CheckpointStorage(f"file://{tmp_path}/chk", JOB)
    committer = LakeCommitter(CommitterContext(), own, storage, offsets_of=lambda m: {("t", 0): (0, 50)},
                              open_table=lambda uri: Watched(sinks[uri], calls, wait, fail=uri == fail),
                              commit_threads=threads)
    committer.reset_to_checkpoint(-1, None)
    write_checkpoint(storage, [*sinks.values(), own])
    committer.notify_checkpoint_complete(1)
    return committer, calls, routed, lake


def offsets(path: Path) -> list[int]:
    return sorted(DeltaTable(str(path)).to_pyarrow_table().column("offset").to_pylist())


def test_routed_tables_commit_side_by_side_and_the_jobs_table_after_them(tmp_path: Path) -> None:
    committer, calls, routed, lake = run_checkpoint(tmp_path, ROUTED, barrier=True)  # the barrier needs all at once
    assert sorted(uri for uri, _, _ in calls[:-1]) == sorted(routed)
    own_uri, own_started, _ = calls[-1]
    assert own_uri == committer.sink.table_uri
    assert own_started >= max(ended for _, _, ended in calls[:-1])  # --table after every routed table
    for i in range(ROUTED):
        assert offsets(lake / f"r{i}") == list(range(10 * i, 10 * i + 10))
    assert offsets(lake / "all") == list(range(40, 50))
    assert committer.records_committed == 50


def test_one_commit_thread_commits_the_routed_tables_one_after_another_in_uri_order(tmp_path: Path) -> None:
    _, calls, routed, _ = run_checkpoint(tmp_path, 1, barrier=False)
    assert [uri for uri, _, _ in calls[:-1]] == sorted(routed)
    assert all(ended <= started for (_, _, ended), (_, started, _) in zip(calls, calls[1:], strict=False))


def test_a_routed_table_that_fails_fails_the_checkpoint_and_the_jobs_table_is_not_committed(tmp_path: Path) -> None:
    with pytest.raises(LakeCommitError, match="the store refused the commit"):
        run_checkpoint(tmp_path, ROUTED, barrier=False, fail=str(open_sink(str(tmp_path / "lake" / "r2")).table_uri))
    assert not DeltaTable.is_deltatable(str(tmp_path / "lake" / "all"))  # --table not committed: the checkpoint did not land


def test_routed_iceberg_tables_created_side_by_side_in_a_new_namespace_all_land(tmp_path: Path) -> None:
    """Found by CI: two routed tables of one new namespace of pyiceberg's SQL catalog, created
    side by side, raced to create the namespace; the loser's insert failed (IntegrityError) and
    failed the checkpoint. Each table now lands, whoever created the namespace."""
    catalog = {"warehouse": str(tmp_path / "wh")}
    own = open_sink("iceberg://local/shop.all", catalog_properties=catalog)
    sinks = {s.table_uri: s for s in (open_sink(f"iceberg://local/fresh.r{i}", catalog_properties=catalog)
                                      for i in range(ROUTED))}
    storage = CheckpointStorage(f"file://{tmp_path}/chk", JOB)
    committer = LakeCommitter(CommitterContext(), own, storage, offsets_of=lambda m: {("t", 0): (0, 10 * (ROUTED + 1))},
                              open_table=lambda uri: sinks[uri], commit_threads=ROUTED)
    committer.reset_to_checkpoint(-1, None)
    write_checkpoint(storage, [*sinks.values(), own])
    committer.notify_checkpoint_complete(1)
    for i, sink in enumerate(sinks.values()):
        assert sorted(sink.read_table().column("offset").to_pylist()) == list(range(10 * i, 10 * i + 10))

"""Table maintenance on a real Delta table, without Kafka or Spark: compaction racing the
committer's commits keeps every row once and the committer's (job ID, checkpoint ID, offsets)
record; files a compaction removed are left to vacuum (not to the committer's cleanup)."""

from __future__ import annotations

import threading
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from chandy.connectors.lake.delta import DeltaLakeSink
from chandy.connectors.lake.sink import LakeCommitError
from chandy.connectors.lake.tables import open_sink

JOB = "0123456789abcdef0123456789abcdef"


def rows(checkpoint: int, n: int = 5) -> pa.Table:
    return pa.table({"topic": ["t"] * n, "partition": pa.array([0] * n, pa.int32()),
                     "offset": pa.array([checkpoint * n + i for i in range(n)], pa.int64())})


def commit_checkpoints(sink: DeltaLakeSink, first: int, last: int, n: int = 5) -> None:
    for checkpoint in range(first, last + 1):
        files = sink.write_files(rows(checkpoint, n), job_id=JOB, checkpoint_id=checkpoint, subtask=0, attempt=0)
        assert sink.commit(JOB, checkpoint, files, offsets={("t", 0): (checkpoint + 1) * n})


def offsets(sink: DeltaLakeSink) -> list[int]:
    return sorted(sink.read_table().column("offset").to_pylist())


def test_optimize_keeps_rows_and_the_committers_record(tmp_path: Path) -> None:
    sink = open_sink(str(tmp_path / "t"))
    assert isinstance(sink, DeltaLakeSink)
    commit_checkpoints(sink, 1, 6)
    before = offsets(sink)
    metrics = sink.optimize()
    assert metrics["numFilesRemoved"] == 6 and metrics["numFilesAdded"] == 1
    assert len(DeltaTable(str(tmp_path / "t")).file_uris()) == 1
    assert offsets(sink) == before == list(range(5, 35))
    progress = sink.progress(JOB)
    assert progress.checkpoint_id == 6 and progress.offsets == {("t", 0): 35}
    # a repeated commit of a compacted checkpoint is still skipped: its app transaction survived
    assert not sink.commit(JOB, 6, sink.write_files(rows(6), job_id=JOB, checkpoint_id=6, subtask=0, attempt=1),
                           offsets={("t", 0): 35})


def test_cleanup_leaves_compacted_files_to_vacuum(tmp_path: Path) -> None:
    sink = DeltaLakeSink(str(tmp_path / "t"))
    commit_checkpoints(sink, 1, 3)
    sink.optimize()
    orphan = sink.write_files(rows(9), job_id=JOB, checkpoint_id=4, subtask=0, attempt=0)[0].path  # never committed
    compacted = sink.removed_files()
    assert len(compacted) == 3
    deleted = sink.delete_unreferenced(JOB)
    assert deleted == [orphan]  # not the compacted files: older versions still read them
    assert all((tmp_path / "t" / p).exists() for p in compacted)
    assert DeltaTable(str(tmp_path / "t"), version=3).to_pyarrow_table().num_rows == 15  # time travel works
    assert sorted(sink.vacuum(retention_hours=0, dry_run=True)) == sorted(compacted)
    assert all((tmp_path / "t" / p).exists() for p in compacted)  # dry run
    assert sorted(sink.vacuum(retention_hours=0)) == sorted(compacted)
    assert not any((tmp_path / "t" / p).exists() for p in compacted)
    assert offsets(sink) == list(range(5, 20))
    with pytest.raises(LakeCommitError, match="0 hours or more"):
        sink.vacuum(retention_hours=-1)


def test_a_young_compaction_is_not_vacuumed(tmp_path: Path) -> None:
    sink = DeltaLakeSink(str(tmp_path / "t"))
    commit_checkpoints(sink, 1, 3)
    sink.optimize()
    assert sink.vacuum(retention_hours=1) == []
    assert len(sink.removed_files()) == 3


def test_compaction_racing_commits_lands_every_row_once(tmp_path: Path) -> None:
    sink = DeltaLakeSink(str(tmp_path / "t"))
    commit_checkpoints(sink, 1, 1, n=3)
    stop = threading.Event()
    compactions: list[dict] = []
    errors: list[BaseException] = []

    def compact() -> None:
        other = DeltaLakeSink(str(tmp_path / "t"))  # another process would have its own handle
        while not stop.is_set():
            try:
                compactions.append(other.optimize(target_size=1 << 20))
            except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
                errors.append(exc)
                return

    thread = threading.Thread(target=compact)
    thread.start()
    try:
        commit_checkpoints(sink, 2, 40, n=3)
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    assert sum(m["numFilesRemoved"] for m in compactions) > 0, "no compaction happened during the commits"
    landed = offsets(sink)
    assert landed == list(range(3, 123))  # every row once
    assert sink.committed_checkpoint(JOB) == 40
    assert sink.progress(JOB).offsets == {("t", 0): 123}
    history = DeltaTable(str(tmp_path / "t")).history()
    assert {c["operation"] for c in history} >= {"OPTIMIZE"}


def test_two_compactions_at_once_do_not_double_rows(tmp_path: Path) -> None:
    """delta-rs accepts two concurrent OPTIMIZE commits removing the same files (both add their
    compacted copy); the sink serialises them, so each row stays once."""
    sink = DeltaLakeSink(str(tmp_path / "t"))
    commit_checkpoints(sink, 1, 20, n=2)
    results: list[dict] = []
    threads = [threading.Thread(target=lambda: results.append(DeltaLakeSink(str(tmp_path / "t")).optimize()))
               for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 3 and sum(r["numFilesRemoved"] for r in results) == 20
    assert offsets(sink) == list(range(2, 42))


def race_commits(tmp_path: Path, checkpoint: int) -> list[bool]:
    """Two sinks commit ``checkpoint`` (different files, the same rows) at the same moment."""
    sinks = [DeltaLakeSink(str(tmp_path / "t")) for _ in range(2)]
    files = [s.write_files(rows(checkpoint, 3), job_id=JOB, checkpoint_id=checkpoint, subtask=0, attempt=k)
             for k, s in enumerate(sinks)]
    barrier = threading.Barrier(2)
    results: list[bool] = []

    def commit(k: int) -> None:
        barrier.wait()
        results.append(bool(sinks[k].commit(JOB, checkpoint, files[k], offsets={("t", 0): (checkpoint + 1) * 3})))

    threads = [threading.Thread(target=commit, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_two_commits_of_one_checkpoint_at_once_land_it_once(tmp_path: Path) -> None:
    """A fencing failure's worst case: two committers commit the same checkpoint of the same job
    at once. delta-rs refuses the loser (same app transaction); the loser re-reads the table,
    finds the checkpoint landed and stops: its files stay unreferenced, the rows land once."""
    commit_checkpoints(DeltaLakeSink(str(tmp_path / "t")), 1, 1, n=3)
    for checkpoint in range(2, 7):
        # neither raises: the loser either saw the checkpoint landed before committing (False)
        # or lost the race and found it landed on re-reading (True)
        assert sorted(race_commits(tmp_path, checkpoint)) in ([False, True], [True, True])
    sink = DeltaLakeSink(str(tmp_path / "t"))
    assert offsets(sink) == list(range(3, 21))  # every row once
    assert sink.committed_checkpoint(JOB) == 6


def test_the_committer_refuses_a_checkpoint_whose_files_were_cleaned_up(tmp_path: Path) -> None:
    """An intermediate savepoint's files are cleaned up once later checkpoints land its ranges;
    committing it later (a restore from it) must fail with a clear error and leave the table
    readable, never add files that are gone."""
    from chandy.connectors.lake.committer import LakeCommitter
    from chandy.coordinator.storage import CheckpointMetadata, CheckpointStorage, OperatorState, SubtaskState

    class Context:
        job_id, operator_id = JOB, "lake"

        def checkpoint_pointer(self, checkpoint_id: int) -> None:
            return None

        def coordinator_log(self) -> None:
            return None  # a runtime without a coordinator log

    sink = DeltaLakeSink(str(tmp_path / "t"))
    commit_checkpoints(sink, 1, 2)
    storage = CheckpointStorage(f"file://{tmp_path}/chk", JOB)
    files = sink.write_files(rows(3), job_id=JOB, checkpoint_id=3, subtask=0, attempt=0)
    storage.write_metadata(storage.initialize_location_for_checkpoint(3), CheckpointMetadata(
        job_id=JOB, checkpoint_id=3, checkpoint_type="SAVEPOINT", trigger_timestamp=1, completion_timestamp=2,
        operator_states=(OperatorState("lake", None, (SubtaskState(0, 0, tuple(f.to_state_handle() for f in files)),)),)))
    assert sink.delete_unreferenced(JOB) == [f.path for f in files]  # the cleanup of uncommitted files
    committer = LakeCommitter(Context(), sink, storage)
    with pytest.raises(LakeCommitError, match=r"checkpoint 3 references 1 data file\(s\) no longer in table"):
        committer.notify_checkpoint_complete(3)
    assert sink.committed_checkpoint(JOB) == 2 and offsets(sink) == list(range(5, 15))


def test_a_conflict_resolved_by_another_coordinators_commit_is_not_this_writers(tmp_path: Path) -> None:
    """Issue 36: a fenced coordinator whose commit of checkpoint N conflicts with the newer
    coordinator's commit of the same N finds N in the table, but the commit is not its own: it
    reports None (the run summary does not count it). Its own commit that conflicted with a
    compaction and then landed is reported, with its version."""
    uri = str(tmp_path / "t")
    old, new = DeltaLakeSink(uri), DeltaLakeSink(uri)
    commit_checkpoints(old, 1, 1)
    stale = old._open()  # the fenced coordinator read the table before the newer one committed
    commit_checkpoints(new, 2, 2)
    reads = iter([stale])
    old._fresh = lambda: next(reads, None) or DeltaLakeSink._fresh(old)  # type: ignore[method-assign]
    late = old.write_files(rows(2), job_id=JOB, checkpoint_id=2, subtask=0, attempt=1)
    assert old.commit(JOB, 2, late, offsets={("t", 0): 15}) is None
    assert offsets(old) == list(range(5, 15))  # checkpoint 2 once, the newer coordinator's files
    # a conflict with a compaction: this writer's own commit lands on the retry, and it is its own
    stale = old._open()
    new.optimize()
    reads = iter([stale])
    landed = old.commit(JOB, 3, old.write_files(rows(3), job_id=JOB, checkpoint_id=3, subtask=0, attempt=0),
                        offsets={("t", 0): 20})
    # its own commit, at the table's newest version (after the compaction's)
    assert landed is not None and landed.checkpoint_id == 3 and landed.records == 5 and landed.files == 1
    assert landed.table_version == DeltaLakeSink(uri)._open().version() == landed.previous_table_version + 1
    assert offsets(old) == list(range(5, 20))


def test_each_commit_is_found_and_read_back_alone_after_compaction(tmp_path: Path) -> None:
    """Issue 35: the commit of each checkpoint (its version, records, files) is found in the table's
    history, and read_commit gives exactly its rows, also once OPTIMIZE rewrote its files."""
    sink = DeltaLakeSink(str(tmp_path / "t"))
    commit_checkpoints(sink, 1, 4)
    found = sink.commits_after(JOB, 1)
    assert [c.checkpoint_id for c in found] == [2, 3, 4]
    assert [c.table_version for c in found] == [1, 2, 3] and [c.previous_table_version for c in found] == [0, 1, 2]
    assert all(c.records == 5 and c.files == 1 for c in found)
    sink.optimize()
    assert DeltaTable(str(tmp_path / "t")).version() == 4  # the compaction's own version
    for commit in found:
        read = sink.read_commit(commit.table_version, commit.previous_table_version)
        assert sorted(read.column("offset").to_pylist()) == list(range(commit.checkpoint_id * 5,
                                                                       commit.checkpoint_id * 5 + 5))
    first = sink.read_commit(0, None)  # the table's first commit: everything it added
    assert sorted(first.column("offset").to_pylist()) == list(range(5, 10))
    assert sink.commits_after(JOB, 4) == []

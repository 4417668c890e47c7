"""Whose files a cleanup deletes, and when (docs/design.md §7, "Cleanup: whose files, and when"),
on real Delta and Iceberg tables (deltalake; pyiceberg's SQL catalog), without Kafka or Spark:

- a data file's name carries its coordinator log's ID, and a cleanup with a log ID deletes only
  that log's files and files named before log IDs, never another log's (a second ``--prefix`` of
  the same job hands out the same checkpoint IDs: its in-flight files look aborted from here);
- the restore's cleanup waits until the coordinator's start is in its log
  (``context.when_logged``), and never runs when it is not (a fenced coordinator).

Both were found by the commit-protocol simulation (tests/simulation, seeds 119 and 310)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from chandy.connectors.lake.committer import LakeCommitter
from chandy.connectors.lake.delta import DeltaLakeSink
from chandy.connectors.lake.sink import DATA_FILE_NAME, LakeSink, coordinator_log_id
from chandy.connectors.lake.tables import open_sink
from chandy.coordinator.storage import CheckpointStorage
from tests.fixtures.lake_committer import JOB, CommitterContext

TP = ("orders", 0)
OURS, THEIRS = coordinator_log_id("chandy", JOB), coordinator_log_id("chandy-b", JOB)


def rows(checkpoint: int, n: int = 2) -> pa.Table:
    return pa.table({"topic": ["orders"] * n, "partition": pa.array([0] * n, pa.int32()),
                     "offset": pa.array([checkpoint * n + i for i in range(n)], pa.int64())})


def delta(tmp_path: Path) -> LakeSink:
    return DeltaLakeSink(str(tmp_path / "orders"))


def iceberg(tmp_path: Path) -> LakeSink:
    return open_sink("iceberg://local/lake.orders", catalog_properties={"warehouse": str(tmp_path / "wh")})


SINKS = pytest.mark.parametrize("make_sink", [delta, iceberg], ids=["delta", "iceberg"])


def write(sink: LakeSink, checkpoint: int, log_id: str | None) -> str:
    return sink.write_files(rows(checkpoint), job_id=JOB, checkpoint_id=checkpoint, subtask=0, attempt=0,
                            log_id=log_id)[0].path


def on_storage(sink: LakeSink, path: str) -> bool:
    return bool(sink.fs.exists(f"{sink.root}/{path}"))


def test_coordinator_log_ids_tell_prefixes_apart_and_name_files() -> None:
    assert OURS != THEIRS and len(OURS) == 8 and int(OURS, 16) >= 0
    assert coordinator_log_id("chandy", JOB) == OURS  # the same log (a recreated one too) keeps its ID
    assert coordinator_log_id("chandy", JOB[::-1]) != OURS
    named = DATA_FILE_NAME.search("part-chandy-01234567-0000000003-00001-a2-log" + OURS + "-0123456789ab.parquet")
    assert named is not None and named["log"] == OURS and named["checkpoint"] == "0000000003"
    legacy = DATA_FILE_NAME.search("part-chandy-01234567-0000000003-00001-a2-0123456789ab.parquet")
    assert legacy is not None and legacy["log"] is None and legacy["attempt"] == "2"


@SINKS
def test_a_cleanup_deletes_its_own_logs_files_and_legacy_ones_never_another_logs(
        tmp_path: Path, make_sink: Callable[[Path], LakeSink]) -> None:
    sink = make_sink(tmp_path)
    never_committed = write(sink, 1, OURS)  # subtask 0's file of checkpoint 1; subtask 1's is committed
    assert sink.commit(JOB, 1, sink.write_files(rows(1), job_id=JOB, checkpoint_id=1, subtask=1, attempt=0,
                                                log_id=OURS), offsets={TP: 4})
    ours, theirs, legacy = write(sink, 2, OURS), write(sink, 2, THEIRS), write(sink, 2, None)
    assert f"-log{OURS}-" in ours and f"-log{THEIRS}-" in theirs and "-log" not in legacy
    deleted = sink.delete_unreferenced(JOB, keep_checkpoints_after=2, log_id=OURS)
    assert sorted(deleted) == sorted([never_committed, ours, legacy])
    assert on_storage(sink, theirs) and not on_storage(sink, ours) and not on_storage(sink, legacy)
    # without a log ID (a caller that knows none, as before log IDs): every unreferenced file of the job
    assert sink.delete_unreferenced(JOB, keep_checkpoints_after=2) == [theirs]


class HeldContext(CommitterContext):
    """A context whose log has not yet made the coordinator's start durable: ``when_logged``
    actions wait in ``held`` (the test runs them, as the log writer would once its transaction
    commits, or never, as for a fenced coordinator)."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[Callable[[], object]] = []

    def when_logged(self, action: Callable[[], object]) -> None:
        self.held.append(action)


@SINKS
def test_the_restore_cleans_up_only_once_its_start_is_in_the_log(
        tmp_path: Path, make_sink: Callable[[Path], LakeSink]) -> None:
    sink = make_sink(tmp_path)
    assert sink.commit(JOB, 1, sink.write_files(rows(1), job_id=JOB, checkpoint_id=1, subtask=0, attempt=0,
                                                log_id=OURS), offsets={TP: 4})
    aborted = write(sink, 2, OURS)
    storage = CheckpointStorage(f"file://{tmp_path}/chk", JOB)
    context = HeldContext()
    context.newest = 2  # the log handed out 2, and it crashed
    committer = LakeCommitter(context, sink, storage, log_id=OURS)
    committer.reset_to_checkpoint(1, None)  # the table holds 1: nothing to commit, the cleanup waits
    assert on_storage(sink, aborted), "the restore deleted files before its start was in the log"
    assert len(context.held) == 1
    context.held.pop()()  # the start landed: the cleanup runs (on the I/O executor, inline here)
    assert not on_storage(sink, aborted)


@SINKS
def test_a_fenced_coordinators_restore_never_cleans_up(tmp_path: Path, make_sink: Callable[[Path], LakeSink]) -> None:
    """The race the simulation found (seed 310): a coordinator fenced right after its
    ``init_transactions`` replays the log after its successor wrote checkpoint 2 there, so its
    bound covers 2; the successor's file of 2 is in flight. Its start never lands, so it never
    deletes that file, and the successor's commit of 2 references a file that exists."""
    sink = make_sink(tmp_path)
    assert sink.commit(JOB, 1, sink.write_files(rows(1), job_id=JOB, checkpoint_id=1, subtask=0, attempt=0,
                                                log_id=OURS), offsets={TP: 4})
    in_flight = sink.write_files(rows(2), job_id=JOB, checkpoint_id=2, subtask=0, attempt=0, log_id=OURS)
    context = HeldContext()
    context.newest = 2  # its replay saw the successor's trigger of 2
    LakeCommitter(context, sink, CheckpointStorage(f"file://{tmp_path}/chk", JOB), log_id=OURS).reset_to_checkpoint(1, None)
    # fenced: its log writer stops and context.held never runs; the successor commits 2
    assert sink.commit(JOB, 2, in_flight, offsets={TP: 6})
    assert not sink.missing_files(in_flight)
    assert sorted(sink.read_table().column("offset").to_pylist()) == [2, 3, 4, 5]

"""Issue 44, item 3: the lake committer believes the table, not its memory. When the table
already holds checkpoint N (another coordinator of the job committed it: a run that was not
fenced, a zombie, one job under two coordinator logs), its record of N must equal this
committer's ranges of N, else a LakeCommitError names both and nothing is announced (so nothing
reaches the consumer group, notified after the committer). A committer whose memory is behind the
table reads the table again before it commits. Real Delta (delta-rs) and Iceberg (pyiceberg's SQL
catalog) tables, no Kafka."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from chandy.connectors.lake.committer import LakeCommitter
from chandy.connectors.lake.sink import LakeCommitError, LakeSink
from chandy.connectors.lake.tables import open_sink
from chandy.coordinator.storage import CheckpointMetadata, CheckpointStorage, OperatorState, SubtaskState
from tests.fixtures.lake_committer import JOB, CommitterContext

TP0 = ("t", 0)


def rows(start: int, end: int) -> pa.Table:
    n = end - start
    return pa.table({"topic": ["t"] * n, "partition": pa.array([0] * n, pa.int32()),
                     "offset": pa.array(range(start, end), pa.int64())})


class Run:
    """One coordinator of the job: its checkpoint storage (``_metadata`` with its files) and the
    ranges it read per checkpoint, and a committer over the shared table."""

    def __init__(self, tmp_path: Path, name: str, table: str, catalog: dict[str, str]) -> None:
        self.sink = open_sink(table, catalog_properties=catalog)
        self.storage = CheckpointStorage(f"file://{tmp_path}/{name}-chk", JOB)
        self.ranges: dict[int, dict[tuple[str, int], tuple[int, int]]] = {}
        self.context = CommitterContext()
        self.committer = LakeCommitter(self.context, self.sink, self.storage,
                                       offsets_of=lambda m: self.ranges[m.checkpoint_id])

    def complete(self, checkpoint_id: int, start: int, end: int) -> None:
        """Write checkpoint ``checkpoint_id``'s files of offsets [start, end) and its _metadata,
        then notify the committer of its completion."""
        files = self.sink.write_files(rows(start, end), job_id=JOB, checkpoint_id=checkpoint_id, subtask=0, attempt=0)
        self.storage.write_metadata(self.storage.initialize_location_for_checkpoint(checkpoint_id), CheckpointMetadata(
            job_id=JOB, checkpoint_id=checkpoint_id, checkpoint_type="CHECKPOINT", trigger_timestamp=1,
            completion_timestamp=2, operator_states=(OperatorState("lake", None, (SubtaskState(
                0, 0, tuple(f.to_state_handle() for f in files)),)),)))
        self.ranges[checkpoint_id] = {TP0: (start, end)}
        self.committer.notify_checkpoint_complete(checkpoint_id)


def offsets(sink: LakeSink) -> list[int]:
    return sorted(sink.read_table().column("offset").to_pylist())


@pytest.fixture(params=["delta", "iceberg"])
def table(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, str]]:
    if request.param == "delta":
        return str(tmp_path / "t"), {}
    return "iceberg://local/lake.t", {"warehouse": str(tmp_path / "wh")}


def after_one_checkpoint(tmp_path: Path, table: tuple[str, dict[str, str]], first: str, second: str) -> tuple[Run, Run]:
    """Two coordinators of the job over one table: ``first`` committed checkpoint 1 ([0, 5)), and
    ``second`` restored it (its next checkpoint is 2)."""
    uri, catalog = table
    a, b = Run(tmp_path, first, uri, catalog), Run(tmp_path, second, uri, catalog)
    a.committer.reset_to_checkpoint(-1, None)
    a.complete(1, 0, 5)
    b.committer.reset_to_checkpoint(1, None)
    return a, b


def test_a_checkpoint_another_coordinator_committed_with_other_ranges_is_refused(tmp_path, table) -> None:
    uri, catalog = table
    a, b = Run(tmp_path, "a", uri, catalog), Run(tmp_path, "b", uri, catalog)
    a.committer.reset_to_checkpoint(-1, None)
    a.complete(1, 0, 5)
    b.committer.reset_to_checkpoint(-1, None)
    b.complete(2, 5, 12)  # the other coordinator's checkpoint 2: [5, 12)
    published = len(a.context.published)
    with pytest.raises(LakeCommitError, match=r"holds checkpoint 2 of job .* t-0 \[5, 12\), but this "
                                              r"coordinator's checkpoint 2 reads \[5, 10\)"):
        a.complete(2, 5, 10)  # this one's checkpoint 2: [5, 10)
    assert len(a.context.published) == published  # no LAKE_COMMITTED for ranges the table does not hold
    assert offsets(a.sink) == list(range(12))  # every offset once: the other coordinator's commit stands
    # the same ranges under the same ID: the commit is skipped, and that is right
    a2 = Run(tmp_path, "a2", uri, catalog)
    a2.committer.reset_to_checkpoint(-1, None)
    a2.complete(2, 5, 12)
    assert offsets(a2.sink) == list(range(12))


def test_a_checkpoint_another_coordinator_committed_with_the_same_end_from_another_start_is_refused(
        tmp_path, table) -> None:
    """Found by the commit-protocol simulation (family two-logs, seed 1000705): the table's
    checkpoint 3 ends where this coordinator's does, but starts elsewhere (the other coordinator's
    checkpoint 2 ended at 8, this one's at 5): the ends alone agree, the ranges do not, and
    announcing [5, 12) would name offsets the table's checkpoint 3 does not hold."""
    a, b = after_one_checkpoint(tmp_path, table, "a", "b")
    b.complete(2, 5, 8)
    b.complete(3, 8, 12)
    published = len(a.context.published)
    with pytest.raises(LakeCommitError, match=r"holds checkpoint 3 of job .* t-0 \[8, 12\), but this "
                                              r"coordinator's checkpoint 3 reads \[5, 12\)"):
        a.complete(3, 5, 12)
    assert len(a.context.published) == published
    assert offsets(a.sink) == list(range(12))


def test_a_commit_another_coordinator_races_between_the_check_and_the_commit_is_refused(tmp_path, table,
                                                                                       monkeypatch) -> None:
    """Found by the commit-protocol simulation (family two-logs-faults, seed 213): the committer
    checked its ranges against the table, then another coordinator of the job committed, then this
    one committed: its records landed twice. The sink now commits only while the job's newest
    checkpoint in the table is still the one the check read (``checked_at``), and the race fails
    the checkpoint instead."""
    a, b = after_one_checkpoint(tmp_path, table, "a", "b")
    commit = a.sink.commit

    def raced(*args, **kwargs):  # the other coordinator's commit lands between the check and this commit
        b.complete(2, 5, 12)
        return commit(*args, **kwargs)

    monkeypatch.setattr(a.sink, "commit", raced)
    published = len(a.context.published)
    with pytest.raises(LakeCommitError, match=r"another coordinator of job .* committed its checkpoint 2 since this "
                                              r"commit's ranges were checked against the table \(which then held "
                                              r"the job's checkpoint 1\)"):
        a.complete(3, 5, 10)
    assert len(a.context.published) == published
    assert offsets(a.sink) == list(range(12))  # every offset once


def test_a_committer_whose_memory_is_behind_the_table_reads_it_again(tmp_path, table) -> None:
    """A zombie: it committed checkpoint 1, then another coordinator committed 2 and 3. The
    zombie's next checkpoint (4, from its memory at offset 5) would land [5, 9) again: refused,
    because the committer reads the table's offsets again (12), not its own (5)."""
    zombie, newer = after_one_checkpoint(tmp_path, table, "z", "n")
    newer.complete(2, 5, 8)
    newer.complete(3, 8, 12)
    with pytest.raises(LakeCommitError, match=r"would land t-0 offsets \[5, 9\) but table .* already holds that "
                                              r"partition up to offset 12"):
        zombie.complete(4, 5, 9)
    assert offsets(zombie.sink) == list(range(12))


def test_a_slow_restore_never_deletes_a_newer_coordinators_in_flight_files(tmp_path, table) -> None:
    """Issue 44, item 6: the restore's cleanup is bounded by the restored checkpoint (or the
    table's newest): a crashed attempt's file of checkpoint 2 goes, while the in-flight files of
    checkpoint 3 that a newer coordinator of the job wrote meanwhile stay."""
    uri, catalog = table
    old, newer = Run(tmp_path, "old", uri, catalog), Run(tmp_path, "new", uri, catalog)
    old.committer.reset_to_checkpoint(-1, None)
    old.complete(1, 0, 5)
    old.complete(2, 5, 10)
    crashed = old.sink.write_files(rows(5, 10), job_id=JOB, checkpoint_id=2, subtask=0, attempt=1)
    in_flight = newer.sink.write_files(rows(10, 15), job_id=JOB, checkpoint_id=3, subtask=0, attempt=0)
    restoring = Run(tmp_path, "old", uri, catalog)
    restoring.ranges = old.ranges
    restoring.committer.reset_to_checkpoint(2, None)
    assert restoring.sink.missing_files(crashed) == [f.path for f in crashed]  # garbage of checkpoint 2: gone
    assert restoring.sink.missing_files(in_flight) == []  # the newer coordinator's: kept
    assert offsets(restoring.sink) == list(range(10))

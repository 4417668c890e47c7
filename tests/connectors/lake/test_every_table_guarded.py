"""Issue 54: one guarded commit for every table a checkpoint touches. The job's table, each routed
table and each ``--cdc`` merge go through the same read, check, commit-while-unchanged, verify
sequence (``LakeCommitter._commit``), on real Delta (delta-rs) and Iceberg (pyiceberg's SQL
catalog) tables, no Kafka. Each test is a finding of the issue that held on the code before it:
D (routed tables trusted memory), E (``--cdc`` merged without the check-then-commit guard), G
(Iceberg ``--cdc`` called a method that no longer existed on a refused commit) and A (a table's
cleanup deleted a nested routed table's committed files)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pyarrow as pa
import pytest

from chandy.connectors.lake.changes import OP_COLUMN
from chandy.connectors.lake.committer import LakeCommitter
from chandy.connectors.lake.sink import SOURCE_METRICS_KIND, DataFile, LakeCommitError, LakeSink, offsets_to_json
from chandy.connectors.lake.tables import open_sink
from chandy.coordinator.messages import IdlePartition, PartitionEventTime, StateHandle
from chandy.coordinator.storage import CheckpointMetadata, CheckpointStorage, OperatorState, SubtaskState
from tests.fixtures.lake_committer import JOB, CommitterContext

TP0 = ("t", 0)


def rows(start: int, end: int) -> pa.Table:
    n = end - start
    return pa.table({"topic": ["t"] * n, "partition": pa.array([0] * n, pa.int32()),
                     "offset": pa.array(range(start, end), pa.int64())})


def changes(start: int, end: int, name: str, deleted: frozenset[int] = frozenset()) -> pa.Table:
    """Offsets [start, end) as changes of keys ``offset % 4``: each sets its key's name to ``name``
    (or deletes it, for an offset in ``deleted``)."""
    offsets = list(range(start, end))
    return pa.table({"id": pa.array([o % 4 for o in offsets], pa.int64()), "name": [name] * len(offsets),
                     "topic": ["t"] * len(offsets), "partition": pa.array([0] * len(offsets), pa.int32()),
                     "offset": pa.array(offsets, pa.int64()),
                     OP_COLUMN: ["d" if o in deleted else "u" for o in offsets]})


class Run:
    """One coordinator of the job (its own checkpoint storage and ranges) over shared tables:
    the job's ``table`` and, with ``routed``, a routed table every record goes to."""

    def __init__(self, tmp_path: Path, name: str, table: str, catalog: dict[str, str], *, routed: str | None = None,
                 cdc: bool = False) -> None:
        self.sink = open_sink(table, catalog_properties=catalog)
        self.routed = None if routed is None else open_sink(routed, catalog_properties=catalog)
        self.cdc = cdc
        self.storage = CheckpointStorage(f"file://{tmp_path}/{name}-chk", JOB)
        self.ranges: dict[int, dict[tuple[str, int], tuple[int, int]]] = {}
        self.context = CommitterContext()
        self.committer = LakeCommitter(self.context, self.sink, self.storage, changes=cdc,
                                       offsets_of=lambda m: self.ranges[m.checkpoint_id],
                                       open_table=lambda uri: open_sink(uri, catalog_properties=catalog))

    def write(self, checkpoint_id: int, data: pa.Table, route: bool) -> list[DataFile]:
        sink = self.routed if route and self.routed is not None else self.sink
        files = sink.write_files(data, job_id=JOB, checkpoint_id=checkpoint_id, subtask=0, attempt=0)
        if sink is self.routed:
            files = [dataclasses.replace(f, table_uri=self.routed.table_uri) for f in files]
        if self.cdc:
            files = [dataclasses.replace(f, id_columns=("id",)) for f in files]
        return files

    def complete(self, checkpoint_id: int, start: int, end: int, data: pa.Table | None = None, *,
                 route: bool = True) -> None:
        """Write checkpoint ``checkpoint_id``'s files of offsets [start, end) (into the routed
        table, if any, unless not ``route``) and its _metadata, then notify the committer of its
        completion."""
        files = self.write(checkpoint_id, rows(start, end) if data is None else data, route)
        self.storage.write_metadata(self.storage.initialize_location_for_checkpoint(checkpoint_id), CheckpointMetadata(
            job_id=JOB, checkpoint_id=checkpoint_id, checkpoint_type="CHECKPOINT", trigger_timestamp=1,
            completion_timestamp=2, operator_states=(OperatorState("lake", None, (SubtaskState(
                0, 0, tuple(f.to_state_handle() for f in files)),)),)))
        self.ranges[checkpoint_id] = {TP0: (start, end)}
        self.committer.notify_checkpoint_complete(checkpoint_id)


def offsets(sink: LakeSink) -> list[int]:
    return sorted(sink.read_table().column("offset").to_pylist())


def names(sink: LakeSink) -> dict[int, str]:
    table = sink.read_table()
    return dict(zip(table.column("id").to_pylist(), table.column("name").to_pylist(), strict=True))


@pytest.fixture(params=["delta", "iceberg"])
def tables(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str, dict[str, str]]:
    """(the job's table, a routed table, catalog properties) of one format."""
    if request.param == "delta":
        return str(tmp_path / "t"), str(tmp_path / "routed"), {}
    return "iceberg://local/lake.t", "iceberg://local/lake.routed", {"warehouse": str(tmp_path / "wh")}


def test_d_a_routed_table_is_read_again_when_another_coordinator_committed_to_it(tmp_path, tables) -> None:
    """Finding D: a routed table's offsets were read once per run and never again, and routed
    tables were committed before ``--table``. With two coordinators of one job (two coordinator
    logs), the one whose memory of the routed table is behind landed duplicates in it; ``--table``
    refused, but after the routed table held them. Now each table is read again when its job's
    checkpoint moved, and every table is checked before any is committed."""
    uri, routed, catalog = tables
    a = Run(tmp_path, "a", uri, catalog, routed=routed)
    b = Run(tmp_path, "b", uri, catalog, routed=routed)
    a.committer.reset_to_checkpoint(-1, None)
    a.complete(1, 0, 5, route=False)  # into --table
    b.committer.reset_to_checkpoint(1, None)
    b.complete(2, 5, 8)  # b reads the routed table (none yet) and commits to it
    a.complete(3, 8, 12)  # the other coordinator: the routed table now holds up to 12
    assert b.routed is not None
    published = len(b.context.published)
    with pytest.raises(LakeCommitError, match=r"would land t-0 offsets \[8, 11\) but table \S*routed already holds "
                                              r"that partition up to offset 12: refusing to duplicate"):
        b.complete(4, 8, 11)  # b's memory of the routed table says 8
    assert offsets(b.routed) == list(range(5, 12))  # every offset once: nothing landed in the routed table
    assert len(b.context.published) == published  # and nothing was announced


def test_e_a_merge_another_coordinator_races_between_the_check_and_the_merge_is_refused(
        tmp_path, tables, monkeypatch) -> None:
    """Finding E: ``commit_changes`` had no ``checked_at``: a coordinator that checked its ranges
    against the table, then lost the race to another coordinator of the job, merged its (older)
    changes over the newer ones and moved the recorded offsets back. Now the merge goes on only
    while the table holds what the check read."""
    uri, _, catalog = tables
    a, b = Run(tmp_path, "a", uri, catalog, cdc=True), Run(tmp_path, "b", uri, catalog, cdc=True)
    a.committer.reset_to_checkpoint(-1, None)
    a.complete(1, 0, 4, changes(0, 4, "first"))
    b.committer.reset_to_checkpoint(1, None)
    merge = a.sink.commit_changes

    def raced(*args, **kwargs):  # the other coordinator merges between this one's check and its merge
        b.complete(2, 4, 10, changes(4, 10, "newer", deleted=frozenset({9})))
        return merge(*args, **kwargs)

    monkeypatch.setattr(a.sink, "commit_changes", raced)
    with pytest.raises(LakeCommitError, match=r"another coordinator of job .* committed its checkpoint 2 since this "
                                              r"commit's ranges were checked"):
        a.complete(3, 4, 7, changes(4, 7, "stale"))
    assert names(a.sink) == {0: "newer", 2: "newer", 3: "newer"}  # key 1 deleted at offset 9 stays deleted
    assert a.sink.progress(JOB).offsets == {TP0: 10}  # not moved back to 7


def test_e_a_stale_coordinators_merge_is_refused_by_the_fresh_read(tmp_path, tables) -> None:
    """Finding E, without a race: a coordinator whose memory is behind the table (the other one
    merged checkpoints 2 and 3) reads the table again and refuses its stale changes."""
    uri, _, catalog = tables
    a, b = Run(tmp_path, "a", uri, catalog, cdc=True), Run(tmp_path, "b", uri, catalog, cdc=True)
    a.committer.reset_to_checkpoint(-1, None)
    a.complete(1, 0, 4, changes(0, 4, "first"))
    b.committer.reset_to_checkpoint(1, None)
    b.complete(2, 4, 8, changes(4, 8, "second"))
    b.complete(3, 8, 10, changes(8, 10, "third", deleted=frozenset({9})))
    with pytest.raises(LakeCommitError, match=r"would land t-0 offsets \[4, 7\) but table .* already holds that "
                                              r"partition up to offset 10"):
        a.complete(4, 4, 7, changes(4, 7, "stale"))
    assert names(a.sink) == {0: "third", 2: "second", 3: "second"}
    assert a.sink.progress(JOB).offsets == {TP0: 10}


def test_g_an_iceberg_merge_refused_by_the_catalog_is_retried(tmp_path, monkeypatch) -> None:
    """Finding G: the Iceberg ``--cdc`` path called ``sink._commit_failure``, moved to a module
    function: a commit the catalog refused (a lost race, for example with ``--optimize-every``)
    raised AttributeError and restarted the job instead of retrying the commit."""
    from pyiceberg.exceptions import CommitFailedException
    from pyiceberg.table import Transaction

    run = Run(tmp_path, "a", "iceberg://local/lake.t", {"warehouse": str(tmp_path / "wh")}, cdc=True)
    run.committer.reset_to_checkpoint(-1, None)
    run.complete(1, 0, 4, changes(0, 4, "first"))
    commit_transaction = Transaction.commit_transaction
    refused: list[int] = []

    def refuse_once(self):
        if not refused:
            refused.append(1)
            raise CommitFailedException("Requirement failed: branch main has changed")  # the catalog's compare-and-swap
        return commit_transaction(self)

    monkeypatch.setattr(Transaction, "commit_transaction", refuse_once)
    run.complete(2, 4, 8, changes(4, 8, "second", deleted=frozenset({5})))
    assert refused == [1]
    assert names(run.sink) == {0: "second", 2: "second", 3: "second"}
    assert run.sink.progress(JOB).offsets == {TP0: 8}


def test_a_a_tables_cleanup_never_lists_a_table_nested_in_its_directory(tmp_path) -> None:
    """Finding A: the cleanup descended into every directory whose name holds ``=``, so the job
    table's cleanup (at every abort and restart) listed the files of a routed table at
    ``lake/events/region=eu`` (same job, same log) as its own, found them unreferenced by the job's
    table and deleted them: the routed table then referenced missing files. A directory holding
    ``_delta_log/`` or ``metadata/`` is another table's root, and no cleanup lists it."""
    outer, inner = open_sink(str(tmp_path / "events")), open_sink(str(tmp_path / "events" / "region=eu"))
    assert outer.commit(JOB, 1, outer.write_files(rows(0, 3), job_id=JOB, checkpoint_id=1, subtask=0, attempt=0),
                        offsets={TP0: 3})
    assert inner.commit(JOB, 1, inner.write_files(rows(3, 6), job_id=JOB, checkpoint_id=1, subtask=0, attempt=0),
                        offsets={TP0: 6})
    orphan = outer.write_files(rows(6, 9), job_id=JOB, checkpoint_id=2, subtask=0, attempt=0)  # an aborted checkpoint's
    deleted = outer.delete_unreferenced(JOB, keep_checkpoints_after=2)
    assert deleted == [f.path for f in orphan]  # its own orphan, and nothing of the nested table
    assert offsets(inner) == [3, 4, 5]  # the nested table still reads
    assert offsets(outer) == [0, 1, 2]


def test_a_a_routed_table_nested_in_another_tables_directory_is_refused(tmp_path) -> None:
    """Finding A, at the source: a routed table nested in ``--table``'s directory is refused at
    start when the rule's fixed part says so, and by the committer (every path opens a routed
    table there) before anything of the checkpoint is committed."""
    from chandy.connectors.lake.sink import LakeLayoutError
    from chandy.connectors.spark.options import PipelineError, PipelineOptions

    base = dict(bootstrap_servers="k:1", topics=("a",), value_format="json", route_field="region")
    with pytest.raises(PipelineError, match=r"--route table .*events/\$1 lies inside the directory of --table "
                                            r"file://\S*/events for every record"):
        PipelineOptions(table_uri=str(tmp_path / "events"), routes=(f"([a-z]+)={tmp_path}/events/$1",), **base)
    PipelineOptions(table_uri=str(tmp_path / "events"), routes=(f"([a-z]+)={tmp_path}/by_region/$1",), **base)  # beside
    run = Run(tmp_path, "a", str(tmp_path / "events"), {}, routed=str(tmp_path / "events" / "eu"))
    run.committer.reset_to_checkpoint(-1, None)
    with pytest.raises(LakeLayoutError, match=r"table file://\S*/events/eu lies inside the directory of table "
                                              r"file://\S*/events: one job's tables must not nest"):
        run.complete(1, 0, 5)
    assert run.routed is not None and not run.routed.exists() and not run.sink.exists()  # nothing committed


def metrics_handle(times: dict[tuple[str, int], int]) -> StateHandle:
    """A task's ``source-metrics`` handle naming the newest timestamp it read per partition."""
    return StateHandle(SOURCE_METRICS_KIND, None, None, 0, {
        "event_time_ms": str(max(times.values())), "fetch_time_ms": str(max(times.values()) + 5),
        "partition_event_time_ms": offsets_to_json(times)})


def complete_two_partitions(run: Run, checkpoint_id: int, ranges: dict[tuple[str, int], tuple[int, int]],
                            times: dict[tuple[str, int], int]) -> dict:
    """Checkpoint ``checkpoint_id`` of a job assigned t-0 and t-1 (``ranges``: one each, empty or
    not), whose task read ``times``; returns its LAKE_COMMITTED event's fields."""
    start, end = ranges[TP0]
    files = run.write(checkpoint_id, rows(start, end), False)
    run.storage.write_metadata(run.storage.initialize_location_for_checkpoint(checkpoint_id), CheckpointMetadata(
        job_id=JOB, checkpoint_id=checkpoint_id, checkpoint_type="CHECKPOINT", trigger_timestamp=1,
        completion_timestamp=2, operator_states=(OperatorState("lake", None, (SubtaskState(
            0, 0, (*(f.to_state_handle() for f in files), metrics_handle(times))),)),)))
    run.ranges[checkpoint_id] = ranges
    run.committer.notify_checkpoint_complete(checkpoint_id)
    (_, event, fields), = [p for p in run.context.published if p[0] == checkpoint_id]
    assert event == "LAKE_COMMITTED"
    return fields


def test_f_a_partition_never_read_holds_the_watermark_back_until_idle(tmp_path, tables) -> None:
    """Finding F: ``valid_through_ms`` was the minimum over the partitions some task had read, so a
    partition idle since the start (or skipped by ``--starting-offsets latest``, or added later)
    held nothing back and a downstream job closed an hour its records still belong to. Every
    assigned partition now holds it back until read, as a Flink watermark without idleness does;
    ``--source-idle-timeout`` (Flink's ``withIdleness``) lets an idle one stop holding it back, and
    the event names it."""
    uri, _, catalog = tables
    t1 = ("t", 1)
    run = Run(tmp_path, "a", uri, catalog)
    run.committer.reset_to_checkpoint(-1, None)
    fields = complete_two_partitions(run, 1, {TP0: (0, 4), t1: (0, 0)}, {TP0: 1_000})
    assert fields["valid_through_ms"] is None  # t-1 is assigned and unread: no watermark yet
    assert fields["event_times"] == (PartitionEventTime("t", 0, 1_000),)
    assert "idle_partitions" not in fields
    assert run.sink.commits_after(JOB, 0)[-1].valid_through_ms is None  # nor in the table
    fields = complete_two_partitions(run, 2, {TP0: (4, 8), t1: (0, 3)}, {TP0: 2_000, t1: 1_500})
    assert fields["valid_through_ms"] == 1_500  # both read: their minimum
    assert run.sink.commits_after(JOB, 1)[-1].valid_through_ms == 1_500

    idle = Run(tmp_path, "b", "iceberg://local/lake.u" if uri.startswith("iceberg://") else f"{uri}-u", catalog)
    idle.committer = LakeCommitter(idle.context, idle.sink, idle.storage, offsets_of=lambda m: idle.ranges[m.checkpoint_id],
                                   source_idle_timeout_ms=50)
    idle.committer.reset_to_checkpoint(-1, None)
    fields = complete_two_partitions(idle, 1, {TP0: (0, 4), t1: (0, 0)}, {TP0: 1_000})
    assert fields["valid_through_ms"] is None and fields["idle_partitions"] == ()  # not idle for 50 ms yet
    time.sleep(0.1)
    fields = complete_two_partitions(idle, 2, {TP0: (4, 8), t1: (0, 0)}, {TP0: 2_000})
    assert fields["valid_through_ms"] == 2_000 and fields["idle_partitions"] == (IdlePartition("t", 1),)
    assert idle.sink.commits_after(JOB, 1)[-1].valid_through_ms == 2_000
    time.sleep(0.1)  # both idle now: the minimum over those read, t-0's
    fields = complete_two_partitions(idle, 3, {TP0: (8, 8), t1: (0, 0)}, {TP0: 2_000})
    assert fields["valid_through_ms"] == 2_000
    assert fields["idle_partitions"] == (IdlePartition("t", 0), IdlePartition("t", 1))


def test_c_the_jobs_offsets_outlive_deltas_log_cleanup(tmp_path) -> None:
    """Finding C: the offsets lived only in ``commitInfo``, which Delta's checkpoints do not keep.
    Once the log cleanup (``delta.logRetentionDuration``) removed the job's last commit,
    ``progress()`` returned the checkpoint without offsets, and a restart raised
    LakeDivergenceError ("holds t-0 only up to offset None"), which suppresses restarts: the job
    was FAILED for good. Each commit now also records its offsets (and watermark times) as app
    transactions, which every Delta checkpoint keeps; a restart after the job's commit left the
    log restores exactly. Read back through delta-rs, a reader Chandy does not write with."""
    from deltalake import DeltaTable

    uri = str(tmp_path / "t")
    first = Run(tmp_path, "a", uri, {})
    first.sink = first.committer.sink = open_sink(uri, table_properties={"delta.logRetentionDuration": "interval 0 seconds"})
    first.committer.reset_to_checkpoint(-1, None)
    first.complete(1, 0, 5)
    other = open_sink(uri)  # another job's commits, then Delta's checkpoint and log cleanup
    for checkpoint in (1, 2):
        files = other.write_files(rows(0, 2).set_column(0, "topic", pa.array(["u"] * 2)), job_id="f" * 32,
                                  checkpoint_id=checkpoint, subtask=0, attempt=0)
        assert other.commit("f" * 32, checkpoint, files, offsets={("u", 0): 2 * checkpoint})
    table = DeltaTable(uri)
    table.create_checkpoint()
    time.sleep(0.05)
    table.cleanup_metadata()
    assert all(entry.get("chandy.job_id") != JOB for entry in DeltaTable(uri).history())  # the job's commit is gone
    assert DeltaTable(uri).transaction_version(f"chandy/{JOB}/offset/t/0") == 5  # Delta's own reader sees the txn
    assert open_sink(uri).progress(JOB, [TP0]).offsets == {TP0: 5}
    restart = Run(tmp_path, "a", uri, {})
    restart.ranges = first.ranges
    restart.committer.reset_to_checkpoint(1, None)  # the table holds 1: skipped, its ranges checked
    restart.complete(2, 5, 9)
    landed = restart.sink.read_table()
    assert sorted(o for t, o in zip(landed.column("topic").to_pylist(), landed.column("offset").to_pylist(), strict=True)
                  if t == "t") == list(range(9))  # every offset of t-0 once
    with pytest.raises(LakeCommitError, match=r"would land t-0 offsets \[7, 9\) but table .* already holds that "
                                              r"partition up to offset 9"):
        restart.complete(3, 7, 9)  # and a range it holds is still refused


def test_a_later_checkpoint_that_lands_between_the_check_and_the_commit_must_hold_the_ranges(
        tmp_path, tables, monkeypatch) -> None:
    """Found by the commit-protocol simulation (family routed-two-logs-faults, seed 956), on every
    path: another coordinator log's checkpoint 3 landed between this coordinator's check and its
    commit of 2; the commit then found the table past 2 and skipped, and the verification looked
    only for a commit of 2 (there is none), so 2 counted as landed and its ends ([5, 12), past the
    table's 10) reached the consumer group. The verification now checks the ranges against the
    table as it is (step 2 again): 2 is refused, and nothing is announced."""
    uri, _, catalog = tables
    a, b = Run(tmp_path, "a", uri, catalog), Run(tmp_path, "b", uri, catalog)
    a.committer.reset_to_checkpoint(-1, None)
    a.complete(1, 0, 5)
    b.committer.reset_to_checkpoint(1, None)
    commit = a.sink.commit

    def raced(*args, **kwargs):
        b.complete(3, 5, 10)  # the other log's IDs run ahead of this one's
        return commit(*args, **kwargs)

    monkeypatch.setattr(a.sink, "commit", raced)
    published = len(a.context.published)
    with pytest.raises(LakeCommitError, match=r"holds checkpoint 3 of job .*, so checkpoint 2 would be skipped, but "
                                              r"the table holds t-0 only up to offset 10 and checkpoint 2 reads up to 12"):
        a.complete(2, 5, 12)
    assert len(a.context.published) == published
    assert offsets(a.sink) == list(range(10))


def test_a_the_layouts_of_many_routed_tables_refuse_every_nesting_either_way() -> None:
    """Finding A's check over a job's tables by parent directory (issue 57: pairwise, 1,000 routed
    tables cost half a million comparisons): a table inside another's directory is refused, so is
    one that holds another, whichever came first; a sibling sharing a name's prefix is not nested."""
    from chandy.connectors.lake.uri import TableLayouts, TableUriError

    layouts = TableLayouts("file:///lake/events")
    for uri in ("file:///lake/events2", "file:///lake/by/eu", "file:///lake/by/us", "file:///lake/by/eu",
                "s3://bucket/lake/events/eu", "iceberg://cat/lake.events"):
        layouts.add(uri)  # beside, the same table again, another store, a catalog's table: taken
    for new, inner, outer in (("file:///lake/events/eu", "file:///lake/events/eu", "file:///lake/events"),
                              ("file:///lake/by/eu/x/y", "file:///lake/by/eu/x/y", "file:///lake/by/eu"),
                              ("file:///lake/by", "file:///lake/by/eu", "file:///lake/by"),
                              ("s3://bucket/lake", "s3://bucket/lake/events/eu", "s3://bucket/lake")):
        with pytest.raises(TableUriError, match=f"^table {inner} lies inside the directory of table {outer}:"):
            layouts.add(new)
    layouts.add("file:///lake/by2/eu")  # a refused table was not taken: its neighbours still are

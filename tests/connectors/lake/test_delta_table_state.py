"""Issue 57: the Delta sink keeps its table object between commits (``update_incremental``
instead of opening the table again) and remembers the app transaction versions of the version it
read. These tests check that what it answers is still what a new ``DeltaTable`` reads, whoever
else committed meanwhile, and that a deleted table is seen as gone."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from chandy.connectors.lake.delta import DeltaLakeSink, progress_app_id

JOB = "0123456789abcdef0123456789abcdef"
TP0, TP1 = ("t", 0), ("t", 1)


def rows(checkpoint: int, n: int = 5) -> pa.Table:
    return pa.table({"id": pa.array(range(checkpoint * n, (checkpoint + 1) * n), pa.int64())})


def commit(sink: DeltaLakeSink, checkpoint: int, offsets: dict) -> None:
    files = sink.write_files(rows(checkpoint), job_id=JOB, checkpoint_id=checkpoint, subtask=0, attempt=0)
    assert sink.commit(JOB, checkpoint, files, offsets=offsets) is not None


def recorded(uri: str, tp: tuple[str, int]) -> int | None:
    """The offset app transaction of ``tp``, read by a new delta-rs table object."""
    return DeltaTable(uri).transaction_version(progress_app_id(JOB, "offset", tp))


def test_the_app_transactions_carried_over_own_commits_equal_what_the_table_holds(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    sink = DeltaLakeSink(uri)
    commit(sink, 1, {TP0: 10, TP1: 5})
    commit(sink, 2, {TP0: 20, TP1: 5})  # TP1 unchanged: no new transaction for it
    commit(sink, 3, {TP0: 30, TP1: 7})
    assert (recorded(uri, TP0), recorded(uri, TP1)) == (30, 7)
    assert DeltaTable(uri).transaction_version(JOB) == sink.committed_checkpoint(JOB) == 3
    # the second commit (version 1) read TP1 from what the first wrote: it recorded nothing for it
    txns = [json.loads(line)["txn"]["appId"] for line in (tmp_path / "t" / "_delta_log" / f"{1:020d}.json").open()
            if "txn" in json.loads(line)]
    assert sorted(txns) == sorted([JOB, progress_app_id(JOB, "offset", TP0)])


def test_another_writers_commit_between_two_of_this_sinks_is_read(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    sink, other = DeltaLakeSink(uri), DeltaLakeSink(uri)
    commit(sink, 1, {TP0: 10})
    assert sink.committed_checkpoint(JOB) == 1
    commit(other, 2, {TP0: 20})  # another coordinator of the job
    assert sink.committed_checkpoint(JOB) == 2  # not the 1 this sink remembers
    # its next commit records TP0 again: the value the table holds (20) is not the one it wrote (10)
    commit(sink, 3, {TP0: 20, TP1: 4})
    assert (recorded(uri, TP0), recorded(uri, TP1)) == (20, 4)
    commit(other, 4, {TP0: 10, TP1: 4})  # moves TP0 back in the table's record
    commit(sink, 5, {TP0: 20, TP1: 4})
    assert recorded(uri, TP0) == 20  # read at version 4, not remembered from version 3


def test_a_deleted_table_is_gone_and_a_new_one_starts_from_nothing(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    sink = DeltaLakeSink(uri)
    commit(sink, 1, {TP0: 10})
    commit(sink, 2, {TP0: 20})
    shutil.rmtree(tmp_path / "t")
    assert sink.committed_checkpoint(JOB) is None
    commit(sink, 3, {TP0: 30})
    table = DeltaTable(uri)
    assert table.version() == 0 and table.transaction_version(JOB) == 3 and recorded(uri, TP0) == 30
    assert sorted(table.to_pyarrow_table().column("id").to_pylist()) == list(range(15, 20))


def test_a_table_another_writer_creates_after_this_sink_found_none_is_read(tmp_path: Path) -> None:
    """The sink answers "no table" from a missing ``_delta_log`` without delta-rs until it found
    the table once: a table created by another writer afterwards is read, not taken for absent."""
    uri = str(tmp_path / "t")
    sink, other = DeltaLakeSink(uri), DeltaLakeSink(uri)
    assert sink.table_fields() is None and sink.committed_checkpoint(JOB) is None
    commit(other, 1, {TP0: 10})
    assert sink.table_fields() == {"id": "long"}
    assert sink.committed_checkpoint(JOB) == 1
    assert sink.progress(JOB, [TP0]).offsets == {TP0: 10}


def test_a_commit_of_another_writer_right_after_this_sinks_read_is_read(tmp_path: Path) -> None:
    """The kept table object skips delta-rs's listing when the log has no file of the version
    after it; a commit of another writer made right after this sink read the table (no commit of
    its own between) is that file, and is read."""
    uri = str(tmp_path / "t")
    sink, other = DeltaLakeSink(uri), DeltaLakeSink(uri)
    commit(sink, 1, {TP0: 10})
    assert sink.committed_checkpoint(JOB) == 1
    assert sink.committed_checkpoint(JOB) == 1  # read again with nothing new: the same answer
    commit(other, 2, {TP0: 20})
    assert sink.committed_checkpoint(JOB) == 2
    assert sink.commit(JOB, 2, [], offsets={TP0: 20}) is None  # held already: skipped
    commit(sink, 3, {TP0: 30})
    assert DeltaTable(uri).transaction_version(JOB) == 3 and recorded(uri, TP0) == 30


def test_known_fields_are_the_committers_last_read_and_cost_no_read(tmp_path: Path) -> None:
    """What the driver hands a routed job's tasks (``TaskOptions.routed_table_fields``): the
    columns of the table as the committer's reads last saw them; none before its first read."""
    uri = str(tmp_path / "t")
    sink = DeltaLakeSink(uri)
    assert sink.known_fields() is None
    commit(sink, 1, {TP0: 10})  # creates the table: no read of it kept yet
    assert sink.known_fields() is None
    assert sink.committed_checkpoint(JOB) == 1
    assert sink.known_fields() == {"id": "long"}
    wider = DeltaLakeSink(uri, add_columns=True)  # another writer adds a column
    files = wider.write_files(pa.table({"id": pa.array([7], pa.int64()), "note": ["n"]}), job_id=JOB,
                              checkpoint_id=2, subtask=0, attempt=0)
    assert wider.commit(JOB, 2, files) is not None
    assert sink.known_fields() == {"id": "long"}  # no read since: what the last one saw
    assert sink.committed_checkpoint(JOB) == 2
    assert sink.known_fields() == {"id": "long", "note": "string"}
    evolving = DeltaLakeSink(uri, add_columns=True)  # a committer with schema evolution
    assert evolving.committed_checkpoint(JOB) == 2
    files = evolving.write_files(pa.table({"id": pa.array([8], pa.int64()), "note": ["m"], "extra": [1.5]}),
                                 job_id=JOB, checkpoint_id=3, subtask=0, attempt=0)
    assert evolving.commit(JOB, 3, files) is not None
    # the column its own commit added is known without another read
    assert evolving.known_fields() == {"id": "long", "note": "string", "extra": "double"}


def test_a_routed_tables_columns_sent_by_the_driver_are_what_its_tasks_use(tmp_path: Path) -> None:
    """A task takes a routed table's columns from ``routed_table_fields`` (no open of the table);
    a routed table the driver did not name is read by the task."""
    from chandy.connectors.spark.task.options import TaskOptions
    from chandy.connectors.spark.task.tables import RoutedTables

    known, unknown = str(tmp_path / "known"), str(tmp_path / "unknown")
    commit(DeltaLakeSink(unknown), 1, {TP0: 5})
    options = TaskOptions(table_uri=str(tmp_path / "job"), job_id=JOB, checkpoint_id=2, epoch=1, operator_id="lake-sink",
                          bootstrap_servers="unused:9092", prefix="chandy", checkpoint_dir=str(tmp_path / "cp"),
                          routed_table_fields={DeltaLakeSink(known).table_uri: {"id": "long", "v": "string"}})
    tables = RoutedTables(options)
    assert tables.fields_of_table(known) == {"id": "long", "v": "string"}  # the table does not even exist
    assert tables.fields_of_table(unknown) == {"id": "long"}

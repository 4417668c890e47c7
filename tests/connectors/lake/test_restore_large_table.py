"""Issue 44, item 7: a restore on a large Delta table completes, and its cleanup deletes exactly
the job's unreferenced files. The table's files are hard links of a few tiny Parquet files, added
in commits of 10,000 (deltalake's write transactions), so 100,000 of them take seconds to make;
the restore is the lake committer's ``reset_to_checkpoint``: it commits the restored checkpoint
(the table lacks it) and deletes the files no version references. No Kafka, no Spark.

``pytest tests/connectors/lake/test_restore_large_table.py -s`` prints the restore's time."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, Schema
from deltalake.transaction import AddAction, CommitProperties, Transaction, create_table_with_add_actions

from chandy.connectors.lake.committer import LakeCommitter
from chandy.connectors.lake.delta import DeltaLakeSink
from chandy.coordinator.storage import CheckpointMetadata, CheckpointStorage, OperatorState, SubtaskState
from tests.fixtures.lake_committer import JOB, CommitterContext

OTHER_JOB = "fedcba9876543210fedcba9876543210"
TP0 = ("t", 0)
PER_COMMIT = 10_000
PARTITIONS = 10  # ext4 allows 65,000 links of one file: one seed file per partition


def name(job: str, checkpoint: int, subtask: int, attempt: int = 0) -> str:
    """A data file's name, as the sinks name them (``DATA_FILE_NAME``)."""
    return f"part-chandy-{job[:8]}-{checkpoint:010d}-{subtask:05d}-a{attempt}-{uuid.uuid4().hex[:12]}.parquet"


class LargeTable:
    """A Delta table partitioned by ``p`` whose job ``JOB`` committed checkpoints 1 to ``committed``
    (``files`` files in all), then checkpoint ``compacted`` (4 files in partition ``p=c``, which an
    OPTIMIZE then compacted: the job's files that only older versions reference); checkpoint
    ``restored`` is complete (its ``_metadata`` lists 2 files written by attempt 1 of its tasks)
    but not committed; and these files no version references: the job's ``unreferenced`` (an
    aborted checkpoint's, and attempt 0 of ``restored``'s tasks) and ``foreign`` ones (another
    job's, and a file Chandy did not name), which a cleanup of the job must keep."""

    def __init__(self, root: Path, files: int) -> None:
        self.root = root
        root.mkdir(parents=True)
        seeds = []
        for p in range(PARTITIONS):
            seeds.append(root / f"_seed{p}.parquet")
            pq.write_table(pa.table({"offset": pa.array([p], pa.int64())}), seeds[-1])
        size = seeds[0].stat().st_size
        schema = Schema.from_arrow(pa.schema([("offset", pa.int64()), ("p", pa.string())]))
        self.committed = (files + PER_COMMIT - 1) // PER_COMMIT
        for p in range(PARTITIONS):
            (root / f"p={p}").mkdir()
        landed = 0
        for checkpoint in range(1, self.committed + 1):
            actions = []
            for i in range(min(PER_COMMIT, files - landed)):
                p = i % PARTITIONS
                relative = f"p={p}/{name(JOB, checkpoint, i % 100_000)}"
                os.link(seeds[p], root / relative)
                actions.append(AddAction(relative, size, {"p": str(p)}, 1_700_000_000_000, True,
                                         json.dumps({"numRecords": 1})))
            landed += len(actions)
            self._commit(checkpoint, actions, schema, landed)
        for seed in seeds:
            seed.unlink()
        self.offset = landed
        # checkpoint `compacted`: 4 files in p=c, then compacted into one (an OPTIMIZE's file)
        self.compacted = self.committed + 1
        (root / "p=c").mkdir()
        actions = []
        for subtask in range(4):
            relative = f"p=c/{name(JOB, self.compacted, subtask)}"
            pq.write_table(pa.table({"offset": pa.array([self.offset + subtask], pa.int64())}), root / relative)
            actions.append(AddAction(relative, (root / relative).stat().st_size, {"p": "c"}, 1_700_000_000_000, True,
                                     json.dumps({"numRecords": 1})))
        self.offset += 4
        self._commit(self.compacted, actions, schema, self.offset)
        self.tombstoned = sorted(a.path for a in actions)
        metrics = DeltaTable(str(root)).optimize.compact(partition_filters=[("p", "=", "c")])
        assert metrics["numFilesRemoved"] == 4, metrics
        self.restored = self.compacted + 1
        self.unreferenced: list[str] = []
        self.foreign: list[str] = []

    def _commit(self, checkpoint: int, actions: list[AddAction], schema: Schema, end: int) -> None:
        properties = CommitProperties(app_transactions=[Transaction(JOB, checkpoint)], custom_metadata={
            "chandy.job_id": JOB, "chandy.checkpoint_id": str(checkpoint), "chandy.offsets": json.dumps({"t": {"0": end}})})
        if checkpoint == 1:
            create_table_with_add_actions(str(self.root), schema, actions, mode="error", partition_by=["p"],
                                          commit_properties=properties)
        else:
            DeltaTable(str(self.root)).create_write_transaction(actions, mode="append", schema=schema, partition_by=["p"],
                                                                commit_properties=properties)

    def write(self, relative: str, offset: int) -> str:
        (self.root / relative).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"offset": pa.array([offset], pa.int64())}), self.root / relative)
        return relative

    def leftovers(self, sink: DeltaLakeSink, storage: CheckpointStorage) -> None:
        """The restored checkpoint's files and _metadata, and the files no version references."""
        files = []
        for subtask in range(2):
            files.extend(sink.write_files(pa.table({"offset": pa.array([self.offset + subtask], pa.int64()),
                                                    "p": ["r"]}), job_id=JOB, checkpoint_id=self.restored,
                                          subtask=subtask, attempt=1))
            # the task's first attempt failed after writing its file
            self.unreferenced.append(self.write(f"p=r/{name(JOB, self.restored, subtask, attempt=0)}", -1))
        self.restored_files = sorted(f.path for f in files)
        storage.write_metadata(storage.initialize_location_for_checkpoint(self.restored), CheckpointMetadata(
            job_id=JOB, checkpoint_id=self.restored, checkpoint_type="CHECKPOINT", trigger_timestamp=1,
            completion_timestamp=2, operator_states=(OperatorState("lake", None, (SubtaskState(
                0, 0, tuple(f.to_state_handle() for f in files)),)),)))
        self.unreferenced += [self.write(f"p={p}/{name(JOB, 2, 90_000 + p)}", -1) for p in range(3)]  # checkpoint 2 aborted
        self.foreign += [self.write(f"p=0/{name(OTHER_JOB, 1, 0)}", -1),  # another job's, in flight
                         self.write("p=1/part-00000-written-by-spark.snappy.parquet", -1)]


def restore(tmp_path: Path, files: int) -> tuple[LargeTable, float]:
    """Build a LargeTable of ``files`` files, then restore its job's checkpoint ``restored``: the
    table, the restore's seconds."""
    table = LargeTable(tmp_path / "t", files)
    sink = DeltaLakeSink(str(table.root), partition_by=["p"])
    storage = CheckpointStorage(f"file://{tmp_path}/chk", JOB)
    table.leftovers(sink, storage)
    ranges = {table.restored: {TP0: (table.offset, table.offset + 2)}}
    committer = LakeCommitter(CommitterContext(), sink, storage, offsets_of=lambda m: ranges[m.checkpoint_id])
    started = time.perf_counter()
    committer.reset_to_checkpoint(table.restored, None)
    return table, time.perf_counter() - started


def check(table: LargeTable, files: int) -> None:
    sink = DeltaLakeSink(str(table.root))
    assert sink.committed_checkpoint(JOB) == table.restored
    referenced = sink.referenced_files()
    assert len(referenced) == files + 1 + 2  # the committed ones, the compacted file, the restored ones
    assert set(table.restored_files) <= referenced
    on_disk = {str(p.relative_to(table.root)) for p in table.root.rglob("*.parquet")}
    assert not set(table.unreferenced) & on_disk, "an unreferenced file of the job was kept"
    assert referenced | set(table.tombstoned) | set(table.foreign) == on_disk


def test_a_restore_on_a_table_of_100000_files_deletes_exactly_the_jobs_unreferenced_files(tmp_path) -> None:
    """About 10 s in all (2 s the restore itself, the rest making and checking the table)."""
    table, seconds = restore(tmp_path, 100_000)
    print(f"restore on a Delta table of 100,000 files: {seconds:.2f} s")
    check(table, 100_000)


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_cleanup_keeps_the_committed_files_of_partitions_whose_names_are_escaped(tmp_path, fmt) -> None:
    """Delta's log holds each path as a URI: the file ``p=a%20b/...`` on storage is
    ``p=a%2520b/...`` in the log. The cleanup compared the two as they were and deleted every
    committed file of such a partition (a space, a slash, a ``%`` or any non-ASCII character in
    its value): the table then named files that were gone."""
    from chandy.connectors.lake.tables import open_sink

    uri = str(tmp_path / "t") if fmt == "delta" else "iceberg://local/lake.t"
    sink = open_sink(uri, partition_by=["p"], catalog_properties={"warehouse": str(tmp_path / "wh")})
    values = ["a b/c", "x%y", "é", "plain"]
    data = pa.table({"offset": pa.array(range(4), pa.int64()), "p": values})
    files = sink.write_files(data, job_id=JOB, checkpoint_id=1, subtask=0, attempt=0)
    assert sink.commit(JOB, 1, files, offsets={TP0: 4})
    aborted = sink.write_files(data, job_id=JOB, checkpoint_id=2, subtask=0, attempt=0)
    assert sink.commit(JOB, 3, sink.write_files(data, job_id=JOB, checkpoint_id=3, subtask=0, attempt=0),
                       offsets={TP0: 8})
    assert sorted(sink.delete_unreferenced(JOB)) == sorted(f.path for f in aborted)
    assert sink.missing_files(files) == []
    assert sorted(sink.read_table().column("offset").to_pylist()) == [0, 0, 1, 1, 2, 2, 3, 3]

"""Issue 57: a ``--cdc`` merge rewrites the files that hold its keys, not the table. Delta data
files carry the protocol's column statistics (``minValues``/``maxValues``/``nullCount`` of their
integer columns), and the merge (Delta ``MERGE`` through delta-rs, Iceberg delete + append through
pyiceberg) is bounded by the changes' smallest and largest key, so both libraries skip the files
outside. Real tables; read back with deltalake, pyiceberg and pyarrow, not the sink."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from chandy.connectors.lake.changes import OP_COLUMN
from chandy.connectors.lake.tables import open_sink

JOB = "0123456789abcdef0123456789abcdef"
FILES, PER_FILE = 4, 1000


def rows(ids: list[int], offset: int, ops: list[str] | None = None) -> pa.Table:
    n = len(ids)
    data = {"id": pa.array(ids, pa.int64()), "name": [f"v{i}-{offset + k}" for k, i in enumerate(ids)],
            "topic": ["cdc"] * n, "partition": pa.array([0] * n, pa.int32()), "offset": pa.array(range(offset, offset + n), pa.int64())}
    if ops is not None:
        data[OP_COLUMN] = ops
    return pa.table(data)


@pytest.fixture(params=["delta", "iceberg"])
def sink(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "delta":
        return open_sink(str(tmp_path / "t"))
    return open_sink("iceberg://local/lake.t", catalog_properties={"warehouse": str(tmp_path / "wh")})


def referenced(sink) -> set[str]:
    if sink.FORMAT == "delta":
        return {Path(u).name for u in DeltaTable(sink.table_uri).file_uris()}
    return {Path(p).name for p in sink._load().inspect.files().column("file_path").to_pylist()}


def test_a_merge_of_the_newest_keys_rewrites_only_their_file_and_lands_every_change(sink) -> None:
    model: dict[int, str] = {}
    offset = 0
    for n in range(FILES):  # ids in order, one file per commit, as a database's rows arrive
        ids = list(range(n * PER_FILE, (n + 1) * PER_FILE))
        files = sink.write_files(rows(ids, offset), job_id=JOB, checkpoint_id=n + 1, subtask=0, attempt=0)
        sink.commit(JOB, n + 1, files, offsets={("cdc", 0): offset + len(ids)})
        model.update((i, f"v{i}-{offset + k}") for k, i in enumerate(ids))
        offset += len(ids)
    before = referenced(sink)
    assert len(before) == FILES

    newest = (FILES - 1) * PER_FILE
    ids = [newest + 990 + i for i in range(10)] + [newest + 980 + i for i in range(5)] + [FILES * PER_FILE + i for i in range(10)]
    ids += [newest + 990]  # the same key again: the last change wins
    ops = ["u"] * 10 + ["d"] * 5 + ["c"] * 10 + ["u"]
    change = rows(ids, offset, ops)
    files = sink.write_files(change, job_id=JOB, checkpoint_id=FILES + 1, subtask=0, attempt=0, partitioned=False)
    files = [dataclasses.replace(f, id_columns=("id",)) for f in files]
    assert sink.commit_changes(JOB, FILES + 1, files, offsets={("cdc", 0): offset + len(ids)}) is not None
    for position, (i, op) in enumerate(zip(ids, ops, strict=True)):
        if op == "d":
            model.pop(i, None)
        else:
            model[i] = f"v{i}-{offset + position}"

    table = sink.read_table()
    landed = dict(zip(table.column("id").to_pylist(), table.column("name").to_pylist(), strict=True))
    assert table.num_rows == len(landed) == len(model)  # no key twice
    assert landed == model
    after = referenced(sink)
    assert len(before - after) == 1  # only the file of the newest ids was rewritten
    kept = {name for name in before if name in after}
    assert len(kept) == FILES - 1  # the files of the older ids are still the table's, untouched


def test_delta_data_files_carry_exact_column_statistics(tmp_path: Path) -> None:
    sink = open_sink(str(tmp_path / "t"))
    data = rows([5, -3, 17, 2], 100).append_column("maybe", pa.array([None, 4, None, 9], pa.int32()))
    data = data.append_column("nothing", pa.array([None] * 4, pa.int16()))
    files = sink.write_files(data, job_id=JOB, checkpoint_id=1, subtask=0, attempt=0)
    sink.commit(JOB, 1, files, offsets={("cdc", 0): 104})
    log = sorted((tmp_path / "t" / "_delta_log").glob("*.json"))[-1]
    adds = [json.loads(line)["add"] for line in log.read_text().splitlines() if '"add"' in line]
    assert len(adds) == 1
    stats = json.loads(adds[0]["stats"])
    written = pq.read_table(tmp_path / "t" / adds[0]["path"])
    assert stats["numRecords"] == written.num_rows == 4
    for column in ("id", "partition", "offset", "maybe"):
        extent = pc.min_max(written.column(column))
        assert (stats["minValues"][column], stats["maxValues"][column]) == (extent["min"].as_py(), extent["max"].as_py())
        assert stats["nullCount"][column] == written.column(column).null_count
    assert stats["nullCount"]["nothing"] == 4 and "nothing" not in stats["minValues"]
    assert "name" not in stats["minValues"] and "topic" not in stats["nullCount"]  # strings: no statistics
    # a reader that skips by them (delta-rs, through the add actions) finds the rows
    assert DeltaTable(str(tmp_path / "t")).to_pyarrow_table(filters=[("id", "=", 17)]).num_rows == 1

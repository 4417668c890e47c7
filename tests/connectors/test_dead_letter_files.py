"""Dead-letter files (chandy/connectors/spark/task/dead_letters.py), without servers: a subtask's bad
records and its skipped tombstones are read back once per checkpoint, the count riding in the
file's schema metadata (no Spark accumulator: Spark Connect has none)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from chandy.connectors.spark.task.dead_letters import DeadLetterFile, delete_dead_letters_before, read_dead_letters
from chandy.formats.decoder import BAD_RECORDS_SCHEMA


def bad_rows(n: int, partition: int) -> pa.RecordBatch:
    rows = [{"topic": "t", "partition": partition, "offset": i, "key": b"k", "value": b"{", "headers": [],
             "error_class": "BadRecordError", "error_message": "not JSON"} for i in range(n)]
    return pa.RecordBatch.from_pylist(rows, BAD_RECORDS_SCHEMA)


def test_bad_records_and_skipped_tombstones_are_read_back_per_checkpoint(tmp_path: Path) -> None:
    root = str(tmp_path / "chk")
    first = DeadLetterFile(root, "job", 7, 0)
    first.add(bad_rows(2, 0))
    first.add_skipped(3)
    first.close()
    only_skipped = DeadLetterFile(root, "job", 7, 1)  # no bad record: a file for the count alone
    only_skipped.add_skipped(4)
    only_skipped.close()
    DeadLetterFile(root, "job", 7, 2).close()  # nothing at all: no file
    other = DeadLetterFile(root, "job", 8, 0)
    other.add(bad_rows(1, 1))
    other.close()

    bad, skipped = read_dead_letters(root, "job", 7)
    assert (bad.num_rows, skipped) == (2, 7)
    assert bad.schema == BAD_RECORDS_SCHEMA  # the count's metadata does not leak into the rows
    assert bad.column("offset").to_pylist() == [0, 1]
    assert sorted(p.name for p in (tmp_path / "chk" / "job" / "taskowned" / "dead-letters" / "chk-7").iterdir()) == [
        "part-00000.parquet", "part-00001.parquet"]
    bad, skipped = read_dead_letters(root, "job", 8)
    assert (bad.num_rows, skipped) == (1, 0)
    assert read_dead_letters(root, "job", 9)[1] == 0

    delete_dead_letters_before(root, "job", 8)
    assert read_dead_letters(root, "job", 7) == (BAD_RECORDS_SCHEMA.empty_table(), 0)

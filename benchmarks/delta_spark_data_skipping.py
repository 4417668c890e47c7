"""Delta's own Spark reader on a Delta table Chandy wrote (issue 57): the column statistics of
Chandy's data files (``minValues``/``maxValues``/``nullCount`` of integer columns,
:func:`chandy.connectors.lake.sink.file_stats`) let delta-spark skip files by a predicate, and
every query still returns exactly the rows it should. Not a timing: a check with a reader Chandy
did not write, which the tests' environment cannot run (delta-spark exists for pyspark 4.2.0, the
benchmarks' pin, not for the tests' newer pyspark).

Run: ``make bench-setup && .venv-bench/bin/python benchmarks/delta_spark_data_skipping.py``
(``--delta-spark-version``, default 4.4.0; about a minute, most of it Spark's start). Exits 1
naming the first disagreement. Measured here: ``id = 217`` reads 1 file of 4, ``id >= 150 AND
id < 250`` 2, ``maybe = 4`` 1, ``id > 1000`` none, ``maybe IS NULL`` all 4 (each holds nulls),
every answer exact.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.delta_spark import delta_spark_session, run_check
from chandy.connectors.lake.tables import open_sink

JOB = "0123456789abcdef0123456789abcdef"
FILES, PER_FILE = 4, 100

#: predicate -> (which ids match, how many files delta-spark may read at most)
QUERIES: dict[str, tuple[Callable[[int], bool], int]] = {
    "id = 217": (lambda i: i == 217, 1),
    "id >= 150 AND id < 250": (lambda i: 150 <= i < 250, 2),
    "maybe = 4": (lambda i: i == 4, 1),
    "id > 1000": (lambda i: False, 0),
    "maybe IS NULL": (lambda i: i % 2 == 1, FILES),
}


def create_table(path: str) -> None:
    """A Delta table of ``FILES`` files written by Chandy's sink, ids in order (100 a file), and
    ``maybe``: the id when even, else null."""
    sink = open_sink(path)
    for checkpoint in range(1, FILES + 1):
        ids = list(range((checkpoint - 1) * PER_FILE, checkpoint * PER_FILE))
        rows = pa.table({"id": pa.array(ids, pa.int64()), "name": [f"n{i}" for i in ids],
                         "maybe": pa.array([None if i % 2 else i for i in ids], pa.int32())})
        files = sink.write_files(rows, job_id=JOB, checkpoint_id=checkpoint, subtask=0, attempt=0)
        sink.commit(JOB, checkpoint, files, offsets={("t", 0): checkpoint * PER_FILE})


def check(path: str, delta_spark_version: str) -> list[str]:
    """What delta-spark disagrees with, if anything."""
    spark = delta_spark_session(delta_spark_version)
    problems = []
    table = spark.read.format("delta").load(path)
    for predicate, (matches, most_files) in QUERIES.items():
        query = table.where(predicate)
        got = sorted(r.id for r in query.select("id").collect())
        expected = [i for i in range(FILES * PER_FILE) if matches(i)]
        if got != expected:
            problems.append(f"WHERE {predicate} gave {len(got)} rows, not the {len(expected)} that match")
        read = len(query.inputFiles())
        if read > most_files:
            problems.append(f"WHERE {predicate} read {read} files, not at most {most_files}: no data skipping")
        print(f"WHERE {predicate}: {len(got)} rows, {read} of {FILES} files read")
    spark.stop()
    return problems


if __name__ == "__main__":
    sys.exit(run_check(__doc__.split("\n\n")[0], create_table, check,
                       "delta-spark skips Chandy's data files by their statistics and answers every query exactly"))

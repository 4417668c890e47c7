"""Delta's own Spark reader on a Delta table Chandy created with partition transforms (issue 47):
its ``year``, ``month``, ``day``, ``hour`` and ``truncate`` partition columns are Delta generated
columns, so delta-spark derives partition filters on ``day`` and ``hour`` from a predicate on the
source column, and an ``INSERT`` by Spark computes every generated column as Chandy does. Not a timing: a check with a reader Chandy
did not write, which the tests' environment cannot run (delta-spark exists for pyspark 4.2.0, the
benchmarks' pin, not for the tests' newer pyspark).

Run: ``make bench-setup && .venv-bench/bin/python benchmarks/delta_spark_generated_columns.py``
(``--delta-spark-version``, default 4.4.0; about a minute, most of it Spark's start and Ivy's
download). Exits 1 naming the first disagreement.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.delta_spark import delta_spark_session, run_check
from chandy.connectors.lake.tables import open_sink

JOB = "0123456789abcdef0123456789abcdef"
UTC = datetime.UTC
ENTRIES = ("year(ts)", "month(ts)", "day(ts)", "hour(ts)", "truncate(2, name)", "truncate(10, id)")


def create_table(path: str) -> None:
    """A Delta table written by Chandy's sink: four rows, one of them in 1969, one null."""
    sink = open_sink(path, partition_by=ENTRIES)
    stamps = [datetime.datetime(2026, 9, 21, 23, 59, tzinfo=UTC), datetime.datetime(2027, 1, 1, 0, 1, tzinfo=UTC),
              datetime.datetime(1969, 12, 31, 23, 30, tzinfo=UTC), None]
    rows = pa.table({"ts": pa.array(stamps, pa.timestamp("us", tz="UTC")), "id": pa.array([34, 35, -7, 1], pa.int64()),
                     "name": ["iceberg", "delta", "ic", None], "offset": pa.array(range(4), pa.int64())})
    files = sink.write_files(rows, job_id=JOB, checkpoint_id=1, subtask=0, attempt=0)
    sink.commit(JOB, 1, files, offsets={("t", 0): 4})


def check(path: str, delta_spark_version: str) -> list[str]:
    """What delta-spark disagrees with, if anything."""
    spark = delta_spark_session(delta_spark_version, **{"spark.sql.session.timeZone": "UTC"})
    problems = []
    table = f"delta.`{path}`"
    detail = spark.sql(f"DESCRIBE DETAIL {table}").collect()[0]
    if detail.minWriterVersion < 4:
        problems.append(f"minWriterVersion {detail.minWriterVersion}: no generated columns")
    query = spark.sql(f"SELECT offset FROM {table} WHERE ts >= TIMESTAMP'2027-01-01 00:00:00'")
    plan = query._jdf.queryExecution().executedPlan().toString()
    filters = next((line for line in plan.split("\n") if "PartitionFilters" in line), "")
    for column in ("ts_day", "ts_hour"):
        if f"{column}#" not in filters.split("PartitionFilters")[-1]:
            problems.append(f"no partition filter on {column} from a predicate on ts: {filters.strip()[:300]}")
    if sorted(r.offset for r in query.collect()) != [1]:
        problems.append("WHERE ts >= 2027-01-01 did not give offset 1 alone")
    spark.sql(f"INSERT INTO {table} (ts, id, name, offset) VALUES (TIMESTAMP'2026-09-22 13:45:00', -13, 'ü€x', 9)")
    inserted = spark.sql(f"SELECT * FROM {table} WHERE offset = 9").collect()[0].asDict()
    expected = {"ts_year": 2026, "ts_month": "2026-09", "ts_day": datetime.date(2026, 9, 22), "ts_hour": datetime.datetime(2026, 9, 22, 13),
                "name_trunc": "ü€", "id_trunc": -20}
    for column, value in expected.items():
        if inserted[column] != value:
            problems.append(f"Spark's INSERT computed {column} = {inserted[column]!r}, Chandy computes {value!r}")
    chandy = {r.offset: r.asDict() for r in spark.sql(f"SELECT * FROM {table} WHERE offset < 4").collect()}
    if chandy[2]["ts_day"] != datetime.date(1969, 12, 31) or chandy[2]["id_trunc"] != -10 \
            or chandy[2]["ts_month"] != "1969-12":
        problems.append(f"Chandy's 1969 row reads back as {chandy[2]}")
    spark.stop()
    return problems


if __name__ == "__main__":
    sys.exit(run_check(__doc__.split("\n\n")[0], create_table, check,
                       "delta-spark derives partition filters on ts_day and ts_hour and computes every generated "
                       "column as Chandy does"))

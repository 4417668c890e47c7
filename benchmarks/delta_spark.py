"""What the by-hand checks with Delta's own Spark reader share (``delta_spark_*.py``, run in
``.venv-bench``, whose pyspark delta-spark supports): a Spark session with delta-spark, and the
run of one check on a table Chandy wrote into a temporary directory."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable
from typing import Any


def delta_spark_session(version: str, **conf: str) -> Any:
    """A ``local[1]`` Spark session with delta-spark ``version`` (from Maven Central through
    ``spark.jars.packages``), its SQL extensions and catalog, and ``conf``."""
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master("local[1]")
               .config("spark.jars.packages", f"io.delta:delta-spark_2.13:{version}")
               .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
               .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog")
               .config("spark.ui.enabled", "false"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_check(description: str, create_table: Callable[[str], None], check: Callable[[str, str], list[str]],
              agreed: str) -> int:
    """Parse ``--delta-spark-version`` (default 4.4.0), let ``create_table(path)`` write a table
    into a temporary directory and ``check(path, version)`` list what delta-spark disagrees with;
    print each disagreement (or ``agreed``). Returns the exit code: 1 on a disagreement."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--delta-spark-version", default="4.4.0")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        path = f"{directory}/t"
        create_table(path)
        problems = check(path, args.delta_spark_version)
    for problem in problems:
        print(f"DISAGREES: {problem}")
    if not problems:
        print(agreed)
    return 1 if problems else 0

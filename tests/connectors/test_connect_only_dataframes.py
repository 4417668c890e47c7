"""Spark Connect has no ``SparkContext`` and no RDDs (Databricks' ``UNSUPPORTED_CONNECT_FEATURE``):
Chandy's code reaches them only in ``chandy/connectors/spark/classic.py``, whose functions give
Spark Connect's answer otherwise. This test reads every other module's syntax tree."""

from __future__ import annotations

import ast
from pathlib import Path

import chandy

PACKAGE = Path(chandy.__file__).resolve().parent
ALLOWED = {PACKAGE / "connectors" / "spark" / "classic.py"}
#: attributes only a classic driver has (SparkContext, RDDs, accumulators, broadcast variables)
CLASSIC_ATTRIBUTES = {"sparkContext", "rdd", "parallelize", "mapPartitionsWithIndex", "accumulator", "addPyFile",
                      "defaultParallelism", "setLogLevel", "_jvm", "_jsc", "_jsparkSession"}
CLASSIC_MODULES = ("pyspark.rdd", "pyspark.context", "pyspark.accumulators", "pyspark.broadcast")


def classic_uses(path: Path) -> list[str]:
    """``<file>:<line>: <use>`` for every classic-only use in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    where = path.relative_to(PACKAGE.parent) if path.is_relative_to(PACKAGE.parent) else path
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in CLASSIC_ATTRIBUTES:
            found.append(f"{where}:{node.lineno}: .{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module and (
                node.module.startswith(CLASSIC_MODULES) or (node.module == "pyspark" and any(
                    a.name in ("SparkContext", "RDD", "Accumulator", "Broadcast") for a in node.names))):
            found.append(f"{where}:{node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import) and any(a.name.startswith(CLASSIC_MODULES) for a in node.names):
            found.append(f"{where}:{node.lineno}: import {node.names[0].name}")
    return found


def test_no_sparkcontext_or_rdd_outside_the_classic_module() -> None:
    offending = [use for path in sorted(PACKAGE.rglob("*.py")) if path not in ALLOWED for use in classic_uses(path)]
    assert offending == [], "classic-only Spark outside connectors/spark/classic.py:\n" + "\n".join(offending)


def test_the_check_sees_a_classic_call(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f(spark, df):\n    spark.sparkContext.parallelize([1]).collect()\n    return df.rdd\n"
                     "from pyspark.accumulators import AccumulatorParam\n")
    assert sorted(u.split(": ", 1)[1] for u in classic_uses(probe)) == [
        ".parallelize", ".rdd", ".sparkContext", "from pyspark.accumulators import ..."]

"""The only place Chandy touches classic Spark's ``SparkContext`` or an RDD.

Everything else runs through DataFrames, which classic Spark and Spark Connect both serve (Spark
Connect has no ``SparkContext`` and no RDDs: Databricks' ``UNSUPPORTED_CONNECT_FEATURE``). The
functions here answer a question only a classic driver can answer, and give Spark Connect's
answer (or none) otherwise; ``tests/connectors/spark/test_connect_only_dataframes.py`` keeps
``sparkContext``, ``.rdd`` and their kin out of every other module.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (``pyspark.sql.connect.session.SparkSession``):
    a client of a remote driver, with DataFrames and no ``SparkContext``."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def spark_master(spark: Any) -> str:
    """The master of the driver ``spark`` talks to (``spark.master``; under Spark Connect, the
    server's: ``local[*]``, ``spark://...``, ``yarn``, ...; empty when the server does not say)."""
    if not is_connect(spark):
        return str(spark.sparkContext.master)
    return str(spark.conf.get("spark.master", None) or "")


def default_parallelism(spark: Any) -> int:
    """Spark's default parallelism (``SparkContext.defaultParallelism``: the local cores, the
    executors' cores, or ``spark.default.parallelism``). Under Spark Connect it is read from the
    driver as the partitions of an unpartitioned ``spark.range`` (whose leaf parallelism is the
    default parallelism, ``SparkSession.leafNodeDefaultParallelism``): one small job. At least 1."""
    if not is_connect(spark):
        return max(1, int(spark.sparkContext.defaultParallelism))
    configured = spark.conf.get("spark.default.parallelism", None)
    if configured:
        return max(1, int(configured))
    from pyspark.sql import functions as F

    row = spark.range(0, 1 << 16).select(F.spark_partition_id().alias("p")).agg(F.max("p").alias("last")).collect()[0]
    return max(1, int(row["last"]) + 1)


def bound_connect_retries(spark: Any, max_wait_s: float, max_backoff_ms: int = 5000) -> None:
    """Under Spark Connect, retry a call that finds the server unavailable for about ``max_wait_s``
    seconds, not pyspark's ``DefaultPolicy`` (at least 10 minutes, during which the pipeline's loop
    would hang in one call): the micro-batch then fails, and the job's restart strategy decides,
    as for any other failure. Backoff as pyspark's (50 ms, x4, with jitter), capped at
    ``max_backoff_ms``. Nothing on classic Spark."""
    if not is_connect(spark):
        return
    from pyspark.sql.connect.client.retries import DefaultPolicy

    retries, waited, backoff = 0, 0.0, 50.0
    while waited < max_wait_s * 1000:
        waited += min(backoff, max_backoff_ms)
        backoff *= 4
        retries += 1
    spark.client.set_retry_policies([DefaultPolicy(max_retries=retries, max_backoff=max_backoff_ms)])


def quiet_logs(spark: Any) -> None:
    """Spark's log level to WARN (``SparkContext.setLogLevel``); a Spark Connect server's logs are
    its own, so nothing there."""
    if not is_connect(spark):
        spark.sparkContext.setLogLevel("WARN")


def ship_python_file(spark: Any, path: str) -> None:
    """Put ``path`` (a ``.zip`` or ``.py``) on the executors' Python path for this session:
    ``SparkContext.addPyFile`` on classic Spark, ``SparkSession.addArtifacts(path, pyfile=True)``
    under Spark Connect (a session-scoped artifact, which Databricks serverless accepts too)."""
    if is_connect(spark):
        spark.addArtifacts(path, pyfile=True)
    else:
        spark.sparkContext.addPyFile(path)


def partitions_of(df: Any) -> int | None:
    """The partitions ``df`` will be computed in (``df.rdd.getNumPartitions()``), or None under
    Spark Connect, which does not say without running a job."""
    if is_connect(df.sparkSession):
        return None
    return int(df.rdd.getNumPartitions())

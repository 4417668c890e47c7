"""The pipeline on a real Spark standalone cluster: a master and two workers (1 core, 1 GB each)
started from the installed pyspark's own classes, ``chandy pipeline run --master spark://...`` as
a subprocess on a real topic into a real Delta table. The executors run a Python that has
Chandy's dependencies but not Chandy (an executor image with the dependencies only): the tasks
import the code the driver ships them (``--ship-code``, on by default off local masters).

Checked: every (topic, partition, offset) landed once with its value, the consumer group is
committed to the topic's ends, and every task ran on the cluster's two executors, one per worker
(Spark's event log, the workers' executor directories, the master's completed application), so
the test would fail in local mode. The slow test does the same the way YARN users do (the
executors' Python from an environment archive) with a ``--transform``, whose Python data sources
Spark plans on the driver. Run under ``flock /tmp/chandy-spark.lock``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from chandy.connectors.lake.tables import open_sink
from chandy.connectors.spark.options import default_job_id
from chandy.connectors.spark.verify import verify_table
from tests.fixtures import REPO_ROOT
from tests.fixtures.lake_pipeline import make_topic, topic_ends
from tests.fixtures.pipeline import group_offsets
from tests.fixtures.spark_cluster import (
    SparkStandaloneCluster,
    cluster_processes_left,
    python_without_chandy,
    spark_standalone_cluster,
)

pytestmark = pytest.mark.integration

ROOT = REPO_ROOT
PARTITIONS = 4
PER_PARTITION = 900
CAP = 400  # records per partition per checkpoint: three checkpoints carry data


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandaloneCluster]:
    directory = tmp_path_factory.mktemp("spark-standalone")
    with spark_standalone_cluster(directory, workers=2, cores=1, memory="1g") as started:
        yield started
    assert cluster_processes_left(started) == [], "processes of the cluster outlived its teardown"


def event_log(directory: Path) -> list[dict]:
    """Every event of the Spark event logs under ``directory`` (rolled or not, uncompressed; not
    the ``.crc`` files beside them)."""
    events = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and not p.name.startswith(".")):
        events.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return events


def run_on_cluster(cluster: SparkStandaloneCluster, servers: str, topic: str, table: Path, prefix: str, events: Path,
                   env: dict[str, str], cwd: Path, *extra: str) -> None:
    """``chandy pipeline run --master spark://...`` until drained, with Spark's event log in ``events``."""
    events.mkdir()
    env = {**env, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("CHANDY_CRASH_AT", None)
    run = subprocess.run(
        [sys.executable, "-m", "chandy.cli", "pipeline", "run", "--table", str(table), "--topic", topic,
         "-b", servers, "--prefix", prefix, "--until-drained", "--max-records-per-checkpoint", str(CAP),
         "--parallelism", "2", "--master", cluster.master_url, "--conf", "spark.ui.enabled=false",
         # start the micro-batches once both executors registered, so that each stage's two tasks
         # run one per executor
         "--conf", "spark.scheduler.minRegisteredResourcesRatio=1.0",
         "--conf", "spark.scheduler.maxRegisteredResourcesWaitingTime=120s",
         "--conf", "spark.eventLog.enabled=true", "--conf", f"spark.eventLog.dir={events.as_uri()}",
         "--conf", "spark.eventLog.compress=false", *extra],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=420, start_new_session=True)
    assert run.returncode == 0, f"{run.stdout[-2000:]}\n{run.stderr[-5000:]}\n{cluster.log_tail()}"


def check_landed_exactly_once_by_the_executors(cluster: SparkStandaloneCluster, servers: str, topic: str,
                                               values: list[bytes], table: Path, events: Path) -> str:
    """Every offset once with its value, the group at the ends, every task on the cluster's two
    executors (one per worker, each fetched the shipped code). Returns the application's ID."""
    rows, duplicates, missing = verify_table(open_sink(str(table)), servers, [topic])
    assert (rows, duplicates, missing) == (len(values), 0, 0)
    landed = open_sink(str(table)).read_table().select(["partition", "offset", "value"]).to_pylist()
    assert {(r["partition"], r["offset"]): r["value"] for r in landed} == {
        (i % PARTITIONS, i // PARTITIONS): v for i, v in enumerate(values)}
    job_id = default_job_id(str(table), [topic])
    ends = topic_ends(servers, topic, PARTITIONS)
    assert group_offsets(servers, f"chandy-{job_id}", topic, PARTITIONS) == {p: ends[(topic, p)] for p in range(PARTITIONS)}

    log = event_log(events)
    app_id = next(e["App ID"] for e in log if e["Event"] == "SparkListenerApplicationStart")
    executors = {e["Executor ID"] for e in log if e["Event"] == "SparkListenerExecutorAdded"}
    tasks = Counter(e["Task Info"]["Executor ID"] for e in log
                    if e["Event"] == "SparkListenerTaskEnd" and e["Task End Reason"]["Reason"] == "Success")
    assert len(executors) == 2 and "driver" not in executors, executors
    assert set(tasks) == executors, tasks  # both executors ran tasks, the driver none
    assert sum(tasks.values()) >= 3 * 2  # three micro-batches of two subtasks at least
    for work_dir in cluster.work_dirs:  # each worker launched an executor, which fetched the code
        fetched = list((work_dir / app_id).glob("*/chandy-tasks-*.zip"))
        assert len(fetched) == 1, f"{work_dir}: {sorted(p.name for p in (work_dir / app_id).rglob('*'))}"
    completed = {a["id"]: a for a in cluster.state()["completedapps"]}
    assert completed[app_id]["state"] == "FINISHED" and completed[app_id]["cores"] == 2
    assert completed[app_id]["name"] == f"chandy-pipeline-{job_id[:8]}"
    return app_id


def source(servers: str) -> tuple[str, list[bytes]]:
    values = [f"record-{i}-{uuid.uuid4().hex}".encode() for i in range(PARTITIONS * PER_PARTITION)]
    return make_topic(servers, values, partitions=PARTITIONS, prefix="standalone"), values


def test_pipeline_on_a_standalone_cluster_lands_exactly_once_from_the_executors(
        kafka_bootstrap_servers: str, topic_prefix: str, cluster: SparkStandaloneCluster, tmp_path: Path) -> None:
    executor_python = python_without_chandy(tmp_path / "executor-python")
    probe = subprocess.run([str(executor_python), "-c", "import pyarrow, confluent_kafka, deltalake; import chandy"],
                           cwd=tmp_path, capture_output=True, text=True)
    assert "No module named 'chandy'" in probe.stderr, probe  # the dependencies, not Chandy
    topic, values = source(kafka_bootstrap_servers)
    table, events = tmp_path / "lake" / "orders", tmp_path / "spark-events"
    run_on_cluster(cluster, kafka_bootstrap_servers, topic, table, topic_prefix, events,
                   {**os.environ, "PYSPARK_PYTHON": str(executor_python)}, ROOT)
    check_landed_exactly_once_by_the_executors(cluster, kafka_bootstrap_servers, topic, values, table, events)


@pytest.mark.slow
def test_transform_with_a_packed_environment_on_a_standalone_cluster(
        kafka_bootstrap_servers: str, topic_prefix: str, cluster: SparkStandaloneCluster, tmp_path: Path) -> None:
    """YARN's way (Spark's "Python Package Management"): the executors' Python comes in an archive
    (``spark.archives=env.tar.gz#environment``, ``spark.pyspark.python=./environment/bin/python``),
    and a ``--transform`` makes the micro-batches go through Python data sources, which Spark plans
    on the driver with that same relative path: the command runs where ``./environment`` exists."""
    environment = python_without_chandy(tmp_path / "env").parent.parent
    archive = tmp_path / "env.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(environment, arcname=".")  # symlinks stay symlinks, as venv-pack leaves them
    workdir = tmp_path / "driver"
    workdir.mkdir()
    (workdir / "environment").symlink_to(environment)
    (workdir / "cluster_transform.py").write_text(
        "from pyspark.sql import functions as F\n\n\ndef tag(df):\n"
        "    return df.withColumn('landed_by', F.lit('cluster'))\n")
    topic, values = source(kafka_bootstrap_servers)
    table, events = tmp_path / "lake" / "orders", tmp_path / "spark-events"
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    run_on_cluster(cluster, kafka_bootstrap_servers, topic, table, topic_prefix, events, env, workdir,
                   "--transform", "cluster_transform:tag", "--conf", f"spark.archives={archive.as_uri()}#environment",
                   "--conf", "spark.pyspark.python=./environment/bin/python")
    app_id = check_landed_exactly_once_by_the_executors(cluster, kafka_bootstrap_servers, topic, values, table, events)
    assert set(open_sink(str(table)).read_table().column("landed_by").to_pylist()) == {"cluster"}
    for work_dir in cluster.work_dirs:  # the executors ran the archive's Python, unpacked beside them
        assert list((work_dir / app_id).glob("*/environment/bin/python")), work_dir

"""What the pipeline decides for a Spark cluster, without one: which Python the executors run,
how many attempts a task has, and the zip of Chandy's task code shipped to the executors (it
imports, schemas included, in a Python that has the dependencies but not Chandy)."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile

import pytest

from chandy.connectors.spark.cluster import TASK_PACKAGES, default_parallelism, executor_python, task_code_zip, task_max_failures
from chandy.connectors.spark.options import PipelineOptions
from chandy.connectors.spark.spark_urls import is_local_master


def test_local_masters_are_those_whose_executors_live_in_the_driver() -> None:
    assert all(is_local_master(m) for m in ("local", "local[2]", "local[*]", "local[4,3]"))
    assert not any(is_local_master(m) for m in ("local-cluster[2,1,1024]", "spark://h:7077", "yarn", "k8s://https://h"))


def test_task_attempts_follow_sparks_task_scheduler() -> None:
    assert task_max_failures("local[2]", "8") == 1  # local mode ignores spark.task.maxFailures
    assert task_max_failures("local[2, 3]", None) == 3
    assert task_max_failures("spark://h:7077", None) == 4  # Spark's default on a cluster
    assert task_max_failures("yarn", "2") == 2


def test_executor_python_prefers_the_setting_then_the_variable_then_this_interpreter_on_known_layouts() -> None:
    conf = {"spark.pyspark.python": "./environment/bin/python"}
    assert executor_python("yarn", conf, {"PYSPARK_PYTHON": "/usr/bin/python3"}) == "./environment/bin/python"
    assert executor_python("yarn", {}, {"PYSPARK_PYTHON": "/opt/py/bin/python"}) == "/opt/py/bin/python"
    assert executor_python("local[2]", {}, {}) == sys.executable
    assert executor_python("spark://h:7077", {}, {}) == sys.executable
    # this driver's interpreter path means nothing in a YARN container or a Kubernetes pod
    assert executor_python("yarn", {}, {}) is None
    assert executor_python("k8s://https://h:6443", {}, {}) is None


def test_code_is_shipped_by_default_only_off_local_masters() -> None:
    base = {"table_uri": "/tmp/t", "bootstrap_servers": "b:9092", "topics": ("t",)}
    assert not PipelineOptions(**base).resolved_ship_code
    assert PipelineOptions(**base, master="spark://h:7077").resolved_ship_code
    assert not PipelineOptions(**base, master="yarn", ship_code=False).resolved_ship_code
    assert PipelineOptions(**base, ship_code=True).resolved_ship_code


def test_task_code_zip_imports_with_its_schemas_where_chandy_is_not_installed(tmp_path) -> None:
    code = task_code_zip()
    assert task_code_zip() == code  # once per process
    names = zipfile.ZipFile(code).namelist()
    assert {".".join(n.split("/")[:2]) for n in names if n.count("/") >= 2} == set(TASK_PACKAGES)
    assert "chandy/__init__.py" in names
    assert "chandy/schemas/chandy.v1.AcknowledgeCheckpoint.avsc" in names and "chandy/connectors/spark/task/run.py" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert not [n for n in names if n.startswith(("chandy/cli", "chandy/ui/", "chandy/broker"))]  # the tasks' code only
    # -S: no site-packages .pth files, so not the editable install's finder; the dependencies come
    # from our site-packages as a plain path, Chandy only from the zip
    script = ("import sys; sys.path[:0] = sys.argv[1:3]\n"
              "import chandy.connectors.spark.task.run, chandy.coordinator.kafka.participant\n"
              "from chandy.schemas.codec import default_repository\n"
              "print(chandy.connectors.__file__); print(len(default_repository().names()))\n")
    probe = subprocess.run([sys.executable, "-S", "-c", script, code, sysconfig.get_paths()["purelib"]],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr[-2000:]
    location, schemas = probe.stdout.split()
    assert location.startswith(code)
    assert int(schemas) > 10
    unshipped = subprocess.run([sys.executable, "-S", "-c", "import sys; sys.path[:0] = sys.argv[1:2]; import chandy",
                                sysconfig.get_paths()["purelib"]], cwd=tmp_path, capture_output=True, text=True)
    assert unshipped.returncode != 0 and "No module named 'chandy'" in unshipped.stderr


def test_a_transform_needs_the_executors_python_path_to_run_on_the_driver_too(tmp_path, monkeypatch) -> None:
    """Spark plans a transform's Python data sources on the driver with the executors' Python:
    a path that only the executors' unpacked archive has fails before Spark starts, in one line."""
    from chandy.connectors.spark.options import PipelineError
    from chandy.connectors.spark.pipeline import Pipeline

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    options = PipelineOptions(table_uri=str(tmp_path / "t"), bootstrap_servers="127.0.0.1:9", topics=("t",),
                              master="yarn", transform="tests.transforms.flights:identity",
                              spark_conf={"spark.pyspark.python": "./environment/bin/python"})
    pipeline = Pipeline(options)
    with pytest.raises(PipelineError, match=r"'\./environment/bin/python', which does not exist from"):
        pipeline._spark_session()  # refused before a Spark session is asked for
    python = tmp_path / "environment" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    pipeline._check_planner_python("./environment/bin/python")  # the archive unpacked here: accepted
    with pytest.raises(PipelineError):
        pipeline._check_planner_python("no-such-python-3.11")


def test_a_py4j_error_without_a_python_cause_is_reported_by_its_java_cause() -> None:
    from chandy.connectors.spark.driver.failures import root_cause

    text = ("An error occurred while calling o53.load.\n: org.apache.spark.SparkException: [PYTHON_WORKER] failed\n"
            "\tat org.apache.spark.api.python.PythonWorkerFactory.create(PythonWorkerFactory.scala:1)\n"
            'Caused by: java.io.IOException: Cannot run program "./environment/bin/python": error=2, No such file\n'
            "\tat java.base/java.lang.ProcessBuilder.start(ProcessBuilder.java:1143)\n"
            "Caused by: java.io.IOException: error=2, No such file\n")
    assert root_cause(text) == 'IOException: Cannot run program "./environment/bin/python": error=2, No such file'
    # a Python error in the same text still wins
    assert root_cause(text + "ValueError: bad value\n") == "ValueError: bad value"


def test_default_parallelism_is_a_subtask_per_partition_capped_by_local_cores() -> None:
    assert default_parallelism(8, "local[2]", lambda: 2) == 2
    assert default_parallelism(8, "local[*]", lambda: 16) == 8
    assert default_parallelism(3, "local", lambda: 1) == 1
    assert default_parallelism(0, "local[4]", lambda: 4) == 1  # a pattern that matches nothing yet
    assert default_parallelism(8, "spark://h:7077", lambda: 2) == 8  # executors may still be joining

    def never() -> int:
        raise AssertionError("asked off a local master (a job under Spark Connect)")

    assert default_parallelism(12, "yarn", never) == 12

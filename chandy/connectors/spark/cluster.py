"""Where the pipeline runs: local masters and clusters, the default parallelism, task retries, the
executors' Python and the task code shipped to them (and the warm-up their Python workers run), and
user transforms. Why a Spark job failed is told by :mod:`chandy.connectors.spark.driver.failures`."""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from chandy.connectors.spark.options import PipelineError
from chandy.connectors.spark.spark_urls import is_local_master

log = logging.getLogger(__name__)

#: executors by :func:`task_code_zip`
TASK_PACKAGES = ("chandy.connectors", "chandy.formats", "chandy.coordinator", "chandy.schemas")


def default_parallelism(partitions: int, master: str, spark_default_parallelism: Callable[[], int]) -> int:
    """Subtasks when ``--parallelism`` is not given: one per source partition (as Spark's Kafka
    source plans a task per partition), but on a local master at most Spark's default parallelism
    (``SparkContext.defaultParallelism``: the local cores, or ``spark.default.parallelism``).

    More subtasks than cores only queue up there: every Spark task pays a fixed cost (scheduling,
    a Python worker's turn, a Parquet file, an acknowledgement) before and after its records, and a
    subtask reads several partitions' ranges one after the other, as a Flink KafkaSource reader
    holds several splits. Measured with 8 partitions on ``local[*]`` with 2 cores
    (``benchmarks/pipeline_vs_structured_streaming.py``): 50,000-record micro-batches took 395 ms
    with 2 subtasks and 671 ms with 8. Off a local master the executors may still be joining when
    the job starts (dynamic allocation), so the partitions decide alone. At least 1.
    ``spark_default_parallelism`` is asked only on a local master (under Spark Connect the
    answer costs a job, :func:`~chandy.connectors.spark.classic.default_parallelism`).
    """
    subtasks = max(1, partitions)
    if is_local_master(master):
        subtasks = min(subtasks, max(1, spark_default_parallelism()))
    return subtasks


_LOCAL_WITH_FAILURES = re.compile(r"local\[\s*(?:\d+|\*)\s*,\s*(\d+)\s*\]")


def task_max_failures(master: str, configured: str | None) -> int:
    """Attempts Spark gives a task before failing its job, as ``SparkContext.createTaskScheduler``
    decides: in local mode 1, or F of ``local[N,F]`` (``spark.task.maxFailures`` is not read);
    otherwise ``spark.task.maxFailures`` (``configured``), 4 when unset."""
    if is_local_master(master):
        match = _LOCAL_WITH_FAILURES.fullmatch(master)
        return int(match.group(1)) if match else 1
    return int(configured) if configured else 4


def executor_python(master: str, spark_conf: Mapping[str, str], environ: Mapping[str, str]) -> str | None:
    """The Python the executors run for this driver (PySpark's ``SparkContext.pythonExec``, read
    from ``PYSPARK_PYTHON`` when the context starts and sent with every task): ``spark.pyspark.python``
    first (spark-submit gives the setting precedence over the variable), then ``PYSPARK_PYTHON``,
    then this interpreter for local and standalone (``spark://``) masters, whose executors run on
    machines laid out as this one; None elsewhere (YARN, Kubernetes: PySpark's ``python3`` on the
    executors' PATH, unless a packed environment says otherwise, see docs/cluster.md)."""
    if spark_conf.get("spark.pyspark.python"):
        return spark_conf["spark.pyspark.python"]
    if environ.get("PYSPARK_PYTHON"):
        return environ["PYSPARK_PYTHON"]
    if is_local_master(master) or master.startswith(("spark://", "local-cluster[")):
        return sys.executable
    return None


_task_zip_lock = threading.Lock()
_task_zip: str | None = None


def task_code_zip() -> str:
    """A zip of :data:`TASK_PACKAGES` as this process imports them (every file but ``__pycache__``,
    ``.avsc`` schemas included), for ``SparkContext.addPyFile``: the executors then run the
    driver's own Chandy code, and need only its third-party dependencies (pyarrow,
    confluent-kafka, fastavro, deltalake, ...; compiled packages cannot travel in a zip). Built
    once per process in a temporary directory removed at exit; named by the SHA-256 of its
    content, since Spark refuses a second, different file under a name it already serves.

    Raises:
        PipelineError: a package is not importable from a directory (e.g. Chandy itself runs from a zip).
    """
    global _task_zip
    import atexit
    import hashlib
    import importlib.util
    import shutil
    import tempfile
    import zipfile
    from pathlib import Path

    with _task_zip_lock:
        if _task_zip is not None and os.path.exists(_task_zip):
            return _task_zip
        members: list[tuple[str, bytes]] = []
        root_spec = importlib.util.find_spec("chandy")
        if root_spec is not None and root_spec.origin and os.path.isfile(root_spec.origin):
            # the package root (its __init__ loads nothing eagerly), so the executors import chandy.* from the zip
            members.append(("chandy/__init__.py", Path(root_spec.origin).read_bytes()))
        for package in TASK_PACKAGES:
            spec = importlib.util.find_spec(package)
            locations = list(spec.submodule_search_locations or []) if spec is not None else []
            if not locations or not os.path.isdir(locations[0]):
                raise PipelineError(f"cannot ship package {package} to the executors: it is not imported from a "
                                    f"directory ({locations or spec}); install Chandy on the executors and pass "
                                    "--no-ship-code")
            root = Path(locations[0])
            for path in sorted(root.rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                    members.append((f"{package.replace('.', '/')}/{path.relative_to(root).as_posix()}", path.read_bytes()))
        digest = hashlib.sha256()
        for name, data in members:
            digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
        directory = tempfile.mkdtemp(prefix="chandy-tasks-")
        atexit.register(shutil.rmtree, directory, True)
        target = os.path.join(directory, f"chandy-tasks-{digest.hexdigest()[:16]}.zip")
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, data in members:
                archive.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data, zipfile.ZIP_DEFLATED)
        _task_zip = target
        return target


def warm_task(bootstrap_servers: str, job_id: str, prefix: str, consumer_overrides: Mapping[str, Any],
              producer_overrides: Mapping[str, Any], sink: Mapping[str, Any] | None, topics: tuple[str, ...],
              rows: Iterator[Any]) -> Iterator[Any]:
    """For ``spark.range(slots, numPartitions=slots).mapInArrow(...)``, in a Python worker:
    import what a micro-batch's task runs and create the worker's pooled
    Kafka clients of the job (a range reader and the ack sender, connecting in the background),
    with the reader's metadata of ``topics`` (librdkafka otherwise asks for a topic's metadata
    only at its next topic scan, up to a second after the first assignment: measured 0.7 s of a
    first read, 0.2 s with it) and, with ``sink`` (the keyword arguments of
    :func:`~chandy.connectors.spark.task.clients.task_sink`), its pooled lake sink, so the first
    micro-batch (after a start, a take-over or an idle spell) finds them ready. Yields one
    ``warm boolean`` row."""
    import importlib

    import pyarrow as pa

    from chandy.connectors.spark.task.clients import ack_sender, range_reader, task_sink

    for module in ("chandy.connectors.lake.tables", "chandy.connectors.spark.task.run",
                   "chandy.formats.json_batch", "pyarrow.parquet", "pyarrow.dataset"):
        importlib.import_module(module)  # loaded now, not in the first micro-batch's task

    with range_reader(bootstrap_servers, consumer_overrides) as reader:
        for topic in topics:
            reader.consumer.list_topics(topic, timeout=5)
    ack_sender(bootstrap_servers, job_id, prefix=prefix, producer_overrides=producer_overrides)
    if sink is not None:
        task_sink(**sink)
    time.sleep(0.2)  # overlap the slots' tasks, so each slot's worker is started, not one reused
    for _ in rows:
        pass
    yield pa.RecordBatch.from_pydict({"warm": [True]})


def load_transform(spec: str) -> Callable[[Any], Any]:
    """Import ``module:function``.

    Raises:
        PipelineError: the module or the function cannot be found, or is not callable.
    """
    module_name, _, function = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise PipelineError(f"--transform {spec}: cannot import {module_name}: {exc}") from exc
    transform = getattr(module, function, None)
    if not callable(transform):
        raise PipelineError(f"--transform {spec}: {module_name} has no function {function!r}")
    return transform

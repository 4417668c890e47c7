"""The pipeline's Spark session (:class:`SparkSessionManager`): started or borrowed, renewed after a
restart under Spark Connect, its Python data sources registered, its Python workers warmed, the
planner's Python checked; and the driver's signal handlers (:func:`install_signal_handlers`)."""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from chandy.connectors.spark.classic import (
    bound_connect_retries,
    default_parallelism,
    is_connect,
    quiet_logs,
    ship_python_file,
)
from chandy.connectors.spark.cluster import executor_python, task_code_zip, warm_task
from chandy.connectors.spark.driver.failures import root_cause
from chandy.connectors.spark.driver.state import DriverState
from chandy.connectors.spark.options import PipelineError
from chandy.connectors.spark.spark_urls import connect_address, redact_remote
from chandy.coordinator import faults

log = logging.getLogger(__name__)


#: seconds a job may idle before :meth:`SparkSessionManager.warm_python_workers` runs again (Spark stops a
#: Python worker idle for 60 s)
KEEP_WARM_S = 30.0
#: seconds a Spark Connect server's address may take to accept a connection before the start fails
CONNECT_TIMEOUT_S = 10.0
#: seconds a Spark Connect call retries an unavailable server before it fails (then the
#: micro-batch fails, and the restart strategy decides; pyspark's own policy waits 10 minutes)
CONNECT_RETRY_S = 60.0


def stop_spark(spark: Any) -> None:
    """Stop the session this run started. Its JVM may be gone already: a SIGTERM or Ctrl-C to the
    driver's process group reaches Spark's JVM too, and the driver then stops cleanly (exit 143 /
    130) instead of failing on py4j's refused connection."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    try:
        spark.stop()
    except (ConnectionError, OSError, Py4JError, PySparkException) as exc:  # the JVM (or Connect server) is gone
        log.info("Spark's driver was gone at stop: %s", exc)


class SparkSessionManager:
    """The run's Spark session: ``spark`` when the caller gave one (kept as it is, never stopped
    here), else one this run starts (:meth:`get_or_create`) and stops."""

    def __init__(self, state: DriverState, spark: Any = None) -> None:
        self.state = state
        self._given = spark
        self._default_slots: int | None = None  # Spark's default parallelism, once asked
        self._data_sources_registered = False

    @property
    def given(self) -> bool:
        """Whether the caller gave the session (then the run neither changes its settings nor stops it)."""
        return self._given is not None

    def get_or_create(self) -> Any:
        """The given session, else a new one (``getOrCreate``): Spark Connect's (``--remote``) once
        its server accepts connections, or the master's (``--master``) with the executors' Python
        set; ``--conf`` applied, Spark's logs quieted, the task code shipped with ``--ship-code``.
        Arms the crash points of :mod:`chandy.coordinator.faults` when the environment asks.

        Raises:
            PipelineError: the Spark Connect server is unreachable or refused the session; a
                transform's planner Python does not exist here (:meth:`check_planner_python`).
        """
        if self._given is not None:
            return self._given
        from pyspark.sql import SparkSession

        opts = self.state.options
        if os.environ.get(faults.ENV) or os.environ.get(faults.PGID_ENV):
            faults.arm()  # a crash point in a task kills the driver too
        if opts.remote:
            # Spark Connect: the driver (and its executors' Python) is the server's; this process
            # is its client, and keeps the coordinator, the lake committer and the source's enumerator
            self._check_connect_server_reachable()
            builder = SparkSession.builder.remote(opts.remote)
        else:
            # the executors' Python workers must import the tasks' packages (see executor_python)
            python = executor_python(opts.master, opts.spark_conf, os.environ)
            if python:
                os.environ["PYSPARK_PYTHON"] = python
            if self.state.transform is not None:
                self.check_planner_python(python or "python3")
            builder = SparkSession.builder.master(opts.master).config("spark.ui.showConsoleProgress", "false")
        builder = builder.appName(f"chandy-pipeline-{self.state.job_id[:8]}")
        for key, value in opts.spark_conf.items():
            builder = builder.config(key, value)
        try:
            spark = builder.getOrCreate()
            quiet_logs(spark)
            if opts.remote:
                bound_connect_retries(spark, CONNECT_RETRY_S)
            if opts.resolved_ship_code:
                code = task_code_zip()
                ship_python_file(spark, code)  # every executor fetches it before its first task
                log.info("shipped %s to the executors; their Python: %s", os.path.basename(code),
                         "the Spark Connect server's" if opts.remote else os.environ.get("PYSPARK_PYTHON", "python3"))
        except PipelineError:
            raise
        except Exception as exc:
            if not opts.remote:
                raise
            # under Connect the first calls reach the server: a refused token, a setting it refuses
            raise PipelineError(f"the Spark Connect server {redact_remote(opts.remote)} refused the session: "
                                f"{root_cause(exc)}") from exc
        return spark

    def _check_connect_server_reachable(self) -> None:
        """A Spark Connect server that does not accept connections fails the start in one line,
        within :data:`CONNECT_TIMEOUT_S` (pyspark's client would retry its first call for minutes).

        Raises:
            PipelineError: the server's address does not resolve or refuses connections.
        """
        import socket

        assert self.state.options.remote is not None
        host, port = connect_address(self.state.options.remote)
        try:
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
        except OSError as exc:
            raise PipelineError(f"cannot reach the Spark Connect server {redact_remote(self.state.options.remote)} "
                                f"({host}:{port}): {exc.strerror or exc}") from exc

    def renews(self, spark: Any) -> bool:
        """Whether a restart's attempt needs a new session (:meth:`renew`): under Spark Connect,
        unless the caller gave the session (a restarted server has lost the session, its
        artifacts and its data sources); classic Spark keeps its own."""
        return self._given is None and is_connect(spark)

    def renew(self, spark: Any) -> Any:
        """Before a restart's attempt under Spark Connect: stop ``spark`` and open a new session,
        the task code shipped and the data sources registered (the caller warms its workers),
        since the failure may have been the server's own.

        Raises:
            Exception: whatever opening the session raised (the server still down): a failed
                restart, which the restart strategy decides on.
        """
        stop_spark(spark)
        self._data_sources_registered = False
        renewed = self.get_or_create()
        self.register_data_sources(renewed)
        return renewed

    def spark_default_parallelism(self, spark: Any) -> int:
        """Spark's default parallelism (:func:`~chandy.connectors.spark.classic.default_parallelism`),
        asked once per run: under Spark Connect the answer costs a job."""
        if self._default_slots is None:
            self._default_slots = default_parallelism(spark)
        return self._default_slots

    def register_data_sources(self, spark: Any) -> None:
        """Register the two data sources with ``spark`` once (Spark 4 looks Python data sources up
        in a Python worker: about two seconds a warm standby spends before it leads, not after)."""
        if self._data_sources_registered:
            return
        from chandy.connectors.spark.task.datasources import KafkaRangesDataSource, LakeFilesDataSource

        spark.dataSource.register(KafkaRangesDataSource)
        spark.dataSource.register(LakeFilesDataSource)
        self._data_sources_registered = True

    def warm_python_workers(self, spark: Any, *, with_sink: bool = False) -> None:
        """Run one task per slot that imports the tasks' modules and creates their pooled Kafka
        clients, with the metadata of the job's topics (:func:`~chandy.connectors.spark.cluster.warm_task`)
        and, ``with_sink`` (after the preflight), the pooled lake sink, so the next micro-batch reuses started Python workers
        (``spark.python.worker.reuse``, on by default) instead of paying their start, imports and
        connections (about a second). Done by a standby before it stands by, by every run before
        its coordinator starts (so RUNNING means warm), and again while the job idles
        (:data:`KEEP_WARM_S`): Spark stops Python workers that stayed idle for a minute
        (``PythonWorkerFactory.IDLE_WORKER_TIMEOUT_NS``)."""
        opts = self.state.options
        slots = self.spark_default_parallelism(spark)
        sink = None
        if with_sink:
            sink = {"table_uri": opts.table_uri, "partition_by": tuple(opts.partition_by),
                    "storage_options": self.state.storage_options(), "catalog_properties": dict(opts.catalog_properties),
                    "add_columns": self.state.add_columns, "location": getattr(self.state.sink, "root_url", None),
                    "table_properties": dict(opts.table_properties)}
        warm = functools.partial(warm_task, opts.bootstrap_servers, self.state.job_id, opts.prefix,
                                 dict(opts.task_consumer_overrides), dict(opts.task_producer_overrides), sink,
                                 tuple(self.state.topic_names))
        try:
            spark.range(0, slots, 1, numPartitions=slots).mapInArrow(warm, "warm boolean").collect()
        except Exception as exc:  # noqa: BLE001 - only an optimization: the first micro-batch starts them anyway
            log.warning("could not warm the Python workers: %s", root_cause(exc))
        self.state.last_spark_job = time.monotonic()

    def check_planner_python(self, python: str) -> None:
        """With a transform, the micro-batch reads and writes through Python data sources, which
        Spark plans on the driver in a Python worker started with the executors' Python path,
        from this process's directory (``PythonPlannerRunner``): that path must run here too.

        Raises:
            PipelineError: it does not (e.g. ``./environment/bin/python`` of an archive that only
                the executors unpack).
        """
        import shutil

        found = os.path.isfile(python) if os.sep in python else shutil.which(python) is not None
        if not found:
            raise PipelineError(
                f"--transform: Spark plans the transform's data sources on the driver with the executors' Python "
                f"{python!r}, which does not exist from {os.getcwd()}; run from a directory where it does (the "
                "environment archive unpacked there, or a link to an environment with Chandy's dependencies)")


def install_signal_handlers(state: DriverState) -> dict[int, Any]:
    """Ctrl-C (SIGINT) and SIGTERM finish or abort the checkpoint in flight and stop
    (:meth:`DriverState.request_stop`); a second one stops at once (``KeyboardInterrupt``).
    Installed after Spark starts, since PySpark's SparkContext replaces the SIGINT handler with
    its own; only on the main thread (elsewhere nothing is installed). Returns the handlers
    replaced, for :func:`restore_signal_handlers`."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def handler(signum: int, frame: Any) -> None:
        if state.stop.is_set():
            raise KeyboardInterrupt
        print(f"\n{signal.Signals(signum).name}: stopping after the checkpoint in flight "
              "(again to stop at once)", file=sys.stderr)
        state.request_stop(signum)

    previous: dict[int, Any] = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, handler)
    return previous


def restore_signal_handlers(previous: dict[int, Any]) -> None:
    """Put back the handlers :func:`install_signal_handlers` replaced."""
    for signum, handler in previous.items():
        signal.signal(signum, handler)

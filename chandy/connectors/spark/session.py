"""The pipeline's Spark session: started or borrowed, its Python data sources registered, its
Python workers warmed, the planner's Python checked, and the driver's signal handlers."""

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
from chandy.connectors.spark.cluster import (
    executor_python,
    root_cause,
    task_code_zip,
    warm_task,
)
from chandy.connectors.spark.driver_core import PipelineCore
from chandy.connectors.spark.options import (
    PipelineError,
)
from chandy.connectors.spark.spark_urls import connect_address, redact_remote
from chandy.coordinator import faults

log = logging.getLogger(__name__)


#: seconds a job may idle before :meth:`PipelineSession._warm_python_workers` runs again (Spark stops a
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


class PipelineSession(PipelineCore):
    """The session part of :class:`~chandy.connectors.spark.pipeline.Pipeline`."""

    def _spark_session(self) -> Any:
        if self._spark is not None:
            return self._spark
        from pyspark.sql import SparkSession

        opts = self.options
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
            if self._transform is not None:
                self._check_planner_python(python or "python3")
            builder = SparkSession.builder.master(opts.master).config("spark.ui.showConsoleProgress", "false")
        builder = builder.appName(f"chandy-pipeline-{self.job_id[:8]}")
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

        assert self.options.remote is not None
        host, port = connect_address(self.options.remote)
        try:
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
        except OSError as exc:
            raise PipelineError(f"cannot reach the Spark Connect server {redact_remote(self.options.remote)} "
                                f"({host}:{port}): {exc.strerror or exc}") from exc

    def _renew_connect_session(self, spark: Any, restart: int) -> Any:
        """Before a restart's attempt under Spark Connect: a new session (the task code shipped,
        the data sources registered, the Python workers warmed), since the failure may have been
        the server's own (a restarted server has lost the session, its artifacts and its data
        sources). A session the caller gave, or classic Spark, is kept.

        Raises:
            Restart: the server cannot be reached yet, and the restart strategy allows another attempt.
            PipelineError: it cannot, and the restart strategy gave up.
        """
        if self._spark is not None or not is_connect(spark):
            return spark
        from chandy.connectors.spark.restarts import Restart

        stop_spark(spark)
        self._data_sources_registered = False
        try:
            renewed = self._spark_session()
            self._register_data_sources(renewed)
        except Exception as exc:  # the server still down: a failed restart, retried as one
            reason = f"restart {restart} could not open a Spark Connect session: {root_cause(exc)}"
            delay = self._restart_delay_s(reason)
            if delay is None:
                raise PipelineError(f"job {self.job_id} failed: {self._gave_up(reason, restart)}") from exc
            raise Restart(reason, delay) from exc
        self._warm_python_workers(renewed, with_sink=True)
        return renewed

    def _default_parallelism(self, spark: Any) -> int:
        """Spark's default parallelism (:func:`~chandy.connectors.spark.classic.default_parallelism`),
        asked once per run: under Spark Connect the answer costs a job."""
        if self._default_slots is None:
            self._default_slots = default_parallelism(spark)
        return self._default_slots

    def _register_data_sources(self, spark: Any) -> None:
        """Register the two data sources with ``spark`` once (Spark 4 looks Python data sources up
        in a Python worker: about two seconds a warm standby spends before it leads, not after)."""
        if self._data_sources_registered:
            return
        from chandy.connectors.spark.task.datasources import KafkaRangesDataSource, LakeFilesDataSource

        spark.dataSource.register(KafkaRangesDataSource)
        spark.dataSource.register(LakeFilesDataSource)
        self._data_sources_registered = True

    def _warm_python_workers(self, spark: Any, *, with_sink: bool = False) -> None:
        """Run one task per slot that imports the tasks' modules and creates their pooled Kafka
        clients, with the metadata of the job's topics (:func:`~chandy.connectors.spark.cluster.warm_task`)
        and, ``with_sink`` (after the preflight), the pooled lake sink, so the next micro-batch reuses started Python workers
        (``spark.python.worker.reuse``, on by default) instead of paying their start, imports and
        connections (about a second). Done by a standby before it stands by, by every run before
        its coordinator starts (so RUNNING means warm), and again while the job idles
        (:data:`KEEP_WARM_S`): Spark stops Python workers that stayed idle for a minute
        (``PythonWorkerFactory.IDLE_WORKER_TIMEOUT_NS``)."""
        opts = self.options
        slots = self._default_parallelism(spark)
        sink = None
        if with_sink:
            sink = {"table_uri": opts.table_uri, "partition_by": tuple(opts.partition_by),
                    "storage_options": dict(opts.storage_options), "catalog_properties": dict(opts.catalog_properties),
                    "add_columns": self.add_columns, "location": getattr(self.sink, "root_url", None),
                    "table_properties": dict(opts.table_properties)}
        warm = functools.partial(warm_task, opts.bootstrap_servers, self.job_id, opts.prefix,
                                 dict(opts.task_consumer_overrides), dict(opts.task_producer_overrides), sink,
                                 tuple(self.topic_names))
        try:
            spark.range(0, slots, 1, numPartitions=slots).mapInArrow(warm, "warm boolean").collect()
        except Exception as exc:  # noqa: BLE001 - only an optimization: the first micro-batch starts them anyway
            log.warning("could not warm the Python workers: %s", root_cause(exc))
        self.last_spark_job = time.monotonic()

    def _check_planner_python(self, python: str) -> None:
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

    def _install_signal_handlers(self) -> dict[int, Any]:
        """Ctrl-C (SIGINT) and SIGTERM finish or abort the checkpoint in flight and stop; a
        second one stops at once. Installed after Spark starts, since PySpark's SparkContext
        replaces the SIGINT handler with its own."""
        if threading.current_thread() is not threading.main_thread():
            return {}

        def handler(signum: int, frame: Any) -> None:
            if self._stop.is_set():
                raise KeyboardInterrupt
            print(f"\n{signal.Signals(signum).name}: stopping after the checkpoint in flight "
                  "(again to stop at once)", file=sys.stderr)
            self.request_stop(signum)

        previous: dict[int, Any] = {}
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous[signum] = signal.signal(signum, handler)
        return previous

    @staticmethod
    def _restore_signal_handlers(previous: dict[int, Any]) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

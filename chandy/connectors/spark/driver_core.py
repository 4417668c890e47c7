"""What every part of the pipeline's driver shares: :class:`PipelineCore` holds one run's
settings, its sink, its coordinator service and its counters. The parts
(:mod:`~chandy.connectors.spark.pipeline` the loop, :mod:`~chandy.connectors.spark.preflight`,
:mod:`~chandy.connectors.spark.session`, :mod:`~chandy.connectors.spark.decoding`,
:mod:`~chandy.connectors.spark.micro_batch`, :mod:`~chandy.connectors.spark.request_executor`) add
their methods; the declarations at the end name what one part calls of another."""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from chandy.connectors.kafka.source.split import KafkaPartitionSplit
from chandy.connectors.lake.routing import Router
from chandy.connectors.lake.sink import TP, TableProgress
from chandy.connectors.lake.sinks import LakeSink, open_sink
from chandy.connectors.spark.cluster import (
    load_transform,
)
from chandy.connectors.spark.options import (
    SINK_OPERATOR,
    SOURCE_OPERATOR,
    PipelineOptions,
)
from chandy.coordinator.kafka.election import LeaderElection
from chandy.coordinator.kafka.metrics import MetricScope
from chandy.coordinator.kafka.requests import ControlRequest
from chandy.coordinator.kafka.runtime import CoordinatorService
from chandy.coordinator.restart_strategy import RestartBackoffTimeStrategy, create_restart_strategy
from chandy.formats.decoder import ValueDecoder

log = logging.getLogger(__name__)


class PipelineCore:
    """The shared state of :class:`~chandy.connectors.spark.pipeline.Pipeline`."""

    def __init__(self, options: PipelineOptions, *, spark: Any = None) -> None:
        self.options = options
        self.job_id = options.resolved_job_id
        #: the metrics' Flink scope: job name, host, and the task that chains the source and the sink
        self.metric_scope = MetricScope(self.job_id, options.resolved_job_name,
                                        task_name=f"Source: {SOURCE_OPERATOR} -> {SINK_OPERATOR}",
                                        legacy_names=options.metrics_legacy_names)
        self._spark = spark
        self._stop = threading.Event()
        self._wake = threading.Event()
        self.stop_signal: int | None = None
        # schema evolution: decoded value fields the table lacks become columns (never the raw
        # Kafka columns of a table landed otherwise)
        self.add_columns = options.schema_evolution and options.value_format is not None
        self.sink: LakeSink = open_sink(options.table_uri, partition_by=options.partition_by,
                                        storage_options=options.storage_options,
                                        catalog_properties=options.catalog_properties, add_columns=self.add_columns,
                                        table_properties=options.table_properties)
        self._transform = load_transform(options.transform) if options.transform else None
        #: ``--route``'s rules, relative table paths made absolute here (None: one table)
        self.router: Router | None = Router.parse(options.routes, options.route_field,
                                                              options.route_by).resolved() if options.routes else None
        self.service: CoordinatorService | None = None
        self.parallelism = 0
        self._default_slots: int | None = None  # Spark's default parallelism, once asked (session.py)
        self.topic_names: list[str] = list(options.topics)
        self.partitions: list[TP] = []
        self.notices: list[str] = []
        self.table_progress: TableProgress | None = None
        #: ``--ending-offsets`` resolved when the run starts: (topic, partition) -> end (exclusive)
        self.ending_offsets: dict[TP, int] | None = None
        self.table_fields: dict[str, Any] | None = None
        self.cluster_id: str | None = None
        self.decoder: ValueDecoder | None = None
        self.bad_records = 0
        self.dead_lettered = 0
        self.tombstones_skipped = 0
        #: --no-fail-on-data-loss: offsets the job skipped because partitions' logs moved below its
        #: position (the Kafka source's ``offsets_lost``, over this run's attempts: offsets deleted
        #: before they were read, and the offsets recreated or truncated logs moved back by)
        self.offsets_lost = 0
        self._offsets_lost_before = 0  # of those, the attempts before this one
        self._data_loss_seen = 0  # the source's data-loss warnings of this attempt already noticed
        self._checkpoint_id_floor: int | None = None
        self._preflight_done = False
        self._static_checked = False
        self._data_sources_registered = False
        self._requests: queue.Queue[tuple[ControlRequest, concurrent.futures.Future]] = queue.Queue()
        self._draining: tuple[ControlRequest, concurrent.futures.Future] | None = None
        # requests taken off the queue by the driver loop, in arrival order (driver thread only)
        self._backlog: collections.deque[tuple[ControlRequest, concurrent.futures.Future]] = collections.deque()
        self.election: LeaderElection | None = None
        self.takeover_s: float | None = None
        #: Flink's restartingTime: the last restart of this run, from its failure to the new
        #: coordinator running, in ms (0 before any); _restart_began: when the one in progress began
        self.restarting_ms = 0.0
        self._restart_began: float | None = None
        self._last_committed = 0
        self._lag_consumer: Any = None  # reads the source's last stable offsets (micro_batch.py)
        #: the job's restart strategy (Flink's), made at the start of :meth:`Pipeline.run`
        self._restart_strategy: RestartBackoffTimeStrategy = create_restart_strategy(options.restart_strategy_options)
        self.last_spark_job = 0.0  # time.monotonic() of the last Spark job (a micro-batch or a warm-up)

    def _notice(self, message: str) -> None:
        self.notices.append(message)
        log.warning("%s", message)

    # -- preflight: everything checked before Spark starts --------------------------------------

    def _enumerator_call(self, func: Callable[[Any], Any]) -> Any:
        assert self.service is not None
        return self.service.call_operator_coordinator(SOURCE_OPERATOR, func)

    def request_stop(self, signum: int | None = None) -> None:
        """Finish (or abort) the checkpoint in flight and stop; callable from any thread or signal handler."""
        if signum is not None and self.stop_signal is None:
            self.stop_signal = signum
        self._stop.set()

    # -- what one part calls of another ----------------------------------------------------------
    def _await(self, trigger: Any, timeout_s: float) -> Any:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.micro_batch`

    def _backoff_s(self, consecutive_failures: int) -> float:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.micro_batch`

    def _cancel(self, request: tuple[ControlRequest, concurrent.futures.Future]) -> None:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.request_executor`

    def _record_failure(self, reason: str) -> None:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.pipeline`

    def _check_output_schema(self, schema: pa.Schema) -> None:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.decoding`

    def _committed_records(self) -> int:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.micro_batch`

    @staticmethod
    def _decode_frame(df: Any, task: Any) -> Any:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.decoding`

    def _decoder_from_known_schema(self) -> ValueDecoder | None:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.decoding`

    @staticmethod
    def _fail_request(request: tuple[ControlRequest, concurrent.futures.Future] | None, exc: BaseException) -> None:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.request_executor`

    def _fenced_message(self) -> str:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.pipeline`

    def _reconcile(self) -> None:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.preflight`

    def _idle(self, seconds: float) -> None:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.request_executor`

    def _infer_decoder(self, ranges: dict[tuple[str, int], KafkaPartitionSplit]) -> ValueDecoder:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.decoding`

    def _install_signal_handlers(self) -> dict[int, Any]:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.session`

    def _next_request(self) -> tuple[ControlRequest, concurrent.futures.Future] | None:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.request_executor`

    def _output_schema(self) -> pa.Schema:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.decoding`

    def _ranges(self, checkpoint_id: int, future: Any, timeout_s: float) -> dict[tuple[str, int], KafkaPartitionSplit]:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.micro_batch`

    def _register_data_sources(self, spark: Any) -> None:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.session`

    def _restart_delay_s(self, reason: str) -> float | None:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.restarts`

    def _gave_up(self, reason: str, restarts: int) -> str:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.restarts`

    @staticmethod
    def _restore_signal_handlers(previous: dict[int, Any]) -> None:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.session`

    def _run_micro_batch(self, spark: Any, checkpoint_id: int, ranges: dict) -> None:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.micro_batch`

    def _safe_committed_records(self) -> int:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.micro_batch`

    def _spark_session(self) -> Any:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.session`

    def _trigger_for(self, request: tuple[ControlRequest, concurrent.futures.Future] | None) -> Any:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.request_executor`

    def _warm_python_workers(self, spark: Any, *, with_sink: bool = False) -> None:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.session`

    def check_static(self) -> None:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.preflight`

    def lag(self) -> dict[tuple[str, int], int]:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.micro_batch`

    def preflight(self) -> None:
        raise NotImplementedError  # :mod:`chandy.connectors.spark.preflight`

"""What the driver's collaborators share: :class:`DriverState`, one run's settings, its sink, its
coordinator service, what the preflight learnt (topics, partitions, the table's progress and
columns), the value decoder and the run's counters.

Each collaborator of :class:`~chandy.connectors.spark.driver.pipeline.Pipeline` gets this one
object and reads or sets its fields; a collaborator's own bookkeeping (the request queue, the lag
client, the restart strategy, the Spark session) stays in that collaborator."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

from chandy.connectors.lake.routing import Router
from chandy.connectors.lake.sink import TP, TableProgress
from chandy.connectors.lake.tables import LakeSink, open_sink
from chandy.connectors.spark.cluster import load_transform
from chandy.connectors.spark.options import SINK_OPERATOR, SOURCE_OPERATOR, PipelineOptions
from chandy.coordinator.kafka.election import LeaderElection
from chandy.coordinator.kafka.metrics import MetricScope
from chandy.coordinator.kafka.runtime import CoordinatorService
from chandy.formats.decoder import ValueDecoder

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class DriverState:
    """One run's shared state (see the module docstring). Made by :meth:`open`; the driver thread
    changes it, except :attr:`stop` and :attr:`wake` (any thread, signal handlers included) and the
    dead-letter counters (the coordinator's I/O executor, one completion at a time)."""

    options: PipelineOptions
    job_id: str
    #: the metrics' Flink scope: job name, host, and the task that chains the source and the sink
    metric_scope: MetricScope
    #: the job's table (``--table``), opened with the options' partitioning, storage and properties
    sink: LakeSink
    #: schema evolution: decoded value fields the table lacks become columns (never the raw Kafka
    #: columns of a table landed otherwise)
    add_columns: bool
    #: ``--transform`` (DataFrame -> DataFrame), None without one
    transform: Callable[[Any], Any] | None
    #: ``--route``'s rules, relative table paths made absolute here (None: one table)
    router: Router | None
    #: set to stop after the checkpoint in flight (:meth:`request_stop`)
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)
    #: set when a control request arrives, to end an idle wait early
    wake: threading.Event = dataclasses.field(default_factory=threading.Event)
    #: the signal that stopped the run (SIGINT, SIGTERM), if one did
    stop_signal: int | None = None
    #: the running attempt's coordinator (None before the first attempt starts)
    service: CoordinatorService | None = None
    #: subtasks of ``lake-sink``: one Spark task each
    parallelism: int = 0
    #: the topics read (``--topic``, or those ``--topic-pattern`` matched at the preflight)
    topic_names: list[str] = dataclasses.field(default_factory=list)
    #: the (topic, partition)s of those topics at the preflight
    partitions: list[TP] = dataclasses.field(default_factory=list)
    #: one line each for what the run did that the user should know (also logged as warnings)
    notices: list[str] = dataclasses.field(default_factory=list)
    #: what the table held of the job at the preflight (its offsets floor the source's ranges)
    table_progress: TableProgress | None = None
    #: ``--ending-offsets`` resolved when the run starts: (topic, partition) -> end (exclusive)
    ending_offsets: dict[TP, int] | None = None
    #: the table's columns as Delta type JSON (None: no table yet)
    table_fields: dict[str, Any] | None = None
    #: the routed tables' sinks the lake committer opened (``--route``), by table URI
    routed_sinks: dict[str, LakeSink] = dataclasses.field(default_factory=dict)
    #: the Kafka cluster's ID, as the brokers answered the preflight
    cluster_id: str | None = None
    #: how the tasks decode keys and values (None: raw Kafka columns, or JSON not inferred yet)
    decoder: ValueDecoder | None = None
    #: bad records of this run, in completed checkpoints; of those, published as dead letters
    bad_records: int = 0
    dead_lettered: int = 0
    tombstones_skipped: int = 0
    #: --no-fail-on-data-loss: offsets the job skipped because partitions' logs moved below its
    #: position (the Kafka source's ``offsets_lost``, over this run's attempts: offsets deleted
    #: before they were read, and the offsets recreated or truncated logs moved back by)
    offsets_lost: int = 0
    #: the table's newest checkpoint of the job + 1 (Flink's ``CheckpointIDCounter.setCount``)
    checkpoint_id_floor: int | None = None
    #: the job's election group, joined by a ``--standby`` before it leads
    election: LeaderElection | None = None
    #: a standby's take-over: seconds from leading the election to its coordinator running
    takeover_s: float | None = None
    #: Flink's restartingTime: the last restart of this run, from its failure to the new
    #: coordinator running, in ms (0 before any); restart_began: when the one in progress began
    restarting_ms: float = 0.0
    restart_began: float | None = None
    #: time.monotonic() of the last Spark job (a micro-batch or a warm-up)
    last_spark_job: float = 0.0

    @classmethod
    def open(cls, options: PipelineOptions) -> DriverState:
        """The state of a new run of ``options``: the table's sink opened (nothing read yet), the
        transform imported and the routes parsed.

        Raises:
            PipelineError: ``--transform`` cannot be imported.
        """
        job_id = options.resolved_job_id
        scope = MetricScope(job_id, options.resolved_job_name, task_name=f"Source: {SOURCE_OPERATOR} -> {SINK_OPERATOR}",
                            legacy_names=options.metrics_legacy_names)
        add_columns = options.schema_evolution and options.value_format is not None
        sink = open_sink(options.table_uri, partition_by=options.partition_by, storage_options=options.storage_options,
                         catalog_properties=options.catalog_properties, add_columns=add_columns,
                         table_properties=options.table_properties)
        transform = load_transform(options.transform) if options.transform else None
        router = Router.parse(options.routes, options.route_field, options.route_by).resolved() if options.routes else None
        return cls(options, job_id, scope, sink, add_columns, transform, router, topic_names=list(options.topics))

    def storage_options(self) -> dict[str, Any]:
        """The job's storage options as they are now: the ones given, and the credentials the
        catalog vends with an Iceberg table of a REST catalog, renewed when they expire soon
        (:meth:`~chandy.connectors.lake.sink.SchemaChecked.task_storage_options`); for the
        checkpoint storage (whose default directory lies in the table's location), the dead
        letters and the tasks."""
        return self.sink.task_storage_options()

    def running(self) -> CoordinatorService:
        """The running attempt's coordinator; called only once an attempt started it."""
        assert self.service is not None
        return self.service

    def enumerator_call(self, func: Callable[[Any], Any]) -> Any:
        """``func(enumerator)`` on the coordinator's mailbox: the Kafka source's enumerator
        (``kafka-source``) is read and changed only there.

        Raises:
            ChandyError: the coordinator stopped, or ``func`` raised.
        """
        return self.running().call_operator_coordinator(SOURCE_OPERATOR, func)

    def notice(self, message: str) -> None:
        """Tell the user ``message`` (one line): logged as a warning and kept for the run's summary."""
        self.notices.append(message)
        log.warning("%s", message)

    def request_stop(self, signum: int | None = None) -> None:
        """Finish (or abort) the checkpoint in flight and stop; callable from any thread or signal handler."""
        if signum is not None and self.stop_signal is None:
            self.stop_signal = signum
        self.stop.set()

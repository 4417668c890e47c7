"""The lake committer: an operator coordinator that makes a completed checkpoint's files visible.

Protocol, in order (docs/design.md, "The pipeline's commit protocol"):

1. the write tasks (subtasks of this operator) write Parquet files into the table location and
   acknowledge checkpoint N with them as state handles; the files are in N's ``_metadata``;
2. ``notify_checkpoint_complete(N)``: read N's ``_metadata``: its files, and (through
   ``offsets_of``) the offset range of every (topic, partition) it covers;
3. check the table, which is the truth about what landed: if the table already holds N (its app
   transaction version is N or later) the commit is skipped, but only when the table's recorded
   offsets cover N's ranges; if a range starts below what the table holds, landing it would
   duplicate records, so nothing is committed and the job fails, naming the partition;
4. commit N's files in one Delta commit with app transaction (job id, N) and ``commitInfo``
   recording the end offsets of every partition landed so far (cumulative);
5. announce it: a ``LAKE_COMMITTED`` event (the table, its version or snapshot ID, the records,
   files and offset ranges added) on the checkpoint-events topic, in one Kafka transaction with a
   :class:`~chandy.connectors.lake.log_records.LakeCommitRecord` in the coordinator log, so the
   event is published exactly when the log says so; a restart, a restore or a standby's
   take-over that finds the table holding checkpoints the log has not announced announces them
   (read from the table's own history), in order, and never one twice;
6. only then does the Kafka source, notified next, commit the consumer-group offsets: offsets
   are never committed past what the table holds.

The commit runs on the mailbox thread, on purpose: it must finish before the source commits its
offsets, and that order is the order of notifications. ``reset_to_checkpoint(N)`` (a restart)
commits N as well, since restoring implies completion, and then, once its start is in the
coordinator log, deletes the job's data files that no commit references (written by aborted or
crashed checkpoints) and that this coordinator log's runs wrote (``log_id``).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from chandy.connectors.lake.log_records import LAKE_COMMITS_KIND, LakeCommitRecord
from chandy.connectors.lake.sink import (
    COMMIT_ATTEMPTS,
    SOURCE_METRICS_KIND,
    TP,
    DataFile,
    LakeCommit,
    LakeCommitError,
    LakeDivergenceError,
    LakeLayoutError,
    LakeSchemaError,
    LakeSink,
    data_files_from_handles,
    offsets_from_json,
    valid_through_ms,
    with_incarnation,
)
from chandy.connectors.lake.uri import TableLayouts, TableUriError
from chandy.coordinator.faults import crash_point
from chandy.coordinator.messages import IdlePartition, OffsetRange, PartitionEventTime
from chandy.coordinator.operator_coordinator import NO_CHECKPOINT, OperatorEvent
from chandy.coordinator.storage import (
    CheckpointMetadata,
    CheckpointStorage,
    CheckpointStorageError,
    resolve_checkpoint_pointer,
)

log = logging.getLogger(__name__)

#: (topic, partition) -> (start offset, end offset) of a checkpoint's ranges
OffsetRanges = Mapping[TP, tuple[int, int]]


@dataclasses.dataclass
class TableView:
    """What one table holds for the job, as a :class:`LakeCommitter` last read it from the table
    or wrote it there: the job's newest checkpoint in it (None: none), the job's cumulative end
    offsets it recorded (per (topic, partition)), and the completeness watermark's per-partition
    times (ms)."""

    checkpoint: int | None
    offsets: dict[TP, int]
    event_times: dict[TP, int]
    #: the partitions the read asked for (a Delta table whose job's commits left its log has
    #: their offsets in app transactions, read by partition): a read for others reads again
    partitions: frozenset[TP] = frozenset()


@dataclasses.dataclass(frozen=True)
class Watermark:
    """The completeness watermark of one checkpoint's commit: per (topic, partition) the newest
    Kafka record timestamp the job landed (ms), the watermark over them
    (:func:`~chandy.connectors.lake.sink.valid_through_ms`: None while a partition that is not
    idle is unread), and the ``idle`` partitions it leaves out (``--source-idle-timeout``)."""

    event_times: Mapping[TP, int]
    valid_through_ms: int | None
    idle: tuple[TP, ...] = ()


class LakeCommitter:
    """The lake sink's operator coordinator (see the module docstring).

    Args:
        context: the operator coordinator context.
        sink: the table.
        storage: the job's checkpoint storage, to read ``_metadata``.
        offsets_of: the offset ranges a checkpoint covers, read from its ``_metadata`` (the
            source's state); None when the source has no offsets (nothing is recorded or checked).
        cluster_id: the Kafka cluster's ID, recorded with each commit.
        optimize_every: compact the table (``sink.optimize``) after every checkpoint whose ID is
            a multiple of this, on a thread of its own, concurrently with the next checkpoints;
            None: never. A failed compaction is logged, never fails the job.
        optimize_target_size: the compacted files' size in bytes (None: the sink's default).
        vacuum_every: after every checkpoint whose ID is a multiple of this, on the same thread
            after any compaction, delete what the tables removed more than
            ``vacuum_retention_hours`` ago (``sink.vacuum``: Delta's lite VACUUM, Iceberg's
            expire snapshots, keeping the ``vacuum_retain_last`` newest); None: never. A failed
            vacuum is logged, never fails the job.
        open_table: opens the sink of a table the job routes records to (``--route``), by its
            normalised URI; None: every file belongs to ``sink`` (routing: docs/design.md §7).
        changes: the files are change files (``--cdc``), applied as upserts (``commit_changes``).
        log_id: the job's coordinator log's ID (``coordinator_log_id`` without an incarnation):
            with the incarnation of the log this coordinator replayed
            (``context.log_incarnation()``, ``with_incarnation``) it names the files this log's
            runs write; cleanups delete only files named with it (or with none).
        source_idle_timeout_ms: a partition that got no record for this long (ms; since this run
            first met it, for one never read) stops holding the completeness watermark back and is
            named in ``LAKE_COMMITTED``'s ``idle_partitions`` (Flink's ``WatermarkStrategy.withIdleness``);
            None: every assigned partition holds it back until read, and at its newest record.
        commit_threads: how many of a checkpoint's routed tables (or catalog transactions) commit
            at once (:meth:`_side_by_side`); ``--table`` commits after them, alone. 1: one after
            another, in URI order.
    """

    def __init__(self, context: Any, sink: LakeSink, storage: CheckpointStorage, *,
                 offsets_of: Callable[[CheckpointMetadata], OffsetRanges] | None = None,
                 cluster_id: str | None = None, optimize_every: int | None = None,
                 optimize_target_size: int | None = None, open_table: Callable[[str], LakeSink] | None = None,
                 changes: bool = False, vacuum_every: int | None = None,
                 vacuum_retention_hours: float = 168.0, vacuum_retain_last: int = 1,
                 log_id: str | None = None, source_idle_timeout_ms: int | None = None, commit_threads: int = 1) -> None:
        self.context = context
        self.commit_threads = commit_threads
        self._counting = threading.Lock()  # what the table commits running side by side count
        self.source_idle_timeout_ms = source_idle_timeout_ms
        self._active_at: dict[TP, float] = {}  # per partition, when (monotonic ms) it last had records, or was first met
        #: the data files of this incarnation of the job's coordinator log: the only ones it deletes
        self.log_id = None if log_id is None else with_incarnation(log_id, context.log_incarnation())
        self.open_table = open_table
        self.changes = changes
        self._routed: dict[str, LakeSink] = {}  # the routed tables this run met, by URI
        self._layouts: TableLayouts | None = None  # the locations of the job's table and of those in _routed
        #: what each table (the job's and each routed one, by URI) holds for the job, as last read or written
        self._views: dict[str, TableView] = {}
        self._cleaned: set[str] = set()  # routed tables whose unreferenced files this run deleted
        self._committed_through: int | None = None  # the newest checkpoint this run committed and announced
        self._restoring = False  # in reset_to_checkpoint, which cleans every table it meets itself
        self.sink = sink
        self.storage = storage
        self._foreign_checkpoint: int | None = None  # restored from another table's savepoint
        self.offsets_of = offsets_of
        self.cluster_id = cluster_id
        self.optimize_every = optimize_every
        self.optimize_target_size = optimize_target_size
        self.vacuum_every, self.vacuum_retention_hours = vacuum_every, vacuum_retention_hours
        self.vacuum_retain_last = vacuum_retain_last
        self.vacuumed: list[list[str]] = []  # the paths each vacuum of this run deleted
        self.committed_checkpoints: list[int] = []
        self.records_committed = 0
        self.optimizations: list[dict[str, Any]] = []  # metrics of the compactions this run did
        self.last_commit_ms: float | None = None  # the latest notify_checkpoint_complete's lake commit, in ms
        self.last_commit_ended_ms: float | None = None  # when it ended, in ms since the epoch
        #: per subtask, FetchTime - EventTime (ms) of the newest record its latest committed
        #: checkpoint fetched (Flink's currentFetchEventTimeLag), from its "source-metrics" handle
        self.fetch_event_time_lag_ms: dict[int, int] = {}
        #: what the checkpoints this run committed read, for the Kafka consumer's metrics: the
        #: record bytes (keys and values; bytes_consumed_rate), the Fetch requests and the records
        #: librdkafka received for them (records_per_request_avg)
        self.bytes_read = self.fetch_requests = self.records_fetched = 0
        self._optimizer: concurrent.futures.ThreadPoolExecutor | None = None
        self._optimizing: concurrent.futures.Future | None = None

    def start(self) -> None:
        pass

    def close(self) -> None:
        if self._optimizer is not None:
            self._optimizer.shutdown(wait=True)

    def _maybe_optimize(self, checkpoint_id: int, sinks: list[LakeSink]) -> None:
        """Start the table maintenance due after checkpoint ``checkpoint_id`` on ``sinks`` (the
        tables the checkpoint committed to): a compaction after every ``optimize_every``-th
        checkpoint, then a vacuum after every ``vacuum_every``-th, unless the last still runs."""
        compact = bool(self.optimize_every) and not checkpoint_id % (self.optimize_every or 1)
        vacuum = bool(self.vacuum_every) and not checkpoint_id % (self.vacuum_every or 1)
        if not compact and not vacuum:
            return
        if self._optimizing is not None and not self._optimizing.done():
            log.info("checkpoint %d: the previous compaction still runs; not starting another", checkpoint_id)
            return
        if self._optimizer is None:
            self._optimizer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="chandy-optimize")
        target_size = self.optimize_target_size

        def optimize() -> None:
            for sink in sinks:
                try:
                    if compact:
                        self.optimizations.append(sink.optimize(target_size=target_size))
                    if vacuum:
                        self.vacuumed.append(sink.vacuum(retention_hours=self.vacuum_retention_hours,
                                                         retain_last=self.vacuum_retain_last))
                except Exception as exc:  # noqa: BLE001 - storage and delta-rs errors alike: the next one may succeed
                    log.warning("maintenance of %s after checkpoint %d failed (the pipeline goes on): %s",
                                sink.table_uri, checkpoint_id, exc)

        self._optimizing = self._optimizer.submit(optimize)

    def checkpoint_coordinator(self, checkpoint_id: int, result_future: concurrent.futures.Future) -> None:
        # the files are the subtasks' state; the committer's own is the table they belong to, so a
        # job restored from this checkpoint or savepoint into another table knows they are not its
        result_future.set_result(json.dumps({"table_uri": self.sink.table_uri}).encode())

    def _metadata(self, checkpoint_id: int) -> CheckpointMetadata:
        """The ``_metadata`` of checkpoint or savepoint ``checkpoint_id``: where the coordinator
        says it is (a savepoint lives in the savepoint directory), else the checkpoint directory."""
        pointer = self.context.checkpoint_pointer(checkpoint_id) or self.storage.checkpoint_directory(checkpoint_id)
        _, metadata = resolve_checkpoint_pointer(pointer, self.storage.storage_options)
        return metadata

    def _check_own_metadata(self, checkpoint_id: int, metadata: CheckpointMetadata) -> None:
        """Before checkpoint ``checkpoint_id``'s completion notice commits anything: its
        ``_metadata`` is this coordinator log's (``CheckpointMetadata.coordinator_log`` equals
        ``context.coordinator_log()``, when both are known). Two coordinator logs of one job (two
        ``--prefix``es) hand out the same checkpoint IDs into one checkpoint directory: committing
        the other log's checkpoint N while this log's source commits its own N's offsets to the
        consumer group would leave the group ahead of the tables (found by the commit-protocol
        simulation, issue 54: family routed-two-logs-faults, seed 1007916).

        Raises:
            LakeDivergenceError: the ``_metadata`` names another coordinator log.
        """
        own, written_by = self.context.coordinator_log(), metadata.coordinator_log
        if own is None or written_by is None or own == written_by:
            return
        raise LakeDivergenceError(
            f"checkpoint {checkpoint_id}'s _metadata was written by coordinator log {written_by}, not by this one "
            f"({own}): another coordinator log of job {self.context.job_id} (another --prefix, or the old log of a "
            "lost one) uses the same checkpoint directory and IDs; nothing is committed. Run each job under one prefix")

    def files_of(self, checkpoint_id: int, metadata: CheckpointMetadata | None = None) -> list[DataFile]:
        """The data files checkpoint ``checkpoint_id`` references, from its ``_metadata``."""
        metadata = metadata or self._metadata(checkpoint_id)
        operator = metadata.operator(self.context.operator_id)
        if operator is None:
            return []
        return data_files_from_handles(h for s in operator.subtask_states for h in s.state_handles)

    def _note_source_metrics(self, metadata: CheckpointMetadata,
                             landed: Mapping[TP, int]) -> tuple[dict[TP, int], dict[str, int]]:
        """Keep each subtask's fetch lag of this checkpoint (its ``source-metrics`` handle, if
        any), and return the completeness watermark's per-partition times once this checkpoint
        lands (``landed``, the job's table's, raised by the newest timestamps its subtasks read) and
        the record bytes, Fetch requests and records fetched its subtasks counted."""
        event_times, counts = dict(landed), {"bytes_read": 0, "fetch_requests": 0, "records_fetched": 0}
        operator = metadata.operator(self.context.operator_id)
        for subtask in operator.subtask_states if operator is not None else ():
            for handle in subtask.state_handles:
                if handle.kind != SOURCE_METRICS_KIND:
                    continue
                try:
                    lag = int(handle.properties["fetch_time_ms"]) - int(handle.properties["event_time_ms"])
                    read = offsets_from_json(handle.properties.get("partition_event_time_ms"))
                except (KeyError, ValueError, LakeCommitError):
                    continue
                self.fetch_event_time_lag_ms[subtask.subtask_index] = lag
                for name in counts:
                    counts[name] += int(handle.properties.get(name) or 0)
                for tp, millis in read.items():
                    event_times[tp] = max(millis, event_times.get(tp, millis))
        return event_times, counts

    def _check_ranges(self, sink: LakeSink, checkpoint_id: int, ranges: OffsetRanges, already_committed: int | None,
                      held: Mapping[TP, int], *, gaps: bool = True) -> None:
        """Step 3 of the module docstring, for ``sink``, which holds ``held`` of the job's
        partitions; ``gaps``: refuse a range that starts above what the table holds (not for a
        routed table, which gets a commit only when records are routed to it): the job's ranges
        of a partition the table holds start at the table's offsets (``offset_floor``), so a
        higher start is another coordinator's memory (found by the commit-protocol simulation:
        two first runs of one job under two logs with ``--starting-offsets latest``). Raises
        LakeCommitError instead of losing or duplicating."""
        if already_committed is not None and already_committed >= checkpoint_id:
            # an empty range above the table's offsets too (with gaps): its end would reach the group
            behind = {tp: (end, held.get(tp)) for tp, (start, end) in ranges.items()
                      if (end > start and held.get(tp, -1) < end) or (gaps and tp in held and start > held[tp])}
            if behind:
                (topic, partition), (end, has) = sorted(behind.items())[0]
                raise LakeDivergenceError(
                    f"table {sink.table_uri} holds checkpoint {already_committed} of job {self.context.job_id}, "
                    f"so checkpoint {checkpoint_id} would be skipped, but the table holds {topic}-{partition} only up "
                    f"to offset {has} and checkpoint {checkpoint_id} reads up to {end}: its checkpoint IDs do not match "
                    "the table's (was the coordinator log deleted or recreated?); refusing to skip records")
            return
        for (topic, partition), (start, end) in sorted(ranges.items()):
            has = held.get((topic, partition))
            if has is None:
                continue
            if start < has and end > start:
                raise LakeDivergenceError(
                    f"checkpoint {checkpoint_id} would land {topic}-{partition} offsets [{start}, {end}) but table "
                    f"{sink.table_uri} already holds that partition up to offset {has}: refusing to duplicate")
            if start > has and gaps:  # an empty range too: the commit would record its end
                raise LakeDivergenceError(
                    f"checkpoint {checkpoint_id} would land {topic}-{partition} offsets [{start}, {end}) but table "
                    f"{sink.table_uri} holds that partition only up to offset {has}: offsets [{has}, {start}) would "
                    "never land (another coordinator of the job, under another coordinator log, started elsewhere); "
                    "refusing to skip records (a restart resumes from the table's offsets)")

    def _sink_of(self, table_uri: str) -> LakeSink:
        """The sink of a table this job's files name: ``sink``, or a routed table's (opened once).

        Raises:
            LakeCommitError: files of another table while the job routes nothing.
            LakeLayoutError: the table lies inside another table of the job's directory, or holds one.
        """
        if table_uri == self.sink.table_uri:
            return self.sink
        sink = self._routed.get(table_uri)
        if sink is None:
            if self.open_table is None:
                raise LakeCommitError(f"the checkpoint holds files of table {table_uri}, but job "
                                      f"{self.context.job_id} writes only {self.sink.table_uri} (no --route)")
            try:  # every path opens a routed table here: none may nest in another of the job's tables
                if self._layouts is None:
                    self._layouts = TableLayouts(self.sink.table_uri)
                self._layouts.add(table_uri)
            except TableUriError as exc:
                raise LakeLayoutError(f"checkpoint files of job {self.context.job_id}: {exc}") from exc
            sink = self._routed[table_uri] = self.open_table(table_uri)
        return sink

    def _commit(self, checkpoint_id: int) -> None:
        """The one guarded sequence every table a checkpoint touches goes through (the job's
        table, each routed table, an append or a ``--cdc`` merge, on every format; docs/design.md
        §7, "One guarded commit"):

        1. *read* what each table holds for the job now (:meth:`_read_table`: its newest
           checkpoint of the job, read again at every checkpoint, and its offsets, read again
           whenever that moved), never what an earlier read remembered;
        2. *check* every table's ranges against what it holds (:meth:`_check_table`) before any
           table is committed, so a refusal leaves every table as it was;
        3. *commit* each table (the routed ones in URI order, the job's own last) only while it
           still holds what step 1 read (``checked_at``, :func:`~chandy.connectors.lake.sink.check_unchanged`);
           the tables of one REST catalog that serves the multi-table commit go in one catalog
           transaction (:meth:`_commit_together`), built by the same per-table code;
        4. *verify*: a table that answers "held already" must hold exactly these ranges.
        """
        if self._committed_through is not None and checkpoint_id <= self._committed_through:
            return  # this run committed it already (a restore's commit, then its completion notice)
        crash_point("before-lake-commit", checkpoint_id)
        metadata = self._metadata(checkpoint_id)
        if not self._restoring:  # a restore commits what its pointer names, whoever wrote it
            self._check_own_metadata(checkpoint_id, metadata)
        files = self.files_of(checkpoint_id, metadata)
        ranges = self.offsets_of(metadata) if self.offsets_of is not None else {}
        by_table: dict[str, list[DataFile]] = {}
        for f in files:
            by_table.setdefault(f.table_uri or self.sink.table_uri, []).append(f)
        # the job's own table last: its commit says the checkpoint landed everywhere
        sinks = [self._sink_of(uri) for uri in sorted(set(by_table) - {self.sink.table_uri})] + [self.sink]
        # 1. read, the tables side by side as their commits (a table's read is a round trip to its store)
        views = dict(zip([sink.table_uri for sink in sinks], self._each(lambda sink: self._read_table(sink, ranges), sinks),
                         strict=True))
        own = views[self.sink.table_uri]
        event_times, counts = self._note_source_metrics(metadata, own.event_times)
        watermark = self._watermark(event_times, ranges)
        offsets = {**own.offsets, **{tp: end for tp, (_, end) in ranges.items()}}
        for sink in sinks:  # 2. check, every table before any commit
            self._check_table(sink, checkpoint_id, by_table.get(sink.table_uri, []), ranges, views[sink.table_uri])
        landed: list[tuple[LakeSink, LakeCommit | None, OffsetRanges | None]] = []
        groups = self._commit_groups(sinks)  # --table's group last

        def commit(group: list[LakeSink]) -> dict[str, LakeCommit | None]:  # 3. commit, only while unchanged; 4. verify
            if len(group) > 1:
                commits = self._commit_together(group, checkpoint_id, by_table, ranges, offsets, views, watermark)
            else:
                sink = group[0]
                commits = {sink.table_uri: self._commit_table(sink, checkpoint_id, by_table.get(sink.table_uri, []),
                                                              ranges, offsets, views[sink.table_uri].checkpoint, watermark)}
            if self.sink not in group:
                crash_point("between-table-commits", checkpoint_id)
            return commits

        def settle(group: list[LakeSink], commits: dict[str, LakeCommit | None]) -> None:  # on this thread
            for sink in group:
                committed = commits[sink.table_uri]
                if committed is not None:  # else the table holds what step 1 or the verification read
                    self._remember(sink, checkpoint_id, offsets, event_times)
                landed.append((sink, committed, ranges if sink is self.sink else None))
                if sink is not self.sink:
                    if sink.table_uri not in self._cleaned and not self._restoring:  # files of checkpoints that crashed
                        self._cleaned.add(sink.table_uri)
                        self._delete_unreferenced_async(sink, checkpoint_id)

        self._side_by_side(groups[:-1], commit, settle)  # the routed tables
        settle(groups[-1], commit(groups[-1]))  # then --table
        if any(committed for _, committed, _ in landed):
            self.committed_checkpoints.append(checkpoint_id)
            self.bytes_read += counts["bytes_read"]
            self.fetch_requests += counts["fetch_requests"]
            self.records_fetched += counts["records_fetched"]
        committed_to = [sink for sink, committed, _ in landed if committed]
        if committed_to:
            self._maybe_optimize(checkpoint_id, committed_to)
        crash_point("before-lake-event", checkpoint_id)
        for sink, committed, table_ranges in landed:
            self._announce(sink, checkpoint_id, committed, table_ranges, watermark)
        self._committed_through = checkpoint_id
        crash_point("before-offset-commit", checkpoint_id)

    def _watermark(self, event_times: Mapping[TP, int], ranges: OffsetRanges) -> Watermark:
        """The completeness watermark once a checkpoint of ``ranges`` lands (``event_times``: the
        newest timestamps landed, per partition): every partition of ``ranges`` (the job's
        assigned partitions: the source fixes a range, empty or not, for each) holds it back until
        read (:func:`~chandy.connectors.lake.sink.valid_through_ms`), as a Flink watermark
        without idleness does, unless ``source_idle_timeout_ms`` passed since its last records
        (since this run first met it, for one never read): Flink's ``withIdleness``."""
        now = time.monotonic() * 1000
        for tp, (start, end) in ranges.items():
            if end > start or tp not in self._active_at:
                self._active_at[tp] = now
        timeout = self.source_idle_timeout_ms
        idle = () if timeout is None else tuple(sorted(tp for tp in ranges if now - self._active_at[tp] >= timeout))
        return Watermark(dict(event_times), valid_through_ms(event_times, ranges, idle), idle)

    def _read_table(self, sink: LakeSink, partitions: Iterable[TP] = ()) -> TableView:
        """Step 1 of :meth:`_commit`: what ``sink``'s table holds for the job now. Its newest
        checkpoint of the job is read at every call; its offsets and watermark (a longer read of
        the table's history or properties) again whenever that checkpoint is not the one this
        committer last read or wrote (another coordinator of the job committed since: a run it
        did not fence, a zombie, one job under two coordinator logs). The table decides, never
        this committer's memory: the same rule for the job's table and every routed table.
        ``partitions``: the job's assigned partitions, whose offsets a Delta table whose job's
        commits all left its log keeps in app transactions only."""
        done = sink.committed_checkpoint(self.context.job_id)
        view = self._views.get(sink.table_uri)
        wanted = frozenset(partitions)
        if view is not None and done == view.checkpoint and wanted <= view.partitions | view.offsets.keys():
            return view
        wanted |= view.partitions if view is not None else frozenset()
        progress = sink.progress(self.context.job_id, wanted)
        if view is not None and done is not None:
            log.warning("job %s: table %s holds checkpoint %s, not %s as this coordinator last saw: reading its "
                        "offsets again (another coordinator of the job committed to it)", self.context.job_id,
                        sink.table_uri, progress.checkpoint_id, view.checkpoint)
        view = self._views[sink.table_uri] = TableView(progress.checkpoint_id, dict(progress.offsets),
                                                       dict(progress.event_times), wanted)
        return view

    def _remember(self, sink: LakeSink, checkpoint_id: int, offsets: Mapping[TP, int],
                  event_times: Mapping[TP, int]) -> None:
        """What ``sink``'s table holds after this committer's commit of ``checkpoint_id`` in step 3
        (unless the table holds a later checkpoint of the job, read in step 1: then its own record
        stays)."""
        view = self._views.get(sink.table_uri)
        if view is None or view.checkpoint is None or view.checkpoint <= checkpoint_id:
            self._views[sink.table_uri] = TableView(checkpoint_id, dict(offsets), dict(event_times),
                                                    view.partitions if view is not None else frozenset())

    def _check_table(self, sink: LakeSink, checkpoint_id: int, files: list[DataFile], ranges: OffsetRanges,
                     view: TableView) -> None:
        """Step 2 of :meth:`_commit` for one table, as step 1 read it (``view``): a table that holds
        the checkpoint must hold exactly these ranges (:meth:`_check_recorded`); the ranges must
        start where the table's offsets end (:meth:`_check_ranges`). (That the files are all there is
        checked right before each table's commit, :meth:`_commit_table`: the later the better.)

        Raises:
            LakeDivergenceError: naming the table, the partition and both sides.
        """
        done = view.checkpoint
        if done is not None and done >= checkpoint_id:
            self._check_recorded(sink, checkpoint_id, ranges)
        self._check_ranges(sink, checkpoint_id, ranges, done, view.offsets, gaps=sink is self.sink)

    @property
    def table_offsets(self) -> dict[TP, int]:
        """What the job's table holds for the job, per partition, as this committer last read or wrote it."""
        view = self._views.get(self.sink.table_uri)
        return {} if view is None else view.offsets

    @property
    def event_times(self) -> dict[TP, int]:
        """The completeness watermark's per-partition times (ms) of the job's table, as last read or written."""
        view = self._views.get(self.sink.table_uri)
        return {} if view is None else view.event_times

    def _check_recorded(self, sink: LakeSink, checkpoint_id: int, ranges: OffsetRanges) -> None:
        """The table holds ``checkpoint_id`` already: its commit of it must record exactly the ends
        of this committer's ranges, and the job's commit before it must not end above their starts
        (the table's own range starts there), or the two disagree about what landed (another
        coordinator of the job committed other ranges under the same ID) and skipping it,
        announcing these ranges or committing them to the consumer group would lose or duplicate
        records. The commit before found may end below a start: a routed table's records between
        went to other tables, and an Iceberg commit that added no file made no snapshot to find.

        Raises:
            LakeCommitError: naming the partition, both ranges and both sides.
        """
        recorded = next((c.offsets for c in sink.commits_after(self.context.job_id, checkpoint_id - 1)
                         if c.checkpoint_id == checkpoint_id), None)
        if recorded is None:
            return  # no commit of its own (a routed table it routed nothing to), or its history is gone: held checks
        before = self._offsets_before(sink, checkpoint_id)
        for (topic, partition), (start, end) in sorted(ranges.items()):
            has = recorded.get((topic, partition))
            had = before.get((topic, partition)) if before is not None else None
            same_end = has == end or (has is None and end <= start)
            same_start = had is None or had <= start
            if same_end and same_start:
                continue
            held = f"[{had}, {has})" if had is not None else f"up to offset {has}"
            raise LakeDivergenceError(
                f"table {sink.table_uri} holds checkpoint {checkpoint_id} of job {self.context.job_id} with "
                f"{topic}-{partition} {held}, but this coordinator's checkpoint {checkpoint_id} reads "
                f"[{start}, {end}) of it: another coordinator of the job committed other ranges under the same "
                "checkpoint ID (a run that was not fenced, or one job under two coordinator logs); nothing is "
                "announced or committed to the consumer group")

    def _offsets_before(self, sink: LakeSink, checkpoint_id: int) -> Mapping[TP, int] | None:
        """The job's cumulative offsets recorded by its newest commit to ``sink`` before
        ``checkpoint_id`` (None: no such commit, or it recorded none), looked up in windows of 1,
        16, 256, ... checkpoint IDs back (one read of the table's recent history in the usual case)."""
        window = 1
        while True:
            after = max(checkpoint_id - 1 - window, 0)
            earlier = [c for c in sink.commits_after(self.context.job_id, after) if c.checkpoint_id < checkpoint_id]
            if earlier:
                return earlier[-1].offsets
            if after == 0:
                return None
            window *= 16

    def _each(self, call: Callable[[LakeSink], TableView], sinks: list[LakeSink]) -> list[TableView]:
        """``call(sink)`` for each of ``sinks``, up to :attr:`commit_threads` at once; the results
        in the order of ``sinks``.

        Raises:
            Exception: the first (in the order of ``sinks``) a call raised, once every call ended.
        """
        if self.commit_threads <= 1 or len(sinks) <= 1:
            return [call(sink) for sink in sinks]
        with concurrent.futures.ThreadPoolExecutor(min(self.commit_threads, len(sinks)),
                                                   thread_name_prefix="chandy-table-read") as pool:
            return list(pool.map(call, sinks))

    def _side_by_side(self, groups: list[list[LakeSink]],
                      commit: Callable[[list[LakeSink]], dict[str, LakeCommit | None]],
                      settle: Callable[[list[LakeSink], dict[str, LakeCommit | None]], None]) -> None:
        """``commit(group)`` for each of ``groups`` (independent tables: the routed ones), on up
        to :attr:`commit_threads` threads at once (one: in order, on this thread), as the Kafka
        Connect Iceberg sink's ``iceberg.control.commit.threads`` commits its tables, then
        ``settle(group, its commits)`` on this thread, in the order of ``groups``, for each that
        committed. Each commit is the whole guarded sequence of its table (its own idempotence
        check): running them side by side changes only which of them have landed when one
        fails, as a crash between two would.

        Raises:
            Exception: the first (in the order of ``groups``) a commit raised, once every
                commit started has ended and every other one is settled.
        """
        if self.commit_threads <= 1 or len(groups) <= 1:
            for group in groups:
                settle(group, commit(group))
            return
        with concurrent.futures.ThreadPoolExecutor(min(self.commit_threads, len(groups)),
                                                   thread_name_prefix="chandy-table-commit") as pool:
            futures = [pool.submit(commit, group) for group in groups]
            concurrent.futures.wait(futures)
        failures = [future.exception() for future in futures]
        for group, future, failure in zip(groups, futures, failures, strict=True):
            if failure is None:
                settle(group, future.result())
        first = next((failure for failure in failures if failure is not None), None)
        if first is not None:
            raise first

    def _commit_groups(self, sinks: list[LakeSink]) -> list[list[LakeSink]]:
        """``sinks`` (the routed tables in URI order, the job's own last) in the groups step 3 of
        :meth:`_commit` commits: the tables of one REST catalog that serves the multi-table commit
        (:func:`~chandy.connectors.lake.iceberg_transactions.transaction_key`) together, each other
        table alone, in the same order; a group that holds the job's own table comes last, as
        that table alone would."""
        from chandy.connectors.lake.iceberg_transactions import transaction_key

        keys = {sink.table_uri: transaction_key(sink) for sink in sinks}
        counts: dict[str, int] = {}
        for key in keys.values():
            if key is not None:
                counts[key] = counts.get(key, 0) + 1
        groups: list[list[LakeSink]] = []
        together: dict[str, list[LakeSink]] = {}
        for sink in sinks:
            key = keys[sink.table_uri]
            if key is None or counts[key] < 2:
                groups.append([sink])
            elif key in together:
                together[key].append(sink)
            else:
                together[key] = [sink]
                groups.append(together[key])
        own = next(g for g in groups if self.sink in g)
        return [g for g in groups if g is not own] + [own]

    def _commit_together(self, group: list[LakeSink], checkpoint_id: int, by_table: Mapping[str, list[DataFile]],
                         ranges: OffsetRanges, offsets: Mapping[TP, int], views: Mapping[str, TableView],
                         watermark: Watermark) -> dict[str, LakeCommit | None]:
        """Steps 3 and 4 of :meth:`_commit` for ``group``, tables of one REST catalog, in one
        catalog transaction (:class:`~chandy.connectors.lake.iceberg_transactions.CatalogTransaction`):
        each table's commit is built by the one-table code (:meth:`_commit_table`: the same
        read, check and commit-while-unchanged), recorded instead of sent, and all are sent in
        one request. A request that fails leaves the outcome to be read: each table is read
        again (:meth:`~chandy.connectors.lake.iceberg_transactions.CatalogTransaction.landed_after`);
        what landed counts, and what did not is built and sent again (a conflict, a table that
        landed while another did not), up to ``COMMIT_ATTEMPTS`` times.

        Raises:
            LakeCommitError: the catalog refused, or its answer and a read of the tables leave
                the outcome unknown; LakeSchemaError, LakeDivergenceError: as :meth:`_commit_table`.
        """
        from chandy.connectors.lake.iceberg_commits import is_conflict
        from chandy.connectors.lake.iceberg_transactions import CatalogTransaction

        uris = ", ".join(sink.table_uri for sink in group)
        commits: dict[str, LakeCommit | None] = {}
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            transaction = CatalogTransaction(group)
            staged: dict[str, tuple[LakeSink, LakeCommit | None]] = {}
            with transaction.staging():
                for sink in group:
                    if sink.table_uri in commits:
                        continue  # landed by an earlier attempt
                    staged[sink.table_uri] = (sink, self._stage_table(
                        sink, checkpoint_id, by_table.get(sink.table_uri, []), ranges, offsets,
                        views[sink.table_uri].checkpoint, watermark))
            sent = [uri for uri, (_, committed) in staged.items() if committed is not None]  # a request each
            try:
                if sent:
                    transaction.commit()
            except Exception as exc:  # pyiceberg and requests raise many types; the tables say what landed
                held = transaction.landed_after(exc, f"checkpoint {checkpoint_id}: the catalog transaction of {uris}")
                landed = [uri for uri in sent if held.get(uri, False)]
                for uri, committed in _together(staged, landed).items():
                    commits[uri] = self._committed(staged[uri][0], checkpoint_id, committed, by_table.get(uri, []))
                if len(landed) == len(sent):
                    log.warning("checkpoint %d: the catalog answered the transaction of %s with %s: %s, but every "
                                "table holds its commit (read again): it landed", checkpoint_id, uris,
                                type(exc).__name__, exc)
                    continue
                if (landed or is_conflict(exc)) and attempt < COMMIT_ATTEMPTS:
                    log.warning("checkpoint %d: the catalog transaction of %s failed (%s: %s) with %d of %d "
                                "table(s) landed: building it again", checkpoint_id, uris, type(exc).__name__,
                                exc, len(landed), len(sent))
                    continue
                raise LakeCommitError(f"checkpoint {checkpoint_id}: the catalog transaction of {uris} failed "
                                      f"(attempt {attempt}): {type(exc).__name__}: {exc}") from exc
            together = _together(staged, sent)
            for uri, (sink, committed) in staged.items():
                commits[uri] = self._committed(sink, checkpoint_id, together.get(uri, committed), by_table.get(uri, []),
                                               ranges)
            if len(sent) > 1:
                log.info("checkpoint %d: %d table(s) committed in one catalog transaction (%s)", checkpoint_id,
                         len(sent), uris)
            return commits
        raise LakeCommitError(f"checkpoint {checkpoint_id}: the catalog transaction of {uris} did not land "
                              f"after {COMMIT_ATTEMPTS} attempts")  # not reached: the last attempt raises

    def _stage_table(self, sink: LakeSink, checkpoint_id: int, files: list[DataFile], ranges: OffsetRanges,
                     offsets: Mapping[TP, int], done: int | None, watermark: Watermark) -> LakeCommit | None:
        """Step 3 of :meth:`_commit` for one table, checked (step 2) against its job's
        checkpoint ``done``: refuse files that are gone (LakeDivergenceError), then commit its
        files of ``checkpoint_id`` (an append, or with ``changes`` a merge), recording the job's
        cumulative ``offsets`` and completeness ``watermark`` (the job's: every table it writes
        holds every record read below it), only while the table still holds ``done``
        (``checked_at``); None when the table holds it already or there was nothing. Inside a
        catalog transaction's staging, the commit is recorded, not sent."""
        missing = sink.missing_files(files) if done is None or done < checkpoint_id else []
        if missing:  # checked right before the commit: a cleanup of another run may race it (design.md §7)
            # never commit a file that is gone: the table would reference data it cannot read
            raise LakeDivergenceError(
                f"checkpoint {checkpoint_id} references {len(missing)} data file(s) no longer in table "
                f"{sink.table_uri} (first: {missing[0]}); they were deleted after it was taken (an "
                "intermediate savepoint's files are cleaned up once a later checkpoint lands the same ranges), "
                "so it cannot be committed: restore a checkpoint or a stop-with-savepoint savepoint instead")
        try:
            commit = sink.commit_changes if self.changes else sink.commit
            return commit(self.context.job_id, checkpoint_id, files, offsets=dict(offsets) or None,
                          cluster_id=self.cluster_id, checked_at=done, event_times=dict(watermark.event_times),
                          valid_through_ms=watermark.valid_through_ms)
        except LakeSchemaError as exc:  # say which records did not fit
            where = ", ".join(f"{t}-{p} offsets [{start}, {end})" for (t, p), (start, end) in sorted(ranges.items())
                              if end > start)
            raise LakeSchemaError(f"{exc} (records: {where or 'none'})") from exc

    def _committed(self, sink: LakeSink, checkpoint_id: int, committed: LakeCommit | None, files: list[DataFile],
                   ranges: OffsetRanges | None = None) -> LakeCommit | None:
        """Step 4 of :meth:`_commit` for one table once its commit was sent: ``committed`` None
        (the table held the checkpoint already) with ``ranges`` is verified (:meth:`_verify`); a
        commit made is counted and logged."""
        if committed is None and ranges:
            self._verify(sink, checkpoint_id, ranges)
        if committed:
            records = sum(f.records for f in files)
            with self._counting:  # tables commit side by side (_side_by_side)
                self.records_committed += records
            log.info("checkpoint %d: %d file(s), %d record(s) committed to %s (version %s)", checkpoint_id,
                     len(files), records, sink.table_uri, committed.table_version)
        return committed

    def _commit_table(self, sink: LakeSink, checkpoint_id: int, files: list[DataFile], ranges: OffsetRanges,
                      offsets: Mapping[TP, int], done: int | None, watermark: Watermark) -> LakeCommit | None:
        """Steps 3 and 4 of :meth:`_commit` for one table: its commit (:meth:`_stage_table`), then
        its verification and count (:meth:`_committed`)."""
        committed = self._stage_table(sink, checkpoint_id, files, ranges, offsets, done, watermark)
        return self._committed(sink, checkpoint_id, committed, files, ranges)

    def _verify(self, sink: LakeSink, checkpoint_id: int, ranges: OffsetRanges) -> None:
        """Step 4 of :meth:`_commit`: ``sink``'s commit of ``checkpoint_id`` committed nothing.
        When the table holds it or a later checkpoint of the job now, committed by another
        coordinator since step 1 (a zombie, another coordinator log), it must hold the
        checkpoint's ranges, as step 2 checks a table that held them at step 1: its commit of N
        records exactly them (:meth:`_check_recorded`), and its offsets reach their ends
        (:meth:`_check_ranges`). Found by the commit-protocol simulation (family
        routed-two-logs-faults, seed 956): another log's checkpoint 7 landed between this one's
        check and commit of 6, whose ranges reach past 7's; 6 counted as landed and its ends
        reached the consumer group.

        Raises:
            LakeDivergenceError: naming the table, the partition and both sides.
        """
        now = self._read_table(sink, ranges)
        if now.checkpoint is not None and now.checkpoint >= checkpoint_id:
            self._check_recorded(sink, checkpoint_id, ranges)
            self._check_ranges(sink, checkpoint_id, ranges, now.checkpoint, now.offsets, gaps=sink is self.sink)

    def _delete_unreferenced_async(self, sink: LakeSink, keep_checkpoints_after: int | None) -> None:
        job_id = self.context.job_id

        def cleaned(deleted: Any, error: BaseException | None) -> None:
            if error is not None:
                log.warning("cleanup of %s failed: %s", sink.table_uri, error)

        self.context.call_async(lambda: sink.delete_unreferenced(job_id, keep_checkpoints_after=keep_checkpoints_after,
                                                                 log_id=self.log_id), cleaned)

    def _announced(self, sink: LakeSink) -> int | None:
        """The newest checkpoint whose LAKE_COMMITTED event for ``sink``'s table the log records."""
        record = self.context.log_records(LAKE_COMMITS_KIND).get(sink.table_uri)
        return None if record is None else int(record.checkpoint_id)

    def _announce(self, sink: LakeSink, checkpoint_id: int, committed: LakeCommit | None,
                  ranges: OffsetRanges | None, watermark: Watermark | None = None) -> None:
        """Publish ``LAKE_COMMITTED`` of ``sink``'s table for ``checkpoint_id`` (and for any earlier
        checkpoint the table holds but the log has not announced, read from the table's history),
        unless the log says it was published. ``committed``: the commit this committer just made
        (None when the table held the checkpoint already, or it had nothing to record). A routed
        table, which gets commits only for the checkpoints that route records to it, is read back
        only when ``committed`` is None. ``watermark``: the completeness watermark of
        ``checkpoint_id``'s commit, as this committer computed it (its idle partitions included);
        an earlier checkpoint's event carries what the table recorded."""
        announced = self._announced(sink)
        if announced is not None and announced >= checkpoint_id:
            return
        landed: dict[int, LakeCommit] = {}
        behind = sink is self.sink and announced is not None and announced < checkpoint_id - 1
        if committed is None or behind:
            # a predecessor landed them and stopped before their events (or before this one's)
            after = checkpoint_id - 1 if announced is None else announced
            landed.update((c.checkpoint_id, c) for c in sink.commits_after(self.context.job_id, after)
                          if c.checkpoint_id <= checkpoint_id)
        if committed is not None:
            landed[committed.checkpoint_id] = committed
        for landed_id in sorted(landed):
            current = landed_id == checkpoint_id
            self._publish(sink, landed[landed_id], ranges if current else None, watermark if current else None)

    def _publish(self, sink: LakeSink, commit: LakeCommit, ranges: OffsetRanges | None,
                 watermark: Watermark | None = None) -> None:
        offset_ranges = None if ranges is None else tuple(
            OffsetRange(topic, partition, start, end) for (topic, partition), (start, end) in sorted(ranges.items())
            if end > start)
        record = LakeCommitRecord(self.context.job_id, sink.table_uri, commit.checkpoint_id, commit.table_version,
                                  int(time.time() * 1000))
        fields: dict[str, Any] = {}
        if watermark is not None and self.source_idle_timeout_ms is not None:  # this committer's: it knows them
            fields["idle_partitions"] = tuple(IdlePartition(topic, partition) for topic, partition in watermark.idle)
        if watermark is None and commit.event_times:  # the completeness watermark the commit recorded
            watermark = Watermark(commit.event_times, commit.valid_through_ms)
        if commit.committed_with is not None:
            fields["committed_with"] = commit.committed_with
        if watermark is not None and watermark.event_times:
            fields.update(valid_through_ms=watermark.valid_through_ms, event_times=tuple(
                PartitionEventTime(topic, partition, millis)
                for (topic, partition), millis in sorted(watermark.event_times.items())))
        self.context.publish_event(
            commit.checkpoint_id, "LAKE_COMMITTED", records=[record], table_uri=sink.table_uri,
            table_format=sink.FORMAT, table_version=commit.table_version,
            previous_table_version=commit.previous_table_version, records_added=commit.records,
            files_added=commit.files, offset_ranges=offset_ranges, **fields)
        log.info("checkpoint %d: LAKE_COMMITTED published (%s version %s)", commit.checkpoint_id, sink.table_uri,
                 commit.table_version)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Commit the checkpoint (steps 2 to 4). An exception fails the job and stops the
        notification of the coordinators after this one (the offset commit); the checkpoint
        stays complete, and a restart commits it."""
        if checkpoint_id == self._foreign_checkpoint:
            return
        started = time.monotonic()
        self._commit(checkpoint_id)
        self.last_commit_ms = (time.monotonic() - started) * 1000
        self.last_commit_ended_ms = time.time() * 1000

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        for sink in (self.sink, *self._routed.values()):
            self._delete_unreferenced_async(sink, checkpoint_id)

    def reset_to_checkpoint(self, checkpoint_id: int, checkpoint_data: bytes | None) -> None:
        """Restore (a restart): read what the table holds, commit ``checkpoint_id`` if the table
        lacks it (restoring implies completion); once this coordinator's start is in its log
        (``context.when_logged``), delete its log's unreferenced files (``log_id``) of checkpoints up
        to ``checkpoint_id``, the table's newest or the log's newest (docs/design.md §7, "Cleanup").

        Raises:
            LakeCommitError: the restored checkpoint disagrees with the table (see step 3), or
                its ``_metadata`` is unreadable while the table does not hold it.
        """
        self._views.pop(self.sink.table_uri, None)
        self._read_table(self.sink)
        source_table = _table_of(checkpoint_data)
        if checkpoint_id != NO_CHECKPOINT and source_table not in (None, self.sink.table_uri):
            # a savepoint of another table (Flink's `flink run -s` into a new sink): its files stay
            # there; this table starts at the savepoint's offsets, recorded with an empty commit
            ranges = self.offsets_of(self._metadata(checkpoint_id)) if self.offsets_of is not None else {}
            offsets = {**self.table_offsets, **{tp: end for tp, (_, end) in ranges.items()}}
            self.sink.commit(self.context.job_id, checkpoint_id, [], offsets=offsets or None, cluster_id=self.cluster_id)
            # the next commit records them (a new table gets no empty commit)
            self._views[self.sink.table_uri] = TableView(checkpoint_id, offsets, dict(self.event_times))
            self._foreign_checkpoint = checkpoint_id  # its completion notice (restoring implies it) lands nothing
            log.warning("restored checkpoint %d of table %s: its records stay in that table; %s starts at its "
                        "offsets", checkpoint_id, source_table, self.sink.table_uri)
        elif checkpoint_id != NO_CHECKPOINT:
            try:
                self._restoring = True
                self._commit(checkpoint_id)
            except CheckpointStorageError as exc:
                done = self.sink.committed_checkpoint(self.context.job_id)
                if done is None or done < checkpoint_id:
                    raise LakeCommitError(
                        f"restored checkpoint {checkpoint_id} is not in table {self.sink.table_uri} and its _metadata "
                        f"is not readable ({exc}): its records cannot be committed") from exc
                log.info("restored checkpoint %d is already in the table; its _metadata is gone (%s)", checkpoint_id, exc)
                self._announce(self.sink, checkpoint_id, None, None)
            finally:
                self._restoring = False
        # bounded by the IDs this log handed out (a later coordinator takes higher ones), and only
        # once this coordinator's start is logged: a coordinator fenced before that may have replayed
        # a log its successor wrote to, and its bound would cover the successor's checkpoints
        done = self.sink.committed_checkpoint(self.context.job_id)
        keep_after = max(checkpoint_id, done if done is not None else NO_CHECKPOINT, self.context.newest_checkpoint_id())
        sinks = (self.sink, *self._routed.values())
        self._cleaned.update(sink.table_uri for sink in sinks)

        def clean_up() -> None:
            for sink in sinks:
                self._delete_unreferenced_async(sink, keep_after)

        self.context.when_logged(clean_up)

    def subtask_reset(self, subtask: int, checkpoint_id: int) -> None:
        pass

    def execution_attempt_failed(self, subtask: int, attempt_number: int, reason: BaseException | None) -> None:
        pass

    def execution_attempt_ready(self, subtask: int, attempt_number: int, gateway: Any) -> None:
        pass

    def handle_event_from_operator(self, subtask: int, attempt_number: int, event: OperatorEvent) -> None:
        pass


def _together(staged: Mapping[str, tuple[LakeSink, LakeCommit | None]], uris: list[str]) -> dict[str, LakeCommit | None]:
    """The commits of ``uris`` (tables of ``staged`` one catalog request landed), each saying which
    tables it landed with (``committed_with``, for ``LAKE_COMMITTED``) when they are several."""
    partners = tuple(sorted(uris)) if len(uris) > 1 else None
    together: dict[str, LakeCommit | None] = {}
    for uri in uris:
        committed = staged[uri][1]
        together[uri] = committed if committed is None or partners is None else dataclasses.replace(
            committed, committed_with=partners)
    return together


@dataclasses.dataclass(frozen=True)
class LakeCommitterProvider:
    """Creates the :class:`LakeCommitter` of operator ``operator_id``."""

    operator_id: str
    sink: LakeSink
    storage: CheckpointStorage
    offsets_of: Callable[[CheckpointMetadata], OffsetRanges] | None = None
    cluster_id: str | None = None
    optimize_every: int | None = None
    optimize_target_size: int | None = None
    open_table: Callable[[str], LakeSink] | None = None
    changes: bool = False
    vacuum_every: int | None = None
    vacuum_retention_hours: float = 168.0
    vacuum_retain_last: int = 1
    log_id: str | None = None
    source_idle_timeout_ms: int | None = None
    commit_threads: int = 1

    def create(self, context: Any) -> LakeCommitter:
        return LakeCommitter(context, self.sink, self.storage, offsets_of=self.offsets_of, cluster_id=self.cluster_id,
                             optimize_every=self.optimize_every, optimize_target_size=self.optimize_target_size,
                             open_table=self.open_table, changes=self.changes, vacuum_every=self.vacuum_every,
                             vacuum_retention_hours=self.vacuum_retention_hours,
                             vacuum_retain_last=self.vacuum_retain_last, log_id=self.log_id,
                             source_idle_timeout_ms=self.source_idle_timeout_ms, commit_threads=self.commit_threads)


def _table_of(checkpoint_data: bytes | None) -> str | None:
    """The table URI a lake committer's checkpoint state names (None: older, empty state)."""
    if not checkpoint_data:
        return None
    try:
        value = json.loads(checkpoint_data)
    except ValueError:
        return None
    return value.get("table_uri") if isinstance(value, dict) else None

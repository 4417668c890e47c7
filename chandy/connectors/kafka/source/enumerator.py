"""The Kafka source enumerator: an operator coordinator modelled on Flink's KafkaSourceEnumerator.

What it does, all on the coordinator's mailbox thread (Kafka I/O on the I/O executor through
``context.call_async``):

1. **Discovery**: at start and then every ``partition.discovery.interval.ms`` (disabled when
   <= 0) it lists the topics (by name or regex) and their partitions. Partitions of the first
   discovery start at the configured offsets initializer; partitions found later start at
   earliest, as Flink's KafkaSource.
2. **Assignment**: each partition goes to reader subtask
   ``((hash(topic) * 31 & 0x7FFFFFFF) % n + partition) % n`` (Java's String.hashCode, so the
   assignment equals Flink's). Splits are pushed to registered readers as ``AddSplits`` events
   and held for readers not ready yet; ``subtask_reset`` hands a subtask's splits back, to be
   sent again when its next attempt is ready. Every assignment change is a
   ``SplitAssignmentRecord`` in the coordinator log.
3. **Micro-batches**: at ``checkpoint_coordinator(N)`` it fixes, per assigned partition, the
   range [end of the last completed checkpoint, last stable offset), capped at
   ``max.records.per.checkpoint``, sends each reader its ranges (``OffsetRanges`` event) and
   then completes the checkpoint future with its state: the splits and the ranges. Events sent
   before the future completes belong to checkpoint N, so readers see their ranges before N's
   trigger. One checkpoint is in flight at a time: an overlapping one is declined, because a
   range that starts after a checkpoint that may still abort could skip records. Every trigger
   (the first after a start or a restore too) first checks each partition's log against the
   job's position, as Spark's ``failOnDataLoss`` (:mod:`~chandy.connectors.kafka.source.data_loss`):
   a log that ends below it, starts above it, or is gone fails the job
   (:class:`~chandy.connectors.kafka.source.reader.KafkaDataLossError`, no restart), or, with
   ``fail_on_data_loss`` False, is gone on from with a warning and counted (``offsets_lost``).
4. **Offset commits**: on ``notify_checkpoint_complete(N)`` it commits to the consumer group
   ``group.id`` the range ends of the newest in-flight checkpoint <= N and drops every entry
   <= N; an aborted checkpoint's entry is dropped, so its offsets are never committed. A
   failed commit is logged and counted; the next completion covers it. Restoring checkpoint N
   (``reset_to_checkpoint``) implies N completed: its ends are committed as well.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import re
import threading
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from chandy.connectors.kafka.source import offsets as offsets_module
from chandy.connectors.kafka.source.data_loss import (
    END_BELOW,
    GONE,
    UNKNOWN_PARTITION_ERRORS,
    LogChange,
    log_change,
    partition_gone,
)
from chandy.connectors.kafka.source.log_records import OffsetCommitRecord, SplitAssignment, SplitAssignmentRecord, TopicPartitionOffset
from chandy.connectors.kafka.source.offsets import ConsumerOffsetsRetriever, OffsetsInitializer
from chandy.connectors.kafka.source.reader import KafkaDataLossError
from chandy.connectors.kafka.source.split import KafkaPartitionSplit, split_owner
from chandy.connectors.kafka.source.subscriber import subscribed_topics
from chandy.coordinator import serde
from chandy.coordinator.environment import SourceOffsets
from chandy.coordinator.errors import ChandyError
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.topics import OffsetsUnavailableError, watermark_offsets
from chandy.coordinator.operator_coordinator import NO_CHECKPOINT, OperatorCoordinatorContext, OperatorEvent, SubtaskGateway
from chandy.schemas.codec import SingleObjectCodec

log = logging.getLogger(__name__)

TP = tuple[str, int]
ADD_SPLITS = "AddSplits"
OFFSET_RANGES = "OffsetRanges"


class KafkaSourceClosedError(ChandyError):
    """The enumerator was used after :meth:`KafkaSourceEnumerator.close` (or before ``start``)."""


class KafkaSourceConfigError(ChandyError):
    """The Kafka source is configured inconsistently."""


@dataclasses.dataclass(frozen=True)
class KafkaSourceOptions:
    """The Kafka source's settings; names follow Flink's KafkaSource / Kafka's where they exist.

    Args:
        bootstrap_servers: ``bootstrap.servers``.
        topics: topic names, or ``topic_pattern``: a regex (full match) over topic names.
        group_id: ``group.id`` that offsets are committed to on checkpoint completion.
        commit_offsets_on_checkpoint: ``commit.offsets.on.checkpoint``; default: true with a
            ``group_id``. True without a ``group_id`` is an error.
        partition_discovery_interval_ms: ``partition.discovery.interval.ms``; <= 0 disables.
        starting_offsets: offsets initializer of the first discovery (default earliest).
        max_records_per_checkpoint: ``max.records.per.checkpoint`` per partition (None: no cap).
        consumer_overrides: librdkafka settings under their own names.
        offset_floor: per (topic, partition), the offset the sink already holds (the pipeline
            passes the lake table's recorded offsets). A partition whose start an initializer
            chooses (no restored checkpoint holds it: a lost coordinator log, a new partition)
            starts exactly there, whatever ``starting_offsets`` says (the option applies only to
            partitions the sink has never seen), so nothing is skipped or landed twice; a
            restored checkpoint's end below it is raised to it.
        stopping_offsets: per (topic, partition), the offset (exclusive) no range goes past: a
            bounded source (Flink's ``KafkaSourceBuilder.setBounded``, Spark's ``endingOffsets``);
            a partition it does not name is unbounded.
        fail_on_data_loss: Spark's ``failOnDataLoss`` (default true): a partition whose log moved
            below the job's position (:mod:`~chandy.connectors.kafka.source.data_loss`: it ends
            below it, starts above it, or is gone) fails the job with :class:`KafkaDataLossError`,
            which suppresses restarts. False goes on from the new log with a warning and counts the
            offsets lost (:attr:`KafkaSourceEnumerator.offsets_lost`): from the new log's start
            when it ends below the position (never below ``offset_floor``), from its log start
            when that moved above the position, and without a range while a partition is gone.
            Readers must skip offsets gone the same way
            (``KafkaRangeReader.read_batches(fail_on_data_loss=False)``).
        sink_holds_offsets: the sink records each partition's offsets and takes only ranges that
            continue them (the lake committer refuses a range below or above the table's offsets),
            so no position ever moves back and no range leaves a gap: without
            ``fail_on_data_loss``, a partition whose log ends below the position goes on from the
            position once the new log reaches it (the new log's records below it are skipped), and
            one whose log start moved above it gets a range from the position, whose offsets below
            the log start the readers skip.
    """

    bootstrap_servers: str
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    group_id: str | None = None
    commit_offsets_on_checkpoint: bool | None = None
    partition_discovery_interval_ms: int = 30_000
    starting_offsets: OffsetsInitializer = dataclasses.field(default_factory=offsets_module.earliest)
    max_records_per_checkpoint: int | None = None
    consumer_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    offset_floor: Mapping[tuple[str, int], int] = dataclasses.field(default_factory=dict)
    stopping_offsets: Mapping[tuple[str, int], int] = dataclasses.field(default_factory=dict)
    fail_on_data_loss: bool = True
    sink_holds_offsets: bool = False

    def __post_init__(self) -> None:
        if bool(self.topics) == bool(self.topic_pattern):
            raise KafkaSourceConfigError("give exactly one of topics (a list) or topic_pattern (a regex)")
        if self.commit_offsets_on_checkpoint and not self.group_id:
            raise KafkaSourceConfigError("commit.offsets.on.checkpoint is true but no group.id is set")
        if self.max_records_per_checkpoint is not None and self.max_records_per_checkpoint < 1:
            raise KafkaSourceConfigError(f"max.records.per.checkpoint must be >= 1, got {self.max_records_per_checkpoint}")
        if self.topic_pattern:
            try:
                re.compile(self.topic_pattern)
            except re.error as exc:
                raise KafkaSourceConfigError(f"topic pattern {self.topic_pattern!r} is not a regex: {exc}") from exc

    @property
    def commits(self) -> bool:
        """Whether offsets are committed on checkpoint completion."""
        if self.commit_offsets_on_checkpoint is None:
            return self.group_id is not None
        return self.commit_offsets_on_checkpoint


@dataclasses.dataclass(frozen=True)
class AssignedSplit:
    split: KafkaPartitionSplit
    subtask_index: int


@dataclasses.dataclass(frozen=True)
class KafkaSourceEnumeratorState:
    """The checkpointed state (Avro ``chandy.v1.KafkaSourceEnumeratorState``)."""

    SCHEMA = "chandy.v1.KafkaSourceEnumeratorState"

    checkpoint_id: int
    splits: tuple[AssignedSplit, ...]
    initial_discovery_finished: bool
    ranges: tuple[KafkaPartitionSplit, ...] = ()

    def serialize(self) -> bytes:
        return SingleObjectCodec().encode(self.SCHEMA, serde.to_avro(self))

    @classmethod
    def deserialize(cls, data: bytes) -> KafkaSourceEnumeratorState:
        return serde.from_avro(cls, SingleObjectCodec().decode(data).value)


@dataclasses.dataclass(frozen=True)
class SplitsEvent:
    """Payload of AddSplits / OffsetRanges events (Avro ``chandy.v1.SplitsEvent``)."""

    SCHEMA = "chandy.v1.SplitsEvent"

    checkpoint_id: int
    splits: tuple[KafkaPartitionSplit, ...]

    def to_event(self, event_type: str) -> OperatorEvent:
        return OperatorEvent(event_type, SingleObjectCodec().encode(self.SCHEMA, serde.to_avro(self)))

    @classmethod
    def from_event(cls, event: OperatorEvent) -> SplitsEvent:
        return serde.from_avro(cls, SingleObjectCodec().decode(event.payload).value)


class KafkaSourceEnumerator:
    """The enumerator (see the module docstring). Created by :class:`KafkaSourceCoordinatorProvider`."""

    def __init__(self, context: OperatorCoordinatorContext, options: KafkaSourceOptions) -> None:
        self.context = context
        self.options = options
        self.num_readers = context.current_parallelism()
        self.splits: dict[TP, KafkaPartitionSplit] = {}  # every known partition, with its initial offset
        self.readers: dict[int, SubtaskGateway] = {}  # subtask -> gateway of its ready attempt
        self.sent: dict[int, set[TP]] = {}  # splits each ready reader has been sent
        self.initial_discovery_finished = False
        self.committed_end: dict[TP, int] = {}  # range starts: ends of the last completed checkpoint
        self.in_flight: dict[int, dict[TP, KafkaPartitionSplit]] = {}
        self.commits_succeeded = 0
        self.commits_failed = 0
        #: without ``fail_on_data_loss``: offsets of partitions whose log moved below the job's
        #: position that the job will never read, as far as knowable (``LogChange.offsets_lost``:
        #: exact for offsets deleted before they were read; for a log that ends below the position,
        #: the offsets it moved back by), each counted once per enumerator
        self.offsets_lost = 0
        #: without ``fail_on_data_loss``: the warnings about data loss, in order (one line each)
        self.data_loss: list[str] = []
        #: known partitions the latest discovery did not find in the metadata (deleted, or a topic
        #: with fewer partitions now): each trigger asks whether they are gone
        self.missing: frozenset[TP] = frozenset()
        self._below: dict[TP, int] = {}  # partitions whose log ends below the position: its end when reported
        self._lost_to: dict[TP, int] = {}  # offsets below a moved log start counted lost, up to this one
        self._gone: set[TP] = set()  # partitions reported gone
        self._known: frozenset[TP] = frozenset()  # read by discovery on the I/O thread
        self._commit_lock = threading.Lock()
        self._consumer: Consumer | None = None
        self._committer: Consumer | None = None
        self._closed = False
        # offset commits run on the I/O executor; these keep them in checkpoint order and let close
        # flush the newest one (guarded by _commit_lock)
        self._committed_checkpoint = -1
        self._newest_commit: tuple[int, list[TopicPartition]] | None = None

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        consumer = self._consumer = kafka_config.consumer(
            self.options.bootstrap_servers, group_id=self.options.group_id, overrides=self.options.consumer_overrides)
        if self.options.commits:
            self._committer = consumer
        elif self.options.group_id is None:
            log.warning("Kafka source %s has no group.id: offsets are not committed to Kafka "
                        "(the checkpoints alone record progress)", self.context.operator_id)
        self.context.call_async(self._discover, self._handle_discovery, 0,
                                max(0, self.options.partition_discovery_interval_ms))

    def close(self) -> None:
        """Flush the newest completed checkpoint's offsets if its async commit has not run yet
        (as Kafka's ``KafkaConsumer.close`` completes pending commits), then close the client: a
        stop-with-savepoint leaves the consumer group exactly at the savepoint. A failed flush is
        logged; the checkpoint itself already holds the offsets."""
        self._closed = True
        if self._consumer is not None:
            with self._commit_lock:
                self._flush_newest_commit()
                self._consumer.close()
            self._consumer = None

    def _flush_newest_commit(self) -> None:
        newest, committer = self._newest_commit, self._committer
        if newest is None or committer is None or newest[0] <= self._committed_checkpoint:
            return
        checkpoint_id, offsets = newest
        try:
            _commit_offsets(committer, offsets)
        except KafkaException as exc:
            log.warning("committing offsets of checkpoint %d to group %s on close failed: %s",
                        checkpoint_id, self.options.group_id, exc)
            return
        self._committed_checkpoint = checkpoint_id
        self.commits_succeeded += 1

    # -- discovery ------------------------------------------------------------------------------------
    def _discover(self) -> tuple[bool, dict[TP, int], frozenset[TP]]:
        """On the I/O executor: partitions not yet known, with their starting offsets, and the
        known partitions the metadata does not hold (any more, or for now).

        Raises:
            KafkaSourceClosedError: the enumerator was closed (or never started).
        """
        consumer = self._consumer
        if consumer is None:
            raise KafkaSourceClosedError(f"Kafka source {self.context.operator_id}: the enumerator is closed")
        metadata = consumer.list_topics(timeout=30)
        available = [t for t, m in metadata.topics.items() if m.error is None]
        wanted = subscribed_topics(available, self.options.topics, self.options.topic_pattern)
        missing = set(self.options.topics) - set(wanted)
        if missing:
            log.warning("Kafka source topics not found (yet): %s", ", ".join(sorted(missing)))
        found = {(t, p) for t in wanted for p in metadata.topics[t].partitions}
        known = self._known
        new = sorted(found - known)
        initial = not self.initial_discovery_finished
        retriever = ConsumerOffsetsRetriever(consumer)
        # the first discovery uses the configured initializer, later ones start at earliest (Flink)
        initializer = self.options.starting_offsets if initial else offsets_module.earliest()
        return initial, initializer.get_partition_offsets(new, retriever) if new else {}, frozenset(known - found)

    def _handle_discovery(self, result: tuple[bool, dict[TP, int], frozenset[TP]] | None,
                          error: BaseException | None) -> None:
        if error is not None:
            if isinstance(error, offsets_module.NoOffsetForPartitionError):
                raise error  # a configuration problem: fail the job with a clear message
            log.warning("partition discovery failed: %s", error)
            return
        if result is None:
            return
        initial, new, self.missing = result
        added = [KafkaPartitionSplit(t, p, offset) for (t, p), offset in sorted(new.items())
                 if (t, p) not in self.splits]
        self.initial_discovery_finished = self.initial_discovery_finished or initial
        if not added:
            return
        for i, split in enumerate(added):
            held = self.options.offset_floor.get(split.topic_partition)
            if held is not None and held != split.starting_offset and split.topic_partition not in self.committed_end:
                # the sink holds this partition up to `held`: the table's offsets win over the initializer
                log.info("Kafka source %s: %s-%d starts at %d, where the sink's records end (the starting-offsets "
                         "initializer said %d)", self.context.operator_id, split.topic, split.partition, held,
                         split.starting_offset)
                split = added[i] = dataclasses.replace(split, starting_offset=held)
            self.splits[split.topic_partition] = split
            self.committed_end.setdefault(split.topic_partition, split.starting_offset)
        self._apply_offset_floor()
        self._known = frozenset(self.splits)
        log.info("Kafka source %s: %d new partition(s)", self.context.operator_id, len(added))
        self._assign(added)

    # -- assignment -------------------------------------------------------------------------------------
    def owner(self, tp: TP) -> int:
        return split_owner(tp[0], tp[1], self.num_readers)

    def assignment(self) -> dict[int, list[KafkaPartitionSplit]]:
        """Subtask -> its splits (every known split, by the owner rule)."""
        result: dict[int, list[KafkaPartitionSplit]] = {i: [] for i in range(self.num_readers)}
        for tp, split in sorted(self.splits.items()):
            result[self.owner(tp)].append(split)
        return result

    def _assign(self, splits: list[KafkaPartitionSplit]) -> None:
        by_owner: dict[int, list[KafkaPartitionSplit]] = {}
        for split in splits:
            by_owner.setdefault(self.owner(split.topic_partition), []).append(split)
        for subtask in by_owner:
            self._send_pending(subtask)
        self._log_assignment()

    def _send_pending(self, subtask: int) -> None:
        gateway = self.readers.get(subtask)
        if gateway is None:
            return  # held until the reader is ready
        sent = self.sent.setdefault(subtask, set())
        pending = [s for s in self.assignment()[subtask] if s.topic_partition not in sent]
        if pending:
            sent.update(s.topic_partition for s in pending)
            gateway.send_event(SplitsEvent(-1, tuple(pending)).to_event(ADD_SPLITS))

    def _log_assignment(self, checkpoint_id: int = NO_CHECKPOINT) -> None:
        splits = tuple(
            SplitAssignment(split.split_id, split.topic, split.partition,
                            self.owner(tp) if self.owner(tp) in self.readers else -1,
                            self.committed_end.get(tp, split.starting_offset), None)
            for tp, split in sorted(self.splits.items())
        )
        self.context.append_log_record(SplitAssignmentRecord(
            self.context.job_id, self.context.operator_id, checkpoint_id, splits, int(time.time() * 1000)))

    def execution_attempt_ready(self, subtask: int, attempt_number: int, gateway: SubtaskGateway) -> None:
        self.readers[subtask] = gateway
        self.sent[subtask] = set()  # a new attempt has none of its splits yet
        self._send_pending(subtask)

    def execution_attempt_failed(self, subtask: int, attempt_number: int, reason: BaseException | None) -> None:
        gateway = self.readers.get(subtask)
        if gateway is not None and gateway.attempt_number == attempt_number:
            del self.readers[subtask]
            self.sent.pop(subtask, None)

    def subtask_reset(self, subtask: int, checkpoint_id: int) -> None:
        """Hand the subtask's splits back: its next attempt gets them all again when ready."""
        self.readers.pop(subtask, None)
        self.sent.pop(subtask, None)
        self._log_assignment(checkpoint_id)

    def handle_event_from_operator(self, subtask: int, attempt_number: int, event: OperatorEvent) -> None:
        log.debug("Kafka source %s: event %s from subtask %d ignored", self.context.operator_id, event.event_type, subtask)

    # -- checkpoints -----------------------------------------------------------------------------------------
    def checkpoint_coordinator(self, checkpoint_id: int, result_future: concurrent.futures.Future) -> None:
        if self.in_flight:
            result_future.set_exception(ChandyError(
                f"Kafka source {self.context.operator_id}: checkpoint {min(self.in_flight)} is still in flight; "
                "micro-batch ranges allow one checkpoint at a time (max concurrent checkpoints 1)"))
            return
        partitions = sorted(self.splits)
        missing = self.missing
        self.in_flight[checkpoint_id] = {}  # reserved: a concurrent trigger is refused meanwhile
        self.context.call_async(
            lambda: self._read_logs(partitions, missing),
            lambda logs, error: self._fix_ranges(checkpoint_id, partitions, logs, error, result_future),
        )

    def _read_logs(self, partitions: list[TP], missing: frozenset[TP]) -> dict[TP, tuple[int, int] | None]:
        """On the I/O executor: per partition its log now, (log start offset, last stable offset),
        or None when it is gone (:func:`~chandy.connectors.kafka.source.data_loss.partition_gone`,
        asked only for partitions the latest discovery missed and for those whose offsets the
        broker says it does not know: every other trigger makes the calls it always made).

        Raises:
            KafkaSourceClosedError: the enumerator is closed.
            OffsetsUnavailableError: a partition's offsets could not be read (and it is not gone).
        """
        if not partitions:
            return {}
        consumer = self._consumer
        if consumer is None:
            raise KafkaSourceClosedError(f"Kafka source {self.context.operator_id}: the enumerator is closed")
        logs: dict[TP, tuple[int, int] | None] = {}
        for tp in partitions:
            if tp in missing and partition_gone(consumer, tp):
                logs[tp] = None
                continue
            try:
                logs[tp] = watermark_offsets(consumer, TopicPartition(*tp))
            except OffsetsUnavailableError as exc:
                if exc.code not in UNKNOWN_PARTITION_ERRORS or not partition_gone(consumer, tp):
                    raise
                logs[tp] = None
        return logs

    def _fix_ranges(self, checkpoint_id: int, partitions: list[TP], logs: dict[TP, tuple[int, int] | None] | None,
                    error: BaseException | None, result_future: concurrent.futures.Future) -> None:
        if checkpoint_id not in self.in_flight:
            return  # aborted meanwhile
        if error is not None or logs is None:
            del self.in_flight[checkpoint_id]
            result_future.set_exception(error or KafkaSourceClosedError(f"no end offsets for checkpoint {checkpoint_id}"))
            return
        cap = self.options.max_records_per_checkpoint
        ranges: dict[TP, KafkaPartitionSplit] = {}
        try:
            for tp in partitions:
                position = self.committed_end.get(tp, self.splits[tp].starting_offset)
                stop = self.options.stopping_offsets.get(tp)
                log_now = logs[tp]
                if stop is not None and position >= stop:
                    ranges[tp] = KafkaPartitionSplit(tp[0], tp[1], position, position)  # done: its log no longer matters
                    continue
                start = self._checked_start(tp, position, log_now)
                if start is None or log_now is None:
                    continue  # gone: no range until it is back
                read_from = max(start, log_now[0])  # the first offset the log still holds
                end = max(start, log_now[1])
                if cap is not None:
                    end = min(end, read_from + cap)
                if stop is not None:
                    end = max(start, min(end, stop))
                ranges[tp] = KafkaPartitionSplit(tp[0], tp[1], start, end)
        except KafkaDataLossError as exc:
            # Spark's failOnDataLoss: the job ends, and a restart would meet the same log
            del self.in_flight[checkpoint_id]
            log.error("Kafka source %s: checkpoint %d: %s", self.context.operator_id, checkpoint_id, exc)
            result_future.set_exception(exc)
            self.context.fail_job(exc)
            return
        self.in_flight[checkpoint_id] = ranges
        # events first: they belong to this checkpoint; then the future (the checkpoint's moment)
        for subtask, splits in self.assignment().items():
            gateway = self.readers.get(subtask)
            if gateway is not None:
                mine = tuple(ranges[s.topic_partition] for s in splits if s.topic_partition in ranges)
                gateway.send_event(SplitsEvent(checkpoint_id, mine).to_event(OFFSET_RANGES))
        state = KafkaSourceEnumeratorState(
            checkpoint_id,
            tuple(AssignedSplit(s, self.owner(tp)) for tp, s in sorted(self.splits.items())),
            self.initial_discovery_finished,
            tuple(r for _, r in sorted(ranges.items())),
        )
        result_future.set_result(state.serialize())

    # -- data loss (Spark's failOnDataLoss) ------------------------------------------------------------------
    def check_log_ends(self, logs: Mapping[TP, tuple[int, int] | None]) -> dict[TP, int]:
        """Between triggers, the data loss no trigger would see: a partition whose log ends below
        the job's position (or is gone) shows no lag, so no checkpoint may come to look at it, and
        once its new log grows past the position a range can no longer tell. ``logs``: per
        partition (log start offset, last stable offset), or None when it is gone; partitions
        that are not assigned, done (at their stopping offset), or whose log starts above the
        position (found by the next trigger: it has lag) are left alone. Called by a driver that
        polls the lag (the pipeline, before each trigger).

        Returns:
            every partition's position (the next offset it reads) after the check.

        Raises:
            KafkaDataLossError: such a partition, with ``fail_on_data_loss`` (the job is not failed
                here: the caller ends it).
        """
        for tp, log_now in sorted(logs.items()):
            if tp not in self.splits:
                continue
            position = self.committed_end.get(tp, self.splits[tp].starting_offset)
            stop = self.options.stopping_offsets.get(tp)
            if stop is not None and position >= stop:
                continue
            if log_now is not None and log_now[1] >= position:
                self._below.pop(tp, None)  # the log reaches the position (again)
                self._gone.discard(tp)
                continue
            self._checked_start(tp, position, log_now)
        return {tp: self.committed_end.get(tp, split.starting_offset) for tp, split in self.splits.items()}

    def _checked_start(self, tp: TP, position: int, log_now: tuple[int, int] | None) -> int | None:
        """Where ``tp``'s next range starts, given its log now, ``log_now`` (log start offset, last
        stable offset; None: gone), and the job's ``position`` in it (Spark's ``failOnDataLoss``,
        see :mod:`~chandy.connectors.kafka.source.data_loss`): ``position`` while the log holds
        it; else, without ``fail_on_data_loss``, the new log's start when it ends below
        ``position`` (the position moves there at once; not below ``offset_floor``; with
        ``sink_holds_offsets`` the position stays), the log start offset when it moved above
        ``position`` (with ``sink_holds_offsets``: ``position``, the readers skip the offsets gone),
        None while the partition is gone. Warns once per change and counts :attr:`offsets_lost`.

        Raises:
            KafkaDataLossError: the log moved below ``position`` and ``fail_on_data_loss``.
        """
        change = log_change(tp, position, log_now)
        if change is None:
            self._below.pop(tp, None)
            self._lost_to.pop(tp, None)
            self._gone.discard(tp)
            return position
        if self.options.fail_on_data_loss:
            raise change.error()
        holds = self.options.sink_holds_offsets
        if change.kind == GONE:
            if tp not in self._gone:
                self._gone.add(tp)
                self._report(change, "no range until it is back")
            return None
        assert log_now is not None
        self._gone.discard(tp)
        low, high = log_now
        if change.kind == END_BELOW:
            floor = self.options.offset_floor.get(tp)
            resume = position if holds else max(low, min(position, floor if floor is not None else low))
            if tp not in self._below:
                self._below[tp] = high
                self._report(change, f"going on from offset {resume}" + (
                    " once the new log reaches it (the sink holds the offsets below it)" if resume > high else ""))
            self.committed_end[tp] = resume
            return resume
        # START_ABOVE: offsets [position, low) were deleted before they were read
        stop = self.options.stopping_offsets.get(tp)
        gone_to = low if stop is None else min(low, stop)
        counted = max(position, self._lost_to.get(tp, position))
        if gone_to > counted:
            self._lost_to[tp] = gone_to
            self._report(change, f"going on from offset {gone_to}", lost=gone_to - counted)
        return position if holds else gone_to

    def _report(self, change: LogChange, going_on: str, lost: int | None = None) -> None:
        """Warn of ``change`` (without ``fail_on_data_loss``) and count its offsets lost."""
        lost = change.offsets_lost if lost is None else lost
        self.offsets_lost += lost
        counted = f"; {lost} offset(s) counted lost" if lost else ""
        message = f"{change.describe()}; {going_on}, as --no-fail-on-data-loss asks (Spark's failOnDataLoss=false){counted}"
        self.data_loss.append(message)
        log.warning("Kafka source %s: %s", self.context.operator_id, message)

    def ranges_of(self, checkpoint_id: int) -> dict[TP, KafkaPartitionSplit]:
        """The ranges fixed for an in-flight checkpoint (empty when unknown)."""
        return dict(self.in_flight.get(checkpoint_id, {}))

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        done = [c for c in self.in_flight if c <= checkpoint_id and self.in_flight[c]]
        if done:
            newest = max(done)
            ends = {tp: r.stopping_offset for tp, r in self.in_flight[newest].items() if r.stopping_offset is not None}
            self.committed_end.update(ends)
            self._commit(newest, ends)
        for c in [c for c in self.in_flight if c <= checkpoint_id]:
            del self.in_flight[c]

    def release_ranges(self, checkpoint_id: int) -> None:
        """Forget the ranges of a completed intermediate savepoint. Nobody is notified of it
        (Flink 1.15+), so nothing commits its offsets: the next checkpoint reads its ranges again
        and lands them, exactly once. Called by the driver that ran the savepoint's micro-batch."""
        self.in_flight.pop(checkpoint_id, None)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        # never commit an aborted checkpoint's offsets; the next checkpoint re-reads its ranges
        self.in_flight.pop(checkpoint_id, None)

    def reset_to_checkpoint(self, checkpoint_id: int, checkpoint_data: bytes | None) -> None:
        self.in_flight.clear()
        self.readers.clear()
        self.sent.clear()
        self.splits.clear()
        self.committed_end.clear()
        self.initial_discovery_finished = False
        if checkpoint_data is not None:
            state = KafkaSourceEnumeratorState.deserialize(checkpoint_data)
            for assigned in state.splits:
                self.splits[assigned.split.topic_partition] = assigned.split
                self.committed_end[assigned.split.topic_partition] = assigned.split.starting_offset
            ends = {r.topic_partition: r.stopping_offset for r in state.ranges if r.stopping_offset is not None}
            self.committed_end.update(ends)
            self.initial_discovery_finished = state.initial_discovery_finished
            # restoring implies completion: committing its offsets is safe (Flink's OperatorCoordinator javadoc)
            if ends:
                self._commit(checkpoint_id, ends)
        self._apply_offset_floor()
        self._known = frozenset(self.splits)

    def _apply_offset_floor(self) -> None:
        for tp, floor in self.options.offset_floor.items():
            if tp in self.committed_end and self.committed_end[tp] < floor:
                log.info("Kafka source %s: %s-%d starts at %d, the offset the sink already holds (not %d)",
                         self.context.operator_id, tp[0], tp[1], floor, self.committed_end[tp])
                self.committed_end[tp] = floor

    # -- offset commits ----------------------------------------------------------------------------------------
    def _commit(self, checkpoint_id: int, ends: dict[TP, int]) -> None:
        committer, group_id = self._committer, self.options.group_id
        if committer is None or group_id is None or not ends:
            return
        offsets = [TopicPartition(t, p, o) for (t, p), o in sorted(ends.items())]
        record = OffsetCommitRecord(self.context.job_id, group_id, checkpoint_id,
                                    tuple(TopicPartitionOffset(t, p, o) for (t, p), o in sorted(ends.items())),
                                    int(time.time() * 1000))
        # with the Kafka runtime: in the coordinator log's transaction (sendOffsetsToTransaction), so
        # a fenced coordinator commits nothing and the group never moves back, not even for a moment
        transactional = SourceOffsets(group_id, tuple((t, p, o) for (t, p), o in sorted(ends.items())))
        with self._commit_lock:
            if checkpoint_id <= self._committed_checkpoint:
                return
            if self.context.commit_source_offsets(record, transactional):
                self._committed_checkpoint = checkpoint_id
                self._newest_commit = None  # nothing for close to flush: the log writer commits it
                self.commits_succeeded += 1
                return
            if self._newest_commit is None or checkpoint_id > self._newest_commit[0]:
                self._newest_commit = (checkpoint_id, offsets)

        def commit() -> bool:
            """True when committed; False when closed or a newer checkpoint's commit ran first
            (I/O threads may run commits out of order; the group never moves backwards)."""
            with self._commit_lock:
                if self._closed or checkpoint_id <= self._committed_checkpoint:
                    return False
                _commit_offsets(committer, offsets)
                self._committed_checkpoint = checkpoint_id
                return True

        def done(committed: bool | None, error: BaseException | None) -> None:
            if error is None and not committed:
                return
            if error is not None:
                self.commits_failed += 1
                log.warning("committing offsets of checkpoint %d to group %s failed (the next completed "
                            "checkpoint covers them): %s", checkpoint_id, self.options.group_id, error)
                return
            self.commits_succeeded += 1
            self.context.append_log_record(record)

        self.context.call_async(commit, done)


def _commit_offsets(committer: Consumer, offsets: list[TopicPartition]) -> None:
    """Commit ``offsets`` synchronously (``Consumer.commit(asynchronous=False)``).

    Raises:
        KafkaException: the commit failed, or the broker refused one of its partitions (the first
            partition's error).
    """
    result = committer.commit(offsets=offsets, asynchronous=False)
    failed = [tp for tp in result or [] if tp.error is not None]
    if failed:
        raise KafkaException(failed[0].error)


@dataclasses.dataclass(frozen=True)
class KafkaSourceCoordinatorProvider:
    """Creates the :class:`KafkaSourceEnumerator` of operator ``operator_id``."""

    operator_id: str
    options: KafkaSourceOptions
    #: reader subtasks, when the readers are not an operator whose acks the coordinator awaits
    parallelism: int | None = None

    def create(self, context: OperatorCoordinatorContext) -> KafkaSourceEnumerator:
        return KafkaSourceEnumerator(context, self.options)

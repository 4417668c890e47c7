"""The coordinator's only writer: :class:`LogWriter` commits batches (log records, control messages,
public events, outputs, source offsets) in order, one Kafka transaction per group of queued
batches, with ``transactional.id = <prefix>-coordinator-<job id>`` (:func:`transactional_id_for`):
a newer coordinator's ``init_transactions`` fences this one, and a fenced writer writes nothing
more (:class:`CoordinatorFencedError`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from chandy.coordinator.environment import Batch, SourceOffsets
from chandy.coordinator.errors import ChandyError
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.log import KEY_VERSION_HEADER, encode_record, partition_for
from chandy.coordinator.kafka.topics import ChandyTopics
from chandy.coordinator.records import LogKey, Tombstone
from chandy.coordinator.state import EpochClaim
from chandy.schemas.codec import Codec

log = logging.getLogger(__name__)


class CoordinatorFencedError(ChandyError):
    """Another coordinator of the same job took over (its producer fenced this one's)."""


class LogWriteError(ChandyError):
    """The coordinator log could not be written: Kafka kept failing past the retry timeout, or
    failed fatally without fencing this coordinator. The coordinator stops; unlike a fenced one,
    no other coordinator took over, and a restart resumes the job from its log."""


def transactional_id_for(prefix: str, job_id: str) -> str:
    """``<prefix>-coordinator-<job id>``: one transactional producer per job, for fencing."""
    return f"{prefix}-coordinator-{job_id}"


def is_fencing(error: KafkaError) -> bool:
    """Whether ``error`` means a newer producer of the same ``transactional.id`` took over (or the
    producer failed fatally, which librdkafka reports for fencing too)."""
    # produce() on a producer already in its fatal state raises "Unable to produce message: Local:
    # Fatal error" (code _FATAL) with fatal() False: the fencing is behind it (CI saw a fenced
    # coordinator stop as a mere write failure)
    return error.code() in (KafkaError._FENCED, KafkaError._FATAL, KafkaError.PRODUCER_FENCED,
                            KafkaError.INVALID_PRODUCER_EPOCH,
                            KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED) or error.fatal()


#: seconds a ``send_offsets_to_transaction`` may block before its producer counts as stuck:
#: librdkafka ignores the call's own timeout while it looks for the group's coordinator, and after
#: that broker left the client's metadata (a restart) it may wait forever (librdkafka issues 5456
#: and 5511; seen in a rolling restart of three brokers)
SEND_OFFSETS_STUCK_S = 45.0


class _ProducerStuck(Exception):
    """A transactional call did not return within :data:`SEND_OFFSETS_STUCK_S`."""


class LogWriter:
    """Commits batches in order, one Kafka transaction per group of queued batches.

    ``on_committed`` callbacks are handed to ``post`` (the mailbox) after the commit.
    ``on_fatal`` is called once when the producer is fenced or fails fatally.
    ``still_leading`` says whether this coordinator may replace a stuck producer: a new producer's
    ``init_transactions`` fences every other of the same ``transactional.id``, so only a
    coordinator that still leads its job's election may make one. ``newest_epoch`` reads the
    log (read committed, to its end): the claim of its newest epoch record (an
    :class:`~chandy.coordinator.state.EpochClaim`) and its key versions
    (``LoadStats.next_key_versions``). After the new producer's ``init_transactions`` the writer
    writes again only if that claim is this coordinator's own (``epoch``), or, when this one's
    epoch record never landed, if the log holds exactly what its replay found (the versions given
    to :meth:`seed_key_versions`). Else another coordinator of the job wrote meanwhile (a plain
    restart, which the stuck producer could not notice, perhaps with the same epoch number, having
    replayed the log before this one's record landed; or the coordinator this one replaced, itself
    unstuck), and this one stops as fenced, writing nothing (see docs/design.md, "A stuck producer").
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topics: ChandyTopics,
        job_id: str,
        codec: Codec,
        transactional_id: str,
        post: Callable[[Callable[[], None]], None],
        on_fatal: Callable[[BaseException], None],
        producer_overrides: Mapping[str, Any] | None = None,
        log_partitions: int = 1,
        retry_timeout_s: float = 180.0,
        still_leading: Callable[[], bool] = lambda: True,
        epoch: Callable[[], EpochClaim] | None = None,
        newest_epoch: Callable[[], tuple[EpochClaim, Mapping[LogKey, int]]] | None = None,
    ) -> None:
        self.topics = topics
        self.still_leading = still_leading
        self.epoch = epoch
        self.newest_epoch = newest_epoch
        self._replayed_versions: dict[LogKey, int] = {}  # the key versions the replay found
        self.retry_timeout_s = retry_timeout_s
        self.job_id = job_id
        self.codec = codec
        self.post = post
        self.on_fatal = on_fatal
        self.log_partition = partition_for(job_id, log_partitions)
        self.transactional_id = transactional_id
        self._producer_settings = {"transaction.timeout.ms": 60_000, "retry.backoff.ms": 10, "retry.backoff.max.ms": 100,
                                   **(producer_overrides or {})}
        self.bootstrap_servers = bootstrap_servers
        self.producer = self._new_producer()
        self._stuck_producers: list[Any] = []  # replaced, never destroyed: a call of theirs may still block
        self._security = kafka_config.security_settings(producer_overrides)
        self._group_consumers: dict[str, Any] = {}  # group id -> a consumer that never joins, for its metadata
        self._queue: list[tuple[Batch, Callable[[], None] | None]] = []
        #: per key, the version of its next record (KEY_VERSION_HEADER); seeded from the log's load
        self._key_versions: dict[LogKey, int] = {}
        self._batch_versions: dict[int, list[int]] = {}  # id(batch) -> the versions of its records
        self._cond = threading.Condition()
        self._closed = False
        self.failed: BaseException | None = None
        self.transactions = 0
        self._thread = threading.Thread(target=self._run, name=f"chandy-log-writer-{job_id[:8]}", daemon=True)

    def _new_producer(self) -> Any:
        return kafka_config.producer(self.bootstrap_servers, transactional_id=self.transactional_id,
                                     overrides=self._producer_settings)

    def _check_reachable(self) -> None:
        """Raises :class:`~chandy.coordinator.kafka.config.KafkaUnreachableError` when no broker answers (10 s)."""
        kafka_config.check_reachable(self.bootstrap_servers, self._security, timeout_s=10.0)

    def _replace_stuck_producer(self, what: str) -> None:
        """A new producer for the stuck one; its ``init_transactions`` aborts the open transaction.
        Then the log must prove that no newer coordinator of the job exists before anything is
        written again: ``init_transactions`` fences any producer of the ``transactional.id``, a
        newer coordinator's included, and this coordinator's memory is the job's truth only while
        no other coordinator has written. The proof: the log's newest epoch record is this
        coordinator's own (same epoch *and* ``coordinator_id``: a restart that replayed the log
        before this one's record landed takes the same epoch number), or, when this one's record
        never landed (its first transaction is the stuck one), the log holds exactly the records
        its replay found (the coordinator it replaced may have written on after that replay).

        Raises:
            CoordinatorFencedError: this coordinator no longer leads its job (the new producer
                would fence the one that does), or a newer epoch is in the log (the newer
                coordinator, fenced by the new producer, stops too; a restart resumes from the log).
            LogWriteError: the new producer or the log's read failed (nothing was written).
        """
        if not self.still_leading():
            try:  # an election lost because Kafka is gone is an outage (a restart cures it), not fencing
                self._check_reachable()
            except kafka_config.KafkaUnreachableError as exc:
                raise LogWriteError(f"the coordinator log could not be written: {what}, and {exc}") from exc
            raise CoordinatorFencedError(f"log writer stopped: {what}, and this coordinator no longer leads its job")
        log.warning("job %s: %s (librdkafka issues 5456, 5511): replacing the coordinator's producer", self.job_id, what)
        self._stuck_producers.append(self.producer)
        self.producer = self._new_producer()
        try:
            self._call_retrying(lambda: self.producer.init_transactions(30.0))
        except KafkaException as exc:
            error = exc.args[0]
            if is_fencing(error):
                raise CoordinatorFencedError(f"log writer stopped: {error.str()}") from exc
            raise LogWriteError(f"the coordinator log could not be written: a new producer failed: {error.str()}") from exc
        if self.epoch is None or self.newest_epoch is None:
            return
        mine = self.epoch()
        try:
            newest, versions = self.newest_epoch()
        except ChandyError as exc:
            raise LogWriteError(f"the coordinator log could not be written: after replacing a stuck producer, the "
                                f"log's newest epoch could not be read to prove no newer coordinator exists ({exc})") \
                from exc
        if newest == mine or (newest.epoch < mine.epoch and versions == self._replayed_versions):
            return
        raise CoordinatorFencedError(
            f"log writer stopped: {what}, and while it was stuck another coordinator of job {self.job_id} wrote to "
            f"its log (the newest epoch record: epoch {newest.epoch}, coordinator {newest.coordinator_id}; this "
            f"one: epoch {mine.epoch}, coordinator {mine.coordinator_id}); the replacement producer fenced it, so "
            "neither writes on: restart the job (it resumes from the log)")

    def init(self, timeout_s: float = 60.0) -> None:
        """``init_transactions()``: fences older producers of the same transactional.id."""
        self.producer.init_transactions(timeout_s)
        self._thread.start()

    def seed_key_versions(self, next_versions: Mapping[LogKey, int]) -> None:
        """The key versions the log already holds (``LoadStats.next_key_versions``), before the
        first batch: each record is written with :data:`KEY_VERSION_HEADER`, the number of
        records of its key written before it."""
        with self._cond:
            self._key_versions.update(next_versions)
            self._replayed_versions.update(next_versions)

    def _versions_for(self, batch: Batch) -> list[int]:
        """The key version of each of ``batch``'s records, assigned once, in submission order
        (the order of the transactions), so a retried transaction writes the same ones."""
        versions = []
        for record in batch.records:
            key = record.key()
            version = self._key_versions.get(key, 0)
            versions.append(version)
            if isinstance(record, Tombstone) and key.kind == "checkpoint":
                self._key_versions.pop(key, None)  # a checkpoint ID is never written again
            else:
                self._key_versions[key] = version + 1
        return versions

    def submit(self, batch: Batch, on_committed: Callable[[], None] | None = None) -> None:
        with self._cond:
            if self._closed or self.failed is not None:
                log.debug("log writer closed: dropping a batch of %d records", len(batch.records))
                return
            self._batch_versions[id(batch)] = self._versions_for(batch)
            self._queue.append((batch, on_committed))
            self._cond.notify()

    def close(self, timeout_s: float = 30.0) -> None:
        """Commit what is queued, then stop."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        for consumer in self._group_consumers.values():
            consumer.close()
        self._group_consumers.clear()

    def _produce(self, batch: Batch) -> None:
        key = self.job_id.encode()
        versions = self._batch_versions.get(id(batch)) or [0] * len(batch.records)
        for record, version in zip(batch.records, versions, strict=True):
            k, v = encode_record(self.codec, record, self.topics.coordinator_log)
            self.producer.produce(self.topics.coordinator_log, v, k, partition=self.log_partition,
                                  headers=[(KEY_VERSION_HEADER, str(version).encode())])
        for message in batch.control:
            self.producer.produce(self.topics.control, self.codec.encode(message.SCHEMA, message.to_avro(),
                                                                         topic=self.topics.control), key)
        for event in batch.events:
            self.producer.produce(self.topics.checkpoint_events, self.codec.encode(event.SCHEMA, event.to_avro(),
                                                                                   topic=self.topics.checkpoint_events), key)
        for output in batch.outputs:
            self.producer.produce(output.topic, output.value, output.key, headers=list(output.headers) or None)
        for committed in batch.source_offsets:
            self._send_offsets(committed)

    def _send_offsets(self, committed: SourceOffsets) -> None:
        offsets = [TopicPartition(t, p, o) for t, p, o in committed.offsets]
        metadata = self._group_metadata(committed.group_id)
        producer = self.producer

        def send() -> None:
            # in a thread of its own, waited for at most SEND_OFFSETS_STUCK_S: the call can block
            # past its timeout, and then only a new producer gets the writer going again
            outcome: list[BaseException | None] = []
            done = threading.Event()

            def call() -> None:
                try:
                    producer.send_offsets_to_transaction(offsets, metadata, 30.0)
                    outcome.append(None)
                except KafkaException as exc:  # handed to the writer's thread
                    outcome.append(exc)
                finally:
                    done.set()

            threading.Thread(target=call, name=f"chandy-send-offsets-{self.job_id[:8]}", daemon=True).start()
            if not done.wait(SEND_OFFSETS_STUCK_S):
                raise _ProducerStuck(f"send_offsets_to_transaction did not return within {SEND_OFFSETS_STUCK_S:.0f} s")
            if not outcome:  # anything but a KafkaException is a bug; the thread logged it
                raise LogWriteError("send_offsets_to_transaction failed with an unexpected error")
            if outcome[0] is not None:
                raise outcome[0]

        self._call_retrying(send)

    def _group_metadata(self, group_id: str) -> Any:
        """``ConsumerGroupMetadata`` of ``group_id`` for ``send_offsets_to_transaction``, from a
        consumer of the group that never subscribes (generation -1: the broker takes the commit
        as a simple, memberless group's, as the enumerator's own commits are)."""
        if group_id not in self._group_consumers:
            self._group_consumers[group_id] = kafka_config.consumer(self.bootstrap_servers, group_id=group_id,
                                                                    overrides=self._security)
        return self._group_consumers[group_id].consumer_group_metadata()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue and self._closed:
                    return
                group, self._queue = self._queue, []
            try:
                self._commit(group)
            except BaseException as exc:  # noqa: BLE001 - fenced or fatal: stop writing for good
                self.failed = exc
                with self._cond:
                    self._queue.clear()
                self.on_fatal(exc)
                return
            self.transactions += 1
            with self._cond:
                for batch, _ in group:
                    self._batch_versions.pop(id(batch), None)
            for _, on_committed in group:
                if on_committed is not None:
                    self.post(on_committed)

    def _commit(self, group: list[tuple[Batch, Callable[[], None] | None]]) -> None:
        """One transaction for the group, following librdkafka's transactional contract: a
        retriable commit error retries the commit itself; an abortable one aborts and redoes the
        whole transaction; a fatal or fencing error stops the writer for good."""
        for attempt in range(5):
            try:
                self.producer.begin_transaction()
                for batch, _ in group:
                    self._produce(batch)
                self._call_retrying(lambda: self.producer.commit_transaction(30.0))
                return
            except _ProducerStuck as exc:
                self._replace_stuck_producer(str(exc))  # the group is written again by the new producer
                continue
            except KafkaException as exc:
                error = exc.args[0]
                if is_fencing(error):
                    raise CoordinatorFencedError(f"log writer stopped: {error.str()}") from exc
                if not error.txn_requires_abort():
                    # fatal, or retriable past retry_timeout_s: the coordinator cannot go on
                    raise LogWriteError(f"the coordinator log could not be written: {error.str()}") from exc
                log.warning("transaction attempt %d failed (%s); aborting and retrying", attempt + 1, error.str())
                try:
                    self._call_retrying(lambda: self.producer.abort_transaction(30.0))
                except KafkaException as abort_exc:
                    # a newer coordinator can fence this one between the failed commit and the abort
                    if is_fencing(abort_exc.args[0]):
                        raise CoordinatorFencedError(f"log writer stopped: {abort_exc.args[0].str()}") from abort_exc
                    raise
                time.sleep(0.1 * (attempt + 1))
        raise LogWriteError("the coordinator log could not be written: 5 transactions in a row were aborted")

    def _call_retrying(self, call: Callable[[], None]) -> None:
        """``call`` retried with backoff (10 ms doubling to 1 s) while it fails retriably (a broker's
        death, a leader election, the transaction coordinator moving), for up to ``retry_timeout_s``."""
        deadline = time.monotonic() + self.retry_timeout_s
        attempt = 0
        while True:
            try:
                call()
                return
            except KafkaException as exc:
                error = exc.args[0]
                if not error.retriable() or error.fatal() or time.monotonic() > deadline:
                    raise
                attempt += 1
                if attempt in (1, 10, 50):
                    log.warning("job %s: coordinator log transaction: %s; retrying", self.job_id, error.str())
                time.sleep(min(1.0, 0.01 * 2 ** min(attempt, 7)))



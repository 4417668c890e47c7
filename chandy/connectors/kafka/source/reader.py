"""The reader side: consume exactly an offset range [start, stop) of one partition.

Assign and seek, no consumer-group rebalancing; ``isolation.level=read_committed``. The range
ends at ``stop`` even when the last offsets before it hold no record a reader can see
(transaction markers, aborted records, compacted gaps): the reader stops at the first record at
or past ``stop``, or when the consumer reports the end of the partition at or past ``stop``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from confluent_kafka import OFFSET_END, Consumer, KafkaError, TopicPartition

from chandy.connectors.kafka.source.split import KafkaPartitionSplit
from chandy.coordinator.errors import ChandyError, SuppressRestartsError
from chandy.coordinator.kafka import config as kafka_config

log = logging.getLogger(__name__)


class RangeReadError(ChandyError):
    """A range could not be read to its end."""


class SourceAuthorizationError(RangeReadError):
    """The client's principal may not read a topic (Kafka's TOPIC_AUTHORIZATION_FAILED)."""


class KafkaDataLossError(RangeReadError, SuppressRestartsError):
    """Offsets the job has yet to read are no longer in Kafka: a range's offsets gone when a reader
    fetches them (Kafka's OFFSET_OUT_OF_RANGE: aged out by retention, deleted with
    ``DeleteRecords``, the topic deleted and created again), or a partition whose log moved below
    the job's position when the enumerator fixes a checkpoint's ranges
    (:mod:`chandy.connectors.kafka.source.data_loss`). Spark's Kafka source fails the query the
    same way unless ``failOnDataLoss`` is false. A restart would meet the same log, so it ends the
    job whatever its restart strategy (:class:`SuppressRestartsError`)."""


#: errors that say the principal lacks an ACL, not that the broker is busy
_AUTHORIZATION_ERRORS = (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED,
                         KafkaError.CLUSTER_AUTHORIZATION_FAILED)


def check_read_access(bootstrap_servers: str, partitions: Iterable[tuple[str, int]],
                      consumer_overrides: Mapping[str, Any] | None = None, timeout_s: float = 15.0) -> None:
    """Whether ``consumer_overrides``' principal may read the partitions, learnt before there is a
    range to read: the topics' metadata (Kafka hides a topic without DESCRIBE, and librdkafka then
    waits for it in silence), then one Fetch from the end of each partition (Kafka checks READ;
    no record is transferred, the fetch starts at the last stable offset). Partitions that do not
    answer within ``timeout_s`` seconds pass (a slow broker is not a missing ACL).

    Raises:
        SourceAuthorizationError: the broker refused a topic (names the topic and Kafka's error).
    """
    wanted = {(t, p) for t, p in partitions}
    if not wanted:
        return
    settings = kafka_config.consumer_config(bootstrap_servers, overrides={"enable.partition.eof": True,
                                                                         **(consumer_overrides or {})})
    consumer = Consumer(settings)
    try:
        for name in sorted({t for t, _ in wanted}):
            error = _metadata_error(consumer, name, timeout_s)
            if error is not None:
                raise SourceAuthorizationError(f"topic {name}: {error.str()}")
        consumer.assign([TopicPartition(t, p, OFFSET_END) for t, p in sorted(wanted)])
        deadline = time.monotonic() + timeout_s
        while wanted and time.monotonic() < deadline:
            for message in consumer.consume(num_messages=len(wanted), timeout=0.2):
                error = message.error()
                if error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED:
                    raise SourceAuthorizationError(
                        f"consumer group {settings['group.id']} (the group.id of consumers that only assign "
                        f"partitions; Kafka needs DESCRIBE on it): {error.str()}")
                if error is not None and error.code() in _AUTHORIZATION_ERRORS:
                    where = message.topic() or ", ".join(sorted({t for t, _ in wanted}))
                    raise SourceAuthorizationError(f"topic {where}: {error.str()}")
                wanted.discard((message.topic(), message.partition()))
    finally:
        consumer.close()


def _metadata_error(consumer: Consumer, topic: str, timeout_s: float) -> KafkaError | None:
    """The authorization error of ``topic``'s metadata for this consumer's principal, if any."""
    metadata = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    error = None if metadata is None else metadata.error
    return error if error is not None and error.code() in _AUTHORIZATION_ERRORS else None


def _in_range(messages: list[Any], stop: int, split_id: str) -> tuple[list[Any], bool]:
    """The records of one ``consume`` batch below offset ``stop``, and whether the range is done
    (a record at or past ``stop``, or the partition's end at or past it).

    Raises:
        RangeReadError: the batch holds a consumer error other than the partition's end.
    """
    records: list[Any] = []
    for message in messages:
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._AUTO_OFFSET_RESET:
                return records, False  # the range's next offset is gone: read_batches decides
            if error.code() != KafkaError._PARTITION_EOF:
                raise RangeReadError(f"reading {split_id}: {error}")
            offset = message.offset()
            if offset is not None and offset >= stop:
                return records, True
            continue  # the end for now; the records up to the range's end come later
        if message.offset() >= stop:
            return records, True
        records.append(message)
    return records, False


#: how often a range reader's consumer hands librdkafka's statistics to :class:`KafkaRangeReader`
#: (ms; its Fetch request count gives the KafkaSourceReader's ``records-per-request-avg``)
STATS_INTERVAL_MS = 100


class KafkaRangeReader:
    """Reads bounded splits with one consumer (reused across ranges; not thread-safe).

    Args:
        bootstrap_servers: ``bootstrap.servers``.
        consumer_overrides: librdkafka settings under their own names, over
            :data:`chandy.coordinator.kafka.config.RANGE_READ`.
        timeout_s: how long a range may make no progress before :class:`RangeReadError`.
    """

    def __init__(self, bootstrap_servers: str, consumer_overrides: Mapping[str, Any] | None = None,
                 timeout_s: float = 60.0) -> None:
        #: librdkafka's counters in its latest statistics (``statistics.interval.ms``, see
        #: :data:`STATS_INTERVAL_MS`): Fetch requests sent to every broker, records received
        self.fetch_requests = self.records_fetched = 0
        overrides = {**kafka_config.RANGE_READ, "statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": self._on_stats,
                     **(consumer_overrides or {})}
        self.consumer = kafka_config.consumer(bootstrap_servers, overrides=overrides)
        self.timeout_s = timeout_s

    def _on_stats(self, text: str) -> None:
        """librdkafka's statistics (JSON, ``STATISTICS.md``): the sum of ``brokers[*].req.Fetch``
        and ``rxmsgs``, for the consumer's records per fetch request."""
        try:
            stats = json.loads(text)
            self.fetch_requests = sum(int((b.get("req") or {}).get("Fetch", 0)) for b in (stats.get("brokers") or {}).values())
            self.records_fetched = int(stats.get("rxmsgs", 0))
        except (ValueError, TypeError, AttributeError):  # statistics are a metric: never fail a read for them
            return

    def read(self, split: KafkaPartitionSplit, batch_size: int = 10_000) -> Iterator[Any]:
        """Yield the ``confluent_kafka.Message``\\ s of ``split``'s range, in offset order
        (:meth:`read_batches`, one message at a time).

        Raises:
            ValueError: the split is unbounded.
            RangeReadError: a consumer error, or no progress for ``timeout_s`` seconds.
        """
        for batch in self.read_batches(split, batch_size):
            yield from batch

    def read_batches(self, split: KafkaPartitionSplit, batch_size: int = 10_000, *,
                     fail_on_data_loss: bool = True) -> Iterator[list[Any]]:
        """Yield the records of ``split``'s range [starting, stopping offset) as lists of at most
        ``batch_size`` ``confluent_kafka.Message``\\ s, in offset order.

        Offsets of the range that Kafka no longer holds (the reader's consumer has
        ``auto.offset.reset=error``, so librdkafka never jumps over them in silence) raise
        :class:`KafkaDataLossError`; with ``fail_on_data_loss`` False (Spark's ``failOnDataLoss``)
        the reader logs what it skips and goes on from the partition's log start offset.

        Each ``consume`` asks for no more records than the range still holds, so the reader
        neither waits for records past its end (``consume`` returns when it has the count it asked
        for, or at its timeout) nor converts them. A range may hold fewer records than offsets
        (transaction markers, compaction); the reader then stops at the partition's end
        (``enable.partition.eof``) or at the first record past the range.

        Raises:
            ValueError: the split is unbounded.
            KafkaDataLossError: offsets of the range are gone (``fail_on_data_loss``).
            RangeReadError: a consumer error, or no progress for ``timeout_s`` seconds.
        """
        if split.stopping_offset is None:
            raise ValueError(f"split {split.split_id} has no stopping offset")
        start, stop = split.starting_offset, split.stopping_offset
        if stop <= start:
            return
        self.consumer.assign([TopicPartition(split.topic, split.partition, start)])
        position = start  # the next offset the range needs
        last_progress = time.monotonic()
        try:
            while True:
                messages = self.consumer.consume(num_messages=max(1, min(batch_size, stop - position)), timeout=0.1)
                if not messages:
                    if time.monotonic() - last_progress > self.timeout_s:
                        # librdkafka waits in silence for a topic it may not describe: say so
                        denied = _metadata_error(self.consumer, split.topic, 10.0)
                        why = f" ({denied.str()})" if denied is not None else ""
                        raise RangeReadError(f"no progress reading {split.split_id} [{start}, {stop}) for "
                                             f"{self.timeout_s} s{why}")
                    continue
                records, done = _in_range(messages, stop, split.split_id)
                if records:
                    last_progress = time.monotonic()
                    position = records[-1].offset() + 1
                    yield records
                if done or position >= stop:
                    return
                if any(_offset_gone(m) for m in messages):
                    resume = self._skip_lost(split, position, fail_on_data_loss)
                    if resume > position:
                        position, last_progress = resume, time.monotonic()
                    if position >= stop:
                        return
        finally:
            self.consumer.unassign()

    def _skip_lost(self, split: KafkaPartitionSplit, position: int, fail_on_data_loss: bool) -> int:
        """Where to go on once the broker said offset ``position`` of ``split`` is out of range:
        ``position`` again when the log holds it after all (a stale leader), the partition's log
        start offset when the offsets below it are gone, the range's end when the log now ends
        before ``position`` (the topic was created again); the consumer is moved there.

        Raises:
            KafkaDataLossError: offsets of the range are gone and ``fail_on_data_loss`` (what is
                gone, and what to do about it).
        """
        low, high = self.consumer.get_watermark_offsets(TopicPartition(split.topic, split.partition),
                                                        timeout=30, cached=False)
        stop = split.stopping_offset
        assert stop is not None
        if low <= position < high:
            resume = position  # in the log after all: read it again (no progress counted)
        else:
            resume = stop if position >= high else min(low, stop)
            where = (f"{split.split_id}: offsets [{position}, {resume}) of the range [{split.starting_offset}, "
                     f"{stop}) are no longer in Kafka (the partition's log holds [{low}, {high}): aged out by "
                     "retention, deleted, or the topic was created again)")
            if fail_on_data_loss:
                raise KafkaDataLossError(f"{where}; nothing of this checkpoint landed. To skip them, restore the "
                                         "job from its latest checkpoint (--from-savepoint) with "
                                         "--no-fail-on-data-loss (Spark's failOnDataLoss=false)")
            log.warning("%s: skipped (--no-fail-on-data-loss)", where)
        if resume < stop:  # assign again: librdkafka refuses to seek a partition in its error state
            self.consumer.assign([TopicPartition(split.topic, split.partition, resume)])
        return resume

    def close(self) -> None:
        self.consumer.close()


def _offset_gone(message: Any) -> bool:
    """Whether ``message`` is librdkafka's report that the offset it was asked to fetch is not in
    the partition's log (``auto.offset.reset=error``)."""
    error = message.error()
    return error is not None and error.code() == KafkaError._AUTO_OFFSET_RESET

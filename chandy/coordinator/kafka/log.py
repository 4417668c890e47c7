"""The coordinator log on Kafka: encoding records, choosing the partition, loading on restart.

Keys are ``chandy.v1.CoordinatorLogKey`` (job id, kind, entity id) and values the record's own
schema, both single-object encoded (or Confluent-framed with a registry); a null value is a
tombstone. All records of one job go to one partition (CRC-32 of the job id modulo the
partition count), so the fold sees them in the order they were decided.

Loading (Kafka's coordinator loader): capture the end offset of the job's partition at start,
read from the beginning with ``isolation.level=read_committed`` until the consumer reports the
end of the partition at or past that offset. End-of-partition events (``enable.partition.eof``)
are what make this safe on a compacted, transactional topic, where the last offsets can be
transaction markers or compacted away and no record ever arrives at ``end - 1``.

Loading for a restart (:func:`load_state`) follows Kafka's ``CoordinatorLoaderImpl``: a record
of a kind this version does not know is skipped with a warning (a newer coordinator wrote it),
but a record it cannot read (bytes that do not decode, a known kind whose value does not parse)
fails the load with :class:`LogRecordCorruptError`: skipping it could silently restore an older
checkpoint. ``chandy log replay`` reads leniently and reports what it skipped.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import zlib
from collections.abc import Iterator
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from chandy.coordinator.errors import ChandyError
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.topics import OffsetsUnavailableError, watermark_offsets
from chandy.coordinator.records import LogKey, LogRecord, Tombstone, known_kinds, record_type_for
from chandy.coordinator.state import CoordinatorState, apply
from chandy.schemas.codec import Codec, SingleObjectCodec, WireFormatError, location_of

log = logging.getLogger(__name__)

KEY_SCHEMA = "chandy.v1.CoordinatorLogKey"

#: The record header carrying a log record's *key version*: how many records of the same key the
#: job's coordinators wrote before it (0: the first of its key), in decimal ASCII. Compaction
#: keeps or drops a record whole, headers included, so a replay that meets a key first at a
#: version above 0 knows older records of that key were compacted away (:mod:`chandy.coordinator.kafka.replay`).
KEY_VERSION_HEADER = "chandy.key_version"


def key_version_of(message: Any) -> int | None:
    """The :data:`KEY_VERSION_HEADER` of a log message, or None (written before Chandy set it,
    or unreadable)."""
    headers = message.headers() if hasattr(message, "headers") else None
    for name, value in headers or ():
        if name == KEY_VERSION_HEADER and value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


class LogLoadError(ChandyError):
    """The coordinator log could not be read to its end."""


class LogUnreachableError(LogLoadError, kafka_config.KafkaUnreachableError):
    """The coordinator log could not be read because no broker answered (Kafka is down or
    unreachable): nothing is known of the log, a newer coordinator's epoch included."""


class LogRecordCorruptError(LogLoadError):
    """A record of the coordinator log cannot be read (Kafka's CoordinatorLoader fails the load
    on such a record rather than guess); the message says where it is."""


def partition_for(job_id: str, num_partitions: int) -> int:
    """The log partition of ``job_id``: CRC-32 of its UTF-8 bytes modulo ``num_partitions``."""
    return zlib.crc32(job_id.encode("utf-8")) % num_partitions


def encode_record(codec: Codec, record: LogRecord, topic: str | None = None) -> tuple[bytes, bytes | None]:
    """(key bytes, value bytes or None for a tombstone) of a log record."""
    key = codec.encode(KEY_SCHEMA, record.key().to_avro(), topic=topic)
    if isinstance(record, Tombstone):
        return key, None
    return key, codec.encode(record.SCHEMA, record.to_avro(), topic=topic)


@dataclasses.dataclass
class LoadStats:
    """What a load read: messages read, records applied, newest-of-their-key tombstones (nothing
    to delete), records skipped (other jobs, unknown kinds, bad
    bytes), offsets read up to, and the time taken in seconds."""

    read: int = 0
    applied: int = 0
    tombstones: int = 0
    skipped_other_jobs: int = 0
    skipped_unknown: int = 0
    skipped_bad: int = 0
    end_offset: int = 0
    seconds: float = 0.0
    #: per live key of the job (its newest record is not a deletion marker): the key version its
    #: next record gets (:data:`KEY_VERSION_HEADER`)
    next_key_versions: dict[LogKey, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class LoggedRecord:
    """A decoded log record with where it was read and when it was written (ms)."""

    record: LogRecord
    partition: int
    offset: int
    timestamp_ms: int
    #: the record's :data:`KEY_VERSION_HEADER` (None: not set)
    key_version: int | None = None


def raw_messages(
    bootstrap_servers: str,
    topic: str,
    *,
    job_id: str | None = None,
    consumer_overrides: dict[str, Any] | None = None,
    stats: LoadStats | None = None,
    timeout_s: float = 60.0,
) -> Iterator[Any]:
    """The log's messages, undecoded, from the beginning up to the end offsets captured when
    called: of ``job_id``'s partition, or of all partitions. Read-only: a consumer without a
    group that never commits.

    Raises:
        LogUnreachableError: no broker answered within ``timeout_s`` seconds.
        LogLoadError: the topic is missing, or no progress for ``timeout_s`` seconds.
    """
    for batch in raw_batches(bootstrap_servers, topic, job_id=job_id, consumer_overrides=consumer_overrides,
                             stats=stats, timeout_s=timeout_s):
        yield from batch


def raw_batches(
    bootstrap_servers: str,
    topic: str,
    *,
    job_id: str | None = None,
    consumer_overrides: dict[str, Any] | None = None,
    stats: LoadStats | None = None,
    timeout_s: float = 60.0,
) -> Iterator[list[Any]]:
    """:func:`raw_messages` a fetched batch (a list of up to 10,000 messages, in offset order per
    partition) at a time: the per-record work of a long log's load stays in the caller's loop.

    Raises:
        LogUnreachableError: no broker answered within ``timeout_s`` seconds.
        LogLoadError: the topic is missing, or no progress for ``timeout_s`` seconds.
    """
    stats = stats if stats is not None else LoadStats()
    # a catch-up read to a known end (kafka_config.BOUNDED_READ says why each setting)
    overrides = {**kafka_config.BOUNDED_READ, "fetch.max.bytes": 52428800, "max.partition.fetch.bytes": 10485760,
                 **(consumer_overrides or {})}
    consumer = kafka_config.consumer(bootstrap_servers, overrides=overrides)
    try:
        try:
            metadata = consumer.list_topics(topic, timeout=timeout_s)
        except KafkaException as exc:
            error = exc.args[0]
            if kafka_config.is_unreachable(error):
                raise LogUnreachableError(f"coordinator log {topic}: Kafka is unreachable: no metadata from "
                                          f"{bootstrap_servers} within {timeout_s:g} s ({error.str()})") from None
            raise LogLoadError(f"coordinator log {topic}: metadata: {error.str()}") from exc
        if topic not in metadata.topics or metadata.topics[topic].error is not None:
            raise LogLoadError(f"coordinator log topic {topic} does not exist")
        partitions = sorted(metadata.topics[topic].partitions)
        if job_id is not None:
            partitions = [partition_for(job_id, len(partitions))]
        ends: dict[int, int] = {}
        for p in partitions:
            low, high = _watermarks(consumer, TopicPartition(topic, p), timeout_s)
            if high > low:
                ends[p] = high
        stats.end_offset = sum(ends.values())
        if not ends:
            return
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in ends])
        remaining = set(ends)
        last_progress = time.monotonic()
        while remaining:
            messages = consumer.consume(num_messages=10_000, timeout=0.05)
            if not messages:
                if time.monotonic() - last_progress > timeout_s:
                    raise LogLoadError(f"no progress reading {topic} for {timeout_s} s "
                                       f"(partitions {sorted(remaining)} unfinished)")
                continue
            batch = []
            for message in messages:
                error = message.error()
                partition, offset = message.partition(), message.offset()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        if partition is not None and offset is not None and offset >= ends.get(partition, 0):
                            remaining.discard(partition)
                        continue
                    raise LogLoadError(f"reading {topic}: {error}")
                if partition is None or offset is None:  # never for a fetched record
                    continue
                end = ends[partition]
                if offset >= end:
                    remaining.discard(partition)
                    continue
                batch.append(message)
                if offset + 1 >= end:
                    remaining.discard(partition)
            if batch:
                last_progress = time.monotonic()
                yield batch
    finally:
        consumer.close()


def _watermarks(consumer: Any, partition: TopicPartition, timeout_s: float) -> tuple[int, int]:
    """:func:`~chandy.coordinator.kafka.topics.watermark_offsets`, failing as a load does.

    Raises:
        LogLoadError: the offsets cannot be read within ``timeout_s`` seconds.
    """
    try:
        return watermark_offsets(consumer, partition, timeout_s)
    except OffsetsUnavailableError as exc:
        raise LogLoadError(f"end offsets of the coordinator log: {exc}") from exc


def read_log(
    bootstrap_servers: str,
    topic: str,
    *,
    job_id: str | None = None,
    codec: Codec | None = None,
    consumer_overrides: dict[str, Any] | None = None,
    stats: LoadStats | None = None,
    timeout_s: float = 60.0,
    strict: bool = False,
) -> Iterator[LoggedRecord]:
    """The log's records (of ``job_id``, or of all jobs) up to the end offsets captured when
    called, decoded (:func:`raw_messages`). Records of unknown kinds are logged, counted and
    skipped; undecodable ones too, unless ``strict``.

    Raises:
        LogLoadError: as :func:`raw_messages`.
        LogRecordCorruptError: ``strict`` and a record cannot be read.
    """
    codec = codec or SingleObjectCodec()
    stats = stats if stats is not None else LoadStats()
    started = time.monotonic()
    try:
        for message in raw_messages(bootstrap_servers, topic, job_id=job_id, consumer_overrides=consumer_overrides,
                                    stats=stats, timeout_s=timeout_s):
            decoded = decode_message(codec, message, job_id, stats, strict=strict)
            if decoded is not None:
                yield decoded
    finally:
        stats.seconds = time.monotonic() - started


def decode_message(codec: Codec, message: Any, job_id: str | None, stats: LoadStats, *,
                   strict: bool = False) -> LoggedRecord | None:
    """Decode one log message (key and value; None value = tombstone); None when skipped (counted
    in ``stats``). A record of an unknown kind is always skipped with a warning.

    Raises:
        LogRecordCorruptError: ``strict`` and the key, or the value of a known kind, cannot be
            read (Kafka's ``CoordinatorLoaderImpl``: recovery never guesses).
    """
    where = location_of(message)

    def bad(what: str, exc: BaseException | None = None) -> None:
        stats.skipped_bad += 1
        if strict:
            raise LogRecordCorruptError(f"coordinator log record at {where} cannot be read: {what}"
                                        + (f" ({exc})" if exc is not None else "")) from exc
        log.warning("skipping a log record at %s: %s%s", where, what, f" ({exc})" if exc is not None else "")

    try:
        key = LogKey.from_avro(codec.decode(message.key(), where).value)
    except (WireFormatError, KeyError, TypeError, AttributeError) as exc:
        bad("unreadable key", exc)
        return None
    if job_id is not None and key.job_id != job_id:
        stats.skipped_other_jobs += 1
        return None
    if key.kind not in known_kinds():
        stats.skipped_unknown += 1
        log.warning("skipping log record of unknown kind %r at %s (written by a newer coordinator?)", key.kind, where)
        return None
    timestamp = message.timestamp()[1]
    if message.value() is None:
        if key.kind == "checkpoint" and not key.entity_id.lstrip("-").isdigit():
            bad(f"a checkpoint tombstone with a non-numeric id {key.entity_id!r}")
            return None
        return LoggedRecord(Tombstone(key), message.partition(), message.offset(), timestamp, key_version_of(message))
    try:
        decoded = codec.decode(message.value(), where)
    except WireFormatError as exc:
        bad(f"an undecodable value of kind {key.kind!r}", exc)
        return None
    cls = record_type_for(decoded.name)
    if cls is None or cls.KIND != key.kind:
        bad(f"a {decoded.name} value under a key of kind {key.kind!r}")
        return None
    try:
        record = cls.from_avro(decoded.value)
    except (TypeError, ValueError, KeyError) as exc:
        bad(f"a value that does not fit {decoded.name}", exc)
        return None
    return LoggedRecord(record, message.partition(), message.offset(), timestamp, key_version_of(message))


def load_state(
    bootstrap_servers: str,
    topic: str,
    job_id: str,
    *,
    codec: Codec | None = None,
    consumer_overrides: dict[str, Any] | None = None,
    timeout_s: float = 60.0,
) -> tuple[CoordinatorState, LoadStats]:
    """Replay the job's log to its current end: the state a restarted coordinator starts from.

    The fold only needs the newest record of each key (the log is compacted, and the state is
    what compaction leaves: :func:`chandy.coordinator.state.apply` is compaction-invariant), so the
    messages are read undecoded, the newest per key is kept (in the order of its offset), and only
    those are decoded and applied, as a log compacted at this moment would be; a key whose newest
    record is a tombstone has nothing left to delete and is not decoded at all. ``stats.read``
    counts the messages read, ``stats.applied`` the records applied, ``stats.tombstones`` the
    tombstones passed over.

    Strict, as Kafka's ``CoordinatorLoaderImpl``: unknown record kinds are skipped with a warning,
    unreadable records fail the load (a record superseded by a newer one of its key is not read,
    as compaction would have removed it).

    Raises:
        LogUnreachableError: no broker answered (Kafka is down or unreachable).
        LogLoadError: the log cannot be read to its end.
        LogRecordCorruptError: a record of this job cannot be read.
    """
    codec = codec or SingleObjectCodec()
    stats = LoadStats()
    state = CoordinatorState(job_id)
    started = time.monotonic()
    newest: dict[bytes | None, Any] = {}
    try:
        for batch in raw_batches(bootstrap_servers, topic, job_id=job_id, consumer_overrides=consumer_overrides,
                                 stats=stats, timeout_s=timeout_s):
            stats.read += len(batch)
            for message in batch:
                key = message.key()
                newest.pop(key, None)  # re-inserted last: the dict keeps the newest records in offset order
                newest[key] = message
        for message in newest.values():
            if message.value() is None:
                # the newest record of its key is a tombstone: nothing older of that key is
                # applied, so the tombstone would delete nothing (a long job's log holds one per
                # subsumed checkpoint until compaction drops them after delete.retention.ms)
                stats.tombstones += 1
                continue
            logged = decode_message(codec, message, job_id, stats, strict=True)
            if logged is not None:
                apply(state, logged.record)
                stats.applied += 1
                # the key's next version follows its newest record's (1 for a record written
                # before the header: it is not the first of its key either)
                version = logged.key_version
                stats.next_key_versions[logged.record.key()] = 1 if version is None else version + 1
    finally:
        stats.seconds = time.monotonic() - started
    return state, stats

"""Offsets initializers (Flink's OffsetsInitializer): where a newly discovered split starts.

``earliest()``, ``latest()``, ``committed(reset_strategy)``, ``timestamp(ms)`` and
``offsets({(topic, partition): offset}, reset_strategy)``. Each resolves a set of partitions to
concrete offsets through a :class:`OffsetsRetriever` backed by a real consumer. "latest" is the
last stable offset: Chandy's consumers read ``read_committed``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Protocol

from confluent_kafka import OFFSET_INVALID, TopicPartition

from chandy.coordinator.errors import ChandyError
from chandy.coordinator.kafka.topics import watermark_offsets

TP = tuple[str, int]


class NoOffsetForPartitionError(ChandyError):
    """The committed offset was asked for, the group has none, and no reset strategy is set."""


class OffsetsRetriever(Protocol):
    def earliest(self, partitions: Iterable[TP]) -> dict[TP, int]: ...
    def latest(self, partitions: Iterable[TP]) -> dict[TP, int]: ...
    def committed(self, partitions: Iterable[TP]) -> dict[TP, int | None]: ...
    def for_timestamp(self, partitions: Iterable[TP], timestamp_ms: int) -> dict[TP, int]: ...


class ConsumerOffsetsRetriever:
    """:class:`OffsetsRetriever` over a confluent-kafka ``Consumer`` (read_committed; with the
    consumer group ``group.id`` for committed offsets). Timeouts in seconds."""

    def __init__(self, consumer, timeout_s: float = 30.0) -> None:
        self.consumer = consumer
        self.timeout_s = timeout_s

    def earliest(self, partitions: Iterable[TP]) -> dict[TP, int]:
        return {tp: watermark_offsets(self.consumer, TopicPartition(*tp), self.timeout_s)[0]
                for tp in partitions}

    def latest(self, partitions: Iterable[TP]) -> dict[TP, int]:
        return {tp: watermark_offsets(self.consumer, TopicPartition(*tp), self.timeout_s)[1]
                for tp in partitions}

    def committed(self, partitions: Iterable[TP]) -> dict[TP, int | None]:
        tps = [TopicPartition(*tp) for tp in partitions]
        if not tps:
            return {}
        result = self.consumer.committed(tps, timeout=self.timeout_s)
        return {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 and tp.offset != OFFSET_INVALID else None)
                for tp in result}

    def for_timestamp(self, partitions: Iterable[TP], timestamp_ms: int) -> dict[TP, int]:
        tps = [TopicPartition(topic, partition, timestamp_ms) for topic, partition in partitions]
        if not tps:
            return {}
        found = self.consumer.offsets_for_times(tps, timeout=self.timeout_s)
        latest = self.latest((tp.topic, tp.partition) for tp in found if tp.offset < 0)
        # no record at or after the timestamp: start at the end, as Flink's TimestampOffsetsInitializer
        return {(tp.topic, tp.partition): tp.offset if tp.offset >= 0 else latest[(tp.topic, tp.partition)]
                for tp in found}


class OffsetsInitializer(Protocol):
    def get_partition_offsets(self, partitions: Iterable[TP], retriever: OffsetsRetriever) -> dict[TP, int]:
        """Concrete starting offsets for ``partitions``."""
        ...


@dataclasses.dataclass(frozen=True)
class _Earliest:
    def get_partition_offsets(self, partitions, retriever):
        return retriever.earliest(list(partitions))


@dataclasses.dataclass(frozen=True)
class _Latest:
    def get_partition_offsets(self, partitions, retriever):
        return retriever.latest(list(partitions))


@dataclasses.dataclass(frozen=True)
class _Timestamp:
    timestamp_ms: int

    def get_partition_offsets(self, partitions, retriever):
        return retriever.for_timestamp(list(partitions), self.timestamp_ms)


@dataclasses.dataclass(frozen=True)
class _Committed:
    reset_strategy: str | None  # "earliest", "latest" or None

    def get_partition_offsets(self, partitions, retriever):
        partitions = list(partitions)
        committed = retriever.committed(partitions)
        missing = [tp for tp in partitions if committed.get(tp) is None]
        if missing and self.reset_strategy is None:
            raise NoOffsetForPartitionError(
                f"no committed offset for {', '.join(f'{t}-{p}' for t, p in missing)} and no reset strategy: "
                "use committed(reset_strategy='earliest'|'latest')"
            )
        fallback = _fallback(self.reset_strategy, missing, retriever)
        return {tp: committed[tp] if committed.get(tp) is not None else fallback[tp] for tp in partitions}


@dataclasses.dataclass(frozen=True)
class _Specific:
    offsets: Mapping[TP, int]
    reset_strategy: str

    def get_partition_offsets(self, partitions, retriever):
        partitions = list(partitions)
        missing = [tp for tp in partitions if tp not in self.offsets]
        fallback = _fallback(self.reset_strategy, missing, retriever)
        return {tp: self.offsets[tp] if tp in self.offsets else fallback[tp] for tp in partitions}


def _fallback(strategy: str | None, partitions: list[TP], retriever: OffsetsRetriever) -> dict[TP, int]:
    if not partitions:
        return {}
    if strategy == "earliest":
        return retriever.earliest(partitions)
    if strategy == "latest":
        return retriever.latest(partitions)
    raise ValueError(f"reset strategy must be 'earliest' or 'latest', got {strategy!r}")


def earliest() -> OffsetsInitializer:
    """Start at the earliest offset of each partition."""
    return _Earliest()


def latest() -> OffsetsInitializer:
    """Start at the last stable offset of each partition (only records produced later)."""
    return _Latest()


def committed(reset_strategy: str | None = None) -> OffsetsInitializer:
    """Start at the consumer group's committed offsets; partitions without one use
    ``reset_strategy`` ("earliest"/"latest"), or raise :class:`NoOffsetForPartitionError`."""
    if reset_strategy not in (None, "earliest", "latest"):
        raise ValueError(f"reset strategy must be 'earliest' or 'latest', got {reset_strategy!r}")
    return _Committed(reset_strategy)


def timestamp(timestamp_ms: int) -> OffsetsInitializer:
    """Start at the first record with a timestamp >= ``timestamp_ms`` (ms since the Unix epoch)."""
    return _Timestamp(timestamp_ms)


def offsets(specific: Mapping[TP, int], reset_strategy: str = "earliest") -> OffsetsInitializer:
    """Start at the given offsets; other partitions use ``reset_strategy``."""
    return _Specific(dict(specific), reset_strategy)


class OffsetsSpecError(ChandyError):
    """A ``--starting-offsets`` / ``--ending-offsets`` value is not one of the accepted forms."""


#: Spark's markers in a JSON offsets map: -2 the earliest offset, -1 the latest
EARLIEST_MARKER, LATEST_MARKER = -2, -1


@dataclasses.dataclass(frozen=True)
class _SpecificWithMarkers:
    """Spark's JSON offsets: per partition an offset, or -2 (earliest) / -1 (latest); partitions
    the map does not name use ``reset_strategy`` (Flink's ``OffsetsInitializer.offsets``), unless
    ``every_partition`` (``what`` names the option): then the map must name exactly the job's
    partitions, as Spark requires of ``endingOffsets`` (``KafkaOffsetReader.fetchSpecificOffsets``:
    "you must specify all TopicPartitions"), else :class:`OffsetsSpecError`."""

    offsets: Mapping[TP, int]
    reset_strategy: str = "earliest"
    every_partition: bool = False
    what: str = "--ending-offsets"

    def get_partition_offsets(self, partitions, retriever):
        partitions = list(partitions)
        if self.every_partition:
            self._check_names_every_partition(partitions)
        given = {tp: self.offsets[tp] for tp in partitions if tp in self.offsets}
        earliest_of = [tp for tp, o in given.items() if o == EARLIEST_MARKER]
        latest_of = [tp for tp, o in given.items() if o == LATEST_MARKER]
        resolved = {**retriever.earliest(earliest_of), **retriever.latest(latest_of)} if earliest_of or latest_of else {}
        fallback = _fallback(self.reset_strategy, [tp for tp in partitions if tp not in given], retriever)
        return {tp: resolved.get(tp, given[tp]) if tp in given else fallback[tp] for tp in partitions}

    def _check_names_every_partition(self, partitions: list[TP]) -> None:
        missing = sorted(set(partitions) - set(self.offsets))
        extra = sorted(set(self.offsets) - set(partitions))
        if not missing and not extra:
            return
        problems = []
        if missing:
            shown = ", ".join(f"{t}-{p}" for t, p in missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
            problems.append(f"names no offset for {shown}")
        if extra:
            shown = ", ".join(f"{t}-{p}" for t, p in extra[:10]) + (f" and {len(extra) - 10} more" if len(extra) > 10 else "")
            problems.append(f"names {shown}, which the job does not read")
        raise OffsetsSpecError(
            f"{self.what} {' and '.join(problems)}: JSON offsets must name every partition of the topics the job reads "
            "(-1 for latest), as Spark's endingOffsets must; a partition left out would end at once and land nothing")


def parse_timestamp_ms(text: str, what: str) -> int:
    """ms since the Unix epoch, or an ISO-8601 date-time (``2026-11-27T10:00:00Z``; without a zone: UTC).

    Raises:
        OffsetsSpecError: neither.
    """
    import datetime

    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise OffsetsSpecError(f"{what}: {text!r} is neither ms since the epoch nor an ISO-8601 date-time "
                               "(e.g. 2026-11-27T10:00:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


def parse_offsets_json(text: str, what: str, *, ending: bool) -> dict[TP, int]:
    """Spark's JSON offsets, ``{"topic": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest; an ending
    offset cannot be -2), as {(topic, partition): offset}.

    Raises:
        OffsetsSpecError: not that shape, naming what is wrong.
    """
    import json

    try:
        value = json.loads(text)
    except ValueError as exc:
        raise OffsetsSpecError(f"{what}: not JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise OffsetsSpecError(f"{what}: JSON offsets are an object of topics, e.g. {{\"orders\": {{\"0\": 23}}}}")
    result: dict[TP, int] = {}
    lowest = LATEST_MARKER if ending else EARLIEST_MARKER
    for topic, partitions in value.items():
        if not isinstance(partitions, dict):
            raise OffsetsSpecError(f"{what}: topic {topic!r} must map partitions to offsets, got {partitions!r}")
        for partition, offset in partitions.items():
            if not str(partition).isdigit() or isinstance(offset, bool) or not isinstance(offset, int) \
                    or offset < lowest:
                raise OffsetsSpecError(f"{what}: {topic}-{partition}: {offset!r} is not an offset (>= 0, or "
                                       f"{'-1 for latest' if ending else '-2 for earliest, -1 for latest'})")
            result[(topic, int(partition))] = offset
    return result


def parse_offsets_spec(text: str, what: str | None = None, *, ending: bool = False) -> OffsetsInitializer:
    """The offsets initializer a ``--starting-offsets`` (or, with ``ending``, ``--ending-offsets``)
    value names, in Spark's and Flink's forms: ``earliest``, ``latest``, ``committed`` (starting only:
    the group's offsets, else earliest), ``timestamp:<ms or ISO-8601>`` (the first record whose
    timestamp is at or after it; as an end, exclusive: records before it are read) or Spark's JSON
    offsets (``{"topic": {"0": 23}}``).

    ``what`` names the option in messages (default: ``--ending-offsets`` with ``ending``, else
    ``--starting-offsets``).

    Raises:
        OffsetsSpecError: none of these, naming the value.
    """
    what = what or ("--ending-offsets" if ending else "--starting-offsets")
    text = text.strip()
    if text == "latest":
        return latest()
    if not ending and text == "earliest":
        return earliest()
    if not ending and text == "committed":
        return committed("earliest")
    if text.startswith("timestamp:"):
        return timestamp(parse_timestamp_ms(text[len("timestamp:"):], what))
    if text.startswith("{"):
        return _SpecificWithMarkers(parse_offsets_json(text, what, ending=ending), every_partition=ending, what=what)
    forms = "latest, timestamp:<ms or ISO-8601> or JSON offsets" if ending else \
        "earliest, latest, committed, timestamp:<ms or ISO-8601> or JSON offsets"
    raise OffsetsSpecError(f"{what}: {text!r} is not one of {forms} (e.g. {{\"orders\": {{\"0\": 23}}}})")

"""Kafka partition splits and the owner rule (Flink's KafkaPartitionSplit, KafkaSourceEnumerator.getSplitOwner)."""

from __future__ import annotations

import dataclasses

#: Starting-offset markers, as Flink's KafkaPartitionSplit: resolved by an offsets initializer.
EARLIEST_OFFSET = -2
LATEST_OFFSET = -1
COMMITTED_OFFSET = -3


@dataclasses.dataclass(frozen=True, order=True)
class KafkaPartitionSplit:
    """A topic partition to read from ``starting_offset`` (inclusive) to ``stopping_offset``
    (exclusive; None = unbounded). A bounded split is an offset range [start, stop)."""

    SCHEMA = "chandy.v1.KafkaPartitionSplit"

    topic: str
    partition: int
    starting_offset: int
    stopping_offset: int | None = None

    @property
    def split_id(self) -> str:
        """``<topic>-<partition>``, as Flink."""
        return f"{self.topic}-{self.partition}"

    @property
    def topic_partition(self) -> tuple[str, int]:
        return (self.topic, self.partition)

    @property
    def num_records(self) -> int:
        """Offsets in the range (an upper bound on records: markers and compaction leave gaps)."""
        if self.stopping_offset is None:
            raise ValueError(f"split {self.split_id} is unbounded")
        return max(0, self.stopping_offset - self.starting_offset)


def java_string_hash(value: str) -> int:
    """Java's ``String.hashCode`` (signed 32-bit, over UTF-16 code units): the stable hash
    Flink's owner rule uses, so Chandy assigns partitions exactly as Flink's KafkaSource does."""
    data = value.encode("utf-16-be")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i:i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def split_owner(topic: str, partition: int, num_readers: int) -> int:
    """Flink's ``KafkaSourceEnumerator.getSplitOwner``:
    ``((hash(topic) * 31 & 0x7FFFFFFF) % n + partition) % n``, with Java's String.hashCode.

    Raises:
        ValueError: ``num_readers`` < 1.
    """
    if num_readers < 1:
        raise ValueError(f"need at least one reader, got {num_readers}")
    start_index = ((java_string_hash(topic) * 31) & 0x7FFFFFFF) % num_readers
    return (start_index + partition) % num_readers

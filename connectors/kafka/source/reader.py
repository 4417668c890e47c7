"""The reader side: consume exactly an offset range [start, stop) of one partition.

Assign and seek, no consumer-group rebalancing; ``isolation.level=read_committed``. The range
ends at ``stop`` even when the last offsets before it hold no record a reader can see
(transaction markers, aborted records, compacted gaps): the reader stops at the first record at
or past ``stop``, or when the consumer reports the end of the partition at or past ``stop``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from connectors.kafka.source.split import KafkaPartitionSplit
from coordinator.errors import ChandyError
from coordinator.kafka import config as kafka_config


class RangeReadError(ChandyError):
    """A range could not be read to its end."""


class KafkaRangeReader:
    """Reads bounded splits with one consumer (reused across ranges; not thread-safe).

    Args:
        bootstrap_servers: ``bootstrap.servers``.
        consumer_overrides: librdkafka settings under their own names.
        timeout_s: how long a range may make no progress before :class:`RangeReadError`.
    """

    def __init__(self, bootstrap_servers: str, consumer_overrides: Mapping[str, Any] | None = None,
                 timeout_s: float = 60.0) -> None:
        self.consumer = kafka_config.consumer(
            bootstrap_servers, overrides={"enable.partition.eof": True, **(consumer_overrides or {})})
        self.timeout_s = timeout_s

    def read(self, split: KafkaPartitionSplit, batch_size: int = 10_000) -> Iterator[Any]:
        """Yield the ``confluent_kafka.Message``\\ s of ``split``'s range, in offset order.

        Raises:
            ValueError: the split is unbounded.
            RangeReadError: a consumer error, or no progress for ``timeout_s`` seconds.
        """
        if split.stopping_offset is None:
            raise ValueError(f"split {split.split_id} has no stopping offset")
        start, stop = split.starting_offset, split.stopping_offset
        if stop <= start:
            return
        self.consumer.assign([TopicPartition(split.topic, split.partition, start)])
        last_progress = time.monotonic()
        try:
            while True:
                messages = self.consumer.consume(num_messages=batch_size, timeout=0.1)
                if not messages and time.monotonic() - last_progress > self.timeout_s:
                    raise RangeReadError(f"no progress reading {split.split_id} [{start}, {stop}) for {self.timeout_s} s")
                for message in messages:
                    error, offset = message.error(), message.offset()
                    if error is not None:
                        if error.code() == KafkaError._PARTITION_EOF:
                            if offset is not None and offset >= stop:
                                return
                            continue
                        raise RangeReadError(f"reading {split.split_id}: {error}")
                    if offset is None:  # never for a fetched record
                        continue
                    last_progress = time.monotonic()
                    if offset >= stop:
                        return
                    yield message
                    if offset + 1 >= stop:
                        return
        finally:
            self.consumer.unassign()

    def close(self) -> None:
        self.consumer.close()

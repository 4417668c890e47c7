"""Spark's ``failOnDataLoss`` for the Kafka source: a partition whose log no longer holds the
offsets the job has yet to read.

The job's *position* in a partition is the next offset it reads (the end of its last completed
checkpoint's range, or where a new split starts). Three ways the log can move below it, as
Spark's Kafka source tells them apart (``KafkaOffsetReaderAdmin.getOffsetRangesFromResolvedOffsets``
on the driver, ``KafkaDataConsumer`` in the tasks):

- :data:`END_BELOW`: the log ends (last stable offset) below the position: the topic was deleted
  and created again, or an unclean leader election truncated the log (or a starting offset was set
  past the log's end). Spark: "Partition ...'s offset was changed from X to Y, some data may have
  been missed". The job sees no lag and reads nothing, and once the new log grows past the
  position a range can no longer tell: every record below it would be skipped for good.
- :data:`START_ABOVE`: the log starts (log start offset) above the position: retention or
  ``DeleteRecords`` removed offsets [position, log start) before the job read them. Spark: "Some
  data may have been lost because they are not available in Kafka any more".
- :data:`GONE`: the partition is not in its topic's metadata: the topic was deleted (and not yet
  created again), or holds fewer partitions. Spark: "... are gone. Some data may have been missed."

With ``failOnDataLoss`` (the default) each ends the job with :class:`KafkaDataLossError`, one line
naming the partition, the offsets before and after, and the likely causes; without it the job goes
on from the new log with a warning naming the same facts
(:class:`~chandy.connectors.kafka.source.enumerator.KafkaSourceEnumerator` decides where).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from chandy.connectors.kafka.source.reader import KafkaDataLossError

TP = tuple[str, int]

#: the kinds of :class:`LogChange` (see the module docstring)
END_BELOW, START_ABOVE, GONE = "end-below", "start-above", "gone"

#: what a job that fails on data loss can do instead (the pipeline's switch and Spark's option)
REMEDY = ("to go on from the new log, skipping them, run the job with --no-fail-on-data-loss (Spark's "
          "failOnDataLoss=false)")

#: ``KafkaError`` codes that say a topic or partition does not exist (as opposed to a leader moving)
UNKNOWN_PARTITION_ERRORS = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC,
                                      KafkaError._UNKNOWN_PARTITION})


@dataclasses.dataclass(frozen=True)
class LogChange:
    """A partition whose log moved below the job's position.

    Attributes:
        topic, partition: the partition.
        position: the job's next offset in it.
        log: (log start offset, last stable offset) now; None when the partition is gone.
    """

    topic: str
    partition: int
    position: int
    log: tuple[int, int] | None

    @property
    def kind(self) -> str:
        """:data:`GONE`, :data:`END_BELOW` or :data:`START_ABOVE`."""
        if self.log is None:
            return GONE
        return END_BELOW if self.log[1] < self.position else START_ABOVE

    @property
    def offsets_lost(self) -> int:
        """Offsets the job will never read, as far as they are knowable: for :data:`START_ABOVE`
        exactly the offsets deleted before they were read (log start - position); for
        :data:`END_BELOW` the offsets the log moved back by (position - new end), since what is
        really lost (records of an old log past the job's last look at it, or of the new log below
        the position) cannot be known; 0 for :data:`GONE`. Offsets, not records: a compacted or
        transactional log holds fewer records than offsets."""
        if self.log is None:
            return 0
        low, high = self.log
        return self.position - high if high < self.position else max(0, low - self.position)

    def describe(self) -> str:
        """One line: the partition, the offsets before and after, the likely causes."""
        where = f"{self.topic}-{self.partition}"
        if self.log is None:
            return (f"{where} is gone (it is no longer in topic {self.topic}'s metadata), so records from the job's "
                    f"position {self.position} on may have been missed: the topic was deleted, or created again with "
                    "fewer partitions")
        low, high = self.log
        if high < self.position:
            return (f"{where}: the log ends at offset {high}, below the job's position {self.position} (offset was "
                    f"changed from {self.position} to {high}): the topic was deleted and created again, or an unclean "
                    "leader election truncated the log (or the job started past the log's end)")
        return (f"{where}: offsets [{self.position}, {low}) are no longer in Kafka (the log start offset moved above the "
                f"job's position {self.position} to {low}; the log holds [{low}, {high})): retention or DeleteRecords "
                "removed them before they were read, or the topic was deleted and created again")

    def error(self) -> KafkaDataLossError:
        """The error that ends a job failing on data loss (Spark's ``failOnDataLoss=true``)."""
        return KafkaDataLossError(f"{self.describe()}; some data may have been missed: {REMEDY}")


def log_change(tp: TP, position: int, log: tuple[int, int] | None) -> LogChange | None:
    """The change of ``tp``'s log below ``position`` (the job's next offset), or None when the log
    [log start, last stable offset) = ``log`` still holds every offset from ``position`` on.
    ``log`` None: the partition is gone."""
    if log is not None and log[0] <= position <= log[1]:
        return None
    return LogChange(tp[0], tp[1], position, log)


def partition_gone(consumer: Any, tp: TP, timeout_s: float = 10.0) -> bool:
    """Whether ``tp`` is not in the cluster's metadata (asked of a broker now): its topic is
    unknown, or has no such partition. A metadata request that fails, or a topic whose metadata
    holds another error (no leader, not authorized), is not "gone": nothing is concluded from a
    broker that does not answer or a principal that may not look.

    ``consumer``: a confluent-kafka ``Consumer`` (or anything with its ``list_topics``)."""
    topic, partition = tp
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s).topics.get(topic)
    except KafkaException:
        return False
    if metadata is None:
        return True
    if metadata.error is not None:
        return metadata.error.code() in UNKNOWN_PARTITION_ERRORS
    return partition not in metadata.partitions

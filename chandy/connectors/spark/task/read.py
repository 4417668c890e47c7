"""The task's first stage: read a subtask's offset ranges from Kafka as Arrow batches
(:func:`read_ranges`), watched by a :class:`FetchClock` for the fetch lag and the watermark."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from chandy.connectors.lake.sink import SOURCE_METRICS_KIND, offsets_to_json
from chandy.connectors.spark.task.options import TaskOptions
from chandy.coordinator.messages import StateHandle
from chandy.formats.records import to_record_batch


@dataclasses.dataclass
class RangesPartition(InputPartition):
    """One subtask's ranges: [(topic, partition, start, stop), ...]."""

    subtask: int
    ranges: list


def read_ranges(options: TaskOptions, ranges: list, clock: FetchClock | None = None) -> Iterator[pa.RecordBatch]:
    """A subtask's ranges ([topic, partition, start, stop], ...) as Arrow batches of at most
    ``options.batch_size`` records, in order, read with a reader pooled in this process
    (:mod:`chandy.connectors.spark.task.clients`); ``clock`` gets the Fetch requests and records the
    reader's librdkafka statistics counted meanwhile."""
    from chandy.connectors.kafka.source.split import KafkaPartitionSplit
    from chandy.connectors.spark.task.clients import range_reader
    from chandy.coordinator.faults import crash_point

    checkpoint_id = options.checkpoint_id
    with range_reader(options.bootstrap_servers, options.consumer_overrides) as reader:
        requests, records = reader.fetch_requests, reader.records_fetched
        for topic, p, start, stop in ranges:
            split = KafkaPartitionSplit(topic, p, start, stop)
            for messages in reader.read_batches(split, options.batch_size, fail_on_data_loss=options.fail_on_data_loss):
                yield to_record_batch(messages)
                crash_point("task-read", checkpoint_id)
        if clock is not None:  # the statistics lag up to their interval: over a run, task after task, they add up
            clock.fetch_requests += max(0, reader.fetch_requests - requests)
            clock.records_fetched += max(0, reader.records_fetched - records)


class FetchClock:
    """Watches a subtask's raw batches go by (:meth:`watch`): the newest Kafka record timestamp
    fetched (ms since the epoch) and the wall-clock time it was fetched (ms), for Flink's
    ``currentFetchEventTimeLag`` (FetchTime - EventTime of the last fetched record), and per
    (topic, partition) the newest timestamp read, for the completeness watermark the lake commit
    records (:func:`chandy.connectors.lake.sink.watermark_metadata`)."""

    def __init__(self) -> None:
        self.event_time_ms: int | None = None
        self.fetch_time_ms: int | None = None
        self.partition_event_time_ms: dict[tuple[str, int], int] = {}
        self.bytes_read = 0  # the records' keys and values, as consumed (Kafka's bytes-consumed)
        self.fetch_requests = self.records_fetched = 0  # librdkafka's counts (read_ranges), records-per-request

    def watch(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """``batches``, unchanged, noting each one's newest timestamp and fetch time."""
        import time

        import pyarrow.compute as pc

        for batch in batches:
            for column in ("key", "value"):
                self.bytes_read += pc.sum(pc.binary_length(batch.column(column))).as_py() or 0
            newest = pc.max(batch.column("timestamp")).as_py() if batch.num_rows else None
            if newest is not None:
                self.event_time_ms = int(newest.timestamp() * 1000)
                self.fetch_time_ms = int(time.time() * 1000)
                per_partition = (pa.Table.from_batches([batch]).group_by(["topic", "partition"])
                                 .aggregate([("timestamp", "max")]).to_pylist())
                for row in per_partition:
                    if row["timestamp_max"] is not None:
                        key, millis = (row["topic"], row["partition"]), int(row["timestamp_max"].timestamp() * 1000)
                        self.partition_event_time_ms[key] = max(millis, self.partition_event_time_ms.get(key, millis))
            yield batch

    def state_handle(self) -> StateHandle | None:
        """The :data:`SOURCE_METRICS_KIND` handle to acknowledge with (None: no timestamp seen)."""
        if self.event_time_ms is None or self.fetch_time_ms is None:
            return None
        return StateHandle(SOURCE_METRICS_KIND, None, None, 0, {
            "event_time_ms": str(self.event_time_ms), "fetch_time_ms": str(self.fetch_time_ms),
            "bytes_read": str(self.bytes_read), "fetch_requests": str(self.fetch_requests),
            "records_fetched": str(self.records_fetched),
            "partition_event_time_ms": offsets_to_json(self.partition_event_time_ms)})

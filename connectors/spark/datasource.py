"""PySpark Python data sources (Spark 4's ``pyspark.sql.datasource``) for one micro-batch.

- ``chandy_kafka_ranges`` reads the offset ranges the Kafka source enumerator fixed for a
  checkpoint: Spark partition *i* is reader subtask *i* and reads exactly its ranges with
  :class:`~connectors.kafka.source.reader.KafkaRangeReader`, yielding Arrow batches.
- ``chandy_lake_files`` writes each Spark partition (= subtask) as Parquet files into the lake
  table location (invisible until committed) and acknowledges the checkpoint with them as state
  handles; an attempt that fails on its last allowed try declines the checkpoint instead.

Both run inside Spark tasks; their options are strings (JSON for structured values), set by
:mod:`connectors.spark.pipeline`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, DataSourceReader, InputPartition, WriterCommitMessage

from connectors.spark.records import SPARK_DDL, to_record_batch

RANGES_FORMAT = "chandy_kafka_ranges"
LAKE_FILES_FORMAT = "chandy_lake_files"


@dataclasses.dataclass
class RangesPartition(InputPartition):
    """One subtask's ranges: [(topic, partition, start, stop), ...]."""

    subtask: int
    ranges: list


def read_ranges(options: dict, ranges: list) -> Iterator[pa.RecordBatch]:
    """A subtask's ranges ([topic, partition, start, stop], ...) as Arrow batches, in order."""
    from connectors.kafka.source.reader import KafkaRangeReader
    from connectors.kafka.source.split import KafkaPartitionSplit
    from coordinator.faults import crash_point

    checkpoint_id = int(options["checkpoint_id"])
    batch_size = int(options.get("batch_size", "20000"))
    reader = KafkaRangeReader(options["bootstrap_servers"], json.loads(options.get("consumer_overrides", "{}")))
    try:
        for topic, p, start, stop in ranges:
            buffer = []
            for message in reader.read(KafkaPartitionSplit(topic, p, start, stop)):
                buffer.append(message)
                if len(buffer) >= batch_size:
                    yield to_record_batch(buffer)
                    buffer = []
                    crash_point("task-read", checkpoint_id)
            if buffer:
                yield to_record_batch(buffer)
                crash_point("task-read", checkpoint_id)
    finally:
        reader.close()


def write_and_acknowledge(options: dict, batches: Iterator[pa.RecordBatch], subtask: int, attempt: int) -> tuple[int, int]:
    """Write one subtask's batches as lake files and acknowledge the checkpoint with them; on
    failure decline it when this is the last allowed attempt, and re-raise. Returns (files, rows)."""
    from connectors.lake.delta import DeltaLakeSink
    from coordinator.failure import CheckpointFailureReason
    from coordinator.faults import crash_point
    from coordinator.participant import AckSender

    o = options
    checkpoint_id, epoch = int(o["checkpoint_id"]), int(o["epoch"])
    sender = AckSender(o["bootstrap_servers"], o["job_id"], prefix=o["prefix"],
                       producer_overrides=json.loads(o.get("producer_overrides", "{}")))
    try:
        batches = list(batches)
        table = pa.Table.from_batches(batches) if batches else None
        sink = DeltaLakeSink(o["table_uri"], partition_by=json.loads(o.get("partition_by", "[]")),
                             storage_options=json.loads(o.get("storage_options", "{}")))
        files = [] if table is None else sink.write_files(
            table, job_id=o["job_id"], checkpoint_id=checkpoint_id, subtask=subtask, attempt=attempt)
        crash_point("task-written", checkpoint_id)
        sender.acknowledge(epoch, checkpoint_id, o["operator_id"], subtask, attempt, [f.to_state_handle() for f in files])
        return len(files), 0 if table is None else table.num_rows
    except Exception as exc:
        # Spark retries a failed task; only its last allowed attempt declines the checkpoint
        if attempt + 1 >= int(o.get("max_task_failures", "1")):
            try:
                sender.decline(epoch, checkpoint_id, o["operator_id"], subtask, attempt,
                               CheckpointFailureReason.CHECKPOINT_DECLINED, f"{type(exc).__name__}: {exc}")
            except Exception:  # noqa: BLE001, S110 - the checkpoint then expires instead
                pass
        raise
    finally:
        sender.close()


def read_write_and_acknowledge(options: dict) -> Callable[[int, Iterator[list]], Iterator[tuple[int, int]]]:
    """For ``rdd.mapPartitionsWithIndex``: a task that reads its ranges, writes them and acknowledges,
    all in one Python worker (no round trip through the JVM): the path without decoding or transform."""

    def task(index: int, ranges: Iterator[list]) -> Iterator[tuple[int, int]]:
        from pyspark import TaskContext

        context = TaskContext.get()
        mine = [r for subtask_ranges in ranges for r in subtask_ranges]
        yield write_and_acknowledge(options, read_ranges(options, mine), context.partitionId(), context.attemptNumber())

    return task


class _RangesReader(DataSourceReader):
    def __init__(self, options: dict) -> None:
        self.options = options

    def partitions(self) -> list[RangesPartition]:
        per_subtask = json.loads(self.options["ranges"])
        return [RangesPartition(i, ranges) for i, ranges in enumerate(per_subtask)]

    def read(self, partition: RangesPartition) -> Iterator[pa.RecordBatch]:
        return read_ranges(self.options, partition.ranges)


class KafkaRangesDataSource(DataSource):
    """``spark.read.format("chandy_kafka_ranges")``: a checkpoint's offset ranges as rows."""

    @classmethod
    def name(cls) -> str:
        return RANGES_FORMAT

    def schema(self) -> str:
        return SPARK_DDL

    def reader(self, schema) -> DataSourceReader:
        return _RangesReader(self.options)


@dataclasses.dataclass
class FilesWritten(WriterCommitMessage):
    subtask: int
    attempt: int
    files: int
    records: int


class _LakeFilesWriter(DataSourceArrowWriter):
    def __init__(self, options: dict) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FilesWritten:
        from pyspark import TaskContext

        context = TaskContext.get()
        subtask, attempt = context.partitionId(), context.attemptNumber()
        files, rows = write_and_acknowledge(self.options, iterator, subtask, attempt)
        return FilesWritten(subtask, attempt, files, rows)

    def commit(self, messages: list[FilesWritten]) -> None:
        pass  # the lake committer commits, on checkpoint completion

    def abort(self, messages: list[FilesWritten]) -> None:
        pass  # unreferenced files are deleted when the checkpoint aborts


class LakeFilesDataSource(DataSource):
    """``df.write.format("chandy_lake_files")``: lake files plus checkpoint acknowledgements."""

    @classmethod
    def name(cls) -> str:
        return LAKE_FILES_FORMAT

    def writer(self, schema, overwrite: bool) -> DataSourceArrowWriter:
        return _LakeFilesWriter(self.options)

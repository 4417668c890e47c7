"""PySpark Python data sources (Spark 4's ``pyspark.sql.datasource``) for the path with a
``--transform``, where Spark runs the user's SQL between reading and writing:

- ``chandy_kafka_ranges`` reads the offset ranges the Kafka source enumerator fixed for a
  checkpoint: Spark partition *i* is reader subtask *i* and reads exactly its ranges
  (:func:`~chandy.connectors.spark.task.read.read_ranges`), yielding Arrow batches.
- ``chandy_lake_files`` writes each Spark partition (= subtask) as Parquet files into the lake
  table location (invisible until committed) and acknowledges the checkpoint with them as state
  handles; an attempt that fails on its last allowed try declines the checkpoint instead.

What they need travels as the single option :data:`~chandy.connectors.spark.task.options.TASK_OPTION`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceArrowWriter, DataSourceReader, InputPartition, WriterCommitMessage

from chandy.connectors.spark.task.acknowledge import write_and_acknowledge
from chandy.connectors.spark.task.options import TASK_OPTION, TaskOptions
from chandy.connectors.spark.task.read import RangesPartition, read_ranges
from chandy.connectors.spark.task.run import task_context
from chandy.formats.records import SPARK_DDL

RANGES_FORMAT = "chandy_kafka_ranges"
LAKE_FILES_FORMAT = "chandy_lake_files"


class _RangesReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = options

    def partitions(self) -> list[RangesPartition]:
        per_subtask = json.loads(self.options["ranges"])
        return [RangesPartition(i, ranges) for i, ranges in enumerate(per_subtask)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, RangesPartition)
        return read_ranges(TaskOptions.decode(self.options[TASK_OPTION]), partition.ranges)


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
    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FilesWritten:
        context = task_context()
        subtask, attempt = context.partitionId(), context.attemptNumber()
        files, rows = write_and_acknowledge(TaskOptions.decode(self.options[TASK_OPTION]), iterator, subtask, attempt)
        return FilesWritten(subtask, attempt, files, rows)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # the lake committer commits, on checkpoint completion

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # unreferenced files are deleted when the checkpoint aborts


class LakeFilesDataSource(DataSource):
    """``df.write.format("chandy_lake_files")``: lake files plus checkpoint acknowledgements."""

    @classmethod
    def name(cls) -> str:
        return LAKE_FILES_FORMAT

    def writer(self, schema, overwrite: bool) -> DataSourceArrowWriter:
        return _LakeFilesWriter(self.options)

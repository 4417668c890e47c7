"""One subtask's whole task, its stages in the order the data flows: read
(:mod:`~chandy.connectors.spark.task.read`), decode (:mod:`~chandy.connectors.spark.task.decode`),
write (:mod:`~chandy.connectors.spark.task.write`), acknowledge
(:mod:`~chandy.connectors.spark.task.acknowledge`), in one Python worker, with one
:class:`~chandy.connectors.spark.task.tables.RoutedTables` per subtask."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from chandy.connectors.spark.task.acknowledge import write_and_acknowledge
from chandy.connectors.spark.task.decode import decode_with_dead_letters
from chandy.connectors.spark.task.options import TaskOptions
from chandy.connectors.spark.task.read import FetchClock, read_ranges
from chandy.connectors.spark.task.tables import RoutedTables

#: the row each task of :func:`read_write_and_acknowledge` returns (Spark DDL)
TASK_RESULT_DDL = "subtask long, attempt long, files long, records long"


def read_write_and_acknowledge(options: TaskOptions, per_subtask: list[list[list]]
                               ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """For ``spark.range(n, numPartitions=n).mapInArrow(...)`` (a DataFrame operation, so classic
    Spark and Spark Connect run it alike): partition *i* is subtask *i*, whose task reads its
    ranges ``per_subtask[i]`` (``[topic, partition, start, stop]`` lists), decodes them (with a
    decoder), writes them and acknowledges, all in one Python worker (no round trip through the
    JVM): the path without a transform. Each task returns one :data:`TASK_RESULT_DDL` row."""

    def task(rows: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for _ in rows:  # partition i holds the one row i
            pass
        context = task_context()
        subtask, attempt = context.partitionId(), context.attemptNumber()
        clock, tables = FetchClock(), RoutedTables(options)  # one of each per subtask, for every stage
        batches = clock.watch(read_ranges(options, per_subtask[subtask], clock))
        if options.decoder is not None:
            batches = decode_with_dead_letters(options, batches, subtask, tables)
        files, records = write_and_acknowledge(options, batches, subtask, attempt, clock, tables)
        yield pa.RecordBatch.from_pydict({"subtask": [subtask], "attempt": [attempt], "files": [files],
                                          "records": [records]},
                                         pa.schema([(name, pa.int64()) for name in ("subtask", "attempt", "files", "records")]))

    return task


def task_context() -> Any:
    """The running Spark task's ``TaskContext`` (partition = subtask, attempt number).

    Raises:
        RuntimeError: not inside a Spark task.
    """
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("not inside a Spark task: no TaskContext")
    return context

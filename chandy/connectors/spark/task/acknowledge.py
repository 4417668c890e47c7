"""The task's last stage: acknowledge the checkpoint with the files written (and the fetch
clock's source metrics), or decline it when the last allowed attempt fails."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa

from chandy.connectors.lake.sink import data_files_to_handles
from chandy.connectors.spark.task.clients import ack_sender, discard_sender
from chandy.connectors.spark.task.options import TaskOptions
from chandy.connectors.spark.task.read import FetchClock
from chandy.connectors.spark.task.tables import RoutedTables
from chandy.connectors.spark.task.write import write_parts
from chandy.coordinator.failure import CheckpointFailureReason
from chandy.coordinator.faults import crash_point


def write_and_acknowledge(options: TaskOptions, batches: Iterator[pa.RecordBatch], subtask: int,
                          attempt: int, fetch_clock: FetchClock | None = None,
                          tables: RoutedTables | None = None) -> tuple[int, int]:
    """Write one subtask's batches as lake files (:func:`~chandy.connectors.spark.task.write.write_parts`)
    and acknowledge the checkpoint with them; on failure (of this stage or of an earlier one, as
    ``batches`` is consumed here) decline it when this is the last allowed attempt, and re-raise.
    Returns (files, rows). ``fetch_clock``: the subtask's fetch times, acknowledged with the
    files as a :data:`~chandy.connectors.lake.sink.SOURCE_METRICS_KIND` handle; ``tables``: the
    subtask's tables (one made here when None).

    Raises:
        LakeSchemaError: the data does not fit the table (checked before its part is written).
    """
    o = options
    sender = ack_sender(o.bootstrap_servers, o.job_id, prefix=o.prefix, producer_overrides=o.producer_overrides)
    try:
        files, rows = write_parts(o, batches, subtask, attempt, tables or RoutedTables(o))
        crash_point("task-written", o.checkpoint_id)
        handles = data_files_to_handles(files)  # each distinct schema once, not once a file
        metrics = fetch_clock.state_handle() if fetch_clock is not None else None
        sender.acknowledge(o.epoch, o.checkpoint_id, o.operator_id, subtask, attempt,
                           handles + ([metrics] if metrics is not None else []))
        return len(files), rows
    except Exception as exc:
        # Spark retries a failed task; only its last allowed attempt declines the checkpoint
        if attempt + 1 >= o.max_task_failures:
            try:
                sender.decline(o.epoch, o.checkpoint_id, o.operator_id, subtask, attempt,
                               CheckpointFailureReason.CHECKPOINT_DECLINED, f"{type(exc).__name__}: {exc}")
            except Exception:  # noqa: BLE001 - the checkpoint then expires instead
                pass
        discard_sender(sender)
        raise

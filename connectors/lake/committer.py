"""The lake committer: an operator coordinator that makes a completed checkpoint's files visible.

Protocol, in order (DESIGN.md, "The Spark pipeline"):

1. the write tasks (subtasks of this operator) write Parquet files into the table location and
   acknowledge checkpoint N with them as state handles; the files are in N's ``_metadata``;
2. ``notify_checkpoint_complete(N)``: read N's ``_metadata``, and commit its files in one
   Delta commit with app transaction (job id, N), unless the table already holds N (a repeated
   commit after a restart is skipped);
3. only then does the Kafka source, notified next, commit the consumer-group offsets.

The commit runs on the mailbox thread, on purpose: it must finish before the source commits its
offsets, and that order is the order of notifications. ``reset_to_checkpoint(N)`` (a restart)
commits N as well, since restoring implies completion, and then deletes the job's data files
that no commit references (written by aborted or crashed checkpoints).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
from typing import Any

from connectors.lake.delta import FILE_KIND, DataFile, DeltaLakeSink
from coordinator.faults import crash_point
from coordinator.operator_coordinator import NO_CHECKPOINT, OperatorEvent
from coordinator.storage import CheckpointStorage, CheckpointStorageError, resolve_checkpoint_pointer

log = logging.getLogger(__name__)


class LakeCommitter:
    """The lake sink's operator coordinator (see the module docstring)."""

    def __init__(self, context: Any, sink: DeltaLakeSink, storage: CheckpointStorage) -> None:
        self.context = context
        self.sink = sink
        self.storage = storage
        self.committed_checkpoints: list[int] = []
        self.records_committed = 0

    def start(self) -> None:
        pass

    def close(self) -> None:
        pass

    def checkpoint_coordinator(self, checkpoint_id: int, result_future: concurrent.futures.Future) -> None:
        result_future.set_result(b"")  # no state of its own: the files are the subtasks' state

    def files_of(self, checkpoint_id: int) -> list[DataFile]:
        """The data files checkpoint ``checkpoint_id`` references, from its ``_metadata``."""
        _, metadata = resolve_checkpoint_pointer(self.storage.checkpoint_directory(checkpoint_id),
                                                 self.storage.storage_options)
        operator = metadata.operator(self.context.operator_id)
        if operator is None:
            return []
        return [DataFile.from_state_handle(h) for s in operator.subtask_states for h in s.state_handles
                if h.kind == FILE_KIND]

    def _commit(self, checkpoint_id: int) -> None:
        crash_point("before-lake-commit", checkpoint_id)
        files = self.files_of(checkpoint_id)
        if self.sink.commit(self.context.job_id, checkpoint_id, files):
            self.committed_checkpoints.append(checkpoint_id)
            self.records_committed += sum(f.records for f in files)
            log.info("checkpoint %d: %d file(s), %d record(s) committed to %s", checkpoint_id, len(files),
                     sum(f.records for f in files), self.sink.table_uri)
        crash_point("before-offset-commit", checkpoint_id)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        try:
            self._commit(checkpoint_id)
        except Exception as exc:  # noqa: BLE001 - the checkpoint stays complete; a restart commits it
            log.exception("lake commit of checkpoint %d failed", checkpoint_id)
            self.context.fail_job(exc)

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        job_id = self.context.job_id
        self.context.call_async(lambda: self.sink.delete_unreferenced(job_id, keep_checkpoints_after=checkpoint_id),
                                lambda deleted, error: error and log.warning("cleanup failed: %s", error))

    def reset_to_checkpoint(self, checkpoint_id: int, checkpoint_data: bytes | None) -> None:
        if checkpoint_id != NO_CHECKPOINT:
            try:
                self._commit(checkpoint_id)
            except CheckpointStorageError as exc:
                log.warning("restored checkpoint %d has no readable _metadata in this job's storage (%s); "
                            "nothing to commit", checkpoint_id, exc)
        self.sink.delete_unreferenced(self.context.job_id)

    def subtask_reset(self, subtask: int, checkpoint_id: int) -> None:
        pass

    def execution_attempt_failed(self, subtask: int, attempt_number: int, reason: BaseException | None) -> None:
        pass

    def execution_attempt_ready(self, subtask: int, attempt_number: int, gateway: Any) -> None:
        pass

    def handle_event_from_operator(self, subtask: int, attempt_number: int, event: OperatorEvent) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class LakeCommitterProvider:
    """Creates the :class:`LakeCommitter` of operator ``operator_id``."""

    operator_id: str
    sink: DeltaLakeSink
    storage: CheckpointStorage

    def create(self, context: Any) -> LakeCommitter:
        return LakeCommitter(context, self.sink, self.storage)

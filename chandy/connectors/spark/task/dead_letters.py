"""Dead letters: bad records kept raw, and published exactly once with the checkpoint that read them.

1. A Spark task that decodes subtask *i*'s ranges of checkpoint N keeps its bad records and, at
   the end of its input, writes them as one Parquet file (:data:`~chandy.formats.decoder.BAD_RECORDS_SCHEMA`),
   ``<checkpoint dir>/<job id>/taskowned/dead-letters/chk-N/part-<i>.parquet``, through a
   temporary name, so the file is whole or absent; a retried attempt rewrites the same file with
   the same records (its ranges are fixed). The file's schema metadata also holds how many
   tombstones the subtask skipped (``--tombstones skip``), so the driver counts them once per
   completed checkpoint, with no accumulator (which Spark Connect lacks, and which counts a
   retried task twice); a subtask that only skipped tombstones writes an empty file for the count.
2. When N is fully acknowledged, :func:`completion_outputs` reads N's files and returns one
   Kafka message per bad record for the dead-letter topic; the coordinator publishes them in the
   same Kafka transaction as N's COMPLETED record. So they appear exactly when N completes, never
   for an aborted N (whose records are read again by a later checkpoint), and never twice.
3. Each message is the raw record (key, value, headers) with Kafka Connect's error headers
   (``__connect.errors.topic``, ``.partition``, ``.offset``, ``.exception.class.name``,
   ``.exception.message``, ``.connector.name``), so tools made for Connect's dead-letter queues read it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from chandy.coordinator.environment import OutboundMessage
from chandy.coordinator.filesystems import open_filesystem
from chandy.formats.decoder import BAD_RECORDS_SCHEMA

log = logging.getLogger(__name__)

#: the key of a dead-letter file's schema metadata that holds the tombstones its subtask skipped
SKIPPED_KEY = "chandy.tombstones_skipped"


def dead_letter_directory(checkpoint_dir: str, job_id: str, checkpoint_id: int | None = None) -> str:
    """Where the dead letters of ``checkpoint_id`` (or of every checkpoint) are kept."""
    root = f"{checkpoint_dir.rstrip('/')}/{job_id}/taskowned/dead-letters"
    return root if checkpoint_id is None else f"{root}/chk-{checkpoint_id}"


class DeadLetterFile:
    """Collects a subtask's bad records for one checkpoint; :meth:`close` writes them (step 1)."""

    def __init__(self, checkpoint_dir: str, job_id: str, checkpoint_id: int, subtask: int,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        self.directory = dead_letter_directory(checkpoint_dir, job_id, checkpoint_id)
        self.subtask = subtask
        self.storage_options = dict(storage_options or {})
        self.batches: list[pa.RecordBatch] = []
        self.skipped = 0

    @property
    def count(self) -> int:
        """Bad records collected so far."""
        return sum(b.num_rows for b in self.batches)

    def add(self, batch: pa.RecordBatch) -> None:
        self.batches.append(batch)

    def add_skipped(self, records: int) -> None:
        self.skipped += records

    def close(self) -> None:
        """Write the file (nothing when there are no bad records and no skipped tombstones)."""
        if not self.batches and not self.skipped:
            return
        fs, directory = open_filesystem(self.directory, self.storage_options)
        fs.makedirs(directory, exist_ok=True)
        final = f"{directory}/part-{self.subtask:05d}.parquet"
        temporary = f"{directory}/.part-{self.subtask:05d}-{uuid.uuid4().hex[:8]}.tmp"
        with fs.open(temporary, "wb") as handle:
            schema = BAD_RECORDS_SCHEMA.with_metadata({SKIPPED_KEY: str(self.skipped)})
            pq.write_table(pa.Table.from_batches(self.batches, schema), handle)
        fs.mv(temporary, final)


def read_dead_letters(checkpoint_dir: str, job_id: str, checkpoint_id: int,
                      storage_options: Mapping[str, Any] | None = None) -> tuple[pa.Table, int]:
    """Checkpoint ``checkpoint_id``'s bad records (empty when there are none) and the tombstones
    its subtasks skipped (records)."""
    fs, directory = open_filesystem(dead_letter_directory(checkpoint_dir, job_id, checkpoint_id), storage_options)
    if not fs.exists(directory):
        return BAD_RECORDS_SCHEMA.empty_table(), 0
    files = sorted(p for p in fs.ls(directory, detail=False) if p.rsplit("/", 1)[-1].startswith("part-"))
    tables = []
    skipped = 0
    for path in files:
        with fs.open(path, "rb") as handle:
            table = pq.read_table(handle)
        skipped += int((table.schema.metadata or {}).get(SKIPPED_KEY.encode(), b"0"))
        tables.append(table.replace_schema_metadata(None))
    return (pa.concat_tables(tables) if tables else BAD_RECORDS_SCHEMA.empty_table()), skipped


def delete_dead_letters_before(checkpoint_dir: str, job_id: str, checkpoint_id: int,
                               storage_options: Mapping[str, Any] | None = None) -> None:
    """Delete the dead-letter files of checkpoints below ``checkpoint_id`` (published or aborted)."""
    fs, root = open_filesystem(dead_letter_directory(checkpoint_dir, job_id), storage_options)
    if not fs.exists(root):
        return
    for path in fs.ls(root, detail=False):
        name = path.rstrip("/").rsplit("/", 1)[-1]
        if name.startswith("chk-") and name[4:].isdigit() and int(name[4:]) < checkpoint_id:
            fs.rm(path, recursive=True)


def to_messages(bad: pa.Table, topic: str, connector_name: str) -> list[OutboundMessage]:
    """One dead-letter message per bad record (step 3)."""
    messages = []
    for row in bad.to_pylist():
        headers = [(h["key"], h["value"]) for h in row["headers"] or []]
        headers += [
            ("__connect.errors.topic", row["topic"].encode()),
            ("__connect.errors.partition", str(row["partition"]).encode()),
            ("__connect.errors.offset", str(row["offset"]).encode()),
            ("__connect.errors.connector.name", connector_name.encode()),
            ("__connect.errors.exception.class.name", (row["error_class"] or "").encode()),
            ("__connect.errors.exception.message", (row["error_message"] or "").encode()),
        ]
        messages.append(OutboundMessage(topic, row["key"], row["value"], tuple(headers)))
    return messages

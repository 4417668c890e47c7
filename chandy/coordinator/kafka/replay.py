"""Replaying a coordinator log: what the coordinator knew, step by step, read-only.

:func:`replay` folds log records with the coordinator's own :func:`chandy.coordinator.state.apply` and
turns each record into a timeline entry (checkpoints triggered, completed with k of n acks,
aborted and why, subsumed, discarded; savepoints; epochs and fencings; job status; split
assignments; committed offsets). It can stop at a checkpoint (``until_checkpoint``: the state just
before the next checkpoint was triggered) or at a time (``until_ms``: records written at or
before it).

The log comes from Kafka (:func:`chandy.coordinator.kafka.log.read_log`, a consumer with no group that never
commits and never writes, so replaying never fences a running coordinator) or from a file made
by :func:`export_log`: one JSON object per record with its key and value bytes in base64, so an
incident can be examined away from the cluster.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from chandy.coordinator.errors import ChandyError
from chandy.coordinator.kafka.log import LoadStats, LoggedRecord, decode_message, raw_messages, read_log
from chandy.coordinator.records import (
    CheckpointIdCounterRecord,
    CheckpointRecord,
    CoordinatorEpochRecord,
    JobStatusRecord,
    LogKey,
    Tombstone,
    record_kind,
)
from chandy.coordinator.state import CoordinatorState, apply
from chandy.schemas.codec import Codec, SingleObjectCodec

EXPORT_FORMAT = "chandy-coordinator-log/1"


class ExportFileError(ChandyError):
    """A log export file is not readable (wrong format, truncated line)."""


def timeline_entry(logged: LoggedRecord, previous: CoordinatorState) -> dict[str, Any] | None:
    """One timeline entry (JSON-ready) for a logged record, or None for bookkeeping records.
    ``previous`` is the state before the record (a new epoch over a RUNNING one is a fencing)."""
    r = logged.record
    base = {"offset": logged.offset, "timestamp": logged.timestamp_ms, "job_id": r.key().job_id}
    if isinstance(r, CoordinatorEpochRecord):
        entry = {"event": "epoch", "epoch": r.epoch, "host": r.host}
        if previous.epoch > 0:
            # the previous coordinator had not stopped cleanly: this one fenced it (or it had died)
            entry.update(previous_epoch=previous.epoch, fenced=previous.job_status == "RUNNING")
        return {**base, **entry}
    if isinstance(r, CheckpointRecord):
        kind = "savepoint" if r.is_savepoint else "checkpoint"
        entry = {"checkpoint_id": r.checkpoint_id, "checkpoint_type": r.checkpoint_type, "epoch": r.epoch}
        if r.status == "PENDING":
            entry.update(event=f"{kind}_triggered", num_subtasks=r.num_subtasks)
        elif r.status == "COMPLETED":
            entry.update(event=f"{kind}_completed", acknowledged=f"{r.num_acknowledged} of {r.num_subtasks}",
                         duration_ms=r.status_timestamp - r.trigger_timestamp, state_size=r.state_size,
                         external_pointer=r.external_pointer)
            if "restored_from" in r.properties:
                entry["restored_from"] = r.properties["restored_from"]
        else:
            event = "checkpoint_subsumed" if r.failure_reason == "CHECKPOINT_SUBSUMED" else f"{kind}_aborted"
            entry.update(event=event, acknowledged=f"{r.num_acknowledged} of {r.num_subtasks}",
                         reason=r.failure_reason, message=r.failure_message)
        return {**base, **entry}
    if isinstance(r, Tombstone):
        key = r.key()
        if key.kind == "checkpoint":
            return {**base, "event": "checkpoint_discarded", "checkpoint_id": int(key.entity_id)}
        return {**base, "event": f"{key.kind}_deleted", "entity_id": key.entity_id}
    if isinstance(r, JobStatusRecord):
        return {**base, "event": "job_status", "status": r.status, "reason": r.reason, "epoch": r.epoch}
    if isinstance(r, CheckpointIdCounterRecord):
        return None
    registered = record_kind(r.KIND)
    if registered is not None and registered.describe is not None:
        return {**base, **registered.describe(r)}
    return {**base, "event": f"{r.KIND}_recorded", "entity_id": r.entity_id}


def _checkpoint_of(record: Any) -> int | None:
    """The checkpoint a record starts or concerns (a counter record announces ``next - 1``)."""
    if isinstance(record, CheckpointRecord):
        return record.checkpoint_id
    if isinstance(record, CheckpointIdCounterRecord):
        return record.next_checkpoint_id - 1
    return None


@dataclasses.dataclass
class Replay:
    """The result of a replay: the state(s) per job and the timeline, in log order."""

    states: dict[str, CoordinatorState]
    timeline: list[dict[str, Any]]
    records: int


def replay(logged: Iterable[LoggedRecord], *, job_id: str | None = None, until_checkpoint: int | None = None,
           until_ms: int | None = None) -> Replay:
    """Fold ``logged`` (one job's, or all jobs') with :func:`apply` into states and a timeline.

    ``until_checkpoint``: stop before the first record of a later checkpoint (the state the
    coordinator had once checkpoint N was completed or aborted). ``until_ms``: ignore records
    written after this time (ms since the Unix epoch).
    """
    states: dict[str, CoordinatorState] = {}
    timeline: list[dict[str, Any]] = []
    stopped: set[str] = set()
    count = 0
    for item in logged:
        job = item.record.key().job_id
        if (job_id is not None and job != job_id) or job in stopped:
            continue
        if until_ms is not None and item.timestamp_ms > until_ms:
            stopped.add(job)
            continue
        checkpoint = _checkpoint_of(item.record)
        if until_checkpoint is not None and checkpoint is not None and checkpoint > until_checkpoint:
            stopped.add(job)
            continue
        state = states.setdefault(job, CoordinatorState(job))
        previous = CoordinatorState(job, epoch=state.epoch, job_status=state.job_status)
        apply(state, item.record)
        count += 1
        entry = timeline_entry(item, previous)
        if entry is not None:
            timeline.append(entry)
    return Replay(states, timeline, count)


# -- export / import ---------------------------------------------------------------------------------
def export_log(bootstrap_servers: str, topic: str, path: Path, *, job_id: str | None = None,
               consumer_overrides: dict | None = None) -> int:
    """Write the log (of ``job_id`` or all jobs) to ``path``: a header line, then one JSON line per
    record with partition, offset, timestamp (ms) and base64 key and value. Returns the records written."""
    codec = SingleObjectCodec()
    written = 0
    with open(path, "w", encoding="utf-8") as out:
        out.write(json.dumps({"format": EXPORT_FORMAT, "topic": topic, "job_id": job_id}) + "\n")
        for message in raw_messages(bootstrap_servers, topic, job_id=job_id, consumer_overrides=consumer_overrides):
            if job_id is not None:
                try:
                    if LogKey.from_avro(codec.decode(message.key()).value).job_id != job_id:
                        continue
                except Exception:  # noqa: BLE001 - exported as is; the replay skips and counts it
                    pass
            value = message.value()
            out.write(json.dumps({
                "partition": message.partition(), "offset": message.offset(), "timestamp": message.timestamp()[1],
                "key": base64.b64encode(message.key() or b"").decode(),
                "value": None if value is None else base64.b64encode(value).decode(),
            }) + "\n")
            written += 1
    return written


class _FileMessage:
    """A line of an export file, looking like a ``confluent_kafka.Message`` to the decoder."""

    def __init__(self, topic: str, line: dict) -> None:
        self._topic, self._line = topic, line

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._line["partition"]

    def offset(self) -> int:
        return self._line["offset"]

    def timestamp(self) -> tuple[int, int]:
        return (1, self._line["timestamp"])

    def key(self) -> bytes:
        return base64.b64decode(self._line["key"])

    def value(self) -> bytes | None:
        return None if self._line["value"] is None else base64.b64decode(self._line["value"])


def read_export(path: Path, *, job_id: str | None = None, codec: Codec | None = None,
                stats: LoadStats | None = None) -> Iterator[LoggedRecord]:
    """The records of an export file, decoded like a live log (bad records skipped and counted).

    Raises:
        ExportFileError: not an export file, or a line that is not JSON.
    """
    codec = codec or SingleObjectCodec()
    stats = stats if stats is not None else LoadStats()
    with open(path, encoding="utf-8") as handle:
        try:
            header = json.loads(handle.readline())
        except json.JSONDecodeError as exc:
            raise ExportFileError(f"{path}: not a Chandy log export (first line is not JSON)") from exc
        if header.get("format") != EXPORT_FORMAT:
            raise ExportFileError(f"{path}: not a Chandy log export (format {header.get('format')!r})")
        for number, line in enumerate(handle, start=2):
            try:
                message = _FileMessage(header["topic"], json.loads(line))
            except json.JSONDecodeError as exc:
                raise ExportFileError(f"{path}:{number}: not a JSON line ({exc})") from exc
            decoded = decode_message(codec, message, job_id, stats)
            if decoded is not None:
                yield decoded


def read_logged(bootstrap_servers: str | None, topic: str, *, from_file: Path | None = None, job_id: str | None = None,
                stats: LoadStats | None = None) -> Iterator[LoggedRecord]:
    """The records to replay: from an export file, or from the live log topic."""
    if from_file is not None:
        return read_export(from_file, job_id=job_id, stats=stats)
    if bootstrap_servers is None:
        raise ChandyError("no bootstrap servers to read the coordinator log from")
    return read_log(bootstrap_servers, topic, job_id=job_id, stats=stats)


__all__ = ["Replay", "export_log", "read_export", "read_logged", "replay", "timeline_entry"]

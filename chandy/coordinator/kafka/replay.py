"""Replaying a coordinator log: what the coordinator knew, step by step, read-only.

:func:`replay` folds log records with the coordinator's own :func:`chandy.coordinator.state.apply` and
turns each record into a timeline entry (checkpoints triggered, completed with k of n acks,
aborted and why, subsumed, discarded; savepoints; epochs and fencings; job status; split
assignments; committed offsets). It can stop at a checkpoint (``until_checkpoint``: the state just
before the next checkpoint was triggered) or at a time (``until_ms``: records written at or
before it).

**The history horizon.** Kafka's log cleaner keeps only the newest record of each key, so once it
has run, the state *before* a point may be missing records that a later record of the same key
replaced: the log cannot say what the coordinator knew then. Every record Chandy writes carries
its key version (:data:`~chandy.coordinator.kafka.log.KEY_VERSION_HEADER`: how many records of
its key came before it), so a replay that meets a key first at a version above 0 knows older
records of that key were compacted away, and that a replay stopping before that record would be
made up. :func:`history_horizon` finds the last such record of a job (for logs written before the
header, a checkpoint first seen completed, aborted or deleted, an epoch or job status of an
epoch above 1, and a checkpoint ID counter past 2 say the same;
a checkpoint ID missing below a present one means its deletion marker was purged too); replays
that stop before it are refused (:class:`HistoryCompactedError`), replays after it are exact, and
the live state (no ``until``) is always exact, since the fold keeps what compaction keeps.

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
from chandy.coordinator.kafka.log import (
    KEY_VERSION_HEADER,
    LoadStats,
    LoggedRecord,
    decode_message,
    key_version_of,
    raw_messages,
    read_log,
)
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


class HistoryCompactedError(ChandyError):
    """A replay ``until`` a point before the history horizon: compaction removed records the state
    at that point depends on, so it cannot be replayed exactly."""


@dataclasses.dataclass(frozen=True)
class HistoryHorizon:
    """Where a job's compacted log becomes exact again.

    ``offset``: the last record that replaced records compaction removed (a replay must include
    it); ``timestamp_ms``: its write time, the earliest ``until`` time whose replay is exact;
    ``checkpoint_id``: the earliest checkpoint N whose ``until_checkpoint`` replay is exact;
    ``reason``: what was found compacted (for the message).
    """

    job_id: str
    offset: int
    timestamp_ms: int
    checkpoint_id: int
    reason: str

    def describe(self) -> str:
        """One line: from which checkpoint and time on the job's replays are exact, and why."""
        import datetime

        when = datetime.datetime.fromtimestamp(self.timestamp_ms / 1000, datetime.UTC).isoformat(timespec="milliseconds")
        return (f"the coordinator log of job {self.job_id} was compacted ({self.reason}): a replay is exact from "
                f"checkpoint {self.checkpoint_id} (--until-checkpoint {self.checkpoint_id}) or from {when} "
                f"(--until {when.replace('+00:00', 'Z')}) on, and live")


def _replaced_older(logged: LoggedRecord) -> bool:
    """Whether a job's first record of its key shows that older records of the key were compacted
    away: its key version is above 0 (or, without the header, by what the record is)."""
    r = logged.record
    if logged.key_version is not None:
        return logged.key_version > 0
    if isinstance(r, Tombstone):
        return r.key().kind == "checkpoint"
    if isinstance(r, CheckpointRecord):
        return r.status != "PENDING" and "restored_from" not in r.properties
    if isinstance(r, (CoordinatorEpochRecord, JobStatusRecord)):
        return r.epoch > 1  # every coordinator writes both when it starts: epoch 1's are gone
    if isinstance(r, CheckpointIdCounterRecord):
        return r.next_checkpoint_id > 2  # the first checkpoint's trigger wrote 2
    return False


def history_horizon(logged: Iterable[LoggedRecord]) -> dict[str, HistoryHorizon]:
    """Per job whose log was compacted, its :class:`HistoryHorizon` (see the module docstring);
    jobs whose log is whole are not in the result."""
    by_job: dict[str, list[LoggedRecord]] = {}
    for item in logged:
        by_job.setdefault(item.record.key().job_id, []).append(item)
    horizons = {}
    for job, records in by_job.items():
        seen: set[LogKey] = set()
        last: tuple[int, str] | None = None  # (index, reason)
        checkpoints: dict[int, int] = {}  # checkpoint id -> index of its first record
        for index, item in enumerate(records):
            key = item.record.key()
            if key.kind == "checkpoint":
                checkpoints.setdefault(int(key.entity_id), index)
            if key in seen:
                continue
            seen.add(key)
            if _replaced_older(item):
                version = f"version {item.key_version}" if item.key_version is not None else "no earlier record"
                last = (index, f"{key.kind} {key.entity_id or ''} starts at {version}".replace("  ", " "))
        present = sorted(c for c in checkpoints if c > 0)
        missing = [c for c in range(present[0] if present else 1, present[-1] if present else 1) if c not in checkpoints]
        if missing:
            # a deleted checkpoint whose deletion marker (tombstone) was purged too: the marker
            # came no later than a checkpoint that started after it
            after = [checkpoints[c] for c in present if c > missing[-1]
                     and records[checkpoints[c]].key_version in (0, None)
                     and not _replaced_older(records[checkpoints[c]])]
            index = min(after) if after else len(records) - 1
            if last is None or index > last[0]:
                last = (index, f"checkpoints {missing[0]}..{missing[-1]} deleted and purged")
        if last is None:
            continue
        index, reason = last
        reached = [c for c in (_checkpoint_of(r.record) for r in records[:index + 1]) if c is not None]
        horizons[job] = HistoryHorizon(job, records[index].offset, records[index].timestamp_ms,
                                       max(reached, default=0), reason)
    return horizons


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
    """The result of a replay: the state(s) per job, the timeline in log order, and the history
    horizon of each job whose log was compacted."""

    states: dict[str, CoordinatorState]
    timeline: list[dict[str, Any]]
    records: int
    horizons: dict[str, HistoryHorizon] = dataclasses.field(default_factory=dict)


def replay(logged: Iterable[LoggedRecord], *, job_id: str | None = None, until_checkpoint: int | None = None,
           until_ms: int | None = None) -> Replay:
    """Fold ``logged`` (one job's, or all jobs') with :func:`apply` into states and a timeline.

    ``until_checkpoint``: stop before the first record of a later checkpoint (the state the
    coordinator had once checkpoint N was completed or aborted). ``until_ms``: ignore records
    written after this time (ms since the Unix epoch).

    Raises:
        HistoryCompactedError: ``until_checkpoint`` or ``until_ms`` stops a job's replay before its
            history horizon (:func:`history_horizon`): the message names the horizon.
    """
    logged = [item for item in logged if job_id is None or item.record.key().job_id == job_id]
    horizons = history_horizon(logged)
    states: dict[str, CoordinatorState] = {}
    included: dict[str, int] = {}  # job -> offset of the last record replayed
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
        included[job] = item.offset
        entry = timeline_entry(item, previous)
        if entry is not None:
            timeline.append(entry)
    if until_checkpoint is not None or until_ms is not None:
        early = [h for job, h in sorted(horizons.items()) if included.get(job, -1) < h.offset]
        if early:
            until = f"--until-checkpoint {until_checkpoint}" if until_checkpoint is not None else "--until"
            raise HistoryCompactedError(f"{until} is before the history horizon: {early[0].describe()}")
    return Replay(states, timeline, count, horizons)


# -- export / import ---------------------------------------------------------------------------------
def export_log(bootstrap_servers: str, topic: str, path: Path, *, job_id: str | None = None,
               consumer_overrides: dict | None = None) -> int:
    """Write the log (of ``job_id`` or all jobs) to ``path``: a header line, then one JSON line per
    record with partition, offset, timestamp (ms), base64 key and value and key version. Returns the records
    written."""
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
                "key_version": key_version_of(message),
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

    def headers(self) -> list[tuple[str, bytes]] | None:
        version = self._line.get("key_version")  # absent in exports made before the header existed
        return None if version is None else [(KEY_VERSION_HEADER, str(version).encode())]


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


__all__ = ["HistoryCompactedError", "HistoryHorizon", "Replay", "export_log", "history_horizon", "read_export",
           "read_logged", "replay", "timeline_entry"]

"""Flink's REST view of a job's checkpoints, folded from the public checkpoint events.

:class:`JobCheckpointsView` folds :class:`~chandy.coordinator.messages.CheckpointEvent` objects (the
``<prefix>.checkpoint-events`` topic, in order) into the JSON bodies of Flink's REST endpoints:

- ``GET /jobs/:jobid/checkpoints`` (Flink's ``CheckpointingStatistics``):
  ``{"counts": {restored, total, in_progress, completed, failed},
  "summary": {checkpointed_size, state_size, end_to_end_duration, alignment_buffered,
  processed_data, persisted_data}`` (each ``{min, max, avg, p50, p90, p95, p99, p999}``),
  ``"latest": {completed, savepoint, failed, restored}, "history": [...]}`` (newest first);
- ``GET /jobs/:jobid/checkpoints/details/:checkpointid`` (Flink's ``CheckpointStatistics``):
  ``className``, ``id``, ``status`` (IN_PROGRESS, COMPLETED, FAILED), ``is_savepoint``,
  ``trigger_timestamp`` and ``latest_ack_timestamp`` (ms since the epoch), ``checkpointed_size`` and
  ``state_size`` (bytes), ``end_to_end_duration`` (ms), ``num_subtasks``,
  ``num_acknowledged_subtasks``, ``checkpoint_type``, ``tasks``; completed ones add
  ``external_path`` and ``discarded``, failed ones ``failure_timestamp``, ``failure_message`` and
  Chandy's ``failure_reason`` (a ``CheckpointFailureReason`` name);
- Chandy's own ``GET /jobs/:jobid/lake-commits`` (:meth:`JobCheckpointsView.lake_commits`): the
  end-to-end lag of each ``LAKE_COMMITTED`` (ms from the checkpoint's trigger to its records being
  readable in the lake) and its summary; Flink's shapes above are left as Flink has them;
- ``GET /jobs/:jobid`` and ``GET /jobs/:jobid/checkpoints/config`` (Flink's ``JobDetailsInfo`` and
  ``CheckpointConfigInfo``), from what ``TRIGGERED`` events say of the job.

Field names are Flink's. What Chandy does not measure is 0, as in Flink for a job without those
features: ``alignment_buffered``, ``processed_data``, ``persisted_data`` (no unaligned
checkpoints); ``checkpointed_size`` equals ``state_size`` (no incremental checkpoints).
``tasks`` holds one Flink ``TaskCheckpointStatistics`` per operator (job vertex, by operator ID) the
TRIGGERED event named: its ``num_subtasks``, and, since acknowledgements are not on the events
topic, what the checkpoint's totals tell exactly: with one operator all of it; with several, a
completed checkpoint's ``num_acknowledged_subtasks`` (all of them) and -1 for what is known only
in total (sizes, the latest acknowledgement, the duration, an unfinished checkpoint's
acknowledgements). ``counts.restored`` and
``latest.restored`` stay 0 and null: restores are not published as events (the coordinator's own
``CoordinatorService.stats()`` has them). History is bounded by ``history_size`` (Flink's
``web.checkpoints.history``, default 10 there, 100 here); counts and the summary cover every
event seen. Pure: no Kafka here; the reader is ``coordinator.kafka.jobs_view``.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any

from chandy.coordinator.messages import CheckpointEvent

#: The percentiles of Flink's ``StatsSummaryDto``, as (field name, quantile).
PERCENTILES: tuple[tuple[str, float], ...] = (
    ("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999))
_SUMMARY_FIELDS = ("checkpointed_size", "state_size", "end_to_end_duration", "alignment_buffered",
                   "processed_data", "persisted_data")
_SAMPLE_LIMIT = 10_000  # Flink's StatsSummary keeps a bounded histogram window too


def quantile(ordered: list[int], q: float) -> float:
    """The ``q`` quantile (0 < q < 1) of an ascending list, by the nearest-rank method; 0.0 if empty."""
    if not ordered:
        return 0.0
    rank = max(1, math.ceil(q * len(ordered)))
    return float(ordered[min(rank, len(ordered)) - 1])


def summary(values: list[int]) -> dict[str, float]:
    """Flink's ``StatsSummaryDto``: ``{min, max, avg, p50, p90, p95, p99, p999}`` of ``values``
    (all 0 when there are none, as Flink reports an empty summary)."""
    ordered = sorted(values)
    result: dict[str, float] = {"min": 0, "max": 0, "avg": 0}
    if ordered:
        result = {"min": ordered[0], "max": ordered[-1], "avg": round(sum(ordered) / len(ordered))}
    for name, q in PERCENTILES:
        result[name] = quantile(ordered, q)
    return result


def job_status(latest_status_change: tuple[int, str] | None, epoch: int) -> str:
    """A job's status from its public events: the latest ``JOB_STATUS_CHANGED`` as ``(epoch,
    status)`` and the newest coordinator epoch seen in any event. The status holds while no
    later epoch has spoken; an event of a later epoch means a coordinator started since (a restart
    after SUSPENDED, a new run): RUNNING, as Flink reports a recovered job. With no status change
    at all, RUNNING (a coordinator publishes only the statuses that end or suspend a job)."""
    if latest_status_change is not None and latest_status_change[0] >= epoch:
        return latest_status_change[1]
    return "RUNNING"


@dataclasses.dataclass
class _Checkpoint:
    checkpoint_id: int
    checkpoint_type: str
    trigger_timestamp: int
    num_subtasks: int = 0
    status: str = "IN_PROGRESS"
    num_acknowledged: int = 0
    latest_ack_timestamp: int = -1
    end_to_end_duration: int = 0
    state_size: int = 0
    external_path: str | None = None
    failure_timestamp: int | None = None
    failure_reason: str | None = None
    failure_message: str | None = None
    #: operator ID -> parallelism, as its TRIGGERED event said (the job's vertices)
    operators: dict[str, int] = dataclasses.field(default_factory=dict)

    def _tasks(self) -> dict[str, dict[str, Any]]:
        """Flink's ``tasks`` map: a ``TaskCheckpointStatistics`` per operator (see the module
        docstring for what is exact and what is -1)."""
        single, completed = len(self.operators) == 1, self.status == "COMPLETED"
        tasks = {}
        for operator, parallelism in self.operators.items():
            size = self.state_size if single else -1
            acknowledged = parallelism if completed else self.num_acknowledged if single else -1
            tasks[operator] = {
                "id": operator, "status": self.status,
                "latest_ack_timestamp": self.latest_ack_timestamp if single else -1,
                "checkpointed_size": size, "state_size": size,
                "end_to_end_duration": self.end_to_end_duration if single else -1,
                "alignment_buffered": 0, "processed_data": 0, "persisted_data": 0,
                "num_subtasks": parallelism, "num_acknowledged_subtasks": acknowledged}
        return tasks

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "className": {"IN_PROGRESS": "in_progress", "COMPLETED": "completed", "FAILED": "failed"}[self.status],
            "id": self.checkpoint_id,
            "status": self.status,
            "is_savepoint": self.checkpoint_type != "CHECKPOINT",
            "savepointFormat": "CANONICAL" if self.checkpoint_type != "CHECKPOINT" else None,
            "trigger_timestamp": self.trigger_timestamp,
            "latest_ack_timestamp": self.latest_ack_timestamp,
            "checkpointed_size": self.state_size,
            "state_size": self.state_size,
            "end_to_end_duration": self.end_to_end_duration,
            "alignment_buffered": 0,
            "processed_data": 0,
            "persisted_data": 0,
            "num_subtasks": self.num_subtasks,
            "num_acknowledged_subtasks": self.num_acknowledged,
            "checkpoint_type": {"CHECKPOINT": "CHECKPOINT", "SAVEPOINT": "SAVEPOINT",
                                "SAVEPOINT_TERMINATE": "SYNC_SAVEPOINT"}.get(self.checkpoint_type, self.checkpoint_type),
            "tasks": self._tasks(),
        }
        if self.status == "COMPLETED":
            body["external_path"] = self.external_path
            body["discarded"] = False
        elif self.status == "FAILED":
            body["failure_timestamp"] = self.failure_timestamp
            body["failure_message"] = self.failure_message
            body["failure_reason"] = self.failure_reason
        return body


class JobCheckpointsView:
    """One job's checkpoint statistics in Flink's REST shape, folded from its checkpoint events
    (Flink's ``CheckpointStatsTracker`` fed from the events topic instead of the coordinator).

    Not thread-safe: one thread applies events; readers copy with :meth:`checkpointing_statistics`
    and :meth:`checkpoint_details` under the caller's lock.
    """

    def __init__(self, job_id: str, history_size: int = 100) -> None:
        self.job_id = job_id
        self.history_size = history_size
        self.history: collections.OrderedDict[int, _Checkpoint] = collections.OrderedDict()
        self.counts = {"restored": 0, "total": 0, "completed": 0, "failed": 0}
        self._durations: collections.deque[int] = collections.deque(maxlen=_SAMPLE_LIMIT)
        self._sizes: collections.deque[int] = collections.deque(maxlen=_SAMPLE_LIMIT)
        self._lags: collections.deque[int] = collections.deque(maxlen=_SAMPLE_LIMIT)
        self._lake_commits: collections.deque[dict[str, Any]] = collections.deque(maxlen=history_size)
        self._latest: dict[str, _Checkpoint | None] = {"completed": None, "savepoint": None, "failed": None}
        self.last_event_timestamp: int | None = None
        self.epoch = 0
        self._status: tuple[int, str] | None = None  # (epoch, status) of the latest JOB_STATUS_CHANGED
        self._status_timestamp: int | None = None
        self.first_event_timestamp: int | None = None
        #: from the newest TRIGGERED event: the job's name, checkpointing configuration, operators
        self.name: str | None = None
        self.config: dict[str, int] | None = None
        self.operators: dict[str, int] = {}

    def apply(self, event: CheckpointEvent) -> None:
        """Fold one event: TRIGGERED adds an IN_PROGRESS checkpoint; COMPLETED and
        SAVEPOINT_COMPLETED complete it; ABORTED and SAVEPOINT_FAILED fail it; LAKE_COMMITTED
        adds a lake commit and its end-to-end lag (trigger to readable in the lake, ms). A completion or
        failure whose trigger was not seen (history read from the middle) is added as such.
        JOB_STATUS_CHANGED (a job that finished, failed, was canceled or suspended) sets the
        status. Other event types (UNKNOWN to this version) are ignored."""
        if event.job_id != self.job_id:
            raise ValueError(f"event of job {event.job_id} applied to the view of job {self.job_id}")
        self.last_event_timestamp = event.timestamp
        if self.first_event_timestamp is None:
            self.first_event_timestamp = min(event.timestamp, event.trigger_timestamp or event.timestamp)
        self.epoch = max(self.epoch, event.epoch)
        kind = event.event_type
        if event.job_name:
            self.name = event.job_name
        if event.checkpoint_config:
            self.config = dict(event.checkpoint_config)
        if event.operators:
            self.operators = {o.operator_id: o.parallelism for o in event.operators}
        if kind == "JOB_STATUS_CHANGED" and event.job_status:
            self._status = (event.epoch, str(event.job_status))
            self._status_timestamp = event.timestamp
            return
        if kind == "LAKE_COMMITTED":
            self._lake_commits.append({
                "id": event.checkpoint_id, "trigger_timestamp": event.trigger_timestamp,
                "lake_committed_timestamp": event.timestamp,
                "end_to_end_lag": event.timestamp - event.trigger_timestamp, "table_uri": event.table_uri,
                "table_version": event.table_version, "records_added": event.records_added})
            self._lags.append(event.timestamp - event.trigger_timestamp)
            return
        if kind not in ("TRIGGERED", "COMPLETED", "SAVEPOINT_COMPLETED", "ABORTED", "SAVEPOINT_FAILED"):
            return
        checkpoint = self.history.get(event.checkpoint_id)
        if checkpoint is None:
            checkpoint = _Checkpoint(event.checkpoint_id, str(event.checkpoint_type), event.trigger_timestamp,
                                     event.num_subtasks)
            self.history[event.checkpoint_id] = checkpoint
            self.counts["total"] += 1
            while len(self.history) > self.history_size:
                self.history.popitem(last=False)
        elif checkpoint.status != "IN_PROGRESS":
            return  # a repeated terminal event (at-least-once readers) counts once
        checkpoint.num_subtasks = event.num_subtasks or checkpoint.num_subtasks
        checkpoint.num_acknowledged = event.num_acknowledged
        if kind == "TRIGGERED" or not checkpoint.operators:
            checkpoint.operators = dict(self.operators)
        if kind == "TRIGGERED":
            return
        checkpoint.end_to_end_duration = (event.end_to_end_duration_ms if event.end_to_end_duration_ms is not None
                                          else event.timestamp - event.trigger_timestamp)
        checkpoint.state_size = event.state_size
        if kind in ("COMPLETED", "SAVEPOINT_COMPLETED"):
            checkpoint.status = "COMPLETED"
            checkpoint.latest_ack_timestamp = event.timestamp
            checkpoint.external_path = event.external_pointer
            self.counts["completed"] += 1
            self._durations.append(checkpoint.end_to_end_duration)
            self._sizes.append(checkpoint.state_size)
            self._latest["savepoint" if checkpoint.checkpoint_type != "CHECKPOINT" else "completed"] = checkpoint
        else:
            checkpoint.status = "FAILED"
            checkpoint.failure_timestamp = event.timestamp
            checkpoint.failure_reason = None if event.failure_reason is None else str(event.failure_reason)
            checkpoint.failure_message = event.failure_message or checkpoint.failure_reason
            self.counts["failed"] += 1
            self._latest["failed"] = checkpoint

    @property
    def in_progress(self) -> int:
        """Checkpoints triggered and neither completed nor failed (within the history)."""
        return sum(1 for c in self.history.values() if c.status == "IN_PROGRESS")

    def checkpointing_statistics(self) -> dict[str, Any]:
        """The body of ``GET /jobs/:jobid/checkpoints`` (see the module docstring)."""
        durations, sizes = list(self._durations), list(self._sizes)
        summaries = {name: summary([]) for name in _SUMMARY_FIELDS}
        summaries["end_to_end_duration"] = summary(durations)
        summaries["state_size"] = summaries["checkpointed_size"] = summary(sizes)
        return {
            "counts": {"restored": self.counts["restored"], "total": self.counts["total"],
                       "in_progress": self.in_progress, "completed": self.counts["completed"],
                       "failed": self.counts["failed"]},
            "summary": summaries,
            "latest": {
                "completed": self._json(self._latest["completed"]),
                "savepoint": self._json(self._latest["savepoint"]),
                "failed": self._json(self._latest["failed"]),
                "restored": None,
            },
            "history": [c.to_json() for c in reversed(self.history.values())],
        }

    def lake_commits(self) -> dict[str, Any]:
        """The body of Chandy's ``GET /jobs/:jobid/lake-commits`` (not Flink's): the summary of the
        end-to-end lag (ms from a checkpoint's trigger, when its offset ranges were fixed, to its
        ``LAKE_COMMITTED`` event, when its records became readable; min/max/avg/percentiles as
        Flink's summaries) and the latest lake commits, newest first (one per checkpoint and
        table: ``id``, ``trigger_timestamp``, ``lake_committed_timestamp``, ``end_to_end_lag``,
        ``table_uri``, ``table_version``, ``records_added``)."""
        return {"summary": {"end_to_end_lag": summary(list(self._lags))},
                "history": list(reversed(self._lake_commits))}

    def checkpoint_details(self, checkpoint_id: int) -> dict[str, Any] | None:
        """The body of ``GET /jobs/:jobid/checkpoints/details/:checkpointid``, or None when the
        checkpoint is unknown or has left the history (Flink answers 404 then)."""
        checkpoint = self.history.get(checkpoint_id)
        return None if checkpoint is None else checkpoint.to_json()

    @property
    def status(self) -> str:
        """Flink's job status as far as the events tell: the latest ``JOB_STATUS_CHANGED`` of the
        current coordinator epoch (FINISHED, FAILED, CANCELED, SUSPENDED, ...), else RUNNING (a
        coordinator publishes only the statuses that end or suspend a job; one killed without a
        word still reads RUNNING)."""
        return job_status(self._status, self.epoch)

    def overview(self) -> dict[str, Any]:
        """One row of ``GET /jobs`` (Flink's ``{"id", "status"}`` and more):
        ``{"id", "name", "status", "epoch", "last_event_timestamp", "counts"}`` (``name``: the
        job's name once a TRIGGERED event said it, else None)."""
        return {"id": self.job_id, "name": self.name, "status": self.status, "epoch": self.epoch,
                "last_event_timestamp": self.last_event_timestamp, "counts": self.checkpointing_statistics()["counts"]}

    def job_details(self, now_ms: int) -> dict[str, Any]:
        """The body of ``GET /jobs/:jobid`` in the shape of Flink's ``JobDetailsInfo`` (times in ms
        since the epoch, durations in ms; -1 for a time not reached): the job's name and status,
        and one vertex per operator with its parallelism, as the newest TRIGGERED event said."""
        state = self.status
        start = self.first_event_timestamp if self.first_event_timestamp is not None else -1
        terminal = state in ("FINISHED", "FAILED", "CANCELED")
        end = (self._status_timestamp or -1) if terminal else -1
        duration = ((end if end >= 0 else now_ms) - start) if start >= 0 else -1
        vertex_state = {"FINISHED": "FINISHED", "FAILED": "FAILED", "CANCELED": "CANCELED"}.get(state, "RUNNING")
        vertices = [{"id": operator, "name": operator, "parallelism": parallelism, "maxParallelism": parallelism,
                     "status": vertex_state, "start-time": start, "end-time": end, "duration": duration,
                     "tasks": {vertex_state: parallelism}, "metrics": {}}
                    for operator, parallelism in self.operators.items()]
        counts = {vertex_state: len(vertices)} if vertices else {}
        return {"jid": self.job_id, "name": self.name or self.job_id, "isStoppable": not terminal, "state": state,
                "job-type": "STREAMING", "start-time": start, "end-time": end, "duration": duration,
                "maxParallelism": max(self.operators.values(), default=-1), "now": now_ms,
                "timestamps": {state: self._status_timestamp or start}, "vertices": vertices, "status-counts": counts,
                "plan": {"jid": self.job_id, "name": self.name or self.job_id, "type": "STREAMING",
                         "nodes": [{"id": v["id"], "parallelism": v["parallelism"], "operator": v["name"],
                                    "description": v["name"], "inputs": []} for v in vertices]}}

    def checkpoint_config(self) -> dict[str, Any] | None:
        """The body of ``GET /jobs/:jobid/checkpoints/config`` in the shape of Flink's
        ``CheckpointConfigInfo`` (ms and counts), or None before a TRIGGERED event said it.
        Chandy's checkpoints are exactly-once and kept when a job is canceled (Flink's
        ``RETAIN_ON_CANCELLATION``); ``num_retained`` is ``state.checkpoints.num-retained``."""
        c = self.config
        if c is None:
            return None
        return {"mode": "exactly_once", "interval": c.get("interval_ms", 0), "timeout": c.get("timeout_ms", 0),
                "min_pause": c.get("min_pause_ms", 0), "max_concurrent": c.get("max_concurrent", 1),
                "externalization": {"enabled": True, "delete_on_cancellation": False},
                "state_backend": "chandy", "checkpoint_storage": "FileSystemCheckpointStorage",
                "unaligned_checkpoints": False, "tolerable_failed_checkpoints": c.get("tolerable_failed", 0),
                "aligned_checkpoint_timeout": 0, "checkpoints_after_tasks_finish": True,
                "state_changelog_enabled": False, "num_retained": c.get("num_retained", 1)}

    @staticmethod
    def _json(checkpoint: _Checkpoint | None) -> dict[str, Any] | None:
        return None if checkpoint is None else checkpoint.to_json()

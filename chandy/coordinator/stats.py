"""Checkpoint statistics, shaped like Flink's REST answer ``/jobs/:jobid/checkpoints``.

Per checkpoint: trigger time, acks received of expected, latest ack time, end-to-end duration
(ms), state size (bytes), status and failure reason. The summary gives counts and
min/max/avg/p50/p90/p99 of end-to-end duration and state size over completed checkpoints.
Kept in memory, bounded by ``history_size`` (Flink's ``web.checkpoints.history``).
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
from typing import Any


@dataclasses.dataclass
class CheckpointStats:
    """Statistics of one checkpoint or savepoint (times in ms since the Unix epoch)."""

    checkpoint_id: int
    checkpoint_type: str
    trigger_timestamp: int
    num_subtasks: int
    status: str = "IN_PROGRESS"
    num_acknowledged: int = 0
    latest_ack_timestamp: int | None = None
    end_to_end_duration_ms: int | None = None
    state_size: int = 0
    failure_reason: str | None = None
    failure_message: str | None = None
    external_pointer: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.checkpoint_id,
            "status": self.status,
            "is_savepoint": self.checkpoint_type != "CHECKPOINT",
            "checkpoint_type": self.checkpoint_type,
            "trigger_timestamp": self.trigger_timestamp,
            "latest_ack_timestamp": self.latest_ack_timestamp,
            "end_to_end_duration": self.end_to_end_duration_ms,
            "state_size": self.state_size,
            "num_subtasks": self.num_subtasks,
            "num_acknowledged_subtasks": self.num_acknowledged,
            "failure_reason": self.failure_reason,
            "failure_message": self.failure_message,
            "external_path": self.external_pointer,
        }


def _percentile(ordered: list[int], q: float) -> float:
    if not ordered:
        return 0.0
    index = min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))
    return float(ordered[index])


def _summary(values: list[int]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"min": 0, "max": 0, "avg": 0, "p50": 0, "p90": 0, "p99": 0}
    return {
        "min": ordered[0], "max": ordered[-1], "avg": statistics.fmean(ordered),
        "p50": _percentile(ordered, 0.5), "p90": _percentile(ordered, 0.9), "p99": _percentile(ordered, 0.99),
    }


class CheckpointStatsTracker:
    """Tracks :class:`CheckpointStats` (Flink's CheckpointStatsTracker); mailbox thread only."""

    def __init__(self, history_size: int = 100) -> None:
        self.history: collections.OrderedDict[int, CheckpointStats] = collections.OrderedDict()
        self.history_size = history_size
        self.counts: collections.Counter[str] = collections.Counter()
        self._durations: collections.deque[int] = collections.deque(maxlen=10_000)
        self._sizes: collections.deque[int] = collections.deque(maxlen=10_000)
        self.latest: dict[str, CheckpointStats | None] = {"completed": None, "savepoint": None, "failed": None}
        self.restored: dict[str, Any] | None = None

    def get(self, checkpoint_id: int) -> CheckpointStats | None:
        return self.history.get(checkpoint_id)

    def report_pending(self, stats: CheckpointStats) -> None:
        self.history[stats.checkpoint_id] = stats
        self.counts["total"] += 1
        while len(self.history) > self.history_size:
            self.history.popitem(last=False)

    def report_ack(self, checkpoint_id: int, timestamp: int, state_size: int) -> None:
        stats = self.history.get(checkpoint_id)
        if stats is not None:
            stats.num_acknowledged += 1
            stats.latest_ack_timestamp = timestamp
            stats.state_size += state_size

    def report_completed(self, checkpoint_id: int, now: int, state_size: int, pointer: str | None) -> None:
        stats = self.history.get(checkpoint_id)
        if stats is None:
            return
        stats.status = "COMPLETED"
        stats.end_to_end_duration_ms = now - stats.trigger_timestamp
        stats.state_size = state_size
        stats.external_pointer = pointer
        self.counts["completed"] += 1
        self._durations.append(stats.end_to_end_duration_ms)
        self._sizes.append(state_size)
        self.latest["savepoint" if stats.checkpoint_type != "CHECKPOINT" else "completed"] = stats

    def report_failed(self, checkpoint_id: int, now: int, reason: str, message: str | None) -> None:
        stats = self.history.get(checkpoint_id)
        if stats is None:
            return
        stats.status = "FAILED"
        stats.end_to_end_duration_ms = now - stats.trigger_timestamp
        stats.failure_reason = reason
        stats.failure_message = message
        self.counts["failed"] += 1
        self.latest["failed"] = stats

    def report_restored(self, checkpoint_id: int, pointer: str | None, timestamp: int) -> None:
        self.counts["restored"] += 1
        self.restored = {"id": checkpoint_id, "external_path": pointer, "restore_timestamp": timestamp}

    def to_json(self) -> dict[str, Any]:
        """The ``/jobs/:jobid/checkpoints`` shape: counts, summary, latest, history (newest first)."""
        in_progress = sum(1 for s in self.history.values() if s.status == "IN_PROGRESS")
        return {
            "counts": {
                "restored": self.counts["restored"],
                "total": self.counts["total"],
                "in_progress": in_progress,
                "completed": self.counts["completed"],
                "failed": self.counts["failed"],
            },
            "summary": {
                "end_to_end_duration": _summary(list(self._durations)),
                "state_size": _summary(list(self._sizes)),
            },
            "latest": {
                "completed": self.latest["completed"].to_json() if self.latest["completed"] else None,
                "savepoint": self.latest["savepoint"].to_json() if self.latest["savepoint"] else None,
                "failed": self.latest["failed"].to_json() if self.latest["failed"] else None,
                "restored": self.restored,
            },
            "history": [s.to_json() for s in reversed(self.history.values())],
        }

"""A checkpoint's phases (issue 32) are the gaps between its milestones: they add up to its
end-to-end time, none is negative, and each lands where its milestone says, whether the lake
commit ends before the driver's Spark job call returns or after."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from chandy.connectors.spark.options import CHECKPOINT_PHASES
from chandy.connectors.spark.pipeline import Pipeline
from chandy.coordinator.errors import ChandyError
from chandy.coordinator.stats import CheckpointStats


class _Service:
    def __init__(self, stats: CheckpointStats | None, lake_ended_ms: float | None, *, stopped: bool = False) -> None:
        self.stats, self.lake_ended_ms, self.stopped = stats, lake_ended_ms, stopped

    def checkpoint_stats(self, checkpoint_id: int) -> CheckpointStats | None:
        if self.stopped:
            raise ChandyError("the coordinator stopped")
        return self.stats

    def call_operator_coordinator(self, operator_id: str, func) -> float | None:
        return func(SimpleNamespace(last_commit_ended_ms=self.lake_ended_ms))


def _stats(trigger: int, acked: int, completed: int) -> CheckpointStats:
    return CheckpointStats(7, "CHECKPOINT", trigger, 2, status="COMPLETED", num_acknowledged=2,
                           latest_ack_timestamp=acked, end_to_end_duration_ms=completed - trigger)


@pytest.mark.parametrize("job_ended", [1_250.0, 1_400.0])
def test_the_phases_are_the_gaps_between_the_milestones_and_add_up(job_ended) -> None:
    # started 1000, ranges fixed 1010, last ack 1200, completed 1205, lake commit ended 1260,
    # driver's job call returned at job_ended, completion handed over at 1420
    pipeline = SimpleNamespace(service=_Service(_stats(1_002, 1_200, 1_205), 1_260.0))
    phases = Pipeline._phases(pipeline, 7, 1_000.0, 1_010.0, job_ended, 1_420.0)
    assert tuple(phases) == CHECKPOINT_PHASES
    assert sum(phases.values()) == pytest.approx(420.0)
    assert phases["trigger"] == 10.0 and phases["tasks"] == 190.0 and phases["finalize"] == 5.0
    assert phases["lake_commit"] == 55.0
    assert phases["job_end"] == max(0.0, job_ended - 1_260.0)
    assert phases["notify"] == pytest.approx(1_420.0 - 1_260.0 - phases["job_end"])
    assert min(phases.values()) >= 0


def test_no_phases_without_the_checkpoints_statistics_or_a_running_coordinator() -> None:
    assert Pipeline._phases(SimpleNamespace(service=_Service(None, None)), 7, 0.0, 1.0, 2.0, 3.0) == {}
    stopped = _Service(_stats(1, 2, 3), 4.0, stopped=True)
    assert Pipeline._phases(SimpleNamespace(service=stopped), 7, 0.0, 1.0, 2.0, 3.0) == {}

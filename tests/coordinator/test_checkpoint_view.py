"""Flink's REST shape folded from checkpoint events (coordinator/checkpoint_view.py), and the
Prometheus gauge values derived from a stats body (coordinator/kafka/metrics.py)."""

from __future__ import annotations

import pytest

from chandy.coordinator.checkpoint_view import JobCheckpointsView, quantile, summary
from chandy.coordinator.kafka.metrics import checkpoint_gauge_values
from chandy.coordinator.messages import CheckpointEvent

JOB = "3f2a9c1e5b7d4a60a1b2c3d4e5f60718"


def event(checkpoint_id: int, kind: str, *, at: int, trigger: int, checkpoint_type: str = "CHECKPOINT",
          duration: int | None = None, size: int = 0, reason: str | None = None, pointer: str | None = None,
          acks: int = 0, job: str = JOB) -> CheckpointEvent:
    return CheckpointEvent(job_id=job, checkpoint_id=checkpoint_id, event_type=kind, checkpoint_type=checkpoint_type,
                           epoch=1, timestamp=at, trigger_timestamp=trigger, end_to_end_duration_ms=duration,
                           num_subtasks=2, num_acknowledged=acks, state_size=size, failure_reason=reason,
                           failure_message=None, external_pointer=pointer)


def folded() -> JobCheckpointsView:
    view = JobCheckpointsView(JOB)
    for e in [
        event(1, "TRIGGERED", at=1000, trigger=1000),
        event(1, "COMPLETED", at=1040, trigger=1000, duration=40, size=100, acks=2, pointer="file:///c/chk-1"),
        event(2, "TRIGGERED", at=2000, trigger=2000),
        event(2, "ABORTED", at=2500, trigger=2000, reason="CHECKPOINT_DECLINED", acks=1),
        event(3, "TRIGGERED", at=3000, trigger=3000, checkpoint_type="SAVEPOINT"),
        event(3, "SAVEPOINT_COMPLETED", at=3070, trigger=3000, checkpoint_type="SAVEPOINT", duration=70, size=300,
              acks=2, pointer="file:///sp/savepoint-1"),
        event(4, "TRIGGERED", at=4000, trigger=4000),
    ]:
        view.apply(e)
    return view


def test_counts_latest_and_history_follow_flinks_checkpointing_statistics():
    body = folded().checkpointing_statistics()
    assert body["counts"] == {"restored": 0, "total": 4, "in_progress": 1, "completed": 2, "failed": 1}
    assert [c["id"] for c in body["history"]] == [4, 3, 2, 1]
    assert [c["status"] for c in body["history"]] == ["IN_PROGRESS", "COMPLETED", "FAILED", "COMPLETED"]
    assert body["latest"]["completed"]["id"] == 1 and body["latest"]["completed"]["external_path"] == "file:///c/chk-1"
    assert body["latest"]["savepoint"]["id"] == 3 and body["latest"]["savepoint"]["is_savepoint"] is True
    assert body["latest"]["failed"]["id"] == 2 and body["latest"]["failed"]["failure_message"] == "CHECKPOINT_DECLINED"
    assert body["latest"]["failed"]["failure_timestamp"] == 2500
    assert body["latest"]["restored"] is None
    assert set(body["summary"]) == {"checkpointed_size", "state_size", "end_to_end_duration", "alignment_buffered",
                                    "processed_data", "persisted_data"}
    duration = body["summary"]["end_to_end_duration"]
    assert set(duration) == {"min", "max", "avg", "p50", "p90", "p95", "p99", "p999"}
    assert (duration["min"], duration["max"], duration["avg"]) == (40, 70, 55)
    assert body["summary"]["state_size"]["max"] == 300


def test_details_carry_flinks_checkpoint_statistics_fields():
    view = folded()
    completed = view.checkpoint_details(1)
    assert completed is not None
    assert completed["className"] == "completed" and completed["end_to_end_duration"] == 40
    assert completed["num_acknowledged_subtasks"] == 2 and completed["num_subtasks"] == 2
    assert completed["state_size"] == completed["checkpointed_size"] == 100
    assert completed["trigger_timestamp"] == 1000 and completed["latest_ack_timestamp"] == 1040
    assert completed["checkpoint_type"] == "CHECKPOINT" and completed["discarded"] is False
    failed = view.checkpoint_details(2)
    assert failed is not None and failed["className"] == "failed" and failed["failure_reason"] == "CHECKPOINT_DECLINED"
    assert "external_path" not in failed
    assert view.checkpoint_details(99) is None


def test_repeated_terminal_events_count_once_and_history_is_bounded():
    view = JobCheckpointsView(JOB, history_size=3)
    for cid in range(1, 6):
        view.apply(event(cid, "TRIGGERED", at=cid * 10, trigger=cid * 10))
        done = event(cid, "COMPLETED", at=cid * 10 + 5, trigger=cid * 10, duration=5, size=1)
        view.apply(done)
        view.apply(done)  # an at-least-once reader may see it twice
    body = view.checkpointing_statistics()
    assert body["counts"]["completed"] == 5 and body["counts"]["total"] == 5
    assert [c["id"] for c in body["history"]] == [5, 4, 3]
    assert view.checkpoint_details(1) is None


def test_a_completion_without_its_trigger_is_still_shown():
    view = JobCheckpointsView(JOB)
    view.apply(event(7, "COMPLETED", at=7100, trigger=7000, duration=100, size=9))
    assert view.checkpoint_details(7)["end_to_end_duration"] == 100
    assert view.checkpointing_statistics()["counts"]["completed"] == 1


def test_events_of_another_job_or_unknown_kind():
    view = JobCheckpointsView(JOB)
    with pytest.raises(ValueError, match="other"):
        view.apply(event(1, "TRIGGERED", at=1, trigger=1, job="other"))
    view.apply(event(1, "UNKNOWN", at=1, trigger=1))
    assert view.checkpointing_statistics()["counts"]["total"] == 0


def test_job_status_follows_job_status_events_of_the_current_epoch():
    view = folded()
    assert view.overview()["status"] == "RUNNING"
    done = CheckpointEvent(job_id=JOB, checkpoint_id=3, event_type="JOB_STATUS_CHANGED", checkpoint_type="CHECKPOINT",
                           epoch=1, timestamp=5000, trigger_timestamp=5000, job_status="FINISHED")
    view.apply(done)
    assert view.overview()["status"] == "FINISHED"
    assert view.checkpointing_statistics()["counts"]["total"] == 4  # a status event is no checkpoint
    restarted = event(5, "TRIGGERED", at=6000, trigger=6000)
    view.apply(CheckpointEvent(**{**restarted.__dict__, "epoch": 2}))
    assert view.overview()["status"] == "RUNNING" and view.overview()["epoch"] == 2


def test_percentiles_by_nearest_rank():
    values = list(range(1, 1001))
    assert quantile(values, 0.5) == 500 and quantile(values, 0.99) == 990 and quantile(values, 0.999) == 999
    assert summary([]) == {"min": 0, "max": 0, "avg": 0, "p50": 0.0, "p90": 0.0, "p95": 0.0, "p99": 0.0, "p999": 0.0}


def test_gauges_use_minus_one_before_any_completion_as_flink():
    empty = checkpoint_gauge_values({"counts": {"total": 1, "in_progress": 1, "completed": 0, "failed": 0},
                                     "latest": {"completed": None, "restored": None}})
    assert empty["lastCheckpointDuration"] == -1 and empty["lastCompletedCheckpointId"] == -1
    assert empty["lastCheckpointRestoreTimestamp"] == -1 and empty["numberOfInProgressCheckpoints"] == 1
    body = folded().checkpointing_statistics()
    values = checkpoint_gauge_values(body)
    assert values["lastCheckpointDuration"] == 40 and values["lastCheckpointSize"] == 100
    assert values["lastCompletedCheckpointId"] == 1 and values["lastCheckpointCompletedTimestamp"] == 1040
    assert values["numberOfCompletedCheckpoints"] == 2 and values["numberOfFailedCheckpoints"] == 1
    assert values["totalNumberOfCheckpoints"] == 4


def test_job_list_summary_reads_a_restart_after_suspended_as_running():
    """`chandy job list` and `GET /jobs` agree: a status holds until a later coordinator epoch speaks."""
    from chandy.coordinator.kafka.requests import JobSummary

    def status_change(status: str, epoch: int, at: int) -> CheckpointEvent:
        return CheckpointEvent(job_id=JOB, checkpoint_id=2, event_type="JOB_STATUS_CHANGED", checkpoint_type="CHECKPOINT",
                               epoch=epoch, timestamp=at, trigger_timestamp=at, job_status=status)

    summary, view = JobSummary(JOB), JobCheckpointsView(JOB)
    first = event(1, "COMPLETED", at=1000, trigger=900)
    for e in (first, status_change("SUSPENDED", 1, 2000)):
        summary.fold(e)
        view.apply(e)
    assert summary.status == view.status == "SUSPENDED"
    # the restarted coordinator (epoch 2) answers a request before any checkpoint: running again
    answer = CheckpointEvent(job_id=JOB, checkpoint_id=0, event_type="REQUEST_FAILED", checkpoint_type="CHECKPOINT",
                             epoch=2, timestamp=3000, trigger_timestamp=3000)
    summary.fold(answer)
    view.apply(answer)
    assert summary.status == view.status == "RUNNING" and summary.epoch == 2
    summary.fold(status_change("CANCELED", 2, 4000))
    assert summary.status == "CANCELED" and summary.last_checkpoint == 1


def test_lake_commits_give_the_end_to_end_lag_and_triggers_the_job_name_config_and_vertices():
    """Issues 33 and 35: LAKE_COMMITTED gives a completed checkpoint its end-to-end lag (trigger to
    readable in the lake, ms); TRIGGERED events carry the job's name, configuration and operators,
    served as Flink's /jobs/:jobid and /jobs/:jobid/checkpoints/config."""
    from chandy.coordinator.messages import OperatorParallelism

    view = folded()
    assert view.checkpoint_config() is None and view.overview()["name"] is None
    view.apply(CheckpointEvent(**{**event(1, "LAKE_COMMITTED", at=1130, trigger=1000).__dict__,
                                  "table_uri": "file:///t", "table_version": 0}))
    view.apply(CheckpointEvent(**{**event(1, "LAKE_COMMITTED", at=1500, trigger=1000).__dict__,
                                  "table_uri": "file:///other", "table_version": 3}))  # a second table of the job
    view.apply(CheckpointEvent(**{**event(5, "TRIGGERED", at=5000, trigger=5000).__dict__, "job_name": "orders",
                                  "checkpoint_config": {"interval_ms": 1000, "timeout_ms": 60000, "min_pause_ms": 0,
                                                        "max_concurrent": 1, "tolerable_failed": 3, "num_retained": 2},
                                  "operators": (OperatorParallelism("kafka-source", 4),
                                                OperatorParallelism("lake-sink", 2))}))
    lake = view.lake_commits()
    assert [(c["id"], c["table_uri"], c["end_to_end_lag"]) for c in lake["history"]] == [
        (1, "file:///other", 500), (1, "file:///t", 130)]
    assert lake["summary"]["end_to_end_lag"]["min"] == 130 and lake["summary"]["end_to_end_lag"]["max"] == 500
    assert "end_to_end_lag" not in view.checkpointing_statistics()["summary"]  # Flink's shape stays Flink's
    assert view.overview()["name"] == "orders"
    config = view.checkpoint_config()
    assert config is not None and (config["interval"], config["timeout"], config["tolerable_failed_checkpoints"],
                                   config["num_retained"]) == (1000, 60000, 3, 2)
    details = view.job_details(now_ms=9000)
    assert (details["name"], details["state"], details["start-time"], details["duration"]) == ("orders", "RUNNING",
                                                                                               1000, 8000)
    assert [(v["id"], v["parallelism"]) for v in details["vertices"]] == [("kafka-source", 4), ("lake-sink", 2)]


def test_details_carry_one_task_checkpoint_statistics_per_operator():
    """Issue 47: Flink's ``tasks`` map (``TaskCheckpointStatistics`` per job vertex) from the
    operators a TRIGGERED event names: exact with one operator (the pipeline's lake sink), and with
    several only what the totals tell (a completed checkpoint's acknowledgements), -1 otherwise."""
    import dataclasses

    from chandy.coordinator.messages import OperatorParallelism

    view = JobCheckpointsView(JOB)
    one = (OperatorParallelism("lake-sink", 2),)
    view.apply(dataclasses.replace(event(1, "TRIGGERED", at=1000, trigger=1000), operators=one))
    view.apply(event(1, "COMPLETED", at=1040, trigger=1000, duration=40, size=100, acks=2))
    view.apply(dataclasses.replace(event(2, "TRIGGERED", at=2000, trigger=2000, acks=1), operators=one))
    task = view.checkpoint_details(1)["tasks"]["lake-sink"]
    assert task == {"id": "lake-sink", "status": "COMPLETED", "latest_ack_timestamp": 1040, "checkpointed_size": 100,
                    "state_size": 100, "end_to_end_duration": 40, "alignment_buffered": 0, "processed_data": 0,
                    "persisted_data": 0, "num_subtasks": 2, "num_acknowledged_subtasks": 2}
    pending = view.checkpoint_details(2)["tasks"]["lake-sink"]
    assert (pending["status"], pending["num_acknowledged_subtasks"]) == ("IN_PROGRESS", 1)
    two = (OperatorParallelism("kafka-source", 1), OperatorParallelism("lake-sink", 2))
    view.apply(dataclasses.replace(event(3, "TRIGGERED", at=3000, trigger=3000), operators=two))
    view.apply(event(3, "COMPLETED", at=3050, trigger=3000, duration=50, size=10, acks=3))
    tasks = view.checkpoint_details(3)["tasks"]
    assert {k: (t["num_subtasks"], t["num_acknowledged_subtasks"], t["state_size"]) for k, t in tasks.items()} == {
        "kafka-source": (1, 1, -1), "lake-sink": (2, 2, -1)}
    assert folded().checkpoint_details(1)["tasks"] == {}  # no TRIGGERED event named operators

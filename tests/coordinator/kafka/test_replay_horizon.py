"""Issue 35: a replay knows how far back its compacted log remembers. Runs of the real coordinator
(as the event-sourcing property does) produce a log; Kafka's log cleaner is simulated on it (below
a cleaner point, a record goes when a later record of its key exists; below a purge point, a
deletion marker goes too); then for every checkpoint, a replay of the compacted log either is
refused naming the horizon, or equals the replay of the whole log at the same point. No broker:
the integration test in tests/pipeline compacts a real topic."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chandy.coordinator.kafka.log import LoggedRecord
from chandy.coordinator.kafka.replay import HistoryCompactedError, history_horizon, replay
from chandy.coordinator.messages import DeclineCheckpoint
from chandy.coordinator.records import CheckpointRecord, CoordinatorEpochRecord, LogKey, Tombstone
from chandy.coordinator.state import replay as fold
from tests.fixtures.coordinator import JOB, OPERATORS, ack, make
from tests.fixtures.manual_env import ManualEnvironment

SUBTASKS = [(op, i) for op, n in OPERATORS.items() for i in range(n)]

operation = st.one_of(
    st.just(("checkpoint",)),  # triggered and acknowledged by every subtask
    st.just(("trigger",)),
    st.tuples(st.just("decline"), st.integers(0, 8)),
    st.just(("restart",)),
)


def run_log(tmp: Path, operations: list) -> list:
    """The log records of a coordinator driven through ``operations`` (restarts replay the log)."""
    config = {"timeout_ms": 300, "max_concurrent": 2, "num_retained": 1, "tolerable_failed": 100}
    cc, env, _ = make(tmp, **config)
    for op in operations:
        if op[0] in ("checkpoint", "trigger"):
            result = cc.trigger_checkpoint(forced=True)
            env.run()
            if op[0] == "checkpoint" and result.checkpoint_id is not None:
                for name, index in SUBTASKS:
                    ack(cc, result.checkpoint_id, name, index)
        elif op[0] == "decline" and cc.pending:
            ids = sorted(cc.pending)
            cc.receive_decline(DeclineCheckpoint(JOB, cc.epoch, ids[op[1] % len(ids)], *SUBTASKS[0], 0,
                                                 "CHECKPOINT_DECLINED"))
        elif op[0] == "restart":
            fresh = ManualEnvironment(start_ms=env.now)
            fresh.log = list(env.log)
            cc, env, _ = make(tmp, env=fresh, state=fold(JOB, env.log), **config)
        env.run()
        env.advance(10)
    return list(env.log)


def as_logged(records: list, *, versions: bool = True) -> list[LoggedRecord]:
    """The records as a Kafka partition holds them: offsets, times, and key versions assigned as
    :class:`~chandy.coordinator.kafka.log_writer.LogWriter` assigns them (None: a log written
    before the header)."""
    next_version: dict[LogKey, int] = {}
    logged = []
    for offset, record in enumerate(records):
        key = record.key()
        version = next_version.get(key, 0)
        next_version[key] = version + 1
        logged.append(LoggedRecord(record, 0, offset, 1_000_000 + 10 * offset, version if versions else None))
    return logged


def compact(logged: list[LoggedRecord], cleaner_point: int, purge_point: int) -> list[LoggedRecord]:
    """Kafka's cleaner: below ``cleaner_point`` a record whose key has a later record goes; below
    ``purge_point`` (<= the cleaner point) a deletion marker goes as well. The log's last record
    is in the active segment, which Kafka's cleaner never cleans, so both points stop before it."""
    cleaner_point = min(cleaner_point, len(logged) - 1)
    purge_point = min(purge_point, cleaner_point)
    last = {item.record.key(): item.offset for item in logged}
    return [item for item in logged
            if not (item.offset < cleaner_point and last[item.record.key()] > item.offset)
            and not (item.offset < purge_point and isinstance(item.record, Tombstone))]


def _state(result, job: str = JOB):
    state = result.states.get(job)
    return None if state is None else (state.epoch, state.job_status, state.next_checkpoint_id,
                                       state.continuous_failures, state.last_succeeded_checkpoint_id,
                                       dict(state.checkpoints), state.extensions)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=st.lists(operation, min_size=3, max_size=30), cut=st.floats(0, 1), purge=st.floats(0, 1),
       versions=st.booleans())
def test_a_compacted_replay_is_refused_before_its_horizon_and_exact_after_it(operations, cut, purge, versions) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        records = run_log(Path(tmp), operations)
    whole = as_logged(records, versions=versions)
    cleaner_point = int(cut * len(whole))
    compacted = compact(whole, cleaner_point, int(purge * cleaner_point))
    horizon = history_horizon(compacted).get(JOB)
    # the live state is exact whatever was compacted
    assert _state(replay(compacted)) == _state(replay(whole))
    if len(compacted) == len(whole):
        assert horizon is None  # nothing was compacted: nothing refused
    last_checkpoint = max((r.checkpoint_id for r in records if isinstance(r, CheckpointRecord)), default=0)
    for n in range(0, last_checkpoint + 1):
        try:
            result = replay(compacted, until_checkpoint=n)
        except HistoryCompactedError as exc:
            assert horizon is not None and n < horizon.checkpoint_id
            assert f"--until-checkpoint {horizon.checkpoint_id}" in str(exc)
            continue
        assert horizon is None or n >= horizon.checkpoint_id
        assert _state(result) == _state(replay(whole, until_checkpoint=n)), f"until checkpoint {n}"
    for item in whole:  # and by time, at every record's time
        try:
            result = replay(compacted, until_ms=item.timestamp_ms)
        except HistoryCompactedError:
            assert horizon is not None and item.timestamp_ms < horizon.timestamp_ms
            continue
        assert _state(result) == _state(replay(whole, until_ms=item.timestamp_ms)), f"until {item.timestamp_ms}"


def test_the_issues_example_a_compacted_restart_is_refused_not_shown_as_a_job_that_never_ran(tmp_path) -> None:
    """Issue 35: after compaction, `--until-checkpoint 2` showed "epoch 0, job CREATED, next
    checkpoint 1, completed []". Now: refused, naming the checkpoint and time replays are exact from."""
    records = run_log(tmp_path, [("checkpoint",)] * 3 + [("restart",)] + [("checkpoint",)] * 3)
    whole = as_logged(records)
    compacted = compact(whole, len(whole) - 1, 0)
    assert len(compacted) < len(whole)
    with pytest.raises(HistoryCompactedError, match=r"--until-checkpoint 2 is before the history horizon: .*"
                                                    r"exact from checkpoint \d+ \(--until-checkpoint \d+\)"):
        replay(compacted, until_checkpoint=2)
    horizon = history_horizon(compacted)[JOB]
    exact = replay(compacted, until_checkpoint=horizon.checkpoint_id)
    assert _state(exact) == _state(replay(whole, until_checkpoint=horizon.checkpoint_id))
    assert exact.states[JOB].epoch == 2 and exact.states[JOB].job_status == "RUNNING"


def test_a_whole_log_has_no_horizon_and_an_old_log_without_headers_is_judged_by_its_records(tmp_path) -> None:
    records = run_log(tmp_path, [("checkpoint",)] * 2 + [("restart",)] + [("checkpoint",)] * 2)
    assert history_horizon(as_logged(records)) == {}
    assert history_horizon(as_logged(records, versions=False)) == {}
    # without headers, an epoch above 1, a checkpoint first seen completed or a counter past 2 says
    # it was compacted; the horizon lies at or after the restart (epoch 2's record)
    legacy = compact(as_logged(records, versions=False), len(records), 0)
    horizon = history_horizon(legacy)[JOB]
    restart = next(r.offset for r in legacy if isinstance(r.record, CoordinatorEpochRecord))
    assert horizon.offset >= restart and horizon.checkpoint_id >= 2
    with pytest.raises(HistoryCompactedError):
        replay(legacy, until_checkpoint=1)


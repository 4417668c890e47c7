"""The event-sourcing property: for any sequence of operations, replaying the log rebuilds
exactly the state the live coordinator holds (``replay(log) == live state``), also across
restarts, and checkpoint IDs are never reused."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chandy.coordinator.completed_checkpoint_store import CompletedCheckpointStore
from chandy.coordinator.messages import (
    DeclineCheckpoint,
    NotifyCheckpointComplete,
    SubtaskAttemptReady,
)
from chandy.coordinator.records import CheckpointRecord
from chandy.coordinator.state import replay
from chandy.schemas.codec import SingleObjectCodec
from tests.fixtures.coordinator import JOB, OPERATORS, ack, make
from tests.fixtures.manual_env import ManualEnvironment

SUBTASKS = [(op, i) for op, n in OPERATORS.items() for i in range(n)]

operation = st.one_of(
    st.tuples(st.just("trigger"), st.booleans()),
    st.tuples(st.just("savepoint"), st.booleans()),
    st.tuples(st.just("ack"), st.integers(0, 8), st.sampled_from(SUBTASKS), st.integers(0, 2)),
    st.tuples(st.just("decline"), st.integers(0, 8), st.sampled_from(SUBTASKS)),
    st.tuples(st.just("ready"), st.sampled_from(SUBTASKS), st.integers(0, 2)),
    st.tuples(st.just("advance"), st.integers(1, 400)),
    st.tuples(st.just("restart")),
    st.tuples(st.just("periodic"), st.booleans()),
)

#: option sets the property runs under: concurrent checkpoints, and a min pause (one at a time,
#: periodic requests wait for the pause, user requests do not)
CONFIGS = [
    {"timeout_ms": 300, "max_concurrent": 3, "num_retained": 2, "tolerable_failed": 1},
    {"timeout_ms": 300, "max_concurrent": 2, "num_retained": 1, "tolerable_failed": 2, "interval_ms": 100,
     "min_pause_ms": 50, "random_initial_delay": False},
]


def _run(tmp: Path, operations: list, config: dict | None = None) -> None:
    config = config or CONFIGS[0]
    cc, env, _ = make(tmp, **config)
    for op in operations:
        kind = op[0]
        if kind == "trigger":
            cc.trigger_checkpoint(forced=op[1])
        elif kind == "savepoint":
            cc.trigger_savepoint(terminate=op[1])
        elif kind == "ack":
            ids = sorted(cc.pending) or [cc.state.next_checkpoint_id - 1]
            ack(cc, ids[op[1] % len(ids)], op[2][0], op[2][1], attempt=op[3])
        elif kind == "decline":
            ids = sorted(cc.pending) or [1]
            cc.receive_decline(DeclineCheckpoint(JOB, cc.epoch, ids[op[1] % len(ids)], op[2][0], op[2][1], 0,
                                                  "CHECKPOINT_DECLINED"))
        elif kind == "ready":
            cc.attempt_ready(SubtaskAttemptReady(JOB, op[1][0], op[1][1], op[2]))
        elif kind == "advance":
            env.advance(op[1])
        elif kind == "restart":
            # a new coordinator process: its state comes from the log alone
            fresh = ManualEnvironment(start_ms=env.now)
            fresh.log = list(env.log)
            cc, env, _ = make(tmp, env=fresh, state=replay(JOB, env.log), **config)
            # what it restored is the latest completed checkpoint, never an intermediate savepoint
            restored = [m.checkpoint_id for m in env.control_of(NotifyCheckpointComplete)]
            latest = CompletedCheckpointStore.latest(cc.state)
            assert restored == ([latest.checkpoint_id] if latest else [])
        elif kind == "periodic":
            if op[1]:
                cc.start_periodic_scheduler()
            else:
                cc.stop_periodic_scheduler()
        env.run()
        assert replay(JOB, env.log) == cc.state
        # an intermediate savepoint notifies no one of its completion (FLINK-25191)
        assert all(m.checkpoint_type != "SAVEPOINT" for m in env.control_of(NotifyCheckpointComplete))
    # IDs strictly increase in the log, and no ID is triggered twice
    triggered = [r.checkpoint_id for r in env.log if isinstance(r, CheckpointRecord) and r.status == "PENDING"]
    assert triggered == sorted(set(triggered))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=st.lists(operation, max_size=40), config=st.sampled_from(CONFIGS))
def test_replaying_the_log_rebuilds_the_live_state(operations: list, config: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        _run(Path(tmp), operations, config)


@settings(max_examples=30, deadline=None)
@given(operations=st.lists(operation, max_size=25))
def test_log_records_survive_the_wire_format(operations: list) -> None:
    """Every record a run produces encodes and decodes back equal through the Avro codec."""
    from chandy.coordinator.records import Tombstone, record_type_for

    codec = SingleObjectCodec()
    with tempfile.TemporaryDirectory() as tmp:
        cc, env, _ = make(Path(tmp), timeout_ms=300, max_concurrent=3)
        for op in operations:
            if op[0] == "trigger":
                cc.trigger_checkpoint(forced=op[1])
            elif op[0] == "ack" and cc.pending:
                ids = sorted(cc.pending)
                ack(cc, ids[op[1] % len(ids)], op[2][0], op[2][1], attempt=op[3])
            elif op[0] == "advance":
                env.advance(op[1])
            env.run()
        for record in env.log:
            if isinstance(record, Tombstone):
                continue
            decoded = codec.decode(codec.encode(record.SCHEMA, record.to_avro()))
            record_type = record_type_for(decoded.name)
            assert record_type is not None and record_type.from_avro(decoded.value) == record

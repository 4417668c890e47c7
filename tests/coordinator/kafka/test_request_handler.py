"""Control requests on the pure coordinator (a manual environment, no Kafka): at most once through
the log, and request records that do not outlive their retention."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

from chandy.coordinator.kafka.requests import (
    ControlRequest,
    ControlRequestType,
    RequestHandler,
    RequestOutcome,
    RequestRecord,
    RequestStatus,
)
from chandy.coordinator.records import Tombstone
from tests.fixtures.coordinator import JOB, make

HOUR_MS = 60 * 60 * 1000


def test_a_request_is_applied_once_and_its_record_expires_after_the_retention(tmp_path: Path) -> None:
    cc, env, _ = make(tmp_path)
    applied: list[str] = []

    def executor(request: ControlRequest) -> concurrent.futures.Future:
        applied.append(request.request_id)
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result(RequestOutcome(7, "file:///sp/savepoint-7"))
        return done

    handler = RequestHandler(cc, env.execute, executor, retention_ms=HOUR_MS)

    def send(request_id: str) -> None:
        handler.submit(ControlRequest(request_id, JOB, ControlRequestType.TRIGGER_SAVEPOINT, timestamp=env.now,
                                      deadline=env.now + 2 * HOUR_MS))
        env.run()

    send("a")
    send("a")  # sent again: answered from its record, not applied again
    assert applied == ["a"]
    records = cc.state.records_of(RequestRecord.KIND)
    assert records["a"].status is RequestStatus.COMPLETED and records["a"].checkpoint_id == 7
    answers = [e.event_type for e in env.events if e.request_id == "a"]
    assert answers == ["REQUEST_ACCEPTED", "REQUEST_COMPLETED", "REQUEST_COMPLETED"]

    env.advance(HOUR_MS + 1)
    send("b")  # b's outcome tombstones a, whose record is past its retention
    assert sorted(cc.state.records_of(RequestRecord.KIND)) == ["b"]
    assert any(isinstance(r, Tombstone) and r.key().entity_id == "a" for r in env.log)
    assert applied == ["a", "b"]

"""The pipeline driver loop's choice of the next control request, without Spark or Kafka: a
cancel overtakes a draining stop-with-savepoint, and a request that waited past its deadline
fails unapplied (its sender gave up)."""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

import pytest

from chandy.connectors.spark.options import PipelineError, PipelineOptions
from chandy.connectors.spark.pipeline import Pipeline
from chandy.coordinator.kafka.requests import ControlRequest, ControlRequestType


def request(kind: ControlRequestType, request_id: str, *, deadline_in_ms: int = 60_000, drain: bool = False) -> ControlRequest:
    now = int(time.time() * 1000)
    return ControlRequest(request_id, "job", kind, drain=drain, timestamp=now, deadline=now + deadline_in_ms)


@pytest.fixture
def pipeline(tmp_path: Path) -> Pipeline:
    return Pipeline(PipelineOptions(table_uri=str(tmp_path / "table"), bootstrap_servers="localhost:1", topics=("t",)))


def test_a_cancel_overtakes_a_draining_stop_with_savepoint(pipeline: Pipeline) -> None:
    stop = pipeline._execute_request(request(ControlRequestType.STOP_WITH_SAVEPOINT, "stop", drain=True))
    taken = pipeline._next_request()
    assert taken is not None and taken[0].request_id == "stop"
    pipeline._draining = taken  # the loop lands what is available first (Flink's --drain)
    checkpoint = pipeline._execute_request(request(ControlRequestType.TRIGGER_CHECKPOINT, "checkpoint"))
    cancel = pipeline._execute_request(request(ControlRequestType.CANCEL, "cancel"))
    taken = pipeline._next_request()
    assert taken is not None and taken[0].request_id == "cancel" and taken[1] is cancel
    with pytest.raises(PipelineError, match="canceled by request cancel while draining"):
        stop.result(0)
    # the request queued before the cancel is still there, in order, for the loop's cleanup
    taken = pipeline._next_request()
    assert taken is not None and taken[1] is checkpoint and pipeline._next_request() is None


def test_without_a_cancel_the_drain_goes_on_and_the_queue_keeps_its_order(pipeline: Pipeline) -> None:
    first = pipeline._execute_request(request(ControlRequestType.TRIGGER_CHECKPOINT, "a"))
    second = pipeline._execute_request(request(ControlRequestType.TRIGGER_SAVEPOINT, "b"))
    draining = (request(ControlRequestType.STOP_WITH_SAVEPOINT, "stop", drain=True), concurrent.futures.Future())
    pipeline._draining = draining
    assert pipeline._next_request() is draining
    taken = [pipeline._next_request(), pipeline._next_request()]
    assert [t[1] if t else None for t in taken] == [first, second] and not draining[1].done()


def test_a_request_that_waited_past_its_deadline_fails_unapplied(pipeline: Pipeline) -> None:
    expired = pipeline._execute_request(request(ControlRequestType.TRIGGER_SAVEPOINT, "late", deadline_in_ms=-5))
    fresh = pipeline._execute_request(request(ControlRequestType.TRIGGER_CHECKPOINT, "fresh"))
    taken = pipeline._next_request()
    assert taken is not None and taken[1] is fresh
    with pytest.raises(PipelineError, match="before the pipeline could apply it: not applied"):
        expired.result(0)

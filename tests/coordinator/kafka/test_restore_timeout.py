"""Issue 44, item 7: a restore is not bounded by the start's Kafka timeout. The coordinator's
start runs the restore (every operator coordinator's ``reset_to_checkpoint``, every hook's
``reset``), which on a large table takes as long as the table needs; ``start`` waits for it
without a bound by default, saying every ``RESTORE_PROGRESS_INTERVAL_S`` what it is doing, and
with ``restore_timeout_s`` a restore that outlasts it is a ``RestoreTimeoutError`` (a ChandyError)
naming what was slow, after which the service is stopped. Real broker, a master hook whose
``reset`` is slow."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import pytest

from chandy.coordinator.errors import ChandyError
from chandy.coordinator.kafka import runtime
from chandy.coordinator.kafka.runtime import CoordinatorService, RestoreTimeoutError
from tests.fixtures.workers import options
from tests.procs.common import RecordingHook

pytestmark = pytest.mark.integration


class SlowHook(RecordingHook):
    """A master hook whose ``reset`` (the restore of a job with no checkpoint) takes
    ``seconds``; ``done`` is set when it returns."""

    def __init__(self, seconds: float) -> None:
        super().__init__("slow-hook")
        self.seconds = seconds
        self.done = threading.Event()

    def reset(self) -> None:
        time.sleep(self.seconds)
        super().reset()
        self.done.set()


@pytest.fixture
def job() -> str:
    return uuid.uuid4().hex


def test_a_restore_longer_than_the_start_timeout_completes_and_says_what_it_is_doing(
        kafka_bootstrap_servers, topic_prefix, job, tmp_path, monkeypatch, caplog) -> None:
    """Before: ``started.result(timeout_s)`` raised a bare TimeoutError after ``timeout_s``."""
    monkeypatch.setattr(runtime, "RESTORE_PROGRESS_INTERVAL_S", 1.0)
    hook = SlowHook(seconds=7.0)
    service = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path, wait_for_running_subtasks=False), {"src": 1}, master_hooks=[hook],
                                 prefix=topic_prefix, accept_requests=False)
    with caplog.at_level(logging.INFO, logger=runtime.__name__):
        began = time.monotonic()
        service.start(periodic=False, timeout_s=4.0)
    try:
        assert time.monotonic() - began >= 7.0 and hook.resets == 1
        progress = [r.getMessage() for r in caplog.records if "has run" in r.getMessage()]
        assert progress, "no progress line while the restore ran"
        assert "SlowHook.reset" in progress[-1], progress[-1]
        assert not service.stopped.is_set()
        assert service.trigger_checkpoint().checkpoint_id == 1  # it runs
    finally:
        service.stop()


def test_a_restore_past_its_restore_timeout_is_a_chandy_error_naming_it_and_the_service_stops(
        kafka_bootstrap_servers, topic_prefix, job, tmp_path) -> None:
    hook = SlowHook(seconds=6.0)
    service = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path, wait_for_running_subtasks=False), {"src": 1}, master_hooks=[hook],
                                 prefix=topic_prefix, accept_requests=False)
    began = time.monotonic()
    with pytest.raises(RestoreTimeoutError, match=r"did not finish within 2 s; it was in .*SlowHook\.reset") as raised:
        service.start(periodic=False, timeout_s=30.0, restore_timeout_s=2.0)
    assert isinstance(raised.value, ChandyError)
    assert time.monotonic() - began < 6.0, "it waited for the restore"
    assert service.stopped.is_set() and service.stop_reason is raised.value
    service.stop()  # a no-op on a stopped service
    assert hook.done.wait(10)  # the restore itself ended in the background, and nothing failed
    # the job starts again (and fences the stopped one, which writes nothing more)
    again = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path, wait_for_running_subtasks=False), {"src": 1},
                               master_hooks=[RecordingHook()], prefix=topic_prefix, accept_requests=False)
    again.start(periodic=False)
    try:
        assert again.trigger_checkpoint().checkpoint_id == 1
    finally:
        again.stop()

"""The pipeline's request executor: control requests (trigger a checkpoint or a savepoint, stop
with a savepoint, cancel) that the coordinator hands to the driver loop, applied between
micro-batches in arrival order (:mod:`chandy.coordinator.kafka.requests`)."""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import time
from typing import Any

from chandy.connectors.spark.driver_core import PipelineCore
from chandy.connectors.spark.options import (
    PipelineError,
)
from chandy.coordinator.kafka.requests import ControlRequest, ControlRequestType, RequestOutcome

log = logging.getLogger(__name__)


class PipelineRequestExecutor(PipelineCore):
    """The request executor part of :class:`~chandy.connectors.spark.pipeline.Pipeline`."""

    def _execute_request(self, request: ControlRequest) -> concurrent.futures.Future:
        """The coordinator's request executor (mailbox thread): queue the request for the driver
        loop, which runs the micro-batch of the checkpoint or savepoint it asks for."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._requests.put((request, future))
        self._wake.set()
        return future

    def _next_request(self) -> tuple[ControlRequest, concurrent.futures.Future] | None:
        """The next control request for the driver loop (driver thread only).

        A queued CANCEL overtakes everything, a stop-with-savepoint that is draining included
        (its request fails: the job is canceled instead, as Flink's cancel ends a draining job).
        Then the draining request, then the queue in order; a queued request whose deadline
        passed before the loop got to it fails unapplied (its sender has given up waiting)."""
        while True:
            try:
                self._backlog.append(self._requests.get_nowait())
            except queue.Empty:
                break
        cancel = next((r for r in self._backlog if r[0].request_type is ControlRequestType.CANCEL), None)
        if cancel is not None:
            self._backlog.remove(cancel)
            if self._draining is not None:
                self._fail_request(self._draining, PipelineError(
                    f"canceled by request {cancel[0].request_id} while draining; no savepoint was taken"))
                self._draining = None
            return cancel
        if self._draining is not None:
            request, self._draining = self._draining, None
            return request
        while self._backlog:
            request = self._backlog.popleft()
            now = int(time.time() * 1000)
            if request[0].deadline and now > request[0].deadline:
                self._fail_request(request, PipelineError(
                    f"expired {now - request[0].deadline} ms before the pipeline could apply it: not applied"))
                continue
            return request
        return None

    def _idle(self, seconds: float) -> None:
        """Wait up to ``seconds``, less when a stop or a control request arrives."""
        deadline = time.monotonic() + seconds
        while not self._stop.is_set() and not self._wake.is_set() and time.monotonic() < deadline:
            self._wake.wait(min(0.05, max(0.0, deadline - time.monotonic())))
        self._wake.clear()

    def _trigger_for(self, request: tuple[ControlRequest, concurrent.futures.Future] | None) -> Any:
        """The trigger of this round: a checkpoint, or what a control request asks for."""
        assert self.service is not None
        if request is None:
            return self.service.trigger_checkpoint()
        kind, target = request[0].request_type, request[0].target_directory
        if kind is ControlRequestType.TRIGGER_SAVEPOINT:
            return self.service.trigger_savepoint(target)
        if kind is ControlRequestType.STOP_WITH_SAVEPOINT:
            return self.service.trigger_savepoint(target, terminate=True)
        return self.service.trigger_checkpoint(forced=True)

    def _cancel(self, request: tuple[ControlRequest, concurrent.futures.Future]) -> None:
        """Cancel the job (Flink's ``JobMaster.cancel``): no savepoint, nothing more lands."""
        assert self.service is not None
        try:
            self.service.cancel_job(f"canceled by request {request[0].request_id}").result(30)
            request[1].set_result(RequestOutcome())
        except Exception as exc:  # noqa: BLE001 - the request's answer says why
            request[1].set_exception(exc)

    @staticmethod
    def _fail_request(request: tuple[ControlRequest, concurrent.futures.Future] | None, exc: BaseException) -> None:
        if request is not None and not request[1].done():
            request[1].set_exception(exc)

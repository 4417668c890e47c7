"""The pipeline's control requests (trigger a checkpoint or a savepoint, stop with a savepoint,
cancel; :mod:`chandy.coordinator.kafka.requests`): the coordinator hands each accepted request to
:meth:`RequestExecutor.execute`, and the driver loop applies them between micro-batches, in
arrival order, as Flink's JobMaster applies a REST request to its running job."""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import queue
import time
from typing import Any

from chandy.connectors.spark.driver.state import DriverState
from chandy.connectors.spark.options import PipelineError
from chandy.coordinator.kafka.requests import ControlRequest, ControlRequestType, RequestOutcome

log = logging.getLogger(__name__)

#: a control request and the future that answers its sender (a :class:`RequestOutcome` or an error)
Request = tuple[ControlRequest, concurrent.futures.Future]


def fail_request(request: Request | None, exc: BaseException) -> None:
    """Answer ``request`` (if any, and not answered yet) with ``exc``: it was not applied."""
    if request is not None and not request[1].done():
        request[1].set_exception(exc)


class RequestExecutor:
    """The control requests of one run: queued by the coordinator's mailbox thread, taken and
    applied by the driver thread (see the module docstring)."""

    def __init__(self, state: DriverState) -> None:
        self.state = state
        self._queue: queue.Queue[Request] = queue.Queue()
        #: requests taken off the queue by the driver loop, in arrival order (driver thread only)
        self._backlog: collections.deque[Request] = collections.deque()
        #: a stop-with-savepoint with ``drain`` whose savepoint waits until what is available landed
        #: (Flink's ``--drain``); the driver loop sets it, :meth:`next_request` hands it back
        self.draining: Request | None = None

    def execute(self, request: ControlRequest) -> concurrent.futures.Future:
        """The coordinator's request executor (mailbox thread): queue the request for the driver
        loop, which runs the micro-batch of the checkpoint or savepoint it asks for, and wake the
        loop if it idles. Returns the future the loop answers."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((request, future))
        self.state.wake.set()
        return future

    def next_request(self) -> Request | None:
        """The next control request for the driver loop (driver thread only).

        A queued CANCEL overtakes everything, a stop-with-savepoint that is draining included
        (its request fails: the job is canceled instead, as Flink's cancel ends a draining job).
        Then the draining request, then the queue in order; a queued request whose deadline
        (ms since the epoch) passed before the loop got to it fails unapplied (its sender has
        given up waiting)."""
        while True:
            try:
                self._backlog.append(self._queue.get_nowait())
            except queue.Empty:
                break
        cancel = next((r for r in self._backlog if r[0].request_type is ControlRequestType.CANCEL), None)
        if cancel is not None:
            self._backlog.remove(cancel)
            if self.draining is not None:
                fail_request(self.draining, PipelineError(
                    f"canceled by request {cancel[0].request_id} while draining; no savepoint was taken"))
                self.draining = None
            return cancel
        if self.draining is not None:
            request, self.draining = self.draining, None
            return request
        while self._backlog:
            request = self._backlog.popleft()
            now = int(time.time() * 1000)
            if request[0].deadline and now > request[0].deadline:
                fail_request(request, PipelineError(
                    f"expired {now - request[0].deadline} ms before the pipeline could apply it: not applied"))
                continue
            return request
        return None

    def fail_all(self, message: str) -> None:
        """Answer every request still queued (and a draining one) with a :class:`PipelineError`
        saying ``message``: the run ends without applying them."""
        while (queued := self.next_request()) is not None:
            fail_request(queued, PipelineError(message))

    def idle(self, seconds: float) -> None:
        """Wait up to ``seconds``, less when a stop or a control request arrives."""
        state = self.state
        deadline = time.monotonic() + seconds
        while not state.stop.is_set() and not state.wake.is_set() and time.monotonic() < deadline:
            state.wake.wait(min(0.05, max(0.0, deadline - time.monotonic())))
        state.wake.clear()

    def trigger_for(self, request: Request | None) -> Any:
        """The trigger of this round (a future of its checkpoint or savepoint, with its
        ``checkpoint_id``): a periodic checkpoint, or what a control request asks for (a forced
        checkpoint, a savepoint into the request's directory, a stop-with-savepoint)."""
        service = self.state.running()
        if request is None:
            return service.trigger_checkpoint()
        kind, target = request[0].request_type, request[0].target_directory
        if kind is ControlRequestType.TRIGGER_SAVEPOINT:
            return service.trigger_savepoint(target)
        if kind is ControlRequestType.STOP_WITH_SAVEPOINT:
            return service.trigger_savepoint(target, terminate=True)
        return service.trigger_checkpoint(forced=True)

    def cancel(self, request: Request) -> None:
        """Cancel the job (Flink's ``JobMaster.cancel``): no savepoint, nothing more lands; the
        request's answer says whether the CANCELED status was recorded (within 30 s)."""
        service = self.state.running()
        try:
            service.cancel_job(f"canceled by request {request[0].request_id}").result(30)
            request[1].set_result(RequestOutcome())
        except Exception as exc:  # noqa: BLE001 - the request's answer says why
            request[1].set_exception(exc)

"""Control requests over Kafka: trigger a checkpoint or a savepoint, stop with a savepoint, cancel.

What Flink's REST API and JobManager high availability do, with Kafka as the only server:

- **Requests** are :class:`ControlRequest` Avro messages on ``<prefix>.requests`` (one
  partition), keyed by job ID. Each carries a ``request_id``; the coordinator answers on the
  public ``<prefix>.checkpoint-events`` topic with :class:`~chandy.coordinator.messages.CheckpointEvent`
  of type ``REQUEST_ACCEPTED``, then ``REQUEST_COMPLETED`` (with the savepoint pointer) or
  ``REQUEST_FAILED`` (with the reason), carrying the same ``request_id``.
- **At most once.** Before a request is applied, a :class:`RequestRecord` (log kind ``request``,
  entity the request ID) with status ACCEPTED is committed to the coordinator log; its outcome is
  committed later with the answer, in one transaction. A request sent twice is answered again
  from the log, never applied twice; a request that was ACCEPTED by a coordinator that died
  before its outcome is answered FAILED by the next one (never re-applied). A request past its
  ``deadline`` (the sender's timeout) is skipped unapplied, so one sent while no coordinator ran
  does not fire later, and a new leader that reads the topic again from its last committed
  position applies nothing old.
- **Election**: the leader of a job is the member of its election group that owns the requests
  partition (:mod:`chandy.coordinator.kafka.election`); only the leader reads requests.

The client side (:func:`send_request`) is what ``chandy checkpoint trigger``, ``chandy savepoint
trigger``, ``chandy job stop`` and ``chandy job cancel`` call.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from confluent_kafka import TopicPartition

from chandy.coordinator.checkpoint_view import job_status
from chandy.coordinator.environment import Batch
from chandy.coordinator.errors import ChandyError
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.control_request import ControlRequest, ControlRequestType, RequestStatus
from chandy.coordinator.kafka.election import (
    ELECTION_SESSION_TIMEOUT_MS,
    LeaderElection,
    active_members,
    coordinator_running,
    election_group,
    group_has_members,
)
from chandy.coordinator.kafka.topics import ChandyTopics, watermark_offsets
from chandy.coordinator.messages import CheckpointEvent
from chandy.coordinator.records import (
    CheckpointRecord,
    CheckpointType,
    JobStatus,
    LogRecordBase,
    Tombstone,
    register_record_kind,
)
from chandy.schemas.codec import SingleObjectCodec, WireFormatError, location_of

#: the election's names stay importable from here, where they were defined
__all__ = ["ELECTION_SESSION_TIMEOUT_MS", "ControlRequest", "ControlRequestType", "JobNotRunningError", "JobSummary",
           "LeaderElection", "RequestError", "RequestHandler", "RequestOutcome", "RequestRecord", "RequestStatus",
           "RequestTimeoutError", "active_members", "coordinator_running", "election_group", "group_has_members",
           "list_jobs", "send_request"]

log = logging.getLogger(__name__)

#: Default time (ms) a request stays applicable after it was sent.
DEFAULT_REQUEST_TIMEOUT_MS = 60_000


class RequestError(ChandyError):
    """A control request could not be sent, was refused, failed, or got no answer in time."""


class JobNotRunningError(RequestError):
    """No coordinator of the job is running (its election group has no member)."""


class RequestTimeoutError(RequestError):
    """No answer to a control request within the timeout."""


@dataclasses.dataclass(frozen=True)
class RequestRecord(LogRecordBase):
    """A request the coordinator accepted, and later its outcome (log kind ``request``)."""

    SCHEMA: ClassVar[str] = "chandy.v1.RequestRecord"
    KIND: ClassVar[str] = "request"

    job_id: str
    request_id: str
    request_type: ControlRequestType
    status: RequestStatus
    epoch: int
    checkpoint_id: int | None = None
    external_pointer: str | None = None
    failure_message: str | None = None
    timestamp: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "request_type", ControlRequestType(self.request_type))
        object.__setattr__(self, "status", RequestStatus(self.status))

    @property
    def entity_id(self) -> str:
        return self.request_id


def _describe(r: RequestRecord) -> dict[str, Any]:
    return {"event": f"request_{r.status.value.lower()}", "request_id": r.request_id,
            "request_type": r.request_type.value, "checkpoint_id": r.checkpoint_id,
            "external_pointer": r.external_pointer, "message": r.failure_message}


register_record_kind(RequestRecord, describe=_describe)


@dataclasses.dataclass(frozen=True)
class RequestOutcome:
    """What applying a request produced: the checkpoint it took (if any) and its pointer."""

    checkpoint_id: int | None = None
    external_pointer: str | None = None


RequestExecutor = Callable[[ControlRequest], "concurrent.futures.Future[RequestOutcome]"]
"""Applies an accepted request on the coordinator's mailbox thread and returns a future of its
outcome (an exception: the request failed, its message is the reason)."""


def outcome_of(result: Any) -> RequestOutcome:
    """A :class:`RequestOutcome` from what a checkpoint future gives (a CheckpointRecord)."""
    if isinstance(result, CheckpointRecord):
        return RequestOutcome(result.checkpoint_id, result.external_pointer)
    if isinstance(result, RequestOutcome):
        return result
    return RequestOutcome()



#: default retention of a request's record in the coordinator log (ms): 24 h
REQUEST_RETENTION_MS = 24 * 60 * 60 * 1000


class RequestHandler:
    """Applies requests at most once on a running coordinator (see the module docstring).

    Args:
        coordinator: the job's :class:`~chandy.coordinator.checkpoint_coordinator.CheckpointCoordinator`.
        execute_on_mailbox: runs a callable on the coordinator's mailbox thread.
        executor: applies an accepted request (default :func:`default_executor`).
        retention_ms: how long a request's record stays in the log after its last change (ms,
            default 24 h). A request sent again within this time is answered from its record; one
            sent again later is a new request, unless its deadline has passed (then it is skipped
            as expired), so only a sender whose timeout exceeds this could see it applied twice.
            Each outcome written tombstones the records past their retention, so the log keeps
            the requests of the last ``retention_ms`` only (as Kafka expires idle transactional
            IDs after ``transactional.id.expiration.ms``).
    """

    def __init__(self, coordinator: Any, execute_on_mailbox: Callable[[Callable[[], None]], None],
                 executor: RequestExecutor | None = None, *, retention_ms: int = REQUEST_RETENTION_MS) -> None:
        self.coordinator = coordinator
        self.execute_on_mailbox = execute_on_mailbox
        self.executor = executor or default_executor(coordinator)
        self.retention_ms = retention_ms
        self.in_flight: set[str] = set()
        self.applied = 0
        self.answered_again = 0
        self.expired = 0

    def submit(self, request: ControlRequest) -> None:
        """Hand ``request`` to the mailbox (any thread)."""
        self.execute_on_mailbox(lambda: self._on_request(request))

    # mailbox thread from here on
    def _on_request(self, request: ControlRequest) -> None:
        cc = self.coordinator
        now = cc.env.now_ms()
        if request.deadline and now > request.deadline:
            # nobody waits for an answer any more (the client gave up at the deadline): not applied,
            # not answered, not recorded. This is also every old request a new leader reads again.
            self.expired += 1
            log.info("request %s (%s) expired %d ms ago: not applied", request.request_id, request.request_type.value,
                     now - request.deadline)
            return
        known = cc.state.records_of(RequestRecord.KIND).get(request.request_id)
        if known is not None:
            self._answer_known(request, known, now)
            return
        refusal = self._refusal(request, now)
        if refusal is not None:
            self._finish(request, None, refusal)
            return
        accepted = RequestRecord(cc.job_id, request.request_id, request.request_type, RequestStatus.ACCEPTED,
                                 cc.state.epoch, timestamp=now)
        self.in_flight.add(request.request_id)
        cc.commit_batch(Batch(records=[accepted], events=[self._event(request, "REQUEST_ACCEPTED", now)]),
                        lambda: self._apply(request))

    def _refusal(self, request: ControlRequest, now: int) -> str | None:
        cc = self.coordinator
        if request.request_type is ControlRequestType.UNKNOWN:
            return "unknown request type (sent by a newer Chandy?)"
        if request.savepoint_format not in (None, "CANONICAL"):
            return f"savepoint format {request.savepoint_format} is not supported (Chandy writes CANONICAL only)"
        if cc.state.job_status is not JobStatus.RUNNING:
            return f"job {cc.job_id} is {cc.state.job_status.value}, not RUNNING"
        return None

    def _answer_known(self, request: ControlRequest, known: RequestRecord, now: int) -> None:
        self.answered_again += 1
        if known.status is RequestStatus.ACCEPTED:
            if request.request_id in self.in_flight:
                log.info("request %s sent again while in progress: applied once", request.request_id)
                return
            # accepted by an earlier coordinator that stopped before its outcome: never applied again
            self._finish(request, None, f"interrupted: the coordinator of epoch {known.epoch} stopped while "
                                        "applying it; it is not applied again")
            return
        event_type = "REQUEST_COMPLETED" if known.status is RequestStatus.COMPLETED else "REQUEST_FAILED"
        cc = self.coordinator
        cc.commit_batch(Batch(events=[self._event(request, event_type, now, checkpoint_id=known.checkpoint_id,
                                                  external_pointer=known.external_pointer,
                                                  failure_message=known.failure_message)]))

    def _apply(self, request: ControlRequest) -> None:
        try:
            future = self.executor(request)
        except Exception as exc:  # noqa: BLE001 - any failure to apply is the request's answer
            self._finish(request, None, f"{type(exc).__name__}: {exc}")
            return
        self.applied += 1

        def done(f: concurrent.futures.Future) -> None:
            exc = f.exception()
            if exc is not None:
                message = str(exc) or type(exc).__name__
                self.execute_on_mailbox(lambda: self._finish(request, None, message))
            else:
                outcome = outcome_of(f.result())
                self.execute_on_mailbox(lambda: self._finish(request, outcome, None))

        future.add_done_callback(done)

    def _finish(self, request: ControlRequest, outcome: RequestOutcome | None, failure: str | None) -> None:
        cc = self.coordinator
        now = cc.env.now_ms()
        self.in_flight.discard(request.request_id)
        status = RequestStatus.FAILED if failure is not None else RequestStatus.COMPLETED
        checkpoint_id = outcome.checkpoint_id if outcome is not None else None
        pointer = outcome.external_pointer if outcome is not None else None
        record = RequestRecord(cc.job_id, request.request_id, request.request_type, status, cc.state.epoch,
                               checkpoint_id, pointer, failure, now)
        event_type = "REQUEST_FAILED" if failure is not None else "REQUEST_COMPLETED"
        if failure is not None:
            log.warning("request %s (%s) failed: %s", request.request_id, request.request_type.value, failure)
        event = self._event(request, event_type, now, checkpoint_id=checkpoint_id, external_pointer=pointer,
                            failure_message=failure)
        expired = [Tombstone(r.key()) for r in cc.state.records_of(RequestRecord.KIND).values()
                   if now - r.timestamp > self.retention_ms and r.request_id not in self.in_flight
                   and r.request_id != request.request_id]
        cc.commit_batch(Batch(records=[record, *expired], events=[event]))

    def _event(self, request: ControlRequest, event_type: str, now: int, *, checkpoint_id: int | None = None,
               external_pointer: str | None = None, failure_message: str | None = None) -> CheckpointEvent:
        cc = self.coordinator
        return CheckpointEvent(
            job_id=cc.job_id, checkpoint_id=checkpoint_id if checkpoint_id is not None else -1,
            event_type=event_type, checkpoint_type=request.request_type.checkpoint_type.value,
            epoch=cc.state.epoch, timestamp=now, trigger_timestamp=request.timestamp,
            end_to_end_duration_ms=now - request.timestamp if event_type != "REQUEST_ACCEPTED" else None,
            failure_message=failure_message, external_pointer=external_pointer,
            request_id=request.request_id, request_type=request.request_type.value)


def savepoint_outcome(trigger: Any) -> concurrent.futures.Future:
    """A future of the :class:`RequestOutcome` of a savepoint trigger (a
    :class:`~chandy.coordinator.trigger_result.CheckpointTriggerResult` whose future gives the pointer)."""
    outcome: concurrent.futures.Future = concurrent.futures.Future()

    def done(f: concurrent.futures.Future) -> None:
        exc = f.exception()
        if exc is not None:
            outcome.set_exception(exc)
        else:
            outcome.set_result(RequestOutcome(trigger.checkpoint_id, f.result()))

    trigger.future.add_done_callback(done)
    return outcome


def default_executor(coordinator: Any) -> RequestExecutor:
    """Applies requests directly on ``coordinator`` (mailbox thread): Flink's ``triggerCheckpoint``,
    ``triggerSavepoint``, ``triggerSynchronousSavepoint`` (stop-with-savepoint) and
    ``JobMaster.cancel``. ``drain`` has nothing to drain here: workers decide what a checkpoint
    holds; the Spark pipeline installs its own executor that drains its sources."""

    def execute(request: ControlRequest) -> concurrent.futures.Future:
        kind = request.request_type
        if kind is ControlRequestType.TRIGGER_CHECKPOINT:
            return coordinator.trigger_checkpoint(forced=True).future
        if kind in (ControlRequestType.TRIGGER_SAVEPOINT, ControlRequestType.STOP_WITH_SAVEPOINT):
            trigger = coordinator.trigger_savepoint(request.target_directory,
                                                    terminate=kind is ControlRequestType.STOP_WITH_SAVEPOINT)
            return savepoint_outcome(trigger)
        if kind is ControlRequestType.CANCEL:
            return coordinator.cancel_job(f"canceled by request {request.request_id}")
        raise RequestError(f"unknown request type {kind}")

    return execute


# -- the client side ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class RequestAnswer:
    """The coordinator's answer to a request: COMPLETED (with the checkpoint and pointer) or
    FAILED (with the reason), and the round trip in ms from send to answer."""

    request_id: str
    status: RequestStatus
    checkpoint_id: int | None
    external_pointer: str | None
    failure_message: str | None
    round_trip_ms: float


def send_request(
    bootstrap_servers: str,
    job_id: str,
    request_type: ControlRequestType,
    *,
    prefix: str = "chandy",
    target_directory: str | None = None,
    drain: bool = False,
    timeout_s: float = 120.0,
    request_id: str | None = None,
    check_running: bool = True,
    on_accepted: Callable[[], None] | None = None,
    producer_overrides: Mapping[str, Any] | None = None,
    consumer_overrides: Mapping[str, Any] | None = None,
) -> RequestAnswer:
    """Send one control request and wait for its answer (what Flink's CLI does over REST).

    The events topic is read from its current end before the request is sent, so the answer
    cannot be missed; ``on_accepted`` is called when the coordinator accepts the request.

    Raises:
        JobNotRunningError: ``check_running`` and no coordinator of the job runs.
        RequestTimeoutError: no answer within ``timeout_s`` seconds.
    """
    topics = ChandyTopics(prefix)
    if check_running and not coordinator_running(bootstrap_servers, prefix, job_id, overrides=producer_overrides):
        raise JobNotRunningError(f"job {job_id} is not running: no coordinator in consumer group "
                                 f"{election_group(prefix, job_id)} (start it, or check --prefix and --job)")
    codec = SingleObjectCodec()
    request_id = request_id or uuid.uuid4().hex
    now = int(time.time() * 1000)
    request = ControlRequest(request_id, job_id, request_type, target_directory, None, drain, now,
                             now + int(timeout_s * 1000), requester=None)
    consumer = kafka_config.consumer(bootstrap_servers, overrides={"fetch.wait.max.ms": 50, **(consumer_overrides or {})})
    producer = kafka_config.producer(bootstrap_servers, overrides=producer_overrides)
    try:
        metadata = consumer.list_topics(topics.checkpoint_events, timeout=timeout_s)
        if topics.checkpoint_events not in metadata.topics or metadata.topics[topics.checkpoint_events].error:
            raise RequestError(f"topic {topics.checkpoint_events} does not exist (is --prefix right?)")
        partitions = sorted(metadata.topics[topics.checkpoint_events].partitions)
        # position the consumer at the current end, as concrete offsets: a logical OFFSET_END is
        # resolved only at the first fetch, which under load can come after the answer
        ends = [TopicPartition(topics.checkpoint_events, p,
                               watermark_offsets(consumer, TopicPartition(topics.checkpoint_events, p), timeout_s)[1])
                for p in partitions]
        consumer.assign(ends)
        sent = time.monotonic()
        producer.produce(topics.requests, codec.encode(ControlRequest.SCHEMA, request.to_avro()), job_id.encode())
        if producer.flush(timeout_s) != 0:
            raise RequestError(f"the request could not be sent to {topics.requests} within {timeout_s} s")
        deadline = sent + timeout_s
        key = job_id.encode()
        while time.monotonic() < deadline:
            message = consumer.poll(0.1)
            if message is None or message.error() is not None or message.key() != key:
                continue
            try:
                event = CheckpointEvent.from_avro(codec.decode(message.value(), location_of(message)).value)
            except (WireFormatError, TypeError, KeyError) as exc:
                log.debug("skipping an undecodable event: %s", exc)
                continue
            if event.request_id != request_id:
                continue
            if event.event_type == "REQUEST_ACCEPTED":
                if on_accepted is not None:
                    on_accepted()
                continue
            if event.event_type in ("REQUEST_COMPLETED", "REQUEST_FAILED"):
                status = RequestStatus.COMPLETED if event.event_type == "REQUEST_COMPLETED" else RequestStatus.FAILED
                return RequestAnswer(request_id, status, event.checkpoint_id if event.checkpoint_id >= 0 else None,
                                     event.external_pointer, event.failure_message, (time.monotonic() - sent) * 1000)
        raise RequestTimeoutError(f"no answer to {request_type.value} request {request_id} of job {job_id} within "
                                  f"{timeout_s} s (the request stays applicable until then, at most once)")
    finally:
        consumer.close()


@dataclasses.dataclass
class JobSummary:
    """One job as its public events show it (``chandy job list``): its status, whether a
    coordinator runs (a member in its election group), the last completed checkpoint and the
    last savepoint. Times in ms since the Unix epoch."""

    job_id: str
    status: str = "UNKNOWN"
    #: the job's name, from its newest TRIGGERED event (None before one)
    name: str | None = None
    coordinator_running: bool = False
    epoch: int = 0
    last_checkpoint: int | None = None
    last_checkpoint_time: int | None = None
    last_savepoint: str | None = None
    last_event_time: int = 0
    events: int = 0
    #: (epoch, status) of the latest JOB_STATUS_CHANGED, if any
    status_change: tuple[int, str] | None = None

    def fold(self, event: CheckpointEvent) -> None:
        """Take one of the job's events into the summary, in topic order; the status follows
        :func:`chandy.coordinator.checkpoint_view.job_status` (as ``GET /jobs`` of ``chandy ui``)."""
        self.events += 1
        self.epoch = max(self.epoch, event.epoch)
        self.last_event_time = max(self.last_event_time, event.timestamp)
        if event.job_name:
            self.name = event.job_name
        if event.event_type == "JOB_STATUS_CHANGED" and event.job_status:
            self.status_change = (event.epoch, str(event.job_status))
        elif event.event_type in ("COMPLETED", "SAVEPOINT_COMPLETED"):
            if event.checkpoint_type == CheckpointType.CHECKPOINT.value:
                self.last_checkpoint, self.last_checkpoint_time = event.checkpoint_id, event.timestamp
            else:
                self.last_savepoint = event.external_pointer
        self.status = job_status(self.status_change, self.epoch)


def list_jobs(bootstrap_servers: str, *, prefix: str = "chandy", timeout_s: float = 60.0,
              consumer_overrides: Mapping[str, Any] | None = None) -> list[JobSummary]:
    """Every job seen on ``<prefix>.checkpoint-events``, read from the beginning to its current
    end (no consumer group, no commits), with whether a coordinator of it runs now
    (:meth:`JobSummary.fold` gives each event's meaning).

    Raises:
        LogLoadError: the events topic is missing or cannot be read to its end.
    """
    from chandy.coordinator.kafka.log import raw_messages

    codec = SingleObjectCodec()
    jobs: dict[str, JobSummary] = {}
    for message in raw_messages(bootstrap_servers, ChandyTopics(prefix).checkpoint_events,
                                consumer_overrides=dict(consumer_overrides or {}), timeout_s=timeout_s):
        try:
            event = CheckpointEvent.from_avro(codec.decode(message.value(), location_of(message)).value)
        except (WireFormatError, TypeError, KeyError) as exc:
            log.debug("skipping an undecodable event: %s", exc)
            continue
        jobs.setdefault(event.job_id, JobSummary(event.job_id)).fold(event)
    if jobs:
        admin = kafka_config.admin_client(bootstrap_servers, overrides=consumer_overrides)
        groups = {election_group(prefix, job_id): job for job_id, job in jobs.items()}
        for group, future in admin.describe_consumer_groups(list(groups), request_timeout=timeout_s).items():
            try:
                groups[group].coordinator_running = bool(future.result(timeout_s).members)
            except Exception as exc:  # noqa: BLE001 - an unknown group is a job with no coordinator
                log.debug("describing group %s: %s", group, exc)
    return sorted(jobs.values(), key=lambda j: -j.last_event_time)

"""Following the public ``<prefix>.checkpoint-events`` topic: a subscriber for external consumers.

``subscribe(...)`` yields :class:`~chandy.coordinator.messages.CheckpointEvent` objects (trigger,
completion, abort, savepoint, with their statistics; job status changes; lake commits),
optionally of one job and of some event types (``event_types=["LAKE_COMMITTED"]``), from its own
consumer group:

- ``start="committed"`` resumes where the group stopped (the default, earliest for a new group),
  ``"earliest"`` reads from the beginning, ``"latest"`` only new events;
- an event counts as handled once the iterator is asked for the next one: its offset is stored
  then and committed (periodically and on close), so a clean stop and restart continues without
  loss or repeat (at-least-once if the process dies between handling and commit).

Events written by a newer Chandy with fields this one does not know still decode: the reader
resolves the writer schema against its own (new fields are dropped, unknown event types read as
UNKNOWN); writer schemas it has never seen can be given with ``writer_schemas``.

Which event means what: ``COMPLETED`` is Flink's checkpoint completion (the checkpoint is durable;
sinks commit after it, on ``notifyCheckpointComplete``), ``LAKE_COMMITTED`` says the checkpoint's
records are readable in ``table_uri`` at ``table_version`` (Delta's version, Iceberg's snapshot
ID). A job that reads the table should wait for ``LAKE_COMMITTED``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import Any

from confluent_kafka import KafkaError, Message

from chandy.coordinator.errors import ChandyError
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.topics import ChandyTopics
from chandy.coordinator.messages import CheckpointEvent
from chandy.schemas.codec import Schema, SingleObjectCodec, WireFormatError, default_repository, location_of

log = logging.getLogger(__name__)


def _event_types() -> tuple[str, ...]:
    schema = default_repository().current(CheckpointEvent.SCHEMA).definition
    field = next(f for f in schema["fields"] if f["name"] == "event_type")
    return tuple(s for s in field["type"]["symbols"] if s != "UNKNOWN")


#: the event types of ``chandy.v1.CheckpointEvent`` (its enum's symbols but UNKNOWN)
EVENT_TYPES: tuple[str, ...] = _event_types()


class Subscription:
    """An open subscription: iterate it for events; ``close()`` (or ``with``) commits and leaves."""

    def __init__(self, bootstrap_servers: str, *, job_id: str | None = None, start: str = "committed",
                 group_id: str | None = None, prefix: str = "chandy", poll_timeout_s: float = 0.5,
                 writer_schemas: Iterable[Schema] = (), consumer_overrides: dict[str, Any] | None = None,
                 event_types: Iterable[str] | None = None) -> None:
        if start not in ("committed", "earliest", "latest"):
            raise ChandyError(f"start must be committed, earliest or latest, got {start!r}")
        self.event_types = None if event_types is None else frozenset(event_types)
        if self.event_types is not None:
            unknown = sorted(self.event_types - set(EVENT_TYPES))
            if unknown:
                raise ChandyError(f"unknown event type(s) {', '.join(unknown)}; known: {', '.join(EVENT_TYPES)}")
        if start != "committed" and group_id is None:
            group_id = f"chandy-events-{uuid.uuid4().hex[:12]}"  # a throwaway group: no position to resume
        if group_id is None:
            raise ChandyError("start='committed' needs the group_id whose position to resume")
        repository = default_repository()
        for schema in writer_schemas:
            repository.register(schema)
        self.codec = SingleObjectCodec(repository)
        self.job_id = job_id
        self.topic = ChandyTopics(prefix).checkpoint_events
        self.poll_timeout_s = poll_timeout_s
        self.skipped = 0
        overrides = {"enable.auto.commit": True, "enable.auto.offset.store": False, "auto.commit.interval.ms": 1000,
                     "enable.partition.eof": True,
                     "auto.offset.reset": "latest" if start == "latest" else "earliest", **(consumer_overrides or {})}
        self.consumer = kafka_config.consumer(bootstrap_servers, group_id=group_id, overrides=overrides)
        if start == "earliest":
            from confluent_kafka import OFFSET_BEGINNING

            def rewind(consumer, partitions):
                for p in partitions:
                    p.offset = OFFSET_BEGINNING
                consumer.assign(partitions)

            self.consumer.subscribe([self.topic], on_assign=rewind)
        else:
            self.consumer.subscribe([self.topic])
        self._pending: Message | None = None
        self._closed = False
        self._at_end: set[int] = set()  # partitions read to their end (enable.partition.eof)

    def poll(self, timeout_s: float | None = None) -> CheckpointEvent | None:
        """The next event, or None if none arrived within the timeout. Marks the previous one handled."""
        self._mark_handled()
        message = self.consumer.poll(self.poll_timeout_s if timeout_s is None else timeout_s)
        if message is None:
            return None
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                self._at_end.add(message.partition() or 0)
            else:
                log.warning("events consumer: %s", error)
            return None
        self._at_end.discard(message.partition() or 0)
        self._pending = message
        if self.job_id is not None and message.key() != self.job_id.encode():
            return None
        try:
            event: CheckpointEvent = CheckpointEvent.from_avro(self.codec.decode(message.value(),
                                                                                 location_of(message)).value)
        except (WireFormatError, TypeError, KeyError) as exc:
            self.skipped += 1
            log.warning("skipping an undecodable checkpoint event: %s", exc)
            return None
        if self.event_types is not None and event.event_type not in self.event_types:
            return None
        return event

    def caught_up(self) -> bool:
        """Whether every partition assigned to this subscription was read to its end (committed
        events only) since its last event."""
        assignment = self.consumer.assignment()
        return bool(assignment) and all(tp.partition in self._at_end for tp in assignment)

    def _mark_handled(self) -> None:
        if self._pending is not None:
            self.consumer.store_offsets(self._pending)
            self._pending = None

    def __iter__(self) -> Iterator[CheckpointEvent]:
        while not self._closed:
            event = self.poll()
            if event is not None:
                yield event

    def close(self) -> None:
        """Store the last handed-out event as handled, commit, and leave the group."""
        if self._closed:
            return
        self._closed = True
        self._mark_handled()
        try:
            self.consumer.commit(asynchronous=False)
        except Exception as exc:  # noqa: BLE001 - nothing stored to commit
            log.debug("final commit: %s", exc)
        self.consumer.close()

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def subscribe(bootstrap_servers: str, *, job_id: str | None = None, start: str = "committed",
              group_id: str | None = None, prefix: str = "chandy", event_types: Iterable[str] | None = None,
              **kwargs: Any) -> Subscription:
    """Subscribe to checkpoint events (see the module docstring); iterate the result.

    Args:
        job_id: only this job's events (the topic's key).
        start: ``committed`` (resume ``group_id``), ``earliest`` or ``latest``.
        event_types: only events of these types (:data:`EVENT_TYPES`), e.g. ``["LAKE_COMMITTED"]``.

    Raises:
        ChandyError: an unknown ``start`` or event type, or ``committed`` without ``group_id``.
    """
    return Subscription(bootstrap_servers, job_id=job_id, start=start, group_id=group_id, prefix=prefix,
                        event_types=event_types, **kwargs)


async def subscribe_async(bootstrap_servers: str, **kwargs: Any) -> AsyncIterator[CheckpointEvent]:
    """The asyncio variant of :func:`subscribe`: ``async for event in subscribe_async(...)``.
    Polls in a worker thread so the event loop is never blocked; closes when the loop stops iterating."""
    subscription = subscribe(bootstrap_servers, **kwargs)
    try:
        while True:
            event = await asyncio.to_thread(subscription.poll)
            if event is not None:
                yield event
    finally:
        await asyncio.to_thread(subscription.close)


class LakeCommitWaitError(ChandyError):
    """``wait_for_lake_commit`` gave up: the timeout passed, or the job ended without landing the
    checkpoint. ``reason`` is ``timeout`` or ``job-ended``."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def wait_for_lake_commit(bootstrap_servers: str, job_id: str, checkpoint_id: int | None = None, *,
                         table_uri: str | None = None, until_event_time_ms: int | None = None,
                         timeout_s: float = 60.0, prefix: str = "chandy", **kwargs: Any) -> CheckpointEvent:
    """Block until checkpoint ``checkpoint_id`` of ``job_id`` (or a later one, which holds it) is
    in a table: its ``LAKE_COMMITTED`` event, read from the start of the events topic, so a
    checkpoint landed long ago is found at once. ``table_uri``: only that table's commits (a job
    may write several). ``until_event_time_ms`` (ms since the epoch): also (or, without
    ``checkpoint_id``, only) until the table is complete up to that event time, the first
    ``LAKE_COMMITTED`` whose completeness watermark (``valid_through_ms``: the minimum over the
    job's partitions of the newest Kafka timestamp landed) is at or past it, as a downstream job
    waits for an hour to close (the valid-through timestamp of Kafka Connect's Iceberg sink).

    Returns:
        the ``LAKE_COMMITTED`` event (its ``table_version`` is the version to read).

    Raises:
        ValueError: neither ``checkpoint_id`` nor ``until_event_time_ms``.
        LakeCommitWaitError: ``timeout_s`` seconds passed (reason ``timeout``), or the job
            reached a terminal status (FINISHED, FAILED, CANCELED) without landing it (``job-ended``).
    """
    if checkpoint_id is None and until_event_time_ms is None:
        raise ValueError("wait_for_lake_commit needs a checkpoint ID, an event time, or both")
    what = " and ".join(
        ([f"checkpoint {checkpoint_id}"] if checkpoint_id is not None else [])
        + ([f"event time {until_event_time_ms} ms"] if until_event_time_ms is not None else []))
    deadline = time.monotonic() + timeout_s
    ended: CheckpointEvent | None = None  # the job's newest event, when it ended the job
    with subscribe(bootstrap_servers, job_id=job_id, start="earliest", prefix=prefix, **kwargs) as subscription:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            event = subscription.poll(min(0.5, remaining))
            if event is None:
                if ended is not None and subscription.caught_up():
                    raise LakeCommitWaitError(
                        f"job {job_id} ended ({ended.job_status}) without landing {what}"
                        + (f" in {table_uri}" if table_uri else ""), "job-ended")
                continue
            terminal = event.event_type == "JOB_STATUS_CHANGED" and event.job_status in ("FINISHED", "FAILED",
                                                                                         "CANCELED")
            ended = event if terminal else None  # any later event: the job runs again
            if (event.event_type == "LAKE_COMMITTED"
                    and (checkpoint_id is None or event.checkpoint_id >= checkpoint_id)
                    and (until_event_time_ms is None or (event.valid_through_ms is not None
                                                         and event.valid_through_ms >= until_event_time_ms))
                    and (table_uri is None or event.table_uri == table_uri)):
                return event
    raise LakeCommitWaitError(f"{what} of job {job_id} was not in "
                              f"{table_uri or 'its table'} within {timeout_s:g} s", "timeout")

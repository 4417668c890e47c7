"""Following the public ``<prefix>.checkpoint-events`` topic: a subscriber for external consumers.

``subscribe(...)`` yields :class:`~chandy.coordinator.messages.CheckpointEvent` objects (trigger,
completion, abort, savepoint, with their statistics), optionally of one job, from its own
consumer group:

- ``start="committed"`` resumes where the group stopped (the default, earliest for a new group),
  ``"earliest"`` reads from the beginning, ``"latest"`` only new events;
- an event counts as handled once the iterator is asked for the next one: its offset is stored
  then and committed (periodically and on close), so a clean stop and restart continues without
  loss or repeat (at-least-once if the process dies between handling and commit).

Events written by a newer Chandy with fields this one does not know still decode: the reader
resolves the writer schema against its own (new fields are dropped, unknown event types read as
UNKNOWN); writer schemas it has never seen can be given with ``writer_schemas``.
"""

from __future__ import annotations

import asyncio
import logging
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


class Subscription:
    """An open subscription: iterate it for events; ``close()`` (or ``with``) commits and leaves."""

    def __init__(self, bootstrap_servers: str, *, job_id: str | None = None, start: str = "committed",
                 group_id: str | None = None, prefix: str = "chandy", poll_timeout_s: float = 0.5,
                 writer_schemas: Iterable[Schema] = (), consumer_overrides: dict[str, Any] | None = None) -> None:
        if start not in ("committed", "earliest", "latest"):
            raise ChandyError(f"start must be committed, earliest or latest, got {start!r}")
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

    def poll(self, timeout_s: float | None = None) -> CheckpointEvent | None:
        """The next event, or None if none arrived within the timeout. Marks the previous one handled."""
        self._mark_handled()
        message = self.consumer.poll(self.poll_timeout_s if timeout_s is None else timeout_s)
        if message is None:
            return None
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("events consumer: %s", error)
            return None
        self._pending = message
        if self.job_id is not None and message.key() != self.job_id.encode():
            return None
        try:
            return CheckpointEvent.from_avro(self.codec.decode(message.value(), location_of(message)).value)
        except (WireFormatError, TypeError, KeyError) as exc:
            self.skipped += 1
            log.warning("skipping an undecodable checkpoint event: %s", exc)
            return None

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
              group_id: str | None = None, prefix: str = "chandy", **kwargs: Any) -> Subscription:
    """Subscribe to checkpoint events (see the module docstring); iterate the result."""
    return Subscription(bootstrap_servers, job_id=job_id, start=start, group_id=group_id, prefix=prefix, **kwargs)


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

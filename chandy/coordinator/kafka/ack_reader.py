"""What workers send the coordinator: :class:`AckReader` reads ``<prefix>.acks`` (acknowledgements,
declines, operator events, attempt reports) from its end at start and hands the job's messages to
the mailbox in batches."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import OFFSET_END, KafkaError, TopicPartition

from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.topics import ChandyTopics, watermark_offsets
from chandy.coordinator.messages import (
    MESSAGE_TYPES,
)
from chandy.schemas.codec import Codec, WireFormatError, location_of

log = logging.getLogger(__name__)

#: acks-topic messages drained per mailbox action (already fetched ones only; nothing waits for them)
_ACK_BATCH = 1000


class AckReader:
    """Reads ``<prefix>.acks`` from its end at start, decodes, and hands the job's messages to
    ``dispatch`` a poll batch at a time (a list, in offset order). A message that does not decode is counted, logged and skipped (and copied to
    ``dead_letter_topic`` if set); it never stops the reader."""

    def __init__(self, bootstrap_servers: str, topics: ChandyTopics, job_id: str, codec: Codec,
                 dispatch: Callable[[list[Any]], None], consumer_overrides: Mapping[str, Any] | None = None,
                 dead_letter_topic: str | None = None) -> None:
        self.topic = topics.acks
        self.job_id = job_id
        self.codec = codec
        self.dispatch = dispatch
        self.bad_messages = 0
        self.dead_letter_topic = dead_letter_topic
        self._dlq = (kafka_config.producer(bootstrap_servers, overrides=kafka_config.security_settings(consumer_overrides))
                     if dead_letter_topic else None)
        self.consumer = kafka_config.consumer(bootstrap_servers, overrides={"fetch.wait.max.ms": 10,
                                                                             **(consumer_overrides or {})})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"chandy-acks-{job_id[:8]}", daemon=True)

    def start(self) -> None:
        """Start dispatching (after :meth:`assign`)."""
        self._thread.start()

    def assign(self, timeout_s: float = 30.0) -> None:
        """Position at the current end of the acks topic; nothing is dispatched before :meth:`start`."""
        metadata = self.consumer.list_topics(self.topic, timeout=timeout_s)
        partitions = sorted(metadata.topics[self.topic].partitions)
        # start at the end captured now: acks sent to an older coordinator are not ours
        assignment = []
        for p in partitions:
            _, high = watermark_offsets(self.consumer, TopicPartition(self.topic, p), timeout_s)
            assignment.append(TopicPartition(self.topic, p, high if high >= 0 else OFFSET_END))
        self.consumer.assign(assignment)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(10)
        if self._thread.is_alive():
            # closing the consumer under a thread that may poll again is undefined in librdkafka
            log.warning("acks reader of job %s: its thread did not stop within 10 s; the consumer is left open",
                        self.job_id)
        else:
            self.consumer.close()

    def _run(self) -> None:
        key = self.job_id.encode()
        while not self._stop.is_set():
            polled = self.consumer.poll(0.2)
            if polled is None:
                continue
            # poll waits for the first message; what is already fetched is drained without waiting
            # (consume(n, timeout) would wait for its whole timeout unless n messages arrive), and
            # the whole batch goes to the mailbox as one action: 1,000 subtasks' acks are a few
            # mailbox turns, not 1,000
            batch = [polled, *self.consumer.consume(_ACK_BATCH, 0)]
            decoded_batch = []
            for message in batch:
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        log.warning("acks consumer: %s", error)
                    continue
                if message.key() != key:
                    continue
                try:
                    decoded = self.codec.decode(message.value(), location_of(message))
                    cls = MESSAGE_TYPES.get(decoded.name)
                    if cls is None:
                        raise WireFormatError(f"{decoded.name} is not a message the coordinator reads",
                                              location_of(message))
                    decoded_batch.append(cls.from_avro(decoded.value))
                except Exception as exc:  # noqa: BLE001 - one bad message must not stop the reader
                    self.bad_messages += 1
                    log.warning("skipping a bad message on %s: %s", self.topic, exc)
                    if self._dlq is not None and self.dead_letter_topic is not None:
                        self._dlq.produce(self.dead_letter_topic, message.value(), message.key(),
                                          headers={"chandy.error": str(exc)})
                        self._dlq.poll(0)
            if decoded_batch:
                self.dispatch(decoded_batch)



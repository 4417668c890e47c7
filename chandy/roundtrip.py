"""A produce → consume round trip through a broker: the latency floor every Chandy message pays.

Used by ``chandy kafka roundtrip`` (the demo until the pipeline exists) and by
``benchmarks/roundtrip_latency.py``. Each message is produced, flushed and then consumed back by
a consumer already assigned to the partition, so one sample is the loopback time of one message
through the broker: producer send, broker append, consumer fetch (read_committed).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import NewTopic

from chandy.coordinator.errors import ChandyError
from chandy.coordinator.kafka import config as kafka_config
from chandy.schemas.codec import Codec, SingleObjectCodec, location_of


class RoundTripError(ChandyError):
    """A message did not come back, or came back different."""


@dataclasses.dataclass(frozen=True)
class RoundTripResult:
    """Latencies in ms of ``count`` produce→consume round trips, each message checked equal."""

    count: int
    latencies_ms: list[float] = dataclasses.field(repr=False)

    def percentile(self, q: float) -> float:
        """The q-th percentile (0 < q < 100) of the latencies, in ms."""
        ordered = sorted(self.latencies_ms)
        index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
        return ordered[index]

    @property
    def p50_ms(self) -> float:
        return self.percentile(50)

    @property
    def p99_ms(self) -> float:
        return self.percentile(99)

    @property
    def mean_ms(self) -> float:
        return statistics.fmean(self.latencies_ms)


def sample_messages(job_id: str = "roundtrip") -> dict[str, dict[str, Any]]:
    """One valid value of each control/ack message type, keyed by schema name."""
    now = int(time.time() * 1000)
    handle = {"kind": "file", "path": "file:///tmp/chk-1/part-0", "inline_data": None, "state_size": 42,
              "properties": {"records": "7"}}
    return {
        "TriggerCheckpoint": {"job_id": job_id, "epoch": 1, "checkpoint_id": 1, "timestamp": now,
                              "checkpoint_type": "CHECKPOINT", "target_location": None,
                              "operator_ids": [], "properties": {}},
        "AcknowledgeCheckpoint": {"job_id": job_id, "epoch": 1, "checkpoint_id": 1, "operator_id": "source",
                                  "subtask_index": 0, "attempt_number": 0, "state_handles": [handle],
                                  "metrics": {"sync_duration_ms": 1, "async_duration_ms": 2,
                                              "bytes_persisted": 42, "records_processed": 7},
                                  "timestamp": now},
        "DeclineCheckpoint": {"job_id": job_id, "epoch": 1, "checkpoint_id": 2, "operator_id": "source",
                              "subtask_index": 1, "attempt_number": 0, "reason": "CHECKPOINT_DECLINED",
                              "message": "disk full", "timestamp": now},
        "NotifyCheckpointComplete": {"job_id": job_id, "epoch": 1, "checkpoint_id": 1,
                                     "checkpoint_type": "CHECKPOINT", "timestamp": now},
        "NotifyCheckpointAborted": {"job_id": job_id, "epoch": 1, "checkpoint_id": 2,
                                    "reason": "CHECKPOINT_DECLINED", "message": None, "timestamp": now},
        "OperatorEvent": {"job_id": job_id, "epoch": 1, "operator_id": "source", "subtask_index": 0,
                          "attempt_number": 0, "event_type": "AddSplits", "payload": b"\x01\x02",
                          "timestamp": now},
        "SubtaskAttemptReady": {"job_id": job_id, "operator_id": "source", "subtask_index": 0,
                                "attempt_number": 0, "host": "localhost", "timestamp": now},
        "SubtaskAttemptFailed": {"job_id": job_id, "operator_id": "source", "subtask_index": 0,
                                 "attempt_number": 0, "reason": "killed", "timestamp": now},
    }


def round_trip(
    bootstrap_servers: str,
    *,
    messages: int = 1000,
    codec: Codec | None = None,
    topic: str | None = None,
    producer_overrides: Mapping[str, Any] | None = None,
    consumer_overrides: Mapping[str, Any] | None = None,
    on_progress: Callable[[int], None] | None = None,
    timeout_s: float = 10.0,
) -> RoundTripResult:
    """Send ``messages`` messages one at a time (cycling through every message type), consume
    each back, check it decodes equal, and return the per-message latencies.

    A fresh single-partition topic is created (and deleted afterwards) unless ``topic`` is given.

    Raises:
        RoundTripError: a message did not arrive within ``timeout_s`` seconds or differed.
    """
    codec = codec or SingleObjectCodec()
    admin = kafka_config.admin_client(bootstrap_servers)
    own_topic = topic is None
    topic = topic or f"chandy.roundtrip.{uuid.uuid4().hex[:8]}"
    if own_topic:
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result()
    producer = kafka_config.producer(bootstrap_servers, overrides=producer_overrides)
    consumer = kafka_config.consumer(bootstrap_servers, overrides=consumer_overrides)
    try:
        # an explicit start offset: OFFSET_END would be resolved lazily, after the warm-up message
        consumer.assign([TopicPartition(topic, 0, _end_offset(consumer, topic, timeout_s))])
        samples = list(sample_messages().items())
        # warm the connections (metadata, fetch session) before measuring
        producer.produce(topic, codec.encode("TriggerCheckpoint", samples[0][1], topic=topic), key=b"warmup")
        producer.flush(timeout_s)
        _consume_one(consumer, timeout_s)
        latencies: list[float] = []
        for i in range(messages):
            name, value = samples[i % len(samples)]
            payload = codec.encode(name, value, topic=topic)
            start = time.perf_counter()
            producer.produce(topic, payload, key=value["job_id"].encode())
            producer.flush(timeout_s)
            message = _consume_one(consumer, timeout_s)
            latencies.append((time.perf_counter() - start) * 1000.0)
            decoded = codec.decode(message.value(), location_of(message))
            if not decoded.name.endswith("." + name) or decoded.value != value:
                raise RoundTripError(f"{name} came back as {decoded.name} {decoded.value!r}")
            if on_progress is not None:
                on_progress(i + 1)
        return RoundTripResult(messages, latencies)
    finally:
        consumer.close()
        if own_topic:
            admin.delete_topics([topic])


def _consume_one(consumer: Any, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is None:
            continue
        if message.error():
            raise RoundTripError(f"consumer error: {message.error()}")
        return message
    raise RoundTripError(f"no message came back within {timeout_s} s")


def _end_offset(consumer: Any, topic: str, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=timeout_s, cached=False)[1]
        except KafkaException:  # a new topic's leader may not be known yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)

"""The wire contract through a real Apache Kafka broker: every message type and log record is
produced, consumed and decoded back equal; bad bytes on a topic name their topic, partition and
offset."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import TopicPartition

from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.topics import ChandyTopics, ensure_topics
from chandy.roundtrip import round_trip
from chandy.schemas.codec import BadMagicError, SingleObjectCodec, TruncatedMessageError, UnknownSchemaError, load_schemas, location_of
from tests.fixtures.avro_values import example_value

pytestmark = pytest.mark.integration

SCHEMAS = load_schemas()


def _consume_all(servers: str, topic: str, expected: int, timeout_s: float = 30.0) -> list:
    consumer = kafka_config.consumer(servers)
    consumer.assign([TopicPartition(topic, 0, 0)])
    messages = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(messages) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                messages.append(message)
    finally:
        consumer.close()
    return messages


def test_every_message_type_round_trips_through_the_broker(kafka_bootstrap_servers: str, topic_prefix: str) -> None:
    topics = ChandyTopics(topic_prefix)
    ensure_topics(kafka_config.admin_client(kafka_bootstrap_servers), topics)
    codec = SingleObjectCodec()
    producer = kafka_config.producer(kafka_bootstrap_servers)
    sent = []
    for variant in (1, 2):
        for name, schema in sorted(SCHEMAS.items()):
            value = example_value(schema.definition, variant=variant)
            producer.produce(topics.control, codec.encode(name, value), key=b"job-1")
            sent.append((name, value))
    assert producer.flush(30) == 0
    received = _consume_all(kafka_bootstrap_servers, topics.control, len(sent))
    decoded = [codec.decode(m.value(), location_of(m)) for m in received]
    assert [(d.name, d.value) for d in decoded] == sent


def test_bad_bytes_on_a_topic_name_where_they_were_read(kafka_bootstrap_servers: str, topic_prefix: str) -> None:
    topics = ChandyTopics(topic_prefix)
    ensure_topics(kafka_config.admin_client(kafka_bootstrap_servers), topics)
    good = SingleObjectCodec().encode("TriggerCheckpoint", example_value(SCHEMAS["chandy.v1.TriggerCheckpoint"].definition))
    producer = kafka_config.producer(kafka_bootstrap_servers)
    for payload in (good[:6], b"\x00" + good[1:], good[:2] + b"\x11" * 8 + good[10:], good):
        producer.produce(topics.acks, payload, key=b"job-1")
    producer.flush(30)
    messages = _consume_all(kafka_bootstrap_servers, topics.acks, 4)
    codec = SingleObjectCodec()
    for message, error in zip(messages[:3], (TruncatedMessageError, BadMagicError, UnknownSchemaError), strict=True):
        with pytest.raises(error) as raised:
            codec.decode(message.value(), location_of(message))
        assert f"{topics.acks} [partition 0] @ offset {message.offset()}" in str(raised.value)
    # the good message after the bad ones still decodes: one bad message loses nothing else
    assert codec.decode(messages[3].value()).name == "chandy.v1.TriggerCheckpoint"


def test_round_trip_latency_is_measured_over_every_message_type(kafka_bootstrap_servers: str) -> None:
    result = round_trip(kafka_bootstrap_servers, messages=40)
    assert result.count == 40 and len(result.latencies_ms) == 40
    assert 0 < result.p50_ms <= result.p99_ms

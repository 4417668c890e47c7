"""SASL/SCRAM and ACLs on a real broker (``EmbeddedKafkaBroker(security="sasl-scram")``, what
``chandy kafka up --security sasl-scram`` starts, with ``StandardAuthorizer``): with the minimal
ACLs of ``chandy topics acls`` a coordinator and its workers, each authenticated as its own
principal, complete checkpoints; a worker's principal cannot write a NotifyCheckpointComplete to
the control topic, a record to the coordinator log, or use the coordinator's transactional.id
(authorisation errors, and nothing changes on those topics); a reader reads checkpoint events
only; an unknown password does not authenticate; over TLS (``--tls``) the same runs, and a
client that does not trust the broker's certificate is refused at the handshake.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from chandy.broker import EmbeddedKafkaBroker
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.log import encode_record
from chandy.coordinator.kafka.log_writer import transactional_id_for
from chandy.coordinator.kafka.runtime import CoordinatorService
from chandy.coordinator.kafka.topics import ChandyTopics, ensure_topics
from chandy.coordinator.messages import NotifyCheckpointComplete
from chandy.coordinator.records import CoordinatorEpochRecord
from chandy.schemas.codec import SingleObjectCodec
from tests.fixtures.workers import Worker, options, read_events, wait_for

pytestmark = pytest.mark.integration

USERS = {"coordinator": "coordinator-secret", "worker": "worker-secret", "reader": "reader-secret"}
CHANDY = [sys.executable, "-m", "chandy.cli"]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedKafkaBroker]:
    broker = EmbeddedKafkaBroker(tmp_path_factory.mktemp("secured"), security="sasl-scram", scram_users=USERS)
    broker.up()
    try:
        yield broker
    finally:
        broker.down()


def _as(user: str) -> dict[str, str]:
    return kafka_config.sasl_settings(user, USERS[user])


def _servers(broker: EmbeddedKafkaBroker) -> str:
    info = broker.status()
    assert info is not None
    return info.bootstrap_servers


@pytest.fixture
def acl_topics(secured: EmbeddedKafkaBroker, topic_prefix: str) -> ChandyTopics:
    """Chandy's topics created by the admin, with the ACLs applied through ``chandy topics acls``."""
    info = secured.status()
    assert info is not None
    topics = ChandyTopics(topic_prefix)
    ensure_topics(kafka_config.admin_client(info.bootstrap_servers, dict(info.client_settings)), topics)
    result = subprocess.run(
        [*CHANDY, "topics", "acls", "--data-dir", info.data_dir, "-b", info.bootstrap_servers, "--prefix", topic_prefix,
         "--coordinator", "coordinator", "--worker", "worker", "--reader", "User:reader"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "User:coordinator" in result.stdout and "TRANSACTIONAL_ID" in result.stdout
    return topics


def _end_offset(broker: EmbeddedKafkaBroker, topic: str) -> int:
    """The topic's end offset, as the admin sees it."""
    info = broker.status()
    assert info is not None
    consumer = kafka_config.consumer(info.bootstrap_servers, overrides=dict(info.client_settings))
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1]
    finally:
        consumer.close()


def _produce(servers: str, settings: dict[str, str], topic: str, key: bytes, value: bytes) -> KafkaError | None:
    """Produce one record and return the delivery error (None when delivered)."""
    errors: list[KafkaError | None] = []
    producer = kafka_config.producer(servers, overrides={**settings, "message.timeout.ms": 10_000})
    producer.produce(topic, value, key, on_delivery=lambda err, msg: errors.append(err))
    producer.flush(15)
    return errors[0] if errors else KafkaError(KafkaError._MSG_TIMED_OUT)


def test_authenticated_coordinator_and_workers_complete_checkpoints(
        secured: EmbeddedKafkaBroker, acl_topics: ChandyTopics, tmp_path: Path) -> None:
    servers = _servers(secured)
    job = uuid.uuid4().hex
    coordinator = _as("coordinator")
    service = CoordinatorService(job, servers, options(tmp_path), {"op": 2}, prefix=acl_topics.prefix,
                                 producer_overrides=coordinator, consumer_overrides=coordinator).start(periodic=False)
    workers = [Worker(servers, job, acl_topics.prefix, "op", i, overrides=_as("worker")).start() for i in range(2)]
    try:
        for expected in (1, 2, 3):
            assert service.trigger_checkpoint().result(30).checkpoint_id == expected
        wait_for(lambda: all(w.completed[-1:] == [3] for w in workers), 30, "workers notified of checkpoint 3")
        # a reader reads the public events with its own principal
        events = read_events_as(servers, acl_topics.checkpoint_events, job, _as("reader"), expected=3)
        assert [e.checkpoint_id for e in events if e.event_type == "COMPLETED"] == [1, 2, 3]
    finally:
        for worker in workers:
            worker.close()
        service.stop()


def read_events_as(servers: str, topic: str, job: str, settings: dict[str, str], expected: int) -> list:
    """The job's events read with ``settings`` (the reader's credentials), COMPLETED ones counted."""
    deadline = time.monotonic() + 30
    events: list = []
    while time.monotonic() < deadline:
        events = read_events(servers, topic, job, expected=expected * 4, timeout_s=3, overrides=settings)
        if sum(e.event_type == "COMPLETED" for e in events) >= expected:
            return events
    return events


def test_a_worker_cannot_forge_coordinator_messages(
        secured: EmbeddedKafkaBroker, acl_topics: ChandyTopics, tmp_path: Path) -> None:
    servers = _servers(secured)
    job = uuid.uuid4().hex
    coordinator = _as("coordinator")
    service = CoordinatorService(job, servers, options(tmp_path), {"op": 1}, prefix=acl_topics.prefix,
                                 producer_overrides=coordinator, consumer_overrides=coordinator).start(periodic=False)
    worker = Worker(servers, job, acl_topics.prefix, "op", 0, overrides=_as("worker")).start()
    try:
        assert service.trigger_checkpoint().result(30).checkpoint_id == 1
        wait_for(lambda: worker.completed == [1], 30, "checkpoint 1 notified")
        control_end = _end_offset(secured, acl_topics.control)
        log_end = _end_offset(secured, acl_topics.coordinator_log)
        codec = SingleObjectCodec()

        # a NotifyCheckpointComplete of a made-up epoch 999 to the control topic
        forged = NotifyCheckpointComplete(job, 999, 42, timestamp=int(time.time() * 1000))
        error = _produce(servers, _as("worker"), acl_topics.control, job.encode(),
                         codec.encode(forged.SCHEMA, forged.to_avro(), topic=acl_topics.control))
        assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, error

        # a coordinator-log record claiming epoch 999
        record = CoordinatorEpochRecord(job, 999, "forged", "mallory", int(time.time() * 1000))
        key, value = encode_record(codec, record, topic=acl_topics.coordinator_log)
        error = _produce(servers, _as("worker"), acl_topics.coordinator_log, key, value or b"")
        assert error is not None and error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, error

        # the coordinator's transactional.id (which would fence it) is not the worker's either
        producer = kafka_config.producer(servers, transactional_id=transactional_id_for(acl_topics.prefix, job),
                                         overrides=_as("worker"))
        with pytest.raises(KafkaException) as fenced:
            producer.init_transactions(15)
        assert fenced.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED

        # a reader may not read the control topic
        reader = kafka_config.consumer(servers, overrides=_as("reader"))
        try:
            with pytest.raises(KafkaException) as denied:
                reader.get_watermark_offsets(TopicPartition(acl_topics.control, 0), timeout=10, cached=False)
            # without DESCRIBE the topic is hidden from the reader: unknown, or refused outright
            assert denied.value.args[0].code() in (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError._UNKNOWN_PARTITION)
        finally:
            reader.close()

        # nothing changed: both topics end where they did, the coordinator still leads epoch 1
        assert _end_offset(secured, acl_topics.control) == control_end
        assert _end_offset(secured, acl_topics.coordinator_log) == log_end
        assert not service.fenced.is_set()
        assert service.trigger_checkpoint().result(30).checkpoint_id == 2
        wait_for(lambda: worker.completed == [1, 2], 30, "checkpoint 2 notified, the forgery ignored")
        assert worker.participant.max_epoch == service.epoch < 999
    finally:
        worker.close()
        service.stop()


def test_a_wrong_password_does_not_authenticate(secured: EmbeddedKafkaBroker) -> None:
    errors: list[KafkaError] = []
    settings = {**kafka_config.sasl_settings("worker", "not-the-password"), "log_level": 0, "error_cb": errors.append}
    admin = kafka_config.admin_client(_servers(secured), settings)
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    admin.poll(1)  # serves error_cb
    assert any(error.code() == KafkaError._AUTHENTICATION for error in errors), errors
    # the right password does
    assert kafka_config.admin_client(_servers(secured), _as("worker")).list_topics(timeout=10).brokers


def test_tls_with_scram_runs_checkpoints_and_refuses_an_untrusted_client(
        tmp_path_factory: pytest.TempPathFactory, topic_prefix: str, tmp_path: Path) -> None:
    broker = EmbeddedKafkaBroker(tmp_path_factory.mktemp("tls"), security="sasl-scram", tls=True,
                                 scram_users={"worker": USERS["worker"]})
    info = broker.up()
    try:
        assert info.tls and info.client_settings["security.protocol"] == "SASL_SSL"
        ca = info.client_settings["ssl.ca.location"]
        assert Path(ca).read_text().startswith("-----BEGIN CERTIFICATE-----")
        admin_settings = dict(info.client_settings)
        job = uuid.uuid4().hex
        service = CoordinatorService(job, info.bootstrap_servers, options(tmp_path), {"op": 1}, prefix=topic_prefix,
                                     producer_overrides=admin_settings,
                                     consumer_overrides=admin_settings).start(periodic=False)
        worker_settings = {**kafka_config.sasl_settings("worker", USERS["worker"], protocol="SASL_SSL"),
                           "ssl.ca.location": ca}
        apply = subprocess.run(
            [*CHANDY, "topics", "acls", "--data-dir", info.data_dir, "-b", info.bootstrap_servers, "--prefix",
             topic_prefix, "--worker", "worker"],
            capture_output=True, text=True, timeout=120)
        assert apply.returncode == 0, apply.stderr
        worker = Worker(info.bootstrap_servers, job, topic_prefix, "op", 0, overrides=worker_settings).start()
        try:
            assert service.trigger_checkpoint().result(30).checkpoint_id == 1
            wait_for(lambda: worker.completed == [1], 30, "checkpoint 1 notified over TLS")
        finally:
            worker.close()
            service.stop()
        # a client that does not trust the broker's certificate gets no further than the handshake
        errors: list[KafkaError] = []
        untrusted = kafka_config.admin_client(info.bootstrap_servers, {
            **kafka_config.sasl_settings("worker", USERS["worker"], protocol="SASL_SSL"), "log_level": 0,
            "error_cb": errors.append})
        with pytest.raises(KafkaException):
            untrusted.list_topics(timeout=5)
        untrusted.poll(1)
        assert any(error.code() == KafkaError._SSL for error in errors), errors
    finally:
        broker.down()

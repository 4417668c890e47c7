"""When the only broker goes away (issue 44, item 9): Kafka being unreachable is named as such,
never as fencing, and librdkafka's connection errors are rate-limited (one line per broker per
interval, with the count of those held back) for every client Chandy builds."""

from __future__ import annotations

import logging
import re
import socket
import time
import uuid

import pytest

from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.config import ConnectionErrorLimiter, KafkaUnreachableError, LibrdkafkaLog
from chandy.coordinator.kafka.election import LeaderElection
from chandy.coordinator.kafka.log import LogUnreachableError, load_state
from chandy.coordinator.kafka.runtime import CoordinatorService
from chandy.coordinator.kafka.topics import ChandyTopics, ensure_topics
from tests.fixtures.workers import options, wait_for

LIBRDKAFKA = kafka_config.LIBRDKAFKA_LOGGER.name
FAIL = "[thrd:127.0.0.1:{port}/bootstrap]: 127.0.0.1:{port}/bootstrap: Connect to ipv4#127.0.0.1:{port} failed: " \
       "Connection refused (after 0ms in state CONNECT)"


def dead_port() -> int:
    """A local port nothing listens on (bound, then released): connections to it are refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def limiter(monkeypatch) -> ConnectionErrorLimiter:
    """A fresh process limiter of 2 s, so a test sees a few intervals (and no other test's brokers)."""
    fresh = ConnectionErrorLimiter(interval_s=2.0)
    monkeypatch.setattr(kafka_config, "CONNECTION_ERRORS", fresh)
    return fresh


def test_the_limiter_lets_one_line_a_broker_through_per_interval_and_counts_the_rest() -> None:
    now = [100.0]
    limiter = ConnectionErrorLimiter(interval_s=30.0, clock=lambda: now[0])
    assert limiter.admit("a:9092") == 0  # the first line of a broker, nothing held back before it
    assert limiter.admit("b:9092") == 0  # another broker has its own interval
    for _ in range(57):
        now[0] += 0.5
        assert limiter.admit("a:9092") is None
    now[0] = 129.9
    assert limiter.admit("a:9092") is None  # still inside a's interval: 58 held back
    now[0] = 130.0
    assert limiter.admit("a:9092") == 58  # a new interval: its line carries the count
    assert limiter.admit("a:9092") is None
    assert limiter.admit("b:9092") == 0  # b's interval (from 100.0) is over, and nothing of b was held


def test_fail_lines_are_limited_per_broker_and_others_pass(limiter, caplog) -> None:
    log = LibrdkafkaLog()
    with caplog.at_level(logging.DEBUG, logger=LIBRDKAFKA):
        for _ in range(5):
            for port in (1, 2):
                log.log(logging.ERROR, "%s [%s] %s", "FAIL", "rdkafka#producer-1", FAIL.format(port=port))
        log.log(logging.WARNING, "%s [%s] %s", "REQTMOUT", "rdkafka#producer-1", "Timed out 1 in-flight request")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"FAIL [rdkafka#producer-1] {FAIL.format(port=1)} (connection errors of 127.0.0.1:1: one line per 2 s)",
        f"FAIL [rdkafka#producer-1] {FAIL.format(port=2)} (connection errors of 127.0.0.1:2: one line per 2 s)",
        "REQTMOUT [rdkafka#producer-1] Timed out 1 in-flight request"]
    assert [r.levelno for r in caplog.records] == [logging.ERROR, logging.ERROR, logging.WARNING]


def test_clients_pointed_at_no_broker_log_a_few_lines_a_broker(limiter, caplog) -> None:
    """A producer, a consumer and an AdminClient, built as Chandy builds every client (Spark's tasks
    included), against two ports with no broker for 7 s: a few lines a broker, the later ones
    counting the lines held back (without the limiter: about 15 a client and broker)."""
    ports = dead_port(), dead_port()
    servers = ",".join(f"127.0.0.1:{p}" for p in ports)
    with caplog.at_level(logging.INFO, logger=LIBRDKAFKA):
        producer = kafka_config.producer(servers)
        consumer = kafka_config.consumer(servers, group_id=f"g-{uuid.uuid4().hex}")
        consumer.subscribe(["nowhere"])
        admin = kafka_config.admin_client(servers)
        producer.produce("nowhere", b"x")
        deadline = time.monotonic() + 7
        while time.monotonic() < deadline:
            producer.poll(0.1)
            consumer.poll(0.1)
            admin.poll(0.1)
        consumer.close()
    lines = [r.getMessage() for r in caplog.records if r.name == LIBRDKAFKA]
    for port in ports:
        about = [line for line in lines if f"127.0.0.1:{port}" in line]
        assert 1 <= len(about) <= 5, about
        held = [int(n) for n in re.findall(rf"\((\d+) more connection errors of 127\.0\.0\.1:{port} suppressed in the "
                                           r"last 2 s\)", "\n".join(about))]
        assert held and sum(held) >= 10, about  # the lines that were not logged are counted
    assert len(lines) <= 12, lines  # the brokers' lines and "all brokers are down", once an interval


def test_reading_the_log_of_an_unreachable_kafka_says_so() -> None:
    servers = f"127.0.0.1:{dead_port()}"
    with pytest.raises(LogUnreachableError, match=rf"coordinator log p.coordinator-log: Kafka is unreachable: no "
                                                  rf"metadata from {servers} within 2 s"):
        load_state(servers, "p.coordinator-log", "job", timeout_s=2)
    with pytest.raises(KafkaUnreachableError, match=rf"Kafka is unreachable: no broker of {servers} answered within 2 s"):
        kafka_config.check_reachable(servers, timeout_s=2)


def test_a_lost_election_with_kafka_gone_names_the_outage_not_fencing(caplog) -> None:
    servers = f"127.0.0.1:{dead_port()}"
    election = LeaderElection(servers, ChandyTopics("p"), "job")
    election.coordinator_epoch = lambda: 3
    try:
        with caplog.at_level(logging.WARNING, logger="chandy.coordinator.kafka.election"):
            election._explain_loss(lost=True)
    finally:
        election.consumer.close()
    (line,) = [r.getMessage() for r in caplog.records if r.name == "chandy.coordinator.kafka.election"]
    assert line.startswith("job job: this process no longer leads: its session in group p-coordinator-job ended "
                           "(Kafka heard nothing from it for 1500 ms); coordinator log p.coordinator-log: Kafka is "
                           f"unreachable: no metadata from {servers} within 10 s")
    assert line.endswith("whether a newer coordinator leads cannot be known until Kafka answers")
    assert "fences" not in line


@pytest.mark.integration
def test_a_lost_election_reads_the_logs_epoch_when_kafka_answers(kafka_bootstrap_servers, topic_prefix, tmp_path,
                                                                 caplog) -> None:
    job = uuid.uuid4().hex
    topics = ChandyTopics(topic_prefix)
    ensure_topics(kafka_config.admin_client(kafka_bootstrap_servers), topics)
    service = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path), {"src": 1}, prefix=topic_prefix).start()
    service.stop()  # the log now holds epoch 1
    election = LeaderElection(kafka_bootstrap_servers, topics, job)
    try:
        with caplog.at_level(logging.WARNING, logger="chandy.coordinator.kafka.election"):
            election.coordinator_epoch = lambda: 1  # this process's coordinator is the newest
            election._explain_loss(lost=True)
            election.coordinator_epoch = lambda: 0  # an older one: epoch 1 is newer
            election._explain_loss(lost=False)
            election.coordinator_epoch = None  # not told: the log's epoch and the group are what is known
            election._explain_loss(lost=True)
    finally:
        election.consumer.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "chandy.coordinator.kafka.election"]
    group = f"{topic_prefix}-coordinator-{job}"
    assert lines == [
        f"job {job}: this process no longer leads: its session in group {group} ended (Kafka heard nothing from it "
        f"for 1500 ms); no other member leads group {group} and the log's newest coordinator epoch is 1 (this "
        "coordinator's is 1): no newer coordinator is known, and this process rejoins",
        f"job {job}: leadership lost: group {group} revoked its partition, and a newer coordinator (epoch 1, this one 0) "
        "leads; it fences this one",
        f"job {job}: this process no longer leads: its session in group {group} ended (Kafka heard nothing from it "
        f"for 1500 ms); no other member leads group {group} and the log's newest coordinator epoch is 1: no newer "
        "coordinator is known, and this process rejoins"]


@pytest.mark.integration
@pytest.mark.slow  # a broker of its own, killed, and 25 s of reconnects: about 100 s
def test_the_only_broker_killed_under_a_coordinator_is_named_an_outage_in_a_few_lines(tmp_path, caplog) -> None:
    """The scenario of the issue without Spark: a coordinator that leads its election group, and the
    only broker SIGKILLed. The election's loss names the outage (it said "a newer coordinator fences
    this one"), and every client's connection errors take a line a broker per interval (the
    pipeline logged 88 a second)."""
    from chandy.broker import EmbeddedKafkaBroker

    broker = EmbeddedKafkaBroker(tmp_path / "kafka", nodes=1)
    servers = broker.up().bootstrap_servers
    job = uuid.uuid4().hex
    service = CoordinatorService(job, servers, options(tmp_path), {"src": 1}, prefix="p", accept_requests=True,
                                 retry_timeout_s=60).start()
    try:
        assert service.election is not None and service.election.is_leader.wait(30)
        with caplog.at_level(logging.INFO):
            broker.kill_node(broker.status().nodes[0].node_id)  # type: ignore[union-attr]
            killed = time.monotonic()
            election_lines = lambda: [r.getMessage() for r in caplog.records  # noqa: E731
                                      if r.name == "chandy.coordinator.kafka.election" and r.levelno >= logging.WARNING]
            wait_for(election_lines, timeout_s=40, what="the election's line")
            time.sleep(max(0.0, 25 - (time.monotonic() - killed)))  # the clients keep reconnecting meanwhile
        (line,) = election_lines()
        assert "Kafka is unreachable" in line and "cannot be known" in line and "fences" not in line, line
        librdkafka = [r.getMessage() for r in caplog.records if r.name == LIBRDKAFKA]
        # one line per broker address (the bootstrap entry and the broker as the metadata names it) and
        # "all brokers are down" per 30 s interval; before, each client logged every reconnect attempt
        assert 1 <= len(librdkafka) <= 6, librdkafka
    finally:
        service.stop(timeout_s=5)
        broker.down()

"""Pytest fixtures for a real Apache Kafka broker (load with ``pytest_plugins``).

``kafka_bootstrap_servers`` (session scope) picks, in order:

1. an external cluster, when ``CHANDY_BOOTSTRAP_SERVERS`` is set;
2. testcontainers' Kafka module, when ``CHANDY_TEST_KAFKA=testcontainers`` and a Docker engine
   is reachable (otherwise it says why and falls back);
3. the embedded broker (:class:`~connectors.kafka.broker.EmbeddedKafkaBroker`) in a temporary
   directory, stopped at the end of the session.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Iterator

import pytest

from connectors.kafka import config as kafka_config
from connectors.kafka.broker import EmbeddedKafkaBroker

log = logging.getLogger(__name__)

TEST_KAFKA_ENV = "CHANDY_TEST_KAFKA"


def _docker_reachable() -> bool:
    try:
        import docker  # testcontainers' dependency

        docker.from_env().ping()
        return True
    except Exception:  # noqa: BLE001 - any failure means "no engine to use"
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``bootstrap.servers`` of a real broker for the whole test session."""
    external = kafka_config.bootstrap_from_env()
    if external:
        yield external
        return
    if os.environ.get(TEST_KAFKA_ENV) == "testcontainers":
        if _docker_reachable():
            from testcontainers.kafka import KafkaContainer

            with KafkaContainer().with_kraft() as container:
                yield container.get_bootstrap_server()
            return
        log.warning("%s=testcontainers but no Docker engine is reachable: using the embedded broker", TEST_KAFKA_ENV)
    broker = EmbeddedKafkaBroker(tmp_path_factory.mktemp("kafka"))
    info = broker.up()
    try:
        yield info.bootstrap_servers
    finally:
        broker.down()


@pytest.fixture
def topic_prefix() -> str:
    """A prefix no other test uses, so each test has its own Chandy topics."""
    return f"t{uuid.uuid4().hex[:10]}"

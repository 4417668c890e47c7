"""A three-node KRaft cluster on one machine (``EmbeddedKafkaBroker(nodes=3)``, what ``chandy
kafka up --nodes 3`` starts): Chandy's topics get three replicas and ``min.insync.replicas`` 2;
checkpoints go on when one broker is killed with SIGKILL during checkpoints and again during a
coordinator restart (at most the checkpoints in flight fail), and a restarted broker's replicas
catch up (it is back in the in-sync replica set of every partition).

Slow (three JVMs, two kills and two restarts, about two minutes):
``.venv/bin/pytest -m slow tests/coordinator/kafka/test_cluster_kafka.py``.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource

from chandy.broker import EmbeddedKafkaBroker
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.runtime import CoordinatorService
from chandy.coordinator.kafka.topics import ChandyTopics, ensure_topics
from tests.fixtures.kafka import cluster_servers
from tests.fixtures.workers import Worker, options, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SUBTASKS = 3


@pytest.fixture(scope="module")
def cluster(kafka_cluster: EmbeddedKafkaBroker) -> EmbeddedKafkaBroker:
    """The module's three-node cluster (``kafka_cluster`` in tests/fixtures/kafka.py)."""
    return kafka_cluster


def _admin(cluster: EmbeddedKafkaBroker) -> AdminClient:
    return kafka_config.admin_client(cluster_servers(cluster))


def _leader(admin: AdminClient, topic: str) -> int:
    return admin.list_topics(topic, timeout=10).topics[topic].partitions[0].leader


def _all_in_sync(admin: AdminClient, topics: list[str]) -> bool:
    metadata = admin.list_topics(timeout=10)
    return all(
        sorted(p.isrs) == sorted(p.replicas) == [1, 2, 3]
        for name in topics for p in metadata.topics[name].partitions.values()
    )


def _configs(admin: AdminClient, resource: ConfigResource) -> dict | None:
    try:
        return admin.describe_configs([resource])[resource].result()
    except KafkaException:
        return None  # this broker does not know the young topic yet


def _completed(service: CoordinatorService) -> int:
    return service.stats()["counts"].get("completed", 0)


def _failed(service: CoordinatorService) -> int:
    return service.stats()["counts"].get("failed", 0)


def test_topics_get_three_replicas_and_two_in_sync(cluster: EmbeddedKafkaBroker, topic_prefix: str) -> None:
    admin = _admin(cluster)
    topics = ChandyTopics(topic_prefix)
    created = ensure_topics(admin, topics)
    names = [spec.name for spec in topics.specs()]
    assert sorted(created) == sorted(names)
    metadata = admin.list_topics(timeout=10)
    for name in names:
        assert all(len(p.replicas) == 3 for p in metadata.topics[name].partitions.values()), name
    for name in names:  # asked of every broker: each knows the topics and their settings
        for node in cluster.status().nodes:
            single = kafka_config.admin_client(f"127.0.0.1:{node.port}")
            resource = ConfigResource(ConfigResource.Type.TOPIC, name)
            entries = wait_for(lambda r=resource, a=single: _configs(a, r), 30, f"configs of {name}")
            assert entries["min.insync.replicas"].value == "2", (name, node.node_id)


def test_checkpoints_go_on_when_a_broker_dies_and_it_catches_up(
        cluster: EmbeddedKafkaBroker, topic_prefix: str, tmp_path: Path) -> None:
    servers = cluster_servers(cluster)
    admin = _admin(cluster)
    topics = ChandyTopics(topic_prefix)
    names = [spec.name for spec in topics.specs()]
    job = uuid.uuid4().hex
    opts = options(tmp_path, interval_ms=200, timeout_ms=20_000, tolerable_failed=10)
    service = CoordinatorService(job, servers, opts, {"op": SUBTASKS}, prefix=topic_prefix).start()
    workers = [Worker(servers, job, topic_prefix, "op", i).start() for i in range(SUBTASKS)]
    services = [service]
    try:
        wait_for(lambda: _completed(service) >= 5, 60, "five checkpoints before any kill")

        # 1. SIGKILL the leader of the coordinator log while checkpoints run every 200 ms
        victim = _leader(admin, topics.coordinator_log)
        before = _completed(service)
        cluster.kill_node(victim)
        assert victim not in cluster.alive_nodes()
        wait_for(lambda: _completed(service) >= before + 10, 120, "ten checkpoints after the kill")
        assert service.job_status != "FAILED" and not service.stopped.is_set()
        failed_first, completed_first = _failed(service), _completed(service)
        assert _leader(admin, topics.coordinator_log) != victim

        # the killed broker comes back and catches up: in the ISR of every partition again
        cluster.start_node(victim)
        wait_for(lambda: _all_in_sync(admin, names), 120, f"node {victim} back in every ISR")

        # 2. SIGKILL another broker while a new coordinator of the job takes over (fences,
        # replays the log, aborts what was pending, re-notifies the latest checkpoint)
        second = next(n for n in (1, 2, 3) if n != victim)
        last_before_restart = max(max(w.completed, default=0) for w in workers)
        restarted: list[CoordinatorService] = []
        starter = threading.Thread(target=lambda: restarted.append(
            CoordinatorService(job, servers, opts, {"op": SUBTASKS}, prefix=topic_prefix).start()))
        starter.start()
        time.sleep(0.3)
        cluster.kill_node(second)
        starter.join(120)
        assert restarted, "the new coordinator did not start while a broker was down"
        new = restarted[0]
        services.append(new)
        wait_for(lambda: service.fenced.is_set() or service.stopped.is_set(), 60, "the old coordinator fenced")
        assert new.epoch > service.epoch or service.fenced.is_set()
        wait_for(lambda: _completed(new) >= 10, 120, "ten checkpoints of the new coordinator with a broker down")
        assert new.job_status != "FAILED"
        # every worker followed the new coordinator: notified of checkpoints it decided
        wait_for(lambda: all(max(w.completed, default=0) > last_before_restart for w in workers), 60,
                 "workers notified by the new coordinator")

        cluster.start_node(second)
        wait_for(lambda: _all_in_sync(admin, names), 120, f"node {second} back in every ISR")
        completed_new = _completed(new)
        wait_for(lambda: _completed(new) >= completed_new + 3, 60, "checkpoints after both brokers are back")
        failed_second = _failed(new)
        print(f"\ncluster test: kill 1 (node {victim}, during checkpoints): {failed_first} failed of "
              f"{completed_first + failed_first}; kill 2 (node {second}, during a coordinator restart): "
              f"{failed_second} failed of {_completed(new) + failed_second}")
        # at most the checkpoints in flight at each kill fail (max_concurrent 1: one per kill,
        # plus the one a restart aborts as pending); nothing else
        assert failed_first <= 2 and failed_second <= 2, (failed_first, failed_second)
    finally:
        for worker in workers:
            worker.close()
        for s in services:
            s.stop()

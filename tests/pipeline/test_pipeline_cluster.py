"""The pipeline on a three-broker KRaft cluster (``chandy kafka up --nodes 3``: Chandy's topics with
three replicas and ``min.insync.replicas`` 2), landing into Delta while brokers die (issue 36):

1. the broker that leads the coordinator log's partition is SIGKILLed mid-run: the pipeline goes
   on committing, and every record is in the table exactly once;
2. ``chandy job stop`` with a ``--standby`` waiting: the job stays FINISHED and the standby exits 0
   without running it;
3. a rolling restart of all three brokers, one at a time, each back in every ISR before the next;
4. the coordinator log's leader paused (SIGSTOP) for 15 s, longer than the brokers' session
   timeout, then resumed;
5. the active driver's process tree frozen (SIGSTOP) while the standby takes over, then resumed:
   it is fenced (exit 3), and the consumer group's offsets, sampled every 100 ms, never decrease.

Each ends with every record in the table exactly once. Slow (three broker JVMs and Spark, about
ten minutes):
``flock /tmp/chandy-spark.lock .venv/bin/pytest -m slow tests/pipeline/test_pipeline_cluster.py -s``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
from deltalake import DeltaTable

from chandy.broker import EmbeddedKafkaBroker
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.requests import ControlRequestType, RequestStatus, send_request
from chandy.coordinator.kafka.topics import ChandyTopics
from tests.fixtures import REPO_ROOT
from tests.fixtures.kafka import cluster_servers
from tests.fixtures.pipeline import landed
from tests.fixtures.workers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = REPO_ROOT


@pytest.fixture(scope="module")
def cluster(kafka_cluster: EmbeddedKafkaBroker) -> EmbeddedKafkaBroker:
    """The module's three-node cluster (``kafka_cluster`` in tests/fixtures/kafka.py)."""
    return kafka_cluster


def _topic(servers: str, partitions: int = 2) -> str:
    from confluent_kafka.admin import NewTopic

    name = f"cl-{uuid.uuid4().hex[:8]}"
    admin = kafka_config.admin_client(servers)
    admin.create_topics([NewTopic(name, partitions, 3, config={"min.insync.replicas": "2"})])[name].result()
    wait_for(lambda: all(p.leader >= 0 for p in admin.list_topics(name, timeout=10).topics[name].partitions.values()),
             60, "the topic's leaders")
    return name


class _Producer:
    """Produces ``count`` records to ``topic`` at about ``rate`` per second from a thread (acks=all,
    idempotent, so a broker's death neither loses nor doubles one)."""

    def __init__(self, servers: str, topic: str, count: int, rate: int) -> None:
        self.producer = kafka_config.producer(servers, overrides={"enable.idempotence": True, "acks": "all"})
        self.topic, self.count, self.rate = topic, count, rate
        self.delivered = 0
        self.stopped = threading.Event()  # stop() ends production early: ``count`` is then what was sent
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _on_delivery(self, error: object, _message: object) -> None:
        if error is None:
            self.delivered += 1

    def _run(self) -> None:
        for i in range(self.count):
            if self.stopped.is_set():
                self.count = i
                break
            self.producer.produce(self.topic, f"v-{i}".encode(), f"k{i}".encode(), partition=i % 2,
                                  on_delivery=self._on_delivery)
            self.producer.poll(0)
            time.sleep(1 / self.rate)
        assert self.producer.flush(120) == 0

    def start(self) -> _Producer:
        self.thread.start()
        return self

    def stop(self, timeout_s: float = 180.0) -> int:
        """Stop producing; returns how many records were produced (all delivered)."""
        self.stopped.set()
        self.thread.join(timeout_s)
        assert not self.thread.is_alive() and self.delivered == self.count
        return self.count


def _pipeline(servers: str, topic: str, table: str, prefix: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "chandy.cli", "pipeline", "run", "--table", table, "--topic", topic, "-b", servers,
            "--prefix", prefix, "--max-records-per-checkpoint", "200", "--checkpoint-interval", "300",
            "--master", "local[1]", *extra]


def _all_in_sync(servers: str) -> bool:
    metadata = kafka_config.admin_client(servers).list_topics(timeout=10)
    return all(sorted(p.isrs) == sorted(p.replicas) for name, t in metadata.topics.items() if not name.startswith("__")
               for p in t.partitions.values())


def _commits(table: str) -> int:
    return DeltaTable(table).version() if DeltaTable.is_deltatable(table) else -1


def test_the_pipeline_rides_through_the_death_of_the_coordinator_logs_leader(cluster, tmp_path) -> None:
    servers = cluster_servers(cluster)
    topic, table, prefix = _topic(servers), str(tmp_path / "t"), f"cl{uuid.uuid4().hex[:6]}"
    producer = _Producer(servers, topic, 6000, 400).start()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    log_file = tmp_path / "pipeline.log"
    with open(log_file, "w") as err_file:
        run = subprocess.Popen(_pipeline(servers, topic, table, prefix, "--until-drained"), cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=err_file, start_new_session=True)
    try:
        wait_for(lambda: _commits(table) >= 3 or run.poll() is not None, 240, "three commits before the kill")
        assert run.poll() is None, log_file.read_text()[-3000:]
        from chandy.connectors.spark.options import default_job_id
        from chandy.coordinator.kafka.log import partition_for

        admin = kafka_config.admin_client(servers)
        log_topic = ChandyTopics(prefix).coordinator_log
        partitions = admin.list_topics(log_topic, timeout=10).topics[log_topic].partitions
        victim = partitions[partition_for(default_job_id(table, (topic,)), len(partitions))].leader  # the job's partition's
        cluster.kill_node(victim)
        killed_at = _commits(table)
        try:
            wait_for(lambda: _commits(table) >= killed_at + 3 or run.poll() is not None, 180,
                     "three commits after the broker's death")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {log_file.read_text()[-4000:]}") from None
        assert run.poll() is None or run.returncode == 0, log_file.read_text()[-3000:]
        assert _commits(table) >= killed_at + 3
        producer.thread.join(120)
        run.wait(300)
        assert run.returncode == 0, log_file.read_text()[-3000:]
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
        for node in (1, 2, 3):
            if node not in cluster.alive_nodes():
                cluster.start_node(node)
    rows = landed(table)
    assert len(rows) == len(set(rows)) == 6000


def test_a_stopped_job_stays_finished_with_a_standby_waiting(cluster, tmp_path) -> None:
    servers = cluster_servers(cluster)
    topic, table, prefix = _topic(servers), str(tmp_path / "t"), f"cl{uuid.uuid4().hex[:6]}"
    producer = _Producer(servers, topic, 2000, 400).start()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    args = _pipeline(servers, topic, table, prefix)
    active = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    standby = None
    try:
        wait_for(lambda: _commits(table) >= 2 or active.poll() is not None, 240, "the active pipeline's commits")
        assert active.poll() is None, active.communicate()[1][-3000:]
        standby = subprocess.Popen([*args, "--standby"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
        time.sleep(8)  # the standby joins the election group and waits
        assert standby.poll() is None
        from chandy.connectors.spark.options import default_job_id

        job = default_job_id(table, (topic,))
        answer = send_request(servers, job, ControlRequestType.STOP_WITH_SAVEPOINT, prefix=prefix, timeout_s=180)
        assert answer.status is RequestStatus.COMPLETED, answer.failure_message
        _, err = active.communicate(timeout=180)
        assert active.returncode == 0, err[-3000:]
        stopped_at = _commits(table)
        out, err = standby.communicate(timeout=120)
        assert standby.returncode == 0, err[-3000:]
        assert "ended (FINISHED" in err and "does not restart it" in err, err[-3000:]
        assert _commits(table) == stopped_at  # the standby landed nothing
    finally:
        for process in (active, standby):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        producer.thread.join(60)
    rows = landed(table)
    assert len(rows) == len(set(rows)) < 2000 or len(rows) == len(set(rows))


def _group_offsets(servers: str, group: str, topic: str) -> dict[int, int]:
    from confluent_kafka import TopicPartition

    consumer = kafka_config.consumer(servers, group_id=group)
    try:
        committed = consumer.committed([TopicPartition(topic, p) for p in (0, 1)], timeout=10)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in committed if tp.offset >= 0}


def test_a_rolling_restart_of_every_broker_loses_and_doubles_nothing(cluster, tmp_path) -> None:
    servers = cluster_servers(cluster)
    topic, table, prefix = _topic(servers), str(tmp_path / "t"), f"cl{uuid.uuid4().hex[:6]}"
    producer = _Producer(servers, topic, 10**9, 300).start()  # flows until every broker restarted
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    log_file = tmp_path / "pipeline.log"
    with open(log_file, "w") as err_file:
        args = _pipeline(servers, topic, table, prefix)
        run = subprocess.Popen([*args[:3], "-v", *args[3:]], cwd=ROOT, env=env,
                               stdout=subprocess.DEVNULL, stderr=err_file, start_new_session=True)
    try:
        wait_for(lambda: _commits(table) >= 2 or run.poll() is not None, 240, "two commits before the restarts")
        assert run.poll() is None, log_file.read_text()[-3000:]
        for node in (1, 2, 3):  # one broker at a time, each back before the next goes
            before = _commits(table)
            cluster.kill_node(node, signal.SIGTERM)
            cluster.start_node(node)
            wait_for(lambda: _all_in_sync(servers), 120, f"node {node} back in every ISR")  # as an operator waits
            try:
                wait_for(lambda b=before: _commits(table) > b or run.poll() is not None, 120, f"a commit after node {node}")
            except AssertionError as exc:
                raise AssertionError(f"{exc} (produced {producer.delivered}, landed {len(landed(table))}): "
                                     f"{log_file.read_text()[-6000:]}") from None
            assert run.poll() is None, log_file.read_text()[-3000:]
        produced = producer.stop()
        wait_for(lambda: len(landed(table)) >= produced or run.poll() is not None, 180, "every record landed")
        assert run.poll() is None, log_file.read_text()[-3000:]
        os.killpg(run.pid, signal.SIGTERM)  # a clean stop after the checkpoint in flight
        assert run.wait(120) == 128 + signal.SIGTERM, log_file.read_text()[-3000:]
    finally:
        producer.stopped.set()
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    rows = landed(table)
    assert len(rows) == len(set(rows)) == produced


def test_a_broker_paused_past_the_session_timeout_then_resumed(cluster, tmp_path) -> None:
    servers = cluster_servers(cluster)
    topic, table, prefix = _topic(servers), str(tmp_path / "t"), f"cl{uuid.uuid4().hex[:6]}"
    producer = _Producer(servers, topic, 5000, 300).start()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    run = subprocess.Popen(_pipeline(servers, topic, table, prefix, "--until-drained"), cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    paused = None
    try:
        wait_for(lambda: _commits(table) >= 2 or run.poll() is not None, 240, "two commits before the pause")
        assert run.poll() is None, run.communicate()[1][-3000:]
        admin = kafka_config.admin_client(servers)
        log_topic = ChandyTopics(prefix).coordinator_log
        paused = admin.list_topics(log_topic, timeout=10).topics[log_topic].partitions[0].leader
        pid = cluster.status().node(paused).pid
        os.kill(pid, signal.SIGSTOP)  # longer than the brokers' session timeouts (KRaft fences it)
        time.sleep(15)
        os.kill(pid, signal.SIGCONT)
        paused = None
        producer.thread.join(120)
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err[-3000:]
    finally:
        if paused is not None:
            os.kill(cluster.status().node(paused).pid, signal.SIGCONT)
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    rows = landed(table)
    assert len(rows) == len(set(rows)) == 5000


def test_a_frozen_leader_is_fenced_and_the_group_never_moves_back(cluster, tmp_path) -> None:
    """The active driver's whole process tree is frozen (SIGSTOP) mid-run; the standby takes over
    and lands; the old leader resumes: it is fenced (exit 3) and commits nothing, and the
    consumer group's offsets, sampled throughout, never decrease."""
    servers = cluster_servers(cluster)
    topic, table, prefix = _topic(servers), str(tmp_path / "t"), f"cl{uuid.uuid4().hex[:6]}"
    producer = _Producer(servers, topic, 20_000, 300).start()  # still flowing when the leader freezes
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    args = _pipeline(servers, topic, table, prefix)
    from chandy.connectors.spark.options import default_job_id

    group = f"chandy-{default_job_id(table, (topic,))}"
    active_log, standby_log = tmp_path / "active.log", tmp_path / "standby.log"
    with open(active_log, "w") as err_file:
        active = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err_file,
                                  start_new_session=True)
    standby = None
    samples: list[dict[int, int]] = []
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.is_set():
            samples.append(_group_offsets(servers, group, topic))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    frozen = False
    try:
        wait_for(lambda: _commits(table) >= 3 or active.poll() is not None, 240, "the active pipeline's commits")
        assert active.poll() is None, active_log.read_text()[-3000:]
        with open(standby_log, "w") as err_file:
            standby = subprocess.Popen([*args[:3], "-v", *args[3:], "--standby"], cwd=ROOT, env=env,
                                       stdout=subprocess.DEVNULL, stderr=err_file, start_new_session=True)
        wait_for(lambda: "waiting until the active coordinator stops" in standby_log.read_text()
                 or standby.poll() is not None, 240, "a waiting standby")
        assert standby.poll() is None, standby_log.read_text()[-3000:]
        sampler.start()
        os.killpg(active.pid, signal.SIGSTOP)
        frozen = True
        stopped_at = _commits(table)
        try:
            wait_for(lambda: _commits(table) >= stopped_at + 3, 180, "three commits of the standby")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {standby_log.read_text()[-4000:]}") from None
        os.killpg(active.pid, signal.SIGCONT)
        frozen = False
        assert active.wait(120) == 3, active_log.read_text()[-3000:]  # fenced
        producer.thread.join(120)
        wait_for(lambda: len(landed(table)) >= 20_000, 240, "every record landed by the standby")
        time.sleep(2)
    finally:
        sampling.set()
        if frozen:
            os.killpg(active.pid, signal.SIGCONT)
        for process in (active, standby):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    rows = landed(table)
    assert len(rows) == len(set(rows)) == 20_000
    assert len(samples) > 20
    for p in (0, 1):
        seen = [s[p] for s in samples if p in s]
        assert seen == sorted(seen), f"partition {p}: the group moved back: {seen}"

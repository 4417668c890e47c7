"""Replaying coordinator logs and following checkpoint events, against a real broker."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import uuid

import pytest

from chandy.coordinator.failure import CheckpointException
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.log import read_log
from chandy.coordinator.kafka.replay import ExportFileError, export_log, read_export, replay
from chandy.coordinator.kafka.runtime import CoordinatorService
from chandy.coordinator.kafka.subscriber import subscribe
from chandy.coordinator.kafka.topics import ChandyTopics
from chandy.coordinator.messages import CheckpointEvent
from chandy.coordinator.options import CheckpointingOptions
from chandy.schemas.codec import Schema, SingleObjectCodec, default_repository
from tests.fixtures import REPO_ROOT
from tests.fixtures.workers import Worker, read_events, wait_for

pytestmark = pytest.mark.integration
ROOT = REPO_ROOT


def chandy(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chandy.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "250"})


def test_replay_shows_every_decision_in_order_and_the_state_at_a_checkpoint(
        kafka_bootstrap_servers, topic_prefix, tmp_path) -> None:
    job = uuid.uuid4().hex
    options = CheckpointingOptions(interval_ms=0, timeout_ms=1500, tolerable_failed=5,
                                   checkpoint_dir=f"file://{tmp_path}/chk", savepoint_dir=f"file://{tmp_path}/sp")

    def service():
        return CoordinatorService(job, kafka_bootstrap_servers, options, {"src": 1}, prefix=topic_prefix)

    first = service().start(periodic=False)
    worker = Worker(kafka_bootstrap_servers, job, topic_prefix, "src", 0, decline={2}, hold={3}).start()
    try:
        first.trigger_checkpoint().result(30)
        live_after_1 = first.snapshot_state()
        with pytest.raises(CheckpointException, match="CHECKPOINT_DECLINED"):
            first.trigger_checkpoint().result(30)
        with pytest.raises(CheckpointException, match="CHECKPOINT_EXPIRED"):
            first.trigger_checkpoint().result(30)
        worker.release.set()
        first.trigger_savepoint().result(30)
        first.stop()  # a restart ...
        second = service().start(periodic=False)
        third = service().start(periodic=False)  # ... and a fencing
        wait_for(lambda: third.trigger_checkpoint().result(30), what="a checkpoint under epoch 3")
        third.stop()
        second.stop()
    finally:
        worker.close()

    result = chandy("log", "replay", "--job", job, "--format", "json", "--prefix", topic_prefix,
                    "-b", kafka_bootstrap_servers)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    timeline = [(e["event"], e.get("checkpoint_id"), e.get("reason") or e.get("epoch") or e.get("status"))
                for e in lines if e["event"] not in ("job_status", "state")]
    assert timeline == [
        ("epoch", None, 1),
        ("checkpoint_triggered", 1, 1), ("checkpoint_completed", 1, 1),
        ("checkpoint_triggered", 2, 1), ("checkpoint_aborted", 2, "CHECKPOINT_DECLINED"),
        ("checkpoint_triggered", 3, 1), ("checkpoint_aborted", 3, "CHECKPOINT_EXPIRED"),
        ("savepoint_triggered", 4, 1), ("savepoint_completed", 4, 1),
        ("epoch", None, 2),
        ("epoch", None, 3),
        ("checkpoint_triggered", 5, 3), ("checkpoint_completed", 5, 3),
        # one retained checkpoint: 1 falls out of retention, and the aborts before 5 go with it
        ("checkpoint_discarded", 1, None), ("checkpoint_discarded", 2, None), ("checkpoint_discarded", 3, None),
    ]
    epochs = [e for e in lines if e["event"] == "epoch"]
    assert (epochs[1]["previous_epoch"], epochs[1]["fenced"]) == (1, False)  # a clean restart
    assert (epochs[2]["previous_epoch"], epochs[2]["fenced"]) == (2, True)  # the third fenced the second
    statuses = [e["status"] for e in lines if e["event"] == "job_status"]
    assert statuses == ["RUNNING", "SUSPENDED", "RUNNING", "RUNNING", "SUSPENDED"]
    completed = next(e for e in lines if e["event"] == "checkpoint_completed")
    assert completed["acknowledged"] == "1 of 1" and completed["external_pointer"].endswith("chk-1")
    state = lines[-1]
    assert state["event"] == "state" and state["epoch"] == 3 and state["completed"] == [4, 5]

    # --until-checkpoint 1 gives the state the coordinator had then
    logged = list(read_log(kafka_bootstrap_servers, ChandyTopics(topic_prefix).coordinator_log, job_id=job))
    assert replay(logged, job_id=job, until_checkpoint=1).states[job] == live_after_1

    # an export replays the same, away from the cluster; replaying wrote nothing to the log
    export = tmp_path / "log.jsonl"
    assert export_log(kafka_bootstrap_servers, ChandyTopics(topic_prefix).coordinator_log, export, job_id=job) == len(logged)
    from_file = chandy("log", "replay", "--job", job, "--format", "json", "--from-file", str(export))
    assert from_file.stdout == result.stdout
    assert len(list(read_log(kafka_bootstrap_servers, ChandyTopics(topic_prefix).coordinator_log, job_id=job))) == len(logged)
    (tmp_path / "bad.jsonl").write_text('{"format": "something else"}\n')
    with pytest.raises(ExportFileError, match="not a Chandy log export"):
        list(read_export(tmp_path / "bad.jsonl"))
    human = chandy("log", "replay", "--job", job, "--prefix", topic_prefix, "-b", kafka_bootstrap_servers)
    assert human.returncode == 0 and "savepoint_completed" in human.stdout and "CHECKPOINT_EXPIRED" in human.stdout


def test_a_subscriber_process_receives_every_event_in_order_across_a_restart(
        kafka_bootstrap_servers, topic_prefix, tmp_path) -> None:
    job = uuid.uuid4().hex
    group = f"sub-{uuid.uuid4().hex[:8]}"
    service = CoordinatorService(job, kafka_bootstrap_servers, CheckpointingOptions(
        interval_ms=0, checkpoint_dir=f"file://{tmp_path}/chk"), {"src": 1}, prefix=topic_prefix).start(periodic=False)
    worker = Worker(kafka_bootstrap_servers, job, topic_prefix, "src", 0).start()

    def subscriber(max_events: int) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-m", "tests.procs.subscriber", kafka_bootstrap_servers,
                                    topic_prefix, group, job, str(max_events)], cwd=ROOT, stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, text=True)
        assert json.loads(process.stdout.readline())["ready"]
        return process

    try:
        first = subscriber(5)
        for _ in range(3):
            service.trigger_checkpoint().result(30)
        first_events = [json.loads(line) for line in first.stdout]
        assert first.wait(60) == 0
        for _ in range(3):
            service.trigger_checkpoint().result(30)
        second = subscriber(7)
        second_events = [json.loads(line) for line in second.stdout]
        assert second.wait(60) == 0
    finally:
        worker.close()
        service.stop()
    received = [(e["checkpoint_id"], e["event_type"]) for e in first_events + second_events]
    published = [(e.checkpoint_id, e.event_type) for e in
                 read_events(kafka_bootstrap_servers, ChandyTopics(topic_prefix).checkpoint_events, job, 12)]
    assert received == published == [(i, t) for i in range(1, 7) for t in ("TRIGGERED", "COMPLETED")]
    assert all(e["end_to_end_duration_ms"] is not None and e["num_acknowledged"] == 1
               for e in first_events + second_events if e["event_type"] == "COMPLETED")


def test_a_subscriber_decodes_an_event_of_a_newer_schema_version(kafka_bootstrap_servers, topic_prefix) -> None:
    from chandy.coordinator.kafka.topics import ensure_topics

    topics = ChandyTopics(topic_prefix)
    ensure_topics(kafka_config.admin_client(kafka_bootstrap_servers), topics)
    current = default_repository().current("CheckpointEvent")
    definition = copy.deepcopy(dict(current.definition))
    definition["fields"].append({"name": "region", "type": "string", "default": "eu"})
    event_type = next(f for f in definition["fields"] if f["name"] == "event_type")
    event_type["type"]["symbols"].append("RESCALED")
    newer = Schema.from_definition(definition)
    writer = SingleObjectCodec()
    writer.repository = type(writer.repository)([newer])
    value = {**CheckpointEvent("job-x", 9, "RESCALED", "CHECKPOINT", 2, 1000, 900, 100, 4, 4, 64).to_avro(),
             "region": "us"}
    producer = kafka_config.producer(kafka_bootstrap_servers)
    producer.produce(topics.checkpoint_events, writer.encode(newer.name, value), b"job-x")
    producer.flush(10)
    with subscribe(kafka_bootstrap_servers, start="earliest", prefix=topic_prefix, writer_schemas=[newer]) as sub:
        event = wait_for(lambda: sub.poll(1.0), what="the event")
    assert (event.checkpoint_id, event.event_type, event.end_to_end_duration_ms, event.num_acknowledged) == (
        9, "UNKNOWN", 100, 4)
    assert not hasattr(event, "region")

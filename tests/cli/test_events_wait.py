"""``chandy events wait`` and ``chandy events tail --type`` on a real broker, over events written as
a coordinator writes them (one transaction per batch, the job's ID as key): exit 0 once the
checkpoint is in the lake, 124 on timeout, 3 when the job ended without landing it."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time

import pytest

from chandy.coordinator.errors import ChandyError
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.subscriber import subscribe
from chandy.coordinator.kafka.topics import ChandyTopics, ensure_topics
from chandy.coordinator.messages import CheckpointEvent, OffsetRange
from chandy.schemas.codec import SingleObjectCodec
from tests.fixtures import REPO_ROOT

pytestmark = pytest.mark.integration

JOB = "0123456789abcdef0123456789abcdef"


def _publish(servers: str, prefix: str, events: list[CheckpointEvent]) -> None:
    topic = ChandyTopics(prefix).checkpoint_events
    producer = kafka_config.producer(servers, transactional_id=f"{prefix}-coordinator-{JOB}")
    producer.init_transactions(30)
    producer.begin_transaction()
    codec = SingleObjectCodec()
    for event in events:
        producer.produce(topic, codec.encode(event.SCHEMA, event.to_avro()), JOB.encode())
    producer.commit_transaction(30)


def _event(checkpoint: int, event_type: str, **fields) -> CheckpointEvent:
    now = int(time.time() * 1000)
    return CheckpointEvent(JOB, checkpoint, event_type, "CHECKPOINT", 1, now, now, **fields)


def _lake(checkpoint: int, version: int) -> CheckpointEvent:
    return _event(checkpoint, "LAKE_COMMITTED", table_uri="file:///lake/t", table_format="delta",
                  table_version=version, previous_table_version=version - 1, records_added=10, files_added=1,
                  offset_ranges=(OffsetRange("orders", 0, 10 * checkpoint, 10 * checkpoint + 10),))


def _cli(servers: str, prefix: str, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chandy.cli", "events", *args, "-b", servers, "--prefix", prefix],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s)


def test_wait_exits_0_when_landed_124_on_timeout_and_3_once_the_job_ended(kafka_bootstrap_servers, topic_prefix) -> None:
    servers, prefix = kafka_bootstrap_servers, topic_prefix
    ensure_topics(kafka_config.admin_client(servers), ChandyTopics(prefix))
    _publish(servers, prefix, [_event(1, "TRIGGERED"), _event(1, "COMPLETED"), _lake(1, 0),
                               _event(2, "TRIGGERED"), _event(2, "COMPLETED"), _lake(2, 1)])
    landed = _cli(servers, prefix, "wait", "--job", JOB, "--checkpoint", "2", "--format", "json")
    assert landed.returncode == 0, landed.stderr
    event = json.loads(landed.stdout)
    assert (event["event_type"], event["checkpoint_id"], event["table_version"]) == ("LAKE_COMMITTED", 2, 1)
    # a checkpoint an earlier one holds is landed too; another table's commits are not this one's
    assert _cli(servers, prefix, "wait", "--job", JOB, "--checkpoint", "1").returncode == 0
    other = _cli(servers, prefix, "wait", "--job", JOB, "--checkpoint", "1", "--table", "/elsewhere", "--timeout", "3")
    assert other.returncode == 124 and "was not in file:///elsewhere within 3 s" in other.stderr
    # not yet landed: a timeout, then landed while waiting
    early = _cli(servers, prefix, "wait", "--job", JOB, "--checkpoint", "3", "--timeout", "2")
    assert early.returncode == 124, early.stderr
    waiting = subprocess.Popen([sys.executable, "-m", "chandy.cli", "events", "wait", "--job", JOB, "--checkpoint", "3",
                                "--timeout", "60", "-b", servers, "--prefix", prefix],
                               cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    _publish(servers, prefix, [_event(3, "COMPLETED"), _lake(3, 2)])
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, err
    assert "#3 LAKE_COMMITTED file:///lake/t version 2, 10 records in 1 files" in out
    # the job ended: waiting for a checkpoint it never landed ends at once with 3
    _publish(servers, prefix, [_event(3, "JOB_STATUS_CHANGED", job_status="FINISHED")])
    started = time.monotonic()
    ended = _cli(servers, prefix, "wait", "--job", JOB, "--checkpoint", "9", "--timeout", "60")
    assert ended.returncode == 3 and "ended (FINISHED) without landing checkpoint 9" in ended.stderr
    assert time.monotonic() - started < 30


def test_wait_until_event_time_returns_the_first_commit_whose_watermark_reaches_it(kafka_bootstrap_servers,
                                                                                  topic_prefix) -> None:
    """``--until-event-time``: the first LAKE_COMMITTED whose completeness watermark
    (``valid_through_ms``) is at or past the time, given as ms or ISO-8601 (no zone: UTC); a
    commit without a watermark never answers it; with ``--checkpoint`` both must hold."""
    servers, prefix = kafka_bootstrap_servers, topic_prefix
    ensure_topics(kafka_config.admin_client(servers), ChandyTopics(prefix))
    hour = 1_795_000_000_000  # 2026-11-18T11:06:40Z
    _publish(servers, prefix, [_lake(1, 0),  # no watermark (a run with --transform)
                               dataclasses.replace(_lake(2, 1), valid_through_ms=hour - 1),
                               dataclasses.replace(_lake(3, 2), valid_through_ms=hour + 5_000),
                               dataclasses.replace(_lake(4, 3), valid_through_ms=hour + 9_000)])
    closed = _cli(servers, prefix, "wait", "--job", JOB, "--until-event-time", "2026-11-18T11:06:40", "--format", "json")
    assert closed.returncode == 0, closed.stderr
    assert json.loads(closed.stdout)["checkpoint_id"] == 3
    both = _cli(servers, prefix, "wait", "--job", JOB, "--until-event-time", str(hour), "--checkpoint", "4",
                "--format", "json")
    assert both.returncode == 0 and json.loads(both.stdout)["checkpoint_id"] == 4, both.stderr
    later = _cli(servers, prefix, "wait", "--job", JOB, "--until-event-time", str(hour + 10_000), "--timeout", "2")
    assert later.returncode == 124 and f"event time {hour + 10_000} ms of job {JOB} was not in" in later.stderr
    neither = _cli(servers, prefix, "wait", "--job", JOB)
    assert neither.returncode == 2 and "give --checkpoint, --until-event-time, or both" in neither.stderr
    garbled = _cli(servers, prefix, "wait", "--job", JOB, "--until-event-time", "yesterday")
    assert garbled.returncode == 2 and "neither ms since the epoch nor an ISO-8601 date-time" in garbled.stderr


def test_tail_and_subscribe_filter_event_types(kafka_bootstrap_servers, topic_prefix) -> None:
    servers, prefix = kafka_bootstrap_servers, topic_prefix
    ensure_topics(kafka_config.admin_client(servers), ChandyTopics(prefix))
    _publish(servers, prefix, [_event(1, "TRIGGERED"), _event(1, "COMPLETED"), _lake(1, 0), _event(2, "TRIGGERED"),
                               _event(2, "COMPLETED"), _lake(2, 1)])
    tail = _cli(servers, prefix, "tail", "--from-beginning", "--type", "LAKE_COMMITTED", "--max-events", "2",
                "--format", "json")
    assert tail.returncode == 0, tail.stderr
    events = [json.loads(line) for line in tail.stdout.splitlines()]
    assert [(e["event_type"], e["checkpoint_id"]) for e in events] == [("LAKE_COMMITTED", 1), ("LAKE_COMMITTED", 2)]
    assert events[1]["offset_ranges"] == [{"topic": "orders", "partition": 0, "start_offset": 20, "end_offset": 30}]
    bad = _cli(servers, prefix, "tail", "--type", "LANDED")
    assert bad.returncode == 2 and "LANDED" in bad.stderr
    with pytest.raises(ChandyError, match="unknown event type"):
        subscribe(servers, prefix=prefix, start="earliest", event_types=["LANDED"])
    with subscribe(servers, prefix=prefix, start="earliest", event_types=["COMPLETED"]) as sub:
        seen = []
        deadline = time.monotonic() + 30
        while len(seen) < 2 and time.monotonic() < deadline:
            event = sub.poll(1)
            if event is not None:
                seen.append((event.event_type, event.checkpoint_id))
    assert seen == [("COMPLETED", 1), ("COMPLETED", 2)]

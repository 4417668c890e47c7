"""Issue 35, on a coordinator log that Kafka's log cleaner really compacted: the pipeline runs,
restarts and is killed with SIGKILL while its log keeps every record; the log is exported; then
the topic's min.compaction.lag.ms drops to 0 and the broker's cleaner compacts it (checked by
counting the messages left). Afterwards a restart resumes from the compacted log exactly once,
the live replay equals the table's checkpoint, a replay before the history horizon is refused
naming it, and every replay from the horizon on equals the replay of the export made before
compaction, through ``chandy log replay`` as a user runs it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic
from deltalake import DeltaTable

from chandy.connectors.spark.options import default_job_id
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.log import partition_for
from tests.fixtures import REPO_ROOT, exactly_once

pytestmark = pytest.mark.integration

PARTITIONS = 3
CAP = 40  # records per partition per checkpoint: many checkpoints, many log records
LOG_PARTITIONS = 3


def _produce(servers: str, topic: str, start: int, count: int, content: dict) -> None:
    producer = kafka_config.producer(servers)
    for i in range(start, start + count):
        producer.produce(topic, f"v{i}-{uuid.uuid4().hex[:8]}".encode(), f"k{i}".encode(), partition=i % PARTITIONS)
    producer.flush(30)
    for message in exactly_once.consume_to_end(servers, topic, range(PARTITIONS)):
        content[(topic, message.partition(), message.offset())] = message.value()


def _log_messages(servers: str, topic: str, partition: int) -> int:
    """Messages left in the coordinator log's partition (read_committed, to its end)."""
    return sum(1 for _ in exactly_once.consume_to_end(servers, topic, [partition]))


def _replay(servers: str, prefix: str, job: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chandy.cli", "log", "replay", "--job", job, "--format", "json",
                           "-b", servers, "--prefix", prefix, *args],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)


def _state(output: str) -> dict:
    """The replayed state (the ``state`` line of --format json) without the horizon it reports."""
    state = next(json.loads(line) for line in output.splitlines() if '"event": "state"' in line)
    state.pop("history_horizon")
    return state


def test_a_really_compacted_log_restarts_exactly_once_and_replays_only_what_it_remembers(
        kafka_bootstrap_servers: str, tmp_path: Path) -> None:
    servers = kafka_bootstrap_servers
    prefix = f"cl{uuid.uuid4().hex[:8]}"
    log_topic = f"{prefix}.coordinator-log"
    admin = kafka_config.admin_client(servers)
    # the log as Chandy would make it, but with segments that roll at once and a cleaner that runs
    # on any dirt; compaction held back (min.compaction.lag.ms) until the export is taken
    admin.create_topics([NewTopic(log_topic, LOG_PARTITIONS, 1, config={
        "cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
        "min.compaction.lag.ms": str(3600 * 1000), "delete.retention.ms": str(3600 * 1000)})])[log_topic].result()
    topic = f"cl-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result()
    table = tmp_path / "table"
    job = default_job_id(str(table), [topic])
    content: dict = {}

    def run(crash_at: str | None = None) -> subprocess.CompletedProcess:
        return exactly_once.run_pipeline(["--table", str(table)], servers, topic, prefix, cap=CAP,
                                         parallelism=PARTITIONS, crash_at=crash_at)

    _produce(servers, topic, 0, 540, content)
    first = run()
    assert first.returncode == 0, first.stderr[-3000:]
    landed = DeltaTable(str(table)).transaction_version(job)
    _produce(servers, topic, 540, 540, content)
    killed = run(crash_at=f"before-offset-commit@{landed + 2}")  # a restart, then a kill -9 mid-run
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    second = run()
    assert second.returncode == 0, second.stderr[-3000:]
    exactly_once.assert_rows_exactly_once(DeltaTable(str(table)).to_pyarrow_table(columns=list(exactly_once.COLUMNS)),
                                          content)

    export = tmp_path / "log.jsonl"
    exported = subprocess.run([sys.executable, "-m", "chandy.cli", "log", "export", "--job", job, "-o", str(export),
                               "-b", servers, "--prefix", prefix], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=120)
    assert exported.returncode == 0, exported.stderr
    partition = partition_for(job, LOG_PARTITIONS)
    before = _log_messages(servers, log_topic, partition)
    # every record carries its key version: 0, 1, 2, ... per key, across the restarts and the kill
    versions: dict[str, list[int]] = {}
    for line in export.read_text().splitlines()[1:]:
        record = json.loads(line)
        versions.setdefault(record["key"], []).append(record["key_version"])
    assert all(v == list(range(len(v))) for v in versions.values()), versions
    assert max(len(v) for v in versions.values()) >= 3  # epoch, status, counter: rewritten

    # compaction, for real: the lag drops to 0, the broker's cleaner (log.cleaner.backoff.ms 1 s) runs
    def set_lag(ms: int) -> None:
        resource = ConfigResource(ConfigResource.Type.TOPIC, log_topic, incremental_configs=[
            ConfigEntry("min.compaction.lag.ms", str(ms), incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([resource])[resource].result()

    set_lag(0)
    deadline, after = time.monotonic() + 120, before
    while after >= before and time.monotonic() < deadline:
        time.sleep(2)
        after = _log_messages(servers, log_topic, partition)
    assert after < before, f"the log cleaner did not compact {log_topic} within 120 s ({before} messages)"
    set_lag(3600 * 1000)  # what is written from now on stays

    # a restart from the compacted log, killed with SIGKILL mid-run, and one more: what is new
    # lands exactly once
    _produce(servers, topic, 1080, 540, content)
    landed = DeltaTable(str(table)).transaction_version(job)
    killed = run(crash_at=f"before-lake-event@{landed + 2}")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    third = run()
    assert third.returncode == 0, third.stderr[-3000:]
    exactly_once.assert_rows_exactly_once(DeltaTable(str(table)).to_pyarrow_table(columns=list(exactly_once.COLUMNS)),
                                          content)
    assert exactly_once.committed_offsets(servers, f"chandy-{job}") == {
        (topic, p): len([k for k in content if k[1] == p]) for p in range(PARTITIONS)}

    # the whole log: the export made before compaction, then what was written after it
    later = tmp_path / "later.jsonl"
    exported = subprocess.run([sys.executable, "-m", "chandy.cli", "log", "export", "--job", job, "-o", str(later),
                               "-b", servers, "--prefix", prefix], cwd=REPO_ROOT, capture_output=True, text=True,
                              timeout=120)
    assert exported.returncode == 0, exported.stderr
    whole_lines = export.read_text().splitlines()
    exported_up_to = max(json.loads(line)["offset"] for line in whole_lines[1:])
    whole_lines += [line for line in later.read_text().splitlines()[1:] if json.loads(line)["offset"] > exported_up_to]
    whole_log = tmp_path / "whole.jsonl"
    whole_log.write_text("\n".join(whole_lines) + "\n")

    # the live state is exact: the newest completed checkpoint is the one the table holds
    live = _replay(servers, prefix, job)
    assert live.returncode == 0, live.stderr
    state = json.loads(next(line for line in live.stdout.splitlines() if '"event": "state"' in line))
    assert max(state["completed"]) == DeltaTable(str(table)).transaction_version(job)
    horizon = state["history_horizon"]
    assert horizon is not None, "a compacted log must report its horizon"
    earliest, last = horizon["checkpoint_id"], max(state["completed"])
    assert 1 < earliest < last - 3, (horizon, state["completed"])
    # before the horizon: refused, in one line naming it
    refused = _replay(servers, prefix, job, "--until-checkpoint", "1")
    assert refused.returncode != 0
    assert f"exact from checkpoint {earliest} (--until-checkpoint {earliest})" in refused.stderr
    assert len([line for line in refused.stderr.splitlines() if line.strip()]) == 1, refused.stderr
    # from the horizon on: what the whole log says at the same point
    for n in range(earliest, last + 1):
        compacted = _replay(servers, prefix, job, "--until-checkpoint", str(n))
        whole = _replay(servers, prefix, job, "--until-checkpoint", str(n), "--from-file", str(whole_log))
        assert compacted.returncode == 0 and whole.returncode == 0, compacted.stderr + whole.stderr
        assert _state(compacted.stdout) == _state(whole.stdout), f"--until-checkpoint {n}"
    # the whole log itself has no horizon
    assert json.loads(next(line for line in _replay(servers, prefix, job, "--from-file", str(whole_log))
                           .stdout.splitlines() if '"event": "state"' in line))["history_horizon"] is None

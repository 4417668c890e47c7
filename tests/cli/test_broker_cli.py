"""The embedded broker through the CLI a person uses: ``chandy kafka up``, ``status``, ``down``;
``up`` twice starts one broker; a missing Java is a one-line error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from chandy.broker import EmbeddedKafkaBroker, JavaNotFoundError, find_java
from chandy.coordinator.kafka import config as kafka_config

CHANDY = [sys.executable, "-m", "chandy.cli"]


def _chandy(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CHANDY, *args], capture_output=True, text=True, timeout=180, env=env)


@pytest.mark.integration
def test_up_twice_status_down(tmp_path: Path) -> None:
    data_dir = str(tmp_path / "kafka")
    first = _chandy("kafka", "up", "--data-dir", data_dir)
    assert first.returncode == 0, first.stderr
    bootstrap = first.stdout.strip()
    assert bootstrap.startswith("127.0.0.1:")
    pid = EmbeddedKafkaBroker(data_dir).status().pid
    try:
        second = _chandy("kafka", "up", "--data-dir", data_dir)
        assert second.returncode == 0, second.stderr
        assert second.stdout.strip() == bootstrap
        assert "already running" in second.stderr
        assert EmbeddedKafkaBroker(data_dir).status().pid == pid
        # the broker answers real clients
        assert kafka_config.admin_client(bootstrap).list_topics(timeout=10).brokers

        status = _chandy("kafka", "status", "--data-dir", data_dir, "--format", "json")
        assert status.returncode == 0, status.stderr
        shown = json.loads(status.stdout)
        assert shown["running"] and shown["bootstrap_servers"] == bootstrap
        assert shown["kafka_version"] == "4.1.0"
        human = _chandy("kafka", "status", "--data-dir", data_dir)
        assert "Apache Kafka 4.1.0" in human.stdout and bootstrap in human.stdout
    finally:
        down = _chandy("kafka", "down", "--data-dir", data_dir)
    assert down.returncode == 0 and "stopped" in down.stderr
    assert EmbeddedKafkaBroker(data_dir).status() is None
    assert not Path(f"/proc/{pid}").exists() or b"kafka.Kafka" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    after = _chandy("kafka", "status", "--data-dir", data_dir)
    assert after.returncode == 1 and "not running" in after.stderr


def test_missing_java_is_a_one_line_error(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path), "JAVA_HOME": str(tmp_path / "nowhere")}
    result = subprocess.run([*CHANDY, "kafka", "up", "--data-dir", str(tmp_path / "k")],
                            capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Java 17+ is required" in lines[0]


def test_find_java_rejects_nothing_on_the_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(JavaNotFoundError, match="JAVA_HOME"):
        find_java()


def test_bad_cli_arguments_are_usage_errors() -> None:
    result = _chandy("kafka", "up", "--override", "no-equals-sign")
    assert result.returncode == 2 and "expected key=value" in result.stderr
    result = _chandy("kafka", "up", "--port", "70000")
    assert result.returncode == 2 and "70000" in result.stderr


@pytest.mark.integration
def test_a_cluster_id_starting_with_a_dash_formats(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # one random cluster id in 64 starts with "-"; the storage tool must not read it as an option
    import base64

    from chandy.broker import config as broker_config
    from chandy.broker import distribution

    real = base64.urlsafe_b64encode
    monkeypatch.setattr(broker_config.base64, "urlsafe_b64encode", lambda raw: b"-" + real(raw)[1:])
    broker = EmbeddedKafkaBroker(tmp_path)
    tmp_path.mkdir(exist_ok=True)
    properties = broker._write_server_properties(1, {1: (broker_config.free_port(), broker_config.free_port())}, {})
    broker._format_storage(find_java(), distribution.resolve_kafka_jars(), 1, properties, broker._cluster_id(), {})
    assert "cluster.id=-" in (tmp_path / "kraft" / "meta.properties").read_text()


@pytest.mark.integration
def test_checkpoint_demo_runs_checkpoints_through_the_broker(kafka_bootstrap_servers: str) -> None:
    env = {**os.environ, "CHANDY_BOOTSTRAP_SERVERS": kafka_bootstrap_servers, "COLUMNS": "200"}
    result = _chandy("checkpoint", "demo", "--subtasks", "3", "--checkpoints", "4", env=env)
    assert result.returncode == 0, result.stderr
    rows = [[c.strip() for c in line.split("│") if c.strip()] for line in result.stdout.splitlines()
            if line.startswith("│")]
    assert len(rows) == 1
    cells = rows[0]
    assert cells[1:4] == ["3", "4", "0"]  # subtasks, completed, failed
    # the demo deleted the topics of its own (chandy-demo-<job>.*) when it ended
    leftover = [t for t in kafka_config.admin_client(kafka_bootstrap_servers).list_topics(timeout=10).topics
                if t.startswith(f"chandy-demo-{cells[0][:6]}")]
    assert leftover == []
    kept = _chandy("checkpoint", "demo", "--subtasks", "1", "--checkpoints", "1", "--keep-topics", env=env)
    assert kept.returncode == 0, kept.stderr
    job = [[c.strip() for c in line.split("│") if c.strip()] for line in kept.stdout.splitlines()
           if line.startswith("│")][0][0]
    remaining = [t for t in kafka_config.admin_client(kafka_bootstrap_servers).list_topics(timeout=10).topics
                 if t.startswith(f"chandy-demo-{job[:6]}.")]
    assert f"chandy-demo-{job[:6]}.control" in remaining

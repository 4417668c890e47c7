"""Issue 33: a real Prometheus (Debian's ``prometheus`` package; ``.ci/run`` installs it) scrapes a
running pipeline, and every PromQL expression of the shipped Grafana dashboard
(``docker/grafana/dashboards/chandy.json``) answers with a series through Prometheus' HTTP API, as
do the checkpoint, job and Kafka-source expressions Flink's dashboards are written with (Flink's
metric names and labels, as its Prometheus reporter exposes them)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from chandy.broker import free_port
from tests.fixtures import REPO_ROOT
from tests.fixtures.lake_pipeline import make_topic
from tests.fixtures.object_store import stop_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

DASHBOARD = REPO_ROOT / "docker" / "grafana" / "dashboards" / "chandy.json"

#: The expressions of Flink dashboards' checkpoint, job and Kafka-source panels, as they are
#: written against Flink's Prometheus reporter (written here from Flink's metric names, labels and
#: the usual panel queries; not copied from one dashboard).
FLINK_PANEL_EXPRESSIONS = (
    "flink_jobmanager_job_lastCheckpointDuration",
    "max by (job_name) (flink_jobmanager_job_lastCheckpointDuration)",
    "flink_jobmanager_job_lastCheckpointSize",
    "flink_jobmanager_job_lastCheckpointFullSize",
    "flink_jobmanager_job_numberOfCompletedCheckpoints",
    "increase(flink_jobmanager_job_numberOfCompletedCheckpoints[1m])",
    "flink_jobmanager_job_numberOfFailedCheckpoints",
    "increase(flink_jobmanager_job_numberOfFailedCheckpoints[5m])",
    "flink_jobmanager_job_numberOfInProgressCheckpoints",
    "flink_jobmanager_job_totalNumberOfCheckpoints",
    "flink_jobmanager_job_lastCheckpointRestoreTimestamp",
    "flink_jobmanager_job_lastCompletedCheckpointId",
    "flink_jobmanager_job_uptime",
    "flink_jobmanager_job_numRestarts",
    "flink_jobmanager_job_runningState == 1",
    'sum by (job_name) (flink_taskmanager_job_task_operator_pendingRecords)',
    'max by (job_name, topic, partition) (flink_taskmanager_job_task_operator_pendingRecords)',
    'sum by (job_name, operator_name) (flink_taskmanager_job_task_operator_numRecordsInPerSecond)',
    'sum by (job_name, operator_name) (flink_taskmanager_job_task_operator_numRecordsOutPerSecond)',
    'sum by (job_name) (flink_taskmanager_job_task_operator_numRecordsIn)',
    'sum by (job_name) (flink_taskmanager_job_task_operator_numRecordsOut)',
    'sum by (job_name) (flink_taskmanager_job_task_operator_numRecordsInErrors)',
    'max by (job_name, operator_name) (flink_taskmanager_job_task_operator_currentFetchEventTimeLag)',
    # issue 47: the rest of what Flink dashboards plot for a job and a Kafka source
    "sum(flink_jobmanager_numRunningJobs)",
    "flink_jobmanager_job_restartingTime",
    'sum by (job_name) (flink_taskmanager_job_task_operator_KafkaSourceReader_commitsSucceeded)',
    'rate(flink_taskmanager_job_task_operator_KafkaSourceReader_commitsSucceeded[1m])',
    'sum by (job_name) (flink_taskmanager_job_task_operator_KafkaSourceReader_commitsFailed)',
    'max by (job_name) (flink_taskmanager_job_task_operator_sourceIdleTime)',
    'max by (job_name, operator_name) (flink_taskmanager_job_task_operator_currentEmitEventTimeLag)',
    'max by (job_name) (flink_taskmanager_job_task_checkpointAlignmentTime)',
    'sum by (job_name) (flink_taskmanager_job_task_operator_KafkaSourceReader_KafkaConsumer_bytes_consumed_rate)',
    'avg by (job_name) (flink_taskmanager_job_task_operator_KafkaSourceReader_KafkaConsumer_records_per_request_avg)',
)


#: The queries of the checkpoint, job and Kafka-source panels of Confluent's Flink dashboards
#: (confluentinc/jmx-monitoring-stacks, flink-jobmanager.json and flink-taskmanager.json), whose
#: template variables a user's scrape configuration fills: the scrape job ``flink`` and the labels
#: ``env``, ``flink_cluster_id``, ``pod`` (set on the target below). Their JVM, slot, network,
#: back-pressure, RocksDB and Kafka-producer panels are about a Flink cluster Chandy does not run.
SCOPE = 'job="flink", env="test", flink_cluster_id=~".*", pod=~".*"'
TASK_SCOPE = 'job="flink", env="test", flink_cluster_id=~".*", job_id=~".*"'
PUBLIC_PANEL_EXPRESSIONS = (
    f"max(flink_jobmanager_job_totalNumberOfCheckpoints{{{SCOPE}}})",
    f"sum(flink_jobmanager_job_numRestarts{{{SCOPE}}})",
    f"min(flink_jobmanager_job_runningTime{{{SCOPE}}})",
    "flink_jobmanager_job_runningTime",
    f"max(flink_jobmanager_job_lastCheckpointDuration{{{SCOPE}}})",
    f"flink_jobmanager_job_lastCheckpointDuration{{{SCOPE}}}",
    f"max(flink_jobmanager_job_lastCheckpointSize{{{SCOPE}}})",
    f"flink_jobmanager_job_lastCheckpointSize{{{SCOPE}}}",
    f"flink_jobmanager_job_totalNumberOfCheckpoints{{{SCOPE}}}",
    f"max(flink_jobmanager_job_numberOfFailedCheckpoints{{{SCOPE}}} / "
    f"flink_jobmanager_job_totalNumberOfCheckpoints{{{SCOPE}}})",
    f"flink_jobmanager_job_numberOfFailedCheckpoints{{{SCOPE}}} / flink_jobmanager_job_totalNumberOfCheckpoints{{{SCOPE}}}",
    f"sum(flink_taskmanager_job_task_operator_numRecordsInErrors{{{TASK_SCOPE}}})",
    f"sum(flink_taskmanager_job_task_numRecordsInPerSecond{{{TASK_SCOPE}}})",
    f"sum(flink_taskmanager_job_task_numRecordsOutPerSecond{{{TASK_SCOPE}}})",
    f"flink_taskmanager_job_task_numRecordsInPerSecond{{{TASK_SCOPE}}}",
    f"flink_taskmanager_job_task_numRecordsOutPerSecond{{{TASK_SCOPE}}}",
    f"flink_taskmanager_job_task_operator_KafkaSourceReader_KafkaConsumer_records_lag_max{{{TASK_SCOPE}}}",
    f"flink_taskmanager_job_task_operator_KafkaSourceReader_KafkaConsumer_records_consumed_rate{{{TASK_SCOPE}}}",
    f"flink_taskmanager_job_task_operator_KafkaSourceReader_KafkaConsumer_bytes_consumed_rate{{{TASK_SCOPE}}}",
    f"flink_taskmanager_job_task_operator_KafkaSourceReader_KafkaConsumer_records_per_request_avg{{{TASK_SCOPE}}}",
)


def dashboard_expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


def query(prometheus: str, expression: str) -> list:
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
    with urllib.request.urlopen(url, timeout=10) as answer:
        body = json.loads(answer.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def start_prometheus(tmp_path: Path, target: str) -> tuple[subprocess.Popen, str]:
    executable = shutil.which("prometheus")
    if executable is None:
        pytest.skip("Prometheus is missing: apt-get install prometheus (.ci/run installs it)")
    config = tmp_path / "prometheus.yml"
    # the scrape job and target labels a Flink deployment's dashboards select on (see PUBLIC_PANEL_EXPRESSIONS)
    config.write_text(f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: flink\n"
                      f"    static_configs:\n      - targets: ['{target}']\n"
                      f"        labels: {{env: test, flink_cluster_id: chandy, pod: chandy-0}}\n")
    port = free_port()
    process = subprocess.Popen([executable, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                               stderr=(tmp_path / "prometheus.log").open("wb"), start_new_session=True)
    return process, f"http://127.0.0.1:{port}"


def test_every_dashboard_expression_answers_from_a_real_prometheus(kafka_bootstrap_servers, tmp_path) -> None:
    topic = make_topic(kafka_bootstrap_servers, [b"v%d" % i for i in range(4000)], partitions=2)
    metrics_port = free_port()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    pipeline = subprocess.Popen(
        [sys.executable, "-m", "chandy.cli", "pipeline", "run", "--table", str(tmp_path / "table"), "--topic", topic,
         "-b", kafka_bootstrap_servers, "--prefix", f"pr{os.getpid()}", "--max-records-per-checkpoint", "200",
         "--checkpoint-interval", "500", "--metrics-port", str(metrics_port), "--job-name", "orders to lake",
         "--master", "local[1]", "--conf", "spark.ui.enabled=false"],
        cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=(tmp_path / "pipeline.log").open("wb"),
        start_new_session=True)
    prometheus, url = start_prometheus(tmp_path, f"127.0.0.1:{metrics_port}")
    try:
        deadline = time.monotonic() + 240
        while True:  # two scrapes at least after the first micro-batch (rate() and increase() need two)
            try:
                ready = query(url, "count_over_time(flink_taskmanager_job_task_operator_lastLakeCommitDuration[1m])")
            except OSError:
                ready = []
            if ready and float(ready[0]["value"][1]) >= 3:
                break
            assert pipeline.poll() is None, (tmp_path / "pipeline.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no lake commit scraped within 240 s"
            time.sleep(1)
        empty = [e for e in (*dashboard_expressions(), *FLINK_PANEL_EXPRESSIONS, *PUBLIC_PANEL_EXPRESSIONS)
                 if not query(url, e)]
        assert empty == [], f"no series for: {empty}"
        (series,) = query(url, 'flink_jobmanager_job_lastCheckpointDuration{job_name="orders to lake"}')
        assert set(series["metric"]) >= {"job_id", "job_name", "host"} and float(series["value"][1]) > 0
        lag = query(url, "flink_taskmanager_job_task_operator_pendingRecords")
        assert {s["metric"]["topic"] for s in lag} == {topic} and len(lag) == 2
    finally:
        os.killpg(pipeline.pid, signal.SIGTERM)
        try:
            pipeline.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(pipeline.pid, signal.SIGKILL)
        stop_server(prometheus)

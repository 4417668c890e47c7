"""Operating a running pipeline over Kafka, on a real broker, real Spark and real Delta tables:
an intermediate savepoint lands nothing by itself, stop-with-savepoint leaves the table and the
consumer group exactly at the savepoint, and a new job restored from it into a new table lands
exactly the rest."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
from deltalake import DeltaTable

from chandy.connectors.spark.options import PipelineError
from chandy.connectors.spark.pipeline import Pipeline
from chandy.coordinator.kafka.requests import ControlRequestType, RequestStatus, send_request
from tests.fixtures import REPO_ROOT, exactly_once
from tests.fixtures.pipeline import all_offsets, group_offsets, landed, make_topic, options
from tests.fixtures.workers import wait_for

pytestmark = pytest.mark.integration

T = ControlRequestType
ROOT = REPO_ROOT


def _checkpoint_ids(table: str) -> list[int]:
    """The chandy.checkpoint_id of every commit of ``table``, oldest first."""
    return [int(h["chandy.checkpoint_id"]) for h in reversed(DeltaTable(table).history()) if "chandy.checkpoint_id" in h]


def test_savepoint_then_stop_with_savepoint_then_restore_into_a_new_table(spark, kafka_bootstrap_servers,
                                                                          tmp_path) -> None:
    topic = make_topic(kafka_bootstrap_servers, [f"v-{i}".encode() for i in range(4000)])
    table, new_table = str(tmp_path / "t"), str(tmp_path / "t2")
    prefix = f"rq{uuid.uuid4().hex[:6]}"
    opts = options(kafka_bootstrap_servers, topic, table, prefix, stop_when_drained=False,
                   max_records_per_checkpoint=100, checkpoint_interval_ms=200)
    pipeline = Pipeline(opts, spark=spark)
    summaries = []
    runner = threading.Thread(target=lambda: summaries.append(pipeline.run()), daemon=True)
    runner.start()
    try:
        wait_for(lambda: DeltaTable.is_deltatable(table) and DeltaTable(table).version() >= 1, timeout_s=180,
                 what="the first commit")
        savepoint = send_request(kafka_bootstrap_servers, pipeline.job_id, T.TRIGGER_SAVEPOINT, prefix=prefix,
                                 timeout_s=120)
        assert savepoint.status is RequestStatus.COMPLETED, savepoint.failure_message
        assert savepoint.external_pointer and "/savepoints/" in savepoint.external_pointer
        wait_for(lambda: max(_checkpoint_ids(table)) > savepoint.checkpoint_id, timeout_s=120,
                 what="a checkpoint after the savepoint")
        # an intermediate savepoint commits nothing by itself; its records land with the next checkpoint
        assert savepoint.checkpoint_id not in _checkpoint_ids(table)
        stop = send_request(kafka_bootstrap_servers, pipeline.job_id, T.STOP_WITH_SAVEPOINT, prefix=prefix,
                            timeout_s=180)
        assert stop.status is RequestStatus.COMPLETED, stop.failure_message
        runner.join(120)
    finally:
        if runner.is_alive():
            pipeline.request_stop()
            runner.join(120)
    (summary,) = summaries
    assert summary.stopped_because.startswith("stopped with savepoint") and stop.external_pointer in summary.stopped_because
    first = landed(table)
    assert len(first) == len(set(first)) and 0 < len(first) < 4000
    # the table, the consumer group and the savepoint agree: the stop-with-savepoint is the table's last commit
    assert _checkpoint_ids(table)[-1] == stop.checkpoint_id
    ends = {p: max(o for (_, q, o) in first if q == p) + 1 for p in (0, 1)}
    assert group_offsets(kafka_bootstrap_servers, opts.resolved_group_id, topic) == ends

    restored = Pipeline(options(kafka_bootstrap_servers, topic, new_table, prefix, job_id=uuid.uuid4().hex,
                                from_savepoint=stop.external_pointer), spark=spark).run()
    assert restored.stopped_because == "drained"
    second = landed(new_table)
    assert len(second) == len(set(second))
    assert set(first).isdisjoint(second) and set(first) | set(second) == all_offsets(kafka_bootstrap_servers, topic)
    assert min(_checkpoint_ids(new_table)) > stop.checkpoint_id  # IDs continue above the savepoint's


def test_cancel_stops_the_pipeline_and_nothing_more_lands(spark, kafka_bootstrap_servers, tmp_path) -> None:
    topic = make_topic(kafka_bootstrap_servers, [f"v-{i}".encode() for i in range(3000)])
    table = str(tmp_path / "t")
    prefix = f"rq{uuid.uuid4().hex[:6]}"
    pipeline = Pipeline(options(kafka_bootstrap_servers, topic, table, prefix, stop_when_drained=False,
                                max_records_per_checkpoint=100, checkpoint_interval_ms=200), spark=spark)
    summaries = []
    runner = threading.Thread(target=lambda: summaries.append(pipeline.run()), daemon=True)
    runner.start()
    try:
        wait_for(lambda: DeltaTable.is_deltatable(table) and DeltaTable(table).version() >= 1, timeout_s=180,
                 what="the first commit")
        answer = send_request(kafka_bootstrap_servers, pipeline.job_id, T.CANCEL, prefix=prefix, timeout_s=120)
        assert answer.status is RequestStatus.COMPLETED, answer.failure_message
        runner.join(120)
    finally:
        if runner.is_alive():
            pipeline.request_stop()
            runner.join(120)
    (summary,) = summaries
    assert summary.stopped_because == f"canceled by request {answer.request_id}"
    rows = landed(table)
    assert len(rows) == len(set(rows)) < 3000
    assert pipeline.service is not None and pipeline.service.job_status == "CANCELED"


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_standby_pipeline_takes_over_after_a_sigkill_and_lands_every_record_once(kafka_bootstrap_servers,
                                                                                   tmp_path, fmt) -> None:
    topic = make_topic(kafka_bootstrap_servers, [f"v-{i}".encode() for i in range(3000)])
    table = str(tmp_path / "t")
    warehouse, table_name = tmp_path / "warehouse", f"lake.t{uuid.uuid4().hex[:6]}"
    table_args = (["--table", table] if fmt == "delta" else
                  ["--table", f"iceberg://local/{table_name}", "--catalog-property", f"warehouse={warehouse}"])

    def rows() -> list[tuple[str, int, int]]:
        if fmt == "delta":
            return landed(table) if DeltaTable.is_deltatable(table) else []
        if not (warehouse / "catalog.db").exists():
            return []
        from pyiceberg.exceptions import NoSuchTableError

        try:
            data = exactly_once.iceberg_table(warehouse, table_name).scan(
                selected_fields=("topic", "partition", "offset")).to_arrow()
        except NoSuchTableError:  # until the first commit creates it
            return []
        return list(zip(*(data.column(c).to_pylist() for c in ("topic", "partition", "offset")), strict=True))

    prefix = f"rq{uuid.uuid4().hex[:6]}"
    args = [sys.executable, "-m", "chandy.cli", "pipeline", "run", *table_args, "--topic", topic,
            "-b", kafka_bootstrap_servers, "--prefix", prefix, "--max-records-per-checkpoint", "50",
            "--until-drained", "--master", "local[1]"]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    active = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    standby = None
    try:
        wait_for(lambda: len(rows()) > 100, timeout_s=180, what="the active pipeline's first commits")
        standby = subprocess.Popen([*args, "--standby"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
        time.sleep(5)  # the standby joins the election group and waits
        assert standby.poll() is None and active.poll() is None
        killed = time.monotonic()
        os.killpg(active.pid, signal.SIGKILL)  # the driver and its Spark JVM, mid-run
        before = len(rows())
        out, err = standby.communicate(timeout=300)
        assert standby.returncode == 0, err[-3000:]
        print(f"standby finished {time.monotonic() - killed:.1f} s after the SIGKILL; {err.count('leads')} take-over")
        assert "leads" in err  # it says it took over
    finally:
        for process in (active, standby):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    landed_rows = rows()
    assert before < 3000 and len(landed_rows) == len(set(landed_rows)) == 3000
    # issue 35: one LAKE_COMMITTED per commit, in order, after its COMPLETED, through the take-over
    source = all_offsets(kafka_bootstrap_servers, topic)
    if fmt == "delta":
        exactly_once.check_delta_lake_events(kafka_bootstrap_servers, prefix, table, topic, source)
    else:
        exactly_once.check_iceberg_lake_events(kafka_bootstrap_servers, prefix, warehouse, table_name, topic, source)


def _run_into(pipeline: Pipeline, running: concurrent.futures.Future) -> None:
    """Run ``pipeline`` and settle ``running`` with its summary or its error."""
    if running.set_running_or_notify_cancel():
        try:
            running.set_result(pipeline.run())
        except PipelineError as exc:
            running.set_exception(exc)


def test_a_pipeline_that_gives_up_on_kafka_fails_the_job_for_good(spark, kafka_bootstrap_servers, tmp_path) -> None:
    """Issue 36, with issue 54's failOnDataLoss: the source topic deleted under the running
    pipeline stops the run with one error (``KafkaDataLossError: <topic>-<p> is gone``, Spark's
    "partitions are gone"; before issue 54 a PipelineKafkaError once ``--kafka-retry-timeout`` ran
    out), the job FAILED in the coordinator log and on the events topic (no restart: it would meet
    the same log); a plain second run of the job is refused (FAILED is terminal), naming
    ``--from-savepoint``."""
    from confluent_kafka.admin import AdminClient

    from chandy.coordinator.kafka.log import load_state
    from chandy.coordinator.kafka.topics import ChandyTopics
    from chandy.coordinator.records import JobStatus
    from tests.fixtures.workers import read_events

    topic = make_topic(kafka_bootstrap_servers, [f"v-{i}".encode() for i in range(400)])
    table, prefix = str(tmp_path / "t"), f"gv{uuid.uuid4().hex[:6]}"
    opts = options(kafka_bootstrap_servers, topic, table, prefix, stop_when_drained=False,
                   max_records_per_checkpoint=100, checkpoint_interval_ms=200, kafka_retry_timeout_ms=3000,
                   restart_strategy="none")
    pipeline = Pipeline(opts, spark=spark)
    running: concurrent.futures.Future = concurrent.futures.Future()
    runner = threading.Thread(target=lambda: _run_into(pipeline, running), daemon=True)
    runner.start()
    try:
        wait_for(lambda: len(landed(table)) == 400 if DeltaTable.is_deltatable(table) else False, timeout_s=180,
                 what="every record landed")
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap_servers})  # held: its futures need the handle
        admin.delete_topics([topic])[topic].result(30)
        runner.join(120)
    finally:
        if runner.is_alive():
            pipeline.request_stop()
            runner.join(120)
    error = running.exception(0)
    state, _ = load_state(kafka_bootstrap_servers, ChandyTopics(prefix).coordinator_log, pipeline.job_id)
    # a deleted source topic is data loss (Spark's failOnDataLoss: "partitions are gone"), found by
    # the lag poll before Kafka's retries run out: FAILED for good, as a Kafka call that gave up
    gone = f"KafkaDataLossError: {topic}-"
    assert isinstance(error, PipelineError) and gone in str(error) and "is gone" in str(error), error
    assert state.job_status is JobStatus.FAILED and gone in (state.job_status_reason or ""), state.job_status_reason
    changes = wait_for(lambda: [e.job_status for e in read_events(
        kafka_bootstrap_servers, ChandyTopics(prefix).checkpoint_events, pipeline.job_id, expected=100, timeout_s=2)
        if e.event_type == "JOB_STATUS_CHANGED"], what="the JOB_STATUS_CHANGED event")
    assert changes == ["FAILED"]
    assert len(landed(table)) == len(set(landed(table))) == 400  # nothing lost or doubled on the way out
    wait_for(lambda: topic not in admin.list_topics(timeout=10).topics, what="the topic's deletion")
    make_topic(kafka_bootstrap_servers, [b"again"], topic=topic)  # the run would start, but for FAILED
    with pytest.raises(PipelineError, match="--from-savepoint"):
        Pipeline(opts, spark=spark).run()


class _FailingCommits:
    """The lake sink's ``commit``, failing its first ``failures`` calls as a lake outage does (an
    S3 503, a catalog 5xx), then committing."""

    def __init__(self, sink, failures: int) -> None:
        from chandy.connectors.lake.sink import LakeCommitError

        self.commit, self.failures, self.calls, self.error = sink.commit, failures, 0, LakeCommitError

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error(f"the object store answered 503 Slow Down (call {self.calls})")
        return self.commit(*args, **kwargs)


def test_lake_errors_for_a_while_restart_the_job_until_it_recovers(spark, kafka_bootstrap_servers, tmp_path,
                                                                  monkeypatch) -> None:
    """Issue 44, item 5: a failing lake commit is a global failure that Flink's default restart
    strategy (exponential-delay) restarts: the job restarts from its latest completed checkpoint
    (whose restore commits it again) until the lake answers, then lands every record exactly once;
    the job never becomes FAILED and each restart is a new coordinator epoch (numRestarts)."""
    from chandy.coordinator.kafka.log import load_state
    from chandy.coordinator.kafka.topics import ChandyTopics
    from chandy.coordinator.records import JobStatus

    topic = make_topic(kafka_bootstrap_servers, [f"v-{i}".encode() for i in range(300)])
    table, prefix = str(tmp_path / "t"), f"rs{uuid.uuid4().hex[:6]}"
    pipeline = Pipeline(options(kafka_bootstrap_servers, topic, table, prefix, max_records_per_checkpoint=50,
                                flink_conf={"restart-strategy.exponential-delay.initial-backoff": "200 ms"}),
                        spark=spark)
    failing = _FailingCommits(pipeline.sink, failures=3)
    monkeypatch.setattr(pipeline.sink, "commit", failing)  # the driver's committer commits through it
    summary = pipeline.run()
    assert failing.calls > 3
    assert summary.restarts >= 3, summary
    assert any("restarting (restart 1)" in n and "503 Slow Down" in n for n in summary.notices), summary.notices
    rows = landed(table)
    assert len(rows) == len(set(rows)) == 300 and set(rows) == all_offsets(kafka_bootstrap_servers, topic)
    assert group_offsets(kafka_bootstrap_servers, f"chandy-{pipeline.job_id}", topic) == \
        {p: max(o for _, q, o in rows if q == p) + 1 for p in range(2)}
    state, _ = load_state(kafka_bootstrap_servers, ChandyTopics(prefix).coordinator_log, pipeline.job_id)
    assert state.job_status is not JobStatus.FAILED
    assert state.epoch >= 1 + summary.restarts  # each restart a new coordinator (Flink's numRestarts)
    # Flink's restartingTime (issue 47): the last restart took at least its backoff (200 ms doubled by
    # exponential-delay's 1.5 at least once), and it is over
    assert pipeline.restarting_ms >= 200 and pipeline._restart_began is None


def test_a_restart_strategy_that_gives_up_fails_the_job(spark, kafka_bootstrap_servers, tmp_path, monkeypatch) -> None:
    """``fixed-delay`` with one attempt: the lake keeps failing, the job restarts once, then ends
    FAILED in its log, the error naming the strategy, and nothing lands twice or is committed to the
    consumer group past the table."""
    from chandy.coordinator.kafka.log import load_state
    from chandy.coordinator.kafka.topics import ChandyTopics
    from chandy.coordinator.records import JobStatus

    topic = make_topic(kafka_bootstrap_servers, [f"v-{i}".encode() for i in range(100)])
    table, prefix = str(tmp_path / "t"), f"rs{uuid.uuid4().hex[:6]}"
    pipeline = Pipeline(options(kafka_bootstrap_servers, topic, table, prefix, restart_strategy="fixed-delay",
                                flink_conf={"restart-strategy.fixed-delay.attempts": "1",
                                            "restart-strategy.fixed-delay.delay": "100 ms"}), spark=spark)
    monkeypatch.setattr(pipeline.sink, "commit", _FailingCommits(pipeline.sink, failures=1000))
    with pytest.raises(PipelineError, match=r"503 Slow Down.*the fixed-delay restart strategy gave up after 1 "
                                            r"restart\(s\)"):
        pipeline.run()
    state, _ = load_state(kafka_bootstrap_servers, ChandyTopics(prefix).coordinator_log, pipeline.job_id)
    assert state.job_status is JobStatus.FAILED and "gave up" in (state.job_status_reason or "")
    assert not DeltaTable.is_deltatable(table) or landed(table) == []
    assert group_offsets(kafka_bootstrap_servers, f"chandy-{pipeline.job_id}", topic) in ({}, {0: -1001, 1: -1001})

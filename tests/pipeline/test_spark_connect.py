"""The pipeline through Spark Connect (``--remote sc://...``): a real Spark Connect server started
from pyspark's own scripts and jars (tests/fixtures/spark_connect.py), the coordinator, the lake
committer and the source's enumerator in the client process, the tasks on the server's executors,
with nothing but DataFrames between them. The client is SIGKILLed at each step of the commit
protocol it runs and restarted; the table then holds every record of the source once, with its
value, read through deltalake or pyiceberg (not the writer)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import NewTopic
from deltalake import DeltaTable

from chandy.coordinator.faults import POINTS
from chandy.coordinator.kafka import config as kafka_config
from tests.fixtures import REPO_ROOT, exactly_once
from tests.fixtures.lake_pipeline import all_offsets
from tests.fixtures.pipeline import landed, make_topic
from tests.fixtures.workers import wait_for

pytestmark = pytest.mark.integration

PARTITIONS = 2
PER_PARTITION = 300
CAP = 120  # records per partition per checkpoint: checkpoints 1, 2 and 3 carry data
#: the steps of the commit protocol that the client (the driver of the protocol) runs; the
#: tasks' own steps run in the server's Python workers (test_a_client_killed_while_its_tasks_run...)
CLIENT_POINTS = tuple(p for p in POINTS if not p.startswith("task-"))


@pytest.fixture(scope="module")
def connect_topic(kafka_bootstrap_servers: str) -> tuple[str, dict]:
    """A topic of 2 partitions of JSON values, each unique."""
    topic = f"sc-{uuid.uuid4().hex[:8]}"
    admin = kafka_config.admin_client(kafka_bootstrap_servers)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result()
    time.sleep(0.5)
    producer = kafka_config.producer(kafka_bootstrap_servers, overrides={"linger.ms": 5})
    for i in range(PER_PARTITION * PARTITIONS):
        value = json.dumps({"id": i, "name": f"n-{uuid.uuid4().hex[:6]}", "amount": i * 0.25}).encode()
        producer.produce(topic, value, f"k{i}".encode(), partition=i % PARTITIONS)
    producer.flush(30)
    content = {(topic, m.partition(), m.offset()): m.value()
               for m in exactly_once.consume_to_end(kafka_bootstrap_servers, topic, range(PARTITIONS))}
    assert len(content) == PER_PARTITION * PARTITIONS
    return topic, content


def remote(url: str) -> tuple[str, ...]:
    return ("--remote", url)


def run(servers: str, topic: str, table: Path, prefix: str, url: str, *extra: str,
        crash_at: str | None = None) -> subprocess.CompletedProcess:
    return exactly_once.run_cli(["--table", str(table), "--topic", topic, "-b", servers, "--prefix", prefix,
                                 "--until-drained", "--max-records-per-checkpoint", str(CAP),
                                 "--parallelism", str(PARTITIONS), *extra], crash_at=crash_at, spark=remote(url))


def check_landed_once(servers: str, table: Path, prefix: str, topic: str, content: dict) -> None:
    """Every record of ``content`` in the Delta table once with its value (read through
    deltalake), one LAKE_COMMITTED per commit, and no data file the table does not reference."""
    data = DeltaTable(str(table)).to_pyarrow_table(columns=list(exactly_once.COLUMNS))
    exactly_once.assert_rows_exactly_once(data, content)
    exactly_once.check_delta_lake_events(servers, prefix, str(table), topic, set(content))
    referenced = {Path(u).name for u in DeltaTable(str(table)).file_uris()}
    on_disk = {p.name for p in table.rglob("part-chandy-*.parquet")}
    assert on_disk == referenced, f"unreferenced files left: {sorted(on_disk - referenced)}"


@pytest.mark.parametrize("point", CLIENT_POINTS)
def test_a_client_killed_at_each_step_then_restarted_lands_every_record_once(
        kafka_bootstrap_servers, spark_connect_url, connect_topic, tmp_path, point) -> None:
    topic, content = connect_topic
    table = tmp_path / "table"
    prefix = f"sc{uuid.uuid4().hex[:8]}"
    crashed = run(kafka_bootstrap_servers, topic, table, prefix, spark_connect_url, crash_at=f"{point}@2")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    finished = run(kafka_bootstrap_servers, topic, table, prefix, spark_connect_url)
    assert finished.returncode == 0, finished.stderr[-3000:]
    check_landed_once(kafka_bootstrap_servers, table, prefix, topic, content)


def test_cli_help_names_remote_and_spark_remote() -> None:
    shown = subprocess.run([sys.executable, "-m", "chandy.cli", "pipeline", "run", "--help"], cwd=REPO_ROOT,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "--remote" in shown.stdout and "SPARK_REMOTE" in shown.stdout


def table_args(fmt: str, tmp_path: Path) -> tuple[list[str], Any]:
    """The ``--table`` arguments of a Delta or an Iceberg table, and a reader of its rows (pyarrow)."""
    if fmt == "delta":
        table = tmp_path / "table"
        return ["--table", str(table)], lambda: DeltaTable(str(table)).to_pyarrow_table()
    warehouse, name = tmp_path / "warehouse", f"lake.t{uuid.uuid4().hex[:6]}"
    return (["--table", f"iceberg://local/{name}", "--catalog-property", f"warehouse={warehouse}"],
            lambda: exactly_once.iceberg_table(warehouse, name).scan().to_arrow())


@pytest.mark.parametrize("fmt", ["delta", pytest.param("iceberg", marks=pytest.mark.slow)])
def test_json_values_through_a_transform_land_with_every_field_across_a_kill(
        kafka_bootstrap_servers, spark_connect_url, connect_topic, tmp_path, fmt) -> None:
    """JSON decoded into columns, a ``--transform`` of DataFrame operations (planned by the Spark
    Connect server), the client killed before the lake commit of checkpoint 2 and restarted: every
    record lands once, each field equal to what was produced, the transform's columns computed."""
    topic, content = connect_topic
    args, read = table_args(fmt, tmp_path)
    prefix = f"sc{uuid.uuid4().hex[:8]}"
    extra = ("--value-format", "json", "--transform", "tests.transforms.connect:with_doubled_amount")
    crashed = exactly_once.run_cli([*args, "--topic", topic, "-b", kafka_bootstrap_servers, "--prefix", prefix,
                                    "--until-drained", "--max-records-per-checkpoint", str(CAP), *extra],
                                   crash_at="before-lake-commit@2", spark=remote(spark_connect_url))
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    finished = exactly_once.run_cli([*args, "--topic", topic, "-b", kafka_bootstrap_servers, "--prefix", prefix,
                                     "--until-drained", "--max-records-per-checkpoint", str(CAP), *extra],
                                    spark=remote(spark_connect_url))
    assert finished.returncode == 0, finished.stderr[-3000:]
    rows = read().to_pylist()
    assert len(rows) == len(content) == len({(r["topic"], r["partition"], r["offset"]) for r in rows})
    for row in rows:
        produced = json.loads(content[(row["topic"], row["partition"], row["offset"])])
        assert (row["id"], row["name"], row["amount"]) == (produced["id"], produced["name"], produced["amount"])
        assert row["amount_x2"] == produced["amount"] * 2 and row["name_upper"] == produced["name"].upper()
        assert row["key"] == f"k{produced['id']}".encode()


def test_a_standby_client_takes_over_after_a_sigkill(kafka_bootstrap_servers, spark_connect_url, tmp_path) -> None:
    """Two clients of one job on one Spark Connect server: the active one is SIGKILLed mid-run,
    the standby (warm: its session open, its Python workers started) leads and finishes; every
    record lands once."""
    # 3,000 records, 40 a checkpoint: the active client is still running when it is killed (with
    # 1,500 at 50 a checkpoint it once landed them all during the standby's 5 s start)
    topic = make_topic(kafka_bootstrap_servers, [f"v-{i}".encode() for i in range(3000)])
    table = str(tmp_path / "t")
    prefix = f"sb{uuid.uuid4().hex[:6]}"
    args = [sys.executable, "-m", "chandy.cli", "pipeline", "run", "--table", table, "--topic", topic,
            "-b", kafka_bootstrap_servers, "--prefix", prefix, "--max-records-per-checkpoint", "40",
            "--until-drained", "--remote", spark_connect_url]
    active = subprocess.Popen(args, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    standby = None

    def rows() -> list[tuple[str, int, int]]:
        return landed(table) if DeltaTable.is_deltatable(table) else []

    try:
        wait_for(lambda: len(rows()) > 100, timeout_s=180, what="the active client's first commits")
        standby = subprocess.Popen([*args, "--standby"], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
        time.sleep(5)  # the standby joins the election group and waits
        assert standby.poll() is None and active.poll() is None
        killed = time.monotonic()
        os.killpg(active.pid, signal.SIGKILL)
        before = len(rows())
        out, err = standby.communicate(timeout=300)
        assert standby.returncode == 0, err[-3000:]
        print(f"standby finished {time.monotonic() - killed:.1f} s after the SIGKILL")
        assert "leads" in err
    finally:
        for process in (active, standby):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    landed_rows = rows()
    assert before < 3000 and len(landed_rows) == len(set(landed_rows)) == 3000
    exactly_once.check_delta_lake_events(kafka_bootstrap_servers, prefix, table, topic,
                                         all_offsets(kafka_bootstrap_servers, topic))


def test_a_client_killed_while_its_tasks_run_on_the_server_then_restarted_lands_every_record_once(
        kafka_bootstrap_servers, connect_topic, tmp_path, monkeypatch) -> None:
    """The tasks' own steps: a Spark Connect server whose Python workers kill the client when a
    task of checkpoint 2 starts reading (``task-read@2``) and, in the next run, when a task of
    checkpoint 3 wrote its files (``task-written@3``). Unlike a classic local driver, the killed
    client's tasks go on running on the server, writing files and acknowledging for a coordinator
    that is gone; the restarted client must land every record once all the same."""
    from tests.fixtures.spark_connect import spark_connect_server

    topic, content = connect_topic
    table = tmp_path / "table"
    prefix = f"st{uuid.uuid4().hex[:8]}"
    pgid_file = tmp_path / "client.pgid"
    monkeypatch.setenv("CHANDY_CRASH_PGID", f"@{pgid_file}")
    with spark_connect_server(tmp_path / "server", env={"CHANDY_CRASH_AT": "task-read@2,task-written@3",
                                                       "CHANDY_CRASH_PGID": f"@{pgid_file}"}) as url:
        for point in ("task-read@2", "task-written@3"):
            crashed = run(kafka_bootstrap_servers, topic, table, prefix, url)
            assert crashed.returncode == -signal.SIGKILL, f"{point}: {crashed.stderr[-3000:]}"
        monkeypatch.delenv("CHANDY_CRASH_PGID")
        finished = run(kafka_bootstrap_servers, topic, table, prefix, url)
        assert finished.returncode == 0, finished.stderr[-3000:]
    check_landed_once(kafka_bootstrap_servers, table, prefix, topic, content)


def test_a_bad_or_unreachable_remote_fails_in_one_line(kafka_bootstrap_servers, tmp_path) -> None:
    topic = make_topic(kafka_bootstrap_servers, [b"v"])
    base = ["--table", str(tmp_path / "t"), "--topic", topic, "-b", kafka_bootstrap_servers, "--until-drained"]
    bad = exactly_once.run_cli(base, spark=("--remote", "http://spark:15002"), timeout_s=60)
    assert bad.returncode != 0 and "is not a Spark Connect URL" in bad.stderr and "Traceback" not in bad.stderr
    from tests.fixtures.spark_cluster import free_port

    started = time.monotonic()
    gone = exactly_once.run_cli(base, spark=("--remote", f"sc://127.0.0.1:{free_port()}/;token=secret"),
                                timeout_s=120)
    assert gone.returncode != 0 and "cannot reach the Spark Connect server" in gone.stderr, gone.stderr[-2000:]
    assert "secret" not in gone.stderr and "Traceback" not in gone.stderr
    assert time.monotonic() - started < 60  # not pyspark's minutes of retries


def test_connect_urls_are_parsed_and_redacted() -> None:
    from chandy.connectors.spark.spark_urls import connect_address, redact_remote

    assert connect_address("sc://localhost") == ("localhost", 15002)
    assert connect_address("sc://spark.example:443/;use_ssl=true;token=abc") == ("spark.example", 443)
    assert connect_address("sc://[::1]:15099") == ("::1", 15099)
    assert redact_remote("sc://h:443/;use_ssl=true;token=abc;x=1") == "sc://h:443/;use_ssl=true;token=***;x=1"
    from chandy.connectors.spark.options import PipelineError, PipelineOptions

    def options(remote: str) -> PipelineOptions:
        return PipelineOptions(table_uri="/tmp/t", bootstrap_servers="b:9092", topics=("t",), remote=remote)

    for good in ("sc://localhost", "sc://h:15002", "sc://[::1]:15099", "sc://h:443/;use_ssl=true;token=abc"):
        assert options(good).remote == good and options(good).resolved_ship_code
    for bad in ("http://h:15002", "sc://", "sc://h:port", "localhost:15002"):
        with pytest.raises(PipelineError, match="is not a Spark Connect URL"):
            options(bad)


def test_routed_debezium_avro_into_delta_and_iceberg_equals_the_final_state(
        kafka_bootstrap_servers, spark_connect_url, tmp_path) -> None:
    """Avro values, ``--cdc debezium`` merges and ``--route`` to a Delta and an Iceberg table,
    all through Spark Connect: each table equals its shard's final state, field by field."""
    from tests.fixtures import debezium

    stream = debezium.change_stream()
    base = f"sc{uuid.uuid4().hex[:6]}"
    shards = {0: f"{base}.shard0.flights", 1: f"{base}.shard1.flights"}
    admin = kafka_config.admin_client(kafka_bootstrap_servers)
    for topic in shards.values():
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result()
    producer = kafka_config.producer(kafka_bootstrap_servers)
    for i, row, op in stream:
        key, value = debezium.avro_message(i, row, op)
        producer.produce(shards[i % 2], value, key, partition=(i // 2) % PARTITIONS)
    producer.flush(30)
    (tmp_path / "envelope.avsc").write_text(json.dumps(debezium.VALUE_SCHEMA))
    (tmp_path / "key.avsc").write_text(json.dumps(debezium.KEY_SCHEMA))
    lake, warehouse = tmp_path / "lake", tmp_path / "warehouse"
    finished = exactly_once.run_cli([
        "--table", str(lake / "unrouted"), "--topic-pattern", rf"{base}\..*", "-b", kafka_bootstrap_servers,
        "--prefix", f"sc{uuid.uuid4().hex[:6]}", "--cdc", "debezium", "--value-format", "avro", "--avro-framing", "raw",
        "--value-schema", f"@{tmp_path / 'envelope.avsc'}", "--key-schema", f"@{tmp_path / 'key.avsc'}",
        "--route", rf"{base}\.shard0\.flights=delta:{lake}/shard0", "--route", rf"{base}\.(shard1)\.flights=iceberg://local/cdc.$1",
        "--catalog-property", f"warehouse={warehouse}", "--until-drained", "--max-records-per-checkpoint", "30"],
        spark=remote(spark_connect_url))
    assert finished.returncode == 0, finished.stderr[-3000:]
    expected = {n: debezium.final_state([e for e in stream if e[0] % 2 == n]) for n in (0, 1)}
    assert debezium.table_rows(DeltaTable(str(lake / "shard0")).to_pyarrow_table()) == expected[0]
    assert debezium.table_rows(exactly_once.iceberg_table(warehouse, "cdc.shard1").scan().to_arrow()) == expected[1]


def test_stop_with_savepoint_and_the_metrics_of_a_client(kafka_bootstrap_servers, spark_connect_url, tmp_path) -> None:
    """A running client (no --until-drained) serves Flink's checkpoint metrics, and ``chandy job
    stop`` ends it with a savepoint committed to the table: everything before it lands, once."""
    import urllib.request

    from chandy.connectors.spark.options import default_job_id
    from tests.fixtures.spark_cluster import free_port

    topic = make_topic(kafka_bootstrap_servers, [f"v-{i}".encode() for i in range(1000)])
    table = str(tmp_path / "t")
    prefix = f"ss{uuid.uuid4().hex[:6]}"
    port = free_port()
    client = subprocess.Popen(
        [sys.executable, "-m", "chandy.cli", "pipeline", "run", "--table", table, "--topic", topic,
         "-b", kafka_bootstrap_servers, "--prefix", prefix, "--max-records-per-checkpoint", "100",
         "--checkpoint-interval", "200", "--metrics-port", str(port), "--remote", spark_connect_url],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for(lambda: len(landed(table) if DeltaTable.is_deltatable(table) else []) == 1000, timeout_s=180,
                 what="every record landed")

        def scrape() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
                return response.read().decode()

        metrics = scrape()
        completed = [line for line in metrics.splitlines()
                     if line.startswith("flink_jobmanager_job_numberOfCompletedCheckpoints{")]
        assert completed and float(completed[0].rsplit(" ", 1)[1]) >= 5, completed
        stop = subprocess.run([sys.executable, "-m", "chandy.cli", "job", "stop", "--job", default_job_id(table, [topic]),
                               "-b", kafka_bootstrap_servers, "--prefix", prefix, "--timeout", "120"],
                              cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
        assert stop.returncode == 0 and "/savepoints/" in stop.stdout, stop.stdout + stop.stderr[-2000:]
        out, err = client.communicate(timeout=120)
        assert client.returncode == 0, err[-3000:]
        assert "stopped with savepoint" in out and "is FINISHED" in err, out[-2000:] + err[-2000:]
    finally:
        if client.poll() is None:
            os.killpg(client.pid, signal.SIGKILL)
    rows = landed(table)
    assert len(rows) == len(set(rows)) == 1000


@pytest.mark.slow
def test_a_client_rides_through_its_connect_server_being_killed_and_started_again(
        kafka_bootstrap_servers, tmp_path) -> None:
    """The Spark Connect server is SIGKILLed mid-run (its driver, executors and Python workers)
    and started again on the same port 5 s later. The client's micro-batches fail (pyspark's
    retries bounded to about a minute), the job restarts from its latest completed checkpoint
    with a new session (a restarted server has lost the old one, its artifacts and data sources),
    and lands every record once. About a minute: ``.venv/bin/pytest -m slow tests/pipeline/test_spark_connect.py``."""
    from tests.fixtures.spark_cluster import free_port
    from tests.fixtures.spark_connect import spark_connect_server

    topic = make_topic(kafka_bootstrap_servers, [f"v-{i}".encode() for i in range(2000)])
    table = str(tmp_path / "t")
    port = free_port()
    url = f"sc://127.0.0.1:{port}"

    def rows() -> list[tuple[str, int, int]]:
        return landed(table) if DeltaTable.is_deltatable(table) else []

    with spark_connect_server(tmp_path / "first", port=port, crash_at_exit=True):
        client = subprocess.Popen(
            [sys.executable, "-m", "chandy.cli", "pipeline", "run", "--table", table, "--topic", topic,
             "-b", kafka_bootstrap_servers, "--prefix", f"rs{uuid.uuid4().hex[:6]}", "--until-drained",
             "--max-records-per-checkpoint", "25", "--remote", url, "--restart-strategy", "fixed-delay",
             "-D", "restart-strategy.fixed-delay.attempts=20", "-D", "restart-strategy.fixed-delay.delay=2 s"],
            cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            wait_for(lambda: len(rows()) >= 100, timeout_s=180, what="the client's first commits")
        except BaseException:
            os.killpg(client.pid, signal.SIGKILL)
            raise
    before = len(rows())  # the first server is gone (its process group stopped)
    try:
        time.sleep(5)
        assert client.poll() is None, client.stderr.read()[-3000:] if client.stderr else ""
        with spark_connect_server(tmp_path / "second", port=port):
            _, err = client.communicate(timeout=400)
    finally:
        if client.poll() is None:
            os.killpg(client.pid, signal.SIGKILL)
    assert client.returncode == 0, err[-3000:]
    assert "restarting" in err, err[-3000:]
    landed_rows = rows()
    assert before < 2000 and len(landed_rows) == len(set(landed_rows)) == 2000

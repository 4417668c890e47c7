"""Routing one job's records to many tables (``--route``), exactly once: real Kafka, real Spark,
Delta tables read back with deltalake's reader and Iceberg tables with pyiceberg's scan (neither
is the writer), compared field by field with what was produced.

- Four topics, three routed by a regex template into three tables the job creates, the fourth
  (matching no rule) into the job's own table; the job is SIGKILLed at every step of the commit
  protocol (one crash per run, a restart after each, seven in a row) and each record ends in its
  table exactly once, every table's commits announced once each, no unreferenced file left.
- Routing by a decoded field's value: a static map, a template whose group is the table's name
  (a value that would leave its place, ``x/../y``, is not routed), a Delta and an Iceberg
  target, and unrouted records (that one, and a null field) dead-lettered.
"""

from __future__ import annotations

import decimal
import json
import signal
import uuid
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic
from deltalake import DeltaTable

from chandy.connectors.spark.options import default_job_id
from chandy.coordinator.faults import ROUTED_POINTS
from chandy.coordinator.kafka import config as kafka_config
from tests.fixtures import exactly_once

pytestmark = pytest.mark.integration

PARTITIONS = 2
PER_PARTITION = 180
CAP = 10  # records per partition per checkpoint: 18 checkpoints carry data


@pytest.fixture(scope="module")
def routed_topics(kafka_bootstrap_servers: str) -> tuple[str, dict[str, dict]]:
    """Topics <base>.sales.{a,b,c} and <base>.misc, 2 partitions each, unique values."""
    base = f"rt{uuid.uuid4().hex[:8]}"
    topics = [f"{base}.sales.{x}" for x in "abc"] + [f"{base}.misc"]
    admin = kafka_config.admin_client(kafka_bootstrap_servers)
    for topic in topics:
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result()
    producer = kafka_config.producer(kafka_bootstrap_servers, overrides={"linger.ms": 5})
    for topic in topics:
        for i in range(PER_PARTITION * PARTITIONS):
            producer.produce(topic, f"{topic}/{i}/{uuid.uuid4().hex}".encode(), f"k{i}".encode(),
                             partition=i % PARTITIONS)
    producer.flush(30)
    content = {topic: {(topic, m.partition(), m.offset()): m.value()
                       for m in exactly_once.consume_to_end(kafka_bootstrap_servers, topic)} for topic in topics}
    assert all(len(c) == PER_PARTITION * PARTITIONS for c in content.values())
    return base, content


def _check_delta_table(path: Path, content: dict) -> None:
    table = DeltaTable(str(path))
    exactly_once.assert_rows_exactly_once(table.to_pyarrow_table(columns=list(exactly_once.COLUMNS)), content)
    referenced = {Path(u).name for u in table.file_uris()}
    on_disk = {p.name for p in path.rglob("part-chandy-*.parquet")}
    assert on_disk == referenced, f"{path}: unreferenced files left: {sorted(on_disk - referenced)}"


#: the kills ``make test`` runs (where routing adds a step: before the first table's commit, between
#: two tables' commits, after the last); ``-m slow`` runs every step of :data:`ROUTED_POINTS`
ROUTED_KEY_POINTS = ("before-lake-commit", "between-table-commits", "before-offset-commit")


@pytest.mark.parametrize("points", [pytest.param(ROUTED_KEY_POINTS, id="key-steps"),
                                    pytest.param(ROUTED_POINTS, id="every-step", marks=pytest.mark.slow)])
def test_topics_routed_by_regex_into_created_tables_exactly_once_through_a_kill_at_every_step(
        kafka_bootstrap_servers, routed_topics, tmp_path, points: tuple[str, ...]) -> None:
    base, content = routed_topics
    lake = tmp_path / "lake"
    prefix = f"rt{uuid.uuid4().hex[:8]}"
    args = ["--table", str(lake / "default"), "--topic-pattern", rf"{base}\..*", "-b", kafka_bootstrap_servers,
            "--prefix", prefix, "--route", rf"{base}\.sales\.(.*)=delta:{lake}/sales/$1", "--until-drained",
            "--max-records-per-checkpoint", str(CAP), "--parallelism", "2"]
    for i, point in enumerate(points):
        crashed = exactly_once.run_cli(args, crash_at=f"{point}@{2 + 3 * i}")
        assert crashed.returncode == -signal.SIGKILL, f"{point}: {crashed.stderr[-3000:]}"
    finished = exactly_once.run_cli(args)
    assert finished.returncode == 0, finished.stderr[-3000:]

    for x in "abc":
        _check_delta_table(lake / "sales" / x, content[f"{base}.sales.{x}"])
    _check_delta_table(lake / "default", content[f"{base}.misc"])  # the unrouted topic
    assert sorted(p.name for p in (lake / "sales").iterdir()) == ["a", "b", "c"]

    job = default_job_id(str(lake / "default"), (), rf"{base}\..*")
    consumer = kafka_config.consumer(kafka_bootstrap_servers)
    ends = {(t, p): consumer.get_watermark_offsets(TopicPartition(t, p), timeout=10, cached=False)[1]
            for t in content for p in range(PARTITIONS)}
    consumer.close()
    assert exactly_once.committed_offsets(kafka_bootstrap_servers, f"chandy-{job}") == ends

    # every Chandy commit of every table announced exactly once, with that table's version
    events = [e for e in exactly_once.read_events(kafka_bootstrap_servers, prefix, job)
              if e["event_type"] == "LAKE_COMMITTED"]
    for path in [lake / "sales" / x for x in "abc"] + [lake / "default"]:
        uri = f"file://{path}"
        announced = [(e["checkpoint_id"], e["table_version"]) for e in events if e["table_uri"] == uri]
        history = DeltaTable(str(path)).history()
        commits = sorted((int(h["chandy.checkpoint_id"]), int(h["version"])) for h in history
                         if h.get("chandy.job_id") == job)
        assert sorted(announced) == commits, uri
        assert len({c for c, _ in announced}) == len(announced), f"{uri}: a checkpoint announced twice"


def test_routed_by_a_field_value_to_delta_and_iceberg_with_unrouted_records_dead_lettered(
        kafka_bootstrap_servers, tmp_path) -> None:
    from pyiceberg.catalog import load_catalog

    topic = f"rf{uuid.uuid4().hex[:8]}"
    dlq = f"{topic}-dlq"
    admin = kafka_config.admin_client(kafka_bootstrap_servers)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1), NewTopic(dlq, 1, 1)])[topic].result()
    regions = ["eu", "us", "ap", "sa", "x/../y", None, "moon"]
    produced = []
    producer = kafka_config.producer(kafka_bootstrap_servers)
    for i in range(350):
        region = regions[i % len(regions)]
        value = {"id": i, "region": region, "amount": f"{i * 7 % 1000}.{i % 100:02d}"}
        raw = json.dumps(value).replace(f'"{value["amount"]}"', value["amount"]).encode()  # the amount as a number
        producer.produce(topic, raw, str(i).encode(), partition=i % PARTITIONS)
        produced.append(value)
    producer.flush(30)
    lake = tmp_path / "lake"
    warehouse = tmp_path / "warehouse"
    finished = exactly_once.run_cli([
        "--table", str(lake / "default"), "--topic", topic, "-b", kafka_bootstrap_servers,
        "--prefix", f"rf{uuid.uuid4().hex[:8]}", "--value-format", "json",
        "--value-schema", "id BIGINT, region STRING, amount DECIMAL(10,2)", "--route-field", "region",
        "--route", f"eu={lake}/eu", "--route", "us=iceberg://local/geo.us", "--route", f"([a-z/.]+)={lake}/r/$1",
        "--catalog-property", f"warehouse={warehouse}", "--unrouted", "dead-letter", "--errors-tolerance", "all",
        "--dead-letter-topic", dlq, "--until-drained", "--max-records-per-checkpoint", "60"])
    assert finished.returncode == 0, finished.stderr[-3000:]
    # said at start: Delta has no multi-table commit, so routed tables commit table by table
    assert "the tables of a checkpoint are committed table by table (Delta has no multi-table commit)" in \
        " ".join(finished.stderr.split())

    def expected(region: str) -> list[tuple]:
        return sorted((v["id"], v["region"], decimal.Decimal(v["amount"])) for v in produced if v["region"] == region)

    def rows(table) -> list[tuple]:
        return sorted((r["id"], r["region"], r["amount"]) for r in table.select(["id", "region", "amount"]).to_pylist())

    assert rows(DeltaTable(str(lake / "eu")).to_pyarrow_table()) == expected("eu")
    assert rows(DeltaTable(str(lake / "r" / "ap")).to_pyarrow_table()) == expected("ap")
    assert rows(DeltaTable(str(lake / "r" / "sa")).to_pyarrow_table()) == expected("sa")
    assert rows(DeltaTable(str(lake / "r" / "moon")).to_pyarrow_table()) == expected("moon")
    assert sorted(p.name for p in (lake / "r").iterdir()) == ["ap", "moon", "sa"]
    catalog = load_catalog("local", type="sql", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")
    assert rows(catalog.load_table("geo.us").scan().to_arrow()) == expected("us")
    assert not (lake / "default").exists() or not DeltaTable.is_deltatable(str(lake / "default"))
    assert not (lake / "r" / "x").exists(), "a group's text that leaves the template's place made a table"

    letters = list(exactly_once.consume_to_end(kafka_bootstrap_servers, dlq))
    unrouted = [v for v in produced if v["region"] in (None, "x/../y")]
    assert sorted(json.loads(m.value())["id"] for m in letters) == sorted(v["id"] for v in unrouted)
    headers = dict(letters[0].headers())
    assert headers["__connect.errors.exception.class.name"] == b"Unrouted"
    assert b"no --route rule matches its route region" in headers["__connect.errors.exception.message"]


def test_hive_style_routed_tables_parse_as_written_through_the_cli(kafka_bootstrap_servers, routed_topics,
                                                                  tmp_path) -> None:
    """Issue 54, finding J, through the command line alone: a rule whose table path holds ``=``
    (hive-style, ``.../region=$1``) splits at the ``=`` whose pattern compiles and whose table
    names only the pattern's groups, so each topic lands in ``sales/region=<x>`` (before, the rule
    split at its last ``=`` and routed nothing); a rule that reads two ways is refused at start,
    exit 2, naming both readings, before any table is written."""
    base, content = routed_topics
    lake = tmp_path / "lake"
    args = ["--table", str(lake / "default"), "--topic-pattern", rf"{base}\..*", "-b", kafka_bootstrap_servers,
            "--prefix", f"rh{uuid.uuid4().hex[:8]}", "--route", rf"{base}\.sales\.(.*)=delta:{lake}/sales/region=$1",
            "--until-drained", "--parallelism", "2"]
    finished = exactly_once.run_cli(args)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert sorted(p.name for p in (lake / "sales").iterdir()) == ["region=a", "region=b", "region=c"]
    for x in "abc":
        _check_delta_table(lake / "sales" / f"region={x}", content[f"{base}.sales.{x}"])
    _check_delta_table(lake / "default", content[f"{base}.misc"])

    route = args.index("--route")
    ambiguous = [*args[:route], "--route", "(a)=(b)=lake/x/$1", *args[route + 2:]]
    ambiguous[ambiguous.index("--table") + 1] = str(tmp_path / "other")
    refused = exactly_once.run_cli(ambiguous)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert ("splits at more than one '=': pattern '(a)' to table '(b)=lake/x/$1'; or pattern '(a)=(b)' to table "
            "'lake/x/$1'") in refused.stderr, refused.stderr[-3000:]
    assert not (tmp_path / "other").exists()

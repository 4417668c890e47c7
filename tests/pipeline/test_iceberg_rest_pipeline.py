"""Issue 56, the pipeline through a REST catalog: ``chandy pipeline run`` (real Kafka, real Spark)
routes JSON records by a field into two Iceberg tables of Apache Iceberg's own REST catalog
server (``tests/fixtures/iceberg_rest.py``), configured as a Polaris or S3 Tables user would:
``type=rest`` and ``uri`` only, no client-side warehouse, so every table is created where the
catalog places it. The run is killed with SIGKILL at a step of the commit protocol and started
again; afterwards each table, read with a pyiceberg catalog of its own on the server, holds every
record routed to it exactly once with its values, and every LAKE_COMMITTED event of a checkpoint
that wrote both says they went to the catalog in one multi-table commit (``committed_with``),
but for the checkpoint the killed run committed and the next run announced from the tables' history.

The same job also runs with its catalog's warehouse on the S3 API server and only the storage
credentials the catalog vends (the catalog proxy as the test double of vending; the pipeline's
environment holds no S3 setting): tasks, committer and checkpoint storage all write to S3 with them."""

from __future__ import annotations

import json
import signal
import uuid

import pytest
from confluent_kafka.admin import NewTopic
from pyiceberg.catalog import load_catalog

from chandy.connectors.spark.options import default_job_id
from chandy.coordinator.kafka import config as kafka_config
from tests.fixtures import exactly_once
from tests.fixtures.catalog_proxy import CatalogProxy, s3_vending
from tests.fixtures.iceberg_rest import IcebergRestCatalog
from tests.fixtures.object_store import S3Server, clear_storage_settings

pytestmark = pytest.mark.integration

PARTITIONS = 3
RECORDS = 900
CAP = 100  # records per partition per checkpoint: three checkpoints, each writing both tables


@pytest.fixture(scope="module")
def routed_topic(kafka_bootstrap_servers: str) -> tuple[str, list[dict]]:
    """A topic of JSON orders and order lines (``kind``), 900 records over 3 partitions."""
    topic = f"rest-{uuid.uuid4().hex[:8]}"
    admin = kafka_config.admin_client(kafka_bootstrap_servers)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result()
    producer = kafka_config.producer(kafka_bootstrap_servers, overrides={"linger.ms": 5})
    produced = []
    for i in range(RECORDS):
        value = {"id": i, "kind": "order" if i % 3 else "line", "note": f"n{i}-{uuid.uuid4().hex[:6]}"}
        producer.produce(topic, json.dumps(value).encode(), str(i).encode(), partition=i % PARTITIONS)
        produced.append(value)
    producer.flush(30)
    return topic, produced


@pytest.mark.parametrize("point", ["before-lake-commit", "before-lake-event"])
def test_routed_tables_through_a_rest_catalog_land_once_through_a_kill(
        kafka_bootstrap_servers: str, iceberg_rest_catalog: IcebergRestCatalog, routed_topic, point: str) -> None:
    topic, produced = routed_topic
    namespace = f"shop_{point.replace('-', '_')}_{uuid.uuid4().hex[:6]}"
    table = f"iceberg://rest/{namespace}.unrouted"
    prefix = f"rp{uuid.uuid4().hex[:8]}"
    args = ["--table", table, "--topic", topic, "-b", kafka_bootstrap_servers, "--prefix", prefix,
            "--value-format", "json", "--value-schema", "id BIGINT, kind STRING, note STRING", "--route-field", "kind",
            "--route", f"order=iceberg://rest/{namespace}.orders", "--route", f"line=iceberg://rest/{namespace}.lines",
            "--catalog-property", "type=rest", "--catalog-property", f"uri={iceberg_rest_catalog.uri}",
            "--until-drained",
            "--max-records-per-checkpoint", str(CAP), "--parallelism", str(PARTITIONS)]
    crashed = exactly_once.run_cli(args, crash_at=f"{point}@2")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    finished = exactly_once.run_cli(args)
    assert finished.returncode == 0, finished.stderr[-3000:]
    # no warning at start that the tables commit table by table: they go in one request
    assert "committed table by table" not in " ".join((crashed.stderr + finished.stderr).split())

    reader = load_catalog("reader", type="rest", uri=iceberg_rest_catalog.uri)
    for name, kind in (("orders", "order"), ("lines", "line")):
        data = reader.load_table((namespace, name)).scan().to_arrow()
        rows = sorted(zip(data.column("id").to_pylist(), data.column("kind").to_pylist(),
                          data.column("note").to_pylist(), strict=True))
        expected = sorted((v["id"], v["kind"], v["note"]) for v in produced if v["kind"] == kind)
        assert rows == expected  # every record once, with its values
        location = reader.load_table((namespace, name)).location()
        assert location.startswith(iceberg_rest_catalog.warehouse.rstrip("/")), location  # where the catalog placed it

    job = default_job_id(table, [topic])
    assert exactly_once.committed_offsets(kafka_bootstrap_servers, f"chandy-{job}") == {
        (topic, p): RECORDS // PARTITIONS for p in range(PARTITIONS)}
    routed = {f"iceberg://rest/{namespace}.orders", f"iceberg://rest/{namespace}.lines"}
    events = [e for e in exactly_once.read_events(kafka_bootstrap_servers, prefix, job)
              if e["event_type"] == "LAKE_COMMITTED" and e["table_uri"] in routed]
    by_checkpoint: dict[int, dict[str, object]] = {}
    for event in events:
        assert event["table_uri"] not in by_checkpoint.setdefault(event["checkpoint_id"], {}), "announced twice"
        by_checkpoint[event["checkpoint_id"]][event["table_uri"]] = event["committed_with"]
    assert sorted(by_checkpoint) == [1, 2, 3]
    for checkpoint, tables in by_checkpoint.items():
        assert set(tables) == routed, checkpoint
        if point == "before-lake-event" and checkpoint == 2:
            # committed by the killed run, announced by the next one from the tables' history,
            # which does not say what went in one request: the event claims nothing
            assert set(tables.values()) == {None}
            continue
        for together in tables.values():  # both routed tables in one request
            assert together is not None and routed <= set(together), (checkpoint, together)


def test_routed_tables_on_s3_with_only_vended_credentials_land_once_through_a_kill(
        kafka_bootstrap_servers: str, iceberg_rest_catalog_on_s3: tuple[IcebergRestCatalog, str], s3_server: S3Server,
        routed_topic, monkeypatch: pytest.MonkeyPatch) -> None:
    catalog, bucket = iceberg_rest_catalog_on_s3
    clear_storage_settings(monkeypatch)  # the pipeline's process inherits this environment
    topic, produced = routed_topic
    namespace = f"vended_{uuid.uuid4().hex[:6]}"
    table = f"iceberg://rest/{namespace}.unrouted"
    proxy = CatalogProxy(catalog.uri)
    proxy.vend = s3_vending(s3_server, 8_000)  # renewed during the run, past half of its 8 s
    try:
        args = ["--table", table, "--topic", topic, "-b", kafka_bootstrap_servers, "--prefix", f"vp{uuid.uuid4().hex[:8]}",
                "--value-format", "json", "--value-schema", "id BIGINT, kind STRING, note STRING", "--route-field", "kind",
                "--route", f"order=iceberg://rest/{namespace}.orders", "--catalog-property", "type=rest",
                "--catalog-property", f"uri={proxy.uri}", "--until-drained",
                "--max-records-per-checkpoint", str(CAP), "--parallelism", str(PARTITIONS)]
        crashed = exactly_once.run_cli(args, crash_at="before-lake-event@2")
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
        finished = exactly_once.run_cli(args)
        assert finished.returncode == 0, finished.stderr[-3000:]
    finally:
        proxy.close()
    assert proxy.vended and set(proxy.delegations) == {"vended-credentials"}

    reader = load_catalog("reader", type="rest", uri=catalog.uri, **s3_server.reader_options()[1])
    for name, kinds in (("orders", {"order"}), ("unrouted", {"line"})):
        loaded = reader.load_table((namespace, name))
        assert loaded.location().startswith(f"s3://{bucket}/warehouse/"), loaded.location()
        data = loaded.scan().to_arrow()
        rows = sorted(zip(data.column("id").to_pylist(), data.column("kind").to_pylist(),
                          data.column("note").to_pylist(), strict=True))
        assert rows == sorted((v["id"], v["kind"], v["note"]) for v in produced if v["kind"] in kinds)
    # the checkpoints went to the default directory, in the job's table location on S3
    location = reader.load_table((namespace, "unrouted")).location().removeprefix(f"s3://{bucket}/")
    listed = s3_server.client().list_objects_v2(Bucket=bucket, Prefix=f"{location}/_chandy_checkpoints/")
    assert any(o["Key"].endswith("/_metadata") for o in listed.get("Contents", [])), listed.get("Contents")

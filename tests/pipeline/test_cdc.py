"""Change data capture (``--cdc debezium``) on real tables: a Debezium change stream (creates,
snapshot reads, updates, deletes, tombstones and re-creates, keyed by id over two partitions,
spread over many checkpoints) lands a table whose rows equal the stream's final state, replayed
key by key in the test (:mod:`tests.fixtures.debezium`), compared field by field through readers
Chandy does not write with (deltalake's, pyiceberg's scan). JSON (with and without the
converter's schema/payload) and Avro, into Delta and Iceberg, and the same after a SIGKILL in
the middle of a checkpoint and a restart."""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import NewTopic
from deltalake import DeltaTable

from chandy.coordinator.kafka import config as kafka_config
from tests.fixtures import debezium, exactly_once

pytestmark = pytest.mark.integration

PARTITIONS = 2
CAP = 30  # changes per partition per checkpoint: one key's changes span several checkpoints


def _produce(servers: str, messages: list[tuple[int, tuple[bytes, bytes | None]]]) -> str:
    topic = f"cdc{uuid.uuid4().hex[:8]}"
    admin = kafka_config.admin_client(servers)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result()
    producer = kafka_config.producer(servers, overrides={"linger.ms": 5})
    for i, (key, value) in messages:
        producer.produce(topic, value, key, partition=i % PARTITIONS)  # a key's changes in one partition, in order
    producer.flush(30)
    return topic


@pytest.fixture(scope="module")
def stream() -> list:
    return debezium.change_stream()


@pytest.fixture(scope="module")
def json_topic(kafka_bootstrap_servers: str, stream: list) -> str:
    return _produce(kafka_bootstrap_servers, [
        # runs of 60 changes with the converter's schema/payload and 60 without: some checkpoints' batches
        # are all plain envelopes (read by Arrow), others mixed (read record by record)
        (i, debezium.json_message(i, row, op, with_schema=n // 60 % 2 == 1)) for n, (i, row, op) in enumerate(stream)])


@pytest.fixture(scope="module")
def avro_topic(kafka_bootstrap_servers: str, stream: list) -> str:
    return _produce(kafka_bootstrap_servers, [(i, debezium.avro_message(i, row, op)) for i, row, op in stream])


def _json_args(topic: str) -> list[str]:
    return ["--topic", topic, "--cdc", "debezium", "--value-format", "json", "--value-schema", debezium.ROW_DDL]


def _avro_args(topic: str, tmp_path: Path) -> list[str]:
    (tmp_path / "envelope.avsc").write_text(json.dumps(debezium.VALUE_SCHEMA))
    (tmp_path / "key.avsc").write_text(json.dumps(debezium.KEY_SCHEMA))
    return ["--topic", topic, "--cdc", "debezium", "--value-format", "avro", "--avro-framing", "raw",
            "--value-schema", f"@{tmp_path / 'envelope.avsc'}", "--key-schema", f"@{tmp_path / 'key.avsc'}"]


def _run(servers: str, table_args: list[str], source_args: list[str], crash_at: str | None = None) -> None:
    args = [*table_args, *source_args, "-b", servers, "--prefix", PREFIX, "--until-drained",
            "--max-records-per-checkpoint", str(CAP), "--parallelism", str(PARTITIONS)]
    if crash_at is not None:
        crashed = exactly_once.run_cli(args, crash_at=crash_at)
        assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    finished = exactly_once.run_cli(args)
    assert finished.returncode == 0, finished.stderr[-3000:]


PREFIX = f"cdc{uuid.uuid4().hex[:8]}"


def _iceberg(tmp_path: Path, name: str) -> tuple[list[str], object]:
    warehouse = tmp_path / "warehouse"
    return ["--table", f"iceberg://local/{name}", "--catalog-property", f"warehouse={warehouse}"], warehouse


def _iceberg_rows(warehouse: object, name: str) -> dict:
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("local", type="sql", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")
    return debezium.table_rows(catalog.load_table(name).scan().to_arrow())


def _check_delta(path: Path, stream: list) -> None:
    assert debezium.table_rows(DeltaTable(str(path)).to_pyarrow_table()) == debezium.final_state(stream)
    assert not list(path.rglob("part-chandy-*.parquet")), "change files left after their merge"


def test_debezium_json_into_delta_equals_the_final_state_after_a_kill_after_the_merge(
        kafka_bootstrap_servers, json_topic, stream, tmp_path) -> None:
    table = tmp_path / "flights"
    # killed after checkpoint 3's merge, before its event: the restart's replay must change nothing
    _run(kafka_bootstrap_servers, ["--table", str(table)], _json_args(json_topic), crash_at="before-lake-event@3")
    _check_delta(table, stream)
    history = DeltaTable(str(table)).history()
    merges = [h for h in history if h.get("operation") == "MERGE"]
    assert len({h["chandy.checkpoint_id"] for h in merges}) == len(merges), "a checkpoint merged twice"


def test_debezium_json_into_iceberg_equals_the_final_state(kafka_bootstrap_servers, json_topic, stream, tmp_path) -> None:
    table_args, warehouse = _iceberg(tmp_path, "cdc.flights_json")
    _run(kafka_bootstrap_servers, table_args, _json_args(json_topic))
    assert _iceberg_rows(warehouse, "cdc.flights_json") == debezium.final_state(stream)


def test_debezium_avro_into_iceberg_equals_the_final_state_after_a_kill_mid_checkpoint(
        kafka_bootstrap_servers, avro_topic, stream, tmp_path) -> None:
    table_args, warehouse = _iceberg(tmp_path, "cdc.flights_avro")
    _run(kafka_bootstrap_servers, table_args, _avro_args(avro_topic, tmp_path), crash_at="task-written@3")
    assert _iceberg_rows(warehouse, "cdc.flights_avro") == debezium.final_state(stream)


def test_debezium_avro_into_delta_equals_the_final_state_after_a_kill_before_the_merge(
        kafka_bootstrap_servers, avro_topic, stream, tmp_path) -> None:
    table = tmp_path / "flights"
    _run(kafka_bootstrap_servers, ["--table", str(table)], _avro_args(avro_topic, tmp_path),
         crash_at="before-lake-commit@4")
    _check_delta(table, stream)


def test_the_cdc_demo_ends_with_the_flights_final_state(kafka_bootstrap_servers, tmp_path) -> None:
    """``chandy demo --cdc``: 336,776 creates, delay updates, deletes of the cancelled flights and
    their tombstones, merged into a Delta table that the demo compares with the final state; the
    test reads the table itself too."""
    import os
    import subprocess
    import sys

    table = tmp_path / "flights-cdc"
    env = {**os.environ, "CHANDY_BOOTSTRAP_SERVERS": kafka_bootstrap_servers, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run([sys.executable, "-m", "chandy.cli", "demo", "--cdc", "--table", str(table), "--topic",
                           f"flights-cdc-{uuid.uuid4().hex[:6]}", "--metrics-port", "0"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "328,521 rows against the source's final state (328,521 flights, every column): equal" in done.stdout
    rows = {r["id"]: r for r in DeltaTable(str(table)).to_pyarrow_table(
        columns=["id", "dep_time", "dep_delay", "arr_delay"]).to_pylist()}
    assert len(rows) == 328_521
    assert rows[0]["dep_delay"] == 2 + 30 and rows[0]["arr_delay"] == 11 + 30  # flight 0's delays, updated
    assert rows[1]["dep_delay"] == 4  # flight 1: not updated
    assert all(r["dep_time"] is not None for r in rows.values())  # the cancelled flights are deleted


def test_debezium_streams_routed_to_two_tables_each_equal_their_final_state(
        kafka_bootstrap_servers, stream, tmp_path) -> None:
    """Routing with CDC: two shards of one source table (same columns, own topics) routed by a
    regex template to a Delta and an Iceberg table, each merged on its own."""
    base = f"dbz{uuid.uuid4().hex[:6]}"
    shards = {0: f"{base}.shard0.flights", 1: f"{base}.shard1.flights"}
    admin = kafka_config.admin_client(kafka_bootstrap_servers)
    for topic in shards.values():
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result()
    producer = kafka_config.producer(kafka_bootstrap_servers)
    for i, row, op in stream:
        key, value = debezium.json_message(i, row, op, with_schema=False)
        producer.produce(shards[i % 2], value, key, partition=(i // 2) % PARTITIONS)
    producer.flush(30)
    lake, warehouse = tmp_path / "lake", tmp_path / "warehouse"
    finished = exactly_once.run_cli([
        "--table", str(lake / "unrouted"), "--topic-pattern", rf"{base}\..*", "-b", kafka_bootstrap_servers,
        "--prefix", PREFIX, "--cdc", "debezium", "--value-format", "json", "--value-schema", debezium.ROW_DDL,
        "--route", rf"{base}\.shard0\.flights=delta:{lake}/shard0", "--route", rf"{base}\.(shard1)\.flights=iceberg://local/cdc.$1",
        "--catalog-property", f"warehouse={warehouse}", "--until-drained", "--max-records-per-checkpoint", str(CAP)])
    assert finished.returncode == 0, finished.stderr[-3000:]
    expected = {n: debezium.final_state([e for e in stream if e[0] % 2 == n]) for n in (0, 1)}
    assert debezium.table_rows(DeltaTable(str(lake / "shard0")).to_pyarrow_table()) == expected[0]
    assert _iceberg_rows(warehouse, "cdc.shard1") == expected[1]
    assert not (lake / "unrouted").exists() or not DeltaTable.is_deltatable(str(lake / "unrouted"))


def _upsert_messages(stream: list, *, op_field: bool) -> list[tuple[int, tuple[bytes, bytes | None]]]:
    """The same changes as a compacted topic carries them (issue 47, upserts without Debezium):
    plain keys (``42``), each value the row itself, a delete a tombstone; with ``op_field``, a
    delete is the row with ``"op": "D"`` instead and the others carry I or U."""
    import re

    messages = []
    for i, row, op in stream:
        if op is None:
            continue  # Debezium's tombstone after a delete: the delete below is this shape's own
        if op == "d" and not op_field:
            messages.append((i, (str(i).encode(), None)))
            continue
        value = {**debezium._json_row(row), **({"op": {"d": "D", "c": "I", "r": "I"}.get(op, "U")} if op_field else {})}
        text = re.sub(f'"{debezium._NUMBER}([^"#]*){debezium._NUMBER}"', r"\1", json.dumps(value))
        messages.append((i, (str(i).encode(), text.encode())))
    return messages


def test_upserts_of_a_compacted_topic_into_delta_equal_the_final_state_after_a_kill(
        kafka_bootstrap_servers, stream, tmp_path) -> None:
    """--cdc upsert --id-columns id: rows keyed by plain keys, tombstones deleting, spread over
    many checkpoints and a SIGKILL before a merge: the Delta table holds the stream's final state."""
    topic = _produce(kafka_bootstrap_servers, _upsert_messages(stream, op_field=False))
    table = tmp_path / "flights"
    _run(kafka_bootstrap_servers, ["--table", str(table)],
         ["--topic", topic, "--cdc", "upsert", "--id-columns", "id", "--value-format", "json",
          "--value-schema", debezium.ROW_DDL], crash_at="before-lake-commit@3")
    _check_delta(table, stream)


def test_upserts_with_an_operation_field_into_iceberg_equal_the_final_state(
        kafka_bootstrap_servers, stream, tmp_path) -> None:
    """--cdc upsert --cdc-op-field op (Kafka Connect Iceberg sink's cdc-field): D deletes, I and
    U upsert; the Iceberg table holds the final state, the op field as a column."""
    topic = _produce(kafka_bootstrap_servers, _upsert_messages(stream, op_field=True))
    table_args, warehouse = _iceberg(tmp_path, "cdc.flights_upsert")
    _run(kafka_bootstrap_servers, table_args,
         ["--topic", topic, "--cdc", "upsert", "--id-columns", "id", "--cdc-op-field", "op", "--value-format", "json",
          "--value-schema", debezium.ROW_DDL + ", op STRING"])
    assert _iceberg_rows(warehouse, "cdc.flights_upsert") == debezium.final_state(stream)

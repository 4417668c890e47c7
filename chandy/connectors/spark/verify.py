"""``--verify``'s value check: every landed row compared, field by field, with its source record
decoded again from Kafka (issue 31: exactly-once by offsets is not enough if the amounts are wrong).

The table is read with the lake's own reader (deltalake or pyiceberg, not the writer); the source
range is re-read with the range reader and decoded with the pipeline's value decoder (its type
mapping, :mod:`chandy.formats.type_mapping`), and, as a check that needs no type mapping at all, a
field that is present and non-null in the raw value (fastavro's or ``json``'s own reading) must
not have landed NULL.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import math
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import TopicPartition

from chandy.connectors.kafka.source.reader import KafkaRangeReader
from chandy.connectors.kafka.source.split import KafkaPartitionSplit
from chandy.connectors.kafka.source.subscriber import subscribed_topics
from chandy.connectors.lake.sink import LakeSink
from chandy.coordinator.kafka import config as kafka_config
from chandy.formats.decoder import ValueDecoder
from chandy.formats.records import to_record_batch

_KEY = ("topic", "partition", "offset")


@dataclasses.dataclass(frozen=True)
class ValueCheck:
    """The value check's outcome: ``compared`` rows (records), and the first difference found as
    ``topic T partition P offset O field F: landed X, source Y`` (None: every field equal)."""

    compared: int
    first_difference: str | None


def equal_values(landed: Any, source: Any) -> bool:
    """Equal as a lake keeps them: NaN equals NaN, -0.0 is not 0.0, maps (pairs) equal dicts,
    aware timestamps by instant, decimals by value and scale."""
    if isinstance(source, float) and isinstance(landed, float):
        if math.isnan(source):
            return math.isnan(landed)
        return landed == source and math.copysign(1, landed) == math.copysign(1, source)
    if isinstance(source, list) and isinstance(landed, list):
        return len(source) == len(landed) and all(equal_values(a, b) for a, b in zip(landed, source, strict=True))
    if isinstance(source, tuple) and isinstance(landed, tuple):
        return len(source) == len(landed) and all(equal_values(a, b) for a, b in zip(landed, source, strict=True))
    if isinstance(source, dict) and isinstance(landed, dict):
        return set(source) == set(landed) and all(equal_values(landed[k], source[k]) for k in source)
    if isinstance(source, decimal.Decimal) and isinstance(landed, decimal.Decimal):
        return landed == source and landed.as_tuple().exponent == source.as_tuple().exponent
    if isinstance(source, datetime.datetime) and isinstance(landed, datetime.datetime):
        return landed == source and (landed.tzinfo is None) == (source.tzinfo is None)
    return type(landed) is type(source) and landed == source


def _raw_reader(decoder: ValueDecoder) -> Callable[[bytes | None], Mapping[str, Any]]:
    """The raw value's top-level fields as the format's own reader sees them, with no type
    mapping: ``json.loads``, or fastavro with the value schema (as the writer's, so not with a
    Schema Registry's writer schemas, where it reads nothing)."""
    import io
    import json

    if decoder.value_format == "json":
        from chandy.formats.framing import split

        def read_json(raw: bytes | None) -> Mapping[str, Any]:
            try:
                value = json.loads(raw if not raw or decoder.json_framing == "plain" else split(raw)[1]) if raw else None
            except ValueError:
                return {}
            return value if isinstance(value, dict) else {}

        return read_json
    if decoder.schema_registry or decoder.avro_schema is None:
        return lambda raw: {}
    import fastavro

    schema = fastavro.parse_schema(json.loads(decoder.avro_schema))
    header = {"raw": 0, "single-object": 10, "confluent": 5}[decoder.avro_framing]

    def read_avro(raw: bytes | None) -> Mapping[str, Any]:
        try:
            value = fastavro.schemaless_reader(io.BytesIO((raw or b"")[header:]), schema, None)
        except Exception:  # noqa: BLE001 - a bad record: the decoder's check reports it
            return {}
        return value if isinstance(value, dict) else {}

    return read_avro


def check_values(sink: LakeSink, bootstrap_servers: str, decoder: ValueDecoder, topics: list[str],
                 consumer_overrides: Mapping[str, Any] | None = None, *, batch_size: int = 10_000) -> ValueCheck:
    """Compare every landed row's value columns with its source record decoded again.

    Args:
        sink: the table (read with its lake's reader).
        decoder: the pipeline's value decoder (the run's, so the same columns and settings).
        topics: the source topics (the landed rows name theirs; only these are re-read).

    Returns:
        :class:`ValueCheck`. Records that were bad (not landed) are not compared: the offsets
        check (:func:`verify_table`) accounts for them.
    """
    if not sink.exists():
        return ValueCheck(0, None)
    table = sink.read_table()
    names = [f.name for f in decoder.columns if f.name in table.schema.names]
    landed = {(r["topic"], r["partition"], r["offset"]): r for r in table.select([*_KEY, *names]).to_pylist()}
    lenient = dataclasses.replace(decoder, errors_tolerance="all", tombstones="skip", unknown_fields="ignore")
    positions: dict[tuple[str, int], list[int]] = {}
    for topic, partition, offset in landed:
        if topic in topics:
            positions.setdefault((topic, partition), []).append(offset)
    reader = KafkaRangeReader(bootstrap_servers, consumer_overrides)
    compared = 0
    raw_fields = _raw_reader(decoder)
    try:
        for (topic, partition), offsets in sorted(positions.items()):
            split = KafkaPartitionSplit(topic, partition, min(offsets), max(offsets) + 1)
            for messages in reader.read_batches(split, batch_size):
                decoded, _, _ = lenient.decode(to_record_batch(messages), vectorized=False)  # the other path
                raws = {m.offset(): m.value() for m in messages}
                for row in decoded.to_pylist():
                    key = (row["topic"], row["partition"], row["offset"])
                    if key not in landed:
                        continue
                    compared += 1
                    mine, raw = landed[key], raw_fields(raws[key[2]])
                    for name, source_name in zip(decoder.columns.names, decoder.source_names, strict=True):
                        if name not in mine:
                            continue
                        where = f"topic {key[0]} partition {key[1]} offset {key[2]} field {name}"
                        if mine[name] is None and raw.get(source_name) is not None:
                            return ValueCheck(compared, f"{where}: landed NULL, source {raw[source_name]!r}")
                        if not equal_values(mine[name], row[name]):
                            return ValueCheck(compared, f"{where}: landed {mine[name]!r}, source {row[name]!r}")
    finally:
        reader.close()
    return ValueCheck(compared, None)


def verify_table(sink: LakeSink, bootstrap_servers: str, topics: list[str],
                 consumer_overrides: Mapping[str, Any] | None = None, *,
                 topic_pattern: str | None = None, dead_letter_topic: str | None = None) -> tuple[int, int, int]:
    """Compare the committed table with the source topics: (rows in the table, duplicates, missing).

    A duplicate is a (topic, partition, offset) present more than once (in the table, or in the
    table and the dead-letter topic); a missing record is one readable in the topic
    (read_committed, up to the last stable offset) that is in neither. Reads the table with
    pyarrow through deltalake, not with the writer; ``topic_pattern`` selects topics as the
    source does.
    """
    table = sink.read_table().select(["topic", "partition", "offset"]) if sink.exists() else None
    rows = 0 if table is None else table.num_rows
    seen: list[tuple[str, int, int]] = []
    if table is not None:
        seen.extend(zip(*(table.column(c).to_pylist() for c in ("topic", "partition", "offset")), strict=True))
    reader = KafkaRangeReader(bootstrap_servers, consumer_overrides)
    consumer = kafka_config.consumer(bootstrap_servers, overrides=consumer_overrides)
    admin = kafka_config.admin_client(bootstrap_servers, kafka_config.security_settings(consumer_overrides))
    metadata = admin.list_topics(timeout=30)
    try:
        if dead_letter_topic:
            for partition in metadata.topics[dead_letter_topic].partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(dead_letter_topic, partition), timeout=30,
                                                           cached=False)
                for message in reader.read(KafkaPartitionSplit(dead_letter_topic, partition, low, high)):
                    headers = dict(message.headers() or [])
                    seen.append((headers["__connect.errors.topic"].decode(),
                                 int(headers["__connect.errors.partition"]), int(headers["__connect.errors.offset"])))
        present = set(seen)
        duplicates = len(seen) - len(present)
        missing = 0
        available = [t for t, m in metadata.topics.items() if m.error is None]
        for topic in subscribed_topics(available, topics, topic_pattern):
            for partition in metadata.topics[topic].partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=30, cached=False)
                for message in reader.read(KafkaPartitionSplit(topic, partition, low, high)):
                    if (topic, partition, message.offset()) not in present:
                        missing += 1
    finally:
        reader.close()
        consumer.close()
    return rows, duplicates, missing

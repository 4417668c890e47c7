"""The shape of a Kafka record in the pipeline: one Arrow/Spark schema, one conversion."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

#: Arrow schema of records as read from Kafka (the Spark schema below, column for column).
ARROW_SCHEMA = pa.schema([
    ("key", pa.binary()),
    ("value", pa.binary()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
    ("timestamp_type", pa.int32()),
    ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
])

#: The Kafka record's columns, in the order they are landed (:data:`ARROW_SCHEMA`'s).
KAFKA_COLUMNS = tuple(ARROW_SCHEMA.names)

#: ``Message.timestamp()``'s (type, ms) pair, converted in one call.
_STAMP_PAIR = pa.struct([("type", pa.int32()), ("ms", pa.int64())])

#: The same schema as a Spark DDL string.
SPARK_DDL = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
             "timestamp_type int, headers array<struct<key: string, value: binary>>")


def to_record_batch(messages: Sequence[Any]) -> pa.RecordBatch:
    """An Arrow batch of ``confluent_kafka.Message``\\ s, column by column (timestamps in ms
    become microseconds; a record without a timestamp, -1, gets null)."""
    stamps = pa.array([m.timestamp() for m in messages], _STAMP_PAIR)
    millis = stamps.field("ms")
    micros = pc.if_else(pc.greater_equal(millis, 0), pc.multiply(millis, 1000), None).cast(
        ARROW_SCHEMA.field("timestamp").type)
    return pa.RecordBatch.from_arrays([
        pa.array([m.key() for m in messages], pa.binary()),
        pa.array([m.value() for m in messages], pa.binary()),
        pa.array([m.topic() for m in messages], pa.string()),
        pa.array([m.partition() for m in messages], pa.int32()),
        pa.array([m.offset() for m in messages], pa.int64()),
        micros, stamps.field("type"),
        pa.array([[{"key": k, "value": v} for k, v in hs] if (hs := m.headers()) else [] for m in messages],
                 ARROW_SCHEMA.field("headers").type),
    ], schema=ARROW_SCHEMA)

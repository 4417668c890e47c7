"""Every subject its table (issue 45): routed records decoded per destination table, so that
each routed table is created and evolved from its own writer schemas.

When a job reads its values through a Schema Registry (Avro or Protobuf as written, see
``ValueDecoder.as_written``; JSON Schema) and routes by topic or by record name (``--route-by
record-name``), the route of a record is known before its value is decoded: its topic, or the
full name of its writer schema's record (Avro ``namespace.name``, Protobuf ``package.Message``,
JSON Schema's ``title``; what Confluent's ``RecordNameStrategy`` and
``TopicRecordNameStrategy`` name subjects by). A routed JSON Schema table created by the job
starts with the columns of the newest writer schema among its first records. Each raw batch is split
by destination first, and each part decoded with its table's own columns (the table's, or none
for a table not created yet), so a whole Debezium database (one topic per table) or a topic of
several record types lands in one job with each table holding exactly its records' fields: a
field two tables share by name need not share a type.

Decoded batches carry their destination in their schema metadata (:data:`ROUTE_KEY`) until the
writer groups them (:func:`by_destination`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

import pyarrow as pa

from chandy.connectors.lake.routing import Router
from chandy.formats.decoder import KAFKA_COLUMNS, ValueDecoder
from chandy.formats.writer_schemas import newest_json_schema_columns, record_names

#: a decoded batch's schema metadata key holding its destination table URI ("": the job's table)
ROUTE_KEY = b"chandy.route"
#: what ``--route-by`` takes: the topic (default) or the writer schema's record name
ROUTE_BY = ("topic", "record-name")


class RoutedTask(Protocol):
    """What this module reads of a task's options (:class:`~chandy.connectors.spark.task.options.TaskOptions`)."""

    @property
    def router(self) -> Router | None: ...

    @property
    def decoder(self) -> ValueDecoder | None: ...

    @property
    def changes(self) -> bool: ...

    @property
    def unrouted(self) -> str: ...


def routes_before_decoding(options: RoutedTask) -> bool:
    """Whether records are split by table before decoding: a router by topic or record name
    (not by a decoded field) and values read as written from a registry (Avro, Protobuf) or
    through it (JSON Schema), without ``--cdc``."""
    decoder = options.decoder
    return (options.router is not None and options.router.field is None and decoder is not None
            and (decoder.as_written or _json_schema(decoder)) and not options.changes)


def _json_schema(decoder: ValueDecoder) -> bool:
    """``--value-format json-schema`` with a registry: Confluent-framed JSON, each value's schema
    there by its ID."""
    return decoder.value_format == "json" and decoder.json_framing == "confluent" and bool(decoder.schema_registry)


def value_columns(table_fields: Mapping[str, Any] | None) -> tuple[pa.Schema, tuple[str, ...]]:
    """A table's value columns (its columns but the Kafka ones; ``table_fields`` as
    ``LakeSink.table_fields`` gives them, name to Delta type JSON) as Arrow, and each one's field
    name in the value (a column ``value_<kafka column>`` is the value's field ``<kafka column>``).
    No table: no columns."""
    from deltalake import Schema as DeltaSchema

    fields = [{"name": n, "type": t, "nullable": True, "metadata": {}}
              for n, t in (table_fields or {}).items() if n not in KAFKA_COLUMNS]
    if not fields:
        return pa.schema([]), ()
    arrow = pa.schema(DeltaSchema.from_json(json.dumps({"type": "struct", "fields": fields})).to_arrow())
    names = tuple(f.name[len("value_"):] if f.name.startswith("value_") and f.name[6:] in KAFKA_COLUMNS
                  else f.name for f in arrow)
    return arrow, names


def route_keys(batch: pa.RecordBatch, router: Router, decoder: ValueDecoder) -> list[str | None]:
    """Each raw record's route key: its topic, or with ``router.by == "record-name"`` its writer
    schema's record name (:func:`record_names`)."""
    if router.by == "record-name":
        return record_names(batch.column("value"), decoder)
    return batch.column("topic").to_pylist()


def decode_routed(options: RoutedTask, batches: Iterator[pa.RecordBatch], table_fields: Callable[[str], Any],
                  dead: Any) -> Iterator[pa.RecordBatch]:
    """Split each raw batch by destination table and decode each part with that table's columns
    (its own value columns from ``table_fields(uri)``; the job's table: the job's decoder); bad
    records and skipped tombstones go to ``dead`` (a ``DeadLetterFile``), unrouted records to the
    job's table or, with ``unrouted == "dead-letter"``, to ``dead`` as bad records. Yields decoded
    batches whose :data:`ROUTE_KEY` metadata names their table ("": the job's).

    Raises:
        BadRecordError: a bad or dead-lettered unrouted record under ``errors_tolerance="none"``.
    """
    router, decoder = options.router, options.decoder
    assert router is not None and decoder is not None
    decoders: dict[str | None, ValueDecoder] = {None: decoder}
    for batch in batches:
        keys = route_keys(batch, router, decoder)
        destinations = {k: router.destination(k) for k in set(keys)}
        groups: dict[str | None, list[int]] = {}
        for row, key in enumerate(keys):
            groups.setdefault(destinations[key], []).append(row)
        for uri, rows in groups.items():
            part = batch if len(groups) == 1 else batch.take(pa.array(rows, pa.int64()))
            if uri is None and options.unrouted == "dead-letter":
                dead.add(decoder.refuse(part, list(range(part.num_rows)), "Unrouted",
                                        f"no --route rule matches its {router.by} (--unrouted dead-letter)"))
                continue
            if uri not in decoders:  # a routed table (the job's own, None, is there from the start)
                assert uri is not None
                fields = table_fields(uri)
                columns, names = value_columns(fields)
                if fields is None and _json_schema(decoder):  # a new table: its newest writer schema's columns
                    columns, names = newest_json_schema_columns(part.column("value"), decoder)
                key_columns, key_names = decoder.key_columns, decoder.key_names
                from chandy.formats.keys import split_key_columns
                from chandy.formats.modes import FIELD_KEY_FORMATS

                if decoder.key_format in FIELD_KEY_FORMATS:
                    columns, names, key_columns, key_names = split_key_columns(
                        columns, names, decoder.key_schema if decoder.key_format == "avro" else None)
                decoders[uri] = dataclasses.replace(decoder, columns=columns, source_names=names, key_columns=key_columns,
                                                    key_names=key_names, columns_schema_id=None)
            decoded, bad, skipped = decoders[uri].decode(part)
            if bad is not None:
                dead.add(bad)
            if skipped:
                dead.add_skipped(skipped)
            yield decoded.replace_schema_metadata({ROUTE_KEY: (uri or "").encode()})


def by_destination(part: list[pa.RecordBatch]) -> list[tuple[str | None, list[pa.RecordBatch]]]:
    """A part's decoded batches grouped by their :data:`ROUTE_KEY` (None: the job's table), in
    first-appearance order, without that metadata."""
    groups: dict[str | None, list[pa.RecordBatch]] = {}
    for batch in part:
        uri = (batch.schema.metadata or {}).get(ROUTE_KEY, b"").decode() or None
        groups.setdefault(uri, []).append(batch.replace_schema_metadata(None))
    return list(groups.items())


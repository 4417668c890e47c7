"""Kafka keys as columns (``--key-format``), as Flink's Kafka connector reads them with
``key.format`` and ``key.fields-prefix``.

- ``raw`` (the default): the ``key`` column holds Kafka's bytes, as Spark's Kafka source gives them.
- ``string``: the ``key`` column is UTF-8 text (Spark's ``CAST(key AS STRING)``, Flink's ``raw``
  format of a ``STRING`` column); a key that is not UTF-8 makes its record bad.
- ``json`` / ``avro``: the key's fields become columns ``key_<field>`` after the Kafka columns
  (Flink's ``key.fields-prefix``, here always ``key_``), decoded as values are
  (:class:`~chandy.formats.decoder.ValueDecoder`): Avro with ``--key-schema`` or, with a
  Schema Registry, each key read with its own writer schema (the ``<topic>-key`` subject's latest
  version gives the columns at start); JSON objects with their fields' types inferred, new fields
  adding columns with schema evolution. ``protobuf`` / ``json-schema``: Confluent-framed keys read
  through the registry as their values are (each Protobuf key with its own writer message, a JSON
  Schema key's 5-byte header checked and its JSON read), new fields adding columns. The ``key``
  column keeps the bytes. A null key gives null
  key columns; a key that does not decode (not JSON, not Avro of its schema, not framed) makes its
  record bad, named ``key: ...``, never a row with the key's columns null.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa

from chandy.formats.records import KAFKA_COLUMNS

#: the prefix of a key field's column (Flink's ``key.fields-prefix``)
KEY_PREFIX = "key_"


def with_key_fields(decoder: Any, values_schema: pa.Schema) -> pa.Schema:
    """``values_schema`` (the Kafka columns, then the value's) with the key's columns known at
    start after the Kafka columns (``string``: ``key`` as text)."""
    if decoder.key_format == "raw":
        return values_schema
    fields = list(values_schema)
    if decoder.key_format == "string":
        return pa.schema([f.with_type(pa.string()) if f.name == "key" else f for f in fields])
    kafka = len(decoder.keep)
    return pa.schema(fields[:kafka] + list(decoder.key_columns) + fields[kafka:])


def split_key_columns(columns: pa.Schema, names: tuple[str, ...], key_schema: str | None = None
                      ) -> tuple[pa.Schema, tuple[str, ...], pa.Schema, tuple[str, ...]]:
    """A table's columns (``columns``, each one's field ``names`` in the value) split into the
    value's and the key's: a column ``key_<field>`` whose name in the value is itself came from
    the table, not from a value schema: the key's, after the fields of ``key_schema`` (Avro, the
    ``--key-schema``) as ``key_<field>`` columns. Returns (value columns, their names, key
    columns, their fields in the key).

    Raises:
        AvroValueSchemaError: ``key_schema`` is not a record of fields with column types.
    """
    keys: list[tuple[pa.Field, str]] = []
    if key_schema:
        from chandy.formats.avro import avro_columns

        written, written_names = avro_columns(key_schema)
        keys = [(f.with_name(f"{KEY_PREFIX}{f.name}"), n) for f, n in zip(written, written_names, strict=True)]
    taken = {f.name for f, _ in keys}
    value: list[tuple[pa.Field, str]] = []
    for field, name in zip(columns, names, strict=True):
        if field.name.startswith(KEY_PREFIX) and field.name == name:
            if field.name not in taken:
                keys.append((field, field.name[len(KEY_PREFIX):]))
        else:
            value.append((field, name))
    return (pa.schema([f for f, _ in value]), tuple(n for _, n in value), pa.schema([f for f, _ in keys]),
            tuple(n for _, n in keys))


def key_decoder(decoder: Any) -> Any:
    """The decoder of ``decoder``'s keys (one of :data:`~chandy.formats.modes.FIELD_KEY_FORMATS`): every key a row (a
    null key null columns), bad keys kept as bad records, new fields added as columns."""
    schema_framed = decoder.key_format == "json-schema"
    return dataclasses.replace(
        decoder, value_format="json" if schema_framed else decoder.key_format, columns=decoder.key_columns,
        source_names=decoder.key_names, keep=(), avro_schema=decoder.key_schema if decoder.key_format == "avro" else None,
        avro_schema_id=None, unknown_fields="add", tombstones="null", errors_tolerance="all", cdc=None,
        as_written=decoder.key_as_written, columns_schema_id=None, json_framing="confluent" if schema_framed else "plain",
        key_format="raw", key_columns=pa.schema([]), key_names=())


def _column_name(name: str) -> str:
    """A key decoder's column as the table's: ``key_<field>`` (the decoder names a new field
    ``f``, or ``value_f`` when ``f`` is a Kafka column's name)."""
    if name.startswith(KEY_PREFIX):
        return name
    if name.startswith("value_") and name[len("value_"):] in KAFKA_COLUMNS:
        name = name[len("value_"):]
    return f"{KEY_PREFIX}{name}"


def with_keys(decoder: Any, batch: pa.RecordBatch, decoded: pa.RecordBatch,
              kept: list[int] | None) -> tuple[pa.RecordBatch, dict[int, str]]:
    """``decoded`` (the value rows of ``batch``'s rows ``kept``, None: all) with their keys'
    columns (``decoder`` a ``ValueDecoder``); returns (the rows whose keys decode, why each other
    one's did not, by its row in ``batch``)."""
    rows = list(range(batch.num_rows)) if kept is None else kept
    keys = batch.column("key") if kept is None else batch.column("key").take(pa.array(rows, pa.int64()))
    failed: dict[int, str] = {}  # position in rows -> why
    if decoder.key_format == "string":
        texts: list[str | None] = []
        for position, raw in enumerate(keys.to_pylist()):
            try:
                texts.append(None if raw is None else raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                failed[position] = f"not UTF-8 text: {exc}"
                texts.append(None)
        columns = [pa.array(texts, pa.string())]
        names = ["key"]
    else:
        pseudo = batch.take(pa.array(rows, pa.int64())).set_column(batch.schema.get_field_index("value"), "value", keys)
        found, bad, _ = key_decoder(decoder).decode(pseudo)
        if bad is not None:
            where = {(t, p, o): i for i, (t, p, o) in enumerate(zip(pseudo.column("topic").to_pylist(),
                                                                    pseudo.column("partition").to_pylist(),
                                                                    pseudo.column("offset").to_pylist(), strict=True))}
            for record in bad.to_pylist():
                failed[where[(record["topic"], record["partition"], record["offset"])]] = \
                    f"{record['error_class']}: {record['error_message']}"
        columns = found.columns
        names = [_column_name(n) for n in found.schema.names]
        if failed:  # found holds the good keys only: put them back in place
            index, good = [], 0
            for position in range(len(rows)):
                index.append(None if position in failed else good)
                good += position not in failed
            columns = [c.take(pa.array(index, pa.int64())) for c in columns]
    fields = [pa.field(n, c.type) for n, c in zip(names, columns, strict=True)]
    if decoder.key_format == "string":
        at = decoded.schema.get_field_index("key")
        out = decoded.set_column(at, fields[0], columns[0]) if at >= 0 else decoded
    else:
        kafka = len(decoder.keep)
        arrays, schema = list(decoded.columns), list(decoded.schema)
        out = pa.RecordBatch.from_arrays(arrays[:kafka] + columns + arrays[kafka:], schema=pa.schema(
            schema[:kafka] + fields + schema[kafka:]))
    if failed:
        keep = pa.array([p not in failed for p in range(len(rows))])
        out = out.filter(keep)
    return out, {rows[p]: why for p, why in failed.items()}

"""Kafka values (JSON or Avro) decoded into columns inside the Spark tasks, record by record, so
that a record that does not decode is never silent.

A record is *bad* when its value is not valid JSON / Avro, is not a JSON object, has a field of
another type than its column, has a field the table has no column for (when the columns come from
the table or an inferred schema), is empty, or is a tombstone (a null value) while tombstones are
errors. What happens to bad records follows Kafka Connect's error handling:

- ``errors_tolerance="none"`` (the default): the micro-batch fails with a :class:`BadRecordError`
  naming the first bad record's topic, partition, offset and the parse error;
- ``errors_tolerance="all"``: bad records are left out of the table and kept, raw, as
  :data:`BAD_RECORDS_SCHEMA` rows (the pipeline counts them, logs them and, with a dead-letter
  topic, publishes them exactly once with the checkpoint, see :mod:`chandy.connectors.spark.task.dead_letters`).

Tombstones have their own setting: ``"error"`` (a bad record, the default), ``"skip"`` (left out,
counted) or ``"null"`` (a row whose value columns are null).

Avro framing is validated: single-object encoding checks the magic ``C3 01`` and the schema
fingerprint; the Confluent wire format checks the magic byte ``0`` and, when given, the schema ID;
every framing checks that the Avro binary is consumed exactly (no trailing bytes).
"""

from __future__ import annotations

import dataclasses
import decimal
import json
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from chandy.formats.debezium import OP_COLUMN
from chandy.formats.errors import FormatError
from chandy.formats.evolution import SchemaChangeError, offset_ranges
from chandy.formats.modes import (
    AvroFraming,
    ChangeFormat,
    ErrorsTolerance,
    JsonFraming,
    KeyFormat,
    Tombstones,
    UnknownFields,
    ValueFormat,
)
from chandy.formats.records import KAFKA_COLUMNS as KAFKA_COLUMNS  # re-exported
from chandy.formats.type_mapping import Unfit, json_converter, parse_json, plain_numbers
from chandy.formats.value_parsers import BadValue, WriterTypeChange, avro_parser, protobuf_parser

#: A bad record, raw, with why it was bad (the columns of a dead-letter file).
BAD_RECORDS_SCHEMA = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
    ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC")),
    ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ("error_class", pa.string()), ("error_message", pa.string()),
])


class BadRecordError(FormatError):
    """A record that does not decode, under ``errors_tolerance="none"``: the message names its
    topic, partition and offset and what was wrong."""


@dataclasses.dataclass
class _ParsedRows:
    """What :meth:`ValueDecoder._parse_rows` read of a batch, record by record: each kept row's
    fields (None: a null tombstone) and its position in the batch, with ``cdc`` its operation;
    the bad records by position; the tombstones skipped; the fields no column has (in the
    order first seen), and (``as_written``) new fields' and widened columns' writer types."""

    rows: list[dict[str, Any] | None] = dataclasses.field(default_factory=list)
    keep_rows: list[int] = dataclasses.field(default_factory=list)
    ops: list[str] = dataclasses.field(default_factory=list)
    bad: dict[int, BadValue] = dataclasses.field(default_factory=dict)
    skipped: int = 0
    extra_names: list[str] = dataclasses.field(default_factory=list)
    writer_types: dict[str, pa.DataType] = dataclasses.field(default_factory=dict)
    widened: dict[str, pa.DataType] = dataclasses.field(default_factory=dict)

    def add(self, position: int, row: dict[str, Any] | None, op: str | None = None) -> None:
        """Keep ``row``, the batch's row ``position`` (with ``cdc``: its operation ``op``)."""
        self.rows.append(row)
        self.keep_rows.append(position)
        if op is not None:
            self.ops.append(op)


@dataclasses.dataclass(frozen=True)
class ValueDecoder:
    """How values become columns (picklable: it travels to the Spark tasks).

    Args:
        value_format: ``"json"``, ``"avro"``, ``"protobuf"``, or ``"raw"`` (values as Kafka's bytes,
            with a ``key_format`` to decode).
        columns: the value's columns as landed (Arrow), in order.
        source_names: the field name in the value for each column (a field named like a Kafka
            column lands as ``value_<name>``).
        keep: the Kafka columns kept before the value columns.
        avro_schema: the Avro writer schema (JSON) for ``"avro"``.
        avro_framing: ``"single-object"``, ``"confluent"`` or ``"raw"``.
        avro_schema_id: with Confluent framing, the only schema ID accepted (None: any).
        schema_registry: with Confluent framing, the Schema Registry client's settings (``url``
            and the others under ``SchemaRegistryClient``'s names) as sorted pairs: each record's
            writer schema is fetched by its ID (cached per process) and resolved against
            ``avro_schema`` by Avro's schema resolution (fields the reader lacks are dropped,
            fields the writer lacks take their defaults); an ID the registry does not know makes
            a bad record, an unreachable registry fails the task (Spark retries it).
        unknown_fields: ``"ignore"`` (fields without a column are dropped, as Spark's
            ``from_json``), ``"error"`` (a bad record: the columns are fixed by the table) or
            ``"add"`` (schema evolution: a field without a column becomes a new column after
            the known ones, its Arrow type inferred from the batch's first non-null value, so
            a batch's schema may have more columns than :attr:`output_schema`; a value of
            another type than that is a bad record).
        tombstones: ``"error"``, ``"skip"`` or ``"null"`` (see the module docstring).
        errors_tolerance: ``"none"`` or ``"all"`` (Kafka Connect's ``errors.tolerance``).
        session_time_zone: the zone of JSON timestamps without an offset (Spark's
            ``spark.sql.session.timeZone``, as ``from_json``).
        cdc: ``"debezium"``: values are Debezium change events (:mod:`chandy.formats.debezium`);
            ``columns`` are the *row*'s (``after``/``before``) and each decoded row gets the
            change's operation in :data:`~chandy.formats.debezium.OP_COLUMN`; a tombstone
            is a delete of the row its key names (``tombstones`` does not apply). None: plain values.
        key_schema: with ``cdc``, the Avro schema of the keys (JSON), read with ``avro_framing``;
            None: keys are JSON, or, with the Confluent framing and a Schema Registry, Avro
            whose writer schema the registry gives.
        id_columns: with ``cdc``, the key columns of the rows (empty: the key's fields).
        op_field: with ``cdc="upsert"``, the value's field holding the operation (Kafka Connect
            Iceberg sink's ``cdc-field``: ``D`` deletes, ``I``/``U``/``C``/``R`` upsert, any case);
            None: every value upserts, a tombstone deletes.
        as_written: with a Schema Registry and no ``--value-schema`` (the registry is the source
            of the schema): each record is read with its own writer schema, as written, with no
            resolution against ``avro_schema`` (which only gave the starting ``columns``). A field
            the columns lack is new (``unknown_fields="add"``: a column typed as its writer schema
            says); a field whose writer type is not the column's and not one Avro's schema
            resolution promotes to it (int to long, float or double; long to float or double;
            float to double) fails the micro-batch with :class:`SchemaChangeError`, naming the
            field, both types, both schema IDs and the offsets; a field the writer lacks is null.
        columns_schema_id: with ``as_written``, the registry ID of the schema the columns came
            from (for messages).
        key_format: ``"raw"`` (the ``key`` column as Kafka's bytes), ``"string"`` (UTF-8 text) or
            ``"json"``/``"avro"``: the key's fields become columns (:mod:`chandy.formats.keys`).
        key_columns: with ``key_format`` json or avro, the key's columns (named ``key_<field>``)
            known at start; ``key_names`` their fields in the key.
        key_as_written: Avro keys read with their own writer schemas from the registry.
        widen_columns: with ``as_written``, a writer type a column's type widens to (int to long,
            float to double, a decimal's precision up: :func:`~chandy.formats.type_mapping.widens`)
            widens the column in the decoded batch instead of failing the micro-batch; the table
            widens it in the checkpoint's commit (Iceberg's type promotion; Delta tables cannot).
        json_framing: ``"plain"`` JSON text, or ``"confluent"``: Confluent's JSON Schema
            serializer's framing (magic byte 0, 4-byte schema ID, then the JSON text), checked and
            stripped before the JSON is read (``--value-format json-schema``).

    Values become columns as :mod:`chandy.formats.type_mapping` says, exactly: a value that
    does not fit its column (a fraction into an integer, a number beyond its column's range) is
    a bad record naming the field, never rounded, truncated or landed as NULL.
    """

    value_format: ValueFormat
    columns: pa.Schema
    source_names: tuple[str, ...]
    keep: tuple[str, ...]
    avro_schema: str | None = None
    avro_framing: AvroFraming = "single-object"
    avro_schema_id: int | None = None
    unknown_fields: UnknownFields = "ignore"
    schema_registry: tuple[tuple[str, str], ...] = ()
    tombstones: Tombstones = "error"
    errors_tolerance: ErrorsTolerance = "none"
    session_time_zone: str = "UTC"
    cdc: ChangeFormat | None = None
    key_schema: str | None = None
    id_columns: tuple[str, ...] = ()
    op_field: str | None = None
    as_written: bool = False
    columns_schema_id: int | None = None
    json_framing: JsonFraming = "plain"
    widen_columns: bool = False
    key_format: KeyFormat = "raw"
    key_columns: pa.Schema = dataclasses.field(default_factory=lambda: pa.schema([]))
    key_names: tuple[str, ...] = ()
    key_as_written: bool = False

    @property
    def output_schema(self) -> pa.Schema:
        """The decoded batches' schema: the kept Kafka columns, then the key's columns
        (``key_format``, :mod:`chandy.formats.keys`), then the value columns (and, with
        ``cdc``, the operation column)."""
        from chandy.formats.keys import with_key_fields

        return with_key_fields(self, self.values_schema)

    @property
    def values_schema(self) -> pa.Schema:
        """:attr:`output_schema` without the key's columns."""
        from chandy.formats.records import ARROW_SCHEMA

        fields = [ARROW_SCHEMA.field(c) for c in self.keep] + list(self.columns)
        return pa.schema(fields + ([_op_field()] if self.cdc else []))

    def _parser(self, on_writer: Callable[[int, pa.Schema, tuple[str, ...]], None] | None = None
                ) -> Callable[[bytes], dict[str, Any]]:
        """A parser of one value into its fields; ``on_writer(schema ID, its columns, their names
        in the value)`` is called for each writer schema read the first time (``as_written`` only)."""
        if self.value_format == "json":
            return _parse_json if self.json_framing == "plain" else lambda raw: _parse_json(_unframed(raw))
        if self.value_format == "protobuf":
            return protobuf_parser(self, on_writer)
        if self.as_written:
            return avro_parser(self, None, on_writer)
        assert self.avro_schema is not None
        return avro_parser(self, self.avro_schema)

    def key_parser(self) -> Callable[[bytes | None], dict[str, Any]]:
        """With ``cdc``: a function from a record's key to its fields (see ``key_schema``).

        It raises ``ChangeEventError`` for a missing or unreadable key."""
        from chandy.formats.debezium import ChangeEventError, json_key

        avro = None
        if self.key_schema is not None:
            avro = avro_parser(self, self.key_schema)
        elif self.avro_framing == "confluent" and self.schema_registry:
            avro = avro_parser(self, None)

        def parse(raw: bytes | None) -> dict[str, Any]:
            if avro is None or raw is None or raw[:1] == b"{":
                return json_key(raw)
            try:
                return avro(raw)
            except BadValue as exc:
                raise ChangeEventError(f"the key is not Avro of the key schema: {exc}") from exc

        return parse

    def key_fields(self, raw: bytes | None) -> tuple[str, ...]:
        """With ``cdc``: the key columns of a change whose key is ``raw``: ``id_columns``, else
        the key's fields (raises ``ChangeEventError`` for a key that does not parse)."""
        return self.id_columns or tuple(self.key_parser()(raw))

    def decode(self, batch: pa.RecordBatch, *, vectorized: bool = True) -> tuple[pa.RecordBatch, pa.RecordBatch | None, int]:
        """One batch of Kafka records (:data:`~chandy.formats.records.ARROW_SCHEMA`): returns
        (decoded rows, bad records as :data:`BAD_RECORDS_SCHEMA` or None, tombstones skipped).

        JSON batches are read by Arrow's JSON reader when that gives the same values
        (:mod:`chandy.formats.json_batch`), Avro batches by the batch decoder
        (:mod:`chandy.formats.avro_batch`), else, and with ``vectorized=False``, record
        by record. With a ``key_format``, the kept records' keys are decoded too
        (:mod:`chandy.formats.keys`; a key that does not decode makes its record bad).

        Raises:
            BadRecordError: a bad record under ``errors_tolerance="none"``.
        """
        decoded, bad, skipped, kept = self._decode_values(batch, vectorized)
        if self.key_format == "raw":
            return decoded, bad, skipped
        from chandy.formats.keys import with_keys

        decoded, failed = with_keys(self, batch, decoded, kept)
        if failed:
            key_bad = {row: BadValue("KeyError", f"key: {why}") for row, why in failed.items()}
            first = min(key_bad)
            self._check_tolerance(batch, first, key_bad[first])
            bad = pa.Table.from_batches([b for b in (bad, _bad_batch(batch, key_bad)) if b is not None]
                                        ).combine_chunks().to_batches()[0]
        return decoded, bad, skipped

    def _decode_values(self, batch: pa.RecordBatch, vectorized: bool
                       ) -> tuple[pa.RecordBatch, pa.RecordBatch | None, int, list[int] | None]:
        """:meth:`decode` of the values: (decoded rows, bad records, tombstones skipped, the
        batch's rows decoded, in order; None: all of them). A batch path first
        (:meth:`_decode_batch`), else record by record (:meth:`_parse_rows`, then
        :meth:`_assemble`)."""
        if self.value_format == "raw":  # raw values, decoded keys (key_format)
            return pa.RecordBatch.from_arrays([batch.column(c) for c in self.keep], schema=self.values_schema), None, 0, None
        if vectorized:
            decoded = self._decode_batch(batch)
            if decoded is not None:
                return decoded, None, 0, None
        parsed = self._parse_rows(batch)
        decoded = self._assemble(batch, parsed)
        return decoded, (_bad_batch(batch, parsed.bad) if parsed.bad else None), parsed.skipped, parsed.keep_rows

    def _decode_batch(self, batch: pa.RecordBatch) -> pa.RecordBatch | None:
        """``batch`` decoded a column at a time by its format's batch path (JSON through Arrow's
        reader, Avro and Protobuf through their numpy wire readers); None when
        no batch path reads it exactly as record by record would (the caller then does)."""
        values = batch.column("value")
        if self.value_format == "json" and self.json_framing == "confluent":
            from chandy.formats.framing import payloads

            values = payloads(values)  # None: a value is not framed, read value by value
            if values is None:
                return None
        if self.value_format == "json" and self.cdc == "debezium" and self.unknown_fields == "ignore":
            from chandy.formats.json_batch import decode_json_change_batch

            changes = decode_json_change_batch(values, self.columns, self.source_names,
                                               session_time_zone=self.session_time_zone, keys=batch.column("key"),
                                               id_columns=self.id_columns)
            if changes is None:
                return None
            kafka = [batch.column(c) for c in self.keep]
            return pa.RecordBatch.from_arrays(kafka + changes[0] + [changes[1]], schema=self.values_schema)
        if self.cdc is not None:
            return None
        columns: list[pa.Array] | None = None
        if self.value_format == "json":
            from chandy.formats.json_batch import decode_json_batch

            columns = decode_json_batch(values, self.columns, self.source_names,
                                        unknown_fields=self.unknown_fields, session_time_zone=self.session_time_zone)
        elif self.value_format == "avro":
            from chandy.formats.avro_batch import decode_avro_batch

            columns = decode_avro_batch(values, self)
        elif self.value_format == "protobuf":
            from chandy.formats.protobuf_batch import decode_protobuf_batch

            columns = decode_protobuf_batch(values, self)
        return None if columns is None else self._with_kafka(batch, columns)

    def _parse_rows(self, batch: pa.RecordBatch) -> _ParsedRows:
        """``batch``'s values parsed one by one into rows of fields (tombstones as ``tombstones``
        says, bad values noted, or raised under ``errors_tolerance="none"``).

        Raises:
            BadRecordError: a bad record under ``errors_tolerance="none"``.
            SchemaChangeError: a writer schema whose field cannot land in its column (``as_written``).
        """
        parsed = _ParsedRows()
        parse = self._parser(self._writer_check(parsed.writer_types, parsed.widened) if self.as_written else None)
        known = set(self.source_names)
        change = self._change_reader(batch) if self.cdc else None
        for i, raw in enumerate(batch.column("value").to_pylist()):
            try:
                if change is not None:
                    row, op = change(i, raw, parse)
                    parsed.add(i, self._checked_fields(row, known, parsed.extra_names), op)
                    continue
                if raw is None:
                    if self.tombstones == "skip":
                        parsed.skipped += 1
                        continue
                    if self.tombstones == "null":
                        parsed.add(i, None)
                        continue
                    raise BadValue("Tombstone", "a tombstone (null value); choose what tombstones do with --tombstones skip|null")
                if not raw:
                    raise BadValue("EmptyValue", "an empty value")
                parsed.add(i, self._checked_fields(parse(raw), known, parsed.extra_names))
            except BadValue as exc:
                parsed.bad[i] = exc
                self._check_tolerance(batch, i, exc)
            except WriterTypeChange as exc:
                raise SchemaChangeError(f"{location(batch, i)}: {exc}; the micro-batch read {offset_ranges(batch)} "
                                        "and lands nothing of it") from None
        return parsed

    def _assemble(self, batch: pa.RecordBatch, parsed: _ParsedRows) -> pa.RecordBatch:
        """The decoded batch of ``parsed``'s rows: the kept Kafka columns of those rows, the value
        columns (widened or added as the writer schemas or the values say; a value that does not
        fit its column makes its record bad, noted in ``parsed``), and with ``cdc`` the operation.

        Raises:
            BadRecordError: a value that does not fit its column, under ``errors_tolerance="none"``.
        """
        rows, keep_rows, ops = parsed.rows, parsed.keep_rows, parsed.ops
        fields = [f.with_type(parsed.widened[n]) if n in parsed.widened else f
                  for f, n in zip(self.columns, self.source_names, strict=True)]
        names = list(self.source_names)
        for name in parsed.extra_names:
            kind = parsed.writer_types.get(name) or _inferred_type([None if r is None else r.get(name) for r in rows])
            if kind is not None:
                fields.append(pa.field(f"value_{name}" if name in KAFKA_COLUMNS else name, kind))
                names.append(name)
        columns, type_bad = self._columns(rows, fields, names)
        if type_bad:
            for position in sorted(type_bad):
                unfit = type_bad[position]
                parsed.bad[keep_rows[position]] = unfit
                self._check_tolerance(batch, keep_rows[position], unfit)
            good = [p for p in range(len(rows)) if p not in type_bad]
            keep_rows = parsed.keep_rows = [keep_rows[p] for p in good]
            ops = [ops[p] for p in good] if ops else ops
            columns, _ = self._columns([rows[p] for p in good], fields, names)
        taken = pa.array(keep_rows, pa.int64())
        kafka = [batch.column(c).take(taken) for c in self.keep]
        base = [f for f in self.values_schema if f.name != OP_COLUMN][:len(self.keep)] + fields
        if self.cdc:
            schema = pa.schema(base + [_op_field()])
            columns = columns + [pa.array(ops, pa.string())]
        else:
            schema = pa.schema(base)
        return pa.RecordBatch.from_arrays(kafka + columns, schema=schema)

    def _with_kafka(self, batch: pa.RecordBatch, columns: list[pa.Array]) -> pa.RecordBatch:
        """A batch path's value ``columns`` of all of ``batch``'s rows, after its kept Kafka columns."""
        return pa.RecordBatch.from_arrays([batch.column(c) for c in self.keep] + columns, schema=self.values_schema)

    def _writer_check(self, new_types: dict[str, pa.DataType], widened: dict[str, pa.DataType]
                      ) -> Callable[[int, pa.Schema, tuple[str, ...]], None]:
        """``as_written``: what to do with a writer schema read the first time (its columns and
        their names in the value): its fields the columns lack are noted in ``new_types`` (their
        column types); a field of another type than its column raises :class:`WriterTypeChange`
        unless Avro's resolution (Protobuf's wire compatibility is the same) promotes it, it
        widens to the column's type (a writer older than the column's widening), or, with
        ``widen_columns``, the column widens to it (noted in ``widened``, the widest seen)."""
        from chandy.formats.avro import promotes
        from chandy.formats.type_mapping import widens, wider

        known = {name: field for name, field in zip(self.source_names, self.columns, strict=True)}
        first: dict[str, int] = {}

        def check(schema_id: int, written: pa.Schema, names: tuple[str, ...]) -> None:
            for field, name in zip(written, names, strict=True):
                column = known.get(name)
                if column is None:
                    earlier = new_types.setdefault(name, field.type)
                    first.setdefault(name, schema_id)
                    if not earlier.equals(field.type):
                        raise WriterTypeChange(f"new field {name} is {earlier} in schema ID {first[name]} but {field.type} "
                                          f"in schema ID {schema_id}")
                elif self.widen_columns and widens(column.type, field.type):
                    widest = wider(widened.get(name, field.type), field.type)
                    widened[name] = field.type if widest is None else widest
                elif not column.type.equals(field.type) and not promotes(field.type, column.type) \
                        and not widens(field.type, column.type):  # an older, narrower writer into a widened column
                    raise WriterTypeChange(
                        f"field {name} changed type: its column is {column.type} (schema ID {self.columns_schema_id}) "
                        f"but schema ID {schema_id} writes {field.type}, which Avro's schema resolution does not read "
                        "as the column's type (a narrowing or another type; " + (
                            "only int to long, float to double and a decimal's precision up widen a column)"
                            if self.widen_columns else "a Delta table cannot widen a column, an Iceberg table with "
                            "schema evolution can: land it in a new table or map it with a --transform)"))

        return check

    def _checked_fields(self, value: dict[str, Any], known: set[str], extra_names: list[str]) -> dict[str, Any]:
        """``value`` after the ``unknown_fields`` rule: new names noted for ``add``; a bad record
        for ``error`` when it has fields without a column."""
        if self.unknown_fields == "add":
            for name in value:
                if name not in known and name not in extra_names:
                    extra_names.append(name)
        elif self.unknown_fields == "error":
            extra = sorted(set(value) - known)
            if extra:
                raise BadValue("UnknownField", f"field(s) {', '.join(extra)} have no column in the table "
                                           "(--schema-evolution adds them; a transform fixes the columns)")
        return value

    def _change_reader(self, batch: pa.RecordBatch) -> Callable[[int, bytes | None, Callable], tuple[dict, str]]:
        """With ``cdc``: (row index, raw value, value parser) -> (the change's row, its operation),
        raising ``BadValue`` for what is not a change event (see :mod:`chandy.formats.debezium`)."""
        from chandy.formats.debezium import (
            DELETE_OP,
            ChangeEventError,
            change_row,
            scalar_key,
            unwrap_payload,
            upsert_row,
            with_logical_types,
        )

        keys = batch.column("key")
        key_of = self.key_parser()
        id_columns = self.id_columns

        def key_row(i: int) -> dict[str, Any]:
            raw_key = keys[i].as_py()
            try:
                fields = key_of(raw_key)
            except ChangeEventError:
                plain = scalar_key(raw_key) if self.cdc == "upsert" and len(id_columns) == 1 else None
                if plain is None:
                    raise
                return {id_columns[0]: plain}  # a compacted topic's plain key ("42", 42) is the one id column
            if id_columns:
                missing = [c for c in id_columns if c not in fields]
                if missing:
                    raise ChangeEventError(f"the key has no field(s) {missing} (--id-columns); it has {sorted(fields)}")
                return {c: fields[c] for c in id_columns}
            return fields

        def read(i: int, raw: bytes | None, parse: Callable[[bytes], dict[str, Any]]) -> tuple[dict, str]:
            try:
                if raw is None:
                    return key_row(i), DELETE_OP  # a tombstone: the key's row is gone
                if not raw:
                    raise BadValue("EmptyValue", "an empty value")
                if self.value_format != "json":
                    value = parse(raw)
                else:
                    value = _parse_json_any(raw if self.json_framing == "plain" else _unframed(raw))
                envelope = unwrap_payload(value)
                if envelope is None:  # the JSON converter's tombstone with schemas: a null payload
                    return key_row(i), DELETE_OP
                if not isinstance(envelope, dict):
                    raise BadValue("JsonParseError", f"not a JSON object but {type(envelope).__name__}")
                if self.cdc == "upsert":
                    row, op = upsert_row(envelope, self.op_field)
                else:
                    row, op = change_row(envelope, lambda: key_row(i))
                if envelope is not value and self.cdc == "debezium":  # the JSON converter's schema: logical types
                    row = with_logical_types(value.get("schema"), "before" if op == DELETE_OP else "after", row)
                missing = [c for c in (id_columns or ()) if row.get(c) is None]
                if missing:
                    raise ChangeEventError(f"the {op!r} change's row has no value for key column(s) {missing}")
                return row, op
            except ChangeEventError as exc:
                raise BadValue("ChangeEventError", str(exc)) from exc

        return read

    def refuse(self, batch: pa.RecordBatch, rows: list[int], kind: str, message: str) -> pa.RecordBatch:
        """Make ``rows`` of the raw Kafka ``batch`` bad records of ``kind`` (e.g. a record no
        ``--route`` rule matches): returned as :data:`BAD_RECORDS_SCHEMA` rows.

        Raises:
            BadRecordError: under ``errors_tolerance="none"``, naming the first of them.
        """
        bad = {row: BadValue(kind, message) for row in rows}
        for row in rows[:1]:
            self._check_tolerance(batch, row, bad[row])
        return _bad_batch(batch, bad)

    def _check_tolerance(self, batch: pa.RecordBatch, row: int, exc: BadValue) -> None:
        if self.errors_tolerance == "none":
            raise BadRecordError(f"{location(batch, row)}: {exc.kind}: {exc} "
                                 "(--errors-tolerance all skips bad records; --dead-letter-topic keeps them)")

    def _columns(self, rows: list[dict[str, Any] | None], fields: list[pa.Field],
                 names: list[str]) -> tuple[list[pa.Array], dict[int, BadValue]]:
        """The value columns of ``rows``; on a type error, which rows (by position) are bad."""
        arrays: list[pa.Array] = []
        bad: dict[int, BadValue] = {}
        for field, name in zip(fields, names, strict=True):
            values = [None if r is None else r.get(name) for r in rows]
            try:
                arrays.append(to_arrow(values, field.type, self.value_format, self.session_time_zone))
            except _UNFIT:
                for position, v in enumerate(values):
                    try:
                        to_arrow([v], field.type, self.value_format, self.session_time_zone)
                    except Unfit as exc:
                        bad.setdefault(position, BadValue("TypeMismatch", f"field {name}{exc.path}: {exc}"))
                    except _UNFIT as exc:
                        shown = json.dumps(v, default=str)[:80]
                        bad.setdefault(position, BadValue("TypeMismatch", f"field {name}: {shown} is not {field.type}: "
                                                                       f"{str(exc).splitlines()[0]}"))
                arrays.append(pa.nulls(len(values), field.type))
        return arrays, bad


#: What a value that does not fit its column raises on its way into Arrow.
_UNFIT = (Unfit, pa.ArrowException, TypeError, ValueError, decimal.InvalidOperation, OverflowError)

def _inferred_type(values: list[Any]) -> pa.DataType | None:
    """The Arrow type of a new field, from its first non-null value (JSON objects become
    structs, arrays lists, integers int64, strings string), or None when all are null."""
    for value in values:
        if value is not None:
            value = plain_numbers(value)
            try:
                kind = pa.array([value]).type
            except (pa.ArrowException, TypeError, ValueError, OverflowError):
                return pa.string() if isinstance(value, str) else None
            return None if pa.types.is_null(kind) else kind
    return None


def location(batch: pa.RecordBatch, row: int) -> str:
    """``topic <t> partition <p> offset <o>`` of a row of a Kafka batch."""
    return (f"topic {batch.column('topic')[row].as_py()} partition {batch.column('partition')[row].as_py()} "
            f"offset {batch.column('offset')[row].as_py()}")


def _op_field() -> pa.Field:
    return pa.field(OP_COLUMN, pa.string())


def _parse_json_any(raw: bytes) -> Any:
    try:
        return parse_json(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadValue("JsonParseError", f"invalid JSON: {exc}") from exc


def _parse_json(raw: bytes) -> dict[str, Any]:
    try:
        value = parse_json(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadValue("JsonParseError", f"invalid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise BadValue("JsonParseError", f"not a JSON object but {type(value).__name__}")
    return value


def to_arrow(values: list[Any], arrow_type: pa.DataType, value_format: str = "json",
             session_time_zone: str = "UTC") -> pa.Array:
    """``values`` (decoded JSON / Avro) as an Arrow array of ``arrow_type``, following the type
    mapping (:mod:`chandy.formats.type_mapping`): JSON values go through its exact, strict
    converter; Avro values, already of their column's Python types (see
    :func:`chandy.formats.avro.reader_schema`), through pyarrow's strict conversion.

    Raises:
        Unfit: a JSON value does not fit (``path`` says where inside the column).
        pyarrow.ArrowException, TypeError, ValueError, OverflowError: an Avro value does not fit.
    """
    if value_format == "json":
        convert = json_converter(arrow_type, session_time_zone)
        if convert is not None:
            values = [convert(v) for v in values]
    return pa.array(values, arrow_type)


def _unframed(raw: bytes) -> bytes:
    """The JSON text of a Confluent-framed value; a bad record when it is not framed."""
    from chandy.formats.framing import FramingError, split

    try:
        return split(raw)[1]
    except FramingError as exc:
        raise BadValue("WireFormatError", str(exc)) from exc


def _bad_batch(batch: pa.RecordBatch, bad: dict[int, BadValue]) -> pa.RecordBatch:
    rows = sorted(bad)
    taken = pa.array(rows, pa.int64())
    columns = [batch.column(c).take(taken) for c in ("key", "value", "topic", "partition", "offset", "timestamp", "headers")]
    columns.append(pa.array([bad[r].kind for r in rows], pa.string()))
    columns.append(pa.array([str(bad[r]) for r in rows], pa.string()))
    return pa.RecordBatch.from_arrays(columns, schema=BAD_RECORDS_SCHEMA)


def decode_batches(batches: Iterator[pa.RecordBatch], decoder: ValueDecoder,
                   on_bad: Callable[[pa.RecordBatch], None], on_skipped: Callable[[int], None]) -> Iterator[pa.RecordBatch]:
    """Decode a stream of Kafka batches; bad records go to ``on_bad``, tombstones skipped are
    counted with ``on_skipped``."""
    for batch in batches:
        decoded, bad, skipped = decoder.decode(batch)
        if bad is not None:
            on_bad(bad)
        if skipped:
            on_skipped(skipped)
        yield decoded

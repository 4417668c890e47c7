"""Avro values decoded a batch at a time, straight into Arrow columns (issue 45's "Avro at batch
speed"), for :meth:`chandy.formats.decoder.ValueDecoder.decode`.

fastavro reads one record at a time into Python dicts (about 7 µs a record), and building Arrow
columns from the dicts costs about as much again. Here a batch of Kafka values (one Arrow binary
column) is read *field by field across all records at once* with numpy: every record has its own
cursor into the values buffer, and each step of the writer schema (a varint, a string, a union's
branch, an array's block) advances the cursors of the records that take it. Every record stays
within its own bytes (its Kafka value), so a bad record can never shift the next one.

The batch path reads a batch only when it can read every record of it exactly as fastavro would
(:func:`chandy.formats.avro.reader_schema` for the column types, then pyarrow's strict
conversion); anything else is :class:`_Fallback` and the whole batch goes record by record, where
bad records are found, named and kept as before. It falls back on: a tombstone or empty value; a
framing, fingerprint or schema ID that is not the expected one; a writer schema the registry gives
whose fields are not (a subset of) the columns, or that must be resolved against another reader
schema; a read past a record's end or trailing bytes; a varint of more than 10 bytes; a boolean
byte other than 0 or 1; a union branch or enum index out of range; a string that is not UTF-8; an
int beyond 32 bits, a date or timestamp beyond Python's ``datetime``, a decimal beyond its
precision or longer than 16 bytes; and schemas with maps (duplicate keys collapse in fastavro's
dicts), empty records, or logical types this module does not know.

Semantics followed: the Avro 1.12 specification's binary encoding (zig-zag varints, little-endian
IEEE floats, length-prefixed bytes and strings, block-encoded arrays with negative counts followed
by a byte size, unions as a branch index), the Confluent wire format (magic 0, 4-byte big-endian
schema ID) and Avro single-object encoding (``C3 01`` and the 8-byte CRC-64-AVRO fingerprint).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from chandy.formats.value_parsers import ValueDecoder as ParserOptions

#: Python's ``datetime`` range in microseconds from the epoch (fastavro builds ``datetime``s).
_MIN_US, _MAX_US = -62_135_596_800_000_000, 253_402_300_799_999_999
#: ``date.fromordinal``'s range in days from the epoch.
_MIN_DAYS, _MAX_DAYS = -719_162, 2_932_896
_INT32 = (-(2**31), 2**31 - 1)
#: Lossless promotions of a writer's column type into the column's (Avro's resolution; the others,
#: e.g. long to float, can lose digits, and pyarrow's strict conversion decides record by record).
_LOSSLESS = {(pa.int32(), pa.int64()), (pa.int32(), pa.float64()), (pa.float32(), pa.float64())}
_KNOWN_LOGICAL = {"decimal", "date", "timestamp-millis", "timestamp-micros", "local-timestamp-millis",
                  "local-timestamp-micros", "time-millis", "time-micros", "uuid"}


class _Fallback(Exception):
    """Internal: this batch is not read alike here; read it record by record."""


class AvroBatchOptions(ParserOptions, Protocol):
    """What the batch path reads of :class:`~chandy.formats.decoder.ValueDecoder`: the
    framing and registry the record-by-record parsers read, and the schema and columns."""

    @property
    def avro_schema(self) -> str | None: ...

    @property
    def as_written(self) -> bool: ...

    @property
    def columns(self) -> pa.Schema: ...

    @property
    def source_names(self) -> tuple[str, ...]: ...


def decode_avro_batch(values: pa.Array, options: AvroBatchOptions,
                      writer_text: Callable[[int], str] | None = None) -> list[pa.Array] | None:
    """The value columns (``options.columns``, in order) of a batch of Avro ``values`` (Arrow
    binary, one Kafka value each), or None when the batch must be read record by record (see the
    module docstring for when).

    Args:
        values: the batch's ``value`` column.
        options: the framing, schemas and columns (a ``ValueDecoder``).
        writer_text: with the Confluent framing and a Schema Registry, a schema ID's schema text
            (default: the registry client's ``get_schema``, cached per process).
    """
    try:
        return _decode(values, options, writer_text)
    except (_Fallback, pa.ArrowInvalid):
        return None


def _decode(values: pa.Array, options: AvroBatchOptions, writer_text: Callable[[int], str] | None) -> list[pa.Array]:
    n = len(values)
    if values.null_count or not pa.types.is_binary(values.type):
        raise _Fallback("tombstones")
    offsets = np.frombuffer(values.buffers()[1], dtype=np.int32)[values.offset:values.offset + n + 1].astype(np.int64)
    data_buffer = values.buffers()[2]
    data = np.frombuffer(data_buffer, dtype=np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    data = np.concatenate([data, np.zeros(16, np.uint8)])  # a varint's look-ahead never leaves the buffer
    start, end = offsets[:-1], offsets[1:]
    if n == 0:
        return [pa.nulls(0, f.type) for f in options.columns]
    if not (end > start).all():
        raise _Fallback("empty value")
    reader = json.loads(options.avro_schema) if options.avro_schema is not None else None
    groups: list[tuple[Any, np.ndarray]]  # (writer schema, rows)
    framing = options.avro_framing
    if framing == "single-object":
        from chandy.schemas.codec import fingerprint

        if reader is None:
            raise _Fallback("no schema")
        _expect_header(data, start, end, b"\xc3\x01" + fingerprint(reader))
        header, groups = 10, [(reader, np.arange(n))]
    elif framing == "confluent":
        from chandy.formats.framing import HEADER_BYTES, schema_ids

        found_ids = schema_ids(data, start, end)
        if found_ids is None:
            raise _Fallback("framing")
        ids, header = found_ids, HEADER_BYTES
        if options.avro_schema_id is not None and not (ids == options.avro_schema_id).all():
            raise _Fallback("schema ID")
        if not options.schema_registry:
            if reader is None:
                raise _Fallback("no schema")
            groups = [(reader, np.arange(n))]
        else:
            fetch = writer_text or _registry_text(options)
            groups = []
            for found in np.unique(ids):
                writer = json.loads(fetch(int(found)))
                if not options.as_written and writer != reader:
                    raise _Fallback("resolution against the reader schema")
                groups.append((writer, np.flatnonzero(ids == found)))
    else:
        header, groups = 0, [(reader, np.arange(n))]
        if reader is None:
            raise _Fallback("no schema")
    cursor = _Cursor(data, start + header, end)
    per_group = [_top_level(cursor, writer, rows, options) for writer, rows in groups]
    if not (cursor.pos == cursor.end).all():
        raise _Fallback("trailing bytes")
    if len(groups) == 1:
        return per_group[0]
    order = np.argsort(np.concatenate([rows for _, rows in groups]), kind="stable")
    taken = pa.array(order)
    return [pa.concat_arrays([g[c] for g in per_group]).take(taken) for c in range(len(options.columns))]


def _registry_text(options: AvroBatchOptions) -> Callable[[int], str]:
    from chandy.formats.registry import registry_client

    client = registry_client(dict(options.schema_registry))

    def fetch(schema_id: int) -> str:
        try:
            return str(client.get_schema(schema_id).schema_str)
        except Exception as exc:  # an unknown ID, an unreachable registry: record by record says which
            raise _Fallback(f"schema ID {schema_id}") from exc

    return fetch


def _expect_header(data: np.ndarray, start: np.ndarray, end: np.ndarray, header: bytes) -> None:
    if not (end - start >= len(header)).all():
        raise _Fallback("short value")
    expected = np.frombuffer(header, np.uint8)
    found = data[start[:, None] + np.arange(len(header))]
    if not (found == expected).all():
        raise _Fallback("framing")


def _top_level(cursor: _Cursor, writer: Any, rows: np.ndarray, options: AvroBatchOptions) -> list[pa.Array]:
    """The columns of ``rows`` read with ``writer`` (a record schema): each column its writer
    field, promoted losslessly where the column is wider, or null where the writer lacks it."""
    from chandy.formats.avro import AvroValueSchemaError, avro_columns
    from chandy.formats.type_mapping import widens

    try:
        written, names = avro_columns(writer)
    except AvroValueSchemaError as exc:
        raise _Fallback(str(exc)) from exc
    by_name = dict(zip(names, written, strict=True))
    if not set(by_name) <= set(options.source_names):
        raise _Fallback("new fields")  # evolution: record by record adds their columns
    for name, column in zip(options.source_names, options.columns, strict=True):
        field = by_name.get(name)
        if field is not None and not field.type.equals(column.type) and (field.type, column.type) not in _LOSSLESS \
                and not widens(field.type, column.type):
            raise _Fallback(f"field {name}")
    named: dict[str, Any] = {}
    read = _Reader(cursor, named)
    struct = read.value(writer, rows)
    out = []
    for name, column in zip(options.source_names, options.columns, strict=True):
        if name not in by_name:
            out.append(pa.nulls(len(rows), column.type))
            continue
        array = struct.field(name)
        out.append(array if array.type.equals(column.type) else array.cast(column.type))
    return out


class _Cursor:
    """Each record's read position (``pos``) and end (``end``) in the values buffer (``data``)."""

    def __init__(self, data: np.ndarray, pos: np.ndarray, end: np.ndarray) -> None:
        self.data, self.pos, self.end = data, pos.copy(), end

    def take(self, rows: np.ndarray, size: np.ndarray | int) -> np.ndarray:
        """The start of ``size`` bytes at each of ``rows``' positions, which move past them."""
        at = self.pos[rows]
        after = at + size
        if (after > self.end[rows]).any() or (np.asarray(size) < 0).any():
            raise _Fallback("past a record's end")
        self.pos[rows] = after
        return at

    def long(self, rows: np.ndarray) -> np.ndarray:
        """A zig-zag varint (Avro ``int`` and ``long``) at each of ``rows``, as int64."""
        at = self.pos[rows]
        value = np.zeros(len(rows), np.uint64)
        length = np.zeros(len(rows), np.int64)
        active = np.arange(len(rows))
        for i in range(10):
            byte = self.data[at[active] + i].astype(np.uint64)
            if i == 9 and (byte > 1).any():
                raise _Fallback("varint beyond 64 bits")
            value[active] |= (byte & np.uint64(0x7F)) << np.uint64(7 * i)
            more = byte >= 0x80
            length[active[~more]] = i + 1
            active = active[more]
            if not len(active):
                break
        else:
            raise _Fallback("varint of more than 10 bytes")
        self.take(rows, length)
        return (value >> np.uint64(1)).view(np.int64) ^ -(value & np.uint64(1)).view(np.int64)

    def chunks(self, rows: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Arrow offsets (int32) and the bytes of one ``sizes[i]``-byte chunk at each of ``rows``."""
        at = self.take(rows, sizes)
        offsets = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        if offsets[-1] >= 2**31:
            raise _Fallback("a batch of more than 2 GiB")
        index = np.repeat(at - offsets[:-1], sizes) + np.arange(offsets[-1])
        return offsets.astype(np.int32), self.data[index]


class _Reader:
    """Reads values of a writer schema at a set of records' cursors into Arrow arrays of the types
    :func:`chandy.formats.avro.avro_columns` gives them (so as fastavro reads them through
    ``reader_schema``, then pyarrow converts them)."""

    def __init__(self, cursor: _Cursor, named: dict[str, Any]) -> None:
        self.cursor, self.named = cursor, named

    def _define(self, schema: dict[str, Any]) -> None:
        """Note a named type under its name and its namespaced name; a name two different types
        share is ambiguous here (a reference to it falls back)."""
        name = str(schema.get("name"))
        for key in {name, f"{schema['namespace']}.{name}" if "namespace" in schema else name}:
            earlier = self.named.get(key, schema)
            self.named[key] = schema if earlier is schema else None

    def value(self, schema: Any, rows: np.ndarray) -> pa.Array:
        """The values of ``schema`` at each of ``rows``' cursors, which move past them."""
        if isinstance(schema, list):
            return self._union(schema, rows)
        if isinstance(schema, str):
            if schema in self.named:
                if self.named[schema] is None:
                    raise _Fallback(f"ambiguous name {schema}")
                return self.value(self.named[schema], rows)
            return self._primitive(schema, rows)
        if not isinstance(schema, dict):
            raise _Fallback(f"schema {schema!r}")
        kind, logical = schema.get("type"), schema.get("logicalType")
        if kind in ("record", "enum", "fixed"):
            self._define(schema)
        if logical is not None and logical not in _KNOWN_LOGICAL:
            raise _Fallback(f"logical type {logical}")
        if logical == "decimal" and kind in ("bytes", "fixed"):
            return self._decimal(schema, rows)
        if logical == "date" and kind == "int":
            days = self.cursor.long(rows)
            if ((days < _MIN_DAYS) | (days > _MAX_DAYS)).any():
                raise _Fallback("date out of range")
            return pa.array(days.astype(np.int32), pa.date32())
        if logical is not None and logical.endswith(("timestamp-millis", "timestamp-micros")) and kind == "long":
            ticks = self.cursor.long(rows)
            if logical.endswith("millis"):
                if ((ticks < _MIN_US // 1000) | (ticks > _MAX_US // 1000)).any():
                    raise _Fallback("timestamp out of range")
                ticks = ticks * 1000
            elif ((ticks < _MIN_US) | (ticks > _MAX_US)).any():
                raise _Fallback("timestamp out of range")
            return pa.array(ticks, pa.timestamp("us", None if logical.startswith("local") else "UTC"))
        if kind == "record":
            fields = schema.get("fields", [])
            if not fields:
                raise _Fallback("an empty record")
            children = [self.value(f["type"], rows) for f in fields]
            return pa.StructArray.from_arrays(children, fields=[pa.field(f["name"], c.type)
                                                                for f, c in zip(fields, children, strict=True)])
        if kind == "enum":
            index = self.cursor.long(rows)
            symbols = schema.get("symbols", [])
            if ((index < 0) | (index >= len(symbols))).any():
                raise _Fallback("enum index")
            return pa.array(symbols, pa.string()).take(pa.array(index))
        if kind == "fixed":
            size = int(schema["size"])
            offsets, chunk = self.cursor.chunks(rows, np.full(len(rows), size, np.int64))
            return pa.Array.from_buffers(pa.binary(), len(rows), [None, pa.py_buffer(offsets), pa.py_buffer(chunk)])
        if kind == "array":
            return self._array(schema["items"], rows)
        if kind == "map":
            raise _Fallback("maps")  # fastavro's dict keeps one value per key
        if isinstance(kind, (str, list, dict)):
            return self.value(kind, rows)
        raise _Fallback(f"schema {schema!r}")

    def _primitive(self, kind: str, rows: np.ndarray) -> pa.Array:
        cursor = self.cursor
        if kind in ("int", "long"):
            value = cursor.long(rows)
            if kind == "int":
                if ((value < _INT32[0]) | (value > _INT32[1])).any():
                    raise _Fallback("int beyond 32 bits")
                return pa.array(value.astype(np.int32))
            return pa.array(value)
        if kind in ("float", "double"):
            width = 4 if kind == "float" else 8
            at = cursor.take(rows, width)
            raw = np.ascontiguousarray(cursor.data[at[:, None] + np.arange(width)])
            return pa.array(raw.view("<f4" if width == 4 else "<f8").reshape(len(rows)))
        if kind == "boolean":
            at = cursor.take(rows, 1)
            byte = cursor.data[at]
            if (byte > 1).any():
                raise _Fallback("boolean byte")
            return pa.array(byte.astype(bool))
        if kind in ("string", "bytes"):
            offsets, chunk = cursor.chunks(rows, cursor.long(rows))
            array = pa.Array.from_buffers(pa.string() if kind == "string" else pa.binary(), len(rows),
                                          [None, pa.py_buffer(offsets), pa.py_buffer(chunk)])
            if kind == "string":
                array.validate(full=True)  # not UTF-8: ArrowInvalid, record by record (fastavro's strict decoding)
            return array
        raise _Fallback(f"type {kind}")

    def _decimal(self, schema: dict[str, Any], rows: np.ndarray) -> pa.Array:
        precision, scale = int(schema["precision"]), int(schema.get("scale", 0))
        sizes = (np.full(len(rows), int(schema["size"]), np.int64) if schema["type"] == "fixed"
                 else self.cursor.long(rows))
        if (sizes > 16).any():
            raise _Fallback("a decimal of more than 16 bytes")
        offsets, chunk = self.cursor.chunks(rows, sizes)
        # big-endian two's complement, right-aligned and sign-extended to 16 bytes, then reversed:
        # Arrow's decimal128 is 16-byte little-endian two's complement
        wide = np.zeros((len(rows), 16), np.uint8)
        negative = np.zeros(len(rows), bool)
        has = sizes > 0
        negative[has] = chunk[offsets[:-1][has]] >= 0x80
        wide[negative] = 0xFF
        row_of = np.repeat(np.arange(len(rows)), sizes)
        column = 16 - np.repeat(sizes, sizes) + (np.arange(len(chunk)) - np.repeat(offsets[:-1], sizes))
        wide[row_of, column] = chunk
        little = np.ascontiguousarray(wide[:, ::-1])
        array = pa.Array.from_buffers(pa.decimal128(precision, scale), len(rows), [None, pa.py_buffer(little)])
        array.validate(full=True)  # beyond the precision: ArrowInvalid, record by record
        return array

    def _union(self, branches: list[Any], rows: np.ndarray) -> pa.Array:
        from chandy.formats.avro import widened_union

        index = self.cursor.long(rows)
        if ((index < 0) | (index >= len(branches))).any():
            raise _Fallback("union branch")
        kinds = [b for b in branches if b != "null"]
        widened = widened_union(kinds) if len(kinds) > 1 else None
        target = {"long": pa.int64(), "double": pa.float64()}.get(widened or "")
        parts: list[pa.Array] = []
        place = np.full(len(rows), -1, np.int64)
        member = 0
        taken = 0
        read: list[tuple[int, pa.Array]] = []
        for i, branch in enumerate(branches):
            chosen = np.flatnonzero(index == i)
            if branch == "null":
                continue
            array = self.value(branch, rows[chosen])
            read.append((member, array))
            place[chosen] = taken + np.arange(len(chosen))
            taken += len(chosen)
            member += 1
        if len(kinds) == 1 or target is not None:
            parts = [a if target is None or a.type.equals(target) else a.cast(target) for _, a in read]
        else:  # a struct of one nullable field member<i> per non-null branch (spark-avro)
            types = [a.type for _, a in read]
            parts = [pa.StructArray.from_arrays(
                [a if k == m else pa.nulls(len(a), types[k]) for k in range(len(types))],
                fields=[pa.field(f"member{k}", types[k]) for k in range(len(types))]) for m, a in read]
        combined = pa.concat_arrays(parts)
        return combined.take(pa.array(place, mask=place < 0))

    def _array(self, items: Any, rows: np.ndarray) -> pa.Array:
        counts = np.zeros(len(rows), np.int64)
        pieces: list[pa.Array] = []
        owners: list[np.ndarray] = []
        sequence: list[np.ndarray] = []
        active = np.arange(len(rows))
        while len(active):
            count = self.cursor.long(rows[active])
            negative = count < 0
            if negative.any():  # a negative count is followed by the block's size in bytes
                self.cursor.long(rows[active[negative]])
                count = np.abs(count)
            remaining = self.cursor.end[rows[active]] - self.cursor.pos[rows[active]]
            if (count > remaining).any():
                raise _Fallback("an array block longer than its record")
            for j in range(int(count.max(initial=0))):
                who = active[count > j]
                pieces.append(self.value(items, rows[who]))
                owners.append(who)
                sequence.append(counts[who] + j)
            counts[active] += count
            active = active[count > 0]
        offsets = np.zeros(len(rows) + 1, np.int32)
        np.cumsum(counts, out=offsets[1:])
        if pieces:
            order = np.lexsort((np.concatenate(sequence), np.concatenate(owners)))
            flat = pa.concat_arrays(pieces).take(pa.array(order))
        else:
            flat = self.value(items, np.zeros(0, np.int64))
        return pa.ListArray.from_arrays(pa.array(offsets), flat)

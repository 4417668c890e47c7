"""Protobuf's binary wire format read a batch at a time with numpy, straight into the Arrow arrays
:mod:`chandy.formats.protobuf` maps a message's fields to, for
:mod:`chandy.formats.protobuf_batch`.

Every message of the batch (a Kafka value's Protobuf binary, a nested message, a repeated
message's element, a map entry) has its own read position and end, and the fields are read *field
by field across all messages at once*: each message's next tag is decoded (a varint: the field
number and the wire type), then, for each field of the message type in field-number order, the
messages whose next tag is that field's read one value of it (a varint, a 4- or 8-byte value, or a
length-delimited payload) and move on. Serializers write fields in field-number order, so one
round over the fields usually reads whole messages; a message whose fields come in another order,
or with fields the message type does not know (skipped by their wire type, as protobuf's runtime
keeps them as unknown fields), takes more rounds. A message never reads past its own end, so a
damaged value can never shift the next one. A compiled plan per message type (its fields' tags,
how each is read and built into Arrow) is kept per process.

The values are those protobuf's runtime (``google.protobuf``, upb) reads and
:func:`chandy.formats.protobuf.field_reader` converts: the last value of a non-repeated field
seen twice; a repeated scalar's elements packed and unpacked alike, in order; zigzag for
``sint32``/``sint64``; any ``bool`` varint but 0 true; a ``float``'s NaN as the runtime's Python
float leaves it (quiet); enums by name (an open enum's unknown number as its digits); ``uint64``
as ``decimal(20, 0)``; a ``google.protobuf.Timestamp`` as UTC microseconds (``nanos`` floored to
microseconds); the default (0, ``""``) for a field without presence that is not there, NULL for
one with presence, the defaults for a map entry's missing key or value; a map's entries in the
order protobuf's runtime iterates them (its hash table's: a map of two entries or more is read
by the runtime itself, from those entries' bytes only).

What this module does not read exactly as the runtime would raises :class:`WireFallback` (the
caller reads the batch record by record, where bad records are named): field number 0, a wire
type other than 0, 1, 2 and 5 (groups, deprecated, among them), a known field with another wire
type than its type's (the runtime keeps it as an unknown field), a varint of more than 10 bytes or
with a 10th byte above 1, a tag beyond 32 bits, a value or a length past its message's end, a
packed field whose last varint or fixed value runs past it; an ``int32`` or enum varint beyond 32
bits signed, a ``uint32`` or ``sint32`` one beyond 32 bits unsigned (the runtime truncates them),
a closed (proto2) enum's unknown number (the runtime keeps it as an unknown field), a string that
is not UTF-8 (even one a later value of its field replaces), a Timestamp beyond ``datetime``'s
range; a non-repeated message field seen twice (the runtime merges them), two members of one
``oneof`` in a message (the runtime keeps the last); an unknown field in a message's extension
ranges or in a map entry (the runtime keeps the whole entry as an unknown field of the map's
message); message types with groups, ``message_set_wire_format``, no fields, or a default other
than zero on a field without presence.

Semantics followed: the Protobuf encoding specification
(https://protobuf.dev/programming-guides/encoding/: base-128 varints, little-endian ``I32`` and
``I64``, ``LEN`` payloads, tags as ``(field_number << 3) | wire_type``, "last one wins" for
non-repeated fields and merging for messages, packed and unpacked repeated fields accepted alike,
unknown fields skipped) and the language guide's conversions (https://protobuf.dev/programming-
guides/proto3/: an out-of-range ``int32`` is truncated, proto3 enums are open, proto2 enums closed).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
from google.protobuf.descriptor import FieldDescriptor
from numpy.lib.stride_tricks import sliding_window_view

#: the encoding spec's wire types
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
#: which wire types (``tag & 7``) are read here: not 3 and 4 (groups), nor 6 and 7 (none)
_READABLE_WIRE = np.array([True, True, True, False, False, True, False, False])
#: each scalar field type's wire type
_WIRE = {FieldDescriptor.TYPE_INT32: _VARINT, FieldDescriptor.TYPE_INT64: _VARINT, FieldDescriptor.TYPE_UINT32: _VARINT,
         FieldDescriptor.TYPE_UINT64: _VARINT, FieldDescriptor.TYPE_SINT32: _VARINT,
         FieldDescriptor.TYPE_SINT64: _VARINT, FieldDescriptor.TYPE_BOOL: _VARINT, FieldDescriptor.TYPE_ENUM: _VARINT,
         FieldDescriptor.TYPE_FIXED32: _I32, FieldDescriptor.TYPE_SFIXED32: _I32, FieldDescriptor.TYPE_FLOAT: _I32,
         FieldDescriptor.TYPE_FIXED64: _I64, FieldDescriptor.TYPE_SFIXED64: _I64, FieldDescriptor.TYPE_DOUBLE: _I64,
         FieldDescriptor.TYPE_STRING: _LEN, FieldDescriptor.TYPE_BYTES: _LEN, FieldDescriptor.TYPE_MESSAGE: _LEN}
#: Python's ``datetime`` range, in seconds and in microseconds from the epoch (record by record
#: builds a ``datetime`` of each Timestamp)
_MIN_S, _MAX_S = -62_135_596_800, 253_402_300_799
_MIN_US, _MAX_US = _MIN_S * 1_000_000, _MAX_S * 1_000_000 + 999_999
#: rounds over a message type's fields before a batch of messages in a very unusual field order
#: goes record by record (each round reads at least one field of every message not done)
_MAX_ROUNDS = 1000
#: an enum's numbers are named through a lookup table when they span fewer than this
_ENUM_TABLE = 4096


class WireFallback(Exception):
    """A batch this module does not read exactly as protobuf's runtime would (the message says
    why): the caller reads it record by record."""


def read_messages(descriptor: Any, data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[pa.Array]:
    """The fields of messages of type ``descriptor`` (a message descriptor), one message's
    Protobuf binary at ``data[starts[i]:ends[i]]`` each, as Arrow arrays: one per field of
    ``descriptor.fields`` (declaration order), of the field's column type
    (:func:`chandy.formats.protobuf.arrow_columns`), ``len(starts)`` values each, exactly what
    protobuf's runtime parses and :func:`~chandy.formats.protobuf.field_reader` converts (see the
    module docstring).

    Args:
        descriptor: the writer's message descriptor.
        data: ``uint8`` bytes holding every message, followed by at least 16 bytes (any value) so
            that reading ahead never leaves the array.
        starts, ends: ``int64`` byte offsets into ``data``, one pair per message (``ends`` exclusive).

    Raises:
        WireFallback: a message or a message type this module does not read exactly as protobuf's
            runtime (the module docstring lists them).

    Semantics: the Protobuf encoding specification, https://protobuf.dev/programming-guides/encoding/.
    """
    return _plan(descriptor).read(_Cursor(data), np.asarray(starts, np.int64), np.asarray(ends, np.int64))


class _Cursor:
    """The bytes of a batch (``data``, ``uint8``, padded) and the readers of its primitives."""

    def __init__(self, data: np.ndarray) -> None:
        self.data, self.buffer = data, pa.py_buffer(data)

    def varint(self, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(value as ``uint64``, length in bytes) of the base-128 varint at each of ``at``.

        Raises:
            WireFallback: a varint of more than 10 bytes, or a 10th byte above 1 (beyond 64 bits).
        """
        data = self.data
        byte = data[at]
        value = byte.astype(np.uint64)
        active = np.flatnonzero(byte >= 0x80)
        length = np.ones(len(at), np.int64)
        if not len(active):
            return value, length
        value &= np.uint64(0x7F)  # a no-op on the single-byte ones
        dense = len(active) == len(at)  # every one longer: whole arrays, not indexes
        where = at if dense else at[active]
        for i in range(1, 10):
            byte = data[where + i]
            part = (byte & 0x7F).astype(np.uint64) << np.uint64(7 * i)
            if dense:
                value |= part
            else:
                value[active] |= part
            if i == 9 and (byte > 1).any():
                raise WireFallback("a varint of more than 10 bytes or beyond 64 bits")
            ended = byte < 0x80
            if ended.all():
                if dense:
                    length[:] = i + 1
                else:
                    length[active] = i + 1
                break
            length[active[ended]] = i + 1
            going = ~ended
            active, where, dense = active[going], where[going], False
        return value, length

    def fixed(self, at: np.ndarray, width: int) -> np.ndarray:
        """The little-endian ``width``-byte (4 or 8) value at each of ``at``, as ``uint64``."""
        raw = sliding_window_view(self.data, width)[at]  # a copy, one row of ``width`` bytes each
        return raw.view("<u4" if width == 4 else "<u8").reshape(len(at)).astype(np.uint64)

    def gathered(self, starts: np.ndarray, sizes: np.ndarray) -> pa.Array:
        """The ``sizes[i]`` bytes at each ``starts[i]`` (ranges one after another in the buffer)
        as a binary array, copied by Arrow's ``take``: the buffer is cut into one element per range
        and one per gap between ranges, and the ranges' elements are taken."""
        some = np.flatnonzero(sizes > 0)
        if not len(some):
            return pa.array([b""] * len(starts), pa.binary())
        first, stop = starts[some], starts[some] + sizes[some]
        if not (first[1:] >= stop[:-1]).all():  # a read takes its messages' values in the buffer's order
            raise WireFallback("values out of the buffer's order")
        bounds = np.empty(2 * len(some) + 1, np.int32)
        bounds[0:-1:2], bounds[1::2] = first, stop
        bounds[-1] = stop[-1]
        cut = pa.Array.from_buffers(pa.binary(), 2 * len(some), [None, pa.py_buffer(bounds), self.buffer])
        index = np.full(len(starts), 2 * len(some) - 1, np.int64)  # an empty one: the last element (empty)
        index[some] = np.arange(0, 2 * len(some), 2)
        return cut.take(pa.array(index))  # a new array: its buffers start at its first value

    def chunks(self, starts: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Arrow offsets (``int64``, one more than chunks) and the bytes of each ``sizes[i]``-byte
        chunk at ``starts[i]``, one after another."""
        array = self.gathered(starts, sizes)
        offsets = np.frombuffer(array.buffers()[1], np.int32)[:len(array) + 1]
        content = array.buffers()[2]
        chunk = np.frombuffer(content, np.uint8) if content is not None else np.zeros(0, np.uint8)
        return offsets.astype(np.int64) - offsets[0], chunk[offsets[0]:offsets[-1]]

    def binary(self, starts: np.ndarray, sizes: np.ndarray, kind: pa.DataType, present: np.ndarray | None) -> pa.Array:
        """The chunks at ``starts`` of ``sizes`` bytes as a ``kind`` (string or binary) array,
        NULL where ``present`` is False.

        Raises:
            WireFallback: a string that is not UTF-8 (protobuf's runtime refuses it in proto3).
        """
        array = self.gathered(starts, sizes)
        array = pa.Array.from_buffers(kind, len(starts), [_validity(present), *array.buffers()[1:]])
        if pa.types.is_string(kind):
            try:
                array.validate(full=True)
            except pa.ArrowInvalid as exc:
                raise WireFallback("a string that is not UTF-8") from exc
        return array


def _validity(present: np.ndarray | None) -> pa.Buffer | None:
    """An Arrow validity bitmap of ``present`` (None: every value is there)."""
    if present is None:
        return None
    return pa.py_buffer(np.packbits(present, bitorder="little"))


#: an index of every message of a read (a basic slice: views, not copies)
_ALL = slice(None)


class _Read:
    """One read of a message type over a set of messages: each one's position (``pos``), end
    (``end``) and its next field's tag (``head``, -1 at its end; ``pos`` is then after the tag).
    The ``rows`` the methods take are increasing indexes of messages."""

    def __init__(self, cursor: _Cursor, starts: np.ndarray, ends: np.ndarray) -> None:
        self.cursor, self.pos, self.end = cursor, starts.copy(), ends
        self.m = len(starts)
        self.head = np.full(self.m, -1, np.int64)
        self.left = self.m  # messages not at their end
        self.oneofs: dict[int, np.ndarray] = {}  # oneof index -> the member set in each message (-1: none)

    def index(self, rows: np.ndarray) -> np.ndarray | slice:
        """``rows`` as an index of the read's arrays: a slice when they are all the messages."""
        return _ALL if len(rows) == self.m else rows

    def peek(self, rows: np.ndarray) -> None:
        """Decode the next tag of each of ``rows`` (each was not at its end) and move past it."""
        at_rows = self.index(rows)
        at, end = self.pos[at_rows], self.end[at_rows]
        live = at < end
        done = len(rows) - int(np.count_nonzero(live))
        byte = self.cursor.data[at]
        tag = byte.astype(np.int64)
        after = at + live
        if done:
            self.left -= done
            tag[~live] = -1
        multi = np.flatnonzero(byte >= 0x80)
        if len(multi):
            if done:
                multi = multi[live[multi]]
            value, length = self.cursor.varint(at[multi])
            after[multi] = at[multi] + length
            if (length > 5).any() or (value >= 2**32).any() or (after[multi] > end[multi]).any():
                raise WireFallback("a tag beyond 32 bits or past its message's end")
            tag[multi] = value.astype(np.int64)
        self.head[at_rows] = tag  # a tag no field of the message type has is checked by _Message._skip_unknown
        self.pos[at_rows] = after

    def scalar(self, rows: np.ndarray, wire: int) -> np.ndarray:
        """The ``VARINT``, ``I32`` or ``I64`` value (``wire``) at each of ``rows``, as ``uint64``;
        their positions move past it."""
        at_rows = self.index(rows)
        at = self.pos[at_rows]
        if wire == _VARINT:
            value, length = self.cursor.varint(at)
            after = at + length
        else:
            width = 8 if wire == _I64 else 4
            value, after = self.cursor.fixed(at, width), at + width
        if (after > self.end[at_rows]).any():
            raise WireFallback("a value past its message's end")
        self.pos[at_rows] = after
        return value

    def length(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(start, size) of the ``LEN`` payload at each of ``rows``; their positions move past it."""
        at_rows = self.index(rows)
        at = self.pos[at_rows]
        size, length = self.cursor.varint(at)
        start = at + length
        room = self.end[at_rows] - start
        if (room < 0).any() or (size > room.astype(np.uint64)).any():
            raise WireFallback("a length past its message's end")
        sizes = size.astype(np.int64)
        self.pos[at_rows] = start + sizes
        return start, sizes

    def packed(self, rows: np.ndarray, wire: int) -> tuple[np.ndarray, np.ndarray]:
        """(values per row, the values as ``uint64`` one row after another) of the packed
        repeated field (``LEN`` of ``wire`` values) at each of ``rows``."""
        start, size = self.length(rows)
        offsets, chunk = self.cursor.chunks(start, size)
        if wire != _VARINT:
            width = 8 if wire == _I64 else 4
            if (size % width).any():
                raise WireFallback("a packed field whose last fixed value runs past it")
            values = np.ascontiguousarray(chunk).view("<u4" if width == 4 else "<u8").astype(np.uint64)
            return size // width, values
        final = chunk < 0x80  # the last byte of each varint
        if not final[offsets[1:][size > 0] - 1].all():
            raise WireFallback("a packed field whose last varint runs past it")
        last = np.flatnonzero(final)
        first = np.concatenate([np.zeros(1, np.int64), last[:-1] + 1]) if len(last) else last
        lengths = last - first + 1
        if (lengths > 10).any() or (chunk[last[lengths == 10]] > 1).any():
            raise WireFallback("a varint of more than 10 bytes or beyond 64 bits")
        shift = (np.arange(len(chunk)) - np.repeat(first, lengths)) * 7
        parts = (chunk & 0x7F).astype(np.uint64) << shift.astype(np.uint64)
        values = np.bitwise_or.reduceat(parts, first) if len(first) else np.zeros(0, np.uint64)
        counted = np.zeros(len(chunk) + 1, np.int64)
        np.cumsum(final, out=counted[1:])
        return counted[offsets[1:]] - counted[offsets[:-1]], values

    def skip(self, rows: np.ndarray) -> None:
        """Move each of ``rows`` past the value of its next field (one its message type does not
        know), by its wire type."""
        wire = self.head[rows] & 7
        for kind in (_VARINT, _I64, _I32):
            chosen = rows[wire == kind]
            if len(chosen):
                self.scalar(chosen, kind)
        chosen = rows[wire == _LEN]
        if len(chosen):
            self.length(chosen)

    def oneof(self, index: int, member: int, rows: np.ndarray) -> None:
        """Note that ``rows`` set ``member`` (a field index) of oneof ``index``.

        Raises:
            WireFallback: a message of ``rows`` set another member of it before.
        """
        members = self.oneofs.setdefault(index, np.full(len(self.pos), -1, np.int64))
        earlier = members[rows]
        if ((earlier >= 0) & (earlier != member)).any():
            raise WireFallback("two members of one oneof")
        members[rows] = member


class _Sink:
    """The occurrences of one field in a read: for a non-repeated field the last one of each
    message (``values``, ``seen``), for a repeated one all, in order (``owners`` and ``chunks``)."""

    def __init__(self, field: _Field, m: int, cursor: _Cursor) -> None:
        self.repeated, self.merges, self.cursor = field.repeated, field.message is not None, cursor
        #: a string the last one overwrites is still checked (the runtime refuses one not UTF-8)
        self.text = not field.repeated and field.kind == FieldDescriptor.TYPE_STRING
        self.owners: list[np.ndarray] = []
        self.chunks: list[list[np.ndarray]] = []
        self.seen = np.zeros(0 if field.repeated else m, bool)
        self.values: list[np.ndarray] = [] if field.repeated else [np.zeros(m, dtype) for dtype in field.parts]

    def add(self, owners: np.ndarray, parts: list[np.ndarray]) -> None:
        """Note one occurrence at each of ``owners`` (increasing), its ``parts``.

        Raises:
            WireFallback: a non-repeated message field seen twice (protobuf's runtime merges
                them), or a string it overwrites that is not UTF-8.
        """
        if self.repeated:
            self.owners.append(owners)
            self.chunks.append(parts)
            return
        every = len(owners) == len(self.seen)
        again = self.seen if every else self.seen[owners]
        if again.any():
            if self.merges:
                raise WireFallback("a non-repeated message field seen twice (protobuf's runtime merges them)")
            if self.text:
                earlier = np.flatnonzero(self.seen) if every else owners[again]
                self.cursor.binary(self.values[0][earlier], self.values[1][earlier], pa.string(), None)
        if every:  # every message: whole arrays
            self.values = parts
            self.seen[:] = True
            return
        for values, part in zip(self.values, parts, strict=True):
            values[owners] = part  # the last one wins
        self.seen[owners] = True

    def flat(self, dtypes: tuple[type, ...]) -> tuple[np.ndarray, list[np.ndarray]]:
        """(owner of each occurrence, each part of the occurrences), by owner, in order."""
        if not self.owners:
            return np.zeros(0, np.int64), [np.zeros(0, dtype) for dtype in dtypes]
        owners = np.concatenate(self.owners)
        parts = [np.concatenate([c[i] for c in self.chunks]) for i in range(len(dtypes))]
        if len(self.owners) > 1:
            order = np.argsort(owners, kind="stable")  # a message's own occurrences stay in their order
            owners, parts = owners[order], [p[order] for p in parts]
        return owners, parts


class _Field:
    """How one field of a message type is read (its tags, what an occurrence yields) and built
    into its Arrow array."""

    def __init__(self, field: Any, index: int, arrow_type: pa.DataType, in_map_entry: bool) -> None:
        from chandy.formats.protobuf import TIMESTAMP, is_repeated

        kind = field.type
        if kind not in _WIRE:
            raise WireFallback(f"field {field.full_name}: a group")
        self.field, self.index, self.arrow_type, self.kind, self.wire = field, index, arrow_type, kind, _WIRE[kind]
        self.number = field.number
        self.repeated = is_repeated(field)
        self.presence = bool(field.has_presence) and not self.repeated and not in_map_entry  # an entry's are defaults
        self.message = field.message_type if kind == FieldDescriptor.TYPE_MESSAGE else None
        self.map = self.message is not None and self.message.GetOptions().map_entry
        self.timestamp = self.message is not None and self.message.full_name == TIMESTAMP
        self.element_type = arrow_type.value_type if self.repeated and not self.map else arrow_type
        self.packable = self.wire != _LEN and self.repeated
        oneof = field.containing_oneof
        self.oneof = None if oneof is None else oneof.index
        if not self.presence and not self.repeated and self.message is None and field.default_value not in (0, "", b""):
            raise WireFallback(f"field {field.full_name}: a default of {field.default_value!r} without presence")
        #: what an occurrence yields: a uint64 value, or a LEN payload's start and size
        self.parts: tuple[type, ...] = (np.uint64,) if self.wire != _LEN else (np.int64, np.int64)
        self.names: dict[int, str] = {}
        self.closed = False
        self.known = np.zeros(0, np.int64)
        if kind == FieldDescriptor.TYPE_ENUM:
            self.names = {number: value.name for number, value in field.enum_type.values_by_number.items()}
            self.closed = getattr(field.enum_type, "is_closed", True) is not False
            self.known = np.array(sorted(self.names), np.int64)
        self._runtime: tuple[Any, Callable[[Any], Any]] | None = None

    def tags(self) -> list[tuple[int, bool]]:
        """(tag, whether packed) of each way the field is written."""
        plain = (self.number << 3) | self.wire
        return [((self.number << 3) | _LEN, True), (plain, False)] if self.packable else [(plain, False)]

    def occurrences(self, read: _Read, rows: np.ndarray, packed: bool) -> tuple[np.ndarray, list[np.ndarray]]:
        """(owner of each value, its parts) of one occurrence of the field at each of ``rows``
        (positioned after the tag)."""
        if packed:
            counts, values = read.packed(rows, self.wire)
            return np.repeat(rows, counts), [values]
        if self.wire != _LEN:
            return rows, [read.scalar(rows, self.wire)]
        start, size = read.length(rows)
        return rows, [start, size]

    def column(self, cursor: _Cursor, sink: _Sink, m: int) -> pa.Array:
        """The field's Arrow array over the ``m`` messages of a read, from its ``sink``."""
        if not self.repeated:
            present = sink.seen if self.presence and not sink.seen.all() else None
            return self.values(cursor, sink.values, present)
        owners, parts = sink.flat(self.parts)
        counts = np.bincount(owners, minlength=m)
        offsets = np.zeros(m + 1, np.int32)
        np.cumsum(counts, out=offsets[1:])
        if self.map:
            return self._map(cursor, parts, counts, offsets)
        return pa.ListArray.from_arrays(pa.array(offsets), self.values(cursor, parts, None), type=self.arrow_type)

    def values(self, cursor: _Cursor, parts: list[np.ndarray], present: np.ndarray | None) -> pa.Array:
        """The Arrow array (of the field's element type) of values with these ``parts``, NULL
        where ``present`` is False (None: all there)."""
        if self.message is not None:
            starts, sizes = parts[-2], parts[-1]
            children = _plan(self.message).read(cursor, starts, starts + sizes)
            if self.timestamp:
                return _timestamps(self.message, children, present, self.element_type)
            return pa.StructArray.from_arrays(children, fields=list(self.element_type),
                                              mask=None if present is None else pa.array(~present))
        if self.wire == _LEN:
            return cursor.binary(parts[0], parts[1], self.element_type, present)
        return self._number(parts[0], present)

    def _number(self, raw: np.ndarray, present: np.ndarray | None) -> pa.Array:
        """Scalars of the field's type from their raw ``uint64`` (a varint's value, or the fixed bytes)."""
        F = FieldDescriptor
        kind, mask = self.kind, None if present is None else ~present
        if kind in (F.TYPE_INT32, F.TYPE_ENUM):
            wide = raw.view(np.int64)
            if ((wide < -(2**31)) | (wide >= 2**31)).any():
                raise WireFallback("an int32 or enum varint beyond 32 bits (protobuf's runtime truncates it)")
            if kind == F.TYPE_ENUM:
                return self._enum(wide, present)
            return pa.array(wide.astype(np.int32), pa.int32(), mask=mask)
        if kind in (F.TYPE_SINT32, F.TYPE_UINT32) and (raw >= 2**32).any():
            raise WireFallback("a uint32 or sint32 varint beyond 32 bits (protobuf's runtime truncates it)")
        if kind == F.TYPE_SINT32:
            narrow = raw.astype(np.uint32)
            return pa.array((narrow >> 1).astype(np.int32) ^ -(narrow & 1).astype(np.int32), pa.int32(), mask=mask)
        if kind == F.TYPE_SFIXED32:
            return pa.array(raw.astype(np.uint32).view(np.int32), pa.int32(), mask=mask)
        if kind in (F.TYPE_UINT32, F.TYPE_FIXED32):
            return pa.array(raw.astype(np.int64), pa.int64(), mask=mask)
        if kind in (F.TYPE_INT64, F.TYPE_SFIXED64):
            return pa.array(raw.view(np.int64), pa.int64(), mask=mask)
        if kind == F.TYPE_SINT64:
            return pa.array((raw >> np.uint64(1)).view(np.int64) ^ -(raw & np.uint64(1)).view(np.int64), pa.int64(),
                            mask=mask)
        if kind in (F.TYPE_UINT64, F.TYPE_FIXED64):
            wide = np.zeros((len(raw), 2), np.uint64)  # decimal128: 16-byte little-endian two's complement
            wide[:, 0] = raw
            return pa.Array.from_buffers(pa.decimal128(20, 0), len(raw), [_validity(present), pa.py_buffer(wide)])
        if kind == F.TYPE_FLOAT:
            single = raw.astype(np.uint32).view(np.float32)
            if np.isnan(single).any():  # as the runtime's Python float and pyarrow's conversion back leave a NaN
                with np.errstate(invalid="ignore"):  # a signaling NaN comes out quiet, as there
                    single = single.astype(np.float64).astype(np.float32)
            return pa.array(single, pa.float32(), mask=mask)
        if kind == F.TYPE_DOUBLE:
            return pa.array(raw.view(np.float64), pa.float64(), mask=mask)
        return pa.array(raw != 0, pa.bool_(), mask=mask)  # a bool: any varint but 0 is true, as the runtime reads it

    def _enum(self, numbers: np.ndarray, present: np.ndarray | None) -> pa.Array:
        """Enum values by name (an unknown number as its digits, as record by record converts them)."""
        if self.closed:
            known = np.isin(numbers, self.known)
            if present is not None:
                known |= ~present
            if not known.all():
                raise WireFallback("a closed enum's unknown number (protobuf's runtime keeps it as an unknown field)")
        if not len(numbers):
            return pa.array([], pa.string())
        low, high = int(numbers.min()), int(numbers.max())
        if high - low < _ENUM_TABLE:
            found, index = list(range(low, high + 1)), numbers - low
        else:
            unique, index = np.unique(numbers, return_inverse=True)
            found = [int(u) for u in unique]
        symbols = pa.array([self.names.get(number, str(number)) for number in found], pa.string())
        return symbols.take(pa.array(index, mask=None if present is None else ~present))

    def _map(self, cursor: _Cursor, parts: list[np.ndarray], counts: np.ndarray, offsets: np.ndarray) -> pa.Array:
        """The map column: entries read here for maps of one entry at most; a map of two or more
        entries read by protobuf's runtime from its entries' bytes (its hash table's order is the
        column's, record by record)."""
        starts, sizes = parts
        entry: Any = self.message
        by_name = dict(zip((f.name for f in entry.fields), _plan(entry).read(cursor, starts, starts + sizes),
                           strict=True))
        keys, items = by_name["key"], by_name["value"]
        several = np.flatnonzero(counts >= 2)
        if not len(several):
            return pa.MapArray.from_arrays(pa.array(offsets), keys, items, type=self.arrow_type)
        cls, read_field = self._runtime_reader()
        tag = _varint_bytes((self.number << 3) | _LEN)
        from google.protobuf.message import DecodeError

        maps = []
        for owner in several:
            first, last = offsets[owner], offsets[owner + 1]
            raw = b"".join(tag + _varint_bytes(int(sizes[e])) + cursor.data[starts[e]:starts[e] + sizes[e]].tobytes()
                           for e in range(first, last))  # the entries as written (a tag in its shortest form)
            try:
                maps.append(read_field(cls.FromString(raw)))
            except DecodeError as exc:
                raise WireFallback(f"a map protobuf's runtime does not read: {exc}") from exc
        try:
            by_runtime = pa.array(maps, self.arrow_type)
        except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
            raise WireFallback("a map value that does not fit its column") from exc
        single = counts <= 1
        kept = pa.array(np.repeat(single, counts))
        single_offsets = np.zeros(int(single.sum()) + 1, np.int32)
        np.cumsum(counts[single], out=single_offsets[1:])
        by_here = pa.MapArray.from_arrays(pa.array(single_offsets), keys.filter(kept), items.filter(kept),
                                          type=self.arrow_type)
        position = np.empty(len(counts), np.int64)
        position[single] = np.arange(len(by_here))
        position[several] = len(by_here) + np.arange(len(several))
        return pa.concat_arrays([by_here, by_runtime]).take(pa.array(position))

    def _runtime_reader(self) -> tuple[Any, Callable[[Any], Any]]:
        """(the message class holding this map field, its column value's reader), built once."""
        if self._runtime is None:
            from google.protobuf import message_factory

            from chandy.formats.protobuf import field_reader

            self._runtime = (message_factory.GetMessageClass(self.field.containing_type), field_reader(self.field))
        return self._runtime


def _varint_bytes(value: int) -> bytes:
    """``value`` (0 or more) as a base-128 varint."""
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _timestamps(message: Any, children: list[pa.Array], present: np.ndarray | None, kind: pa.DataType) -> pa.Array:
    """``google.protobuf.Timestamp`` values (their ``seconds`` and ``nanos`` fields) as ``kind``
    (UTC microseconds): what ``datetime.fromtimestamp(seconds, UTC) + timedelta(microseconds=nanos
    // 1000)`` gives record by record.

    Raises:
        WireFallback: a Timestamp beyond ``datetime``'s range (record by record decides).
    """
    names = [f.name for f in message.fields]
    seconds = children[names.index("seconds")].to_numpy()
    nanos = children[names.index("nanos")].to_numpy().astype(np.int64)
    beyond = (seconds < _MIN_S) | (seconds > _MAX_S)
    micros = np.where(beyond, 0, seconds) * 1_000_000 + nanos // 1000
    beyond |= (micros < _MIN_US) | (micros > _MAX_US)
    if present is not None:
        beyond &= present
    if beyond.any():
        raise WireFallback("a Timestamp beyond datetime's range")
    return pa.array(micros, kind, mask=None if present is None else ~present)


class _Message:
    """A message type's compiled plan: its fields in declaration order and the tags to look for,
    in field-number order."""

    def __init__(self, descriptor: Any) -> None:
        from chandy.formats.protobuf import ProtobufSchemaError, arrow_columns

        if descriptor.GetOptions().message_set_wire_format or not descriptor.fields:
            raise WireFallback(f"message {descriptor.full_name}: a message set or no fields")
        try:
            types = [f.type for f in arrow_columns(descriptor)[0]]
        except ProtobufSchemaError as exc:
            raise WireFallback(str(exc)) from exc
        self.map_entry = descriptor.GetOptions().map_entry
        self.fields = [_Field(f, i, t, self.map_entry) for i, (f, t) in enumerate(zip(descriptor.fields, types,
                                                                                     strict=True))]
        self.steps = sorted(((tag, f.index, packed) for f in self.fields for tag, packed in f.tags()),
                            key=lambda step: (step[0] >> 3, not step[2]))
        self.tags = np.array([tag for tag, _, _ in self.steps], np.int64)
        self.numbers = np.array(sorted({f.number for f in self.fields}), np.int64)
        self.extensions = [(start, end) for start, end in descriptor.extension_ranges]

    def read(self, cursor: _Cursor, starts: np.ndarray, ends: np.ndarray) -> list[pa.Array]:
        """The fields' arrays over the messages at ``starts`` to ``ends`` (see :func:`read_messages`)."""
        m = len(starts)
        read = _Read(cursor, starts, ends)
        sinks = [_Sink(f, m, cursor) for f in self.fields]
        read.peek(np.arange(m))
        rounds = 0
        while read.left:
            active = np.flatnonzero(read.head >= 0)
            for tag, index, packed in self.steps:
                if not read.left:
                    break
                field, sink = self.fields[index], sinks[index]
                rows = np.flatnonzero(read.head == tag) if len(active) == m else active[read.head[active] == tag]
                while len(rows):
                    if field.oneof is not None:
                        read.oneof(field.oneof, index, rows)
                    sink.add(*field.occurrences(read, rows, packed))
                    read.peek(rows)
                    rows = rows[read.head[rows] == tag]
            if read.left:
                self._skip_unknown(read)
            rounds += 1
            if rounds > _MAX_ROUNDS:
                raise WireFallback("messages whose fields are in a very unusual order")
        return [f.column(cursor, s, m) for f, s in zip(self.fields, sinks, strict=True)]

    def _skip_unknown(self, read: _Read) -> None:
        """Move past the fields the message type does not know at the head of messages.

        Raises:
            WireFallback: field number 0, a wire type not read here, a known field with another
                wire type, an unknown one in an extension range or in a map entry.
        """
        unknown = np.flatnonzero(read.head >= 0)
        while len(unknown):
            head = read.head[unknown]
            if (head < 8).any() or not _READABLE_WIRE[head & 7].all():
                raise WireFallback("field number 0, a group or an unknown wire type")
            numbers = head >> 3
            known = np.isin(numbers, self.numbers)
            if not np.isin(head[known], self.tags).all():
                raise WireFallback("a known field with another wire type (protobuf's runtime keeps it as unknown)")
            unknown, numbers = unknown[~known], numbers[~known]
            if self.map_entry and len(unknown):
                raise WireFallback("a map entry with an unknown field (protobuf's runtime keeps the entry as unknown)")
            if any(((numbers >= start) & (numbers < end)).any() for start, end in self.extensions):
                raise WireFallback("a field in an extension range")
            read.skip(unknown)
            read.peek(unknown)
            unknown = unknown[read.head[unknown] >= 0]


#: compiled plans per message descriptor, for every read of a process
_PLANS: dict[Any, _Message] = {}


def _plan(descriptor: Any) -> _Message:
    plan = _PLANS.get(descriptor)
    if plan is None:
        plan = _PLANS[descriptor] = _Message(descriptor)
    return plan

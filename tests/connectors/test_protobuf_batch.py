"""Issue 57: Protobuf values read a batch at a time from their wire format
(:mod:`chandy.formats.protobuf_batch`, :mod:`chandy.formats.protobuf_wire`) land exactly what
protobuf's runtime reads record by record (``ValueDecoder.decode(batch, vectorized=False)``),
value for value and type for type, or the batch falls back to record by record: every message
the Protobuf tests use, a message with every kind of field (proto3 and proto2), values re-encoded
as other writers may write them (fields out of order, seen twice, packed and unpacked, unknown
fields), damaged values, and random messages and random wire bytes (hypothesis). The writers'
schemas live in confluent-kafka's in-process ``mock://`` Schema Registry."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import math
import struct
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2, wrappers_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chandy.formats.decoder import ValueDecoder
from chandy.formats.framing import split_protobuf
from chandy.formats.protobuf import arrow_columns, is_repeated, message_descriptor
from chandy.formats.protobuf_batch import decode_protobuf_batch
from chandy.formats.records import to_record_batch
from chandy.formats.registry import registry_client
from tests.fixtures.messages import FakeMessage as Message
from tests.fixtures.protobuf_messages import message_class, order, order_class

F = descriptor_pb2.FieldDescriptorProto
REGISTRY = {"url": "mock://chandy-protobuf-wire"}
KEEP = ("offset",)

# -- writers -------------------------------------------------------------------------------------


def _pool_class(proto: Any, name: str) -> Any:
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    pool.AddSerializedFile(proto.SerializeToString())
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


def _map_entry(message: Any, name: str, key: int, value: int, value_type: str = "") -> None:
    entry = message.nested_type.add(name=name, options=descriptor_pb2.MessageOptions(map_entry=True))
    entry.field.add(name="key", number=1, type=key, label=F.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=value, label=F.LABEL_OPTIONAL, **_named(value_type))


def _named(type_name: str) -> dict[str, str]:
    """``type_name`` as a field's keyword (none for a scalar: an empty one is a set one)."""
    return {"type_name": type_name} if type_name else {}


#: (name, number, type, label, type name, proto3 optional) of every field of ``chandy.wire.Kitchen``
KITCHEN_FIELDS = [
    ("i32", 1, F.TYPE_INT32), ("i64", 2, F.TYPE_INT64), ("u32", 3, F.TYPE_UINT32), ("u64", 4, F.TYPE_UINT64),
    ("s32", 5, F.TYPE_SINT32), ("s64", 6, F.TYPE_SINT64), ("f32", 7, F.TYPE_FIXED32), ("f64", 8, F.TYPE_FIXED64),
    ("sf32", 9, F.TYPE_SFIXED32), ("sf64", 10, F.TYPE_SFIXED64), ("fl", 11, F.TYPE_FLOAT), ("db", 12, F.TYPE_DOUBLE),
    ("bo", 13, F.TYPE_BOOL), ("st", 14, F.TYPE_STRING), ("by", 15, F.TYPE_BYTES), ("mood", 16, F.TYPE_ENUM),
]
OPTIONAL_FIELDS = [("oi32", 17, F.TYPE_INT32), ("ost", 18, F.TYPE_STRING), ("omood", 19, F.TYPE_ENUM),
                   ("odb", 20, F.TYPE_DOUBLE)]
REPEATED_FIELDS = [("ri32", 21, F.TYPE_INT32), ("rs64", 22, F.TYPE_SINT64), ("ru64", 23, F.TYPE_UINT64),
                   ("rf32", 24, F.TYPE_FIXED32), ("rdb", 25, F.TYPE_DOUBLE), ("rbo", 26, F.TYPE_BOOL),
                   ("rst", 27, F.TYPE_STRING), ("rby", 28, F.TYPE_BYTES), ("rmood", 29, F.TYPE_ENUM),
                   ("rfl", 30, F.TYPE_FLOAT), ("rsf64", 44, F.TYPE_SFIXED64), ("ru32", 45, F.TYPE_UINT32)]


def kitchen_class() -> Any:
    """``chandy.wire.Kitchen`` (proto3): every scalar type, singular, ``optional`` and repeated;
    an open enum; a nested message singular and repeated; Timestamps singular, repeated and as map
    values; maps of strings, ints, messages and enums; a ``oneof``; an ``Int64Value`` wrapper;
    fields numbered 2000 and 300000 (tags of 2 and 3 bytes)."""
    proto = descriptor_pb2.FileDescriptorProto(
        name="chandy/wire/kitchen.proto", package="chandy.wire", syntax="proto3",
        dependency=["google/protobuf/timestamp.proto", "google/protobuf/wrappers.proto"])
    kitchen = proto.message_type.add(name="Kitchen")
    mood = kitchen.enum_type.add(name="Mood")
    for number, name in enumerate(("CALM", "HAPPY", "ANGRY")):
        mood.value.add(name=name, number=number)
    inner = kitchen.nested_type.add(name="Inner")
    inner.field.add(name="a", number=1, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    inner.field.add(name="b", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    inner.field.add(name="c", number=3, type=F.TYPE_INT64, label=F.LABEL_REPEATED)
    inner.field.add(name="mood", number=4, type=F.TYPE_ENUM, label=F.LABEL_OPTIONAL,
                    type_name=".chandy.wire.Kitchen.Mood")
    _map_entry(kitchen, "MsiEntry", F.TYPE_STRING, F.TYPE_INT64)
    _map_entry(kitchen, "MisEntry", F.TYPE_INT32, F.TYPE_STRING)
    _map_entry(kitchen, "MsoEntry", F.TYPE_STRING, F.TYPE_MESSAGE, ".chandy.wire.Kitchen.Inner")
    _map_entry(kitchen, "MieEntry", F.TYPE_INT64, F.TYPE_ENUM, ".chandy.wire.Kitchen.Mood")
    _map_entry(kitchen, "MstEntry", F.TYPE_STRING, F.TYPE_MESSAGE, ".google.protobuf.Timestamp")
    mood_name = ".chandy.wire.Kitchen.Mood"
    for name, number, kind in KITCHEN_FIELDS:
        kitchen.field.add(name=name, number=number, type=kind, label=F.LABEL_OPTIONAL,
                          **_named(mood_name if kind == F.TYPE_ENUM else ""))
    kitchen.oneof_decl.add(name="choice")  # real oneofs before proto3 optional's synthetic ones
    for name, number, kind in OPTIONAL_FIELDS:
        kitchen.field.add(name=name, number=number, type=kind, label=F.LABEL_OPTIONAL, proto3_optional=True,
                          oneof_index=len(kitchen.oneof_decl), **_named(mood_name if kind == F.TYPE_ENUM else ""))
        kitchen.oneof_decl.add(name=f"_{name}")
    for name, number, kind in REPEATED_FIELDS:
        kitchen.field.add(name=name, number=number, type=kind, label=F.LABEL_REPEATED,
                          **_named(mood_name if kind == F.TYPE_ENUM else ""))
    kitchen.field.add(name="inner", number=31, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                      type_name=".chandy.wire.Kitchen.Inner")
    kitchen.field.add(name="rinner", number=32, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                      type_name=".chandy.wire.Kitchen.Inner")
    kitchen.field.add(name="at", number=33, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                      type_name=".google.protobuf.Timestamp")
    kitchen.field.add(name="rat", number=34, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                      type_name=".google.protobuf.Timestamp")
    for name, number in (("msi", 35), ("mis", 36), ("mso", 37), ("mie", 38), ("mst", 39)):
        kitchen.field.add(name=name, number=number, type=F.TYPE_MESSAGE, label=F.LABEL_REPEATED,
                          type_name=f".chandy.wire.Kitchen.{name.capitalize()}Entry")
    choice = 0
    kitchen.field.add(name="c_int", number=40, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL, oneof_index=choice)
    kitchen.field.add(name="c_str", number=41, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, oneof_index=choice)
    kitchen.field.add(name="c_inner", number=42, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, oneof_index=choice,
                      type_name=".chandy.wire.Kitchen.Inner")
    kitchen.field.add(name="wrapped", number=43, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                      type_name=".google.protobuf.Int64Value")
    kitchen.field.add(name="far", number=2000, type=F.TYPE_INT64, label=F.LABEL_OPTIONAL)
    kitchen.field.add(name="farther", number=300000, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
    proto.message_type.add(name="Second").field.add(name="x", number=1, type=F.TYPE_SINT32, label=F.LABEL_OPTIONAL)
    return _pool_class(proto, "chandy.wire.Kitchen")


def legacy_class() -> Any:
    """``chandy.wire.Legacy`` (proto2): a required int64, an optional string with a default, a
    closed enum singular and repeated, int32s repeated unpacked and sint32s packed, a nested
    message with a closed enum of its own; extensions 100 to 199, 100 a ``Part``."""
    proto = descriptor_pb2.FileDescriptorProto(name="chandy/wire/legacy.proto", package="chandy.wire",
                                               syntax="proto2")
    legacy = proto.message_type.add(name="Legacy")
    kind = legacy.enum_type.add(name="Kind")
    kind.value.add(name="FIRST", number=1)
    kind.value.add(name="SECOND", number=2)
    part = legacy.nested_type.add(name="Part")
    part.field.add(name="v", number=1, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
    part.field.add(name="k", number=2, type=F.TYPE_ENUM, label=F.LABEL_OPTIONAL, type_name=".chandy.wire.Legacy.Kind")
    legacy.field.add(name="id", number=1, type=F.TYPE_INT64, label=F.LABEL_REQUIRED)
    legacy.field.add(name="name", number=2, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL, default_value="x")
    legacy.field.add(name="kind", number=3, type=F.TYPE_ENUM, label=F.LABEL_OPTIONAL,
                     type_name=".chandy.wire.Legacy.Kind")
    legacy.field.add(name="nums", number=4, type=F.TYPE_INT32, label=F.LABEL_REPEATED)
    legacy.field.add(name="packed", number=5, type=F.TYPE_SINT32, label=F.LABEL_REPEATED,
                     options=descriptor_pb2.FieldOptions(packed=True))
    legacy.field.add(name="part", number=6, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                     type_name=".chandy.wire.Legacy.Part")
    legacy.field.add(name="kinds", number=7, type=F.TYPE_ENUM, label=F.LABEL_REPEATED,
                     type_name=".chandy.wire.Legacy.Kind")
    legacy.extension_range.add(start=100, end=200)
    proto.extension.add(name="part_ext", number=100, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL,
                        type_name=".chandy.wire.Legacy.Part", extendee=".chandy.wire.Legacy")
    return _pool_class(proto, "chandy.wire.Legacy")


KITCHEN, LEGACY = kitchen_class(), legacy_class()
_SERIALIZERS: dict[Any, Any] = {}
_CONTEXT = SerializationContext("pbwire", MessageField.VALUE)


def framed(message: Any) -> bytes:
    """``message`` as confluent-kafka's ``ProtobufSerializer`` writes it (its schema registered
    in the mock registry under a subject of its own)."""
    descriptor = message.DESCRIPTOR
    subject = f"{descriptor.file.name}:{descriptor.full_name}"
    if subject not in _SERIALIZERS:
        _SERIALIZERS[subject] = ProtobufSerializer(
            type(message), registry_client(REGISTRY), {"auto.register.schemas": True, "use.deprecated.format": False,
                                                       "subject.name.strategy": lambda c, r, n=subject: n})
    return _SERIALIZERS[subject](message, _CONTEXT)


def _sample(cls: Any) -> Any:
    """A ``cls`` message the serializer writes (its required fields set)."""
    message = cls()
    if not message.IsInitialized():
        message.id = 0
    return message


def header(cls: Any) -> bytes:
    """The Confluent header the serializer writes before a ``cls`` message."""
    raw = framed(_sample(cls))
    return raw[:len(raw) - len(split_protobuf(raw)[2])]


def decoder_of(cls: Any, **changes: Any) -> ValueDecoder:
    """The pipeline's decoder of ``cls`` values, its columns the writer schema's (as the registry
    gives it), bad records kept (``errors_tolerance="all"``)."""
    schema_id, indexes, _ = split_protobuf(framed(_sample(cls)))
    columns, names = arrow_columns(message_descriptor(registry_client(REGISTRY), schema_id, indexes))
    decoder = ValueDecoder("protobuf", columns, names, KEEP, schema_registry=tuple(sorted(REGISTRY.items())),
                           unknown_fields="add", as_written=True, columns_schema_id=schema_id, errors_tolerance="all")
    return dataclasses.replace(decoder, **changes)


# -- the comparison --------------------------------------------------------------------------------


def same(a: Any, b: Any) -> bool:
    """Whether two column values are equal and of the same Python types, at any depth (floats
    bit for bit, so NaNs compare)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, datetime.datetime):
        return a == b and a.tzinfo == b.tzinfo
    return bool(a == b)


def _has_floats(kind: pa.DataType) -> bool:
    if pa.types.is_floating(kind):
        return True
    return any(_has_floats(kind.field(i).type) for i in range(kind.num_fields))


def _float_bits(array: pa.Array) -> pa.Array:
    """A float column (or a list of floats) as the unsigned integers of its values' bits."""
    if pa.types.is_list(array.type):
        array = array.flatten()
    if not pa.types.is_floating(array.type):
        return array
    return array.view(pa.uint32() if array.type == pa.float32() else pa.uint64())


def compare(decoder: ValueDecoder, raws: Sequence[bytes | None]) -> list[pa.Array] | None:
    """The batch path's columns of ``raws``, after checking they are the record-by-record path's,
    value for value and type for type; or None when it falls back (then record by record found a
    bad record, raised, or the batch path could not tell)."""
    batch = to_record_batch([Message(i, r) for i, r in enumerate(raws)])
    fast = decode_protobuf_batch(batch.column("value"), decoder)
    try:
        slow, bad, _ = decoder.decode(batch, vectorized=False)
    except (ValueError, OverflowError, OSError, SchemaRegistryError):  # record by record fails the batch (a
        # Timestamp beyond datetime's range, an unknown schema ID)
        assert fast is None
        return None
    if fast is None:
        return None
    assert bad is None, bad.column("error_message").to_pylist()  # the batch path never lands a bad record
    assert slow.schema.names == [*KEEP, *decoder.columns.names]
    assert len(fast) == len(decoder.columns)
    for field, array in zip(decoder.columns, fast, strict=True):
        expected = slow.column(field.name)
        assert array.type == expected.type == field.type, field.name
        assert len(array) == len(expected) == len(raws)
        array.validate(full=True)
        got, want = array.to_pylist(), expected.to_pylist()
        assert same(got, want), (field.name, [(i, g, w) for i, (g, w) in enumerate(zip(got, want, strict=True))
                                             if not same(g, w)][:3])
        if not _has_floats(field.type):  # Arrow's equality has NaN unequal to itself
            assert array.equals(expected), field.name
        else:
            assert _float_bits(array).equals(_float_bits(expected)), field.name  # NaNs' bits too
    fast_batch, _, _ = decoder.decode(batch)  # and through the decoder
    assert fast_batch.schema == slow.schema
    return fast


def must_read(decoder: ValueDecoder, raws: Sequence[bytes | None]) -> list[pa.Array]:
    """:func:`compare`, the batch path having read the batch."""
    fast = compare(decoder, raws)
    assert fast is not None, "the batch path fell back on a batch it reads"
    return fast


# -- the wire format, to write values as other writers may ----------------------------------------


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(number: int, wire: int) -> bytes:
    return varint(number << 3 | wire)


def length_delimited(number: int, payload: bytes) -> bytes:
    return tag(number, 2) + varint(len(payload)) + payload


def fields_of(body: bytes) -> list[tuple[int, int, bytes]]:
    """(field number, wire type, the field's whole bytes) of each field of a valid message."""
    out, pos = [], 0
    while pos < len(body):
        start = pos
        key, pos = _read_varint(body, pos)
        wire = key & 7
        if wire == 0:
            _, pos = _read_varint(body, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            size, pos = _read_varint(body, pos)
            pos += size
        out.append((key >> 3, wire, body[start:pos]))
    return out


def _read_varint(raw: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = raw[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def unpacked(number: int, payload: bytes, wire: int) -> bytes:
    """A packed field's values (``payload``) written one field each (``wire``: 0, 1 or 5)."""
    out, pos = bytearray(), 0
    while pos < len(payload):
        if wire == 0:
            start = pos
            _, pos = _read_varint(payload, pos)
            out += tag(number, 0) + payload[start:pos]
        else:
            width = 8 if wire == 1 else 4
            out += tag(number, wire) + payload[pos:pos + width]
            pos += width
    return bytes(out)


# -- random messages ---------------------------------------------------------------------------------

_INT32, _INT64 = st.integers(-(2**31), 2**31 - 1), st.integers(-(2**63), 2**63 - 1)
_UINT32, _UINT64 = st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1)
_MOOD = st.one_of(st.integers(0, 2), st.integers(-(2**31), 2**31 - 1))  # open: unknown numbers too
_SCALARS = {F.TYPE_INT32: _INT32, F.TYPE_INT64: _INT64, F.TYPE_UINT32: _UINT32, F.TYPE_UINT64: _UINT64,
            F.TYPE_SINT32: _INT32, F.TYPE_SINT64: _INT64, F.TYPE_FIXED32: _UINT32, F.TYPE_FIXED64: _UINT64,
            F.TYPE_SFIXED32: _INT32, F.TYPE_SFIXED64: _INT64, F.TYPE_FLOAT: st.floats(width=32),
            F.TYPE_DOUBLE: st.floats(), F.TYPE_BOOL: st.booleans(), F.TYPE_STRING: st.text(max_size=12),
            F.TYPE_BYTES: st.binary(max_size=12), F.TYPE_ENUM: _MOOD}
_VARINT_TYPES = (F.TYPE_INT32, F.TYPE_INT64, F.TYPE_UINT32, F.TYPE_UINT64, F.TYPE_SINT32, F.TYPE_SINT64, F.TYPE_BOOL,
                 F.TYPE_ENUM)
_I64_TYPES = (F.TYPE_FIXED64, F.TYPE_SFIXED64, F.TYPE_DOUBLE)
_SECONDS = st.integers(-62_135_596_800, 253_402_300_799)
_NANOS = st.integers(0, 999_999_999)


@st.composite
def inners(draw: Any) -> dict[str, Any]:
    return draw(st.fixed_dictionaries({}, optional={
        "a": _INT32, "b": st.text(max_size=8), "c": st.lists(_INT64, max_size=3), "mood": _MOOD}))


def _fill(inner: Any, values: dict[str, Any]) -> None:
    for key, value in values.items():
        if key == "c":
            inner.c.extend(value)
        else:
            setattr(inner, key, value)


def _set_timestamp(target: Any, seconds_nanos: tuple[int, int]) -> None:
    target.seconds, target.nanos = seconds_nanos


@st.composite
def kitchens(draw: Any) -> Any:
    """A random ``Kitchen``: any subset of its fields set, with any values of their types."""
    message = KITCHEN()
    for name, _, kind in KITCHEN_FIELDS + OPTIONAL_FIELDS:
        if draw(st.booleans()):
            setattr(message, name, draw(_SCALARS[kind]))
    for name, _, kind in REPEATED_FIELDS:
        getattr(message, name).extend(draw(st.lists(_SCALARS[kind], max_size=4)))
    if draw(st.booleans()):
        message.inner.SetInParent()
        _fill(message.inner, draw(inners()))
    for values in draw(st.lists(inners(), max_size=3)):
        _fill(message.rinner.add(), values)
    stamps = st.tuples(_SECONDS, _NANOS)
    if draw(st.booleans()):
        _set_timestamp(message.at, draw(stamps))
    for pair in draw(st.lists(stamps, max_size=3)):
        _set_timestamp(message.rat.add(), pair)
    message.msi.update(draw(st.dictionaries(st.text(max_size=6), _INT64, max_size=5)))
    message.mis.update(draw(st.dictionaries(_INT32, st.text(max_size=6), max_size=5)))
    for key, values in draw(st.dictionaries(st.text(max_size=4), inners(), max_size=3)).items():
        _fill(message.mso[key], values)
    message.mie.update(draw(st.dictionaries(_INT64, _MOOD, max_size=4)))
    for key, pair in draw(st.dictionaries(st.text(max_size=4), stamps, max_size=3)).items():
        _set_timestamp(message.mst[key], pair)
    choice = draw(st.sampled_from(["", "c_int", "c_str", "c_inner"]))
    if choice == "c_int":
        message.c_int = draw(_INT32)
    elif choice == "c_str":
        message.c_str = draw(st.text(max_size=6))
    elif choice == "c_inner":
        message.c_inner.a = draw(_INT32)
    if draw(st.booleans()):
        message.wrapped.value = draw(_INT64)
    if draw(st.booleans()):
        message.far = draw(_INT64)
    if draw(st.booleans()):
        message.farther = draw(st.text(max_size=6))
    return message


#: Kitchen's fields that may be packed, by number: their values' wire type
_PACKABLE = {f.number: 0 if f.type in _VARINT_TYPES else 1 if f.type in _I64_TYPES else 5
             for f in KITCHEN.DESCRIPTOR.fields
             if is_repeated(f) and f.type not in (F.TYPE_STRING, F.TYPE_BYTES, F.TYPE_MESSAGE)}
#: Kitchen's non-repeated fields of varint, 8- and 4-byte values
_SINGULAR = {f.number for f in KITCHEN.DESCRIPTOR.fields
             if not is_repeated(f) and f.type not in (F.TYPE_STRING, F.TYPE_BYTES, F.TYPE_MESSAGE)}


@st.composite
def rewritten(draw: Any, body: bytes) -> bytes:
    """``body`` (a valid message) as other writers may write it: packed fields unpacked,
    non-repeated scalars written twice, unknown fields added, fields shuffled."""
    out: list[bytes] = []
    for number, wire, raw in fields_of(body):
        if number in _PACKABLE and wire == 2 and draw(st.booleans()):
            _, start = _read_varint(raw, len(tag(number, 2)))
            raw = unpacked(number, raw[start:], _PACKABLE[number])
        if number in _SINGULAR and draw(st.booleans()):  # an earlier value, overwritten by the last one
            out.append(tag(number, wire) + (bytes(8) if wire == 1 else bytes(4) if wire == 5 else b"\x00"))
        out.append(raw)
        if draw(st.booleans()):
            out.append(draw(st.sampled_from([tag(99, 0) + varint(7), tag(1000, 1) + bytes(8), tag(77, 5) + bytes(4),
                                             length_delimited(5000, b"unknown"), length_delimited(50, b"")])))
    if draw(st.booleans()):
        out = [out[i] for i in draw(st.permutations(range(len(out))))]
    return b"".join(out)


# -- tests -------------------------------------------------------------------------------------------


def test_the_messages_the_protobuf_tests_use_land_as_record_by_record_lands_them() -> None:
    """Order V1 and V2 (every kind of field the column mapping covers), a registry-compiled
    Reading, the routed tests' Customer, the benchmark's PageView, and both writer versions
    interleaved in one batch (their rows back in order)."""
    from benchmarks.decoded_records import protobuf_class

    v1, v2 = order_class(1), order_class(2)
    must_read(decoder_of(v1), [framed(order(v1, i)) for i in range(30)])
    must_read(decoder_of(v2), [framed(order(v2, i)) for i in range(30)])
    mixed = [framed(order(v1 if i % 3 else v2, i)) for i in range(30)]
    fast = must_read(decoder_of(v2), mixed)
    assert fast[-1].to_pylist()[:4] == [order(v2, 0).price, None, None, order(v2, 3).price]
    customer = message_class("chandy.test", "Customer", [("id", F.TYPE_STRING), ("email", F.TYPE_STRING)])
    must_read(decoder_of(customer), [framed(customer(id=f"c-{i}", email="a@x" if i % 2 else "")) for i in range(5)])
    view = protobuf_class()
    values = [view(id=i, user_id=7 * i, session=f"s{i}", page="/p", geo=view.Geo(lat=1.5, lon=-2.25, city="Oslo"))
              for i in range(20)]
    for i, value in enumerate(values):
        value.ts.FromMicroseconds(1_790_000_000_000_000 + i)
    must_read(decoder_of(view), [framed(v) for v in values])
    decoder = decoder_of(v1)  # a slice of a batch (its values an Arrow array with an offset)
    part = to_record_batch([Message(i, framed(order(v1, i))) for i in range(12)]).slice(3, 6)
    sliced = decode_protobuf_batch(part.column("value"), decoder)
    slow = decoder.decode(part, vectorized=False)[0]
    assert sliced is not None and [a.to_pylist() for a in sliced] == [slow.column(f.name).to_pylist()
                                                                      for f in decoder.columns]


def test_every_kind_of_field_lands_as_record_by_record_lands_it() -> None:
    """Kitchen: every scalar type at its extremes (zigzag, 10-byte varints, NaN, infinities,
    -0.0), presence, enums with unknown numbers, nested and repeated messages, Timestamps at the
    ends of ``datetime``'s range, maps of one and of many entries, a oneof, a wrapper."""
    first = KITCHEN(i32=-(2**31), i64=-(2**63), u32=2**32 - 1, u64=2**64 - 1, s32=-(2**31), s64=2**63 - 1,
                    f32=2**32 - 1, f64=2**64 - 1, sf32=-1, sf64=-(2**63), fl=float("nan"), db=float("-inf"),
                    bo=True, st="héllo ✓", by=b"\x00\xff", mood=2, oi32=0, ost="", omood=7, odb=-0.0,
                    ri32=[-1, 0, 2**31 - 1], rs64=[-(2**63), 5], ru64=[0, 2**64 - 1], rf32=[1, 2],
                    rdb=[float("nan"), 1e308], rbo=[True, False, True], rst=["", "a"], rby=[b"", b"b"],
                    rmood=[0, 1, 99, -5], rfl=[3.5, float("inf")], rsf64=[-1], ru32=[2**32 - 1],
                    c_str="chosen", far=-1, farther="far")
    first.inner.a, first.inner.b, first.inner.mood = 5, "in", 1
    first.inner.c.extend([1, -1])
    first.rinner.add(a=1).c.extend([3])
    first.rinner.add()
    first.at.seconds, first.at.nanos = 253_402_300_799, 999_999_999
    first.rat.add(seconds=-62_135_596_800)
    first.rat.add(seconds=1, nanos=1_000)
    first.msi.update({f"k{i}": i for i in range(20)})
    first.mis[7] = "seven"
    first.mso["x"].a = 3
    first.mso["y"].b = "why"
    first.mie.update({1: 2, -1: 77})
    first.mst["epoch"].seconds = 0
    first.mst["later"].seconds = 10
    first.wrapped.value = 0
    second = KITCHEN(c_inner=KITCHEN.Inner(a=1), mood=77)
    second.wrapped.SetInParent()
    second.mso["only"].SetInParent()  # a map value message left unset: its defaults
    second.mst["only"].SetInParent()
    third = KITCHEN(c_int=0, i32=1)
    third.msi["one"] = 1
    must_read(decoder_of(KITCHEN), [framed(m) for m in (first, second, third, KITCHEN())])


def test_values_written_in_other_orders_and_forms_land_as_the_runtime_reads_them() -> None:
    """The same messages re-encoded as the encoding spec lets writers write them: packed
    repeated fields unpacked, split in two or mixed with unpacked elements; a non-repeated field
    written twice (the last one wins); fields out of order; unknown fields of every wire type
    (among them field numbers in the 2- and 5-byte tag ranges); a varint in a longer form than
    needed; an empty message (just the header)."""
    head = header(KITCHEN)
    body = KITCHEN(i32=5, st="a", ri32=[1, 2, 300], rdb=[1.5, -2.0], rfl=[0.5], mood=1).SerializeToString()
    fields = fields_of(body)
    by_number = {number: raw for number, _, raw in fields}
    packed_ints = by_number[21][len(tag(21, 2)) + 1:]
    variants = [
        body,
        b"".join(raw for _, _, raw in reversed(fields)),  # fields in reverse order
        tag(1, 0) + varint(9) + body,  # i32 twice: 5 wins
        body + tag(1, 0) + varint(9),  # i32 twice: 9 wins
        body + tag(14, 2) + b"\x01z",  # st twice: "z" wins
        body + unpacked(21, packed_ints, 0),  # ri32 packed, then unpacked: six elements
        unpacked(21, packed_ints, 0) + body,
        length_delimited(21, varint(1)) + length_delimited(21, varint(2)) + tag(21, 0) + varint(3),
        length_delimited(21, b""),  # an empty packed field
        tag(99, 0) + varint(2**64 - 1) + tag(98, 1) + bytes(8) + tag(97, 5) + bytes(4) + length_delimited(96, b"xyz")
        + body + tag(536_870_911, 0) + varint(1) + tag(4000, 2) + b"\x00",
        tag(1, 0) + b"\x85\x80\x80\x00",  # i32 = 5 in four bytes
        tag(2, 0) + b"\xff" * 9 + b"\x01",  # i64 = -1 in ten bytes
        b"\x88\x00" + varint(5),  # the tag of i32 in two bytes
        b"",
        tag(31, 2) + b"\x00" + tag(33, 2) + b"\x00",  # inner and at present, empty
        tag(16, 0) + varint(5),  # mood: an unknown number of an open enum
        tag(13, 0) + varint(2) + tag(26, 0) + varint(2**64 - 1),  # bools: any varint but 0 is true
        tag(11, 5) + b"\x01\x00\x80\x7f" + tag(12, 1) + b"\x01\x00\x00\x00\x00\x00\xf0\x7f",  # signaling NaNs
        tag(11, 5) + b"\x00\x00\xc0\xff" + length_delimited(30, b"\x05\x00\xa0\x7f"),  # NaNs with payloads
        length_delimited(35, b"") + length_delimited(37, b""),  # map entries without key and value: defaults
        length_delimited(35, tag(2, 0) + varint(3) + length_delimited(1, b"a") + length_delimited(1, b"b")),
        length_delimited(35, length_delimited(1, b"a") + tag(2, 0) + varint(1))
        + length_delimited(35, length_delimited(1, b"a") + tag(2, 0) + varint(2)),  # one key twice: the last
        length_delimited(39, length_delimited(1, b"t") + length_delimited(2, tag(1, 0) + varint(5) + tag(9, 0)
                                                                          + varint(1))),  # unknown in a value
    ]
    fast = must_read(decoder_of(KITCHEN), [head + v for v in variants])
    columns = dict(zip(decoder_of(KITCHEN).columns.names, fast, strict=True))
    assert columns["i32"].to_pylist()[:4] == [5, 5, 5, 9]
    assert columns["st"].to_pylist()[4] == "z"
    assert columns["ri32"].to_pylist()[5:9] == [[1, 2, 300, 1, 2, 300]] * 2 + [[1, 2, 3], []]
    assert columns["i64"].to_pylist()[11] == -1 and columns["mood"].to_pylist()[15] == "5"
    assert columns["bo"].to_pylist()[16] is True and columns["rbo"].to_pylist()[16] == [True]
    assert columns["msi"].to_pylist()[19:22] == [[("", 0)], [("b", 3)], [("a", 2)]]
    assert columns["mso"].to_pylist()[19] == [("", {"a": 0, "b": "", "c": [], "mood": "CALM"})]


@pytest.mark.parametrize(("name", "body"), [
    ("a truncated varint", tag(2, 0) + b"\xff\xff"),
    ("a truncated tag", b"\x88"),
    ("a length past the end", tag(14, 2) + b"\x05ab"),
    ("a nested length past the nested message's end", length_delimited(31, tag(2, 2) + b"\x05ab")),
    ("a fixed64 past the end", tag(12, 1) + bytes(7)),
    ("a varint of 11 bytes", tag(2, 0) + b"\x80" * 10 + b"\x00"),
    ("a 10th varint byte above 1", tag(2, 0) + b"\xff" * 9 + b"\x7f"),
    ("a wrong wire type for a known field (the runtime keeps it as unknown)", tag(1, 1) + bytes(8)),
    ("a string field written as a varint", tag(14, 0) + varint(3)),
    ("a packed varint running past its field", length_delimited(21, b"\x80")),
    ("a packed fixed value running past its field", length_delimited(24, bytes(5))),
    ("field number 0", tag(0, 0) + varint(1)),
    ("a group", tag(99, 3) + tag(99, 4)),
    ("an end group", tag(99, 4)),
    ("wire type 7", tag(99, 7) + varint(1)),
    ("an int32 beyond 32 bits (the runtime truncates it)", tag(1, 0) + varint(2**40 + 5)),
    ("a uint32 beyond 32 bits", tag(3, 0) + varint(2**32 + 1)),
    ("a sint32 beyond 32 bits", tag(5, 0) + varint(2**33)),
    ("an enum beyond 32 bits", tag(16, 0) + varint(2**35)),
    ("a bool of 2", tag(13, 0) + varint(2)),
    ("a string that is not UTF-8", length_delimited(14, b"\xff\xfe")),
    ("a string that is not UTF-8, then one that is (the runtime refuses the first)",
     length_delimited(14, b"\xff") + length_delimited(14, b"ok")),
    ("a map key that is not UTF-8", length_delimited(35, length_delimited(1, b"\xc3"))),
    ("a non-repeated message written twice (merged)", length_delimited(31, tag(1, 0) + varint(1))
     + length_delimited(31, tag(2, 2) + b"\x01b")),
    ("two members of a oneof", tag(40, 0) + varint(1) + length_delimited(41, b"s")),
    ("a Timestamp beyond datetime's range", length_delimited(33, tag(1, 0) + varint(253_402_300_800))),
    ("a Timestamp whose nanos leave datetime's range", length_delimited(33, tag(1, 0) + varint(253_402_300_799)
                                                                         + tag(2, 0) + varint(2**31 - 1))),
    ("a Timestamp before year 1 by its nanos", length_delimited(33, tag(1, 0) + varint(-62_135_596_800)
                                                                + tag(2, 0) + varint(-1))),
    ("a map entry past the end", tag(35, 2) + b"\x09" + length_delimited(1, b"k")),
    ("a map entry with an unknown field (the runtime keeps the entry as unknown)",
     length_delimited(35, tag(99, 0) + varint(1))),
    ("a map entry whose key has another wire type", length_delimited(35, tag(1, 0) + varint(1))),
    ("a map value message written twice in its entry", length_delimited(37, length_delimited(1, b"a")
                                                                        + length_delimited(2, tag(1, 0) + varint(5))
                                                                        + length_delimited(2, tag(2, 2) + b"\x01b"))),
])
def test_a_damaged_value_lands_what_record_by_record_lands_or_the_batch_falls_back(name: str, body: bytes) -> None:
    """Each damaged (or unusual) value, among good ones: the batch path lands what record by
    record lands (the runtime reads it alike) or falls back, never a different value."""
    good = [framed(KITCHEN(i32=i, st=f"s{i}")) for i in range(3)]
    compare(decoder_of(KITCHEN), [*good, header(KITCHEN) + body, *good])


def test_what_the_batch_path_does_not_read_falls_back_to_record_by_record() -> None:
    """A tombstone, an empty or unframed value, an unknown schema ID, a writer field without a
    column, a proto2 closed enum's unknown number, a field in an extension range (the runtime
    reads a known extension, and refuses a damaged one): the whole batch goes record by record;
    the rest of proto2 (required and default values, packed and unpacked) is read."""
    decoder = decoder_of(KITCHEN)
    good = framed(KITCHEN(i32=1))
    for odd in (None, b"", b"\x00\x00", b"\x01" + good[1:], b"\x00\x7f\xff\xff\xff\x00" + good[6:]):
        assert compare(decoder, [good, odd]) is None
    narrow = dataclasses.replace(decoder, columns=pa.schema(list(decoder.columns)[1:]),
                                 source_names=decoder.source_names[1:])
    batch = to_record_batch([Message(0, good)])
    assert decode_protobuf_batch(batch.column("value"), narrow) is None  # i32 is new to these columns
    legacy = decoder_of(LEGACY)
    must_read(legacy, [framed(LEGACY(id=1, kind=2, kinds=[1, 2], nums=[1, -1], packed=[-3], part=LEGACY.Part(k=1))),
                       framed(LEGACY(id=2)), header(LEGACY)])
    unknown_kind = header(LEGACY) + tag(1, 0) + varint(3) + tag(3, 0) + varint(9)
    assert compare(legacy, [framed(LEGACY(id=1)), unknown_kind]) is None
    packed_legacy = header(LEGACY) + tag(1, 0) + varint(3) + length_delimited(4, varint(1) + varint(2)) \
        + unpacked(5, varint(5), 0)
    must_read(legacy, [packed_legacy])
    for extension in (length_delimited(100, tag(1, 0) + varint(5)), length_delimited(100, b"\x08"),
                      length_delimited(150, b"\x08")):  # the runtime reads extension 100: a bad record
        assert compare(legacy, [framed(LEGACY(id=1)), header(LEGACY) + tag(1, 0) + varint(2) + extension]) is None


def test_a_message_after_the_first_of_its_file_and_columns_wider_than_the_writer() -> None:
    """Message indexes other than ``[0]`` (a longer header, read value by value), next to the
    usual ones in one batch; a writer's int32 and float into int64 and double columns (Avro's
    promotions) and its uint64 into a wider decimal; a column the writer lacks is null."""
    second = message_factory.GetMessageClass(KITCHEN.DESCRIPTOR.file.message_types_by_name["Second"])
    raws = [framed(second(x=-i)) for i in range(4)]
    assert split_protobuf(raws[0])[1] == [1]
    must_read(decoder_of(second), raws)
    decoder = decoder_of(KITCHEN)
    widened = {"i32": pa.int64(), "fl": pa.float64(), "u64": pa.decimal128(30, 0)}
    columns = pa.schema([f.with_type(widened.get(f.name, f.type)) for f in decoder.columns]
                        + [pa.field("missing", pa.string())])
    wide = dataclasses.replace(decoder, columns=columns, source_names=(*decoder.source_names, "missing"))
    fast = must_read(wide, [framed(KITCHEN(i32=-7, fl=0.1, u64=2**64 - 1)), framed(KITCHEN())])
    assert fast[0].to_pylist() == [-7, 0] and fast[-1].null_count == 2
    assert fast[list(columns.names).index("u64")].to_pylist() == [decimal.Decimal(2**64 - 1), decimal.Decimal(0)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(kitchens(), min_size=1, max_size=4), st.data())
def test_random_messages_land_as_the_runtime_reads_them(messages: list[Any], data: Any) -> None:
    """Random Kitchens, as protobuf's runtime writes them and as other writers may (see
    :func:`rewritten`), are read by the batch path exactly as record by record reads them."""
    head = header(KITCHEN)
    raws = [head + data.draw(rewritten(m.SerializeToString())) for m in messages]
    must_read(decoder_of(KITCHEN), raws)


_PAYLOADS = st.one_of(st.binary(max_size=12), kitchens().map(lambda m: m.SerializeToString()[:20]),
                      st.sampled_from([b"", b"\x08\x01", b"\x0a\x00", b"\x08\x80\x80\x80\x80\x10", b"\x12\x02ab"]))
_FIXED = {F.TYPE_FIXED32: 4, F.TYPE_SFIXED32: 4, F.TYPE_FLOAT: 4, F.TYPE_FIXED64: 8, F.TYPE_SFIXED64: 8,
          F.TYPE_DOUBLE: 8}
#: varints as writers write them (of 32 or 64 bits), and some they should not (beyond a 32-bit
#: type, longer than needed, of 11 bytes)
_VARINTS_32 = st.one_of(st.integers(0, 3), _INT32, _UINT32).map(varint)
_VARINTS_64 = st.one_of(st.integers(0, 3), _UINT64).map(varint)
_ODD_VARINTS = st.sampled_from([b"\xff" * 9 + b"\x01", b"\x80\x00", b"\x80" * 10 + b"\x00", varint(2**40)])


def _value_bytes(field: Any, depth: int) -> st.SearchStrategy[bytes]:
    """One value of ``field`` (a field descriptor) in its wire form, without the tag: mostly
    valid, sometimes not (an unknown enum number, a string that is not UTF-8)."""
    if field.type in _FIXED:
        return st.binary(min_size=_FIXED[field.type], max_size=_FIXED[field.type])
    if field.type == F.TYPE_STRING:
        return st.one_of(*[st.text(max_size=6).map(str.encode)] * 5, st.just(b"\xc3")).map(lambda b: varint(len(b)) + b)
    if field.type == F.TYPE_BYTES:
        return st.binary(max_size=6).map(lambda b: varint(len(b)) + b)
    if field.type == F.TYPE_MESSAGE:
        return messages_of(field.message_type, depth + 1).map(lambda b: varint(len(b)) + b)
    wide = field.type in (F.TYPE_INT64, F.TYPE_UINT64, F.TYPE_SINT64, F.TYPE_BOOL)
    return st.one_of(*[_VARINTS_64 if wide else _VARINTS_32] * 9, _ODD_VARINTS)


@st.composite
def field_bytes(draw: Any, field: Any, depth: int) -> bytes:
    """One occurrence of ``field`` as a writer may write it: its own wire type (a repeated
    scalar packed or not), now and then another one or a payload of the wrong length."""
    wire = 0 if field.type not in _FIXED else 5 if _FIXED[field.type] == 4 else 1
    if field.type in (F.TYPE_STRING, F.TYPE_BYTES, F.TYPE_MESSAGE):
        wire = 2
    choice = draw(st.integers(0, 99))  # hypothesis draws the ends of a range more often than the rest
    if choice == 50:  # the wrong wire type
        return tag(field.number, draw(st.sampled_from([w for w in (0, 1, 2, 5) if w != wire])))
    if choice == 51:  # a payload of random bytes and length
        return tag(field.number, 2) + varint(draw(st.integers(0, 12))) + draw(st.binary(max_size=12))
    if is_repeated(field) and wire != 2 and draw(st.booleans()):  # packed
        values = b"".join(draw(st.lists(_value_bytes(field, depth), max_size=4)))
        return tag(field.number, 2) + varint(len(values)) + values
    return tag(field.number, wire) + draw(_value_bytes(field, depth))


@st.composite
def messages_of(draw: Any, descriptor: Any, depth: int = 0) -> bytes:
    """A message of type ``descriptor`` as any writer may write it: any of its fields, any
    number of times, in any order, with unknown fields among them."""
    if depth > 2:
        return b""
    fields = draw(st.lists(st.sampled_from(list(descriptor.fields)), max_size=6 if depth == 0 else 3))
    out = [draw(field_bytes(f, depth)) for f in fields]
    if draw(st.integers(0, 9)) == 5:
        out.append(draw(st.sampled_from([tag(99, 0) + varint(1), tag(99, 5) + bytes(4), length_delimited(1999, b"u"),
                                         tag(99, 3) + tag(99, 4), tag(0, 0) + b"\x01"])))
    return b"".join(out)


@st.composite
def wire_fields(draw: Any) -> bytes:
    """A field of random wire bytes: a Kitchen field number (or an unknown one, or 0), any wire
    type, a value of any length (a varint of up to 11 bytes)."""
    number = draw(st.sampled_from([f.number for f in KITCHEN.DESCRIPTOR.fields] + [99, 0]))
    wire = draw(st.sampled_from([0, 0, 1, 2, 2, 2, 5, 3, 4, 6]))
    if wire == 0:
        value = varint(draw(st.integers(0, 2**64 - 1)))
        return tag(number, 0) + (draw(st.sampled_from([value, b"\xff" * 10 + b"\x01", b"\x80"])))
    if wire in (1, 5):
        return tag(number, wire) + draw(st.binary(min_size=0, max_size=9))
    if wire == 2:
        payload = draw(_PAYLOADS)
        size = draw(st.one_of(st.just(len(payload)), st.integers(0, 30)))
        return tag(number, 2) + varint(size) + payload
    return tag(number, wire)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(messages_of(KITCHEN.DESCRIPTOR), min_size=1, max_size=3))
def test_messages_as_any_writer_may_write_them_land_as_record_by_record_lands_them_or_fall_back(
        bodies: list[bytes]) -> None:
    """Kitchens of random fields written any number of times in any order (repeated scalars
    packed or not, the last of a non-repeated field winning, nested messages, maps, Timestamps,
    a oneof), now and then of the wrong wire type or with a damaged payload: the batch path
    lands what record by record lands, or falls back, never a different value."""
    compare(decoder_of(KITCHEN), [header(KITCHEN) + body for body in bodies])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(wire_fields(), max_size=6).map(b"".join), min_size=1, max_size=4),
       st.lists(st.integers(0, 40), max_size=2))
def test_random_wire_bytes_land_as_record_by_record_lands_them_or_fall_back(bodies: list[bytes],
                                                                             cuts: list[int]) -> None:
    """Random fields of random wire types and payloads (valid, truncated, of the wrong type,
    unknown), some values cut short: the batch path lands what record by record lands, or falls
    back, never a different value."""
    head = header(KITCHEN)
    raws = [head + b for b in bodies]
    for cut in cuts:
        raws.append(raws[cut % len(raws)][:len(head) + cut])
    raws.append(framed(KITCHEN(i32=1, msi={"a": 1})))
    compare(decoder_of(KITCHEN), raws)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kitchens(), st.integers(0, 10_000), st.integers(1, 255))
def test_a_random_message_with_a_byte_changed_or_cut_never_lands_a_different_value(message: Any, where: int,
                                                                                   xor: int) -> None:
    """A valid Kitchen with one byte changed, or cut short: equal or a fallback."""
    raw = framed(message)
    body_start = len(header(KITCHEN))
    if len(raw) > body_start:
        at = body_start + where % (len(raw) - body_start)
        changed = raw[:at] + bytes([raw[at] ^ xor]) + raw[at + 1:]
        compare(decoder_of(KITCHEN), [framed(KITCHEN(i32=2)), changed, raw[:at]])

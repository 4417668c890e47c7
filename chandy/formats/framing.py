"""The Confluent wire format's header, parsed in this one place for every format.

Confluent's serializers (``AvroSerializer``, ``JSONSerializer``, ``ProtobufSerializer``) frame a
value as the magic byte ``0``, the writer schema's registry ID as 4 bytes big-endian, then the
payload; Protobuf's payload starts with the *message indexes* (a zigzag varint count, then that
many zigzag varints; a count of 0 means ``[0]``, the file's first message) that name the message
type within the schema. This is what confluent-kafka's ``SchemaId.from_bytes`` reads (magic
byte 0; its newer magic byte 1 names a schema by GUID, which Chandy does not read: such a value
is not framed here and becomes a bad record). Per record (:func:`split`, :func:`split_protobuf`,
:func:`schema_id_of`) and a column at a time (:func:`schema_ids`, :func:`payloads`). Chandy's own
messages on its topics are framed the same way and read by :mod:`chandy.schemas.codec`, whose
constants these are.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from chandy.formats.errors import FormatError
from chandy.schemas.codec import CONFLUENT_HEADER_BYTES, CONFLUENT_MAGIC

#: the magic byte of a value framed with a registry schema ID (the one Chandy's own messages carry,
#: :mod:`chandy.schemas.codec`)
MAGIC_BYTE = CONFLUENT_MAGIC
#: bytes before the payload: the magic byte and the 4-byte schema ID
HEADER_BYTES = CONFLUENT_HEADER_BYTES
#: message indexes a Protobuf header may hold (confluent-kafka refuses more than 100,000; a value
#: naming more than 100 nested messages is damaged)
MAX_MESSAGE_INDEXES = 100

_EXPECTED = "expected 00 followed by a 4-byte schema ID"
_EXPECTED_PROTOBUF = "expected 00, a 4-byte schema ID and the message indexes"


class FramingError(FormatError, ValueError):
    """A value that is not in the Confluent wire format (the message says what its first bytes
    are), or whose Protobuf message indexes do not parse: a bad record."""


def _not_framed(raw: bytes, expected: str) -> FramingError:
    return FramingError(f"not the Confluent wire format: magic byte {raw[:1].hex() or 'missing'}, {expected}")


def split(raw: bytes) -> tuple[int, bytes]:
    """(writer schema ID, payload) of a Confluent-framed Avro or JSON Schema value.

    Raises:
        FramingError: shorter than 5 bytes, or a magic byte other than 0.
    """
    if len(raw) < HEADER_BYTES or raw[0] != MAGIC_BYTE:
        raise _not_framed(raw, _EXPECTED)
    return int.from_bytes(raw[1:HEADER_BYTES], "big"), raw[HEADER_BYTES:]


def schema_id_of(raw: bytes | None, minimum: int = HEADER_BYTES) -> int | None:
    """The writer schema ID of a framed value of at least ``minimum`` bytes; None for a null,
    short or unframed one (the caller then treats it as its format's bad record)."""
    if not raw or len(raw) < minimum or raw[0] != MAGIC_BYTE:
        return None
    return int.from_bytes(raw[1:HEADER_BYTES], "big")


def _zigzag_varint(raw: bytes, position: int) -> tuple[int, int]:
    """(the zigzag-decoded varint at ``position``, the position after it)."""
    shift = result = 0
    while True:
        if position >= len(raw) or shift > 63:
            raise FramingError("the message indexes end before their last varint")
        byte = raw[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), position
        shift += 7


def split_protobuf(raw: bytes) -> tuple[int, list[int], bytes]:
    """(schema ID, message indexes, Protobuf binary) of a Confluent-framed Protobuf value.

    Raises:
        FramingError: no magic byte 0, or message indexes that do not parse.
    """
    if len(raw) < HEADER_BYTES + 1 or raw[0] != MAGIC_BYTE:
        raise _not_framed(raw, _EXPECTED_PROTOBUF)
    schema_id = int.from_bytes(raw[1:HEADER_BYTES], "big")
    count, position = _zigzag_varint(raw, HEADER_BYTES)
    if count < 0 or count > MAX_MESSAGE_INDEXES:
        raise FramingError(f"{count} message indexes")
    if count == 0:
        return schema_id, [0], raw[position:]
    indexes = []
    for _ in range(count):
        index, position = _zigzag_varint(raw, position)
        indexes.append(index)
    return schema_id, indexes, raw[position:]


def schema_ids(data: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray | None:
    """The writer schema IDs (``uint32``) of values laid out in ``data`` (``uint8``) from
    ``start`` to ``end`` (one pair per value), a column at a time; None when a value is not
    framed (the caller reads value by value, naming it)."""
    if not (end - start >= HEADER_BYTES).all() or not (data[start] == MAGIC_BYTE).all():
        return None
    raw = data[(start + 1)[:, None] + np.arange(4)].astype(np.uint32)
    result: np.ndarray = (raw[:, 0] << 24) | (raw[:, 1] << 16) | (raw[:, 2] << 8) | raw[:, 3]
    return result


def payloads(values: pa.Array) -> pa.Array | None:
    """``values`` (binary) without their 5-byte header, at Arrow speed; None when a non-null
    value is not framed (the caller then reads value by value, naming it)."""
    if len(values) == 0:
        return values
    present = values.drop_null()
    if len(present) and not (pc.all(pc.greater_equal(pc.binary_length(present), HEADER_BYTES)).as_py()
                             and pc.all(pc.equal(pc.binary_slice(present, 0, 1), bytes([MAGIC_BYTE]))).as_py()):
        return None
    result: Any = pc.binary_slice(values, HEADER_BYTES, (1 << 31) - 1)  # to the end (pyarrow needs a stop)
    return result

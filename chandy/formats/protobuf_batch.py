"""Protobuf values a batch at a time, column by column, for
:meth:`chandy.formats.decoder.ValueDecoder.decode`.

Each value is parsed by protobuf's runtime with its writer's message class (as record by record),
but the columns are then built one at a time from all the batch's messages, each field read by
the reader :mod:`chandy.formats.protobuf` compiles once per message type, with no dict
per record (1.7 times as fast as record by record on the benchmark's 50,000 records: benchmarks/json_decode.py).

The batch path reads a batch only when every value of it is framed, parses, and was written with
a message whose fields all have a column of the same type (or one Avro's promotions or a widening
read it into); anything else (a tombstone, an unframed or unparsable value, a writer schema the
registry does not give, a writer with a new field, a value that does not fit its column) sends
the whole batch record by record, where bad records are found and named and new fields add
columns, exactly as before.
"""

from __future__ import annotations

import operator
from typing import Any

import pyarrow as pa
from google.protobuf.descriptor import FieldDescriptor


def decode_protobuf_batch(values: pa.Array, options: Any) -> list[pa.Array] | None:
    """The value columns (``options.columns``, in order) of a batch of Confluent-framed Protobuf
    ``values`` (one Kafka value each), or None when the batch must be read record by record (see
    the module docstring). ``options``: the ``ValueDecoder``."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError
    from google.protobuf.message import DecodeError

    from chandy.formats.framing import FramingError, split_protobuf
    from chandy.formats.protobuf import ProtobufReader, ProtobufSchemaError, arrow_columns
    from chandy.formats.registry import registry_client

    if values.null_count:
        return None
    reader = ProtobufReader(registry_client(dict(options.schema_registry)))
    groups: dict[Any, tuple[list[int], list[Any]]] = {}  # writer class -> (rows, messages)
    first_messages: dict[bytes, Any] = {}  # a 6-byte header naming message index [0] -> its writer class
    try:
        for row, raw in enumerate(values.to_pylist()):
            header = raw[:6]
            cls = first_messages.get(header)
            if cls is not None:  # the usual header: magic 0, the schema ID, one 0 byte (the first message)
                body = raw[6:]
            else:
                schema_id, indexes, body = split_protobuf(raw)
                cls, _ = reader.writer(schema_id, indexes)
                if indexes == [0] and raw[5] == 0:
                    first_messages[header] = cls
            rows, messages = groups.setdefault(cls, ([], []))
            rows.append(row)
            messages.append(cls.FromString(body))
    except (FramingError, ProtobufSchemaError, DecodeError, SchemaRegistryError):
        return None  # record by record names the bad record (an unknown schema ID among them)
    per_group: list[list[pa.Array]] = []
    for cls, (_, messages) in groups.items():
        try:
            written, names = arrow_columns(cls.DESCRIPTOR)
        except ProtobufSchemaError:
            return None
        fields = {name: (column, cls.DESCRIPTOR.fields_by_name[name]) for column, name in zip(written, names, strict=True)}
        if not _fits(fields, options):
            return None
        arrays = []
        for column, name in zip(options.columns, options.source_names, strict=True):
            if name not in fields:
                arrays.append(pa.nulls(len(messages), column.type))
                continue
            try:
                arrays.append(_column(messages, fields[name][1], column.type))
            except (pa.ArrowException, TypeError, ValueError, OverflowError):
                return None  # a value that does not fit its column: record by record names it
        per_group.append(arrays)
    if len(per_group) == 1:
        return per_group[0]
    order = [row for rows, _ in groups.values() for row in rows]
    position = pa.array(sorted(range(len(order)), key=order.__getitem__), pa.int64())
    return [pa.concat_arrays([g[c] for g in per_group]).take(position) for c in range(len(options.columns))]


#: field types whose runtime value record by record converts (enum names, uint64 as Decimal, messages)
_CONVERTED = (FieldDescriptor.TYPE_ENUM, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64,
              FieldDescriptor.TYPE_MESSAGE)
#: Python's ``datetime`` range in seconds from the epoch (record by record builds ``datetime``s)
_MIN_S, _MAX_S = -62_135_596_800, 253_402_300_799


def _column(messages: list[Any], field: Any, column_type: pa.DataType) -> pa.Array:
    """The column of ``field`` (a field descriptor) over ``messages``, of ``column_type``: a
    singular Timestamp from its seconds and nanos at once, a singular message as a struct of its
    fields' columns, anything else through :func:`~chandy.formats.protobuf.field_reader`.

    Raises:
        ValueError: a Timestamp beyond ``datetime``'s range (record by record decides);
            pyarrow's errors for a value that does not fit.
    """
    import numpy as np

    from chandy.formats.protobuf import TIMESTAMP, field_reader, is_repeated

    name = field.name
    if field.type not in _CONVERTED and not is_repeated(field) and not field.has_presence:
        return pa.array(list(map(operator.attrgetter(name), messages)), column_type)  # the runtime's value as it is
    singular_message = field.type == FieldDescriptor.TYPE_MESSAGE and not is_repeated(field)
    if not singular_message or not pa.types.is_struct(column_type) and not pa.types.is_timestamp(column_type):
        read = field_reader(field)
        return pa.array([read(m) for m in messages], column_type)
    present = np.array([m.HasField(name) for m in messages], dtype=bool)
    inner = [getattr(m, name) for m in messages]
    if field.message_type.full_name == TIMESTAMP:
        seconds = np.array([t.seconds for t in inner], dtype=np.int64)
        nanos = np.array([t.nanos for t in inner], dtype=np.int64)
        if ((seconds < _MIN_S) | (seconds > _MAX_S)).any():
            raise ValueError("a Timestamp beyond datetime's range")
        return pa.array(seconds * 1_000_000 + nanos // 1000, column_type, mask=~present)
    children = [_column(inner, sub, column_type.field(i).type) for i, sub in enumerate(field.message_type.fields)]
    return pa.StructArray.from_arrays(children, fields=list(column_type), mask=pa.array(~present))


def _fits(fields: dict[str, tuple[pa.Field, Any]], options: Any) -> bool:
    """Whether every field of a writer has a column its values read into as record by record
    would read them (the same type, a promotion, a widening), with no new field."""
    from chandy.formats.avro import promotes
    from chandy.formats.type_mapping import widens

    columns = dict(zip(options.source_names, options.columns, strict=True))
    for name, (written, _) in fields.items():
        column = columns.get(name)
        if column is None:
            return False
        if not column.type.equals(written.type) and not promotes(written.type, column.type) \
                and not widens(written.type, column.type):
            return False
    return True

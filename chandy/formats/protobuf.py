"""Protobuf values (``--value-format protobuf``) from a Schema Registry: Confluent's framing, the
writer's message descriptor by schema ID, and which Protobuf fields become which columns.

Confluent's ``ProtobufSerializer`` writes the magic byte ``0``, the 4-byte big-endian schema ID,
the *message indexes* (the path of the message type in its ``.proto`` file: a zigzag varint
count, then that many zigzag varints; a single ``0`` byte means ``[0]``, the first message),
then the Protobuf binary. The schema is fetched from the registry in its serialized form (a
base64 ``FileDescriptorProto``, ``GET /schemas/ids/{id}?format=serialized``), its references
(imported ``.proto`` files registered under their own subjects) with it, and decoded with
protobuf's own runtime (``google.protobuf``). A registry that answers ``.proto`` text instead
(Apicurio 2.x ignores ``format=serialized`` for schemas registered as text, as Java and Go
clients register them) has the text compiled by ``protoc`` (grpcio-tools' in-process copy), its
imports given as the descriptors already read.

Columns follow Spark's ``from_protobuf`` (``SchemaConverters``), with ``upcast.unsigned.ints``
(an unsigned value never turns negative) and ``emit.default.values`` (a field without presence
lands the value protobuf's runtime reads, 0 or ``""`` when unset):

===============================================  ==========================================
Protobuf                                         column
===============================================  ==========================================
``int32``, ``sint32``, ``sfixed32``              int
``uint32``, ``fixed32``                          bigint
``int64``, ``sint64``, ``sfixed64``              bigint
``uint64``, ``fixed64``                          decimal(20, 0)
``float`` / ``double`` / ``bool``                float / double / boolean
``string`` / ``bytes``                           string / binary
enum                                             string (the value's name; an unknown number
                                                 as its decimal text)
message                                          struct, one field per Protobuf field
``google.protobuf.Timestamp``                    timestamp (UTC, microseconds)
``repeated T``                                   array<T>
``map<K, V>``                                    map<K, V>
===============================================  ==========================================

A field with presence (a message, a proto3 ``optional``, a proto2 field, a ``oneof`` member)
lands NULL when unset. A message that contains itself has no column type (refused, as
``from_protobuf`` refuses it without ``recursive.fields.max.depth``).
"""

from __future__ import annotations

import base64
import datetime
import decimal
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from chandy.formats.errors import FormatError
from chandy.formats.framing import FramingError, split_protobuf


class ProtobufSchemaError(FormatError):
    """A Protobuf schema Chandy cannot read from the registry or map to columns (the message
    says which schema ID or field)."""


class ProtobufFramingError(FramingError):
    """A value that is not Confluent-framed Protobuf: its header (:mod:`chandy.formats.framing`)
    or its bytes after it, not a message of the writer's type (a bad record)."""


#: imports every registry serializer leaves out of a schema's references (the runtime's own)
_BUILTIN_PREFIXES = ("google/protobuf/", "google/type/", "confluent/")


def _well_known_pool() -> Any:
    from google.protobuf import (
        any_pb2,
        descriptor_pb2,
        descriptor_pool,
        duration_pb2,
        empty_pb2,
        field_mask_pb2,
        struct_pb2,
        timestamp_pb2,
        wrappers_pb2,
    )

    pool = descriptor_pool.DescriptorPool()
    for module in (any_pb2, descriptor_pb2, duration_pb2, empty_pb2, field_mask_pb2, struct_pb2, timestamp_pb2,
                   wrappers_pb2):
        pool.AddSerializedFile(module.DESCRIPTOR.serialized_pb)
    return pool


def _file_proto(name: str, schema_str: str, where: str, imports: Mapping[str, Any]) -> Any:
    """The ``FileDescriptorProto`` of a registry's schema named ``name``: its serialized form, or
    its ``.proto`` text compiled with ``imports`` (name to ``FileDescriptorProto``, the files it
    may import besides protobuf's well-known ones)."""
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    proto = descriptor_pb2.FileDescriptorProto()
    try:
        proto.ParseFromString(base64.b64decode(schema_str.encode("ascii"), validate=True))
    except (ValueError, UnicodeEncodeError, DecodeError):
        proto = _compiled(name, schema_str, where, imports)
    proto.name = name
    return proto


def _compiled(name: str, text: str, where: str, imports: Mapping[str, Any]) -> Any:
    """``.proto`` ``text`` compiled by grpcio-tools' ``protoc`` into its ``FileDescriptorProto``.

    Raises:
        ProtobufSchemaError: the text does not compile (protoc's own message goes to stderr).
    """
    import importlib.resources
    import tempfile
    from pathlib import Path

    from google.protobuf import descriptor_pb2
    from grpc_tools import protoc

    with tempfile.TemporaryDirectory(prefix="chandy-proto-") as folder:
        source = Path(folder, "src", name)
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text(text)
        args = ["protoc", f"-I{Path(folder, 'src')}", f"-I{importlib.resources.files('grpc_tools') / '_proto'}",
                f"--descriptor_set_out={Path(folder, 'out.pb')}"]
        if imports:
            given = descriptor_pb2.FileDescriptorSet(file=list(imports.values()))
            Path(folder, "in.pb").write_bytes(given.SerializeToString())
            args.append(f"--descriptor_set_in={Path(folder, 'in.pb')}")
        code = protoc.main([*args, name])
        if code != 0:
            raise ProtobufSchemaError(f"{where}: the registry returned .proto text that protoc does not compile "
                                      f"(exit {code}; its message is on stderr)")
        return descriptor_pb2.FileDescriptorSet.FromString(Path(folder, "out.pb").read_bytes()).file[0]


def message_descriptor(registry: Any, schema_id: int, indexes: list[int]) -> Any:
    """The writer's message descriptor: schema ``schema_id`` (and its references) from
    ``registry`` (a ``SchemaRegistryClient``) in a pool of its own, the message at ``indexes``.

    Raises:
        ProtobufSchemaError: the schema is not Protobuf, not serialized, or has no such message.
    """
    schema = registry.get_schema(schema_id, fmt="serialized")
    if (getattr(schema, "schema_type", None) or "AVRO") != "PROTOBUF":
        raise ProtobufSchemaError(f"schema ID {schema_id} is a {schema.schema_type} schema, not Protobuf")
    pool = _well_known_pool()
    files: dict[str, Any] = {}
    _add_references(registry, schema, pool, files)
    proto = _file_proto(f"chandy-schema-{schema_id}.proto", schema.schema_str, f"schema ID {schema_id}", files)
    descriptor = pool.AddSerializedFile(proto.SerializeToString())
    messages = list(descriptor.message_types_by_name.values())
    found: Any = None
    for depth, index in enumerate(indexes):
        choices = messages if depth == 0 else list(found.nested_types)
        if not 0 <= index < len(choices):
            raise ProtobufSchemaError(f"schema ID {schema_id} has no message at indexes {indexes}")
        found = choices[index]
    return found


def _add_references(registry: Any, schema: Any, pool: Any, files: dict[str, Any]) -> None:
    """Add ``schema``'s references to ``pool``, imports first, each also in ``files`` (by name)."""
    for reference in schema.references or ():
        if reference.name.startswith(_BUILTIN_PREFIXES) or reference.name in files:
            continue
        files[reference.name] = None  # being read: a cycle of imports stops here
        referred = registry.get_version(reference.subject, reference.version, True, "serialized").schema
        _add_references(registry, referred, pool, files)
        proto = _file_proto(reference.name, referred.schema_str, f"reference {reference.name}",
                            {k: v for k, v in files.items() if v is not None})
        files[reference.name] = proto
        pool.AddSerializedFile(proto.SerializeToString())


TIMESTAMP = "google.protobuf.Timestamp"


def arrow_columns(message: Any) -> tuple[pa.Schema, tuple[str, ...]]:
    """A message descriptor's fields as landed columns (see the module docstring): (Arrow
    fields, each one's Protobuf field name); a field named like a Kafka column lands as
    ``value_<name>``.

    Raises:
        ProtobufSchemaError: a message that contains itself.
    """
    from chandy.formats.records import ARROW_SCHEMA

    fields = [pa.field(f.name, _field_type(f, (message.full_name,))) for f in message.fields]
    renamed = [f.with_name(f"value_{f.name}") if f.name in ARROW_SCHEMA.names else f for f in fields]
    return pa.schema(renamed), tuple(f.name for f in fields)


def _is_map(field: Any) -> bool:
    kind = field.message_type
    return kind is not None and kind.GetOptions().map_entry


def is_repeated(field: Any) -> bool:
    """Whether ``field`` (a field descriptor) is repeated (maps too)."""
    repeated = getattr(field, "is_repeated", None)  # protobuf 6+; label before
    return bool(field.label == field.LABEL_REPEATED if repeated is None else repeated)


def _field_type(field: Any, stack: tuple[str, ...]) -> pa.DataType:
    if _is_map(field):
        entry = field.message_type
        return pa.map_(_scalar_type(entry.fields_by_name["key"], stack),
                       _scalar_type(entry.fields_by_name["value"], stack))
    kind = _scalar_type(field, stack)
    return pa.list_(kind) if is_repeated(field) else kind


def _scalar_type(field: Any, stack: tuple[str, ...]) -> pa.DataType:
    from google.protobuf.descriptor import FieldDescriptor as F

    kind = field.type
    if kind in (F.TYPE_INT32, F.TYPE_SINT32, F.TYPE_SFIXED32):
        return pa.int32()
    if kind in (F.TYPE_UINT32, F.TYPE_FIXED32, F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64):
        return pa.int64()
    if kind in (F.TYPE_UINT64, F.TYPE_FIXED64):
        return pa.decimal128(20, 0)
    simple = {F.TYPE_FLOAT: pa.float32(), F.TYPE_DOUBLE: pa.float64(), F.TYPE_BOOL: pa.bool_(),
              F.TYPE_STRING: pa.string(), F.TYPE_BYTES: pa.binary(), F.TYPE_ENUM: pa.string()}
    if kind in simple:
        return simple[kind]
    message = field.message_type
    if message.full_name == TIMESTAMP:
        return pa.timestamp("us", tz="UTC")
    if message.full_name in stack:
        raise ProtobufSchemaError(f"field {field.full_name}: message {message.full_name} contains itself "
                                  "(recursive messages have no column type)")
    return pa.struct([pa.field(f.name, _field_type(f, (*stack, message.full_name))) for f in message.fields])


def message_values(message: Any) -> dict[str, Any]:
    """A parsed message's fields as column values: a field with presence that is unset is None,
    one without presence its runtime value (see the module docstring)."""
    return _extractor(message.DESCRIPTOR)(message)


#: per message descriptor, a function from a message to its column values (built once: reading a
#: field through its descriptor's attributes on every record cost 3 to 4 times the parse)
_EXTRACTORS: dict[Any, Callable[[Any], dict[str, Any]]] = {}


def _extractor(descriptor: Any) -> Callable[[Any], dict[str, Any]]:
    if descriptor not in _EXTRACTORS:
        getters = [(field.name, field_reader(field)) for field in descriptor.fields]
        _EXTRACTORS[descriptor] = lambda message: {name: get(message) for name, get in getters}
    return _EXTRACTORS[descriptor]


def field_reader(field: Any) -> Callable[[Any], Any]:
    """A function from a message to ``field``'s column value (built once per field)."""
    name = field.name
    if _is_map(field):
        convert_value = _converter(field.message_type.fields_by_name["value"])
        if convert_value is None:
            return lambda message: list(getattr(message, name).items())
        return lambda message: [(key, convert_value(value)) for key, value in getattr(message, name).items()]
    convert = _converter(field)
    if is_repeated(field):
        if convert is None:
            return lambda message: list(getattr(message, name))
        return lambda message: [convert(v) for v in getattr(message, name)]
    if field.has_presence:
        if convert is None:
            return lambda message: getattr(message, name) if message.HasField(name) else None
        return lambda message: convert(getattr(message, name)) if message.HasField(name) else None
    if convert is None:
        return lambda message: getattr(message, name)
    return lambda message: convert(getattr(message, name))


def _converter(field: Any) -> Callable[[Any], Any] | None:
    """How one runtime value of ``field`` becomes its column's value (None: as it is): an enum
    its name (an unknown number its digits), a uint64 a Decimal (DECIMAL(20, 0)), a Timestamp a
    UTC datetime (microseconds), a message its column values."""
    from google.protobuf.descriptor import FieldDescriptor as F

    if field.type == F.TYPE_ENUM:
        names = {number: value.name for number, value in field.enum_type.values_by_number.items()}
        return lambda value: names.get(value, str(value))
    if field.type in (F.TYPE_UINT64, F.TYPE_FIXED64):
        return decimal.Decimal
    if field.type == F.TYPE_MESSAGE:
        if field.message_type.full_name == TIMESTAMP:
            return lambda value: datetime.datetime.fromtimestamp(value.seconds, datetime.UTC) + datetime.timedelta(
                microseconds=value.nanos // 1000)
        message_type = field.message_type
        return lambda value: _extractor(message_type)(value)
    return None


#: message classes per (registry client, schema ID, message indexes), for every reader of a process
_CLASSES: dict[tuple[int, int, tuple[int, ...]], Any] = {}


class ProtobufReader:
    """Reads Confluent-framed Protobuf values with each one's writer schema (the message classes
    cached per process, by schema ID and message indexes). ``registry``: a ``SchemaRegistryClient``."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry
        self._seen: set[tuple[int, tuple[int, ...]]] = set()

    def writer(self, schema_id: int, indexes: list[int]) -> tuple[Any, bool]:
        """(the message class of the writer, whether this reader meets it the first time)."""
        key = (schema_id, tuple(indexes))
        cached = (id(self.registry), *key)
        if cached not in _CLASSES:
            from google.protobuf import message_factory

            _CLASSES[cached] = message_factory.GetMessageClass(message_descriptor(self.registry, schema_id, indexes))
        new = key not in self._seen
        self._seen.add(key)
        return _CLASSES[cached], new

    def read(self, raw: bytes) -> tuple[int, Any, Mapping[str, Any], bool]:
        """(schema ID, the writer's message descriptor, the value's fields, whether the writer is
        new to this reader).

        Raises:
            FramingError: not framed; ProtobufFramingError: bytes that are not a message of the writer's type.
            ProtobufSchemaError: the writer's schema cannot be read (see :func:`message_descriptor`).
        """
        from google.protobuf.message import DecodeError

        schema_id, indexes, body = split_protobuf(raw)
        cls, new = self.writer(schema_id, indexes)
        message = cls()
        try:
            message.ParseFromString(body)
        except DecodeError as exc:
            raise ProtobufFramingError(f"not a Protobuf {cls.DESCRIPTOR.full_name}: {exc}") from exc
        return schema_id, cls.DESCRIPTOR, message_values(message), new

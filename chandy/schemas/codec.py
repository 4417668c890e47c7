"""The wire format: the one module that turns Chandy's messages into bytes and back.

Two framings, both carrying Avro binary (fastavro):

- **Single-object encoding** (the default, Avro specification 1.8+): the two bytes ``C3 01``, the
  8-byte little-endian CRC-64-AVRO fingerprint of the writer schema's parsing canonical form,
  then the Avro binary. The reader looks the writer schema up by fingerprint and resolves it
  against its own version of the same named schema, so old and new versions are read side by
  side (Avro's schema resolution: new fields need defaults).
- **Confluent wire format**, when a Schema Registry URL is configured: magic byte ``0``, the
  4-byte big-endian schema id, then the Avro binary, written through
  ``confluent_kafka.schema_registry.avro.AvroSerializer`` (one subject per record type).

Bytes that do not decode raise a :class:`WireFormatError` subclass whose message names the topic,
partition and offset the bytes came from.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import struct
import threading
from collections.abc import Iterable, Mapping
from importlib import resources
from importlib.resources.abc import Traversable
from typing import Any, Protocol

import fastavro
import fastavro.schema
from fastavro.repository import AbstractSchemaRepository, SchemaRepositoryError

from chandy.schemas.errors import ChandyError

log = logging.getLogger(__name__)

#: First two bytes of every single-object encoded message.
SINGLE_OBJECT_MAGIC = b"\xc3\x01"
_SINGLE_OBJECT_HEADER = len(SINGLE_OBJECT_MAGIC) + 8
#: First byte of every Confluent-framed message.
CONFLUENT_MAGIC = 0
CONFLUENT_HEADER_BYTES = 5


# -- errors ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MessageLocation:
    """Where a message was read from: Kafka topic, partition and offset (-1 when unknown)."""

    topic: str | None = None
    partition: int = -1
    offset: int = -1

    def __str__(self) -> str:
        if self.topic is None:
            return "<no topic>"
        return f"{self.topic} [partition {self.partition}] @ offset {self.offset}"


class WireFormatError(ChandyError):
    """Bytes that are not a Chandy message; ``location`` says where they were read."""

    def __init__(self, problem: str, location: MessageLocation | None = None) -> None:
        self.location = location or MessageLocation()
        self.problem = problem
        super().__init__(f"{problem} (at {self.location})")


class TruncatedMessageError(WireFormatError):
    """The message ends before its header or its Avro body is complete."""


class BadMagicError(WireFormatError):
    """The message does not start with the framing's magic bytes."""


class UnknownSchemaError(WireFormatError):
    """The writer schema (fingerprint or registry id) is not one this reader knows."""


class SchemaNotFoundError(ChandyError):
    """No schema of that name is known (raised when encoding, where there is no location)."""


class EncodeError(ChandyError):
    """A value does not match the schema it is encoded with."""


# -- schemas ---------------------------------------------------------------------------------
def fingerprint(schema: Mapping[str, Any] | str) -> bytes:
    """CRC-64-AVRO fingerprint of ``schema``'s parsing canonical form: 8 bytes, little-endian.

    This is the fingerprint of Avro's single-object encoding (Java's
    ``SchemaNormalization.parsingFingerprint64`` written little-endian).
    """
    canonical = fastavro.schema.to_parsing_canonical_form(dict(schema) if isinstance(schema, Mapping) else schema)
    return bytes.fromhex(fastavro.schema.fingerprint(canonical, "CRC-64-AVRO"))


def _strip_hints(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _strip_hints(v) for k, v in schema.items() if not k.startswith("__")}
    if isinstance(schema, list):
        return [_strip_hints(v) for v in schema]
    return schema


@dataclasses.dataclass(frozen=True)
class Schema:
    """One version of a named Avro schema.

    ``definition`` is the expanded JSON-ready schema (referenced named types inlined), ``parsed``
    fastavro's parsed form, ``fingerprint`` its 8-byte CRC-64-AVRO fingerprint.
    """

    name: str
    definition: Mapping[str, Any] = dataclasses.field(repr=False)
    parsed: Any = dataclasses.field(repr=False)
    fingerprint: bytes

    @classmethod
    def from_definition(cls, definition: Mapping[str, Any] | str) -> Schema:
        """A :class:`Schema` from a JSON string or dict that is self-contained (no references)."""
        loaded: dict[str, Any] = json.loads(definition) if isinstance(definition, str) else dict(definition)
        parsed = fastavro.parse_schema(loaded, _write_hint=False)
        expanded = _strip_hints(parsed)
        return cls(
            name=expanded["name"],
            definition=expanded,
            parsed=fastavro.parse_schema(expanded),
            fingerprint=fingerprint(expanded),
        )

    @property
    def json(self) -> str:
        """The expanded schema as a JSON string (what a Schema Registry stores)."""
        return json.dumps(self.definition)


class _AvscFiles(AbstractSchemaRepository):
    """fastavro's ``FlatDictRepository`` (``<full name>.avsc`` in one directory) over a
    :class:`~importlib.resources.abc.Traversable`: a directory, or the ``schemas`` package inside
    a zip (the code a Spark driver ships to its executors with ``addPyFile``)."""

    def __init__(self, directory: Traversable) -> None:
        self.directory = directory

    def load(self, name: str) -> dict[str, Any]:
        try:
            loaded: dict[str, Any] = json.loads(self.directory.joinpath(f"{name}.avsc").read_text(encoding="utf-8"))
        except (OSError, KeyError, ValueError) as exc:  # a zip answers a missing member with KeyError
            raise SchemaRepositoryError(f"Failed to load '{name}' schema from {self.directory}: {exc}") from exc
        return loaded


def load_schemas(directory: Traversable | None = None) -> dict[str, Schema]:
    """Every ``*.avsc`` in ``directory`` (default: the ``schemas`` package's own files, also when
    it is imported from a zip) that defines a record, keyed by full name.

    Named-type references are resolved from files named ``<full name>.avsc`` in the same
    directory (fastavro's ``load_schema`` with a ``FlatDictRepository``-like repository).
    """
    directory = directory if directory is not None else resources.files("chandy.schemas")
    repository = _AvscFiles(directory)
    loaded: dict[str, Schema] = {}
    for entry in sorted((e for e in directory.iterdir() if e.name.endswith(".avsc")), key=lambda e: e.name):
        parsed = fastavro.schema.load_schema(entry.name[: -len(".avsc")], repo=repository, _write_hint=False)
        if not isinstance(parsed, dict) or parsed.get("type") != "record":
            continue  # enums and shared records are reached through the records that use them
        schema = Schema.from_definition(_strip_hints(parsed))
        loaded[schema.name] = schema
    return loaded


#: The sub-package of earlier versions of the schemas, ``<full name>.<fingerprint hex>.avsc``, each
#: self-contained: records written by an earlier Chandy stay readable after a schema changes
#: (Avro's single-object encoding finds the writer schema by fingerprint, so a reader must know
#: every version ever written). A changed schema's previous version is added here.
HISTORY_DIRECTORY = "history"


def load_history(directory: Traversable | None = None) -> list[Schema]:
    """The earlier versions of the schemas shipped in ``directory/history`` (default: the
    ``schemas`` package's), as writer versions to register next to the current ones.

    Raises:
        SchemaNotFoundError: a file's name does not match the fingerprint of its schema (a
            hand-edited history file would otherwise decode records with the wrong schema).
    """
    directory = directory if directory is not None else resources.files("chandy.schemas")
    history = directory.joinpath(HISTORY_DIRECTORY)
    if not history.is_dir():
        return []
    versions = []
    for entry in sorted((e for e in history.iterdir() if e.name.endswith(".avsc")), key=lambda e: e.name):
        schema = Schema.from_definition(entry.read_text(encoding="utf-8"))
        if entry.name != f"{schema.name}.{schema.fingerprint.hex()}.avsc":
            raise SchemaNotFoundError(f"schema history file {entry.name} holds {schema.name} with fingerprint "
                                      f"{schema.fingerprint.hex()}: its name must be "
                                      f"{schema.name}.{schema.fingerprint.hex()}.avsc")
        versions.append(schema)
    return versions


class SchemaRepository:
    """The schemas a process knows: the current version of each name, and every writer version.

    Reading resolves the writer's version (found by fingerprint) against the current version of
    the same name. Thread-safe for reads; :meth:`register` may be called at any time.
    """

    def __init__(self, schemas: Iterable[Schema] | None = None) -> None:
        """``schemas``: the current versions (default: the shipped ones, with every earlier
        version from :func:`load_history` known as a writer version)."""
        self._lock = threading.Lock()
        self._current: dict[str, Schema] = {}
        self._by_fingerprint: dict[bytes, Schema] = {}
        for schema in schemas if schemas is not None else load_schemas().values():
            self.register(schema, current=True)
        if schemas is None:
            for schema in load_history():
                self._by_fingerprint.setdefault(schema.fingerprint, schema)

    def register(self, schema: Schema, *, current: bool = False) -> None:
        """Know ``schema`` as a writer version; with ``current``, also read its name with it."""
        with self._lock:
            self._by_fingerprint[schema.fingerprint] = schema
            if current or schema.name not in self._current:
                self._current[schema.name] = schema

    def current(self, name: str) -> Schema:
        """The current version of schema ``name`` (full name, or the short name in ``chandy.v1``).

        Raises:
            SchemaNotFoundError: no such schema.
        """
        schema = self._current.get(name) or self._current.get(f"chandy.v1.{name}")
        if schema is None:
            raise SchemaNotFoundError(f"no Avro schema named {name!r}; known: {', '.join(sorted(self._current))}")
        return schema

    def by_fingerprint(self, fp: bytes) -> Schema | None:
        """The writer schema with fingerprint ``fp`` (8 bytes), or None."""
        return self._by_fingerprint.get(fp)

    def names(self) -> list[str]:
        """Full names of the current schemas, sorted."""
        return sorted(self._current)


_default_repository: SchemaRepository | None = None
_default_lock = threading.Lock()


def default_repository() -> SchemaRepository:
    """The process-wide repository of the schemas shipped in ``schemas/`` (loaded once)."""
    global _default_repository
    with _default_lock:
        if _default_repository is None:
            _default_repository = SchemaRepository()
        return _default_repository


# -- codecs ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Decoded:
    """A decoded message: the full schema ``name``, the ``value`` as a dict (read with the
    reader's version of the schema) and the ``writer`` schema version it was written with."""

    name: str
    value: dict[str, Any]
    writer: Schema


class Codec(Protocol):
    """What the rest of Chandy uses to put messages on the wire and take them off."""

    def encode(self, name: str, value: Mapping[str, Any], *, topic: str | None = None) -> bytes:
        """Encode ``value`` with the current schema ``name``; ``topic`` is used for the registry subject."""
        ...

    def decode(self, data: bytes | None, location: MessageLocation | None = None) -> Decoded:
        """Decode one message; raises a :class:`WireFormatError` naming ``location``."""
        ...


def _write_avro(schema: Schema, value: Mapping[str, Any]) -> bytes:
    buffer = io.BytesIO()
    try:
        fastavro.schemaless_writer(buffer, schema.parsed, value)
    except (ValueError, TypeError, KeyError, AttributeError, struct.error) as exc:
        raise EncodeError(f"value does not match Avro schema {schema.name}: {exc!r}") from exc
    return buffer.getvalue()


def _read_avro(body: bytes, writer: Schema, reader: Schema, location: MessageLocation | None) -> dict[str, Any]:
    stream = io.BytesIO(body)
    try:
        if writer.fingerprint == reader.fingerprint:
            value = fastavro.schemaless_reader(stream, writer.parsed, None)
        else:
            value = fastavro.schemaless_reader(stream, writer.parsed, reader.parsed)
    except (EOFError, StopIteration, IndexError, struct.error) as exc:
        raise TruncatedMessageError(f"Avro body of {writer.name} ends early ({len(body)} bytes)", location) from exc
    except (ValueError, TypeError, UnicodeDecodeError, KeyError, OverflowError, MemoryError,
            fastavro.read.SchemaResolutionError) as exc:
        # SchemaResolutionError: the writer version cannot be read as the reader's (no default)
        raise WireFormatError(f"Avro body of {writer.name} does not decode: {exc!r}", location) from exc
    if stream.tell() != len(body):
        raise WireFormatError(
            f"{len(body) - stream.tell()} trailing bytes after the Avro body of {writer.name}", location
        )
    if not isinstance(value, dict):
        raise WireFormatError(f"Avro body of {writer.name} is not a record", location)
    return value


class SingleObjectCodec:
    """Avro single-object encoding with writer-schema resolution by fingerprint."""

    def __init__(self, repository: SchemaRepository | None = None) -> None:
        self.repository = repository or default_repository()

    def encode(self, name: str, value: Mapping[str, Any], *, topic: str | None = None) -> bytes:
        """``C3 01`` + fingerprint + Avro binary of ``value`` under the current schema ``name``.

        Raises:
            SchemaNotFoundError: unknown schema name.
            EncodeError: the value does not match the schema.
        """
        schema = self.repository.current(name)
        return SINGLE_OBJECT_MAGIC + schema.fingerprint + _write_avro(schema, value)

    def decode(self, data: bytes | None, location: MessageLocation | None = None) -> Decoded:
        """Decode a single-object encoded message.

        Raises:
            TruncatedMessageError: fewer than 10 header bytes, or the body ends early.
            BadMagicError: the first two bytes are not ``C3 01``.
            UnknownSchemaError: the fingerprint is not one of a known writer schema.
            WireFormatError: the body does not decode, or bytes follow it.
        """
        if data is None:
            raise WireFormatError("null message value where a Chandy message was expected", location)
        fp, body = split_single_object(data, location)
        writer = self.repository.by_fingerprint(fp)
        if writer is None:
            raise UnknownSchemaError(f"unknown writer schema fingerprint {fp.hex()}", location)
        reader = self.repository.current(writer.name)
        return Decoded(writer.name, _read_avro(body, writer, reader, location), writer)


def split_single_object(data: bytes, location: MessageLocation | None = None) -> tuple[bytes, bytes]:
    """A single-object encoded message's (8-byte writer schema fingerprint, Avro body).

    Raises:
        TruncatedMessageError: fewer than 10 header bytes.
        BadMagicError: the first two bytes are not ``C3 01``.
    """
    if len(data) < len(SINGLE_OBJECT_MAGIC):
        raise TruncatedMessageError(f"message of {len(data)} bytes is shorter than the magic bytes", location)
    if data[:2] != SINGLE_OBJECT_MAGIC:
        raise BadMagicError(
            f"expected the single-object magic c3 01, found {data[:2].hex(' ')}", location
        )
    if len(data) < _SINGLE_OBJECT_HEADER:
        raise TruncatedMessageError(
            f"message of {len(data)} bytes ends inside its 10-byte single-object header", location
        )
    return bytes(data[2:_SINGLE_OBJECT_HEADER]), bytes(data[_SINGLE_OBJECT_HEADER:])


class ConfluentCodec:
    """The Confluent wire format through ``confluent_kafka.schema_registry``.

    Writing uses ``AvroSerializer`` with one subject per record type
    (``record_subject_name_strategy``), since a Chandy topic carries several record types;
    reading fetches the writer schema by id from the registry (cached) and resolves it against
    the current version of the same name.

    Args:
        registry: a ``SchemaRegistryClient``, or its configuration (``{"url": ...}`` and the
            client's other settings under their standard names).
        repository: the reader schemas (default: the shipped ones).
        auto_register: register schemas on first use (``auto.register.schemas``).
    """

    def __init__(
        self,
        registry: Any,
        repository: SchemaRepository | None = None,
        *,
        auto_register: bool = True,
    ) -> None:
        from confluent_kafka.schema_registry import SchemaRegistryClient, record_subject_name_strategy

        # new_client: a "mock://" URL gives confluent-kafka's in-process registry (for tests)
        self.registry = SchemaRegistryClient.new_client(dict(registry)) if isinstance(registry, Mapping) else registry
        self.repository = repository or default_repository()
        self._serializer_conf = {
            "auto.register.schemas": auto_register,
            "subject.name.strategy": record_subject_name_strategy,
        }
        self._serializers: dict[str, Any] = {}
        self._writers: dict[int, Schema] = {}
        self._lock = threading.Lock()

    def _serializer(self, schema: Schema) -> Any:
        from confluent_kafka.schema_registry.avro import AvroSerializer

        with self._lock:
            serializer = self._serializers.get(schema.name)
            if serializer is None:
                serializer = AvroSerializer(self.registry, schema.json, conf=self._serializer_conf)
                self._serializers[schema.name] = serializer
            return serializer

    def encode(self, name: str, value: Mapping[str, Any], *, topic: str | None = None) -> bytes:
        """Magic ``0`` + 4-byte schema id + Avro binary, registering the schema if allowed.

        Raises:
            SchemaNotFoundError: unknown schema name.
            EncodeError: the value does not match, or the registry refused the schema.
        """
        from confluent_kafka.schema_registry.error import SchemaRegistryError
        from confluent_kafka.serialization import MessageField, SerializationContext, SerializationError

        schema = self.repository.current(name)
        try:
            return self._serializer(schema)(dict(value), SerializationContext(topic or "", MessageField.VALUE))
        except (SerializationError, SchemaRegistryError, ValueError, TypeError) as exc:
            raise EncodeError(f"could not encode {schema.name} for the Schema Registry: {exc}") from exc

    def _writer(self, schema_id: int, location: MessageLocation | None) -> Schema:
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        with self._lock:
            cached = self._writers.get(schema_id)
        if cached is not None:
            return cached
        try:
            registered = self.registry.get_schema(schema_id)
        except SchemaRegistryError as exc:
            raise UnknownSchemaError(f"schema id {schema_id} is not in the Schema Registry: {exc}", location) from exc
        except Exception as exc:  # registry unreachable: this message cannot be read now
            raise WireFormatError(f"Schema Registry lookup of schema id {schema_id} failed: {exc}", location) from exc
        if not isinstance(registered.schema_str, str):
            raise UnknownSchemaError(f"schema id {schema_id} has no schema text in the Schema Registry", location)
        try:
            writer = Schema.from_definition(registered.schema_str)
        except Exception as exc:  # not an Avro schema (e.g. JSON Schema or Protobuf)
            raise UnknownSchemaError(f"schema id {schema_id} is not an Avro record schema: {exc}", location) from exc
        with self._lock:
            self._writers[schema_id] = writer
        return writer

    def decode(self, data: bytes | None, location: MessageLocation | None = None) -> Decoded:
        """Decode a Confluent-framed message.

        Raises:
            TruncatedMessageError, BadMagicError, UnknownSchemaError, WireFormatError: as
            :meth:`SingleObjectCodec.decode`, for the 5-byte Confluent header.
        """
        if data is None:
            raise WireFormatError("null message value where a Chandy message was expected", location)
        if len(data) < 1:
            raise TruncatedMessageError("empty message", location)
        if data[0] != CONFLUENT_MAGIC:
            raise BadMagicError(f"expected the Confluent magic byte 00, found {data[0]:02x}", location)
        if len(data) < CONFLUENT_HEADER_BYTES:
            raise TruncatedMessageError(
                f"message of {len(data)} bytes ends inside its 5-byte Confluent header", location
            )
        (schema_id,) = struct.unpack(">I", data[1:CONFLUENT_HEADER_BYTES])
        writer = self._writer(schema_id, location)
        try:
            reader = self.repository.current(writer.name)
        except SchemaNotFoundError as exc:
            raise UnknownSchemaError(f"schema id {schema_id} is {writer.name}, not a Chandy schema", location) from exc
        return Decoded(writer.name, _read_avro(bytes(data[CONFLUENT_HEADER_BYTES:]), writer, reader, location), writer)


def codec_for(schema_registry: Mapping[str, Any] | None = None, repository: SchemaRepository | None = None) -> Codec:
    """The codec for a configuration: Confluent framing when ``schema_registry`` (the
    ``SchemaRegistryClient`` settings, at least ``url``) is given, single-object encoding otherwise."""
    if schema_registry and schema_registry.get("url"):
        return ConfluentCodec(dict(schema_registry), repository)
    return SingleObjectCodec(repository)


def location_of(message: Any) -> MessageLocation:
    """The :class:`MessageLocation` of a ``confluent_kafka.Message``."""
    return MessageLocation(message.topic(), message.partition(), message.offset())

"""How one Kafka value of a binary format becomes its fields: Avro (single-object, Confluent or
raw framing; a given schema, or each record's writer schema from a Schema Registry) and
Confluent-framed Protobuf, for :class:`~chandy.formats.decoder.ValueDecoder`. A value that
does not read raises :class:`BadValue` (a bad record); a writer schema whose fields cannot land in
their columns raises :class:`WriterTypeChange` (the micro-batch fails)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any, Protocol

import pyarrow as pa

from chandy.formats.framing import FramingError, split


class ValueDecoder(Protocol):
    """What the parsers read of :class:`~chandy.formats.decoder.ValueDecoder`."""

    @property
    def avro_framing(self) -> str: ...

    @property
    def avro_schema_id(self) -> int | None: ...

    @property
    def schema_registry(self) -> tuple[tuple[str, str], ...]: ...


class BadValue(Exception):
    """Why one record is bad: ``kind`` (e.g. ``WireFormatError``) and the message; the decoder
    routes the record to the bad records (``--errors-tolerance all``) or fails with it."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class WriterTypeChange(Exception):
    """A writer schema whose field cannot land in its column (``as_written``); the decoder
    raises :class:`~chandy.formats.evolution.SchemaChangeError` with its message."""


def protobuf_parser(decoder: ValueDecoder, on_writer: Callable[[int, pa.Schema, tuple[str, ...]], None] | None
                     ) -> Callable[[bytes], dict[str, Any]]:
    """A parser of Confluent-framed Protobuf values, each read with its writer's message
    (:mod:`chandy.formats.protobuf`); not framed, or not of the writer's message: a
    bad record; a writer schema that cannot be read raises ``ProtobufSchemaError``."""
    from chandy.formats.framing import FramingError
    from chandy.formats.protobuf import ProtobufReader, arrow_columns
    from chandy.formats.registry import registry_client

    reader = ProtobufReader(registry_client(dict(decoder.schema_registry)))

    def parse(raw: bytes) -> dict[str, Any]:
        try:
            schema_id, descriptor, values, new = reader.read(raw)
        except FramingError as exc:
            raise BadValue("WireFormatError", str(exc)) from exc
        if new and on_writer is not None:
            on_writer(schema_id, *arrow_columns(descriptor))
        return dict(values)

    return parse

def avro_parser(decoder: ValueDecoder, schema_text: str | None, on_writer: Callable[[int, pa.Schema, tuple[str, ...]], None]
                 | None = None) -> Callable[[bytes], dict[str, Any]]:
    """A parser of Avro records of ``schema_text`` in ``avro_framing`` (None: the Confluent
    framing's writer schema, from the Schema Registry, read as written; ``on_writer`` is
    called with each writer schema's ID and JSON the first time it is read)."""
    import fastavro

    from chandy.formats.avro import reader_schema
    from chandy.schemas.codec import WireFormatError, fingerprint, split_single_object

    definition = json.loads(schema_text) if schema_text is not None else None
    # the same bytes, read into the columns' values
    parsed = fastavro.parse_schema(reader_schema(definition)) if definition is not None else None
    expected_fp = fingerprint(definition) if definition is not None else b""
    framing, schema_id = decoder.avro_framing, decoder.avro_schema_id
    registry = dict(decoder.schema_registry)
    writers: dict[int, Any] = {}

    def writer_schema(found: int) -> Any:
        if found not in writers:
            from confluent_kafka.schema_registry.error import SchemaRegistryError

            from chandy.formats.registry import registry_client

            try:
                text = registry_client(registry).get_schema(found).schema_str
            except SchemaRegistryError as exc:
                if exc.http_status_code == 404:
                    raise BadValue("UnknownSchemaId", f"schema ID {found} is not in the Schema Registry") from exc
                raise
            try:
                definition = json.loads(text)
                writers[found] = fastavro.parse_schema(reader_schema(definition))
            except Exception as exc:  # not Avro (JSON Schema, Protobuf) or not JSON: a bad record
                raise BadValue("UnknownSchemaId", f"schema ID {found} is not an Avro schema: {exc}") from exc
            if on_writer is not None:
                from chandy.formats.avro import AvroValueSchemaError, avro_columns

                try:
                    written, names = avro_columns(definition)
                except AvroValueSchemaError as exc:
                    raise WriterTypeChange(f"schema ID {found}: {exc}") from exc
                on_writer(found, written, names)
        return writers[found]

    def parse_avro(raw: bytes) -> dict[str, Any]:
        body, writer = raw, parsed
        if framing == "single-object":
            try:
                found_fp, body = split_single_object(raw)
            except WireFormatError as exc:
                raise BadValue("WireFormatError", str(exc).split(" (at ")[0]) from exc
            if found_fp != expected_fp:
                raise BadValue("WireFormatError", f"unknown writer schema fingerprint {found_fp.hex()} "
                                              f"(the value schema's is {expected_fp.hex()})")
        elif framing == "confluent":
            try:
                found, body = split(raw)
            except FramingError as exc:
                raise BadValue("WireFormatError", str(exc)) from exc
            if schema_id is not None and found != schema_id:
                raise BadValue("WireFormatError", f"schema ID {found}, expected {schema_id}")
            writer = writer_schema(found) if registry else parsed
        if writer is None:
            raise BadValue("WireFormatError", "no Avro schema to read the record with")
        stream = io.BytesIO(body)
        try:
            reader = parsed if parsed is not None and writer is not parsed else None
            value = fastavro.schemaless_reader(stream, writer, reader)
        except Exception as exc:  # fastavro raises many types on bad bytes
            raise BadValue(type(exc).__name__, f"not Avro of the value schema: {exc}") from exc
        if stream.tell() != len(body):
            raise BadValue("WireFormatError", f"{len(body) - stream.tell()} trailing byte(s) after the Avro record")
        if not isinstance(value, dict):
            raise BadValue("WireFormatError", "the Avro value is not a record")
        return value

    return parse_avro

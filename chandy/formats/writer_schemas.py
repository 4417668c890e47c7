"""What a value's writer schema says before the value is decoded: its record's full name (what
Confluent's ``RecordNameStrategy`` names subjects by; ``--route-by record-name`` routes by it) and,
for a routed JSON Schema table the job creates, the columns of the newest writer schema among its
first records. Each value's schema comes from the Schema Registry by the ID in its Confluent
header (:mod:`chandy.formats.framing`)."""

from __future__ import annotations

import json
from typing import Any, Protocol

import pyarrow as pa

from chandy.formats.framing import HEADER_BYTES, FramingError, schema_id_of, split_protobuf
from chandy.formats.json_schema import JsonSchemaError, json_schema_columns
from chandy.formats.protobuf import ProtobufSchemaError, message_descriptor
from chandy.formats.registry import registry_client


class WriterSchemaOptions(Protocol):
    """What this module reads of a :class:`~chandy.formats.decoder.ValueDecoder`."""

    @property
    def value_format(self) -> str: ...

    @property
    def schema_registry(self) -> tuple[tuple[str, str], ...]: ...


def record_names(values: pa.Array, decoder: WriterSchemaOptions) -> list[str | None]:
    """The full record name of each value's writer schema (Confluent framing; the schema from the
    registry by the value's schema ID): Avro's ``namespace.name``, Protobuf's message full name,
    JSON Schema's ``title`` (what Confluent's serializers name a JSON Schema's record by). None
    for a tombstone, a value not so framed, or a schema ID the registry does not know (such
    records are unrouted)."""
    registry = registry_client(dict(decoder.schema_registry))
    names: dict[tuple[int, tuple[int, ...]], str | None] = {}
    out: list[str | None] = []
    indexes: tuple[int, ...]
    for raw in values.to_pylist():
        schema_id = schema_id_of(raw, minimum=HEADER_BYTES + 1)
        if schema_id is None:
            out.append(None)
            continue
        indexes = (0,)  # Avro: no message indexes
        if decoder.value_format == "protobuf":
            try:
                indexes = tuple(split_protobuf(raw)[1])
            except FramingError:
                out.append(None)
                continue
        key = (schema_id, indexes)
        if key not in names:
            names[key] = _record_name(registry, decoder.value_format, schema_id, list(indexes))
        out.append(names[key])
    return out


def _record_name(registry: Any, value_format: str, schema_id: int, indexes: list[int]) -> str | None:
    """The writer schema's full record name; None for an ID the registry does not know (404) or a
    schema that does not read. A registry that fails otherwise (down, refusing) raises: the task
    fails and is retried, rather than routing the record to the job's table."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    try:
        if value_format == "protobuf":
            return str(message_descriptor(registry, schema_id, indexes).full_name)
        schema = json.loads(registry.get_schema(schema_id).schema_str)
    except SchemaRegistryError as exc:
        if exc.http_status_code == 404:
            return None
        raise
    except (ProtobufSchemaError, ValueError):  # not a schema of this format: the record is unrouted
        return None
    if value_format == "json":  # JSON Schema
        return str(schema["title"]) if isinstance(schema, dict) and schema.get("title") else None
    if not isinstance(schema, dict) or not schema.get("name"):
        return None
    name, namespace = str(schema["name"]), schema.get("namespace")
    return name if "." in name or not namespace else f"{namespace}.{name}"


def newest_json_schema_columns(values: pa.Array, decoder: WriterSchemaOptions) -> tuple[pa.Schema, tuple[str, ...]]:
    """The columns of the newest (highest ID) JSON Schema among ``values``' Confluent-framed
    schema IDs (:func:`~chandy.formats.json_schema.json_schema_columns`); none when no
    value is framed or no such schema has columns (the values' own fields then evolve the table,
    as JSON's do). A registry that fails (down, refusing) raises: the task is retried."""
    from confluent_kafka.schema_registry.error import SchemaRegistryError


    ids = {found for raw in values.to_pylist() if (found := schema_id_of(raw)) is not None}
    registry = registry_client(dict(decoder.schema_registry))
    for schema_id in sorted(ids, reverse=True):
        try:
            return json_schema_columns(registry.get_schema(schema_id).schema_str)
        except SchemaRegistryError as exc:
            if exc.http_status_code != 404:
                raise
        except JsonSchemaError:
            continue
    return pa.schema([]), ()

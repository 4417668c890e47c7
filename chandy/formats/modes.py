"""The modes of :class:`~chandy.formats.decoder.ValueDecoder`, as ``Literal`` types (mypy checks
every value given and compared), and the tuples of their values for the CLI's choices."""

from __future__ import annotations

from typing import Literal, get_args

#: how a value is read (``"raw"``: Kafka's bytes, only the key decoded)
ValueFormat = Literal["json", "avro", "protobuf", "raw"]
#: how an Avro value is framed: Avro's single-object encoding, Confluent's wire format, or none
AvroFraming = Literal["single-object", "confluent", "raw"]
#: what a field without a column does: dropped, a bad record, or a new column (schema evolution)
UnknownFields = Literal["ignore", "error", "add"]
#: what a tombstone (a null value) does: a bad record, skipped, or a row of nulls
Tombstones = Literal["error", "skip", "null"]
#: Kafka Connect's ``errors.tolerance``: fail at a bad record, or keep them as dead letters
ErrorsTolerance = Literal["none", "all"]
#: the values are changes: Debezium's envelope, or upserts (and deletes) of whole rows
ChangeFormat = Literal["debezium", "upsert"]
#: how a JSON value is framed: plain text, or Confluent's JSON Schema serializer's wire format
JsonFraming = Literal["plain", "confluent"]
#: how a key is read (:data:`chandy.formats.keys.KEY_FORMATS`)
KeyFormat = Literal["raw", "string", "json", "avro", "protobuf", "json-schema"]

#: the key formats, in the CLI's order (``--key-format``)
KEY_FORMATS: tuple[KeyFormat, ...] = get_args(KeyFormat)
#: the key formats whose fields become columns (``key_<field>``)
FIELD_KEY_FORMATS: tuple[KeyFormat, ...] = ("json", "avro", "protobuf", "json-schema")

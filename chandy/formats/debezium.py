"""Debezium's change event envelope (``--cdc debezium``), read inside the Spark tasks.

A Debezium change event's value is ``{"before": row, "after": row, "op": ..., "source": ...,
"ts_ms": ...}``; with the JSON converter's ``schemas.enable=true`` it is wrapped as
``{"schema": ..., "payload": {...}}``. ``op`` is ``c`` (create), ``u`` (update), ``r`` (a
snapshot read) or ``d`` (delete; ``before`` holds the deleted row, at least its key); ``t``
(truncate) and ``m`` (message) events carry no row. A delete is followed by a *tombstone*: the
same key with a null value, so that log compaction can drop the key.

The row a change lands is ``after`` (c, u, r) or ``before`` (d); a tombstone is a delete of the
row its key names. Keys are Debezium's key structs: JSON objects (optionally wrapped in
``schema``/``payload``) or Avro records (``--key-schema``, or the Schema Registry with the
Confluent framing). See https://debezium.io/documentation/reference/stable/connectors/postgresql.html#postgresql-events.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from chandy.formats.errors import FormatError

#: the operations that land a row, and the one that deletes it
UPSERT_OPS = ("c", "u", "r")
DELETE_OP = "d"


#: the change column holding a change's operation (the name Debezium's ExtractNewRecordState gives
#: it): ``c``, ``u``, ``r`` or :data:`DELETE`; the lake's merge reads it
OP_COLUMN = "__op"
#: the operation of a delete
DELETE = "d"


class ChangeEventError(FormatError, ValueError):
    """A value that is not a Debezium change event this pipeline can land (the message says why)."""


def unwrap_payload(value: Any) -> Any:
    """``value["payload"]`` when ``value`` is the JSON converter's ``{"schema", "payload"}`` pair,
    else ``value``."""
    if isinstance(value, dict) and "payload" in value and "schema" in value and len(value) == 2:
        return value["payload"]
    return value


def change_row(value: Mapping[str, Any], key: Callable[[], Mapping[str, Any]]) -> tuple[dict[str, Any], str]:
    """The row and operation of a decoded change event ``value`` (the envelope, already unwrapped
    from its payload); ``key`` gives the event's key fields, read only when the row lacks them
    (a delete whose ``before`` is null).

    Raises:
        ChangeEventError: no ``op``, an operation without a row (``t``, ``m``), or no row where
            one is needed.
    """
    op = value.get("op")
    if op not in (*UPSERT_OPS, DELETE_OP):
        shown = "no op field" if op is None else f"op {op!r}"
        raise ChangeEventError(f"not a Debezium row change ({shown}; expected c, u, r or d with before/after)")
    row = value.get("after") if op != DELETE_OP else value.get("before")
    if op == DELETE_OP and row is None:
        row = dict(key())
    if not isinstance(row, dict):
        side = "after" if op != DELETE_OP else "before"
        raise ChangeEventError(f"Debezium {op!r} event without a {side} row")
    return dict(row), op


def json_key(raw: bytes | None) -> dict[str, Any]:
    """A Debezium JSON key's fields (``{"id": 1}`` or ``{"schema": ..., "payload": {"id": 1}}``).

    Raises:
        ChangeEventError: no key, or not a JSON object.
    """
    if raw is None:
        raise ChangeEventError("a change event without a key: its row cannot be found (Debezium keys every event)")
    try:
        value = unwrap_payload(json.loads(raw))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ChangeEventError(f"the key is not JSON ({exc}); give --key-schema for Avro keys") from exc
    if not isinstance(value, dict):
        raise ChangeEventError(f"the key is not a JSON object but {type(value).__name__}")
    return value


def _decimal(raw: Any, scale: int) -> Any:
    """A Connect Decimal: base64 of the big-endian two's-complement unscaled value."""
    import base64
    import decimal

    if not isinstance(raw, str):
        return raw  # decimal.handling.mode=double or string wrote it as a number or its text already
    unscaled = int.from_bytes(base64.b64decode(raw), "big", signed=True)
    return decimal.Decimal(unscaled).scaleb(-scale)


def _instant(value: Any, per_second: int) -> Any:
    import datetime

    if not isinstance(value, int) or isinstance(value, bool):
        return value
    seconds, fraction = divmod(value, per_second)
    stamp = datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    digits = len(str(per_second)) - 1
    return f"{stamp}.{fraction:0{digits}d}Z" if digits else f"{stamp}Z"


def _date(value: Any) -> Any:
    import datetime

    if not isinstance(value, int) or isinstance(value, bool):
        return value
    return (datetime.date(1970, 1, 1) + datetime.timedelta(days=value)).isoformat()


#: Connect's and Debezium's logical types in the JSON converter's schema -> how the payload's value
#: becomes the JSON value Chandy's type mapping reads (a number, an ISO timestamp or date)
_LOGICAL: dict[str, Callable[[Any, Mapping[str, Any]], Any]] = {
    "org.apache.kafka.connect.data.Decimal": lambda v, s: _decimal(v, int(s.get("parameters", {}).get("scale", 0))),
    "io.debezium.data.VariableScaleDecimal": lambda v, s: (
        _decimal(v.get("value"), int(v.get("scale", 0))) if isinstance(v, dict) else v),
    "org.apache.kafka.connect.data.Timestamp": lambda v, s: _instant(v, 1000),
    "io.debezium.time.Timestamp": lambda v, s: _instant(v, 1000),
    "io.debezium.time.MicroTimestamp": lambda v, s: _instant(v, 1_000_000),
    "io.debezium.time.NanoTimestamp": lambda v, s: _instant(v, 1_000_000_000),
    "org.apache.kafka.connect.data.Date": lambda v, s: _date(v),
    "io.debezium.time.Date": lambda v, s: _date(v),
}


def with_logical_types(schema: Any, side: str, row: dict[str, Any]) -> dict[str, Any]:
    """``row`` (the ``side`` field, ``before`` or ``after``, of an envelope whose JSON converter
    ``schema`` is given) with the values of Connect's and Debezium's logical types made plain:
    ``Decimal`` and ``VariableScaleDecimal`` (base64 bytes) become numbers, ``Timestamp``,
    ``MicroTimestamp`` and ``NanoTimestamp`` (epoch counts) ISO timestamps in UTC, ``Date`` (days)
    ISO dates; a row without such fields, or a schema of another shape, is returned as it is."""
    if not isinstance(schema, dict):
        return row
    struct = next((f for f in schema.get("fields", ()) if isinstance(f, dict) and f.get("field") == side), None)
    if not isinstance(struct, dict):
        return row
    for field in struct.get("fields", ()):
        name, logical = field.get("field"), _LOGICAL.get(field.get("name", ""))
        if logical is not None and row.get(name) is not None:
            row[name] = logical(row[name], field)
    return row


#: ``--cdc-op-field`` values (any case) that delete, and those that upsert (Kafka Connect's Iceberg
#: sink's I / U / D, and Debezium's c / u / r / d)
_UPSERT_FIELD_OPS = ("i", "u", "c", "r")


def upsert_row(value: Mapping[str, Any], op_field: str | None) -> tuple[dict[str, Any], str]:
    """The row and operation of a ``--cdc upsert`` value: the value itself is the row; its
    ``op_field`` (Kafka Connect Iceberg sink's ``iceberg.tables.cdc-field``), when given and
    present, says ``D`` (delete) or ``I``/``U``/``C``/``R`` (upsert), in any case; otherwise the
    row is upserted. (A tombstone, a null value, deletes its key's row: the caller's concern.)

    Raises:
        ChangeEventError: an operation field of another value.
    """
    op = "u"
    if op_field is not None and value.get(op_field) is not None:
        given = str(value[op_field]).lower()
        if given == DELETE_OP:
            op = DELETE_OP
        elif given not in _UPSERT_FIELD_OPS:
            raise ChangeEventError(f"field {op_field} is {value[op_field]!r}: --cdc-op-field takes I, U, C, R (upsert) "
                                   "or D (delete)")
    return dict(value), op


def scalar_key(raw: bytes | None) -> Any:
    """A key that is no JSON object (``--cdc upsert`` on a compacted topic keyed by ``42`` or
    ``"a-1"``): its JSON value when it is JSON, else its UTF-8 text; None for no key, a JSON
    object or bytes that are not text."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return None if isinstance(value, dict | list) or value is None else value


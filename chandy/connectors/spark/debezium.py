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

#: the operations that land a row, and the one that deletes it
UPSERT_OPS = ("c", "u", "r")
DELETE_OP = "d"


class ChangeEventError(ValueError):
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

"""JSON Schema value schemas (``--value-format json-schema``): which JSON Schemas become which
columns, and the Confluent framing of the values.

Confluent's ``JSONSerializer`` (and Kafka Connect's ``JsonSchemaConverter``) write a value as the
magic byte ``0``, the 4-byte big-endian schema ID, then the JSON text. The registry's schema of
the subject gives the table's columns; values are then decoded as JSON (Arrow's JSON reader, or
value by value, :mod:`chandy.formats.decoder`), exactly as ``--value-format json``.

The mapping, as Kafka Connect's ``JsonSchemaData`` maps JSON Schema to Connect types (and so as a
Connect sink lands them), with the spec's formats Spark reads as dates and timestamps:

========================================  =============================================
JSON Schema                               column
========================================  =============================================
``boolean``                               boolean
``integer``                               bigint (``connect.type`` int8 / int16 / int32:
                                          tinyint / smallint / int)
``number``                                double (``connect.type`` float32: float)
``string``                                string (``format`` date: date; date-time:
                                          timestamp, UTC)
``string`` with ``contentEncoding`` base64  binary
``enum`` / ``const``                      the type of its values
``object`` with ``properties``            struct, one field per property, in order
``object`` with ``additionalProperties``  map<string, ...> of that schema
``array`` with ``items``                  array<...>
``["null", T]``, ``anyOf`` / ``oneOf``    T (any column may hold null)
of null and one T
``$ref`` to ``#/definitions/...`` or      the schema referred to
``#/$defs/...``
========================================  =============================================

Anything else (a union of two non-null types, an untyped property, a reference outside the
document, a schema that refers to itself) is refused at start with :class:`JsonSchemaError`
naming the property's path.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from chandy.formats.errors import FormatError

#: Kafka Connect's ``connect.type`` hints on ``integer`` and ``number``
_CONNECT_TYPES = {"int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(),
                  "float32": pa.float32(), "float64": pa.float64()}


class JsonSchemaError(FormatError):
    """A JSON Schema that has no columns: not an object with properties, or a property whose
    schema has no column type (the message names its path)."""


def json_schema_columns(schema: str | dict[str, Any]) -> tuple[pa.Schema, tuple[str, ...]]:
    """A JSON Schema (text or parsed) of an object as landed columns: (Arrow fields, each one's
    property name), a property named like a Kafka column landing as ``value_<name>``.

    Raises:
        JsonSchemaError: not JSON, not an object with properties, or a property without a
            column type (see the module docstring).
    """
    from chandy.formats.records import ARROW_SCHEMA

    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise JsonSchemaError(f"the JSON Schema is not JSON: {exc}") from exc
    if not isinstance(schema, dict):
        raise JsonSchemaError("the JSON Schema is not an object")
    root, _ = _resolve(schema, schema, "value", ())
    if _types(root) != ["object"] or not isinstance(root.get("properties"), dict):
        raise JsonSchemaError("the value's JSON Schema must be an object with properties")
    struct = _arrow_type(root, schema, "value", ())
    fields = [f.with_name(f"value_{f.name}") if f.name in ARROW_SCHEMA.names else f for f in struct]
    return pa.schema(fields), tuple(f.name for f in struct)


def _resolve(node: dict[str, Any], document: dict[str, Any], path: str,
             stack: tuple[str, ...]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """``node`` with its ``$ref`` (to this document's ``definitions`` or ``$defs``) followed, and
    the references followed to get there (``stack``, then these)."""
    while "$ref" in node:
        ref = node["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#/"):
            raise JsonSchemaError(f"property {path}: $ref {ref!r} is not in this schema (only #/definitions/... "
                                  "and #/$defs/... are followed)")
        if ref in stack:
            raise JsonSchemaError(f"property {path}: {ref} refers to itself (recursive schemas have no column type)")
        target: Any = document
        for part in ref[2:].split("/"):
            target = target.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(target, dict) else None
        if not isinstance(target, dict):
            raise JsonSchemaError(f"property {path}: $ref {ref} names nothing in the schema")
        stack = (*stack, ref)
        node = target
    return node, stack


def _types(node: dict[str, Any]) -> list[str]:
    """The non-null JSON types ``node`` allows (from ``type``, ``enum`` or ``const``)."""
    kind = node.get("type")
    if kind is None and "enum" in node:
        kind = sorted({_json_type(v) for v in node["enum"]})
    elif kind is None and "const" in node:
        kind = _json_type(node["const"])
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    return [k for k in kinds if k != "null"]


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else "string"


def _arrow_type(node: dict[str, Any], document: dict[str, Any], path: str, stack: tuple[str, ...]) -> pa.DataType:
    node, stack = _resolve(node, document, path, stack)
    for combinator in ("anyOf", "oneOf"):
        if combinator in node:
            branches = [b for b in node[combinator] if not (isinstance(b, dict) and _is_null(b, document))]
            if len(branches) != 1:
                raise JsonSchemaError(f"property {path}: a {combinator} of {len(branches)} non-null schemas has no "
                                      "column type (only null and one schema)")
            return _arrow_type(branches[0], document, path, stack)
    kinds = _types(node)
    if kinds == ["integer", "number"]:
        kinds = ["number"]
    if len(kinds) != 1:
        raise JsonSchemaError(f"property {path}: type {node.get('type', kinds)!r} has no column type (one type, or "
                              "null and one type)")
    kind = kinds[0]
    hint = str(node.get("connect.type"))
    if kind == "boolean":
        return pa.bool_()
    if kind in ("integer", "number"):
        return _CONNECT_TYPES.get(hint, pa.int64() if kind == "integer" else pa.float64())
    if kind == "string":
        form = node.get("format")
        if form == "date":
            return pa.date32()
        if form == "date-time":
            return pa.timestamp("us", tz="UTC")
        return pa.binary() if node.get("contentEncoding") == "base64" else pa.string()
    if kind == "array":
        items = node.get("items")
        if not isinstance(items, dict):
            raise JsonSchemaError(f"property {path}: an array without one items schema has no column type")
        return pa.list_(_arrow_type(items, document, f"{path}[]", stack))
    if kind == "object":
        properties = node.get("properties")
        if isinstance(properties, dict) and properties:
            return pa.struct([pa.field(name, _arrow_type(sub, document, f"{path}.{name}", stack))
                              for name, sub in properties.items()])
        values = node.get("additionalProperties")
        if isinstance(values, dict):
            return pa.map_(pa.string(), _arrow_type(values, document, f"{path}{{}}", stack))
        raise JsonSchemaError(f"property {path}: an object without properties nor an additionalProperties schema "
                              "has no column type")
    raise JsonSchemaError(f"property {path}: unknown JSON type {kind!r}")


def _is_null(node: dict[str, Any], document: dict[str, Any]) -> bool:
    return _resolve(node, document, "", ())[0].get("type") == "null"

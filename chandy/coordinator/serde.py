"""Dataclass <-> Avro value mapping for Chandy's typed messages, records and metadata.

A dataclass maps to an Avro record of the same field names; a ``tuple[X, ...]`` field maps to
an Avro array (of records when X is a dataclass); a ``dict`` field to an Avro map. Fields the
dataclass lacks are dropped when reading (a newer writer), and ``record_version`` is added when
the class declares ``RECORD_VERSION``. The bytes themselves are :mod:`chandy.schemas.codec`'s business.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import types
import typing
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

T = TypeVar("T")


_SCALARS = (str, int, float, bytes, bool, type(None))
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    """The Avro-mapped field names of dataclass ``cls`` (those not ending in ``_``), computed once."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls) if not f.name.endswith("_"))
    return names


def to_avro(obj: Any) -> Any:
    """The Avro value (dicts, lists, scalars) of a dataclass instance, recursively."""
    if isinstance(obj, _SCALARS) and not isinstance(obj, enum.Enum):
        return obj
    cls = type(obj)
    if dataclasses.is_dataclass(cls):
        value = {name: to_avro(getattr(obj, name)) for name in _field_names(cls)}
        version = getattr(cls, "RECORD_VERSION", None)
        if version is not None:
            value["record_version"] = version
        return value
    if isinstance(obj, (tuple, list)):
        return [to_avro(x) for x in obj]
    if isinstance(obj, dict):
        return {k: to_avro(v) for k, v in obj.items()}
    if isinstance(obj, enum.Enum):  # the str enums of statuses and types
        return obj.value
    return obj


class AvroMapped:
    """Mixin for dataclasses with an Avro schema ``SCHEMA``: ``to_avro()`` and ``from_avro(value)``."""

    SCHEMA: ClassVar[str]

    def to_avro(self) -> dict[str, Any]:
        return to_avro(self)

    @classmethod
    def from_avro(cls, value: dict[str, Any]) -> Any:
        return from_avro(cls, value)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _element(tp: Any) -> type | None:
    """The dataclass inside ``tuple[D, ...]``, ``D | None`` or ``D``, if any."""
    origin = typing.get_origin(tp)
    if origin in (tuple, list):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return _element(args[0]) if args else None
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            found = _element(arg)
            if found is not None:
                return found
        return None
    return tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def _converter(tp: Any) -> Callable[[Any], Any] | None:
    """How to turn the Avro value of a field of type ``tp`` into the field's value (None: as is).
    A null Avro value stays None (``from_avro`` never converts it)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):  # X | None: convert as X
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            tp = args[0]
    inner = _element(tp)
    sequence = typing.get_origin(tp) in (tuple, list)
    if inner is not None:
        if sequence:
            return lambda items: tuple(from_avro(inner, x) for x in items)
        return lambda item: None if item is None else from_avro(inner, item)
    if sequence:
        return tuple
    return None


_Plan = tuple[tuple[str, Callable[[Any], Any] | None], ...]
_PLANS: dict[type, _Plan] = {}


def _plan(cls: type) -> _Plan:
    """Per dataclass, computed once: (field name, converter) for every field."""
    plan = _PLANS.get(cls)
    if plan is None:
        hints = _hints(cls)
        fields: tuple[dataclasses.Field[Any], ...] = dataclasses.fields(typing.cast(Any, cls))
        plan = _PLANS[cls] = tuple((f.name, _converter(hints[f.name])) for f in fields)
    return plan


def from_avro(cls: type[T], value: dict[str, Any]) -> T:
    """An instance of dataclass ``cls`` from its Avro value; unknown fields are ignored."""
    kwargs: dict[str, Any] = {}
    for name, convert in _plan(cls):
        if name in value:
            item = value[name]
            kwargs[name] = item if convert is None or item is None else convert(item)
    return cls(**kwargs)

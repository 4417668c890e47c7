"""Values for any Avro schema: a deterministic example, and a hypothesis strategy."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

_LONG = (-(2**63), 2**63 - 1)
_INT = (-(2**31), 2**31 - 1)


def _named(schema: Any, named: dict[str, Any]) -> Any:
    if isinstance(schema, str) and schema in named:
        return named[schema]
    if isinstance(schema, dict) and schema.get("type") in ("record", "enum", "fixed"):
        named[schema["name"]] = schema
    return schema


def example_value(schema: Any, named: dict[str, Any] | None = None, variant: int = 1) -> Any:
    """A deterministic value of ``schema`` (an expanded schema dict); unions take the last branch."""
    named = {} if named is None else named
    schema = _named(schema, named)
    if isinstance(schema, list):
        return example_value(schema[-1], named, variant)
    kind = schema if isinstance(schema, str) else schema["type"]
    if isinstance(kind, (dict, list)):
        return example_value(kind, named, variant)
    if kind == "record":
        return {f["name"]: example_value(f["type"], named, variant) for f in schema["fields"]}
    if kind == "enum":
        return schema["symbols"][variant % len(schema["symbols"])]
    if kind == "array":
        return [example_value(schema["items"], named, variant)]
    if kind == "map":
        return {f"k{variant}": example_value(schema["values"], named, variant)}
    return {
        "null": None, "boolean": True, "int": 7 * variant, "long": 2**40 + variant,
        "float": 1.5, "double": 2.25, "bytes": b"\x00\xff" * variant, "string": f"value-{variant}",
    }[kind]


def values(schema: Any, named: dict[str, Any] | None = None) -> st.SearchStrategy[Any]:
    """A hypothesis strategy of values of ``schema`` (floats without NaN, so equality holds)."""
    named = {} if named is None else named
    schema = _named(schema, named)
    if isinstance(schema, list):
        return st.one_of([values(branch, named) for branch in schema])
    kind = schema if isinstance(schema, str) else schema["type"]
    if isinstance(kind, (dict, list)):
        return values(kind, named)
    if kind == "record":
        return st.fixed_dictionaries({f["name"]: values(f["type"], named) for f in schema["fields"]})
    if kind == "enum":
        return st.sampled_from(schema["symbols"])
    if kind == "array":
        return st.lists(values(schema["items"], named), max_size=3)
    if kind == "map":
        return st.dictionaries(st.text(max_size=5), values(schema["values"], named), max_size=3)
    return {
        "null": st.none(), "boolean": st.booleans(), "int": st.integers(*_INT), "long": st.integers(*_LONG),
        "float": st.floats(width=32, allow_nan=False), "double": st.floats(allow_nan=False),
        "bytes": st.binary(max_size=20), "string": st.text(max_size=20),
    }[kind]

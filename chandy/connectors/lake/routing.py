"""Routing one job's records to many tables (``--route``), as Kafka Connect's Iceberg sink routes
them (``iceberg.tables.route-field`` with per-table ``route-regex``, ``iceberg.tables.dynamic-enabled``).

A rule is ``PATTERN=TABLE``: ``PATTERN`` is a regular expression that must match the whole *route
key*, ``TABLE`` a table URI (Delta or ``iceberg://``) that may name the match's groups as ``$1``,
``${1}`` or ``${name}`` (``$0``: the whole key). A hive-style table path may hold ``=``
(``([a-z]+)=lake/events/region=$1``): the rule splits at the ``=`` that leaves a pattern without
``/``, and a rule that splits two ways is refused, naming both (:meth:`RouteRule.parse`; a
literal ``=`` of a pattern is ``\\=``). The route key is the record's topic, or, with
``--route-field FIELD``, the text of that column's value in the decoded row. Rules are tried in
the order given; the first that matches wins.

- By topic, exact: ``--route 'orders=delta:lake/orders'`` (``delta:`` is optional and only says
  the URI is a Delta table).
- By topic, with a template: ``--route 'cdc\\.sales\\.(.*)=lake/sales/$1'``.
- By a field's value, a static map: ``--route-field region --route 'eu=lake/eu' --route 'us=lake/us'``.
- By a field's value, the value itself as the table's name, checked against an allowed pattern:
  ``--route-field kind --route '([a-z_]{1,40})=iceberg://lake/events.$1'``.

A group's text that would leave the template's place (empty, ``.``, ``..``, or holding ``/``,
``\\``, ``?``, ``#`` or a control character) makes the rule not match: a record never picks a
table outside the pattern its rule allows. A record whose key no rule matches (or whose route
field is null) is *unrouted*; the pipeline lands it in the job's own table or treats it as a bad
record, as ``--unrouted`` says.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from chandy.coordinator.errors import ChandyError

#: a rule's table may start with this, to say it is a Delta table (it is stripped)
DELTA_PREFIX = "delta:"
_GROUP = re.compile(r"\$(?:(\d+)|\{(\w+)\})")
_UNSAFE = re.compile(r"[/\\?#\x00-\x1f]")


class RouteError(ChandyError):
    """A ``--route`` rule that cannot be used: no ``=``, a bad regex, or a group it lacks."""


@dataclasses.dataclass(frozen=True)
class RouteRule:
    """``pattern`` (a regex, matched against the whole route key) to ``table`` (a table URI
    template naming the match's groups as ``$1``, ``${1}``, ``${name}``)."""

    pattern: str
    table: str

    @classmethod
    def parse(cls, text: str) -> RouteRule:
        """A rule from ``PATTERN=TABLE``. A table path may hold ``=`` (hive-style,
        ``lake/events/region=$1``) and so may a regex, so every unescaped ``=`` is tried as the
        split: a *reading* is one whose pattern compiles and whose table names only groups the
        pattern has. One reading: it. Several: the one whose pattern holds no ``/`` (a route key
        is a topic, a record name or a field's text, not a path), when exactly one does; else the
        rule is refused, naming every reading (a literal ``=`` of the pattern is written ``\\=``).

        Raises:
            RouteError: no ``=``, an empty side, no reading (a pattern that is no regex, a table
                naming a group the pattern lacks), or several readings.
        """
        splits = [i for i, c in enumerate(text) if c == "=" and (i == 0 or text[i - 1] != "\\")]
        if not splits:
            raise RouteError(f"--route takes PATTERN=TABLE (e.g. 'cdc\\.sales\\.(.*)=lake/sales/$1'), got {text!r}")
        readings: list[RouteRule] = []
        problems: list[str] = []
        for i in splits:
            pattern, table = text[:i], text[i + 1:].strip()
            if table.startswith(DELTA_PREFIX):
                table = table[len(DELTA_PREFIX):]
            if not pattern or not table:
                continue
            problem = _reading_problem(pattern, table)
            if problem is None:
                readings.append(cls(pattern, table))
            else:
                problems.append(problem)
        if not readings:
            if not problems:
                raise RouteError(f"--route takes PATTERN=TABLE (e.g. 'cdc\\.sales\\.(.*)=lake/sales/$1'), got {text!r}")
            raise RouteError(f"--route {text!r}: {problems[-1]}")
        names = [r for r in readings if "/" not in r.pattern]
        if len(readings) == 1 or len(names) == 1:
            return readings[0] if len(readings) == 1 else names[0]
        told = "; or ".join(f"pattern {r.pattern!r} to table {r.table!r}" for r in readings)
        raise RouteError(f"--route {text!r} splits at more than one '=': {told}; write a literal '=' of the pattern "
                         "as '\\=' so that one reading is left")

    def table_for(self, key: str) -> str | None:
        """The table URI for route key ``key``, or None when the rule does not match it (or a
        group's text is not safe in a table name, see the module docstring)."""
        match = re.fullmatch(self.pattern, key)
        if match is None:
            return None
        unsafe = False

        def group(found: re.Match) -> str:
            nonlocal unsafe
            number, name = found.group(1), found.group(2)
            ref: int | str = int(number) if number else (int(name) if name.isdigit() else name)
            text = match.group(ref) or ""
            if not text or text in (".", "..") or _UNSAFE.search(text):
                unsafe = True
            return text

        table = _GROUP.sub(group, self.table)
        return None if unsafe else table


@dataclasses.dataclass(frozen=True)
class Router:
    """The job's rules, tried in order (picklable: it travels to the Spark tasks).

    ``field``: the column whose value is the route key (None: ``by``); ``by``: ``"topic"``, or
    ``"record-name"``: the full name of the record's writer schema (``--route-by record-name``,
    read from the registry before the value is decoded, see :mod:`chandy.connectors.spark.task.route`).
    """

    rules: tuple[RouteRule, ...]
    field: str | None = None
    by: str = "topic"

    @classmethod
    def parse(cls, rules: Sequence[str], field: str | None = None, by: str = "topic") -> Router:
        """The router of ``--route`` texts, ``--route-field`` and ``--route-by``.

        Raises:
            RouteError: a rule that cannot be used (see :meth:`RouteRule.parse`), or one routing by
                topic whose pattern needs a ``/`` or ``=``, which no Kafka topic name holds (it
                could never match: every record would silently land unrouted).
        """
        parsed = tuple(RouteRule.parse(r) for r in rules)
        if field is None and by == "topic":
            for text, rule in zip(rules, parsed, strict=True):
                literal = re.sub(r"\\.|\[[^\]]*\]", "", rule.pattern)  # escapes and classes may stand for any character
                if "/" in literal or "=" in literal:
                    raise RouteError(f"--route {text!r}: its pattern {rule.pattern!r} needs a '/' or '=', which no Kafka "
                                     "topic name holds, so it could never match (route by a field with --route-field)")
        return cls(parsed, field, by)

    def table_for(self, key: str | None) -> str | None:
        """The table URI of the first rule matching ``key`` (as written in the rule: not yet
        normalised), or None (unrouted)."""
        if key is None:
            return None
        for rule in self.rules:
            table = rule.table_for(key)
            if table is not None:
                return table
        return None

    def destination(self, key: str | None) -> str | None:
        """The normalised table URI of route key ``key``, or None (unrouted)."""
        table = self.table_for(key)
        return None if table is None else _normalized(table)

    def resolved(self) -> Router:
        """This router with each local, relative table template made absolute against the
        current directory (the driver's), so a Spark task resolves it the same wherever it runs."""
        import os

        def absolute(table: str) -> str:
            if "://" in table or os.path.isabs(os.path.expanduser(table)):
                return table
            return os.path.join(os.getcwd(), table)

        return dataclasses.replace(self, rules=tuple(RouteRule(r.pattern, absolute(r.table)) for r in self.rules))

    def keys(self, table: pa.Table) -> pa.ChunkedArray:
        """The route key of each row of ``table``: its topic, or ``field`` as text (null: none).

        Raises:
            RouteError: the route field is not a column, or not of a type with a text form.
        """
        column = self.field or "topic"
        if column not in table.column_names:
            raise RouteError(f"the route field {column} is not a column of the rows (columns: {table.column_names})")
        values = table[column]
        try:
            return values if pa.types.is_string(values.type) else pc.cast(values, pa.string())
        except pa.ArrowException as exc:
            raise RouteError(f"the route field {column} is {values.type}, which has no text form to route by") from exc

    def split(self, table: pa.Table) -> list[tuple[str | None, pa.Table]]:
        """``table``'s rows grouped by destination: (normalised table URI, its rows), and
        (None, the unrouted rows) when some match no rule; in first-appearance order."""
        keys = self.keys(table)
        distinct = pc.unique(keys)
        destination = [self.destination(k) for k in distinct.to_pylist()]
        if len(set(destination)) == 1:
            return [(destination[0], table)]
        index = pc.index_in(keys, value_set=distinct)
        parts: list[tuple[str | None, pa.Table]] = []
        for uri in dict.fromkeys(destination):
            positions = pa.array([i for i, d in enumerate(destination) if d == uri], pa.int32())
            parts.append((uri, table.filter(pc.is_in(index, value_set=positions))))
        return parts


def _reading_problem(pattern: str, table: str) -> str | None:
    """Why ``pattern`` to ``table`` is no reading of a ``--route`` rule (None: it is one): the
    pattern is no regular expression, or the table names a group the pattern lacks."""
    try:
        compiled = re.compile(pattern)
    except re.error as exc:
        return f"{pattern!r} is not a regular expression: {exc}"
    for number, name in _GROUP.findall(table):
        if number and int(number) > compiled.groups:
            return f"the table names ${number} but the pattern has {compiled.groups} group(s)"
        if name and not name.isdigit() and name not in compiled.groupindex:
            return f"the table names ${{{name}}} but the pattern has no group of that name"
        if name and name.isdigit() and int(name) > compiled.groups:
            return f"the table names ${{{name}}} but the pattern has {compiled.groups} group(s)"
    return None


def _normalized(table_uri: str) -> str | None:
    """``table_uri`` normalised (None: not a table URI, which leaves the record unrouted)."""
    from chandy.connectors.lake.uri import TableUriError, normalize_table_uri

    try:
        return normalize_table_uri(table_uri)
    except TableUriError:
        return None

"""Routing one job's records to many tables (``--route``), as Kafka Connect's Iceberg sink routes
them (``iceberg.tables.route-field`` with per-table ``route-regex``, ``iceberg.tables.dynamic-enabled``).

A rule is ``PATTERN=TABLE``: ``PATTERN`` is a regular expression that must match the whole *route
key*, ``TABLE`` a table URI (Delta or ``iceberg://``) that may name the match's groups as ``$1``,
``${1}`` or ``${name}`` (``$0``: the whole key). The route key is the record's topic, or, with
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
        """A rule from ``PATTERN=TABLE``, split at the last ``=`` that is followed by a table
        (a regex may hold ``=``; a table URI seldom does).

        Raises:
            RouteError: no ``=``, an empty side, a pattern that is no regex, or a table naming a
                group the pattern does not have.
        """
        pattern, sep, table = text.rpartition("=")
        if not sep or not pattern or not table.strip():
            raise RouteError(f"--route takes PATTERN=TABLE (e.g. 'cdc\\.sales\\.(.*)=lake/sales/$1'), got {text!r}")
        table = table.strip()
        if table.startswith(DELTA_PREFIX):
            table = table[len(DELTA_PREFIX):]
        rule = cls(pattern, table)
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise RouteError(f"--route {text!r}: {pattern!r} is not a regular expression: {exc}") from exc
        for number, name in _GROUP.findall(table):
            if number and int(number) > compiled.groups:
                raise RouteError(f"--route {text!r}: the table names ${number} but the pattern has "
                                 f"{compiled.groups} group(s)")
            if name and not name.isdigit() and name not in compiled.groupindex:
                raise RouteError(f"--route {text!r}: the table names ${{{name}}} but the pattern has no group "
                                 f"of that name")
        return rule

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
    read from the registry before the value is decoded, see :mod:`chandy.connectors.spark.routed_decoding`).
    """

    rules: tuple[RouteRule, ...]
    field: str | None = None
    by: str = "topic"

    @classmethod
    def parse(cls, rules: Sequence[str], field: str | None = None, by: str = "topic") -> Router:
        """The router of ``--route`` texts, ``--route-field`` and ``--route-by``.

        Raises:
            RouteError: a rule that cannot be used (see :meth:`RouteRule.parse`).
        """
        return cls(tuple(RouteRule.parse(r) for r in rules), field, by)

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


def _normalized(table_uri: str) -> str | None:
    """``table_uri`` normalised (None: not a table URI, which leaves the record unrouted)."""
    from chandy.connectors.lake.uri import TableUriError, normalize_table_uri

    try:
        return normalize_table_uri(table_uri)
    except TableUriError:
        return None

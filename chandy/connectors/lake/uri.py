"""One spelling per table: the normalised, absolute URI that job IDs and sinks are derived from.

``lake/orders`` (from ``/data``), ``/data/lake/orders``, ``/data/lake//orders/``,
``/data/x/../lake/orders`` and ``file:///data/lake/orders`` all name one table and all become
``file:///data/lake/orders``; an object-store URL keeps its scheme and bucket and loses duplicate
and trailing slashes (``S3://bucket//a/`` becomes ``s3://bucket/a``).
"""

from __future__ import annotations

import os
import posixpath
from urllib.parse import unquote, urlsplit

from chandy.coordinator.errors import ChandyError


class TableUriError(ChandyError):
    """A table URI that names no table (empty, or a scheme without a location)."""


def normalize_table_uri(table_uri: str) -> str:
    """The canonical spelling of ``table_uri`` (see the module docstring).

    Local paths become absolute ``file://`` URLs with symbolic links resolved, relative to the
    current directory. Raises:
        TableUriError: the URI is empty or has no location after its scheme.
    """
    text = (table_uri or "").strip()
    if not text:
        raise TableUriError("the table URI is empty")
    if "://" not in text:
        return "file://" + os.path.realpath(os.path.expanduser(text))
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    if scheme == "file":
        path = unquote(parts.netloc + parts.path) if parts.netloc not in ("", "localhost") else unquote(parts.path)
        if not path:
            raise TableUriError(f"{table_uri!r} has no path")
        return "file://" + os.path.realpath(path)
    if not parts.netloc:
        raise TableUriError(f"{table_uri!r} has no bucket or host after {scheme}://")
    path = posixpath.normpath("/" + parts.path.lstrip("/")) if parts.path.strip("/") else ""
    path = "" if path == "/" else path
    return f"{scheme}://{parts.netloc}{path}"


def nested_in(inner: str, outer: str) -> bool:
    """Whether table location ``inner`` lies inside table location ``outer`` (both as
    :func:`normalize_table_uri` spells them; ``iceberg://`` catalog names never nest: their
    locations are the catalog's). A table inside another's directory shares its data files'
    layout: each table's cleanup would list the other's files as its own."""
    if inner.startswith("iceberg://") or outer.startswith("iceberg://"):
        return False
    return inner != outer and inner.startswith(outer.rstrip("/") + "/")


def check_layouts(table_uri: str, other: str) -> None:
    """Refuse two tables of one job of which one lies inside the other's directory (issue 54,
    finding A: a routed table at ``lake/events/region=eu`` beside ``--table lake/events``).

    Raises:
        TableUriError: naming both tables.
    """
    for inner, outer in ((other, table_uri), (table_uri, other)):
        if nested_in(inner, outer):
            raise TableUriError(
                f"table {inner} lies inside the directory of table {outer}: one job's tables must not nest (each "
                "table's data files and cleanup would meet the other's); give the routed table a location of its own, "
                "beside --table, not under it")


class TableLayouts:
    """The locations of one job's tables, each new one checked against all of them
    (:func:`check_layouts`) by its parent directories, not table by table: a thousand routed
    tables cost a thousand lookups per parent, not half a million comparisons."""

    def __init__(self, *table_uris: str) -> None:
        self._tables: dict[str, str] = {}  # location without trailing "/" -> the table's URI
        self._under: dict[str, str] = {}  # a directory holding tables -> one of them
        for uri in table_uris:
            self.add(uri)

    @staticmethod
    def _parents(location: str) -> list[str]:
        parts = location.split("/")
        return ["/".join(parts[:i]) for i in range(1, len(parts))]

    def add(self, table_uri: str) -> None:
        """Take ``table_uri`` (as :func:`normalize_table_uri` spells it) among the job's tables.

        Raises:
            TableUriError: it lies inside another's directory, or holds another (:func:`check_layouts`).
        """
        if table_uri.startswith("iceberg://"):
            return
        location = table_uri.rstrip("/")
        if location in self._tables:
            return
        parents = self._parents(location)
        for parent in parents:
            if parent in self._tables:
                check_layouts(self._tables[parent], table_uri)
        if location in self._under:
            check_layouts(self._under[location], table_uri)
        self._tables[location] = table_uri
        for parent in parents:
            self._under.setdefault(parent, table_uri)


def check_route_layout(table_uri: str, template: str) -> None:
    """Refuse at start a ``--route`` table template whose every table would lie inside
    ``table_uri``'s directory (or be a directory holding it): the part of the template before its
    first group (``$1``, ``${name}``) up to its last ``/`` is fixed, and a group's text never holds
    ``/`` (``chandy.connectors.lake.routing``), so that fixed directory decides.

    Raises:
        TableUriError: naming the rule's table and ``table_uri`` (:func:`check_layouts`).
    """
    if template.startswith("iceberg://") or table_uri.startswith("iceberg://"):
        return
    dynamic = template.find("$")
    if dynamic < 0:
        check_layouts(normalize_table_uri(table_uri), normalize_table_uri(template))
        return
    directory = template[:dynamic].rpartition("/")[0]
    if not directory or directory.endswith("://"):
        return
    fixed, table = normalize_table_uri(directory), normalize_table_uri(table_uri)
    if fixed == table or nested_in(fixed, table):
        raise TableUriError(
            f"--route table {template} lies inside the directory of --table {table} for every record: one job's tables "
            "must not nest (each table's data files and cleanup would meet the other's); give the routed tables a "
            "location of their own, beside --table, not under it")

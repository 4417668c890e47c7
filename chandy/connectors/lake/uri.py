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

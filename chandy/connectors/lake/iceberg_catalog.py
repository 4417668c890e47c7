"""Where an Iceberg table lives: its ``iceberg://`` URI (catalog and identifier), the catalog's
properties (pyiceberg's names)."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from urllib.parse import urlsplit

from chandy.connectors.lake.sink import (
    LakeCommitError,
)
from chandy.connectors.lake.uri import TableUriError

log = logging.getLogger(__name__)


def parse_iceberg_uri(table_uri: str) -> tuple[str, tuple[str, ...], str]:
    """``iceberg://<catalog>/<namespace>.<table>`` -> (catalog, namespace levels, table).

    Raises:
        TableUriError: no catalog, or no namespace and table name separated by a dot.
    """
    parts = urlsplit(table_uri.strip())
    if parts.scheme.lower() != "iceberg" or not parts.netloc:
        raise TableUriError(f"{table_uri!r} is not iceberg://<catalog>/<namespace>.<table>")
    identifier = parts.path.strip("/")
    levels = tuple(identifier.split("."))
    if len(levels) < 2 or not all(levels) or "/" in identifier:
        raise TableUriError(f"{table_uri!r}: the table must be <namespace>.<table> after the catalog, got {identifier!r}")
    return parts.netloc, levels[:-1], levels[-1]


def catalog_properties_for(catalog: str, given: Mapping[str, str] | None = None) -> dict[str, str]:
    """The pyiceberg properties of ``catalog``: ``given`` when they name a catalog type or URI,
    else the catalog's configuration in ``~/.pyiceberg.yaml`` / the environment, else the
    embedded default, a SQL catalog on ``<warehouse>/catalog.db`` (SQLite) with a local warehouse."""
    props = {k: str(v) for k, v in (given or {}).items()}
    if "type" in props or "uri" in props:
        return props
    from pyiceberg.utils.config import Config

    configured = Config().get_catalog_config(catalog)
    if configured and not props:
        return {k: str(v) for k, v in configured.items()}
    warehouse = props.get("warehouse")
    if not warehouse:
        from platformdirs import user_data_dir

        warehouse = os.path.join(user_data_dir("chandy"), "iceberg", catalog)
    if "://" not in warehouse:
        warehouse = "file://" + os.path.realpath(os.path.expanduser(warehouse))
    local = urlsplit(warehouse).path
    if warehouse.startswith("file://"):
        os.makedirs(local, exist_ok=True)
        props.setdefault("uri", f"sqlite:///{local}/catalog.db")
    else:
        raise LakeCommitError(f"iceberg catalog {catalog}: a warehouse on {warehouse} needs a catalog type and uri "
                              "(--catalog-property type=... uri=...): the SQLite default is for local warehouses")
    props["type"] = "sql"
    props["warehouse"] = warehouse
    return props

"""A lake table by its URI: which sink it names (Delta or Iceberg, opened), and the rows a
checkpoint's lake-commit event names.

``iceberg://<catalog>/<namespace>.<table>`` is an Apache Iceberg table in a pyiceberg catalog
(:mod:`chandy.connectors.lake.iceberg`); anything else (a path, ``file://``, ``s3://``, ...) is a Delta
table (:mod:`chandy.connectors.lake.delta`). Both write invisible files from tasks and add them in one
idempotent table commit per checkpoint that records (job ID, checkpoint ID, offsets).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from chandy.connectors.lake.delta import DeltaLakeSink
from chandy.connectors.lake.sink import LakeSink

ICEBERG_SCHEME = "iceberg://"


def is_iceberg(table_uri: str) -> bool:
    """Whether ``table_uri`` names an Iceberg table (``iceberg://catalog/namespace.table``)."""
    return table_uri.strip().lower().startswith(ICEBERG_SCHEME)


def open_sink(table_uri: str, *, partition_by: Sequence[str] = (), storage_options: Mapping[str, str] | None = None,
              catalog_properties: Mapping[str, str] | None = None, add_columns: bool = False,
              location: str | None = None, table_properties: Mapping[str, str] | None = None) -> LakeSink:
    """The sink of ``table_uri``: an :class:`~chandy.connectors.lake.iceberg.IcebergSink` for
    ``iceberg://``, else a :class:`DeltaLakeSink`. ``add_columns``: schema evolution (new
    columns are added to the table, see the sinks). ``location``: the table's root URL, known
    beforehand (Iceberg: the Spark tasks write files without contacting the catalog).
    ``table_properties``: set on the table when the sink creates it (Delta's ``configuration``,
    e.g. ``delta.appendOnly``; Iceberg's properties, e.g. ``format-version``, ``write.*``), and
    the Parquet codec of its files (``write.parquet.compression-codec``, for both formats).

    Raises:
        TableUriError: a URI that names no table; LakeCommitError: an Iceberg URI or catalog
            the sink cannot use (see :class:`~chandy.connectors.lake.iceberg.IcebergSink`).
    """
    if is_iceberg(table_uri):
        from chandy.connectors.lake.iceberg import IcebergSink

        return IcebergSink(table_uri, partition_by=partition_by, catalog_properties=catalog_properties,
                           storage_options=storage_options, add_columns=add_columns, location=location,
                           table_properties=table_properties)
    return DeltaLakeSink(table_uri, partition_by=partition_by, storage_options=storage_options, add_columns=add_columns,
                         table_properties=table_properties)


def read_lake_commit(event: Any, *, storage_options: Mapping[str, str] | None = None,
                     catalog_properties: Mapping[str, str] | None = None) -> Any:
    """Exactly the rows a ``LAKE_COMMITTED`` event's checkpoint landed, as a ``pyarrow.Table``:
    the data files its table version (Delta's version, Iceberg's snapshot ID) added since the
    version before it, read by time travel (see the sinks' ``read_commit``).

    Args:
        event: a :class:`~chandy.coordinator.messages.CheckpointEvent` of type ``LAKE_COMMITTED``
            (from :func:`chandy.subscribe` or ``chandy events wait``).
        storage_options: the object store's settings, as for the pipeline (``--storage-option``).
        catalog_properties: an Iceberg table's catalog properties (``--catalog-property``).

    Raises:
        ValueError: not a ``LAKE_COMMITTED`` event.
        LakeCommitError: the table or that version is gone (vacuumed, expired).
    """
    if getattr(event, "event_type", None) != "LAKE_COMMITTED" or event.table_version is None:
        raise ValueError(f"expected a LAKE_COMMITTED event with a table version, got {getattr(event, 'event_type', event)!r}")
    sink = open_sink(event.table_uri, storage_options=storage_options, catalog_properties=catalog_properties)
    return sink.read_commit(event.table_version, event.previous_table_version)

"""Which sink a table URI names, and what every sink offers.

``iceberg://<catalog>/<namespace>.<table>`` is an Apache Iceberg table in a pyiceberg catalog
(:mod:`chandy.connectors.lake.iceberg`); anything else (a path, ``file://``, ``s3://``, ...) is a Delta
table (:mod:`chandy.connectors.lake.delta`). Both write invisible files from tasks and add them in one
idempotent table commit per checkpoint that records (job ID, checkpoint ID, offsets).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

import pyarrow as pa

from chandy.connectors.lake.delta import DataFile, DeltaLakeSink, TableProgress

ICEBERG_SCHEME = "iceberg://"


class LakeSink(Protocol):
    """What the pipeline, the lake committer and the maintenance commands use of a table (the
    methods of :class:`DeltaLakeSink`, which documents them)."""

    table_uri: str
    root: str
    fs: Any

    def write_files(self, table: pa.Table, *, job_id: str, checkpoint_id: int, subtask: int,
                    attempt: int) -> list[DataFile]: ...

    def exists(self) -> bool: ...

    def committed_checkpoint(self, job_id: str) -> int | None: ...

    def table_fields(self) -> dict[str, Any] | None: ...

    def check_schema(self, data: pa.Schema, table_fields: Mapping[str, Any] | None = None, *, where: str = "") -> None: ...

    def progress(self, job_id: str) -> TableProgress: ...

    def commit(self, job_id: str, checkpoint_id: int, files: Iterable[DataFile], *,
               offsets: Mapping[tuple[str, int], int] | None = None, cluster_id: str | None = None) -> bool: ...

    def missing_files(self, files: Iterable[DataFile]) -> list[str]: ...

    def delete_unreferenced(self, job_id: str, *, keep_checkpoints_after: int | None = None) -> list[str]: ...

    def optimize(self, *, target_size: int | None = None) -> dict[str, Any]: ...

    def vacuum(self, *, retention_hours: float, dry_run: bool = False) -> list[str]: ...

    def read_table(self) -> pa.Table: ...


def is_iceberg(table_uri: str) -> bool:
    """Whether ``table_uri`` names an Iceberg table (``iceberg://catalog/namespace.table``)."""
    return table_uri.strip().lower().startswith(ICEBERG_SCHEME)


def open_sink(table_uri: str, *, partition_by: Sequence[str] = (), storage_options: Mapping[str, str] | None = None,
              catalog_properties: Mapping[str, str] | None = None, add_columns: bool = False,
              location: str | None = None) -> LakeSink:
    """The sink of ``table_uri``: an :class:`~chandy.connectors.lake.iceberg.IcebergSink` for
    ``iceberg://``, else a :class:`DeltaLakeSink`. ``add_columns``: schema evolution (new
    columns are added to the table, see the sinks). ``location``: the table's root URL, known
    beforehand (Iceberg: the Spark tasks write files without contacting the catalog).

    Raises:
        TableUriError: a URI that names no table; LakeCommitError: an Iceberg URI or catalog
            the sink cannot use (see :class:`~chandy.connectors.lake.iceberg.IcebergSink`).
    """
    if is_iceberg(table_uri):
        from chandy.connectors.lake.iceberg import IcebergSink

        return IcebergSink(table_uri, partition_by=partition_by, catalog_properties=catalog_properties,
                           storage_options=storage_options, add_columns=add_columns, location=location)
    return DeltaLakeSink(table_uri, partition_by=partition_by, storage_options=storage_options, add_columns=add_columns)

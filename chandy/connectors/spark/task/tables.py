"""The tables one subtask writes in one checkpoint (:class:`RoutedTables`): the job's table and the
routed ones, each one's sink opened once per process and its columns read once per subtask. One
instance per subtask serves both the decode stage (a routed table's columns decide its decoder)
and the write stage."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from chandy.connectors.lake.sink import DataFile, LakeSchemaError, LakeSink
from chandy.connectors.spark.task.clients import task_sink
from chandy.connectors.spark.task.options import TaskOptions
from chandy.formats.evolution import offset_ranges


class RoutedTables:
    """What one subtask writes to each table of a checkpoint: the job's own table (``sink``) or a
    routed one (opened once per process, its columns read once per subtask and checkpoint), as
    data files, or as change files with ``changes`` (``--cdc``)."""

    def __init__(self, options: TaskOptions) -> None:
        self.options = options
        self._fields: dict[str, Mapping[str, Any] | None] = {}

    def sink(self, table_uri: str, location: str | None = None) -> LakeSink:
        """The sink of the table at ``table_uri`` (pooled per process); ``location``: an Iceberg
        table's root URL, so the task needs no catalog (the job's table: ``table_location``)."""
        o = self.options
        return task_sink(table_uri, partition_by=tuple(o.partition_by), storage_options=o.storage_options,
                         catalog_properties=o.catalog_properties, add_columns=o.add_columns,
                         location=location, table_properties=o.table_properties)

    def fields_of(self, sink: LakeSink) -> Mapping[str, Any] | None:
        """``sink``'s table's columns (name to Delta type JSON; None: no table yet), read once,
        unless the driver sent them (``routed_table_fields``)."""
        if sink.table_uri == self.options.table_uri:
            return self.options.table_fields
        if sink.table_uri in self.options.routed_table_fields:
            return self.options.routed_table_fields[sink.table_uri]
        if sink.table_uri not in self._fields:
            self._fields[sink.table_uri] = sink.table_fields()
        return self._fields[sink.table_uri]

    def fields_of_table(self, table_uri: str) -> Mapping[str, Any] | None:
        """The columns of the table at ``table_uri`` (see :meth:`fields_of`)."""
        return self.fields_of(self.sink(table_uri))

    def write(self, sink: LakeSink, data: pa.Table, subtask: int, attempt: int) -> list[DataFile]:
        """Check ``data`` against ``sink``'s table and write it. Returns the files, each naming
        its table when it is a routed one, and its key columns when it is a change file.

        Raises:
            LakeSchemaError: the data does not fit the table.
        """
        from chandy.formats.debezium import OP_COLUMN, ChangeEventError
        from chandy.formats.decoder import BadRecordError

        o = self.options
        fields = self.fields_of(sink)
        shape = data.schema.remove(data.schema.get_field_index(OP_COLUMN)) if o.changes else data.schema
        if fields is not None:
            try:
                sink.check_schema(shape, fields)
            except LakeSchemaError as exc:  # where: its offset ranges, a group-by read only for the message
                raise LakeSchemaError(f"checkpoint {o.checkpoint_id} ({offset_ranges(data)}): {exc}") from exc
        written = sink.write_files(data, job_id=o.job_id, checkpoint_id=o.checkpoint_id, subtask=subtask, table_fields=fields,
                                   attempt=attempt, partitioned=not o.changes,
                                   log_id=o.log_id)
        changes: dict[str, Any] = {}
        if o.changes and written:
            assert o.decoder is not None
            try:
                changes["id_columns"] = o.decoder.key_fields(data.column("key")[0].as_py())
            except ChangeEventError as exc:
                raise BadRecordError(f"checkpoint {o.checkpoint_id} ({offset_ranges(data)}): the key columns of "
                                     f"table {sink.table_uri} are unknown: {exc} (give --id-columns)") from exc
        if sink.table_uri != o.table_uri:
            changes["table_uri"] = sink.table_uri
        return [dataclasses.replace(f, **changes) for f in written] if changes else written

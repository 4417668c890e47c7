"""The decoder factory: which :class:`~chandy.formats.decoder.ValueDecoder` a job's options give
(a known schema: DDL, Avro, a Schema Registry subject, the table's columns; or inferred from the
first micro-batch's JSON), the output schema the tasks write, its check against the table, and
the decode step of a ``--transform``'s DataFrame (Spark's ``mapInArrow``)."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from chandy.connectors.kafka.source.reader import KafkaRangeReader
from chandy.connectors.kafka.source.split import KafkaPartitionSplit
from chandy.connectors.lake.sink import LakeSchemaError
from chandy.connectors.spark.driver.state import DriverState
from chandy.connectors.spark.options import (
    PipelineError,
)
from chandy.coordinator.errors import ChandyError
from chandy.formats.decoder import KAFKA_COLUMNS, ValueDecoder
from chandy.formats.modes import UnknownFields, ValueFormat
from chandy.formats.registry import task_settings
from chandy.formats.type_mapping import inferred_json_type

log = logging.getLogger(__name__)


class DecoderFactory:
    """Which :class:`~chandy.formats.decoder.ValueDecoder` a job's options give (the value and
    key formats, a schema, a Schema Registry subject, the table's columns), what its output
    schema is, and whether the table takes it. The decoder itself is :attr:`DriverState.decoder`:
    the preflight sets it from a known schema, the first micro-batch infers it otherwise."""

    def __init__(self, state: DriverState) -> None:
        self.state = state

    def _value_columns(self, struct: Any) -> tuple[pa.Schema, tuple[str, ...]]:
        """Spark StructType of the value -> (landed Arrow columns, names in the value)."""
        from pyspark.sql.pandas.types import to_arrow_schema

        arrow = to_arrow_schema(struct, timezone="UTC")
        renamed = [f.with_name(f"value_{f.name}") if f.name in KAFKA_COLUMNS else f for f in arrow]
        return pa.schema(renamed), tuple(f.name for f in arrow)

    def _make_decoder(self, columns: pa.Schema, names: tuple[str, ...], unknown_fields: UnknownFields) -> ValueDecoder:
        opts = self.state.options
        keep = tuple(c for c in KAFKA_COLUMNS if c != "value" or opts.keep_raw_value)
        given = opts.value_format
        value_format: ValueFormat = "json" if given is None or given == "json-schema" else given
        columns, names, key_columns, key_names = self._key_columns(columns, names)
        return ValueDecoder(value_format, columns, names, keep, key_format=opts.key_format, key_columns=key_columns,
                            key_names=key_names, key_as_written=(opts.key_format == "avro" and not opts.key_schema)
                            or opts.key_format == "protobuf",
                            avro_schema=opts.value_schema
                            if opts.value_format == "avro" else None, avro_framing=opts.avro_framing,
                            avro_schema_id=opts.avro_schema_id, unknown_fields=unknown_fields,
                            tombstones=opts.tombstones, errors_tolerance=opts.errors_tolerance,
                            schema_registry=tuple(sorted(task_settings(opts.schema_registry).items()))
                            if opts.schema_registry else (), cdc=opts.cdc,
                            key_schema=opts.key_schema, id_columns=tuple(opts.id_columns), op_field=opts.cdc_op_field,
                            json_framing="confluent" if opts.value_format == "json-schema" else "plain")

    def _key_columns(self, columns: pa.Schema, names: tuple[str, ...]
                     ) -> tuple[pa.Schema, tuple[str, ...], pa.Schema, tuple[str, ...]]:
        """``--key-format json|avro``: (the value's columns without the table's ``key_*`` ones,
        their names, the key's columns known at start, their fields in the key): ``--key-schema``'s
        fields, then the table's ``key_*`` columns (added by earlier keys). Keys read as written
        from a registry, and JSON keys, start from the table's alone (new fields add columns)."""
        from chandy.formats.keys import split_key_columns
        from chandy.formats.modes import FIELD_KEY_FORMATS

        opts = self.state.options
        if opts.key_format not in FIELD_KEY_FORMATS:
            return columns, names, pa.schema([]), ()
        return split_key_columns(columns, names, opts.key_schema if opts.key_format == "avro" else None)

    def from_known_schema(self) -> ValueDecoder | None:
        """The decoder when the value's columns are known before reading: a DDL, an Avro schema,
        a Schema Registry subject's latest version, or (inferred JSON) an existing table's columns;
        with raw values, a decoder of the keys alone (``--key-format``). None: raw values and keys,
        or JSON to infer from the first micro-batch (:meth:`infer`).

        Raises:
            PipelineError: a registry subject whose schema has no columns Chandy can map.
            RegistryError: the Schema Registry refused or did not answer.
            DdlError, AvroValueSchemaError: a value schema that does not parse.
        """
        opts = self.state.options
        if opts.value_format is None:  # raw values: a decoder only for the keys
            if opts.key_format == "raw":
                return None
            raw = self._make_decoder(pa.schema([]), (), "ignore")
            return dataclasses.replace(raw, value_format="raw", keep=KAFKA_COLUMNS)
        if opts.value_format == "avro" and not opts.value_schema:
            return self._decoder_from_registry()
        if opts.value_format == "json-schema" and not opts.value_schema and opts.schema_registry:
            return self._decoder_from_json_schema()
        if opts.value_format == "protobuf":
            return self._decoder_from_protobuf()
        if opts.value_format == "avro":
            from chandy.formats.avro import avro_columns, change_row_schema

            row_schema = change_row_schema(opts.value_schema or "") if opts.cdc == "debezium" else opts.value_schema
            columns, names = avro_columns(row_schema or "")
            return self._make_decoder(columns, names, "ignore")
        if opts.value_schema:
            from chandy.connectors.spark.ddl import parse_ddl

            columns, names = self._value_columns(parse_ddl(opts.value_schema))
            return self._make_decoder(columns, names, "ignore")
        if self.state.table_fields is not None and self.state.transform is None:
            arrow, names = self._table_columns()
            return self._make_decoder(arrow, names, self._unknown_fields)
        return None

    def _table_columns(self) -> tuple[pa.Schema, tuple[str, ...]]:
        """The existing table's value columns (Arrow) and each one's name in the value."""
        from chandy.connectors.spark.task.route import value_columns

        assert self.state.table_fields is not None
        return value_columns(self.state.table_fields)

    def _with_table_columns(self, columns: pa.Schema, names: tuple[str, ...]) -> tuple[pa.Schema, tuple[str, ...]]:
        """``columns`` from a registry's schema, then the existing table's other columns (added by
        earlier writer schemas, which a later version may have dropped): they stay; a column the
        table has widened (int to long, ...) keeps the table's wider type."""
        if self.state.table_fields is None:
            return columns, names
        from chandy.formats.type_mapping import widens

        table, table_names = self._table_columns()
        in_table = dict(zip(table_names, table, strict=True))
        columns = pa.schema([in_table[n] if n in in_table and widens(f.type, in_table[n].type) else f
                             for f, n in zip(columns, names, strict=True)])
        extra = [(f, n) for f, n in zip(table, table_names, strict=True) if n not in names]
        return pa.schema(list(columns) + [f for f, _ in extra]), names + tuple(n for _, n in extra)

    def _registry_columns(self, schema_type: str, to_columns: Callable[[Any], tuple[pa.Schema, tuple[str, ...]]]
                          ) -> tuple[Any, pa.Schema, tuple[str, ...]]:
        """(the latest version of the value subject, which must be a ``schema_type`` schema, and
        the columns ``to_columns`` makes of it followed by the table's other columns, with each
        one's name in the value), logged; the schema's errors (a ``ChandyError``) as one line
        naming the registry, the subject, the version and the schema ID. Routed per subject
        without ``--value-subject`` (``PipelineOptions.routes_per_subject``): (None, the table's
        columns), no subject read.

        Raises:
            PipelineError: as :func:`~chandy.formats.registry.latest_schema`, or a schema
                that has no columns.
        """
        from chandy.formats.registry import latest_schema

        opts = self.state.options
        subject, url = opts.resolved_value_subject, opts.schema_registry.get("url")
        if opts.routes_per_subject and not opts.value_subject:  # each table's columns come from its own records
            columns, names = self._with_table_columns(pa.schema([]), ())
            log.info("job %s: routed records are read as written from %s, each table's columns from its own writer "
                     "schemas (no subject gives the job's table its columns)", self.state.job_id, url)
            return None, columns, names
        latest = latest_schema(opts.schema_registry, subject, schema_type)
        try:
            columns, names = to_columns(latest)
        except ChandyError as exc:  # AvroValueSchemaError, JsonSchemaError, ProtobufSchemaError
            raise PipelineError(f"Schema Registry {url}: subject {subject} version {latest.version} "
                                f"(schema ID {latest.schema_id}): {exc}") from exc
        columns, names = self._with_table_columns(columns, names)
        log.info("job %s: the table's schema is subject %s version %d (schema ID %d, %s) from %s", self.state.job_id,
                 subject, latest.version, latest.schema_id, schema_type, url)
        return latest, columns, names

    def _decoder_from_registry(self) -> ValueDecoder:
        """Avro with a Schema Registry and no ``--value-schema``: the subject's latest version
        is the table's schema. The columns are its fields (then the table's other columns); each
        record is read with its own writer schema (``ValueDecoder.as_written``, not with
        ``--cdc debezium``, whose rows are resolved against the latest version).

        Raises:
            PipelineError: see :meth:`_registry_columns`.
        """

        from chandy.formats.avro import avro_columns, change_row_schema

        debezium = self.state.options.cdc == "debezium"
        latest, columns, names = self._registry_columns("AVRO", lambda latest: avro_columns(
            change_row_schema(latest.schema.schema_str) if debezium else latest.schema.schema_str))
        decoder = self._make_decoder(columns, names, "ignore" if self.state.options.cdc else self._avro_unknown_fields)
        return dataclasses.replace(decoder, avro_schema=latest and latest.schema.schema_str, as_written=not debezium,
                                   columns_schema_id=latest and latest.schema_id, widen_columns=self._widen_columns)

    def _decoder_from_json_schema(self) -> ValueDecoder:
        """``--value-format json-schema`` with a Schema Registry and no ``--value-schema``: the
        subject's latest JSON Schema gives the columns (:mod:`chandy.formats.json_schema`),
        then the table's other columns; fields without a column evolve the table as JSON's do.

        Raises:
            PipelineError: see :meth:`_registry_columns`; or ``--cdc debezium`` (give the row's
                DDL with ``--value-schema``).
        """
        from chandy.formats.json_schema import json_schema_columns

        if self.state.options.cdc == "debezium":
            raise PipelineError("--cdc debezium with --value-format json-schema takes the row's columns from "
                                "--value-schema (Spark DDL), not from the registry's envelope schema")
        _, columns, names = self._registry_columns("JSON", lambda latest: json_schema_columns(latest.schema.schema_str))
        return self._make_decoder(columns, names, self._unknown_fields)

    def _decoder_from_protobuf(self) -> ValueDecoder:
        """``--value-format protobuf``: the first message of the subject's latest schema gives the
        columns (:mod:`chandy.formats.protobuf`), then the table's other columns; each
        record is read with its writer's message, as Avro's ``as_written``.

        Raises:
            PipelineError: see :meth:`_registry_columns` (a schema Chandy cannot read or map).
        """

        from chandy.formats.protobuf import arrow_columns, message_descriptor
        from chandy.formats.registry import registry_client

        registry = registry_client(self.state.options.schema_registry)
        latest, columns, names = self._registry_columns(
            "PROTOBUF", lambda latest: arrow_columns(message_descriptor(registry, latest.schema_id, [0])))
        decoder = self._make_decoder(columns, names, self._avro_unknown_fields)
        return dataclasses.replace(decoder, as_written=True, columns_schema_id=latest and latest.schema_id,
                                   widen_columns=self._widen_columns)

    @property
    def _avro_unknown_fields(self) -> UnknownFields:
        """Registry-driven Avro: fields a writer schema adds become columns with schema evolution
        (not with a transform, whose Spark schema is fixed); otherwise they are dropped, as Avro's
        resolution against the starting schema would."""
        return "add" if self.state.add_columns and self.state.transform is None else "ignore"

    @property
    def _widen_columns(self) -> bool:
        """A writer schema widens a column (int to long, ...) when the table can: an Iceberg table
        with schema evolution (Iceberg's type promotion); delta-rs cannot write Delta's type widening."""
        return self._avro_unknown_fields == "add" and bool(getattr(self.state.sink, "widens_columns", False))

    def output_schema(self) -> pa.Schema:
        """The Arrow schema the tasks write: the decoder's columns, or the raw Kafka record's
        (:data:`~chandy.formats.records.ARROW_SCHEMA`) without a decoder."""
        from chandy.formats.records import ARROW_SCHEMA

        return self.state.decoder.output_schema if self.state.decoder is not None else ARROW_SCHEMA

    def check_output_schema(self, schema: pa.Schema) -> None:
        """Whether the table takes ``schema`` (without ``--cdc``'s operation column): the sink's
        :meth:`~chandy.connectors.lake.sink.SchemaChecked.check_schema` against the table's columns.

        Raises:
            PipelineError: a column the table has with another type (``LakeSchemaError``'s message).
        """
        from chandy.formats.debezium import OP_COLUMN

        if OP_COLUMN in schema.names and self.state.options.cdc:  # the change's operation is not a column of the table
            schema = schema.remove(schema.get_field_index(OP_COLUMN))
        try:
            self.state.sink.check_schema(schema, self.state.table_fields)
        except LakeSchemaError as exc:
            raise PipelineError(str(exc)) from exc

    def infer(self, ranges: dict[tuple[str, int], KafkaPartitionSplit]) -> ValueDecoder:
        """JSON without a schema or a table: infer the columns from up to 1,000 values of the
        first micro-batch's ``ranges`` (pyarrow's JSON inference, read with the range reader);
        later fields without a column are bad records, or new columns with schema evolution.

        Raises:
            PipelineError: none of those values is a JSON object.
        """
        import io

        from pyarrow import json as pa_json

        lines = []
        for raw in self._sample(ranges):
            try:
                if self.state.options.value_format == "json-schema":
                    from chandy.formats.framing import split

                    raw = split(raw)[1]
                value = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                continue
            if self.state.options.cdc == "debezium" and isinstance(value, dict):  # the row's columns, not the envelope's
                from chandy.formats.debezium import unwrap_payload

                envelope = unwrap_payload(value)
                value = (envelope.get("after") or envelope.get("before")) if isinstance(envelope, dict) else None
            if isinstance(value, dict):
                lines.append(json.dumps(value))
        if not lines:
            raise PipelineError("cannot infer the JSON value schema: the first micro-batch has no JSON object "
                                "(give --value-schema)")
        inferred = pa_json.read_json(io.BytesIO("\n".join(lines).encode())).schema
        inferred = pa.schema([f.with_type(inferred_json_type(f.type)) for f in inferred])
        renamed = [f.with_name(f"value_{f.name}") if f.name in KAFKA_COLUMNS else f for f in inferred]
        return self._make_decoder(pa.schema(renamed), tuple(f.name for f in inferred), self._unknown_fields)

    @property
    def _unknown_fields(self) -> UnknownFields:
        """JSON fields without a column (columns inferred or from the table): new columns with
        schema evolution (not with a transform, whose Spark schema is fixed), else bad records."""
        return "add" if self.state.add_columns and self.state.transform is None else "error"

    def _sample(self, ranges: dict[tuple[str, int], KafkaPartitionSplit], limit: int = 1000) -> list[bytes]:
        reader = KafkaRangeReader(self.state.options.bootstrap_servers, self.state.options.consumer_overrides)
        values: list[bytes] = []
        try:
            for split in ranges.values():
                for message in (m for batch in reader.read_batches(
                        split, fail_on_data_loss=self.state.options.fail_on_data_loss) for m in batch):
                    if message.value() is not None:
                        values.append(message.value())
                    if len(values) >= limit:
                        return values
        finally:
            reader.close()
        return values

    @staticmethod
    def decode_frame(df: Any, task: Any) -> Any:
        """``df`` (the ``chandy_kafka_ranges`` data source's Kafka records) decoded by
        ``task.decoder`` in the tasks (``mapInArrow``; bad records go to the dead-letter files of
        :mod:`chandy.connectors.spark.task.dead_letters`), for a ``--transform`` to reshape."""
        from pyspark.sql.pandas.types import from_arrow_schema

        from chandy.connectors.spark.task.decode import decode_with_dead_letters
        from chandy.connectors.spark.task.run import task_context

        def decode(batches: Any) -> Any:
            yield from decode_with_dead_letters(task, batches, task_context().partitionId())

        return df.mapInArrow(decode, from_arrow_schema(task.decoder.output_schema, prefer_timestamp_ntz=True))

"""Kafka records' keys and values into Arrow columns, with no Spark and no lake: one module per
format (:mod:`~chandy.formats.avro`, :mod:`~chandy.formats.protobuf`,
:mod:`~chandy.formats.json_schema`, plain JSON in :mod:`~chandy.formats.json_batch`), the
Confluent wire header in :mod:`~chandy.formats.framing`, the Schema Registry client in
:mod:`~chandy.formats.registry`, the Arrow type mapping in :mod:`~chandy.formats.type_mapping`,
keys, Debezium change events, schema evolution rules, and the one interface a task calls:
:class:`~chandy.formats.decoder.ValueDecoder` and :func:`~chandy.formats.decoder.decode_batches`.
Every error is a :class:`~chandy.formats.errors.FormatError`."""

"""Issue 45: a writer schema that widens a column (int to long, float to double, a decimal's
precision up) widens it, where the table can (Iceberg's type promotion), at the decoder, across a
micro-batch's batches and parts, and in the sink's schema checks; a narrowing, a scale change or a
Delta table still fails in one line. Without servers."""

from __future__ import annotations

import decimal
import json

import pyarrow as pa
import pytest

from chandy.connectors.lake.sink import LakeSchemaError, evolves, merge_schemas, schema_differences
from chandy.formats.avro import avro_columns
from chandy.formats.decoder import ValueDecoder
from chandy.formats.evolution import SchemaChangeError, concat_evolving
from chandy.formats.records import ARROW_SCHEMA
from chandy.formats.type_mapping import widens, wider
from tests.fixtures.avro_values import confluent_framed

_PRICE = {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}
V1 = {"type": "record", "name": "Order", "fields": [
    {"name": "id", "type": "long"}, {"name": "qty", "type": "int"}, {"name": "price", "type": _PRICE},
    {"name": "ratio", "type": "float"}]}
V2 = {**V1, "fields": [V1["fields"][0], {"name": "qty", "type": "long"},
                       {"name": "price", "type": {**_PRICE, "precision": 12}}, {"name": "ratio", "type": "double"}]}
NARROW = {**V1, "fields": [V1["fields"][0], {"name": "qty", "type": "int"}, V1["fields"][2],
                           {"name": "ratio", "type": "float"}]}
RESCALED = {**V1, "fields": [V1["fields"][0], V1["fields"][1], {"name": "price", "type": {**_PRICE, "scale": 3}},
                             V1["fields"][3]]}


def test_the_widenings_are_icebergs_type_promotions() -> None:
    assert widens(pa.int32(), pa.int64()) and widens(pa.float32(), pa.float64())
    assert widens(pa.decimal128(10, 2), pa.decimal128(12, 2))
    assert not widens(pa.int64(), pa.int32()) and not widens(pa.decimal128(10, 2), pa.decimal128(12, 3))
    assert not widens(pa.int32(), pa.float64()) and not widens(pa.string(), pa.binary())
    assert wider(pa.int64(), pa.int32()) == pa.int64() and wider(pa.int32(), pa.string()) is None


def _registry(name: str) -> tuple[dict[str, str], list[int]]:
    from confluent_kafka.schema_registry import Schema

    from chandy.formats.registry import registry_client

    settings = {"url": f"mock://{name}"}
    client = registry_client(settings)
    ids = [client.register_schema(f"{name}-{i}", Schema(json.dumps(s), "AVRO"))
           for i, s in enumerate((V1, V2, NARROW, RESCALED))]
    return settings, ids



def _batch(values: list[bytes], first_offset: int = 0) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(
        [{"key": None, "value": v, "topic": "t", "partition": 0, "offset": first_offset + i, "timestamp": None,
          "timestamp_type": 0, "headers": []} for i, v in enumerate(values)], schema=ARROW_SCHEMA)


def _decoder(settings: dict[str, str], schema_id: int, *, widen: bool) -> ValueDecoder:
    columns, names = avro_columns(V1)
    return ValueDecoder("avro", columns, names, ("offset",), avro_schema=json.dumps(V1), avro_framing="confluent",
                        schema_registry=tuple(sorted(settings.items())), unknown_fields="add", as_written=True,
                        columns_schema_id=schema_id, widen_columns=widen)


def test_a_writer_schema_widens_the_batchs_columns_and_older_records_read_into_them() -> None:
    settings, ids = _registry("widen-decoder")
    decoder = _decoder(settings, ids[0], widen=True)
    old = {"id": 1, "qty": 7, "price": decimal.Decimal("12345678.91"), "ratio": 0.5}
    new = {"id": 2, "qty": 2**40, "price": decimal.Decimal("9999999999.99"), "ratio": 0.1}
    decoded, bad, _ = decoder.decode(_batch([confluent_framed(ids[0], V1, old), confluent_framed(ids[1], V2, new)]))
    assert bad is None
    assert decoded.schema.field("qty").type == pa.int64() and decoded.schema.field("ratio").type == pa.float64()
    assert decoded.schema.field("price").type == pa.decimal128(12, 2)
    assert decoded.to_pylist() == [{"offset": 0, **old}, {"offset": 1, **new}]
    # a batch of the older writer only stays narrow (fast path); the micro-batch unifies them
    older, bad, _ = decoder.decode(_batch([confluent_framed(ids[0], V1, old)], first_offset=2))
    assert bad is None and older.schema.field("qty").type == pa.int32()
    table = concat_evolving([older, decoded])
    assert table.schema.field("qty").type == pa.int64() and table.column("qty").to_pylist() == [7, 7, 2**40]


@pytest.mark.parametrize("widen", [True, False])
def test_a_narrowing_a_rescaled_decimal_or_a_delta_table_fails_naming_the_field(widen) -> None:
    settings, ids = _registry(f"widen-refused-{widen}")
    columns, names = avro_columns(V2)
    decoder = ValueDecoder("avro", columns, names, ("offset",), avro_schema=json.dumps(V2), avro_framing="confluent",
                           schema_registry=tuple(sorted(settings.items())), unknown_fields="add", as_written=True,
                           columns_schema_id=ids[1], widen_columns=widen)
    # V1's int into V2's long column is Avro's promotion, not a change
    assert decoder.decode(_batch([confluent_framed(ids[0], V1, {"id": 1, "qty": 3, "price": decimal.Decimal("1.00"),
                                                         "ratio": 1.0})]))[0].column("qty").to_pylist() == [3]
    narrow_columns, narrow_names = avro_columns(V1)
    narrow = ValueDecoder("avro", narrow_columns, narrow_names, ("offset",), avro_schema=json.dumps(V1),
                          avro_framing="confluent", schema_registry=tuple(sorted(settings.items())),
                          unknown_fields="add", as_written=True, columns_schema_id=ids[0], widen_columns=widen)
    rescaled = confluent_framed(ids[3], RESCALED, {"id": 1, "qty": 1, "price": decimal.Decimal("1.000"), "ratio": 1.0})
    with pytest.raises(SchemaChangeError, match=rf"offset 0: field price changed type: its column is decimal128\(10, 2\) "
                                                rf"\(schema ID {ids[0]}\) but schema ID {ids[3]} writes decimal128\(10, 3\)"):
        narrow.decode(_batch([rescaled]))
    widened = confluent_framed(ids[1], V2, {"id": 1, "qty": 1, "price": decimal.Decimal("1.00"), "ratio": 1.0})
    if widen:
        assert narrow.decode(_batch([widened]))[0].schema.field("qty").type == pa.int64()
    else:
        with pytest.raises(SchemaChangeError, match="field qty changed type.*a Delta table cannot widen a column"):
            narrow.decode(_batch([widened]))


def test_the_sinks_schema_checks_take_a_widening_only_when_the_table_can() -> None:
    table = {"id": "long", "qty": "integer", "price": "decimal(10,2)"}
    wide = pa.schema([("id", pa.int64()), ("qty", pa.int64()), ("price", pa.decimal128(12, 2))])
    narrow = pa.schema([("id", pa.int64()), ("qty", pa.int32()), ("price", pa.decimal128(10, 2))])
    assert schema_differences(wide, table, add_columns=True, widen=True) == []
    assert schema_differences(wide, table, add_columns=True) == [
        "column qty is long in the data but integer in the table",
        "column price is decimal(12,2) in the data but decimal(10,2) in the table"]
    assert schema_differences(narrow, {**table, "qty": "long", "price": "decimal(12,2)"}, widen=True) == []
    assert schema_differences(pa.schema([("qty", pa.string())]), table, widen=True) == [
        "column qty is string in the data but integer in the table"]
    assert merge_schemas([narrow, wide], widen=True) == wide and merge_schemas([wide, narrow], widen=True) == wide
    with pytest.raises(LakeSchemaError, match="column qty is long in one file but integer in another"):
        merge_schemas([narrow, wide])
    assert evolves(wide, table) and not evolves(narrow, table) and not evolves(narrow, {**table, "qty": "long"})


def test_an_iceberg_table_widened_still_lists_and_cleans_its_files(tmp_path) -> None:
    """Found by the slow kill-during-widening test: once Iceberg widened ``qty`` (int to long), a
    restore's cleanup listed the table's files with pyiceberg's ``inspect`` tables, which decode
    the older files' 4-byte int bounds as longs and fail (``struct.error: unpack requires a buffer
    of 8 bytes``): the job could never restore again. Files of both widths, a commit each, then
    the listings a restore reads and its cleanup (an unreferenced file of an aborted checkpoint)."""
    from chandy.connectors.lake.tables import open_sink

    job = "0123456789abcdef0123456789abcdef"
    sink = open_sink("iceberg://local/lake.widened", catalog_properties={"warehouse": str(tmp_path / "wh")},
                     add_columns=True)

    def rows(qty_type: pa.DataType, start: int) -> pa.Table:
        return pa.table({"offset": pa.array([start, start + 1], pa.int64()),
                         "qty": pa.array([-start, 2**40 if qty_type == pa.int64() else 7], qty_type)})

    for checkpoint, qty_type in ((1, pa.int32()), (2, pa.int64())):
        files = sink.write_files(rows(qty_type, 2 * checkpoint), job_id=job, checkpoint_id=checkpoint, subtask=0,
                                 attempt=0)
        assert sink.commit(job, checkpoint, files, offsets={("t", 0): 2 * checkpoint + 2})
    assert dict(sink.table_fields() or {})["qty"] == "long"
    orphan = sink.write_files(rows(pa.int64(), 6), job_id=job, checkpoint_id=3, subtask=0, attempt=0)
    assert len(sink.referenced_files()) == 2
    assert sink.delete_unreferenced(job) == [orphan[0].path]
    assert sorted(sink.read_table().column("qty").to_pylist()) == [-4, -2, 7, 2**40]

"""Issue 47 (partition transforms, as Iceberg names them): ``--partition-by day(ts)``,
``hour(ts)``, ``bucket(N, col)``, ``truncate(W, col)`` add their partition column to every row and
partition the table by it, in Delta and Iceberg, read back with deltalake and pyiceberg; the
bucket hash is checked against the Iceberg spec's own examples (Appendix B). No Kafka, no Spark."""

from __future__ import annotations

import datetime
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable
from pyiceberg.catalog import load_catalog

from chandy.connectors.lake.partitioning import PartitionSpecError, parse_partition_by, with_partition_columns
from chandy.connectors.lake.tables import open_sink
from chandy.connectors.spark.options import PipelineError, PipelineOptions

JOB = "0123456789abcdef0123456789abcdef"
UTC = datetime.UTC


def _rows() -> pa.Table:
    stamps = [datetime.datetime(2026, 9, 21, 23, 59, tzinfo=UTC), datetime.datetime(2026, 9, 22, 0, 1, tzinfo=UTC),
              datetime.datetime(2026, 9, 22, 0, 30, tzinfo=UTC), None]
    return pa.table({"topic": ["t"] * 4, "partition": pa.array([0] * 4, pa.int32()),
                     "offset": pa.array(range(4), pa.int64()), "ts": pa.array(stamps, pa.timestamp("us", tz="UTC")),
                     "id": pa.array([34, 35, -7, 1], pa.int64()), "name": ["iceberg", "delta", "ic", None]})


def test_the_bucket_hash_is_the_iceberg_specs() -> None:
    """The spec's Appendix B hashes (int and long 34: 2017239379; "iceberg": 1210000089; date
    2017-11-16: -653330422; timestamp 2017-11-16T22:31:08: -2047944441; bytes 00010203:
    -188683207), bucketed as (hash & Integer.MAX_VALUE) % N."""
    def bucket(values: pa.Array, n: int = 16) -> int:
        (field,) = parse_partition_by([f"bucket({n}, v)"])
        return with_partition_columns(pa.table({"v": values}), [field]).column("v_bucket")[0].as_py()

    expected = {2017239379: 3, 1210000089: 9, -653330422: 10, -2047944441: 7, -188683207: 9}
    assert bucket(pa.array([34], pa.int32())) == bucket(pa.array([34], pa.int64())) == expected[2017239379]
    assert bucket(pa.array(["iceberg"])) == expected[1210000089]
    assert bucket(pa.array([datetime.date(2017, 11, 16)])) == expected[-653330422]
    assert bucket(pa.array([datetime.datetime(2017, 11, 16, 22, 31, 8)], pa.timestamp("us"))) == expected[-2047944441]
    assert bucket(pa.array([datetime.datetime(2017, 11, 16, 22, 31, 8, tzinfo=UTC)],
                           pa.timestamp("us", tz="UTC"))) == expected[-2047944441]
    assert bucket(pa.array([b"\x00\x01\x02\x03"])) == expected[-188683207]
    assert all((h & 0x7FFFFFFF) % 16 == b for h, b in expected.items())


def test_transforms_give_their_partition_columns() -> None:
    fields = parse_partition_by(["year(ts)", "month(ts)", "day(ts)", "hour(ts)", "truncate(2, name)",
                                 "truncate(10, id)", "topic"])
    rows = with_partition_columns(_rows(), fields).to_pylist()
    assert [(r["ts_year"], r["ts_month"], r["ts_day"]) for r in rows[:2]] == [
        (2026, "2026-09", datetime.date(2026, 9, 21)), (2026, "2026-09", datetime.date(2026, 9, 22))]
    assert rows[2]["ts_hour"] == datetime.datetime(2026, 9, 22, 0, 0, tzinfo=UTC)
    assert [r["name_trunc"] for r in rows] == ["ic", "de", "ic", None]
    assert [r["id_trunc"] for r in rows] == [30, 30, -10, 0]  # Iceberg's truncate rounds down, also below 0
    assert rows[3]["ts_day"] is None and rows[3]["ts_hour"] is None
    for bad, why in ((["day(ts, x)"], "expected a column or transform"), (["week(ts)"], "unknown transform 'week'"),
                     (["bucket(id)"], "bucket takes a width first: bucket\\(16, id\\)"),
                     (["day(2, ts)"], "day takes only a column"), (["day(ts)", "day(ts)"], "given twice")):
        with pytest.raises(PartitionSpecError, match=why):
            parse_partition_by(bad)
    with pytest.raises(PartitionSpecError, match="name is string, not a timestamp or a date"):
        with_partition_columns(_rows(), parse_partition_by(["day(name)"]))
    with pytest.raises(PipelineError, match="unknown transform 'week'"):
        PipelineOptions(table_uri="t", bootstrap_servers="k:1", topics=("a",), partition_by=("week(ts)",))


def test_a_delta_table_partitioned_by_day_and_bucket(tmp_path: Path) -> None:
    sink = open_sink(str(tmp_path / "t"), partition_by=("day(ts)", "bucket(4, id)"))
    files = sink.write_files(_rows(), job_id=JOB, checkpoint_id=1, subtask=0, attempt=0)
    assert sink.commit(JOB, 1, files, offsets={("t", 0): 4})
    table = DeltaTable(str(tmp_path / "t"))
    assert table.metadata().partition_columns == ["ts_day", "id_bucket"]
    rows = table.to_pyarrow_table().to_pylist()
    assert sorted((r["offset"], r["ts_day"]) for r in rows) == [
        (0, datetime.date(2026, 9, 21)), (1, datetime.date(2026, 9, 22)), (2, datetime.date(2026, 9, 22)), (3, None)]
    assert {p.parent.parent.name for p in (tmp_path / "t").rglob("*.parquet")} >= {"ts_day=2026-09-21",
                                                                                  "ts_day=2026-09-22"}
    # a reader prunes by the partition column
    one_day = table.to_pyarrow_table(filters=[("ts_day", "=", datetime.date(2026, 9, 22))])
    assert sorted(one_day.column("offset").to_pylist()) == [1, 2]


def test_delta_partition_transforms_are_generated_columns_delta_rs_agrees_with(tmp_path: Path) -> None:
    """Delta's generated columns (``delta.generationExpression``, writer protocol 4): ``year``,
    ``month``, ``day``, ``hour`` and ``truncate`` partition columns carry the expression Spark and
    delta-rs both evaluate; ``bucket`` stays a plain column. delta-rs checks every row it
    writes against the expression (``(value <=> expression) IS TRUE``): appending Chandy's rows,
    partition columns included, through delta-rs's own writer proves the two agree, on values
    before 1970, negative integers and multi-byte strings too."""
    from deltalake import write_deltalake

    entries = ("day(ts)", "hour(ts)", "truncate(2, name)", "truncate(10, id)", "year(ts)", "month(ts)", "bucket(4, id)")
    sink = open_sink(str(tmp_path / "t"), partition_by=entries)
    rows = _rows()
    files = sink.write_files(rows, job_id=JOB, checkpoint_id=1, subtask=0, attempt=0)
    assert sink.commit(JOB, 1, files, offsets={("t", 0): 4})
    table = DeltaTable(str(tmp_path / "t"))
    assert table.protocol().min_writer_version >= 4
    expressions = {f.name: f.metadata.get("delta.generationExpression") for f in table.schema().fields}
    assert expressions["ts_day"] == "CAST(`ts` AS DATE)"
    assert expressions["ts_hour"] == "DATE_TRUNC('HOUR', `ts`)"
    assert expressions["name_trunc"] == "SUBSTRING(`name`, 1, 2)"
    assert expressions["id_trunc"] == "`id` - (((`id` % 10) + 10) % 10)"
    assert expressions["ts_year"] == "EXTRACT(YEAR FROM `ts`)"
    assert expressions["ts_month"] == "SUBSTRING(CAST(`ts` AS STRING), 1, 7)"
    assert expressions["id_bucket"] is None
    more = pa.table({"topic": ["t"] * 3, "partition": pa.array([0] * 3, pa.int32()),
                     "offset": pa.array([4, 5, 6], pa.int64()),
                     "ts": pa.array([datetime.datetime(1969, 12, 31, 23, 59, 59, tzinfo=UTC),
                                     datetime.datetime(2026, 9, 22, 13, 45, tzinfo=UTC), None],
                                    pa.timestamp("us", tz="UTC")),
                     "id": pa.array([-13, 7, None], pa.int64()), "name": ["ü€x", "d", None]})
    with_columns = with_partition_columns(more, parse_partition_by(entries))
    target = pa.schema(table.schema().to_arrow())
    write_deltalake(str(tmp_path / "t"), with_columns.select(target.names).cast(target),
                    mode="append")  # refused if a value disagreed
    landed = {r["offset"]: r for r in DeltaTable(str(tmp_path / "t")).to_pyarrow_table().to_pylist()}
    assert landed[4]["ts_day"] == datetime.date(1969, 12, 31) and landed[4]["id_trunc"] == -20
    assert landed[4]["name_trunc"] == "ü€" and landed[5]["ts_hour"] == datetime.datetime(2026, 9, 22, 13, tzinfo=UTC)
    assert (landed[4]["ts_month"], landed[5]["ts_month"], landed[6]["ts_month"]) == ("1969-12", "2026-09", None)
    for column, value in (("ts_day", pa.array([datetime.date(2000, 1, 1)] * 3, pa.date32())),
                          ("ts_month", pa.array(["2000-01"] * 3))):
        wrong = with_columns.set_column(with_columns.schema.get_field_index(column), column, value)
        with pytest.raises(Exception, match="failed validation"):
            write_deltalake(str(tmp_path / "t"), wrong.select(target.names).cast(target), mode="append")


def test_an_iceberg_table_partitioned_by_hour_and_truncate(tmp_path: Path) -> None:
    warehouse = tmp_path / "wh"
    sink = open_sink("iceberg://local/lake.orders", catalog_properties={"warehouse": str(warehouse)},
                     partition_by=("hour(ts)", "truncate(2, name)"))
    files = sink.write_files(_rows(), job_id=JOB, checkpoint_id=1, subtask=0, attempt=0)
    assert len(files) == 4  # (23:00, ic), (00:00, de), (00:00, ic), (null, null)
    assert sink.commit(JOB, 1, files, offsets={("t", 0): 4})
    table = load_catalog("local", type="sql", uri=f"sqlite:///{warehouse}/catalog.db",
                         warehouse=f"file://{warehouse}").load_table("lake.orders")
    spec = table.spec()
    # hour(ts) is Iceberg's hidden partitioning: the spec's transform of ts, no ts_hour column;
    # truncate keeps an identity partition on its column (pyiceberg reads no truncate from bounds)
    assert [(table.schema().find_field(f.source_id).name, str(f.transform), f.name) for f in spec.fields] == [
        ("ts", "hour", "ts_hour"), ("name_trunc", "identity", "name_trunc")]
    assert "ts_hour" not in table.schema().column_names
    scanned = table.scan(row_filter="name_trunc == 'ic'").to_arrow()
    assert sorted(scanned.column("offset").to_pylist()) == [0, 2]
    # a predicate on ts itself prunes files: the 23:59 row's file only
    pruned = list(table.scan(row_filter="ts < '2026-09-22T00:00:00+00:00'").plan_files())
    assert len(pruned) == 1 and table.scan(row_filter="ts < '2026-09-22T00:00:00+00:00'").to_arrow().column(
        "offset").to_pylist() == [0]
    epoch = datetime.datetime(1970, 1, 1, tzinfo=UTC)
    # each file's partition: hours since the epoch of its rows' ts (23:59 on the 21st; twice 00:xx on the 22nd)
    hours = sorted((task.file.partition[0] for task in table.scan().plan_files()), key=lambda h: (h is None, h))
    assert hours == [None if t is None else (t - epoch) // datetime.timedelta(hours=1)
                     for t in _rows().column("ts").to_pylist()]


def test_an_iceberg_table_created_with_its_partition_column_keeps_writing_it(tmp_path: Path) -> None:
    """A table whose spec is identity on ts_day (as Chandy created day(ts) tables before hidden
    partitioning) gets ts_day in every file, so add_files reads the partition from it."""
    warehouse = tmp_path / "wh"
    warehouse.mkdir()
    catalog = load_catalog("local", type="sql", uri=f"sqlite:///{warehouse}/catalog.db", warehouse=f"file://{warehouse}")
    catalog.create_namespace("lake")
    rows = with_partition_columns(_rows(), parse_partition_by(["day(ts)"]))
    created = catalog.create_table("lake.old", schema=rows.schema, location=f"file://{warehouse}/lake/old")
    with created.update_spec() as spec:
        spec.add_identity("ts_day")
    sink = open_sink("iceberg://local/lake.old", catalog_properties={"warehouse": str(warehouse)},
                     partition_by=("day(ts)",))
    files = sink.write_files(_rows(), job_id=JOB, checkpoint_id=1, subtask=0, attempt=0,
                             table_fields=sink.table_fields())
    assert sink.commit(JOB, 1, files, offsets={("t", 0): 4})
    table = catalog.load_table("lake.old")
    assert sorted(table.scan(row_filter="ts_day == '2026-09-22'").to_arrow().column("offset").to_pylist()) == [1, 2]

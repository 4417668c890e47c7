"""The Iceberg sink through a real Iceberg REST catalog (Apache Iceberg's own server, a JDBC
catalog behind the REST protocol, ``tests/fixtures/iceberg_rest.py``), without Kafka or Spark, as
a user of Polaris, Unity Catalog or S3 Tables configures it: ``type=rest`` and ``uri`` only, no
client-side warehouse. A new table is placed where the catalog says (the location of a staged
create, nothing created until the first commit), the tasks' files land under it, the commit
creates the table there through the catalog, and a reader of the catalog (pyiceberg, and the
server's own table metadata) sees exactly the rows written, once, with the job's checkpoint."""

from __future__ import annotations

import json
import urllib.request
import uuid

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog

from chandy.connectors.lake.iceberg import IcebergSink
from chandy.connectors.lake.tables import open_sink
from tests.fixtures.iceberg_rest import IcebergRestCatalog

JOB = "0123456789abcdef0123456789abcdef"


def _rows(checkpoint: int, n: int = 5) -> pa.Table:
    return pa.table({"topic": ["orders"] * n, "partition": pa.array([0] * n, pa.int32()),
                     "offset": pa.array([checkpoint * n + i for i in range(n)], pa.int64()),
                     "amount": pa.array([float(checkpoint * 100 + i) for i in range(n)], pa.float64())})


def test_a_new_table_is_placed_created_and_committed_where_the_rest_catalog_says(
        iceberg_rest_catalog: IcebergRestCatalog) -> None:
    namespace, name = f"lake_{uuid.uuid4().hex[:8]}", "orders"
    uri = f"iceberg://rest/{namespace}.{name}"
    sink = open_sink(uri, catalog_properties=iceberg_rest_catalog.properties())
    assert isinstance(sink, IcebergSink)
    # the catalog's placement, not a client-side path: <server warehouse>/<namespace>/<table>
    assert sink.root_url == f"{iceberg_rest_catalog.warehouse}/{namespace}/{name}"
    catalog = load_catalog("reader", type="rest", uri=iceberg_rest_catalog.uri)
    assert not catalog.table_exists((namespace, name))  # placing it created nothing

    # a task writes with the location alone, as the driver hands it over (no catalog in the task)
    task_sink = open_sink(uri, catalog_properties=iceberg_rest_catalog.properties(), location=sink.root_url)
    first = task_sink.write_files(_rows(1), job_id=JOB, checkpoint_id=1, subtask=0, attempt=0)
    assert first and all(not f.path.startswith("/") for f in first)
    assert sink.commit(JOB, 1, first, offsets={("orders", 0): 10}, cluster_id="c1")
    second = task_sink.write_files(_rows(2), job_id=JOB, checkpoint_id=2, subtask=0, attempt=0)
    assert sink.commit(JOB, 2, second, offsets={("orders", 0): 15}, cluster_id="c1")
    assert not sink.commit(JOB, 2, second, offsets={("orders", 0): 15})  # a repeated commit lands nothing

    table = catalog.load_table((namespace, name))
    assert table.location() == sink.root_url
    landed = table.scan().to_arrow().sort_by("offset")
    expected = pa.concat_tables([_rows(1), _rows(2)])
    assert landed.column("offset").to_pylist() == expected.column("offset").to_pylist()
    assert landed.column("amount").to_pylist() == expected.column("amount").to_pylist()
    assert landed.column("topic").to_pylist() == expected.column("topic").to_pylist()
    # the server's own view of the table (the REST protocol's LoadTableResult): two snapshots
    # under the location it assigned, the last one recording the job's checkpoint 2
    with urllib.request.urlopen(f"{iceberg_rest_catalog.uri}/v1/namespaces/{namespace}/tables/{name}",
                                timeout=10) as answer:
        metadata = json.load(answer)["metadata"]
    assert metadata["location"] == sink.root_url and len(metadata["snapshots"]) == 2
    assert sink.committed_checkpoint(JOB) == 2


def test_a_warehouse_given_to_a_rest_catalog_is_the_catalogs_setting_not_a_path(
        iceberg_rest_catalog: IcebergRestCatalog, tmp_path) -> None:
    """With ``warehouse`` given (in Polaris, Unity or S3 Tables it names the catalog), a new table
    still goes where the catalog places it, never under the client's reading of that value."""
    namespace = f"lake_{uuid.uuid4().hex[:8]}"
    props = {**iceberg_rest_catalog.properties(), "warehouse": f"file://{tmp_path}/elsewhere"}
    sink = open_sink(f"iceberg://rest/{namespace}.events", catalog_properties=props)
    assert sink.root_url == f"{iceberg_rest_catalog.warehouse}/{namespace}/events"
    assert not (tmp_path / "elsewhere").exists()


def test_a_table_another_writer_created_meanwhile_is_adopted_when_it_fits_and_refused_when_not(
        iceberg_rest_catalog: IcebergRestCatalog) -> None:
    """Between the driver placing a new table and its first commit, another writer creates the
    table through the catalog: a table whose columns the data fits is adopted (the rows land in
    it, once); one whose columns it does not fit is refused with nothing landed."""
    from chandy.connectors.lake.sink import LakeSchemaError

    catalog = load_catalog("other-writer", type="rest", uri=iceberg_rest_catalog.uri)
    for fits in (True, False):
        namespace = f"lake_{uuid.uuid4().hex[:8]}"
        uri = f"iceberg://rest/{namespace}.orders"
        sink = open_sink(uri, catalog_properties=iceberg_rest_catalog.properties())
        files = sink.write_files(_rows(1), job_id=JOB, checkpoint_id=1, subtask=0, attempt=0)
        other = _rows(0).schema if fits else pa.schema([("topic", pa.string()), ("amount", pa.string())])
        catalog.create_table((namespace, "orders"), schema=other)
        if fits:
            assert sink.commit(JOB, 1, files, offsets={("orders", 0): 10}, cluster_id="c1")
            landed = catalog.load_table((namespace, "orders")).scan().to_arrow()
            assert sorted(landed.column("offset").to_pylist()) == list(range(5, 10))
        else:
            with pytest.raises(LakeSchemaError, match="amount"):
                sink.commit(JOB, 1, files, offsets={("orders", 0): 10}, cluster_id="c1")
            table = catalog.load_table((namespace, "orders"))
            assert table.current_snapshot() is None  # nothing landed


def test_a_table_created_between_the_commits_read_and_its_create_is_checked_too(
        iceberg_rest_catalog: IcebergRestCatalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """The narrowest race: the commit reads no table, another writer creates it, then the
    commit's own create finds it there and adopts it, so its columns are checked then."""
    from chandy.connectors.lake.sink import LakeSchemaError

    catalog = load_catalog("other-writer", type="rest", uri=iceberg_rest_catalog.uri)
    namespace = f"lake_{uuid.uuid4().hex[:8]}"
    sink = open_sink(f"iceberg://rest/{namespace}.orders", catalog_properties=iceberg_rest_catalog.properties())
    files = sink.write_files(_rows(1), job_id=JOB, checkpoint_id=1, subtask=0, attempt=0)
    real_load = sink._load
    reads: list[int] = []

    def load_then_race() -> object:
        reads.append(1)
        if len(reads) == 1:  # the commit's read: no table yet; the other writer creates it right after
            catalog.create_table((namespace, "orders"), schema=pa.schema([("amount", pa.string())]))
            return None
        return real_load()

    monkeypatch.setattr(sink, "_load", load_then_race)
    with pytest.raises(LakeSchemaError, match="amount is double in the data but string in the table"):
        sink.commit(JOB, 1, files, offsets={("orders", 0): 10}, cluster_id="c1")
    assert catalog.load_table((namespace, "orders")).current_snapshot() is None

"""Issue 56: an Iceberg table of a REST catalog written with only the storage credentials the
catalog vends with it. Apache Iceberg's reference REST server keeps its warehouse on a local S3 API
server (moto, ``S3FileIO``); in front of it, the catalog proxy (``tests/fixtures/catalog_proxy.py``)
is the *test double of credential vending* the reference server lacks: each table load and
staged create it answers carries the S3 endpoint, keys and a session token that expires 4 s later
(``s3.session-token-expires-at-ms``). Chandy's process has no S3 setting of its own (the
environment is cleared), so only vended settings can reach the bucket:

- a new table is placed by the catalog on S3; its files are written by the committer's sink and
  by a task's writer opened as the Spark tasks open it (location and ``task_storage_options()``);
  both checkpoints land, read back by a pyiceberg catalog with its own settings;
- every table request asked for vended credentials (``X-Iceberg-Access-Delegation``);
- past half their lifetime, the credentials are loaded again (a new token in what the tasks get),
  and not while they are fresh.
"""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog

from chandy.connectors.lake.iceberg import IcebergSink
from tests.fixtures.catalog_proxy import CatalogProxy, s3_vending
from tests.fixtures.iceberg_rest import IcebergRestCatalog
from tests.fixtures.object_store import S3Server, clear_storage_settings

pytestmark = pytest.mark.integration

JOB = "0123456789abcdef0123456789abcdef"
LIFETIME_MS = 4000


def rows(first: int, n: int = 5) -> pa.Table:
    return pa.table({"id": pa.array(range(first, first + n), pa.int64()),
                     "name": pa.array([f"n{i}" for i in range(first, first + n)])})


def test_a_rest_table_written_with_only_the_credentials_its_catalog_vends(
        iceberg_rest_catalog_on_s3: tuple[IcebergRestCatalog, str], s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> None:
    catalog, bucket = iceberg_rest_catalog_on_s3
    clear_storage_settings(monkeypatch)
    proxy = CatalogProxy(catalog.uri)
    proxy.vend = s3_vending(s3_server, LIFETIME_MS)
    try:
        sink = IcebergSink("iceberg://rest/lake.vended", catalog_properties={"type": "rest", "uri": proxy.uri})
        assert sink.root_url.startswith(f"s3://{bucket}/warehouse/")  # placed by the catalog, on S3
        first = sink.write_files(rows(0), job_id=JOB, checkpoint_id=1, subtask=0, attempt=0)
        assert sink.commit(JOB, 1, first, offsets={("t", 0): 5}) is not None
        # a task's writer, opened as the Spark tasks open it: the location and the options the driver hands out
        options = sink.task_storage_options()
        assert options["AWS_ENDPOINT_URL"] == s3_server.endpoint and options["AWS_SESSION_TOKEN"].startswith("vended-")
        task = IcebergSink(sink.table_uri, location=sink.root_url, storage_options=options)
        second = task.write_files(rows(5), job_id=JOB, checkpoint_id=2, subtask=0, attempt=0)
        assert sink.commit(JOB, 2, second, offsets={("t", 0): 10}) is not None
        assert proxy.vended and set(proxy.delegations) == {"vended-credentials"}

        # fresh credentials are not loaded again; past half their lifetime they are
        loads = len(proxy.vended)
        sink.task_storage_options()
        assert len(proxy.vended) == loads
        time.sleep(LIFETIME_MS / 2 / 1000 + 0.2)
        renewed = sink.task_storage_options()
        assert len(proxy.vended) == loads + 1 and renewed["AWS_SESSION_TOKEN"] == proxy.vended[-1]["s3.session-token"]
        third = sink.write_files(rows(10), job_id=JOB, checkpoint_id=3, subtask=0, attempt=0)
        assert sink.commit(JOB, 3, third, offsets={("t", 0): 15}) is not None
    finally:
        proxy.close()
    reader = load_catalog("reader", type="rest", uri=catalog.uri, **s3_server.reader_options()[1])
    landed = reader.load_table("lake.vended").scan().to_arrow().sort_by("id")
    assert landed.to_pylist() == rows(0, 15).to_pylist()

"""Issue 44, item 7: the cleanup of a job's unreferenced files lists only the table's data
directories (``chandy.connectors.lake.cleanup.job_files``), with each file system's own listing:
on S3 (moto) and Azure (Azurite) it deletes exactly the aborted checkpoint's files, in every
partition, and keeps the committed ones and everything that is not the job's. No Kafka, no Spark."""

from __future__ import annotations

import pyarrow as pa
import pytest

from chandy.connectors.lake.cleanup import job_files
from chandy.connectors.lake.tables import open_sink
from tests.fixtures.object_store import AzuriteServer, S3Server

JOB = "0123456789abcdef0123456789abcdef"
OTHER_JOB = "fedcba9876543210fedcba9876543210"
TP0 = ("t", 0)


@pytest.fixture(params=["s3", "azure"])
def store(request: pytest.FixtureRequest) -> S3Server | AzuriteServer:
    return request.getfixturevalue("s3_server" if request.param == "s3" else "azurite_server")


def table_on(store: S3Server | AzuriteServer, fmt: str, name: str, tmp_path) -> tuple[str, dict[str, str]]:
    """A new table ``name`` of format ``fmt`` in a new bucket of ``store``: its URI and catalog
    properties (Iceberg: pyiceberg's SQL catalog, its warehouse in the bucket)."""
    bucket = store.new_bucket()
    if fmt == "delta":
        return f"{store.table_scheme}://{bucket}/lake/{name}", {}
    return f"iceberg://objcat/lake.{name}", {"type": "sql", "uri": f"sqlite:///{tmp_path}/catalog.db",
                                             "warehouse": f"{store.warehouse_scheme}://{bucket}/warehouse"}


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_cleanup_on_an_object_store_deletes_exactly_the_jobs_unreferenced_files(store, fmt, tmp_path) -> None:
    uri, catalog = table_on(store, fmt, "t", tmp_path)
    options = store.environment()
    sink = open_sink(uri, partition_by=["p"], catalog_properties=catalog, storage_options=options)
    data = pa.table({"offset": pa.array(range(4), pa.int64()), "p": ["a", "b c", "a", "é"]})
    committed = sink.write_files(data, job_id=JOB, checkpoint_id=1, subtask=0, attempt=0)
    assert sink.commit(JOB, 1, committed, offsets={TP0: 4})
    aborted = sink.write_files(data, job_id=JOB, checkpoint_id=2, subtask=0, attempt=0)
    third = sink.write_files(data, job_id=JOB, checkpoint_id=3, subtask=1, attempt=0)
    assert sink.commit(JOB, 3, third, offsets={TP0: 8})
    in_flight = sink.write_files(data, job_id=JOB, checkpoint_id=4, subtask=0, attempt=0)
    foreign = sink.write_files(data, job_id=OTHER_JOB, checkpoint_id=2, subtask=0, attempt=0)
    data_dir = "" if fmt == "delta" else "data"
    listed = job_files(sink.fs, sink.root, JOB, data_dir=data_dir)
    assert set(listed) == {f.path for f in committed + aborted + third + in_flight}
    assert sorted(sink.delete_unreferenced(JOB, keep_checkpoints_after=3)) == sorted(f.path for f in aborted)
    assert sink.missing_files(committed + third + in_flight + foreign) == []
    assert sink.missing_files(aborted) == [f.path for f in aborted]
    assert sorted(sink.read_table().column("offset").to_pylist()) == [0, 0, 1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_each_data_files_recorded_size_is_its_size_on_the_object_store(store, fmt, tmp_path) -> None:
    """Issue 57: a data file's size comes from the bytes its writer wrote, not from a look at the
    store after the write; readers plan their reads by it (Delta's ``add.size``, Iceberg's
    ``file_size_in_bytes``), so it must be the stored object's size, in every partition."""
    uri, catalog = table_on(store, fmt, "sized", tmp_path)
    sink = open_sink(uri, partition_by=["p"], catalog_properties=catalog, storage_options=store.environment())
    data = pa.table({"offset": pa.array(range(3000), pa.int64()), "p": ["a", "b c", "é"] * 1000,
                     "payload": [f"row {i} " * (i % 7) for i in range(3000)]})
    files = sink.write_files(data, job_id=JOB, checkpoint_id=1, subtask=0, attempt=0)
    assert len(files) == 3
    assert [f.size for f in files] == [sink.fs.size(f"{sink.root}/{f.path}") for f in files]
    assert sink.commit(JOB, 1, files, offsets={TP0: 3000})
    assert sorted(sink.read_table().column("offset").to_pylist()) == list(range(3000))

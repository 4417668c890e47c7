"""Issue 56: a checkpoint's Iceberg tables of one REST catalog commit in one catalog transaction
(``POST /v1/transactions/commit``), against Apache Iceberg's own REST catalog server
(``tests/fixtures/iceberg_rest.py``) behind a proxy that records, loses or cuts short its answers
(``tests/fixtures/catalog_proxy.py``). The lake committer (``LakeCommitter``) is driven as the
coordinator drives it, with a routed table beside the job's; what landed is read with a
pyiceberg catalog straight on the server, not through the sink.

- every checkpoint sends both tables' commits in one request, none alone, and each table's
  snapshot of checkpoint N carries N; each table's LAKE_COMMITTED event is published;
- the answer lost after the server applied it (502): the tables are read again, hold the commits,
  and nothing is committed twice;
- a 409: nothing landed; built again and sent again, landed once;
- a server that applied only the first table before failing (502): the committer sends the rest
  again, and each table holds each record once;
- a request that never reached the server (502): the checkpoint fails, nothing landed, and the
  next attempt lands it once.
"""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog

from chandy.connectors.lake.committer import LakeCommitter
from chandy.connectors.lake.sink import DataFile, LakeCommitError
from chandy.connectors.lake.tables import open_sink
from chandy.coordinator.storage import CheckpointMetadata, CheckpointStorage, OperatorState, SubtaskState
from tests.fixtures.catalog_proxy import CatalogProxy
from tests.fixtures.lake_committer import JOB, CommitterContext

pytestmark = pytest.mark.integration


@pytest.fixture
def proxy(catalog_proxy: CatalogProxy) -> CatalogProxy:
    return catalog_proxy


class RoutedJob:
    """The committer of a job writing ``<ns>.orders`` (its ``--table``) and ``<ns>.lines`` (a
    routed table) of the REST catalog behind ``proxy``; checkpoint N lands offsets [4N, 4N+4) of
    partition 0 into both."""

    def __init__(self, tmp_path: Path, proxy: CatalogProxy) -> None:
        self.namespace = f"tx_{uuid.uuid4().hex[:8]}"
        self.catalog = {"type": "rest", "uri": proxy.uri}
        self.sink = open_sink(f"iceberg://rest/{self.namespace}.orders", catalog_properties=self.catalog)
        self.routed = open_sink(f"iceberg://rest/{self.namespace}.lines", catalog_properties=self.catalog)
        self.storage = CheckpointStorage(f"file://{tmp_path}/chk", JOB)
        self.context = CommitterContext()
        self.committer = LakeCommitter(self.context, self.sink, self.storage,
                                       offsets_of=lambda m: {("t", 0): (4 * m.checkpoint_id, 4 * m.checkpoint_id + 4)},
                                       open_table=lambda uri: open_sink(uri, catalog_properties=self.catalog))
        self.committer.reset_to_checkpoint(-1, None)
        self.reader = load_catalog("reader", type="rest", uri=proxy.upstream.geturl())

    def take(self, checkpoint_id: int) -> None:
        """Write checkpoint ``checkpoint_id``'s files into both tables and its _metadata."""
        start = 4 * checkpoint_id
        rows = pa.table({"topic": ["t"] * 4, "partition": pa.array([0] * 4, pa.int32()),
                         "offset": pa.array(range(start, start + 4), pa.int64())})
        files: list[DataFile] = []
        for sink in (self.sink, self.routed):
            written = sink.write_files(rows, job_id=JOB, checkpoint_id=checkpoint_id, subtask=0, attempt=0)
            files += [dataclasses.replace(f, table_uri=sink.table_uri) for f in written]
        self.storage.write_metadata(self.storage.initialize_location_for_checkpoint(checkpoint_id), CheckpointMetadata(
            job_id=JOB, checkpoint_id=checkpoint_id, checkpoint_type="CHECKPOINT", trigger_timestamp=1,
            completion_timestamp=2, operator_states=(OperatorState("lake", None, (SubtaskState(
                0, 0, tuple(f.to_state_handle() for f in files)),)),)))

    def complete(self, checkpoint_id: int) -> None:
        self.committer.notify_checkpoint_complete(checkpoint_id)

    def offsets(self, table: str) -> list[int]:
        return sorted(self.reader.load_table((self.namespace, table)).scan().to_arrow().column("offset").to_pylist())

    def checkpoint_of(self, table: str) -> str | None:
        """The checkpoint the table's current snapshot records (``chandy.checkpoint_id``)."""
        snapshot = self.reader.load_table((self.namespace, table)).current_snapshot()
        return None if snapshot is None else snapshot.summary.additional_properties.get("chandy.checkpoint_id")

    def lake_events(self, checkpoint_id: int) -> list[str]:
        return sorted(fields["table_uri"] for c, kind, fields in self.context.published
                      if c == checkpoint_id and kind == "LAKE_COMMITTED")

    def committed_with(self, checkpoint_id: int) -> dict[str, object]:
        """Each LAKE_COMMITTED event's ``committed_with`` of checkpoint ``checkpoint_id``, by table."""
        return {fields["table_uri"]: fields.get("committed_with") for c, kind, fields in self.context.published
                if c == checkpoint_id and kind == "LAKE_COMMITTED"}


def checkpoint_2_taken(tmp_path: Path, proxy: CatalogProxy, fate: str) -> RoutedJob:
    """A job whose checkpoint 1 landed and whose checkpoint 2 is taken, not completed; the proxy
    gives its next multi-table commit ``fate``."""
    job = RoutedJob(tmp_path, proxy)
    job.take(1)
    job.complete(1)
    proxy.transaction_plans = [fate]
    job.take(2)
    return job


def test_a_checkpoints_tables_commit_in_one_catalog_transaction(tmp_path: Path, proxy: CatalogProxy) -> None:
    job = RoutedJob(tmp_path, proxy)
    for checkpoint in (1, 2, 3):
        job.take(checkpoint)
        job.complete(checkpoint)
        assert job.checkpoint_of("orders") == job.checkpoint_of("lines") == str(checkpoint)
        both = tuple(sorted([job.sink.table_uri, job.routed.table_uri]))
        assert job.committed_with(checkpoint) == dict.fromkeys(both, both)  # the events say they went together
    assert proxy.commits_seen == []  # no table committed alone, not even at the first checkpoint
    assert len(proxy.creations_seen) == 2  # which created both tables first, each in its own request
    changed = sorted([f"{job.namespace}.lines", f"{job.namespace}.orders"])
    assert [(fate, sorted(tables)) for fate, tables in proxy.transactions_seen] == [("pass", changed)] * 3
    assert job.offsets("orders") == job.offsets("lines") == list(range(4, 16))


def test_a_transaction_whose_answer_is_lost_after_it_landed_counts_once(tmp_path: Path, proxy: CatalogProxy) -> None:
    job = checkpoint_2_taken(tmp_path, proxy, "lose-answer")
    job.complete(2)  # the tables are read again: both hold the commits
    assert [fate for fate, _ in proxy.transactions_seen] == ["pass", "lose-answer"]  # not sent again
    assert job.offsets("orders") == job.offsets("lines") == list(range(4, 12))
    assert job.lake_events(2) == sorted([job.sink.table_uri, job.routed.table_uri])


def test_a_conflict_is_built_again_and_lands_once(tmp_path: Path, proxy: CatalogProxy) -> None:
    job = checkpoint_2_taken(tmp_path, proxy, "conflict")
    job.complete(2)
    assert [fate for fate, _ in proxy.transactions_seen] == ["pass", "conflict", "pass"]
    assert len(proxy.transactions_seen[-1][1]) == 2
    assert job.offsets("orders") == job.offsets("lines") == list(range(4, 12))


def test_a_transaction_the_server_applied_to_one_table_only_is_completed_once(tmp_path: Path,
                                                                               proxy: CatalogProxy) -> None:
    job = checkpoint_2_taken(tmp_path, proxy, "partial")
    job.complete(2)
    (first, cut), (second, rest) = proxy.transactions_seen[1:]
    assert (first, second) == ("partial", "pass")
    assert len(cut) == 2 and len(rest) == 1 and rest[0] != cut[0]  # only the table that had not landed, sent again
    assert job.offsets("orders") == job.offsets("lines") == list(range(4, 12))
    assert job.checkpoint_of("orders") == job.checkpoint_of("lines") == "2"
    assert set(job.committed_with(2).values()) == {None}  # each landed alone: the events do not claim otherwise


def test_a_transaction_that_never_reached_the_catalog_fails_then_lands_once(tmp_path: Path,
                                                                             proxy: CatalogProxy) -> None:
    job = checkpoint_2_taken(tmp_path, proxy, "drop")
    with pytest.raises(LakeCommitError, match=r"catalog transaction of .*orders.* failed"):
        job.complete(2)
    assert job.offsets("orders") == job.offsets("lines") == list(range(4, 8))  # neither table moved
    assert job.lake_events(2) == []
    job.complete(2)  # the checkpoint's next attempt (the job restarted from its latest checkpoint)
    assert job.offsets("orders") == job.offsets("lines") == list(range(4, 12))

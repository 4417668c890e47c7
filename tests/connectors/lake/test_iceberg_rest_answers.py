"""The Iceberg sink's commit when the REST catalog answers as the protocol allows, through a proxy
in front of Apache Iceberg's own REST catalog server (``tests/fixtures/iceberg_rest.py``) that
can lose or replace the server's answer to a table commit (``POST /v1/namespaces/{ns}/tables/{t}``):

- the server commits, the client gets a 502 (a gateway timing out after the swap): the outcome is
  unknown, the sink reads the table again, finds its commit token and reports the commit landed,
  once, with nothing committed twice;
- the request never reaches the server and the client gets a 502: the sink reads the table, finds
  no commit, and fails the commit with the catalog's answer (the checkpoint aborts, nothing
  landed), and the next attempt lands it once;
- a 409 (another writer won the compare-and-swap): a conflict, retried, landed once;
- with OAuth2 client credentials (pyiceberg's ``credential``, ``scope``, ``oauth2-server-uri``), a token the catalog
  stops accepting mid-run (401) is fetched again from the catalog's token endpoint and the commit
  lands once, with no failed checkpoint.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pyarrow as pa
import pytest
from pyiceberg.catalog import load_catalog

from chandy.connectors.lake.iceberg import IcebergSink
from chandy.connectors.lake.sink import LakeCommitError
from chandy.connectors.lake.tables import open_sink
from tests.fixtures.catalog_proxy import CatalogProxy

JOB = "fedcba9876543210fedcba9876543210"


@pytest.fixture
def proxy(catalog_proxy: CatalogProxy) -> CatalogProxy:
    return catalog_proxy


def _rows(checkpoint: int, n: int = 4) -> pa.Table:
    return pa.table({"topic": ["t"] * n, "partition": pa.array([0] * n, pa.int32()),
                     "offset": pa.array([checkpoint * n + i for i in range(n)], pa.int64())})


def _sink(proxy: CatalogProxy, **settings: str) -> tuple[IcebergSink, Callable[[], list[int]]]:
    namespace = f"answers_{uuid.uuid4().hex[:8]}"
    sink = open_sink(f"iceberg://rest/{namespace}.t",
                     catalog_properties={"type": "rest", "uri": proxy.uri, **settings})
    assert isinstance(sink, IcebergSink)
    reader = load_catalog("reader", type="rest", uri=proxy.upstream.geturl())

    def landed() -> list[int]:
        return sorted(reader.load_table((namespace, "t")).scan().to_arrow().column("offset").to_pylist())

    return sink, landed


def _commit(sink: IcebergSink, checkpoint: int) -> object:
    files = sink.write_files(_rows(checkpoint), job_id=JOB, checkpoint_id=checkpoint, subtask=0, attempt=0)
    return sink.commit(JOB, checkpoint, files, offsets={("t", 0): (checkpoint + 1) * 4}, cluster_id="c1")


def test_a_commit_whose_answer_is_lost_after_it_landed_counts_once(proxy: CatalogProxy) -> None:
    sink, landed = _sink(proxy)
    assert _commit(sink, 1)  # creates the table (its own commit path), then its checkpoint 1
    proxy.plans = ["lose-answer"]
    committed = _commit(sink, 2)
    assert proxy.commits_seen[-1] == "lose-answer"
    assert committed is not None and committed.checkpoint_id == 2  # the table was read again: it landed
    assert landed() == list(range(4, 12))  # checkpoints 1 and 2, each record once
    assert sink.committed_checkpoint(JOB) == 2
    assert _commit(sink, 2) is None and landed() == list(range(4, 12))  # and a retry lands nothing more


def test_a_commit_that_never_reached_the_catalog_fails_then_lands_once(proxy: CatalogProxy) -> None:
    sink, landed = _sink(proxy)
    assert _commit(sink, 1)
    proxy.plans = ["drop"]
    with pytest.raises(LakeCommitError, match="502|Bad Gateway|bad gateway|CommitStateUnknown|ServerError"):
        _commit(sink, 2)
    assert landed() == list(range(4, 8))  # only checkpoint 1's records
    assert sink.committed_checkpoint(JOB) == 1
    assert _commit(sink, 2)  # the checkpoint's next attempt
    assert landed() == list(range(4, 12))


def test_a_conflict_is_retried_and_lands_once(proxy: CatalogProxy) -> None:
    sink, landed = _sink(proxy)
    assert _commit(sink, 1)
    proxy.plans = ["conflict"]
    assert _commit(sink, 2)
    assert proxy.commits_seen[-2:] == ["conflict", "pass"]
    assert landed() == list(range(4, 12))


def test_an_oauth2_token_the_catalog_stops_accepting_is_fetched_again_and_the_commit_lands(proxy: CatalogProxy) -> None:
    sink, landed = _sink(proxy, credential="chandy:secret", scope="catalog", **{"oauth2-server-uri": f"{proxy.uri}/v1/oauth/tokens"})
    assert _commit(sink, 1)
    assert proxy.token_requests >= 1  # client credentials exchanged at the catalog's token endpoint
    assert proxy.authorizations and all(a.startswith("Bearer ") for a in proxy.authorizations[1:])
    tokens_before = proxy.token_requests
    proxy.reject_next_bearer = True  # the token expires: the catalog answers its next request 401
    assert _commit(sink, 2)  # fetched again, the request repeated: no failed checkpoint
    assert not proxy.reject_next_bearer and proxy.token_requests > tokens_before
    assert landed() == list(range(4, 12))

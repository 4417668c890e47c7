"""One catalog transaction for a checkpoint's Iceberg tables: the Iceberg REST protocol's
multi-table commit, ``POST /v1/{prefix}/transactions/commit`` (``CommitTransactionRequest``: one
``UpdateTableRequest`` per table, its requirements and updates), which the catalog applies to all
of its tables or to none (HTTP 204), or refuses (409: a requirement failed).

pyiceberg builds a table's commit (the requirements and updates of ``Table.transaction()``) but
offers no multi-table commit. :class:`CatalogTransaction` reuses everything the one-table path
builds: while a sink is *staged* (:meth:`CatalogTransaction.staging`), the tables it loads carry a
stand-in catalog that records the commit request instead of sending it (and answers with the
metadata the updates make, so the sink's own bookkeeping - its commit token, its snapshot, the
:class:`~chandy.connectors.lake.sink.LakeCommit` it returns - is the same as on the one-table
path); :meth:`CatalogTransaction.commit` sends every recorded request in one
``CommitTransactionRequest`` through the catalog's own REST session (its OAuth2 token, headers
and TLS settings).

What atomicity a catalog gives behind this endpoint is the server's (docs/design.md §7): Apache
Iceberg's reference server (``CatalogHandlers.commitTransaction``) validates every table's
requirements before committing any, then commits them one after another, so a reader or a crash
can fall between two of them. So the outcome of a failed request is never assumed:
:meth:`CatalogTransaction.landed_after` reads each table again and checks whether its commit's
snapshots and properties are there, and the committer stages again whatever did not land.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator, Sequence
from typing import Any

from chandy.connectors.lake.sink import LakeCommitError

log = logging.getLogger(__name__)

#: the REST path of the multi-table commit, below the catalog's prefix
TRANSACTIONS_COMMIT_PATH = "transactions/commit"


def transaction_key(sink: Any) -> str | None:
    """Which catalog transaction ``sink``'s commits can join: the same key for tables of one REST
    catalog that lists ``POST /v1/{prefix}/transactions/commit`` among the endpoints of its
    ``/v1/config`` answer; None for any other table (Delta, an Iceberg catalog other than REST, a
    REST catalog without the endpoint), which commits alone."""
    if getattr(sink, "FORMAT", None) != "iceberg" or getattr(sink, "catalog_properties", {}).get("type") != "rest":
        return None
    if not serves_transactions(sink.catalog):
        return None
    return json.dumps([sink.catalog_name, sorted(sink.catalog_properties.items())])


def serves_transactions(catalog: Any) -> bool:
    """Whether pyiceberg's REST ``catalog`` was told (``/v1/config``'s ``endpoints``) that the
    server takes ``POST /v1/{prefix}/transactions/commit``."""
    from pyiceberg.catalog.rest import API_PREFIX, Endpoint, HttpMethod

    endpoint = Endpoint(http_method=HttpMethod.POST, path=f"{API_PREFIX}/{TRANSACTIONS_COMMIT_PATH}")
    return endpoint in getattr(catalog, "_supported_endpoints", ())


class _RecordingCatalog:
    """The catalog of a staged table: ``commit_table`` records the request and answers with the
    metadata its updates make, as the catalog would; nothing reaches the server."""

    def __init__(self, transaction: CatalogTransaction) -> None:
        self._transaction = transaction

    def commit_table(self, table: Any, requirements: tuple[Any, ...], updates: tuple[Any, ...]) -> Any:
        from pyiceberg.table import CommitTableRequest, CommitTableResponse, Namespace, TableIdentifier
        from pyiceberg.table.update import update_table_metadata

        identifier = tuple(table.name())
        if identifier in self._transaction.requests:
            raise LakeCommitError(f"table {'.'.join(identifier)} was committed twice in one catalog transaction")
        self._transaction.requests[identifier] = CommitTableRequest(
            identifier=TableIdentifier(namespace=Namespace(root=list(identifier[:-1])), name=identifier[-1]),
            requirements=requirements, updates=updates)
        metadata = update_table_metadata(table.metadata, updates)
        return CommitTableResponse.model_validate({"metadata": metadata, "metadata-location": table.metadata_location})

    def _delete_old_metadata(self, io: Any, base: Any, metadata: Any) -> None:
        """Nothing was committed yet: no metadata file to clean up."""


class CatalogTransaction:
    """The commits of one checkpoint's ``sinks`` (``IcebergSink``s of one REST catalog, the same
    :func:`transaction_key`), sent as one request.

    ``requests``: identifier -> pyiceberg's ``CommitTableRequest``, recorded while staged.
    """

    def __init__(self, sinks: Sequence[Any]) -> None:
        self.sinks = list(sinks)
        self.catalog = self.sinks[0].catalog
        self.requests: dict[tuple[str, ...], Any] = {}

    @contextlib.contextmanager
    def staging(self) -> Iterator[None]:
        """While inside, each sink loads its table with a stand-in catalog that records its
        commit in :attr:`requests` instead of sending it."""
        for sink in self.sinks:
            sink.transaction = self
        try:
            yield
        finally:
            for sink in self.sinks:
                sink.transaction = None

    def staged(self, table: Any) -> Any:
        """``table`` (pyiceberg's) whose commits are recorded here."""
        from pyiceberg.table import Table

        recording: Any = _RecordingCatalog(self)  # the part of pyiceberg's Catalog a commit calls
        return Table(table.name(), table.metadata, table.metadata_location, table.io, recording, table.config)

    def commit(self) -> None:
        """Send every recorded commit in one ``CommitTransactionRequest`` (a 401 or 419 fetches
        the OAuth2 token again once, as pyiceberg's own calls do).

        Raises:
            CommitFailedException: 409, a requirement of some table failed (nothing may have
                landed, or, on a server that commits table after table, some of them).
            CommitStateUnknownException: 500, 502 or 504: the outcome is unknown.
            Exception: any other answer or transport error, as pyiceberg raises it.
        """
        from pyiceberg.exceptions import AuthorizationExpiredError, UnauthorizedError

        try:
            self._post()
        except (AuthorizationExpiredError, UnauthorizedError):
            self.catalog._refresh_token()
            self._post()

    def _post(self) -> None:
        from pyiceberg.catalog.rest.response import _handle_non_200_response
        from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException
        from requests import HTTPError

        body = {"table-changes": [json.loads(request.model_dump_json()) for request in self.requests.values()]}
        response = self.catalog._session.post(self.catalog.url(TRANSACTIONS_COMMIT_PATH, prefixed=True),
                                              data=json.dumps(body).encode(), headers=self.catalog._session.headers)
        try:
            response.raise_for_status()
        except HTTPError as exc:
            _handle_non_200_response(exc, {409: CommitFailedException, 500: CommitStateUnknownException,
                                           502: CommitStateUnknownException, 504: CommitStateUnknownException})

    def landed_after(self, exc: Exception, action: str) -> dict[str, bool]:
        """After :meth:`commit` failed with ``exc``: for each table whose commit was recorded (by
        table URI), whether it holds it now, read again (as an unknown outcome is:
        :func:`~chandy.connectors.lake.iceberg_commits.read_after_unknown_outcome`). A table holds
        its commit when every snapshot it adds is among the table's and every property it sets
        has its value (a Chandy commit sets a commit token no other commit carries).

        Raises:
            LakeCommitError: no read of the tables answered: the outcome stays unknown.
        """
        from chandy.connectors.lake.iceberg_commits import read_after_unknown_outcome

        return dict(read_after_unknown_outcome(self._landed, exc, action, what="the tables"))

    def _landed(self) -> dict[str, bool]:
        from pyiceberg.table.update import AddSnapshotUpdate, SetPropertiesUpdate

        uris = {tuple(sink.identifier): sink.table_uri for sink in self.sinks}
        held: dict[str, bool] = {}
        for identifier, request in self.requests.items():
            table = self.catalog.load_table(identifier)
            snapshots = {s.snapshot_id for s in table.metadata.snapshots}
            holds = True
            for update in request.updates:
                if isinstance(update, AddSnapshotUpdate):
                    holds = holds and update.snapshot.snapshot_id in snapshots
                elif isinstance(update, SetPropertiesUpdate):
                    holds = holds and all(table.properties.get(k) == v for k, v in update.updates.items())
            held[uris[identifier]] = holds
        return held

"""Maintenance of a Delta table while the pipeline runs: compaction (OPTIMIZE) and VACUUM, with
delta-rs: :class:`DeltaMaintenance`, which :class:`~chandy.connectors.lake.delta.DeltaLakeSink`
holds as a field and hands ``optimize`` and ``vacuum`` to."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

from chandy.connectors.lake.sink import COMMIT_ATTEMPTS, LakeCommitError

log = logging.getLogger(__name__)


def is_conflict(exc: BaseException) -> bool:
    """A commit lost to a concurrent one (delta-rs ``CommitFailedError``, or its text)."""
    from deltalake.exceptions import CommitFailedError

    text = str(exc).lower()
    return isinstance(exc, CommitFailedError) or "conflict" in text or "version already exists" in text


class DeltaMaintenance:
    """OPTIMIZE and VACUUM of one Delta table.

    Args:
        table_uri: the table's normalized URI (``file://`` for a local table).
        root: its path in the file system the sink opened (the maintenance lock file goes there).
        open_table: the table's current version (a ``deltalake.DeltaTable``), or None when there
            is none: the sink's own opener, so maintenance reads the table as the commits do.
    """

    def __init__(self, table_uri: str, root: str, open_table: Callable[[], Any]) -> None:
        self.table_uri, self.root = table_uri, root
        self._open = open_table

    def optimize(self, *, target_size: int | None = None) -> dict[str, Any]:
        """Compact small files into files of about ``target_size`` bytes (delta-rs
        ``DeltaTable.optimize.compact``; default its 100 MiB), in one OPTIMIZE commit
        (``dataChange=false``) that neither adds nor removes rows. Safe while the pipeline runs:
        the app transactions and the pipeline's ``commitInfo`` stay in the log, and a pipeline
        commit that meets the OPTIMIZE commit is rebased (or retried, see :meth:`commit`); an
        OPTIMIZE that meets a pipeline commit is retried here. Two OPTIMIZEs of one local table
        never overlap (see :meth:`_maintenance_lock`). The removed files stay on storage until
        :meth:`vacuum`. Returns delta-rs's metrics (``numFilesAdded``, ``numFilesRemoved``, ...).

        Raises:
            LakeCommitError: there is no table, or delta-rs failed ``COMMIT_ATTEMPTS`` times.
        """
        with self._maintenance_lock():
            return self._optimize(target_size)

    @contextlib.contextmanager
    def _maintenance_lock(self) -> Iterator[None]:
        """One OPTIMIZE of a local table at a time, across processes (``flock`` on
        ``_chandy_maintenance.lock`` in the table root). delta-rs (since its PR #3982) lets two
        concurrent OPTIMIZE commits that remove the same files both succeed, which doubles their
        rows; the pipeline's appends are not affected. On object stores there is no such lock:
        run one compaction at a time there."""
        if not self.table_uri.startswith("file://"):
            log.warning("%s: no cross-process lock on object stores; never run two compactions of it at once",
                        self.table_uri)
            yield
            return
        os.makedirs(self.root, exist_ok=True)
        with open(os.path.join(self.root, "_chandy_maintenance.lock"), "a+b") as handle:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def _optimize(self, target_size: int | None) -> dict[str, Any]:
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            table = self._open()
            if table is None:
                raise LakeCommitError(f"no Delta table at {self.table_uri}: nothing to optimize")
            try:
                metrics: dict[str, Any] = table.optimize.compact(target_size=target_size)
                log.info("optimized %s: %s file(s) removed, %s added", self.table_uri, metrics.get("numFilesRemoved"),
                         metrics.get("numFilesAdded"))
                return metrics
            except Exception as exc:  # delta-rs raises several exception types
                if not is_conflict(exc) or attempt == COMMIT_ATTEMPTS:
                    raise LakeCommitError(f"optimizing {self.table_uri} failed (attempt {attempt}): {exc}") from exc
                log.warning("optimize of %s met a concurrent commit (%s): retrying", self.table_uri, exc)
                time.sleep(min(2.0, 0.05 * 2 ** attempt))
        return {}  # not reached

    def vacuum(self, *, retention_hours: float, dry_run: bool = False, retain_last: int = 1) -> list[str]:
        """Delete files that the table removed (compacted away, or overwritten) more than
        ``retention_hours`` ago (delta-rs ``DeltaTable.vacuum``, lite mode: files no version
        ever referenced are the pipeline's to delete, see :meth:`delete_unreferenced`);
        ``retain_last`` is Iceberg's (Delta's log keeps every version: no snapshot to expire). A
        retention below the table's ``delta.deletedFileRetentionDuration`` (default 168 h) is
        allowed on purpose: a reader still on an older version then fails. Returns the paths
        (relative to the table root) deleted, or with ``dry_run`` those that would be.

        Raises:
            LakeCommitError: there is no table, a negative retention, or delta-rs failed.
        """
        if retention_hours < 0:
            raise LakeCommitError(f"vacuum retention must be 0 hours or more, got {retention_hours}")
        table = self._open()
        if table is None:
            raise LakeCommitError(f"no Delta table at {self.table_uri}: nothing to vacuum")
        try:
            # delta-rs takes whole hours; round up so nothing younger than asked is deleted
            hours = int(retention_hours) + (0 if float(retention_hours).is_integer() else 1)
            return list(table.vacuum(retention_hours=hours, dry_run=dry_run, enforce_retention_duration=False))
        except Exception as exc:  # delta-rs raises several exception types
            raise LakeCommitError(f"vacuuming {self.table_uri} failed: {exc}") from exc

"""What an Iceberg table records of Chandy's commits: the snapshot (and so the version a reader
time-travels to) that landed a job's checkpoint, read from the snapshot summaries
:class:`~chandy.connectors.lake.iceberg.IcebergSink` writes (``chandy.job_id``,
``chandy.checkpoint_id``, the commit token, records and files added). Pure functions of a
pyiceberg ``Table``; the sink calls them after a commit and when a restore looks for the commits
a predecessor did not announce.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from chandy.connectors.lake.sink import FILES_KEY, RECORDS_KEY, TP, LakeCommit, offsets_from_json

#: the table properties that hold a job's record: ``chandy.job.<job id>.checkpoint_id``, ``.offsets``, ...
PROPERTY_PREFIX = "chandy.job."


def snapshot_commit(snapshot: Any, checkpoint_id: int) -> LakeCommit:
    """The :class:`LakeCommit` of ``snapshot``, which committed ``checkpoint_id`` (records and
    files from Chandy's summary keys, else Iceberg's ``added-records`` / ``added-data-files``)."""
    summary = snapshot.summary
    records = summary.get(RECORDS_KEY) or summary.get("added-records")
    files = summary.get(FILES_KEY) or summary.get("added-data-files")
    offsets = summary.get("chandy.offsets")
    return LakeCommit(checkpoint_id, snapshot.snapshot_id, snapshot.parent_snapshot_id,
                      None if records is None else int(records), None if files is None else int(files),
                      snapshot.timestamp_ms, None if offsets is None else offsets_from_json(offsets))


def commit_in(table: Any, match: Mapping[str, str], checkpoint_id: int) -> LakeCommit | None:
    """The :class:`LakeCommit` of the newest snapshot of ``table`` whose summary holds every item
    of ``match``, or None."""
    for snapshot in reversed(table.snapshots()):
        summary = snapshot.summary
        if summary is not None and all(summary.get(k) == v for k, v in match.items()):
            return snapshot_commit(snapshot, checkpoint_id)
    return None


def without_snapshot(table: Any, checkpoint_id: int, offsets: Mapping[TP, int] | None = None) -> LakeCommit:
    """A commit that added no data file: Iceberg makes no snapshot for it, so the table's current
    snapshot (unchanged) is the version that holds the checkpoint (0 records, 0 files, now);
    ``offsets``: what the table's properties record for it, when it is the job's newest."""
    current = table.current_snapshot()
    version = None if current is None else current.snapshot_id
    return LakeCommit(checkpoint_id, version, version, 0, 0, int(time.time() * 1000), offsets)


def commits_after(table: Any, job_id: str, checkpoint_id: int, newest: int | None,
                  newest_offsets: Mapping[TP, int] | None = None) -> list[LakeCommit]:
    """``table``'s commits of ``job_id``'s checkpoints after ``checkpoint_id``, oldest first: the
    snapshots whose summary names them (newest first, until an earlier checkpoint of the job), and
    the job's ``newest`` checkpoint (from the table's properties) when its commit added no data
    file and so made no snapshot."""
    found: dict[int, LakeCommit] = {}
    for snapshot in reversed(table.snapshots()):
        summary = snapshot.summary
        if summary is None or summary.get("chandy.job_id") != job_id or summary.get("chandy.checkpoint_id") is None:
            continue
        landed = int(summary.get("chandy.checkpoint_id"))
        if landed <= checkpoint_id:
            break
        if landed not in found:  # newest first: the first snapshot met is the checkpoint's commit
            found[landed] = snapshot_commit(snapshot, landed)
    if newest is not None and newest > checkpoint_id and newest not in found:
        found[newest] = without_snapshot(table, newest, newest_offsets)
    return [commit for _, commit in sorted(found.items())]

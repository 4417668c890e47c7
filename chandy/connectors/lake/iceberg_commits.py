"""What an Iceberg table records of Chandy's commits: the snapshot (and so the version a reader
time-travels to) that landed a job's checkpoint, read from the snapshot summaries
:class:`~chandy.connectors.lake.iceberg.IcebergSink` writes (``chandy.job_id``,
``chandy.checkpoint_id``, the commit token, records and files added). Pure functions of a
pyiceberg ``Table``; the sink calls them after a commit and when a restore looks for the commits
a predecessor did not announce.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from types import EllipsisType
from typing import Any

from chandy.connectors.lake.sink import (
    COMMIT_ATTEMPTS,
    COMMIT_TOKEN,
    EVENT_TIMES_KEY,
    FILES_KEY,
    RECORDS_KEY,
    TP,
    LakeCommit,
    LakeCommitError,
    offsets_from_json,
    offsets_to_json,
    recorded_valid_through,
    watermark_metadata,
)

log = logging.getLogger(__name__)

#: the table properties that hold a job's record: ``chandy.job.<job id>.checkpoint_id``, ``.offsets``, ...
PROPERTY_PREFIX = "chandy.job."


def commit_record(job_id: str, checkpoint_id: int, token: str, *, records: int, files: int,
                  offsets: Mapping[TP, int] | None, cluster_id: str | None,
                  event_times: Mapping[TP, int] | None,
                  valid_through_ms: int | None | EllipsisType = ...) -> tuple[dict[str, str], dict[str, str]]:
    """(snapshot summary, table properties) of one Chandy commit: the job, the checkpoint, the
    token, the records and files added, the job's cumulative ``offsets``, the Kafka cluster and
    the completeness watermark of ``event_times`` and ``valid_through_ms``
    (:func:`~chandy.connectors.lake.sink.watermark_metadata`, in the summary, and the per-partition
    times as the job's ``event_time_ms`` property, which a restart reads back)."""
    key = f"{PROPERTY_PREFIX}{job_id}."
    summary = {"chandy.job_id": job_id, "chandy.checkpoint_id": str(checkpoint_id), COMMIT_TOKEN: token,
               RECORDS_KEY: str(records), FILES_KEY: str(files)}
    properties = {key + "checkpoint_id": str(checkpoint_id), key + "commit_token": token}
    if offsets:
        summary["chandy.offsets"] = properties[key + "offsets"] = offsets_to_json(offsets)
    if cluster_id:
        summary["chandy.kafka_cluster_id"] = properties[key + "kafka_cluster_id"] = cluster_id
    watermark = watermark_metadata(event_times, iceberg=True, valid_through=valid_through_ms)
    if watermark:
        summary.update(watermark)
        properties[key + "event_time_ms"] = watermark[EVENT_TIMES_KEY]
    return summary, properties


def recorded_event_times(table: Any, job_id: str) -> dict[TP, int]:
    """The per-partition times of the completeness watermark ``job_id``'s newest commit of
    ``table`` recorded (see :func:`commit_record`)."""
    return offsets_from_json(table.properties.get(f"{PROPERTY_PREFIX}{job_id}.event_time_ms"))


def snapshot_commit(snapshot: Any, checkpoint_id: int) -> LakeCommit:
    """The :class:`LakeCommit` of ``snapshot``, which committed ``checkpoint_id`` (records and
    files from Chandy's summary keys, else Iceberg's ``added-records`` / ``added-data-files``)."""
    summary = snapshot.summary
    records = summary.get(RECORDS_KEY) or summary.get("added-records")
    files = summary.get(FILES_KEY) or summary.get("added-data-files")
    offsets, event_times = summary.get("chandy.offsets"), summary.get(EVENT_TIMES_KEY)
    return LakeCommit(checkpoint_id, snapshot.snapshot_id, snapshot.parent_snapshot_id,
                      None if records is None else int(records), None if files is None else int(files),
                      snapshot.timestamp_ms, None if offsets is None else offsets_from_json(offsets),
                      None if event_times is None else offsets_from_json(event_times), recorded_valid_through(summary))


def commit_in(table: Any, match: Mapping[str, str], checkpoint_id: int) -> LakeCommit | None:
    """The :class:`LakeCommit` of the newest snapshot of ``table`` whose summary holds every item
    of ``match``, or None."""
    for snapshot in reversed(table.snapshots()):
        summary = snapshot.summary
        if summary is not None and all(summary.get(k) == v for k, v in match.items()):
            return snapshot_commit(snapshot, checkpoint_id)
    return None


def holds_token(table: Any, token: str) -> bool:
    """Whether ``table`` holds the commit that carried ``token`` (Chandy's ``chandy.commit_token``,
    a random hex string per commit): a snapshot whose summary names it (an append, a change set,
    a compaction), or a table property whose value it is (a commit that only set properties)."""
    if any((snapshot.summary or {}).get(COMMIT_TOKEN) == token for snapshot in table.snapshots()):
        return True
    return token in table.properties.values()


#: reads of the table that check whether a commit of unknown outcome landed, and the wait
#: before the first retry (seconds, doubled each time), as Iceberg's ``commit.status-check.*``
STATUS_CHECKS = 3
STATUS_CHECK_WAIT_S = 1.0


def is_conflict(exc: BaseException) -> bool:
    """A commit lost to a concurrent one: the catalog's compare-and-swap failed
    (``CommitFailedException``), or pyiceberg's own retry found the rebased commit invalid
    (``ValidationException``, e.g. files added to what an overwrite deletes)."""
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    return isinstance(exc, CommitFailedException | ValidationException)


def data_file_paths(table: Any, snapshots: Any) -> set[str]:
    """The paths of the data files the manifests of ``snapshots`` list (live entries), read from
    the manifests themselves. Not pyiceberg's ``inspect`` tables: they decode every column's
    bounds with the table's *current* schema, which fails (``struct.error``) on the 4-byte bounds
    an int column's older files keep once Iceberg's type promotion made it a long, so a restore
    after a widening could never list what the table references."""
    from pyiceberg.manifest import ManifestContent

    paths: set[str] = set()
    for snapshot in snapshots:
        for manifest in snapshot.manifests(table.io):
            if manifest.content == ManifestContent.DATA:
                paths.update(entry.data_file.file_path for entry in manifest.fetch_manifest_entry(table.io))
    return paths


def commit_failure(exc: Exception, attempt: int, action: str) -> LakeCommitError | None:
    """After commit attempt ``attempt`` (of ``COMMIT_ATTEMPTS``) failed with ``exc``: the error to
    raise (any failure but a lost race with a concurrent commit, or the last attempt's), else None
    after waiting before the next attempt."""
    if not is_conflict(exc) or attempt == COMMIT_ATTEMPTS:
        return LakeCommitError(f"{action} failed (attempt {attempt}): {type(exc).__name__}: {exc}")
    log.warning("%s met a concurrent commit (%s): retrying", action, exc)
    time.sleep(min(2.0, 0.05 * 2 ** attempt))
    return None


def is_refusal(exc: BaseException) -> bool:
    """A commit that certainly did not land: the catalog's compare-and-swap refused it
    (``CommitFailedException``), or pyiceberg did before any request (``ValidationException`` of
    its own rebase, ``ValidationError``). Any other error leaves the outcome unknown: a REST
    catalog's 5xx (``CommitStateUnknownException``), a Glue or Hive timeout, a reset connection
    may come after the catalog swapped the table's metadata."""
    from pyiceberg.exceptions import CommitFailedException, ValidationError, ValidationException

    return isinstance(exc, CommitFailedException | ValidationException | ValidationError)


def read_after_unknown_outcome(read: Callable[[], Any], exc: Exception, action: str, what: str = "the table") -> Any:
    """``read()`` after a commit failed with ``exc`` (``action`` names it, for messages), to learn
    whether it landed, as Iceberg's ``checkCommitStatus`` reads: up to ``STATUS_CHECKS`` times,
    waiting ``STATUS_CHECK_WAIT_S`` seconds, doubled, between reads that fail, until one answers.

    Raises:
        LakeCommitError: no read answered: the outcome stays unknown (whatever the commit wrote
            must be kept: ``what`` may reference it).
    """
    wait_s = STATUS_CHECK_WAIT_S
    for check in range(1, STATUS_CHECKS + 1):
        try:
            return read()
        except Exception as read_error:  # noqa: BLE001 - the catalog's errors are many; each is retried, then reported
            if check == STATUS_CHECKS:
                raise LakeCommitError(
                    f"{action}: the catalog's answer ({type(exc).__name__}: {exc}) leaves the outcome unknown, and "
                    f"{STATUS_CHECKS} reads of {what} to check it failed (the last: {type(read_error).__name__}: "
                    f"{read_error}): the commit may have landed, so what it wrote is kept") from exc
            log.warning("%s: the outcome is unknown (%s) and %s could not be read to check it (%s): "
                        "reading again in %.0f s", action, exc, what, read_error, wait_s)
            time.sleep(wait_s)
            wait_s *= 2
    return None  # not reached


def landed_after(load: Callable[[], Any], exc: Exception, token: str, action: str) -> Any | None:
    """After a commit carrying ``token`` failed with ``exc`` (``action`` names it, for messages):
    the table (``load()``, read again: :func:`read_after_unknown_outcome`) when the commit landed
    all the same; None when it certainly did not (a refusal, :func:`is_refusal`, or a table read
    after the error that does not hold it, :func:`holds_token`).

    Raises:
        LakeCommitError: no read of the table answered: the outcome stays unknown.
    """
    if is_refusal(exc):
        return None
    table = read_after_unknown_outcome(load, exc, action)
    if table is not None and holds_token(table, token):
        log.warning("%s: the catalog answered %s: %s, but the table holds the commit (checked by reading it "
                    "again): it landed", action, type(exc).__name__, exc)
        return table
    log.info("%s: the catalog answered %s and the table, read again, does not hold the commit: it did not land",
             action, type(exc).__name__)
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

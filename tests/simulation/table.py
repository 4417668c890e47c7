"""The lake table in memory: :class:`SimTable` (the table's state, shared by every process) and
:class:`SimSink` (a process's :class:`~chandy.connectors.lake.sink.LakeSink` of it), modelled on
:class:`~chandy.connectors.lake.delta.DeltaLakeSink`:

- each commit records (job, checkpoint) as the job's app transaction version, the job's
  cumulative end offsets (``chandy.offsets``), the records and files it added, a commit token,
  and adds its data files;
- :meth:`SimSink.commit` reads the table (its version and the job's app transaction: skipped
  when the table holds the checkpoint or a later one), then commits; between the two any other
  process may commit. As delta-rs, a commit that meets a commit of the same app id since its read
  fails as a conflict and is retried on the new version (re-checking the app transaction, as
  ``DeltaLakeSink.commit`` does); any other concurrent commit is rebased;
- data files live in the table's location from the moment a task writes them; the table
  references the files its commits added; a file's name carries its coordinator log's ID
  (``coordinator_log_id`` of the process's prefix); :meth:`SimSink.delete_unreferenced` deletes
  the job's files of its log that no commit references, as the Delta sink does: it lists the
  location, reads what the table references, then deletes file by file (separate calls, which the
  schedule may spread out only when ``SimTable.racy_cleanup`` is set).

A data file's content is the offset ranges it holds (what a Spark task read), so the checker
knows every (topic, partition, offset) the table holds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from chandy.connectors.lake.sink import (
    COMMIT_ATTEMPTS,
    DATA_FILE_NAME,
    TP,
    DataFile,
    LakeCommit,
    LakeCommitError,
    TableProgress,
    check_unchanged,
)
from tests.simulation.kernel import World

Range = tuple[str, int, int, int]  # topic, partition, start, end (exclusive)


@dataclasses.dataclass(frozen=True)
class FileInfo:
    path: str
    job_id: str
    checkpoint_id: int
    ranges: tuple[Range, ...]
    records: int
    writer: str


@dataclasses.dataclass(frozen=True)
class TableCommit:
    version: int
    job_id: str
    checkpoint_id: int
    token: str
    offsets: Mapping[TP, int] | None
    cluster_id: str | None
    files: tuple[str, ...]
    records: int
    timestamp: int
    author: str  # the process that made it
    author_prefix: str


class _Conflict(Exception):
    """A concurrent commit of the same app id won the version (delta-rs ``CommitFailedError``)."""


class SimTable:
    """The table's state (see the module docstring)."""

    def __init__(self, world: World, table_uri: str) -> None:
        self.world = world
        self.table_uri = table_uri
        self.commits: list[TableCommit] = []
        self.storage: dict[str, FileInfo] = {}
        self.written: dict[str, FileInfo] = {}  # every file ever written, deleted ones too (the checker's ledger)
        self.txn: dict[str, int] = {}
        self.racy_cleanup = False
        self.version = 0  # bumped at every change the checker looks at
        self._names = 0

    def referenced(self) -> set[str]:
        return {path for commit in self.commits for path in commit.files}

    def new_name(self, job_id: str, checkpoint_id: int, subtask: int, attempt: int, log_id: str) -> str:
        """As :func:`~chandy.connectors.lake.sink.data_file_name`, with a counter for its random part
        (a seed replays exactly)."""
        self._names += 1
        return (f"part-chandy-{job_id[:8]}-{checkpoint_id:010d}-{subtask:05d}-a{attempt}-log{log_id}-"
                f"{self._names:08x}.parquet")


class SimSink:
    """One process's view of :class:`SimTable`: the LakeSink the real LakeCommitter calls."""

    FORMAT = "delta"

    def __init__(self, table: SimTable, process: str, prefix: str) -> None:
        self.table = table
        self.world = table.world
        self.process = process
        self.prefix = prefix
        self.table_uri = table.table_uri
        self.root = table.table_uri
        self.fs = None
        self._tokens = 0

    def _read(self, what: Any) -> Any:
        return self.world.call("table.read", what, lambda: LakeCommitError(
            f"reading table {self.table_uri} failed (simulated storage error)"), allowed=("ok", "fail", "delay", "late"))

    @staticmethod
    def _lake_commit(commit: TableCommit) -> LakeCommit:
        return LakeCommit(commit.checkpoint_id, commit.version, commit.version - 1 if commit.version > 0 else None,
                          commit.records, len(commit.files), commit.timestamp,
                          None if commit.offsets is None else dict(commit.offsets))

    # -- what the committer reads -------------------------------------------------------------------
    def exists(self) -> bool:
        return bool(self.table.commits)

    def committed_checkpoint(self, job_id: str) -> int | None:
        return self._read(lambda: self.table.txn.get(job_id))

    def table_fields(self) -> dict[str, Any] | None:
        return None

    def check_schema(self, data: Any, table_fields: Mapping[str, Any] | None = None, *, where: str = "") -> None:
        pass

    def progress(self, job_id: str, partitions: Iterable[TP] = ()) -> TableProgress:
        def read() -> TableProgress:
            offsets: dict[TP, int] | None = None
            cluster_id = None
            others: dict[str, dict[TP, int]] = {}
            for commit in reversed(self.table.commits):
                if commit.offsets is None:
                    continue
                if commit.job_id == job_id:
                    if offsets is None:
                        offsets, cluster_id = dict(commit.offsets), commit.cluster_id
                elif commit.job_id not in others:
                    others[commit.job_id] = dict(commit.offsets)
            return TableProgress(self.table.txn.get(job_id), offsets or {}, cluster_id, others)

        return self._read(read)

    def missing_files(self, files: Iterable[DataFile]) -> list[str]:
        paths = [f.path for f in files]
        return self._read(lambda: [p for p in paths if p not in self.table.storage])

    def commits_after(self, job_id: str, checkpoint_id: int) -> list[LakeCommit]:
        def read() -> list[LakeCommit]:
            found = []
            for commit in reversed(self.table.commits):
                if commit.job_id != job_id:
                    continue
                if commit.checkpoint_id <= checkpoint_id:
                    break
                found.append(self._lake_commit(commit))
            return found[::-1]

        return self._read(read)

    # -- commits ------------------------------------------------------------------------------------
    def commit(self, job_id: str, checkpoint_id: int, files: Iterable[DataFile], *,
               offsets: Mapping[TP, int] | None = None, cluster_id: str | None = None,
               checked_at: Any = ..., event_times: Any = None, valid_through_ms: Any = ...) -> LakeCommit | None:
        """As ``DeltaLakeSink.commit`` (see the module docstring)."""
        files = list(files)
        table = self.table

        def snapshot() -> tuple[int, int | None, bool]:
            return len(table.commits), table.txn.get(job_id), bool(table.commits)

        read_version, done, exists = self._read(snapshot)
        if done is not None and done >= checkpoint_id:
            return None
        if not files and (not offsets or not exists):
            return None
        check_unchanged(self.table_uri, job_id, checkpoint_id, done, checked_at)
        read_done = done if checked_at is ... else checked_at
        self._tokens += 1
        token = f"{self.process}-{self._tokens}"
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            base = read_version

            def write(base: int = base) -> LakeCommit:
                if any(c.job_id == job_id for c in table.commits[base:]):
                    raise _Conflict(f"concurrent transaction of app id {job_id}")
                commit = TableCommit(len(table.commits), job_id, checkpoint_id, token,
                                     None if not offsets else dict(offsets), cluster_id, tuple(f.path for f in files),
                                     sum(f.records for f in files), self.world.now_ms(), self.process, self.prefix)
                table.commits.append(commit)
                table.txn[job_id] = checkpoint_id
                table.version += 1
                self.world.note(f"{self.process}: table commit v{commit.version} of checkpoint {checkpoint_id} "
                                f"({len(files)} files, offsets {dict(sorted((offsets or {}).items()))})")
                return self._lake_commit(commit)

            try:
                return self.world.call("table.commit", write, lambda: LakeCommitError(
                    f"committing checkpoint {checkpoint_id} to {self.table_uri} failed (simulated storage error)"))
            except _Conflict as exc:
                if attempt == COMMIT_ATTEMPTS:
                    raise LakeCommitError(f"committing checkpoint {checkpoint_id} to {self.table_uri} failed "
                                          f"(attempt {attempt}): {exc}") from exc
                read_version, done, exists = self._read(snapshot)
                if done is not None and done >= checkpoint_id:
                    ours = [c for c in table.commits if c.token == token] if done == checkpoint_id else []
                    return self._lake_commit(ours[0]) if ours else None
                check_unchanged(self.table_uri, job_id, checkpoint_id, done, read_done)
                self.world.sleep(min(2000, 50 * 2 ** attempt))
        return None  # not reached

    def commit_changes(self, job_id: str, checkpoint_id: int, files: Iterable[DataFile], **kwargs: Any) -> LakeCommit | None:
        """As ``DeltaLakeSink.commit_changes``: the same idempotence check and ``checked_at`` guard,
        before the merge and after a conflict, as :meth:`commit`; the merge itself is modelled as
        the append of the files' ranges (what the checker counts is which offsets landed, once)."""
        return self.commit(job_id, checkpoint_id, files, **kwargs)

    # -- files ----------------------------------------------------------------------------------------
    def write_ranges(self, job_id: str, checkpoint_id: int, subtask: int, attempt: int,
                     ranges: tuple[Range, ...], *, table_uri: str | None = None, log_id: str) -> list[DataFile]:
        """A Spark task's files of ``ranges`` (one file), written into the table's location
        (``table_uri``: the routed table's URI its state handle names, None for the job's own)."""
        if not ranges:
            return []
        path = self.table.new_name(job_id, checkpoint_id, subtask, attempt, log_id)
        records = sum(end - start for _, _, start, end in ranges)
        info = FileInfo(path, job_id, checkpoint_id, ranges, records, self.process)

        def write() -> None:
            self.table.storage[path] = info
            self.table.written[path] = info
            self.table.version += 1

        self.world.call("table.write", write, lambda: LakeCommitError(f"writing {path} failed (simulated)"))
        return [DataFile(path, 100 * records, records, {}, self.world.now_ms(), "", table_uri)]

    def delete_unreferenced(self, job_id: str, *, keep_checkpoints_after: int | None = None,
                            log_id: str | None = None) -> list[str]:
        """As ``DeltaLakeSink.delete_unreferenced`` (see the module docstring)."""
        racy = self.table.racy_cleanup
        allowed = ("ok", "fail", "delay", "late") if racy else ("ok", "fail")
        listing = self.world.call("table.list", lambda: sorted(self.table.storage), lambda: LakeCommitError(
            f"listing {self.table_uri} failed (simulated)"), allowed=allowed)
        referenced = self.world.call("table.read", lambda: set(self.table.referenced()), lambda: LakeCommitError(
            f"reading table {self.table_uri} failed (simulated)"), allowed=allowed)
        deleted = []
        for path in listing:
            match = DATA_FILE_NAME.search(path)
            if match is None or not job_id.startswith(match["job"]) or path in referenced:
                continue
            if log_id is not None and match["log"] not in (None, log_id):
                continue
            if keep_checkpoints_after is not None and int(match["checkpoint"]) > keep_checkpoints_after:
                continue

            def delete(path: str = path) -> None:
                if self.table.storage.pop(path, None) is not None:
                    self.table.version += 1
                    self.world.note(f"{self.process}: deleted unreferenced {path}")

            self.world.call("table.delete", delete, lambda path=path: LakeCommitError(f"deleting {path} failed (simulated)"),
                            allowed=allowed)
            deleted.append(path)
        return deleted

    # -- not used by the committer's paths the simulation drives ------------------------------------------
    def write_files(self, *args: Any, **kwargs: Any) -> list[DataFile]:
        raise NotImplementedError

    def optimize(self, *, target_size: int | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def vacuum(self, *, retention_hours: float, dry_run: bool = False, retain_last: int = 1) -> list[str]:
        raise NotImplementedError

    def read_table(self) -> Any:
        raise NotImplementedError

    def read_commit(self, table_version: int, previous_table_version: int | None) -> Any:
        raise NotImplementedError

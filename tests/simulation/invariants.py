"""What must hold after every step of a schedule (docs/design.md, "The commit-protocol
simulation"). Each violation is (invariant, what was seen):

- ``duplicate``: no (topic, partition, offset) is in the table twice;
- ``gap``: the table holds each partition's offsets without a hole, from where the job started
  (offset 0 with ``earliest``) to its newest commit (a hole is a record skipped for good);
- ``missing-file``: every file the table references exists;
- ``group-ahead``: every offset below the consumer group's committed position is in the table;
- ``group-moved-back``: the group's committed offset never moves back (seen at each commit; not
  checked when two coordinator logs run one job: nothing orders their transactions' group commits);
- ``fenced-write``: no transaction of a fenced producer lands in the log or the group (seen at
  each commit);
- ``commit-without-completion``: the table commits a checkpoint only once the committing
  coordinator's log holds its completion (a durable decision, never a fenced one);
- ``lake-event``: every ``LAKE_COMMITTED`` event names exactly what the table holds for its
  checkpoint: the job's commit of that checkpoint at that version, its records and files, and
  (when the event carries them) offset ranges equal to what the commit's files hold;
  (``lake-event-start``: the ranges differ only in where they start);
- ``lake-event-twice``: no checkpoint of one table is announced twice on one events topic.
- ``watermark``: a ``LAKE_COMMITTED`` event's completeness watermark ``valid_through_ms`` W claims
  nothing that is not in a table: every record of every source partition stamped before W (from
  where the job started) is in the tables when the event is published, and no record stamped
  before W comes later into a partition no table held a record of when W was claimed (a
  partition never read holds the watermark back, as a Flink split that emitted nothing; a record
  stamped before W in a partition read already is late data, which a watermark allows). docs/pipeline.md,
  "A completeness watermark".

With routed tables (``Config.routed``) the table is their union: a partition's records land in
one of them, every table's commits and files count, an event is checked against its own table's
commits, and the offset ranges of ``--table``'s event (the whole checkpoint's) against the files
of that checkpoint's commits in every table. The job's recorded offsets are checked against
``--table``'s newest commit only: it is committed last, so a routed table's commit of N records
offsets of ``--table``'s partitions that land a moment later.
"""

from __future__ import annotations

import bisect
import collections
from typing import Any

from tests.simulation.table import TableCommit

TP = tuple[str, int]


def merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if out and start == out[-1][1]:
            out[-1] = (out[-1][0], end)
        else:
            out.append((start, end))
    return out


class Checker:
    """Checks a simulation's world after each step (see the module docstring)."""

    def __init__(self, sim: Any, *, ignore: frozenset[str] = frozenset(), group_monotonic: bool = True) -> None:
        self.sim = sim
        self.ignore = ignore
        self.group_monotonic = group_monotonic
        self._cluster_violations = 0
        self._versions: tuple[int, ...] = ()
        self._events_seen: dict[str, int] = collections.defaultdict(int)
        self._announced: dict[tuple[str, str], dict[int, int]] = collections.defaultdict(dict)
        self._commits_checked: dict[str, int] = collections.defaultdict(int)
        #: watermarks claimed: (W, the event, its owner, the partitions the tables held records of then)
        self.claims: list[tuple[int, Any, str, frozenset[TP]]] = []

    def check(self) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        cluster = self.sim.cluster
        new = cluster.violations[self._cluster_violations:]
        self._cluster_violations = len(cluster.violations)
        found += [v for v in new if self.group_monotonic or v[0] != "group-moved-back"]
        versions = (cluster.version, *(table.version for table in self.sim.tables))
        if versions != self._versions:
            self._versions = versions
            found += self._check_table()
            found += self._check_events()
            found += self._check_claims()
        return [v for v in found if v[0] not in self.ignore]

    # -- the table and the group ----------------------------------------------------------------------------
    def coverage(self) -> dict[TP, list[tuple[int, int]]]:
        ranges: dict[TP, list[tuple[int, int]]] = collections.defaultdict(list)
        for table in self.sim.tables:
            for commit in table.commits:
                for path in commit.files:
                    info = table.storage.get(path) or table.written.get(path)
                    if info is None:
                        continue
                    for topic, partition, start, end in info.ranges:
                        ranges[(topic, partition)].append((start, end))
        return ranges

    def origin(self, tp: TP) -> int:
        """With ``earliest``: where the job began reading ``tp``, the starting offset of the split
        of the run that fixed the first committed range of it (the run whose tasks wrote its file;
        for a commit that records ``tp``'s offsets without a file of it, the committing run); 0
        before any commit did, or when unknown."""
        commits = sorted(((commit.timestamp, commit.version, i), table, commit)
                         for i, table in enumerate(self.sim.tables) for commit in table.commits)
        writers = [info.writer for _, table, commit in commits
                   for info in (table.written.get(path) for path in commit.files)
                   if info is not None and any((t, p) == tp for t, p, _, _ in info.ranges)]
        authors = [commit.author for _, _, commit in commits if tp in (commit.offsets or {})]
        name = writers[0] if writers else authors[0] if authors else None
        process = next((p for p in self.sim.processes if p.name == name), None)
        return 0 if process is None else process.split_starts.get(tp, 0)

    def _check_table(self) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        table, cluster = self.sim.table, self.sim.cluster
        for each in self.sim.tables:
            for commit in each.commits:
                for path in commit.files:
                    if path not in each.storage:
                        found.append(("missing-file", f"{each.table_uri} version {commit.version} (checkpoint "
                                                      f"{commit.checkpoint_id}) references {path}, which is gone"))
        coverage = self.coverage()
        earliest = self.sim.config.starting_offsets == "earliest"
        recorded: dict[TP, list[int]] = collections.defaultdict(list)
        for commit in (c for each in self.sim.tables for c in each.commits):
            for tp, offset in (commit.offsets or {}).items():
                recorded[tp].append(offset)
        ends: dict[TP, int] = {}
        for tp in sorted(set(coverage) | set(recorded)):
            ordered = sorted(coverage.get(tp, ()))
            for (_, e1), (s2, e2) in zip(ordered, ordered[1:], strict=False):
                if s2 < e1:
                    found.append(("duplicate", f"{tp[0]}-{tp[1]} offsets [{s2}, {min(e1, e2)}) are in the table twice"))
            # where the job started: with earliest, where the split of the run that first landed
            # records of the partition began (0, or the log start it found: records deleted before
            # a run's discovery, with no checkpoint of the job completed, are none the job read;
            # Flink's OffsetsInitializer runs again then); else the lowest it ever recorded or holds
            origin = self.origin(tp) if earliest else min([s for s, _ in ordered] + recorded.get(tp, []))
            reach = origin
            for start, end in ordered:
                if start > reach:
                    found.append(("gap", f"{tp[0]}-{tp[1]} offsets [{reach}, {start}) are not in the table, but later "
                                         f"ones are (up to {ordered[-1][1]})"))
                    break
                reach = max(reach, end)
            ends[tp] = reach
        newest = next((c for c in reversed(table.commits) if c.offsets), None)
        for tp, offset in sorted(((newest.offsets or {}) if newest is not None else {}).items()):
            if offset > ends.get(tp, 0):
                found.append(("gap", f"the table records {tp[0]}-{tp[1]} up to {offset} but holds it only up to "
                                     f"{ends.get(tp, 0)}"))
        for group_id, offsets in cluster.groups.items():
            for tp, offset in sorted(offsets.items()):
                held = ends.get(tp, self.origin(tp) if earliest else None)
                if held is not None and offset > held:
                    found.append(("group-ahead", f"group {group_id} committed {tp[0]}-{tp[1]} at {offset}, but the table "
                                                 f"holds it only up to {held}"))
        for each in self.sim.tables:
            for commit in each.commits[self._commits_checked[each.table_uri]:]:
                if (commit.author_prefix, commit.checkpoint_id) not in cluster.durable_completed:
                    found.append(("commit-without-completion",
                                  f"{commit.author} committed checkpoint {commit.checkpoint_id} to {each.table_uri} "
                                  f"(version {commit.version}), but its log ({commit.author_prefix}) holds no completion "
                                  "of it"))
            self._commits_checked[each.table_uri] = len(each.commits)
        return found

    # -- LAKE_COMMITTED -----------------------------------------------------------------------------------------
    def _check_events(self) -> list[tuple[str, str]]:
        found: list[tuple[str, str]] = []
        tables = {table.table_uri: table for table in self.sim.tables}
        for prefix, events in self.sim.cluster.events.items():
            for event, owner in events[self._events_seen[prefix]:]:
                if event.event_type != "LAKE_COMMITTED":
                    continue
                table = tables.get(event.table_uri)
                if table is None:
                    found.append(("lake-event", f"LAKE_COMMITTED of checkpoint {event.checkpoint_id} by {owner} names "
                                                f"table {event.table_uri}, which the job does not write"))
                    continue
                found += self._check_event(prefix, event, owner, table.commits)
                found += self._check_watermark(event, owner)
            self._events_seen[prefix] = len(events)
        return found

    def _check_watermark(self, event: Any, owner: str) -> list[tuple[str, str]]:
        watermark = event.valid_through_ms
        if watermark is None:
            return []
        coverage = {tp: merged(sorted(ranges)) for tp, ranges in self.coverage().items()}
        self.claims.append((watermark, event, owner, frozenset(tp for tp, held in coverage.items() if held)))
        earliest = self.sim.config.starting_offsets == "earliest"
        for tp, times in sorted(self.sim.cluster.source_times.items()):
            before = bisect.bisect_left(times, watermark)  # offsets [0, before) are stamped before W
            held = coverage.get(tp, [])
            origin = self.origin(tp) if earliest else (held[0][0] if held else before)
            if origin < before and not any(start <= origin and before <= end for start, end in held):
                return [("watermark", f"LAKE_COMMITTED of checkpoint {event.checkpoint_id} by {owner} "
                                      f"({event.table_uri}) says every record before {watermark} is in, but "
                                      f"{tp[0]}-{tp[1]} offsets [{origin}, {before}) are stamped before it and the "
                                      f"tables hold {held}")]
        return []

    def _check_claims(self) -> list[tuple[str, str]]:
        """No record stamped before a claimed watermark came into a partition the tables held no
        record of when it was claimed (see the module docstring)."""
        for watermark, event, owner, read in self.claims:
            for tp, times in sorted(self.sim.cluster.source_times.items()):
                if tp not in read and times and min(times) < watermark:
                    return [("watermark", f"LAKE_COMMITTED of checkpoint {event.checkpoint_id} by {owner} "
                                          f"({event.table_uri}) said every record before {watermark} is in, while the "
                                          f"tables held no record of {tp[0]}-{tp[1]}, which now holds one stamped "
                                          f"{min(times)}")]
        return []

    def _check_event(self, prefix: str, event: Any, owner: str, commits: list[TableCommit]) -> list[tuple[str, str]]:
        n, version = event.checkpoint_id, event.table_version
        where = f"LAKE_COMMITTED of checkpoint {n} by {owner} on {prefix}'s events ({event.table_uri} version {version})"
        previous = self._announced[(prefix, event.table_uri)].get(n)
        self._announced[(prefix, event.table_uri)][n] = version
        if previous is not None:
            return [("lake-event-twice", f"{where}: checkpoint {n} was announced before (version {previous})")]
        if version is None or not 0 <= version < len(commits):
            return [("lake-event", f"{where}: the table has no such version")]
        commit = commits[version]
        if commit.job_id != event.job_id or commit.checkpoint_id != n:
            return [("lake-event", f"{where}: the table's version {version} is checkpoint {commit.checkpoint_id} "
                                   f"of job {commit.job_id}")]
        if event.records_added is not None and event.records_added != commit.records:
            return [("lake-event", f"{where}: it says {event.records_added} records, the commit added {commit.records}")]
        if event.files_added is not None and event.files_added != len(commit.files):
            return [("lake-event", f"{where}: it says {event.files_added} files, the commit added {len(commit.files)}")]
        if event.offset_ranges is None:
            return []
        announced: dict[TP, list[tuple[int, int]]] = collections.defaultdict(list)
        for r in event.offset_ranges:
            announced[(r.topic, r.partition)].append((r.start_offset, r.end_offset))
        held: dict[TP, list[tuple[int, int]]] = collections.defaultdict(list)
        for path in commit.files:
            info = self.sim.table.written.get(path)
            for topic, partition, start, end in info.ranges if info is not None else ():
                held[(topic, partition)].append((start, end))
        if len(self.sim.tables) > 1:
            return self._check_routed_event(where, announced, held)
        a = {tp: merged(v) for tp, v in announced.items()}
        h = {tp: merged(v) for tp, v in held.items()}
        if a != h:
            # the same ends from another start: what a check of the recorded ends alone lets through
            same_ends = a.keys() == h.keys() and all(a[tp][-1][1] == h[tp][-1][1] for tp in a)
            return [("lake-event-start" if same_ends else "lake-event",
                     f"{where}: it names ranges {sorted(a.items())}, the commit holds {sorted(h.items())}")]
        return []

    def _check_routed_event(self, where: str, announced: dict[TP, list[tuple[int, int]]],
                            held: dict[TP, list[tuple[int, int]]]) -> list[tuple[str, str]]:
        """``--table``'s event of a routed job names the whole checkpoint's ranges, which its
        own commit holds only in part: the rest went to routed tables, which commit N only when N
        routes records to them and skip N when they hold its ranges already (under another
        checkpoint ID, of another coordinator log of the job). So: every range ``--table``'s commit
        holds is named, and every range named is in the lake (some table holds it)."""
        coverage = {tp: merged(v) for tp, v in self.coverage().items()}
        named = {tp: merged(v) for tp, v in announced.items()}
        for tp, ranges in sorted(held.items()):
            for start, end in merged(ranges):
                if not any(s <= start and end <= e for s, e in named.get(tp, ())):
                    return [("lake-event", f"{where}: the commit holds {tp[0]}-{tp[1]} [{start}, {end}), which it does "
                                           f"not name ({sorted(named.items())})")]
        for tp, ranges in sorted(named.items()):
            for start, end in ranges:
                if not any(s <= start and end <= e for s, e in coverage.get(tp, ())):
                    return [("lake-event", f"{where}: it names {tp[0]}-{tp[1]} [{start}, {end}), which no table holds "
                                           f"whole ({sorted(coverage.get(tp, ()))})")]
        return []

"""The commit protocol's deterministic simulation (docs/design.md, "The commit-protocol
simulation"): the real coordinator core, lake committer, Kafka source enumerator and log writer,
driven through thousands of seeded schedules against in-memory stand-ins of the coordinator log,
the consumer group, the source topic and the table, every invariant checked after every step.

- ``test_campaign``: the default campaign (``CHANDY_SIM_SCHEDULES`` schedules, 1000 by default);
  ``test_campaign_long`` (``-m slow``) runs 20,000 others.
- ``test_replay``: one schedule, with its whole trace and the real code's logs:
  ``CHANDY_SIM_SEED=123 .venv/bin/pytest tests/simulation -k replay -s`` (a failure prints this
  line, with ``CHANDY_SIM_FAMILY`` when the schedule is not the campaign's).
- ``test_mutation_*``: each turns one rule of the protocol off and requires the simulation to
  find a schedule that breaks an invariant (and that the real rule keeps).
- real bugs the simulation found, each fixed and kept as a test of the seeds that found it, with
  a mutation test that turns its fix off (docs/design.md §10 lists them); a bug found and not yet
  fixed is a strict xfail ``test_bug_*``.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from chandy.connectors.kafka.source.enumerator import KafkaSourceEnumerator
from chandy.connectors.lake.committer import LakeCommitter
from tests.simulation import process as process_module
from tests.simulation.kafka import SimCluster
from tests.simulation.scenario import Result, family_of, run_schedule

SCHEDULES = int(os.environ.get("CHANDY_SIM_SCHEDULES", "1000"))
LONG_SCHEDULES = int(os.environ.get("CHANDY_SIM_SCHEDULES", "20000"))


@pytest.fixture
def quiet() -> Iterator[None]:
    """The real code logs every injected failure (tracebacks included): not thousands of times."""
    logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


#: the families of the long campaign, by seed (the default campaign's are ``family_of``)
LONG_FAMILIES = ("one-log", "two-logs", "lost-log-latest", "racy-cleanup", "routed", "routed-two-logs",
                 "routed-two-logs-faults", "cdc-two-logs-faults", "watermark", "watermark-routed", "truncation",
                 "truncation-routed")


def campaign(seeds: range, family: Callable[[int], str] = lambda seed: "campaign"
             ) -> tuple[Result | None, collections.Counter, int]:
    """Run the schedules of ``seeds``; the first that breaks an invariant, if any, the totals of
    their statistics and how many landed something."""
    totals: collections.Counter = collections.Counter()
    landed = 0
    for seed in seeds:
        name = family(seed)
        started = time.perf_counter()
        result = run_schedule(seed, name)
        took = time.perf_counter() - started
        # a schedule takes tens of ms: seconds mean the real code waited on something outside the world
        assert took < 10, f"schedule {seed} ({name}) took {took:.1f} s of real time: a client or clock not simulated?"
        totals.update(result.stats)
        totals[f"family {family_of(seed) if name == 'campaign' else name}"] += 1
        landed += result.stats["lake_commits"] > 0
        if result.violations:
            return result, totals, landed
    return None, totals, landed


def test_campaign(quiet: None) -> None:
    failed, totals, landed = campaign(range(SCHEDULES))
    if failed is not None:
        pytest.fail(failed.report())
    # the schedules did what they are for: landed records, fenced zombies, lost and compacted logs
    assert landed >= 0.8 * SCHEDULES, totals
    assert totals["fenced"] > 0 and totals["lost_logs"] > 0 and totals["compactions"] > 0, totals
    assert totals["faults"] > 10 * SCHEDULES, totals


@pytest.mark.slow
def test_family_long(quiet: None) -> None:
    """One family (``CHANDY_SIM_FAMILY``, default ``routed-two-logs-faults``) for
    ``CHANDY_SIM_SCHEDULES`` schedules (20,000 by default) from seed 1,000,000: issue 54's
    acceptance runs of each family."""
    family = os.environ.get("CHANDY_SIM_FAMILY", "routed-two-logs-faults")
    failed, totals, _ = campaign(range(1_000_000, 1_000_000 + LONG_SCHEDULES), lambda seed: family)
    if failed is not None:
        pytest.fail(failed.report())
    print(family, dict(totals))


@pytest.mark.slow
def test_campaign_long(quiet: None) -> None:
    failed, totals, _ = campaign(range(1_000_000, 1_000_000 + LONG_SCHEDULES),
                                 lambda seed: LONG_FAMILIES[seed % len(LONG_FAMILIES)])
    if failed is not None:
        pytest.fail(failed.report())
    print(dict(totals))


def test_replay() -> None:
    """One schedule, told in full (``CHANDY_SIM_SEED``, and ``CHANDY_SIM_FAMILY`` unless it is the
    default campaign's)."""
    seed = os.environ.get("CHANDY_SIM_SEED")
    if seed is None:
        pytest.skip("replays CHANDY_SIM_SEED=<seed> (CHANDY_SIM_FAMILY=<family>)")
    family = os.environ.get("CHANDY_SIM_FAMILY", "campaign")
    result = run_schedule(int(seed), family)
    print(result.report(full=True))
    assert not result.violations, result.report()


def test_a_seed_replays_exactly(quiet: None) -> None:
    first, again = run_schedule(7), run_schedule(7)
    assert first.trace == again.trace and first.stats == again.stats
    assert first.stats["lake_commits"] > 0


# -- mutations: each rule off, the simulation must notice -----------------------------------------------
def caught(mutate: Callable[[pytest.MonkeyPatch], None], family: str, monkeypatch: pytest.MonkeyPatch, *,
           seeds: int, ignore: frozenset[str] = frozenset(), first: int = 0) -> Result:
    """The first schedule of ``family`` (seeds ``first`` to ``first + seeds``) that breaks an
    invariant with the rule off (``mutate``) and keeps them all with the real rule."""
    for seed in range(first, first + seeds):
        with monkeypatch.context() as patch:
            mutate(patch)
            mutated = run_schedule(seed, family, checker_ignores=ignore)
        if mutated.violations and not run_schedule(seed, family).violations:
            return mutated
    pytest.fail(f"with the rule off, none of {seeds} schedules of family {family} broke an invariant")


def test_mutation_fencing_off_is_caught(quiet: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The log accepts the transactions of a fenced producer: a zombie's decisions land. Caught by
    their consequences (a group moving back, a checkpoint announced twice, ...), not by the
    invariant that watches fenced writes themselves."""
    found = caught(lambda p: p.setattr(SimCluster, "fenced", lambda self, producer: False), "one-log", monkeypatch,
                   seeds=100, ignore=frozenset({"fenced-write"}))
    assert found.violations[0][0] in {"duplicate", "gap", "group-moved-back", "group-ahead", "lake-event",
                                      "lake-event-twice", "missing-file"}, found.report()


def test_mutation_trust_memory_is_caught(quiet: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lake committer believes its memory (issue 44, item 3): it neither compares a checkpoint
    the table holds with its own ranges nor reads the table's offsets again when another
    coordinator of the job committed. One job under two coordinator logs then lands records twice
    or announces ranges the table does not hold."""

    def trust_memory(patch: pytest.MonkeyPatch) -> None:
        patch.setattr(LakeCommitter, "_check_recorded", lambda self, sink, checkpoint_id, ranges: None)
        read_table = LakeCommitter._read_table
        patch.setattr(LakeCommitter, "_read_table",
                      lambda self, sink, *args: self._views.get(sink.table_uri) or read_table(self, sink, *args))

    found = caught(trust_memory, "two-logs", monkeypatch, seeds=100)
    # group-ahead: the verification of a skipped checkpoint reads the table through the same memory
    assert found.violations[0][0] in {"duplicate", "lake-event", "lake-event-start", "group-ahead"}, found.report()


def test_mutation_starting_offsets_win_over_the_table_is_caught(quiet: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a lost log, ``--starting-offsets latest`` wins over the table's offsets for partitions
    the table holds (issue 44, item 1, before its fix): records produced while the job was down
    are skipped for good."""
    handle_discovery = KafkaSourceEnumerator._handle_discovery

    def initializer_wins(self: KafkaSourceEnumerator, result: Any, error: BaseException | None) -> None:
        options = self.options
        if error is None and result is not None:
            _, new, _ = result
            # the table's offsets only raise a start (the rule before the fix), never lower it
            floor = {tp: f for tp, f in options.offset_floor.items() if not (tp in new and new[tp] > f)}
            self.options = dataclasses.replace(options, offset_floor=floor)
        try:
            handle_discovery(self, result, error)
        finally:
            self.options = options

    def mutate(patch: pytest.MonkeyPatch) -> None:
        patch.setattr(KafkaSourceEnumerator, "_handle_discovery", initializer_wins)
        # the committer's refusal of a range above the table's offsets, a second defence since, off too
        patch.setattr(LakeCommitter, "_check_ranges", _gaps_off)

    found = caught(mutate, "lost-log-latest", monkeypatch, seeds=150)
    assert found.violations[0][0] == "gap", found.report()


@pytest.mark.skipif(not process_module._PROVES_EPOCH, reason="this LogWriter has no epoch proof to turn off")
def test_mutation_stuck_producer_without_epoch_proof_is_caught(quiet: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A log writer that replaces its stuck producer and writes on without asking the log for a
    newer coordinator (issue 44, item 2, before its fix) fences the plain restart that replaced it
    and writes its stale batch: the group moves back, a checkpoint is announced twice."""
    found = caught(lambda p: p.setattr(process_module, "_PROVES_EPOCH", False), "stuck-writers", monkeypatch, seeds=100)
    assert found.violations[0][0] in {"group-moved-back", "lake-event-twice", "duplicate", "lake-event", "lake-event-start"}, found.report()


# -- real bugs the simulation found -----------------------------------------------------------------------
def first_failure(family: str, seeds: int) -> Result | None:
    for seed in range(seeds):
        result = run_schedule(seed, family)
        if result.violations:
            return result
    return None


def test_stuck_producer_replacement_keeps_the_protocol(quiet: None) -> None:
    """Found by this simulation as a bug, then fixed: the epoch proof after a stuck producer's
    replacement compared epoch numbers only. A restart whose epoch record never landed (its first
    transaction hung) wrote on over what the coordinator it replaced wrote after its replay (seed
    22: a checkpoint announced twice); the next restart, replaying a log without that record, took
    the same epoch number and passed the comparison (seed 37: the group moved back). The proof now
    names the coordinator instance and, when its own record never landed, requires the log to hold
    exactly what its replay found."""
    for seed in (22, 37):
        result = run_schedule(seed, "stuck-writers")
        assert not result.violations, result.report()
    failed = first_failure("stuck-writers", 80)
    assert failed is None, failed.report()


def test_mutation_stuck_producer_proof_by_epoch_number_is_caught(quiet: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The proof by epoch numbers alone (before the fix above): two coordinators of one epoch
    number, or one whose epoch record never landed, write over each other."""
    found = caught(lambda p: p.setattr(process_module, "_PROVES_OWNER", False), "stuck-writers", monkeypatch, seeds=100)
    assert found.violations[0][0] in {"group-moved-back", "lake-event-twice", "duplicate", "lake-event",
                                      "lake-event-start"}, found.report()


def test_two_logs_a_commit_racing_the_check_keeps_the_protocol(quiet: None) -> None:
    """Found by this simulation as a bug, then fixed: under two logs with slow calls the
    committer's range check and the table commit were not one step, and the other run's commit
    between them made records land twice (family two-logs-faults, seed 213). The sink now commits
    only while the table holds the job's checkpoint the check read (``check_unchanged``)."""
    result = run_schedule(213, "two-logs-faults")
    assert not result.violations, result.report()


def test_two_logs_cleanups_keep_the_protocol(quiet: None) -> None:
    """Found by this simulation as a bug, then fixed: under two logs with slow calls one run's
    cleanup of an aborted checkpoint deleted the files the other run was committing under the same
    checkpoint ID, after its missing-files check (seed 119: the table referenced files that were
    gone). A data file's name now carries its coordinator log's ID (``coordinator_log_id``) and a
    cleanup deletes only its own log's files."""
    result = run_schedule(119, "two-logs-faults")
    assert not result.violations, result.report()
    failed = first_failure("two-logs-faults", 200)
    assert failed is None, failed.report()


def _without_log_id(init: Callable[..., None]) -> Callable[..., None]:
    def patched(self: LakeCommitter, *args: object, **kwargs: object) -> None:
        kwargs["log_id"] = None
        init(self, *args, **kwargs)
    return patched


def test_mutation_cleanup_of_every_log_is_caught(quiet: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cleanup that deletes the unreferenced files of every coordinator log of the job (before
    the fix above) deletes files the other log's run is committing."""
    found = caught(lambda p: p.setattr(LakeCommitter, "__init__", _without_log_id(LakeCommitter.__init__)),
                   "two-logs-faults", monkeypatch, seeds=400)  # the first since issue 54's table reads: seed 349
    assert found.violations[0][0] == "missing-file", found.report()


def test_two_logs_same_end_other_start_keep_the_protocol(quiet: None) -> None:
    """Found by this simulation as a bug, then fixed: ``LakeCommitter._check_recorded`` compared
    only the end offsets the table recorded for checkpoint N, so another run's commit of N with the
    same end from another start passed, and LAKE_COMMITTED named ranges the table does not hold
    (seed 1000705: checkpoint 8 announced as [40, 50), the table's 8 holds [45, 50)). It now
    refuses a start below where the job's commit before N ended too."""
    for seed in (1000705, 1003233, 1003861):
        result = run_schedule(seed, "two-logs")
        assert not result.violations, result.report()


def test_mutation_check_recorded_ends_only_is_caught(quiet: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check by end offsets alone (before the fix above) announces ranges the table does not hold."""
    monkeypatch.setattr(LakeCommitter, "_offsets_before", lambda self, sink, checkpoint_id: None)
    found = run_schedule(1003651, "two-logs")  # seed 1000705 before later fixes reshuffled the schedules
    assert found.violations and found.violations[0][0] in {"lake-event-start", "lake-event"}, found.report()


def test_two_logs_latest_first_runs_keep_the_protocol(quiet: None) -> None:
    """Found by this simulation as a bug, then fixed: two first runs of one job under two logs with
    ``--starting-offsets latest`` start at different offsets, and the committer committed a range
    starting above the table's offsets (an empty one too, whose end the commit records) with a
    warning only: the offsets between were skipped for good (seed 1004909: orders-0 [6, 13)).
    ``_check_ranges`` now refuses it; a restart resumes from the table's offsets. Seed 1002437: an
    empty range above the table's offsets, in a checkpoint the table held already by ID (the other
    log's run had committed a higher one), was skipped and its end committed to the group."""
    for seed in (1003737, 1004909, 1009861, 1002437):
        result = run_schedule(seed, "two-logs")
        assert not result.violations, result.report()


def _gaps_off(self, sink, checkpoint_id, ranges, already_committed, held, *, gaps=True):
    """``LakeCommitter._check_ranges`` without its refusal of a range above the table's offsets."""
    return _CHECK_RANGES(self, sink, checkpoint_id, ranges, already_committed, held, gaps=False)


_CHECK_RANGES = LakeCommitter._check_ranges


def test_mutation_gaps_only_warned_is_caught(quiet: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The gap check off (the warning before the fix above): offsets skipped for good."""
    monkeypatch.setattr(LakeCommitter, "_check_ranges", _gaps_off)
    found = run_schedule(1000427, "two-logs")  # seed 1004909 before later fixes reshuffled the schedules
    assert found.violations and found.violations[0][0] in {"gap", "group-ahead"}, found.report()


def test_restore_cleanup_of_a_fenced_coordinator_keeps_the_protocol(quiet: None) -> None:
    """Found by this simulation as a bug, then fixed: the restore's cleanup (issue 44, item 6,
    bounded by every checkpoint ID its log handed out) of a coordinator fenced right after its
    ``init_transactions`` that replayed the log after the coordinator that fenced it wrote there
    covered that coordinator's checkpoints and deleted their files while they were committed
    (seed 310: the table referenced files that were gone). The cleanup now waits until the
    coordinator's start is in its log (``context.when_logged``); a fenced one never cleans up."""
    for seed in (310, 487, 1000787):
        result = run_schedule(seed, "racy-cleanup")
        assert not result.violations, result.report()
    failed = first_failure("racy-cleanup", 200)
    assert failed is None, failed.report()


# -- issue 54: every table a checkpoint touches, one guarded commit -----------------------------------------
def test_routed_families_keep_the_protocol(quiet: None) -> None:
    """Routed tables (three partitions, two routed to tables of their own, committed before
    ``--table``) with kills and faults between the tables' commits, under one and two coordinator
    logs: 100 schedules of each family (the default campaign runs 250 more), every invariant over
    the union of the tables."""
    for family in ("routed", "routed-two-logs", "routed-two-logs-faults"):
        failed, totals, landed = campaign(range(100), lambda seed, family=family: family)
        if failed is not None:
            pytest.fail(failed.report())
        assert landed >= 75 and totals["lake_commits"] > 3 * totals["checkpoints_completed"] / 2, (family, totals)


def test_cdc_merges_keep_the_protocol(quiet: None) -> None:
    """``--cdc``: every commit a merge (``commit_changes``), through the same guarded sequence as an
    append, under two coordinator logs with slow and failing calls: 100 schedules."""
    failed, totals, landed = campaign(range(100), lambda seed: "cdc-two-logs-faults")
    if failed is not None:
        pytest.fail(failed.report())
    assert landed >= 75, totals


def test_the_watermark_families_keep_the_protocol(quiet: None) -> None:
    """The completeness watermark (issue 54, finding F): partition 0 quiet for 300 steps, then
    records stamped when the schedule began; every ``LAKE_COMMITTED``'s ``valid_through_ms``
    claims nothing the tables lack, now or later (the checker's ``watermark``), with and without
    routed tables: 100 schedules of each, which claim watermarks."""
    for family in ("watermark", "watermark-routed"):
        failed, totals, landed = campaign(range(100), lambda seed, family=family: family)
        if failed is not None:
            pytest.fail(failed.report())
        assert landed >= 75 and totals["watermarks_claimed"] > 100, (family, totals)


def test_the_truncation_families_keep_the_protocol(quiet: None) -> None:
    """A source partition truncated (DeleteRecords, retention) at any offset of its log, with every
    fault, kills and lost logs, with and without routed tables: the source fails the job
    (``KafkaDataLossError``, Spark's failOnDataLoss, issue 54, finding B) rather than skip a record
    it did not read; 100 schedules of each, which truncate and end jobs that way."""
    for family in ("truncation", "truncation-routed"):
        failed, totals, landed = campaign(range(100), lambda seed, family=family: family)
        if failed is not None:
            pytest.fail(failed.report())
        assert landed >= 75 and totals["truncations"] > 50 and totals["data_loss_failures"] > 10, (family, totals)


def test_mutation_going_on_from_the_log_start_is_caught(quiet: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The source going on from a truncated log's start instead of failing the job (a bare
    enumerator without ``fail_on_data_loss``, the job's position moved to the new log start): the
    records deleted before they were read leave a hole in the tables."""
    import tests.simulation.process as process_of_sim

    real = process_of_sim.KafkaSourceOptions

    def going_on(*args: Any, **kwargs: Any) -> Any:
        return real(*args, **{**kwargs, "fail_on_data_loss": False, "sink_holds_offsets": False})

    for family in ("truncation", "truncation-routed"):
        found = caught(lambda p: p.setattr(process_of_sim, "KafkaSourceOptions", going_on), family, monkeypatch,
                       seeds=120)
        assert found.violations[0][0] == "gap", found.report()


def test_mutation_watermark_over_the_partitions_read_only_is_caught(quiet: None,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``valid_through_ms`` as the minimum over the partitions read only (finding F before its
    fix): a partition never read holds nothing back, and its first records, stamped before the
    claimed watermark, arrive after it."""
    from chandy.connectors.lake import committer as committer_module

    real = committer_module.valid_through_ms
    for family in ("watermark", "watermark-routed"):
        found = caught(lambda p: p.setattr(committer_module, "valid_through_ms",
                                           lambda times, partitions=None, idle=(): real(times)),
                       family, monkeypatch, seeds=50)
        assert found.violations[0][0] == "watermark", found.report()


class _Unguarded:
    """A sink whose ``commit_changes`` drops the committer's ``checked_at`` (issue 54, finding E)."""

    def __init__(self, sink: Any) -> None:
        self._sink = sink

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)

    def commit_changes(self, *args: Any, checked_at: Any = ..., **kwargs: Any) -> Any:
        return self._sink.commit_changes(*args, **kwargs)


def test_mutation_merges_without_the_check_then_commit_guard_are_caught(quiet: None,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding E of issue 54 before its fix: a merge committed without ``checked_at``. Another
    log's commit between the check and the merge makes records land twice."""
    commit_table = LakeCommitter._commit_table

    def unguarded(self: LakeCommitter, sink: Any, *args: Any) -> Any:
        return commit_table(self, _Unguarded(sink), *args)

    found = caught(lambda p: p.setattr(LakeCommitter, "_commit_table", unguarded), "cdc-two-logs-faults", monkeypatch,
                   seeds=300)  # seed 248
    assert found.violations[0][0] in {"duplicate", "gap", "group-ahead"}, found.report()


def test_mutation_routed_tables_trusting_memory_is_caught(quiet: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding D of issue 54 before its fix: a routed table read once per run, never again. A run
    whose other log's run committed to a routed table since (then failed before ``--table``) lands
    records in it twice."""
    read_table = LakeCommitter._read_table

    def trust_routed(self: LakeCommitter, sink: Any, *args: Any) -> Any:
        view = self._views.get(sink.table_uri)
        return view if view is not None and sink is not self.sink else read_table(self, sink, *args)

    found = caught(lambda p: p.setattr(LakeCommitter, "_read_table", trust_routed), "routed-two-logs-faults",
                   monkeypatch, seeds=100)
    assert found.violations[0][0] in {"duplicate", "gap", "group-ahead"}, found.report()


def test_a_lost_log_never_lets_a_new_run_clean_up_a_live_zombies_files(quiet: None) -> None:
    """Found by this simulation as a bug (issue 54, family routed, seeds 1002510 and 1003064 of
    the long campaign; ``routed-two-logs-faults`` 1006010, 1007765), then fixed: a zombie (fenced,
    its checkpoint N completed before the coordinator log was lost) was still committing N to the
    tables when a run on the recreated log resumed from the table (which did not hold N yet),
    took checkpoint ID N for itself, aborted it and deleted the job's unreferenced files of N of
    its log, which were the zombie's: the zombie's commit then referenced files that were gone.
    Both runs named their files with the same log ID (the prefix's). A file's log ID now carries
    the log's incarnation (the log topic's Kafka topic ID, read before the replay and checked
    again after it: seed 1006010 is a start whose replay met the recreated log)."""
    for seed, family in ((1002510, "routed"), (1003064, "routed"), (1006010, "routed-two-logs-faults"),
                         (1007765, "routed-two-logs-faults")):
        result = run_schedule(seed, family)
        assert not result.violations, result.report()


def test_mutation_file_names_without_the_logs_incarnation_are_caught(quiet: None,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The fix above off (a log ID of the prefix and job alone, as before): the zombie's files are
    deleted at seed 1002510."""
    import tests.simulation.process as process_of_sim
    from chandy.connectors.lake import committer as committer_module
    from chandy.connectors.lake.sink import coordinator_log_id

    monkeypatch.setattr(committer_module, "with_incarnation", lambda log_id, incarnation: log_id)
    monkeypatch.setattr(process_of_sim, "coordinator_log_id", lambda prefix, job_id, incarnation=None:
                        coordinator_log_id(prefix, job_id))
    mutated = run_schedule(1002510, "routed")
    assert mutated.violations and mutated.violations[0][0] == "missing-file", mutated.report()


def test_mutation_incarnation_not_checked_after_the_replay_is_caught(quiet: None,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the second look at the log's topic ID after the replay, a run that read the old
    incarnation's ID, then replayed the recreated log (it was lost during the start), names its
    files as the zombie's log and deletes them (seed 1006010), or announces a checkpoint a second
    time (seed 1006375, below)."""
    import tests.simulation.process as process_of_sim

    monkeypatch.setattr(process_of_sim, "check_same_incarnation", lambda *args, **kwargs: None)
    for seed, violation in ((1006010, "missing-file"), (1006375, "lake-event-twice")):
        mutated = run_schedule(seed, "routed-two-logs-faults")
        assert mutated.violations and mutated.violations[0][0] == violation, mutated.report()


def test_a_start_that_replayed_across_a_lost_log_does_not_announce_a_checkpoint_twice(quiet: None) -> None:
    """Found by this simulation as a bug (issue 54, family routed-two-logs-faults, seed 1006375),
    then fixed: a run began its start on the old log and replayed the recreated one (the log was
    lost in between), took checkpoint ID 1 with the same ranges as another run's checkpoint 1, and a
    later run restored it, found the tables holding it, and published its LAKE_COMMITTED again.
    The start now checks that the log it replayed is the incarnation it began with
    (``check_same_incarnation``), and gives up otherwise; the mutation test of that check above
    breaks this seed again ("lake-event-twice")."""
    result = run_schedule(1006375, "routed-two-logs-faults")
    assert not result.violations, result.report()


def test_two_logs_never_commit_each_others_checkpoints(quiet: None) -> None:
    """Found by this simulation as a bug (issue 54, family routed-two-logs-faults, seed 1007916,
    when each family ran every seed of the long campaign), then fixed: two coordinator logs of one
    job (two ``--prefix``es) hand out the same checkpoint IDs into one checkpoint directory, so the
    second log's committer read the first log's ``chk-2/_metadata`` (partition 1's [3, 6)) and
    committed its files, while its own enumerator committed its checkpoint 2's ends to the consumer
    group: the group at 3 on partitions 0 and 2, which no table held. ``_metadata`` now names the
    coordinator log that wrote it (``CheckpointMetadata.coordinator_log``: transactional ID and log
    incarnation), and a completion notice refuses another log's (``LakeDivergenceError``)."""
    result = run_schedule(1007916, "routed-two-logs-faults")
    assert not result.violations, result.report()


def test_mutation_committing_another_logs_metadata_is_caught(quiet: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above off, and the disposal's (below), which since keeps the other log's
    ``chk-2/`` whose loss let this schedule reach the check: seed 1007916 leaves the group ahead of
    the tables again. With the disposal's check on, no schedule of the first 300 of
    routed-two-logs-faults or two-logs-faults needs the metadata check: it is the second defence."""
    from chandy.coordinator.storage import CheckpointStorage

    dispose = CheckpointStorage.dispose_location
    monkeypatch.setattr(LakeCommitter, "_check_own_metadata", lambda self, checkpoint_id, metadata: None)
    monkeypatch.setattr(CheckpointStorage, "dispose_location", lambda self, directory, owner=None: dispose(self, directory))
    mutated = run_schedule(1007916, "routed-two-logs-faults")
    assert mutated.violations and mutated.violations[0][0] == "group-ahead", mutated.report()


def test_an_abort_never_disposes_another_logs_completed_checkpoint(quiet: None) -> None:
    """Found by this simulation as a bug (issue 54, family cdc-two-logs-faults, seed 1008235),
    then fixed: two coordinator logs of one job share the checkpoint directory; the second log's
    run aborted its checkpoint 2 and deleted ``chk-2/``, which held the first log's completed
    checkpoint 2 (its lake commit still in flight). The first log's next run could not restore 2,
    restored 1, and its cleanup deleted checkpoint 2's data files, which the old run's commit then
    referenced. A disposal now keeps a directory whose ``_metadata`` names another coordinator
    log (``CheckpointStorage.dispose_location(owner=...)``)."""
    result = run_schedule(1008235, "cdc-two-logs-faults")
    assert not result.violations, result.report()


def test_mutation_disposing_another_logs_checkpoint_is_caught(quiet: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disposal's check off: seed 1008235 leaves the table referencing deleted files again."""
    from chandy.coordinator.storage import CheckpointStorage

    dispose = CheckpointStorage.dispose_location
    monkeypatch.setattr(CheckpointStorage, "dispose_location",
                        lambda self, directory, owner=None: dispose(self, directory))
    mutated = run_schedule(1008235, "cdc-two-logs-faults")
    assert mutated.violations and mutated.violations[0][0] == "missing-file", mutated.report()

"""One seeded schedule of the world: its configuration (:class:`Config`, drawn from the seed), the
world it builds (the cluster, the table, the processes of the job), the steps it takes and the
invariants checked after each (:mod:`tests.simulation.invariants`).

A step is one of: a work item of a lane starts (a mailbox action, an I/O call, a log
transaction, a Spark task, the driver's next turn) and runs until it finishes or parks in a
stand-in's call; a parked call goes on; due timers fire; the clock moves to the next moment
something is due; records are produced; a process of the job starts (while another runs: a plain
restart, which fences it; the fenced one is a zombie that runs on from its memory until it learns
it was fenced), or is killed; the coordinator log is lost or compacted; with ``two_prefixes``, a
run of the same job under a second prefix starts (a second coordinator log nothing fences).
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import fsspec

from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka import log as log_module
from chandy.coordinator.kafka import log_writer as log_writer_module
from chandy.coordinator.kafka import topics as topics_module
from chandy.coordinator.kafka.topics import ChandyTopics
from tests.simulation.invariants import Checker
from tests.simulation.kafka import FakeAdmin, FakeConsumer, FakeProducer, SimCluster
from tests.simulation.kernel import EPOCH_MS, SimClock, World
from tests.simulation.process import BOOTSTRAP, Process
from tests.simulation.table import SimTable

PREFIXES = ("chandy", "chandy-b")
TOPIC = "orders"


@dataclasses.dataclass(frozen=True)
class Config:
    """A schedule's world and its hazards, drawn from the seed (:meth:`draw`)."""

    seed: int
    family: str = "campaign"
    steps: int = 600
    partitions: int = 2
    parallelism: int = 1
    starting_offsets: str = "earliest"
    max_records: int | None = None
    task_attempts: int = 1
    starts: int = 8  # starts of the job in the schedule, restarts included
    overlaps: int = 2  # of which at most this many while another run of the job is alive (plain restarts)
    fault_level: float = 0.03
    lost_logs: bool = True
    compaction: bool = True
    two_prefixes: bool = False
    stuck_timeouts: bool = True  # a hung send_offsets_to_transaction times out: the writer replaces its producer
    racy_cleanup: bool = False  # a cleanup's reads, listing and deletes may be spread out (issue 44, item 6)
    thinks_it_leads: bool = True  # a fenced coordinator's view of the election says it still leads
    stuck_writers: float = 0.0  # how often send_offsets_to_transaction hangs (librdkafka 5456, 5511), besides faults
    slow_cleanups: float = 0.0  # how often a cleanup's listing of the table is slow, besides faults (with racy_cleanup)
    routed: int = 0  # routed tables (--route by topic partition): partition p lands in routed table p % (routed + 1) - 1
    cdc: bool = False  # --cdc: the committer applies change files (LakeSink.commit_changes) instead of appending
    #: partition 0 gets no record during the first this many steps, then records stamped when the
    #: schedule began (a partition never read: it must hold the completeness watermark back, issue
    #: 54, finding F); its draws go to partition 1 meanwhile
    quiet_steps: int = 0
    #: how likely a step truncates a source partition (DeleteRecords, retention) at a random offset
    #: of its log: the job must never skip what it did not read (Spark's failOnDataLoss, issue 54, B)
    truncations: float = 0.0

    @classmethod
    def draw(cls, seed: int, **fixed: Any) -> Config:
        rng = random.Random(f"chandy-sim-config-{seed}")
        drawn = {
            "partitions": rng.choice((1, 2, 3)),
            "parallelism": rng.choice((1, 2)),
            "starting_offsets": "latest" if rng.random() < 0.3 else "earliest",
            "max_records": rng.choice((None, None, 3, 10)),
            "task_attempts": rng.choice((1, 2)),
            "overlaps": rng.choice((0, 1, 2, 3)),
            "fault_level": rng.choice((0.0, 0.005, 0.01, 0.02, 0.04)),
            "lost_logs": rng.random() < 0.5,
            "compaction": rng.random() < 0.5,
            "thinks_it_leads": rng.random() < 0.7,
        }
        drawn.update(fixed)
        return cls(seed=seed, **drawn)

    def fault_rates(self) -> dict[str, dict[str, float]]:
        r = self.fault_level
        each = {"fail": r, "fail_after": r / 2, "delay": 2 * r, "late": r, "hang": r / 4} if r > 0 else {}
        rates = {"log": each, "table": each, "kafka": each, "ack": each} if each else {}
        if self.stuck_writers:
            rates["log.send_offsets"] = {**each, "hang": self.stuck_writers}
        if self.slow_cleanups:
            rates["table.list"] = {**each, "delay": self.slow_cleanups}
        return rates


@dataclasses.dataclass
class Result:
    seed: int
    config: Config
    violations: list[tuple[str, str]]
    steps: int
    trace: list[str]
    stats: dict[str, Any]

    def report(self, *, full: bool = False) -> str:
        lines = [f"seed {self.seed}: {len(self.violations)} violation(s) at step {self.steps}", f"  config: {self.config}"]
        lines += [f"  VIOLATION {name}: {text}" for name, text in self.violations]
        lines.append(f"  stats: {self.stats}")
        lines.append("  last steps:")
        lines += [f"    {line}" for line in (self.trace if full else self.trace[-60:])]
        family = "" if self.config.family == "campaign" else f"CHANDY_SIM_FAMILY={self.config.family} "
        lines.append(f"  replay: {family}CHANDY_SIM_SEED={self.seed} .venv/bin/pytest tests/simulation -k replay -s")
        return "\n".join(lines)


class Simulation:
    """The world of one schedule (see the module docstring)."""

    def __init__(self, config: Config, *, checker_ignores: frozenset[str] = frozenset()) -> None:
        self.config = config
        self.world = World(config.seed, config.fault_rates())
        self.rng = self.world.rng
        self.cluster = SimCluster(self.world, TOPIC, config.partitions, stuck_timeouts=config.stuck_timeouts)
        self.table = SimTable(self.world, "memory://lake/orders")
        #: the job's table first, then the routed ones (``routed``: a partition's records land in one table)
        self.tables = [self.table] + [SimTable(self.world, f"memory://lake/routed-{i}") for i in range(config.routed)]
        for table in self.tables:
            table.racy_cleanup = config.racy_cleanup
        self.checkpoint_dir = f"memory://sim-{config.seed}-{uuid.uuid4().hex[:8]}/chk"
        self.processes: list[Process] = []
        self.started = 0
        self.overlapped = 0
        self.lost_logs = 0
        self.compactions = 0
        self.truncations = 0
        # two coordinator logs: nothing orders their consumer-group commits (see invariants)
        self.checker = Checker(self, ignore=checker_ignores, group_monotonic=not config.two_prefixes)

    # -- what processes ask of the world --------------------------------------------------------------
    def table_of(self, partition: int) -> SimTable:
        """The table the job routes ``partition``'s records to (the job's own without ``routed``)."""
        index = partition % (self.config.routed + 1)
        return self.tables[0 if index == 0 else index]

    def live(self, prefix: str | None = None) -> list[Process]:
        return [p for p in self.processes if not p.exited and (prefix is None or p.prefix == prefix)]

    def leads(self, process: Process) -> bool:
        """Whether ``process`` leads its job's election: it is the newest live run of its prefix."""
        live = self.live(process.prefix)
        return bool(live) and live[-1] is process

    def stuck(self, process: Process) -> bool:
        """Whether ``process`` looks stuck from outside: its log writer or its mailbox waits in a
        call that hangs or takes 10 s or more."""
        return any(f.lane in (process.writer_lane, process.mailbox)
                   and (f.wake_reason == "timeout" or f.wake_at is None or f.wake_at - self.world.now >= 10_000)
                   for f in self.world.parked)

    def deliver(self, prefix: str, message: Any) -> None:
        """A message on ``prefix``'s acks topic reaches every coordinator reading it."""
        for process in self.live(prefix):
            if process.acks_open:
                process.mailbox.submit(lambda process=process: process.receive(message), "ack")

    def new_producer(self, transactional_id: str | None) -> FakeProducer:
        fiber = self.world.current
        owner: Process | None = fiber.lane.owner if fiber is not None else None
        if owner is None or transactional_id is None:
            raise AssertionError("only a process's log writer makes producers in the simulation")
        return FakeProducer(self.cluster, transactional_id, owner.name, owner.prefix)

    # -- steps --------------------------------------------------------------------------------------------
    def start_process(self, prefix: str, *, overlap: bool = False) -> None:
        self.started += 1
        self.overlapped += overlap
        c = self.config
        process = Process(self, f"p{self.started}{'' if prefix == PREFIXES[0] else 'b'}", prefix,
                          parallelism=c.parallelism, starting_offsets=c.starting_offsets, max_records=c.max_records,
                          task_attempts=c.task_attempts, thinks_it_leads=c.thinks_it_leads)
        self.processes.append(process)
        others = [p.name for p in self.live(prefix) if p is not process]
        self.world.note(f"start {process.name} ({prefix})" + (f" while {others} run" if others else ""))

    def choices(self) -> list[tuple[float, str, Callable[[], None]]]:
        world, c = self.world, self.config
        out: list[tuple[float, str, Callable[[], None]]] = []
        for lane in world.lanes:
            if lane.startable():
                out.append((10.0, f"start {lane.name}:{lane.queue[0][0]}", lambda lane=lane: world.start(lane)))
        for fiber in world.parked:
            if world.resumable(fiber):
                out.append((10.0, f"resume {fiber}", lambda fiber=fiber: world.resume(fiber)))
        if world.timers_due():
            out.append((5.0, "timers", world.fire_due_timers))
        out.append((0.5 if out else 1.0, "advance", world.advance))
        out.append((1.0, "produce", self._produce))
        live = self.live()
        if self.started < c.starts:
            if not live:
                out.append((2.0, "start", lambda: self.start_process(PREFIXES[0])))
            elif self.overlapped < c.overlaps:
                # an operator restarts a job that looks stuck (its log writer hangs): issue 44, item 2
                weight = 1.0 if any(self.stuck(p) for p in live) else 0.03
                out.append((weight, "restart", lambda: self.start_process(PREFIXES[0], overlap=True)))
            if c.two_prefixes and not self.live(PREFIXES[1]):
                out.append((0.03, "start-b", lambda: self.start_process(PREFIXES[1], overlap=bool(live))))
        if live:
            out.append((0.015, "kill", self._kill))
        if c.lost_logs and self.lost_logs < 2:
            out.append((0.008, "lose-log", self._lose_log))
        if c.compaction:
            out.append((0.03, "compact", self._compact))
        if c.truncations:
            out.append((c.truncations, "truncate", self._truncate))
        return out

    def _truncate(self) -> None:
        """DeleteRecords on a source partition, up to an offset the job may not have read yet."""
        partition = self.rng.randrange(self.config.partitions)
        tp = (self.cluster.source_topic, partition)
        start, end = self.cluster.source_start[tp], self.cluster.source_end[tp]
        offset = self.rng.randint(start, end)
        self.world.note(f"the source's {tp[0]}-{tp[1]} now starts at offset {offset} (was {start}, ends at {end})")
        self.cluster.truncate(partition, offset)
        self.truncations += 1

    def _produce(self) -> None:
        partition = self.rng.randrange(self.config.partitions)
        count = self.rng.choice((1, 2, 5, 13))
        if partition == 0 and self.world.steps <= self.config.quiet_steps:
            partition = 1  # partition 0 is quiet: never read yet
        # a quiet partition's records, when they come, were stamped when the schedule began (a
        # producer that buffered them): a watermark the other partitions moved past them was a lie
        old = EPOCH_MS if partition == 0 and self.config.quiet_steps else None
        self.cluster.produce(partition, count, old)

    def _kill(self) -> None:
        process = self.rng.choice(self.live())
        self.world.note(f"kill {process.name}")
        process.kill()

    def _lose_log(self) -> None:
        self.lost_logs += 1
        prefix = self.rng.choice(sorted({p.prefix for p in self.processes} or {PREFIXES[0]}))
        self.world.note(f"the coordinator log of {prefix} is lost")
        self.cluster.lose_log(ChandyTopics(prefix).coordinator_log)

    def _compact(self) -> None:
        self.compactions += 1
        for prefix in sorted({p.prefix for p in self.processes}):
            self.cluster.compact_log(ChandyTopics(prefix).coordinator_log, drop_tombstones=self.rng.random() < 0.5)

    def step(self) -> None:
        options = self.choices()
        total = sum(w for w, _, _ in options)
        draw = self.rng.random() * total
        index = 0
        while index < len(options) - 1 and draw > options[index][0]:
            draw -= options[index][0]
            index += 1
        _, label, action = options[index]
        self.world.steps += 1
        if not label.startswith(("advance", "produce")):
            self.world.note(label)
        action()
        self.world.run_deferred()

    def run(self) -> Result:
        violations: list[tuple[str, str]] = []
        with patched(self):
            try:
                self.start_process(PREFIXES[0])
                for _ in range(self.config.steps):
                    self.step()
                    violations = self.checker.check()
                    if violations:
                        break
            finally:
                self.world.run_deferred()
                for process in self.processes:
                    process.exit()
                _forget(self.checkpoint_dir)
        return Result(self.config.seed, self.config, violations, self.world.steps, list(self.world.trace), self.stats())

    def stats(self) -> dict[str, Any]:
        return {
            "processes": self.started,
            "checkpoints_completed": sum(p.completed for p in self.processes),
            "lake_commits": sum(len(t.commits) for t in self.tables),
            "records_landed": sum(i.records for t in self.tables for c in t.commits for i in
                                  (t.written[path] for path in c.files)),
            "log_transactions": self.cluster.transactions,
            "lost_logs": self.lost_logs,
            "watermarks_claimed": len(self.checker.claims),
            "compactions": self.compactions,
            "truncations": self.truncations,
            "data_loss_failures": sum("KafkaDataLossError" in (p.stop_reason or "") for p in self.processes),
            "faults": sum(self.world.faults_injected.values()),
            "fenced": sum(1 for p in self.processes if p.fenced),
        }


@contextlib.contextmanager
def patched(sim: Simulation) -> Iterator[None]:
    """The real code's Kafka clients and its retry clocks, pointed at the simulated world."""

    def consumer(bootstrap_servers: str, *, group_id: str | None = None, overrides: Any = None) -> FakeConsumer:
        assert bootstrap_servers == BOOTSTRAP
        return FakeConsumer(sim.cluster, group_id)

    def producer(bootstrap_servers: str, *, transactional_id: str | None = None, overrides: Any = None) -> FakeProducer:
        assert bootstrap_servers == BOOTSTRAP
        return sim.new_producer(transactional_id)

    def admin_client(bootstrap_servers: str, overrides: Any = None) -> FakeAdmin:
        assert bootstrap_servers == BOOTSTRAP
        return FakeAdmin(sim.cluster)

    saved = (kafka_config.consumer, kafka_config.producer, kafka_config.admin_client, log_writer_module.time,
             topics_module.time, log_module.time)
    kafka_config.consumer = consumer  # type: ignore[assignment]
    kafka_config.producer = producer  # type: ignore[assignment]
    kafka_config.admin_client = admin_client  # type: ignore[assignment]
    log_writer_module.time = SimClock(sim.world)  # type: ignore[assignment]
    topics_module.time = SimClock(sim.world)  # type: ignore[assignment]
    log_module.time = SimClock(sim.world)  # type: ignore[assignment]
    try:
        yield
    finally:
        (kafka_config.consumer, kafka_config.producer, kafka_config.admin_client, log_writer_module.time,
         topics_module.time, log_module.time) = saved  # type: ignore[assignment]


def _forget(url: str) -> None:
    fs = fsspec.filesystem("memory")
    root = url.split("://", 1)[1].split("/", 1)[0]
    with contextlib.suppress(FileNotFoundError):
        fs.rm(f"/{root}", recursive=True)


#: named families of schedules: the settings each fixes (the rest is drawn from the seed)
FAMILIES: dict[str, dict[str, Any]] = {
    # one coordinator log: every fault, plain restarts (zombies), kills, lost and compacted logs; a
    # hung send_offsets_to_transaction hangs for good (its process is killed or times out)
    "one-log": {"stuck_timeouts": False},
    # one job under two coordinator logs (prefixes), nothing fencing the other; whole actions
    # interleave, but no call is slow or fails (the schedules where the table must decide)
    "two-logs": {"two_prefixes": True, "fault_level": 0.0, "stuck_timeouts": False},
    # a lost log and --starting-offsets latest: the table's offsets must win (issue 44, item 1)
    "lost-log-latest": {"starting_offsets": "latest", "lost_logs": True, "stuck_timeouts": False},
    # a stuck send_offsets_to_transaction times out and the writer replaces its producer while
    # the job is restarted (issue 44, item 2)
    "stuck-writers": {"stuck_timeouts": True, "stuck_writers": 0.1, "overlaps": 3},
    # two coordinator logs with slow and failing calls
    "two-logs-faults": {"two_prefixes": True, "fault_level": 0.04, "stuck_timeouts": False, "overlaps": 3},
    # a restore's cleanup that is slow between reading what the table references and deleting
    # (issue 44, item 6)
    "racy-cleanup": {"racy_cleanup": True, "slow_cleanups": 0.5, "stuck_timeouts": False, "overlaps": 3},
    # --route: three partitions, two of them routed to tables of their own, committed one after
    # another (routed tables first, --table last) with every fault, kills and lost logs between (issue 54)
    # (--starting-offsets earliest: a routed job whose --table does not exist yet has no table to
    # seed a run without a log from, docs/design.md §9)
    "routed": {"routed": 2, "partitions": 3, "starting_offsets": "earliest", "stuck_timeouts": False, "overlaps": 3},
    # routed tables under two coordinator logs of one job: each routed table must be read again,
    # not remembered (issue 54, finding D)
    "routed-two-logs": {"routed": 2, "partitions": 3, "starting_offsets": "earliest", "two_prefixes": True,
                        "fault_level": 0.0, "stuck_timeouts": False, "overlaps": 3},
    # both, with slow and failing calls: a run killed or failing between its routed tables' commits
    # and --table's leaves the other log's run with a memory of a routed table that is behind it
    "routed-two-logs-faults": {"routed": 2, "partitions": 3, "starting_offsets": "earliest", "two_prefixes": True,
                               "fault_level": 0.04, "stuck_timeouts": False, "overlaps": 3},
    # --cdc: every checkpoint's commit is a merge (commit_changes), through the same guarded sequence,
    # under two coordinator logs with slow and failing calls (issue 54, finding E)
    "cdc-two-logs-faults": {"cdc": True, "two_prefixes": True, "fault_level": 0.04, "stuck_timeouts": False,
                            "overlaps": 3},
    # the completeness watermark (issue 54, finding F): partition 0 gets its first records halfway
    # through, so for 300 steps the job reads partitions 1 and 2 only; every LAKE_COMMITTED's
    # valid_through_ms must claim nothing the tables lack (the checker's ``watermark``), with every
    # fault, kills, restarts and lost logs, routed tables or not
    "watermark": {"partitions": 3, "quiet_steps": 300, "starting_offsets": "earliest", "stuck_timeouts": False,
                  "overlaps": 3},
    # a source partition truncated (DeleteRecords, retention) at any offset, the job's position
    # or beyond included, with every fault, kills and lost logs: the source fails the job
    # (KafkaDataLossError) rather than skip a record it did not read (issue 54, finding B)
    "truncation": {"truncations": 0.01, "starting_offsets": "earliest", "stuck_timeouts": False, "overlaps": 3},
    "truncation-routed": {"truncations": 0.01, "routed": 2, "partitions": 3, "starting_offsets": "earliest",
                          "stuck_timeouts": False, "overlaps": 3},
    "watermark-routed": {"routed": 2, "partitions": 3, "quiet_steps": 300, "starting_offsets": "earliest",
                         "stuck_timeouts": False, "overlaps": 3},
}


#: the default campaign's families, by seed modulo their number
CAMPAIGN_FAMILIES = ("one-log", "one-log", "routed", "two-logs", "one-log", "routed-two-logs-faults", "one-log", "two-logs")


def family_of(seed: int) -> str:
    """The family of a seed of the default campaign: half run one coordinator log, one in four
    two coordinator logs, one in four routed tables (one log with faults, or two logs with faults)."""
    return CAMPAIGN_FAMILIES[seed % len(CAMPAIGN_FAMILIES)]


def run_schedule(seed: int, family: str = "campaign", *, checker_ignores: frozenset[str] = frozenset(),
                 **fixed: Any) -> Result:
    """Run the schedule of ``seed`` in ``family`` (``campaign``: the default campaign's family of
    the seed); its configuration is drawn from the seed, the family's settings and ``fixed`` win."""
    settings = {**FAMILIES[family_of(seed) if family == "campaign" else family], **fixed}
    return Simulation(Config.draw(seed, family=family, **settings), checker_ignores=checker_ignores).run()

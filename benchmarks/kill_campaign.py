"""Random-kill campaign: the exactly-once pipeline, SIGKILLed at a random moment of a random process.

Each run lands one source topic into a fresh Delta table (a job of its own) with ``chandy
pipeline run --until-drained`` and small micro-batches, and at a random moment sends SIGKILL to
one process picked at random:

- ``driver``: the pipeline's Python driver (its whole process group goes with it: Spark's JVM
  and Python workers die with their driver);
- ``python-worker``: one Spark Python worker process (a forked child of ``pyspark.daemon``)
  while it runs a task;
- ``broker``: the Kafka broker (the campaign's own embedded broker; with ``--nodes 3`` one node
  of a three-node cluster picked at random, the source topic having three replicas), started
  again 1-3 s later.

Whatever died, the run then restarts what is needed (the broker, the pipeline, as often as the
pipeline fails) until the topic is drained, and checks the table with
``chandy.connectors.spark.verify.verify_table`` (a reader other than the writer): duplicates are
(topic, partition, offset) landed more than once, missing are records of the topic not in the
table. A kill "landed mid-run" when its target was alive and the pipeline had not finished.

    .venv/bin/python benchmarks/kill_campaign.py --runs 5 --lock /tmp/chandy-spark.lock

(``--lock`` holds that file's flock for each run, not for the whole campaign, so other Spark work
can take turns between runs) prints one line per run and the total; the bar is every run with 0 duplicates and 0 missing.
Exit code 1 when any run has a duplicate or a missing record.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.procs import python_workers
from chandy.broker import EmbeddedKafkaBroker
from chandy.connectors.lake.tables import open_sink
from chandy.connectors.spark.verify import verify_table
from chandy.coordinator.kafka import config as kafka_config

ROOT = Path(__file__).resolve().parents[1]

TARGETS = ("driver", "python-worker", "broker")








def _produce_source(servers: str, topic: str, partitions: int, per_partition: int, replicas: int) -> None:
    from confluent_kafka.admin import NewTopic

    admin = kafka_config.admin_client(servers)
    admin.create_topics([NewTopic(topic, partitions, replicas)])[topic].result()
    time.sleep(0.5)
    producer = kafka_config.producer(servers, overrides={"linger.ms": 5})
    for i in range(partitions * per_partition):
        producer.produce(topic, f"record-{i}-{uuid.uuid4().hex}".encode(), f"k{i}".encode(), partition=i % partitions)
    producer.flush(60)


def _pipeline(servers: str, topic: str, table: Path, prefix: str, cap: int, partitions: int) -> subprocess.Popen:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    env.pop("CHANDY_CRASH_AT", None)
    # stderr to a file, never an unread pipe: a broker outage makes librdkafka log enough to
    # fill a pipe's buffer, and the pipeline would block on its next write
    with open(table.parent / f"{table.name}.stderr", "ab") as stderr:
        return subprocess.Popen(
            [sys.executable, "-m", "chandy.cli", "pipeline", "run", "--table", str(table), "--topic", topic, "-b", servers,
             "--prefix", prefix, "--until-drained", "--max-records-per-checkpoint", str(cap),
             "--parallelism", str(partitions), "--master", "local[2]", "--conf", "spark.ui.enabled=false"],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True)


def _end(process: subprocess.Popen, timeout_s: float) -> int:
    """Wait for the pipeline (killing its group after ``timeout_s`` s); its exit code."""
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    # whatever the driver left behind (Spark's JVM, workers) goes with its group
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return process.returncode


def one_run(run: int, rng: random.Random, broker: EmbeddedKafkaBroker, topic: str, root: Path, cap: int,
            partitions: int, kill_window: tuple[float, float]) -> dict:
    servers = broker.status().bootstrap_servers
    table = root / f"table-{run}"
    prefix = f"kc{run}{uuid.uuid4().hex[:6]}"
    target = rng.choice(TARGETS)
    delay = rng.uniform(*kill_window)
    process = _pipeline(servers, topic, table, prefix, cap, partitions)
    started = time.monotonic()
    mid_run = False
    victim = None
    while time.monotonic() - started < delay and process.poll() is None:
        time.sleep(0.1)
    if process.poll() is None:
        if target == "driver":
            victim = process.pid
            os.kill(process.pid, signal.SIGKILL)
            mid_run = True
        elif target == "python-worker":
            deadline = time.monotonic() + 30  # the next task's worker, if none runs at this moment
            while process.poll() is None and time.monotonic() < deadline:
                workers = python_workers(process.pid)
                if workers:
                    victim = rng.choice(workers)
                    try:
                        os.kill(victim, signal.SIGKILL)
                        mid_run = process.poll() is None
                    except ProcessLookupError:
                        victim = None
                        continue
                    break
                time.sleep(0.05)
        else:
            node = rng.choice(broker.alive_nodes())
            victim = broker.kill_node(node)
            mid_run = process.poll() is None
            time.sleep(rng.uniform(1, 3))
            broker.start_node(node)
    attempts = 1
    code = _end(process, 300)
    while code != 0 and attempts < 6:  # restart until it drains (a failed run exits 2, a killed one -9)
        if len(broker.alive_nodes()) < broker.nodes:
            broker.up()
        attempts += 1
        code = _end(_pipeline(servers, topic, table, prefix, cap, partitions), 300)
    rows, duplicates, missing = verify_table(open_sink(str(table)), servers, [topic])
    return {"run": run, "target": target, "delay_s": delay, "victim": victim, "mid_run": mid_run,
            "starts": attempts, "exit": code, "rows": rows, "duplicates": duplicates, "missing": missing}


@contextlib.contextmanager
def _run_lock(path: Path | None):
    """Hold ``path``'s exclusive flock (as ``flock(1)`` does) for one run; nothing when ``path`` is None."""
    if path is None:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
    time.sleep(2)  # let a waiting holder take its turn before the next run asks again


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100, help="pipeline runs (default 100)")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--per-partition", type=int, default=400, help="records per partition")
    parser.add_argument("--cap", type=int, default=20, help="--max-records-per-checkpoint")
    parser.add_argument("--nodes", type=int, default=1, help="Kafka nodes (3: a cluster, one node killed at a time)")
    parser.add_argument("--lock", type=Path, help="a file whose flock each run holds (shared with other Spark work)")
    parser.add_argument("--kill-after", type=float, nargs=2, default=(8.0, 40.0), metavar=("MIN_S", "MAX_S"),
                        help="the kill's moment, uniform in this window after the start (s)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="chandy-kill-campaign-") as tmp:
        root = Path(tmp)
        broker = EmbeddedKafkaBroker(root / "kafka", nodes=args.nodes, heap="512m" if args.nodes == 1 else "384m")
        broker.up()
        try:
            topic = f"campaign-{uuid.uuid4().hex[:8]}"
            _produce_source(broker.status().bootstrap_servers, topic, args.partitions, args.per_partition,
                            min(3, args.nodes))
            total = args.partitions * args.per_partition
            print(f"source: {topic}, {args.partitions} partitions, {total} records; {args.nodes} Kafka node(s); "
                  f"{args.runs} runs, seed {args.seed}")
            print(f"{'run':>4} {'target':<14} {'kill at':>8} {'mid-run':>7} {'starts':>6} {'rows':>6} "
                  f"{'dup':>4} {'miss':>4} {'took':>7}")
            results = []
            for run in range(1, args.runs + 1):
                with _run_lock(args.lock):
                    began = time.monotonic()
                    r = one_run(run, rng, broker, topic, root, args.cap, args.partitions, tuple(args.kill_after))
                    r["elapsed_s"] = time.monotonic() - began
                results.append(r)
                print(f"{r['run']:>4} {r['target']:<14} {r['delay_s']:>7.1f}s {'yes' if r['mid_run'] else 'no':>7} "
                      f"{r['starts']:>6} {r['rows']:>6} {r['duplicates']:>4} {r['missing']:>4}"
                      + f" {r['elapsed_s']:>6.0f}s"
                      + ("" if r["exit"] == 0 else f"  (last exit {r['exit']})"), flush=True)
            clean = sum(1 for r in results if r["duplicates"] == 0 and r["missing"] == 0 and r["exit"] == 0)
            print(f"total: {len(results)} runs, {sum(r['mid_run'] for r in results)} kills mid-run "
                  f"(driver {sum(r['mid_run'] and r['target'] == 'driver' for r in results)}, python worker "
                  f"{sum(r['mid_run'] and r['target'] == 'python-worker' for r in results)}, broker "
                  f"{sum(r['mid_run'] and r['target'] == 'broker' for r in results)}), "
                  f"{sum(r['duplicates'] for r in results)} duplicates, {sum(r['missing'] for r in results)} missing; "
                  f"{clean} of {len(results)} runs exactly once")
            return 0 if clean == len(results) else 1
        finally:
            broker.down()


if __name__ == "__main__":
    sys.exit(main())

"""Take-over: SIGKILL of the active pipeline driver's process group to the standby's first
completed checkpoint (its first lake commit), as an operator sees it.

Each run starts ``chandy pipeline run`` (the active driver, Spark ``local[1]``) on a topic fed at a
steady rate, then the same command with ``--standby`` (a warm standby: its Spark is up, it waits in
the job's election group), lets the active one land a few checkpoints, SIGKILLs the active driver's
whole process group (driver, Spark JVM, Python workers) and times, from the kill, until the table
holds a commit of a checkpoint the killed driver never made. Prints each run, then
min / median / max. ``--other-jobs N`` first writes N coordinator-log records of 50 other jobs
(about an hour of 50 jobs checkpointing every second before compaction), each to the partition of
the log its job maps to, so the replay's share of the take-over shows.

    .venv/bin/python benchmarks/takeover.py [--runs 5] [--other-jobs 1000000] [--spark-connect]

``--spark-connect``: both drivers are Spark Connect clients (``--remote``) of one server started for
the run; the SIGKILL takes the active client's process group, not the server's tasks.

Uses ``$CHANDY_BOOTSTRAP_SERVERS`` or starts an embedded broker in a temporary directory. Run it
alone (it starts Spark twice per run): ``flock /tmp/chandy-spark.lock .venv/bin/python benchmarks/takeover.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka.admin import NewTopic
from deltalake import DeltaTable

from benchmarks.history import write_history
from chandy.broker import EmbeddedKafkaBroker
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.log import partition_for
from chandy.coordinator.kafka.topics import ChandyTopics, ensure_topics

ROOT = Path(__file__).resolve().parent.parent


def _checkpoints(table: str) -> list[int]:
    """The checkpoint IDs of the table's commits (Chandy records them in commitInfo)."""
    if not DeltaTable.is_deltatable(table):
        return []
    return [int(h["chandy.checkpoint_id"]) for h in DeltaTable(table).history() if "chandy.checkpoint_id" in h]


def _feed(servers: str, topic: str, stop: threading.Event, rate: int = 500) -> None:
    producer = kafka_config.producer(servers)
    i = 0
    while not stop.is_set():
        producer.produce(topic, json.dumps({"id": i}).encode(), partition=i % 2)
        producer.poll(0)
        i += 1
        time.sleep(1 / rate)
    producer.flush(30)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait(predicate, timeout_s: float, what: str, poll_s: float = 0.02):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise TimeoutError(f"no {what} within {timeout_s} s")


def one_run(servers: str, prefix: str, tmp: Path, spark: tuple[str, ...] = ("--master", "local[1]")) -> dict:
    topic = f"takeover-{uuid.uuid4().hex[:8]}"
    admin = kafka_config.admin_client(servers)
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result()
    _wait(lambda: topic in admin.list_topics(timeout=10).topics
          and all(p.leader >= 0 for p in admin.list_topics(topic, timeout=10).topics[topic].partitions.values()),
          30, "the new topic's leaders", 0.1)
    table = str(tmp / topic)
    stop = threading.Event()
    feeder = threading.Thread(target=_feed, args=(servers, topic, stop), daemon=True)
    feeder.start()
    args = [sys.executable, "-m", "chandy.cli", "pipeline", "run", "--table", table, "--topic", topic, "-b", servers,
            "--prefix", prefix, "--value-format", "json", "--value-schema", "id BIGINT", "--checkpoint-interval", "500",
            *spark]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    logs = Path(os.environ.get("TAKEOVER_LOGS", str(tmp)))
    logs.mkdir(parents=True, exist_ok=True)
    active_log = logs / f"{topic}-active.log"
    standby = None
    with open(active_log, "w") as err:
        active = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        _wait(lambda: len(_checkpoints(table)) >= 3, 240, "three commits of the active driver", 0.2)
        # the standby joins a running job (started at the same moment, either may win: a newer run fences an older)
        standby_log = logs / f"{topic}-standby.log"
        with open(standby_log, "w") as err:
            verbose = ["-v"] if os.environ.get("TAKEOVER_LOGS") else []  # the standby's phases, with times, in its log
            standby = subprocess.Popen([args[0], args[1], args[2], *verbose, *args[3:], "--standby"], cwd=ROOT, env=env,
                                       stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        _wait(lambda: "waiting until the active coordinator stops" in standby_log.read_text(), 240, "a waiting standby", 0.2)
        time.sleep(3)  # the standby's Spark is warm and it is a member of the election group
        if active.poll() is not None or "leads: coordinator started" in standby_log.read_text():
            raise RuntimeError(f"the standby took over before the kill: active exited {active.poll()}: "
                               f"{active_log.read_text()[-2000:]}")
        killed = time.monotonic()
        if os.environ.get("TAKEOVER_LOGS"):
            print(f"  SIGKILL at {time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d}", flush=True)
        os.killpg(active.pid, signal.SIGKILL)
        active.wait(30)
        _wait(lambda: not _group_alive(active.pid), 30, "the end of the active driver's process group", 0.005)
        before = max(_checkpoints(table))  # read once every process of it is gone: nothing later is its
        first = _wait(lambda: max(_checkpoints(table)) > before and max(_checkpoints(table)), 120, "commit of the standby")
        took = time.monotonic() - killed
        time.sleep(1)
        said = [line.strip() for line in standby_log.read_text().splitlines() if "leads" in line or "took" in line]
        return {"seconds": took, "before": before, "first": first, "said": said[-1:]}
    finally:
        stop.set()
        for process in (active, standby) if standby is not None else (active,):
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(30)
        feeder.join(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--spark-connect", action="store_true", help=(
        "both drivers are Spark Connect clients (--remote) of one server started for the run (local[2], "
        "tests/fixtures/spark_connect.py); the SIGKILL takes the active client's process group"))
    parser.add_argument("--other-jobs", type=int, default=0, metavar="RECORDS",
                        help="coordinator-log records of 50 other jobs written first (default 0: an empty log)")
    args = parser.parse_args()
    broker = None
    servers = kafka_config.bootstrap_from_env()
    with tempfile.TemporaryDirectory() as tmp:
        if not servers:
            broker = EmbeddedKafkaBroker(Path(tmp) / "kafka", heap="1g")
            servers = broker.up().bootstrap_servers
        try:
            prefix = f"takeover-{uuid.uuid4().hex[:6]}"
            topics = ChandyTopics(prefix)
            admin = kafka_config.admin_client(servers)
            ensure_topics(admin, topics)
            partitions = len(admin.list_topics(topics.coordinator_log, timeout=30).topics[topics.coordinator_log].partitions)
            if args.other_jobs:
                jobs = [uuid.uuid4().hex for _ in range(50)]
                for job in jobs:
                    write_history(servers, topics.coordinator_log, partition_for(job, partitions), job,
                                  args.other_jobs // len(jobs))
            print(f"coordinator log: {partitions} partition(s), {args.other_jobs:,} records of other jobs")
            results = []
            spark: tuple[str, ...] = ("--master", "local[1]")
            server = contextlib.nullcontext(None)
            if args.spark_connect:
                from tests.fixtures.spark_connect import spark_connect_server

                server = spark_connect_server(Path(tmp) / "connect")
            with server as url:
                if url is not None:
                    spark = ("--remote", url)
                for run in range(1, args.runs + 1):
                    r = one_run(servers, prefix, Path(tmp), spark)
                    results.append(r["seconds"])
                    print(f"run {run}: SIGKILL -> standby's first checkpoint {r['seconds']:.2f} s "
                          f"(active's last {r['before']}, standby's first {r['first']}) {' '.join(r['said'])}", flush=True)
        finally:
            if broker is not None:
                broker.down()
    print(f"take-over: min {min(results):.2f} s, median {statistics.median(results):.2f} s, "
          f"max {max(results):.2f} s over {len(results)} runs (target median < 4 s: ratio "
          f"{statistics.median(results) / 4:.2f})")


if __name__ == "__main__":
    main()

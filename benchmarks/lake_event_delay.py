"""LAKE_COMMITTED against COMPLETED, as a subscriber that reads the table sees them (issue 35).

Each run starts ``chandy pipeline run`` into a local Delta table (1 s checkpoint interval, Spark
``local[1]``) on a topic fed with JSON records at ``--rate`` records/s, and subscribes to the job's
events (``chandy.subscribe(..., event_types=["COMPLETED", "LAKE_COMMITTED"])``). For every event
it reads the table at once (deltalake, a fresh ``DeltaTable``), each type in a subscription and
thread of its own (so waiting on one never delays the other):

- ``COMPLETED`` (Flink's checkpoint completion, the baseline a subscriber had before): does the
  table already hold checkpoint N (its app transaction version)? If not, how long until it does
  (polled every 5 ms);
- ``LAKE_COMMITTED``: does the table hold ``table_version``, and the delay from the Delta commit
  (its ``commitInfo`` timestamp) to the event reaching the subscriber.

Prints each run and the medians over runs, with the versions, cores and memory; ``--json`` writes
``benchmarks/results/lake_event_delay.json``.

    flock /tmp/chandy-spark.lock .venv/bin/python benchmarks/lake_event_delay.py [--runs 3] [--seconds 60]

Uses ``$CHANDY_BOOTSTRAP_SERVERS`` or starts an embedded broker in a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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

from chandy import subscribe
from chandy.broker import EmbeddedKafkaBroker
from chandy.connectors.spark.options import default_job_id
from chandy.coordinator.kafka import config as kafka_config

ROOT = Path(__file__).resolve().parent.parent


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def _feed(servers: str, topic: str, stop: threading.Event, rate: int) -> None:
    producer = kafka_config.producer(servers, overrides={"linger.ms": 5})
    i, started = 0, time.monotonic()
    while not stop.is_set():
        producer.produce(topic, json.dumps({"id": i}).encode(), partition=i % 4)
        producer.poll(0)
        i += 1
        ahead = i / rate - (time.monotonic() - started)
        if ahead > 0:
            time.sleep(ahead)
    producer.flush(30)


def _holds(table: str, job: str, checkpoint_id: int) -> bool:
    """Whether the Delta table holds ``checkpoint_id`` of ``job`` (its app transaction version)."""
    return DeltaTable.is_deltatable(table) and (DeltaTable(table).transaction_version(job) or 0) >= checkpoint_id


def _commit_times(table: str) -> dict[int, int]:
    """Delta version -> its commitInfo timestamp (ms)."""
    return {h["version"]: int(h["timestamp"]) for h in DeltaTable(table).history()}


def one_run(servers: str, tmp: Path, seconds: float, rate: int) -> dict:
    topic = f"delay-{uuid.uuid4().hex[:8]}"
    prefix = f"delay{uuid.uuid4().hex[:6]}"
    admin = kafka_config.admin_client(servers)
    admin.create_topics([NewTopic(topic, 4, 1)])[topic].result()
    table = str(tmp / topic)
    job = default_job_id(table, [topic])
    args = [sys.executable, "-m", "chandy.cli", "pipeline", "run", "--table", table, "--topic", topic, "-b", servers,
            "--prefix", prefix, "--value-format", "json", "--value-schema", "id BIGINT", "--checkpoint-interval", "1000",
            "--master", "local[1]", "--conf", "spark.ui.enabled=false"]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    stop = threading.Event()
    feeder = threading.Thread(target=_feed, args=(servers, topic, stop, rate), daemon=True)
    pipeline = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
    completed_visible: list[bool] = []
    completed_wait_ms: list[float] = []
    lake_visible: list[bool] = []
    arrivals: list[tuple[int, int]] = []  # (table version, arrival ms) of LAKE_COMMITTED events
    deadline = time.monotonic() + seconds

    def follow_completed() -> None:
        # its own subscription: waiting here for the table never delays the LAKE_COMMITTED reader
        with subscribe(servers, job_id=job, start="earliest", prefix=prefix, event_types=["COMPLETED"]) as events:
            while time.monotonic() < deadline:
                event = events.poll(0.2)
                if event is None:
                    continue
                arrived = time.time() * 1000
                holds = _holds(table, job, event.checkpoint_id)
                completed_visible.append(holds)
                while not holds and time.monotonic() < deadline:
                    time.sleep(0.005)
                    holds = _holds(table, job, event.checkpoint_id)
                if holds:
                    completed_wait_ms.append(time.time() * 1000 - arrived)

    def follow_lake() -> None:
        with subscribe(servers, job_id=job, start="earliest", prefix=prefix, event_types=["LAKE_COMMITTED"]) as events:
            while time.monotonic() < deadline:
                event = events.poll(0.2)
                if event is None:
                    continue
                arrived = time.time() * 1000
                assert event.table_version is not None
                lake_visible.append(DeltaTable(table).version() >= event.table_version)
                arrivals.append((event.table_version, int(arrived)))

    readers = [threading.Thread(target=follow_completed, daemon=True), threading.Thread(target=follow_lake, daemon=True)]
    try:
        feeder.start()
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(seconds + 60)
    finally:
        stop.set()
        pipeline.kill()
        os.killpg(pipeline.pid, 9)
        pipeline.wait(30)
        feeder.join(30)
    commits = _commit_times(table)
    lake_delay_ms = [arrived - commits[version] for version, arrived in arrivals if version in commits]
    return {"completed_events": len(completed_visible), "completed_before_visible": completed_visible.count(False),
            "completed_to_visible_p50_ms": pct(completed_wait_ms, 0.5),
            "completed_to_visible_max_ms": max(completed_wait_ms, default=0.0),
            "lake_events": len(lake_visible), "lake_before_visible": lake_visible.count(False),
            "lake_delay_p50_ms": pct(lake_delay_ms, 0.5), "lake_delay_p99_ms": pct(lake_delay_ms, 0.99),
            "lake_delay_max_ms": max(lake_delay_ms, default=0.0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60.0, help="events read per run (s)")
    parser.add_argument("--rate", type=int, default=2000, help="records/s fed to the topic")
    parser.add_argument("--json", action="store_true", help="write benchmarks/results/lake_event_delay.json")
    args = parser.parse_args()
    import deltalake
    import pyspark

    import chandy

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    print(f"chandy {chandy.__version__}, pyspark {pyspark.__version__}, deltalake {deltalake.__version__}, "
          f"Python {platform.python_version()}, {os.cpu_count()} cores, {memory:.0f} GiB")
    broker = None
    servers = kafka_config.bootstrap_from_env()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        if not servers:
            broker = EmbeddedKafkaBroker(Path(tmp) / "kafka", heap="1g")
            servers = broker.up().bootstrap_servers
        try:
            for run in range(1, args.runs + 1):
                r = one_run(servers, Path(tmp), args.seconds, args.rate)
                results.append(r)
                print(f"run {run}: COMPLETED {r['completed_before_visible']} of {r['completed_events']} before the "
                      f"table held it (then visible after p50 {r['completed_to_visible_p50_ms']:.0f} ms, max "
                      f"{r['completed_to_visible_max_ms']:.0f} ms); LAKE_COMMITTED {r['lake_before_visible']} of "
                      f"{r['lake_events']} before the table held it, commit -> subscriber p50 "
                      f"{r['lake_delay_p50_ms']:.0f} ms, p99 {r['lake_delay_p99_ms']:.0f} ms, max "
                      f"{r['lake_delay_max_ms']:.0f} ms", flush=True)
        finally:
            if broker is not None:
                broker.down()
    summary = {key: statistics.median(r[key] for r in results) for key in results[0]}
    print(f"median of {len(results)} runs: LAKE_COMMITTED commit -> subscriber p50 {summary['lake_delay_p50_ms']:.0f} ms, "
          f"p99 {summary['lake_delay_p99_ms']:.0f} ms; {summary['lake_before_visible']:.0f} LAKE_COMMITTED before "
          f"visible vs {summary['completed_before_visible']:.0f} of {summary['completed_events']:.0f} COMPLETED "
          f"(COMPLETED -> visible p50 {summary['completed_to_visible_p50_ms']:.0f} ms)")
    if args.json:
        out = ROOT / "benchmarks" / "results" / "lake_event_delay.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"runs": results, "median": summary, "rate": args.rate, "seconds": args.seconds,
                                   "cores": os.cpu_count()}, indent=2) + "\n")


if __name__ == "__main__":
    main()

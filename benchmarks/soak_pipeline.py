"""Soak of the pipeline: ``chandy pipeline run`` at 1 s checkpoints on a steady stream, resources sampled.

Starts an embedded broker of its own, a source topic that a producer thread feeds at a steady
rate for the whole run, and ``chandy pipeline run --checkpoint-interval 1000`` into a fresh Delta
table. Every few seconds it samples from /proc the resident memory (VmRSS) of the driver's Python
process, of Spark's JVM and of each Spark Python worker (the ``pyspark.daemon`` children), and
the threads and open file descriptors of the driver. At the end the producer stops, the
pipeline is stopped with SIGTERM (it finishes the checkpoint in flight), and the table is
checked against the topic by a reader other than the writer (duplicates, missing).

Prints the samples at 10 % steps, RSS at the start (25 % into the run, once Spark and the Kafka
clients are warm) and at the end with the growth in %, the checkpoints completed, and the
exactly-once check. It starts Spark:

    flock /tmp/chandy-spark.lock .venv/bin/python benchmarks/soak_pipeline.py --duration 600

Exit code 1 when the driver's RSS grew by 10 % or more, or a record is missing or duplicated.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from confluent_kafka.admin import NewTopic

from benchmarks.procs import cmdline, descendants, status
from chandy.broker import EmbeddedKafkaBroker
from chandy.connectors.lake.tables import open_sink
from chandy.connectors.spark.verify import verify_table
from chandy.coordinator.kafka import config as kafka_config

ROOT = Path(__file__).resolve().parents[1]








def _sample(driver: int) -> dict[str, Any]:
    """RSS (MiB) of the driver, Spark's JVM and the largest Python worker; driver threads and fds."""
    below = descendants(driver)
    jvm = [p for p in below if "java" in cmdline(p).split(" ")[0]]
    workers = [p for p in below if "pyspark.daemon" in cmdline(p)]
    main = status(driver)
    names: dict[str, int] = {}
    for task in Path(f"/proc/{driver}/task").iterdir():
        name = re.sub(r"\d+", "N", (task / "comm").read_text().strip())
        names[name] = names.get(name, 0) + 1
    return {"thread_names": names,
            "driver_mib": main["rss_kb"] / 1024, "threads": main["threads"], "fds": main["fds"],
            "jvm_mib": sum(status(p)["rss_kb"] for p in jvm) / 1024,
            "worker_mib": max((status(p)["rss_kb"] for p in workers), default=0) / 1024}


def _produce(servers: str, topic: str, partitions: int, rate: int, stop: threading.Event, sent: list[int]) -> None:
    producer = kafka_config.producer(servers, overrides={"linger.ms": 20})
    i = 0
    started = time.monotonic()
    while not stop.is_set():
        due = int((time.monotonic() - started) * rate)
        while i < due:
            producer.produce(topic, f"record-{i}-{uuid.uuid4().hex}".encode(), f"k{i}".encode(), partition=i % partitions)
            i += 1
        producer.poll(0)
        time.sleep(0.05)
    producer.flush(60)
    sent.append(i)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=600, help="seconds of streaming (default 600)")
    parser.add_argument("--rate", type=int, default=500, help="records per second produced (default 500)")
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--interval-s", type=float, default=5.0, help="sampling interval (s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chandy-soak-pipeline-") as tmp:
        broker = EmbeddedKafkaBroker(Path(tmp) / "kafka", heap="512m")
        servers = broker.up().bootstrap_servers
        try:
            topic = f"soak-{uuid.uuid4().hex[:8]}"
            admin = kafka_config.admin_client(servers)  # held: a collected client fails its futures
            admin.create_topics([NewTopic(topic, args.partitions, 1)])[topic].result()
            stop, sent = threading.Event(), []
            producer = threading.Thread(target=_produce, args=(servers, topic, args.partitions, args.rate, stop, sent))
            producer.start()
            table = Path(tmp) / "table"
            env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
            with open(Path(tmp) / "pipeline.stderr", "wb") as stderr:
                pipeline = subprocess.Popen(
                    [sys.executable, "-m", "chandy.cli", "pipeline", "run", "--table", str(table), "--topic", topic,
                     "-b", servers, "--checkpoint-interval", "1000", "--parallelism", str(args.partitions),
                     "--master", "local[2]", "--conf", "spark.ui.enabled=false", "--no-verify"],
                    cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True, start_new_session=True)
            started = time.monotonic()
            samples: list[tuple[float, dict[str, Any]]] = []
            while time.monotonic() - started < args.duration and pipeline.poll() is None:
                try:
                    samples.append((time.monotonic() - started, _sample(pipeline.pid)))
                except (OSError, ValueError):
                    pass
                time.sleep(args.interval_s)
            stop.set()
            producer.join()
            time.sleep(5)  # the last records land with the next checkpoint
            pipeline.send_signal(signal.SIGTERM)
            try:
                out = pipeline.communicate(timeout=300)[0]
            except subprocess.TimeoutExpired:
                os.killpg(pipeline.pid, signal.SIGKILL)
                out = pipeline.communicate()[0]
            rows, duplicates, missing = verify_table(open_sink(str(table)), servers, [topic])
            stderr_tail = (Path(tmp) / "pipeline.stderr").read_text(errors="replace").strip().splitlines()[-5:]
        finally:
            broker.down()
    if len(samples) < 10:
        print(f"the pipeline exited {pipeline.returncode} after {len(samples)} samples:\n{out}\n" + "\n".join(stderr_tail))
        return 1
    took = samples[-1][0]
    print(f"{took:.0f} s of streaming at {args.rate} records/s into {args.partitions} partitions, 1 s checkpoints; "
          f"{sent[0]:,} records produced, {rows:,} rows landed; {len(samples)} samples")
    print(f"{'t s':>6} {'driver MiB':>10} {'JVM MiB':>8} {'worker MiB':>10} {'threads':>7} {'fds':>5}")
    for i in range(0, 11):
        t, s = samples[min(len(samples) - 1, i * (len(samples) - 1) // 10)]
        print(f"{t:>6.0f} {s['driver_mib']:>10.1f} {s['jvm_mib']:>8.1f} {s['worker_mib']:>10.1f} {s['threads']:>7} {s['fds']:>5}")
    warm, end = samples[len(samples) // 4][1], samples[-1][1]

    def growth(key: str) -> float:
        return (end[key] - warm[key]) / warm[key] * 100 if warm[key] else 0.0

    print(f"RSS 25 % in → end: driver {warm['driver_mib']:.1f} → {end['driver_mib']:.1f} MiB ({growth('driver_mib'):+.1f} %), "
          f"JVM {warm['jvm_mib']:.1f} → {end['jvm_mib']:.1f} MiB ({growth('jvm_mib'):+.1f} %), largest Python worker "
          f"{warm['worker_mib']:.1f} → {end['worker_mib']:.1f} MiB; driver threads {warm['threads']} → {end['threads']}, "
          f"fds {warm['fds']} → {end['fds']}")
    print(f"exactly once: {duplicates} duplicates, {missing} missing; pipeline exit {pipeline.returncode}")
    summary = [line for line in out.strip().splitlines() if "checkpoint" in line.lower()][-1:]
    print("\n".join(summary))
    print("driver threads by name, 25 % in → end: " + ", ".join(
        f"{name} {warm['thread_names'].get(name, 0)}→{count}"
        for name, count in sorted(end["thread_names"].items())))
    # a SIGTERM'd pipeline exits 128 + 15 once it has stopped cleanly (the shell's convention)
    clean_exit = pipeline.returncode in (0, 128 + signal.SIGTERM)
    return 0 if growth("driver_mib") < 10 and duplicates == 0 and missing == 0 and clean_exit else 1


if __name__ == "__main__":
    sys.exit(main())

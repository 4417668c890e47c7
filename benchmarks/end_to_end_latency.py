"""End-to-end latency from an idle start: Chandy's pipeline next to Spark Structured Streaming,
same topic shape, same machine, same run, as a data engineer measures it from the outside.

Run (in the benchmarks' environment, ``make bench-setup``: Structured Streaming needs
spark-sql-kafka from Maven Central)::

    flock /tmp/chandy-spark.lock .venv-bench/bin/python benchmarks/end_to_end_latency.py [--runs 5]

Uses ``$CHANDY_BOOTSTRAP_SERVERS`` or starts an embedded broker. Per run and system, a fresh topic
of ``--partitions`` (4) partitions, then:

1. the system is started as a new process (a cold start: its JVM, its Python workers) and left
   idle for ``--idle`` seconds (45) from its start;
2. JSON records ``{"id": N}`` are produced at ``--rate`` records/s (20,000) for ``--duration``
   seconds (60), with Kafka CreateTime timestamps;
3. once every record is in its output, the process is stopped, and each record's latency is
   taken: the time its output became visible minus its Kafka timestamp. Chandy: ``chandy pipeline
   run --value-format json --value-schema "id BIGINT" --checkpoint-interval 1000`` into a Delta
   table, visible at its Delta commit (``commitInfo.timestamp``). Structured Streaming:
   ``from_json`` into Parquet with a 1 s ``processingTime`` trigger, visible at its
   ``_spark_metadata`` commit (the file's modification time);
4. every id must land exactly once in both (the run fails otherwise).

Prints p50 / p95 / p99 / max over the whole run and over the steady state (records produced
``--steady-after`` seconds (40) after the first), per run and as the median of the runs with min
and max, and writes them with the versions, cores and memory to
``benchmarks/results/end_to_end_latency.json`` (``--out``); ``benchmarks/results_table.py``
prints the table of ``docs/benchmarks.md`` from it.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa
import pyarrow.parquet as pq
from confluent_kafka.admin import NewTopic

from benchmarks.procs import environment, kafka_servers, spread
from chandy.coordinator.kafka import config as kafka_config

RESULTS = Path(__file__).resolve().parent / "results" / "end_to_end_latency.json"
WINDOWS = ("whole run", "steady state")
QUANTILES = ("p50", "p95", "p99", "max")


def create_topic(servers: str, topic: str, partitions: int) -> None:
    admin = kafka_config.admin_client(servers)
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result()


def produce_at_rate(servers: str, topic: str, rate: int, seconds: float, partitions: int) -> tuple[int, float]:
    """``{"id": N}`` at ``rate`` records/s for ``seconds``; returns (records, first produce time in ms)."""
    producer = kafka_config.producer(servers, overrides={"linger.ms": 5, "queue.buffering.max.messages": 1_000_000})
    started = time.time()
    sent = 0
    total = int(rate * seconds)
    while sent < total:
        due = min(total, int((time.time() - started) * rate) + 1)
        while sent < due:
            try:
                producer.produce(topic, json.dumps({"id": sent}).encode(), partition=sent % partitions)
                sent += 1
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
        time.sleep(0.002)
    producer.flush(60)
    return sent, started * 1000


# -- Chandy ---------------------------------------------------------------------------------------

def start_chandy(python: str, servers: str, topic: str, table: Path, interval_ms: int, log: Path) -> subprocess.Popen:
    command = [python, "-m", "chandy.cli", "pipeline", "run", "--bootstrap-servers", servers, "--topic", topic,
               "--table", str(table), "--value-format", "json", "--value-schema", "id BIGINT",
               "--checkpoint-interval", str(interval_ms), "--prefix", f"lat{uuid.uuid4().hex[:6]}"]
    return subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def _ms(data: pa.Table) -> list[int]:
    """The ``timestamp`` column in ms since the epoch, whatever its unit (Spark writes INT96: ns)."""
    column = data.column("timestamp")
    return column.cast(pa.timestamp("ms", column.type.tz), safe=False).cast(pa.int64()).to_pylist()


def delta_landed(table: Path) -> list[tuple[int, int, int]]:
    """(id, Kafka timestamp ms, commit timestamp ms) of every row, from the Delta log's commits."""
    rows: list[tuple[int, int, int]] = []
    log_dir = table / "_delta_log"
    if not log_dir.is_dir():
        return rows
    for commit in sorted(log_dir.glob("*.json")):
        actions = [json.loads(line) for line in commit.read_text().splitlines() if line.strip()]
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), None)
        adds = [a["add"]["path"] for a in actions if "add" in a]
        if info is None or not adds:
            continue
        visible = int(info["timestamp"])
        for path in adds:
            data = pq.read_table(table / path, columns=["id", "timestamp"])
            rows += [(i, t, visible) for i, t in zip(data.column("id").to_pylist(), _ms(data), strict=True)]
    return rows


# -- Structured Streaming -------------------------------------------------------------------------

def structured_streaming_child(servers: str, topic: str, out: str, checkpoint: str) -> None:
    """Run in its own process: Spark's Kafka source, ``from_json``, Parquet, 1 s trigger, until killed."""
    import pyspark
    from pyspark.sql import SparkSession
    from pyspark.sql.functions import col, from_json

    spark = (SparkSession.builder.master("local[*]").appName("structured-streaming-latency")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "4")
             .config("spark.jars.packages", f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}")
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    stream = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", servers).option("subscribe", topic)
              .option("startingOffsets", "earliest").option("kafka.isolation.level", "read_committed").load())
    rows = stream.select(col("timestamp"), from_json(col("value").cast("string"), "id BIGINT").alias("v")) \
        .select("v.id", "timestamp")
    query = (rows.writeStream.format("parquet").option("path", out).option("checkpointLocation", checkpoint)
             .trigger(processingTime="1 second").start())
    print("STARTED", flush=True)
    query.awaitTermination()


def start_structured_streaming(python: str, servers: str, topic: str, out: Path, log: Path) -> subprocess.Popen:
    command = [python, __file__, "--structured-streaming-child", servers, topic, str(out), str(out) + "-checkpoint"]
    return subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)


def parquet_sink_landed(out: Path) -> list[tuple[int, int, int]]:
    """(id, Kafka timestamp ms, commit time ms) of every row, from the sink's ``_spark_metadata``
    log: a batch's files become visible when its log file is written (compacted logs repeat the
    files of the batches before them)."""
    rows: list[tuple[int, int, int]] = []
    log_dir = out / "_spark_metadata"
    if not log_dir.is_dir():
        return rows
    seen: set[str] = set()
    entries = [p for p in log_dir.iterdir() if p.name.split(".")[0].isdigit()]
    for batch in sorted(entries, key=lambda p: int(p.name.split(".")[0])):
        visible = int(batch.stat().st_mtime * 1000)
        for line in batch.read_text().splitlines()[1:]:  # the first line is the log's version
            path = json.loads(line)["path"]
            if path in seen:
                continue
            seen.add(path)
            data = pq.read_table(path.removeprefix("file:"), columns=["id", "timestamp"])
            rows += [(i, t, visible) for i, t in zip(data.column("id").to_pylist(), _ms(data), strict=True)]
    return rows


# -- one run --------------------------------------------------------------------------------------

def _quantiles(latencies_ms: list[int]) -> dict[str, float]:
    ordered = sorted(latencies_ms)
    if not ordered:
        return {q: float("nan") for q in QUANTILES}

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "max": ordered[-1] / 1000}


def measure(system: str, args: argparse.Namespace, servers: str, root: Path) -> dict:
    topic = f"latency-{system}-{uuid.uuid4().hex[:6]}"
    create_topic(servers, topic, args.partitions)
    out = root / f"{system}-{uuid.uuid4().hex[:6]}"
    log = root / f"{out.name}.log"
    python = sys.executable
    if system == "chandy":
        process = start_chandy(python, servers, topic, out, args.interval_ms, log)
        landed = functools.partial(delta_landed, out)
    else:
        process = start_structured_streaming(python, servers, topic, out, log)
        landed = functools.partial(parquet_sink_landed, out)
    started = time.monotonic()
    try:
        time.sleep(max(0.0, args.idle - (time.monotonic() - started)))
        if process.poll() is not None:
            raise RuntimeError(f"{system} exited during its idle start: {log.read_text()[-2000:]}")
        produced, first_ms = produce_at_rate(servers, topic, args.rate, args.duration, args.partitions)
        deadline = time.monotonic() + args.drain_timeout
        rows = landed()
        while len(rows) < produced and time.monotonic() < deadline:
            time.sleep(2)
            rows = landed()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
    ids = [r[0] for r in rows]
    if len(ids) != produced or len(set(ids)) != produced:
        raise RuntimeError(f"{system}: {produced} produced, {len(ids)} landed, {len(set(ids))} distinct "
                           f"(log: {log})")
    steady_from = first_ms + args.steady_after * 1000
    latencies = {"whole run": [visible - stamp for _, stamp, visible in rows],
                 "steady state": [visible - stamp for _, stamp, visible in rows if stamp >= steady_from]}
    return {"records": produced, **{w: _quantiles(v) for w, v in latencies.items()}}


def summarize(runs: list[dict]) -> dict:
    systems = sorted({s for run in runs for s in run})
    return {s: {w: {q: spread([run[s][w][q] for run in runs if s in run]) for q in QUANTILES} for w in WINDOWS}
            for s in systems}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--idle", type=float, default=45.0, help="seconds from a system's start to the first record")
    parser.add_argument("--rate", type=int, default=20_000, help="records/s produced")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of producing")
    parser.add_argument("--steady-after", type=float, default=40.0,
                        help="the steady state: records produced this many seconds after the first")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--interval-ms", type=int, default=1000, help="Chandy's --checkpoint-interval")
    parser.add_argument("--drain-timeout", type=float, default=180.0)
    parser.add_argument("--no-structured-streaming", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--structured-streaming-child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.structured_streaming_child:
        structured_streaming_child(*args.structured_streaming_child)
        return
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    systems = ["chandy"] + ([] if args.no_structured_streaming else ["structured-streaming"])
    runs: list[dict] = []
    with kafka_servers() as (servers, root):
        for number in range(args.runs):
            run = {}
            for system in (systems if number % 2 == 0 else systems[::-1]):  # alternate who goes first
                run[system] = measure(system, args, servers, root)
                row = run[system]
                print(f"run {number + 1} {system:22} " + "  ".join(
                    f"{w}: " + " / ".join(f"{row[w][q]:.2f}" for q in QUANTILES) for w in WINDOWS), flush=True)
            runs.append(run)
    summary = summarize(runs)
    result = {"benchmark": "end_to_end_latency", "environment": environment(), "config": {
        k: getattr(args, k) for k in ("runs", "idle", "rate", "duration", "steady_after", "partitions", "interval_ms")},
        "runs": runs, "summary": summary}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nlatency (s) from the Kafka timestamp to the commit that made the record visible, median of {args.runs} "
          f"run(s) [min, max]; p50 / p95 / p99 / max")
    for system, windows in summary.items():
        for window, quantiles in windows.items():
            cells = "  ".join(f"{q} {v['median']:.2f} [{v['min']:.2f}, {v['max']:.2f}]" for q, v in quantiles.items())
            print(f"{system:22} {window:13} {cells}")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()

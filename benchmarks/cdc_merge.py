"""The CDC merge (``--cdc debezium``) next to a plain append, same records, same machine, same run.

Run: ``.venv/bin/python benchmarks/cdc_merge.py`` (``--records``, ``--keys``, ``--per-batch``,
``--runs``, ``--sink delta|iceberg|both``). Uses ``$CHANDY_BOOTSTRAP_SERVERS`` or starts an
embedded broker.

1. Produces a Debezium change stream of N changes (default 400,000) over K keys (default N / 4)
   in 8 partitions, keyed by ID: a create per key, then updates of random keys and deletes (5 %,
   each with its tombstone) and re-creates; and, in a second topic, the same number of plain JSON
   rows (each change's row), keyed alike.
2. Chandy appends the plain rows (``--value-format json`` with the row's DDL) into a new table, and
   merges the change stream (``--cdc debezium``, same DDL) into another: Delta ``MERGE`` (delta-rs),
   Iceberg delete + append (pyiceberg), ``max.records.per.checkpoint`` = B / 8.
Both in one SparkSession (``local[*]``), each run in new tables, ``--runs`` runs each (median
[min, max]); the rate is taken from the first checkpoint's trigger to the last one's completion.
Prints records/s of each, the merge / append ratio and the median ``tasks`` (read, decode, write
files) and ``lake_commit`` (the table commit: an append's log entry, or the merge) phases, and
writes them with the versions to ``benchmarks/results/cdc_merge.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import statistics
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka.admin import NewTopic

from benchmarks.procs import environment, kafka_servers, spread
from chandy.connectors.spark.options import PipelineOptions
from chandy.connectors.spark.pipeline import Pipeline
from chandy.coordinator.kafka import config as kafka_config
from chandy.flights import topic_record_count

PARTITIONS = 8
RESULTS = Path(__file__).resolve().parent / "results" / "cdc_merge.json"
ROW_DDL = ("id BIGINT, carrier STRING, origin STRING, dest STRING, dep_delay INT, arr_delay INT, "
           "price DECIMAL(10,2), tailnum STRING, updated_at TIMESTAMP")


def changes(records: int, keys: int, seed: int = 11) -> list[tuple[int, dict | None, str | None]]:
    """(key, row, op) of ``records`` changes over ``keys`` keys (op None: a tombstone)."""
    rng = random.Random(seed)
    base = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    live: set[int] = set()
    out: list[tuple[int, dict | None, str | None]] = []

    def row(i: int) -> dict:
        return {"id": i, "carrier": rng.choice(["UA", "AA", "B6", "DL"]), "origin": rng.choice(["EWR", "JFK", "LGA"]),
                "dest": rng.choice(["IAH", "MIA", "ORD", "ATL", "LAX"]), "dep_delay": rng.randint(-20, 300),
                "arr_delay": rng.randint(-40, 300), "price": f"{rng.randint(1000, 99999) / 100:.2f}",
                "tailnum": f"N{rng.randint(10000, 99999)}",
                "updated_at": (base + datetime.timedelta(seconds=len(out))).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}

    for i in range(min(keys, records)):
        out.append((i, row(i), "c"))
        live.add(i)
    while len(out) < records:
        i = rng.randrange(keys)
        if i in live and rng.random() < 0.05 and len(out) + 2 <= records:
            out.append((i, row(i), "d"))
            out.append((i, None, None))
            live.discard(i)
        else:
            out.append((i, row(i), "u" if i in live else "c"))
            live.add(i)
    return out


def _number(row: dict) -> bytes:
    text = json.dumps(row, separators=(",", ":"))
    return text.replace(f'"price":"{row["price"]}"', f'"price":{row["price"]}').encode()


def produce(servers: str, records: int, keys: int) -> tuple[str, str]:
    """The change topic and the plain-row topic (reused when they already hold the records)."""
    names = (f"bench-cdc-{records}-{keys}", f"bench-rows-{records}-{keys}")
    if all(topic_record_count(servers, t) == records for t in names):
        return names
    admin = kafka_config.admin_client(servers)
    for topic in names:
        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result()
    producer = kafka_config.producer(servers, overrides={"linger.ms": 20, "queue.buffering.max.messages": 500_000})
    for i, row, op in changes(records, keys):
        key = json.dumps({"id": i}).encode()
        envelope = None if op is None else (
            b'{"before":null,"after":' + _number(row) + b',"op":"' + op.encode() + b'"}' if op != "d"
            else b'{"before":' + _number(row) + b',"after":null,"op":"d"}')
        for topic, value in zip(names, (envelope, _number(row) if row is not None else b"{}"), strict=True):
            while True:
                try:
                    producer.produce(topic, value, key, partition=i % PARTITIONS)
                    break
                except BufferError:
                    producer.poll(0.1)
    producer.flush(120)
    return names


def run(spark, servers: str, topic: str, per_batch: int, root: Path, *, cdc: bool, sink: str) -> dict:
    """One Chandy run to the topic's end into a new table: records/s and median phases (ms)."""
    progress: list = []
    table, catalog = str(root / f"t-{uuid.uuid4().hex[:6]}"), {}
    if sink == "iceberg":
        table, catalog = f"iceberg://bench/b.t{uuid.uuid4().hex[:6]}", {"warehouse": str(root / "iceberg")}
    options = PipelineOptions(table_uri=table, bootstrap_servers=servers, topics=(topic,), value_format="json",
                              value_schema=ROW_DDL, cdc="debezium" if cdc else None,
                              max_records_per_checkpoint=per_batch // PARTITIONS, stop_when_drained=True,
                              prefix=f"bench{uuid.uuid4().hex[:6]}", catalog_properties=catalog)
    summary = Pipeline(options, spark=spark).run(on_progress=progress.append)
    ok = [p for p in progress if p.succeeded]
    seconds = progress[-1].elapsed_s - (progress[0].elapsed_s - progress[0].checkpoint_duration_ms / 1000)
    phases = {name: statistics.median(p.phases_ms.get(name, 0.0) for p in ok) for name in ("tasks", "lake_commit")}
    return {"records": summary.records_landed, "seconds": seconds, "records_per_s": summary.records_landed / seconds,
            "checkpoints": len(ok), "phases_ms": phases}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--keys", type=int, default=None, help="distinct keys (default: records / 4)")
    parser.add_argument("--per-batch", type=int, default=100_000, help="records per checkpoint")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--sink", choices=["delta", "iceberg", "both"], default="delta")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    keys = args.keys or args.records // 4
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    sinks = ["delta", "iceberg"] if args.sink == "both" else [args.sink]
    with kafka_servers() as (servers, root):
        change_topic, row_topic = produce(servers, args.records, keys)
        spark = (SparkSession.builder.master("local[*]").appName("chandy-cdc-merge")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
        spark.sparkContext.setLogLevel("WARN")
        run(spark, servers, row_topic, args.per_batch, root, cdc=False, sink="delta")  # warm-up
        result: dict = {"environment": environment(), "config": {
            "records": args.records, "keys": keys, "per_batch": args.per_batch, "runs": args.runs}, "summary": {}}
        for sink in sinks:
            runs: dict[str, list[dict]] = {"append": [], "merge": []}
            for n in range(args.runs):
                for mode in ("append", "merge"):
                    outcome = run(spark, servers, change_topic if mode == "merge" else row_topic, args.per_batch, root,
                                  cdc=mode == "merge", sink=sink)
                    runs[mode].append(outcome)
                    print(f"{sink} {mode} run {n + 1}: {outcome['records_per_s']:,.0f} records/s, "
                          f"{outcome['checkpoints']} checkpoints, phases {outcome['phases_ms']}", flush=True)
            summary = {mode: {"records_per_s": spread([r["records_per_s"] for r in rs]),
                              "phases_ms": {k: statistics.median(r["phases_ms"][k] for r in rs)
                                            for k in ("tasks", "lake_commit")}} for mode, rs in runs.items()}
            result["summary"][sink] = summary
        spark.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    env = result["environment"]
    print(f"\n{args.records:,} changes over {keys:,} keys, {args.per_batch:,} per checkpoint, median of {args.runs} "
          f"runs [min, max]; pyspark {env['pyspark']}, deltalake {env.get('deltalake')}, {env['cores']} cores")
    for sink, summary in result["summary"].items():
        cells = []
        for mode in ("append", "merge"):
            r, p = summary[mode]["records_per_s"], summary[mode]["phases_ms"]
            cells.append(f"{mode} {r['median']:,.0f} [{r['min']:,.0f}, {r['max']:,.0f}] records/s "
                         f"(tasks {p['tasks']:.0f} ms, lake_commit {p['lake_commit']:.0f} ms)")
        ratio = summary["merge"]["records_per_s"]["median"] / summary["append"]["records_per_s"]["median"]
        print(f"{sink:7} " + "; ".join(cells) + f"; merge / append x{ratio:.2f}")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()

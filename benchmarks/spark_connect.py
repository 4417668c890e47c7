"""Chandy on classic Spark next to Chandy through Spark Connect, same data, same machine, same run.

Run: ``.venv/bin/python benchmarks/spark_connect.py`` (about 15 minutes on two cores; ``--runs``,
``--records``, ``--sizes``, ``--formats``). Uses ``$CHANDY_BOOTSTRAP_SERVERS`` or starts an
embedded broker, and starts a Spark Connect server (``local[*]``) from the installed pyspark's own
jars (tests/fixtures/spark_connect.py).

1. Produces ``--records`` (1,000,000) raw and JSON records (:mod:`benchmarks.decoded_records`) over 8
   partitions, once per format.
2. For each format and records-per-checkpoint size (50,000 and 500,000), alternating the two
   systems run by run, ``--runs`` (5) runs each of the pipeline into a new Delta table, in a child
   process of its own per system (so each has one Spark session, as a user's process would):
   ``classic`` drives ``local[*]`` in-process; ``connect`` is a Spark Connect client
   (``--remote sc://...``) whose tasks run on the server's executors.
3. Prints records/s (from the first checkpoint's trigger to the last one's completion, as
   ``pipeline_vs_structured_streaming.py`` measures), median with min and max, the median
   checkpoint duration and the Connect / classic ratio, and writes them with the versions to
   ``benchmarks/results/spark_connect.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.procs import environment, kafka_servers, spread

RESULTS = Path(__file__).resolve().parent / "results" / "spark_connect.json"


def child(args: argparse.Namespace) -> None:
    """One system's run (``--child classic|connect``): prints its result as one JSON line."""
    from pyspark.sql import SparkSession

    from benchmarks.pipeline_vs_structured_streaming import run_chandy, warm_up

    root = Path(args.root)
    if args.child == "connect":
        spark = SparkSession.builder.remote(args.remote).getOrCreate()
    else:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        spark = (SparkSession.builder.master("local[*]").config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false").getOrCreate())
        spark.sparkContext.setLogLevel("WARN")
    try:
        warm_up(spark, args.servers, args.topic, root, args.value_format)
        result = run_chandy(spark, args.servers, args.topic, args.per_batch, root, value_format=args.value_format)
    finally:
        spark.stop()
    print("RESULT " + json.dumps(result), flush=True)


def run_child(system: str, servers: str, topic: str, per_batch: int, value_format: str, root: Path,
              remote: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", system, "--servers", servers, "--topic", topic,
                          "--per-batch", str(per_batch), "--value-format", value_format, "--root", str(root),
                          "--remote", remote], capture_output=True, text=True, timeout=1800)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{system} run failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[50_000, 500_000])
    parser.add_argument("--formats", nargs="+", choices=["raw", "json"], default=["raw", "json"])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", choices=["classic", "connect"], help=argparse.SUPPRESS)
    parser.add_argument("--servers", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--per-batch", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--value-format", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--remote", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    from benchmarks.pipeline_vs_structured_streaming import produce
    from tests.fixtures.spark_connect import spark_connect_server

    rows = []
    with kafka_servers() as (servers, root), spark_connect_server(root / "connect", master="local[*]") as url:
        for value_format in args.formats:
            topic = f"bench-connect-{value_format}-{uuid.uuid4().hex[:6]}"
            produce(servers, topic, args.records, value_format)
            for size in args.sizes:
                runs: dict[str, list[dict]] = {"classic": [], "connect": []}
                for i in range(args.runs):
                    for system in ("classic", "connect") if i % 2 == 0 else ("connect", "classic"):
                        result = run_child(system, servers, topic, size, value_format, root, url)
                        assert result["records"] == args.records, result
                        runs[system].append(result)
                        print(f"{value_format} {size:,}/checkpoint run {i + 1} {system}: "
                              f"{result['records'] / result['seconds']:,.0f} records/s", flush=True)
                row = {"values": value_format, "per_checkpoint": size}
                for system, results in runs.items():
                    row[system] = {"records_per_s": spread([r["records"] / r["seconds"] for r in results]),
                                   "checkpoint_ms": statistics.median(r["batch_ms"] for r in results)}
                row["ratio"] = row["connect"]["records_per_s"]["median"] / row["classic"]["records_per_s"]["median"]
                rows.append(row)
    result = {"environment": environment(), "records": args.records, "runs": args.runs, "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{args.records:,} records per run, median of {args.runs} (min–max), records/s")
    print("| values | per checkpoint | classic local[*] | Spark Connect (server local[*]) | Connect ÷ classic | "
          "checkpoint ms classic / Connect |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        c, r = row["classic"], row["connect"]
        print(f"| {row['values']} | {row['per_checkpoint']:,} | {c['records_per_s']['median']:,.0f} "
              f"({c['records_per_s']['min']:,.0f}–{c['records_per_s']['max']:,.0f}) | "
              f"{r['records_per_s']['median']:,.0f} ({r['records_per_s']['min']:,.0f}–{r['records_per_s']['max']:,.0f}) | "
              f"{row['ratio']:.2f}× | {c['checkpoint_ms']:,.0f} / {r['checkpoint_ms']:,.0f} |")


if __name__ == "__main__":
    main()

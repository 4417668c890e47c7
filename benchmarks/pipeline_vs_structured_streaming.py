"""Chandy's Kafka-to-lake pipeline next to Spark Structured Streaming, same data, same machine, same run.

Run: ``.venv-bench/bin/python benchmarks/pipeline_vs_structured_streaming.py`` (``--records``, ``--per-batch``,
``--value-format raw|json|avro``, ``--sink delta|iceberg|both``, ``--no-structured-streaming``), in the
benchmarks' environment (``make bench-setup``: a pyspark whose Kafka, Avro and Delta connectors are on
Maven Central). Uses ``$CHANDY_BOOTSTRAP_SERVERS`` or starts an embedded broker.

``--suite`` is the issue-32 comparison, every row the median of ``--runs`` (5) runs with min and max:
raw, JSON and Avro values (:mod:`benchmarks.decoded_records`: 12 fields with strings, longs, a
decimal, a timestamp and a nested record; Chandy with its value schema, Structured Streaming with
``from_json`` / ``from_avro``), at 50,000 and 500,000 records per checkpoint / micro-batch, Chandy
into Delta next to Structured Streaming into Parquet and into Delta (delta-spark
``--delta-spark-version``, default 4.4.0) and, at 500,000, the machine's floor (one plain
confluent-kafka + pyarrow process per core, no Spark). It prints each checkpoint's phases (median
and p95: :data:`chandy.connectors.spark.options.CHECKPOINT_PHASES`) beside Structured Streaming's
``durationMs`` breakdown, and writes everything with the versions, cores and memory to
``benchmarks/results/throughput.json`` (``--out``), from which ``benchmarks/results_table.py``
prints the tables of ``docs/benchmarks.md``.

1. Produces N records (default 5,000,000) of about 200 bytes over 8 partitions, once (a topic
   that already holds them is reused).
2. Chandy: the exactly-once pipeline into a Delta table, ``max.records.per.checkpoint`` = B / 8,
   at the pipeline's default parallelism (one subtask per partition, at most the local cores), or
   at each ``--parallelism N`` given (a row each).
3. Spark: ``readStream.format("kafka")`` (spark-sql-kafka-0-10 from Maven Central through
   ``spark.jars.packages``) with ``maxOffsetsPerTrigger`` = B, writing Parquet with a checkpoint
   location, ``trigger(availableNow=True)``.
Both in one SparkSession (``local[*]``), raw key/value/metadata columns, no decoding.

``--sink iceberg`` (or ``both``) also lands the same records with Chandy into an Apache Iceberg
table (pyiceberg's SQL catalog on SQLite, local warehouse) and prints its row next to Delta's with
the Iceberg / Delta ratio; ``--no-structured-streaming`` skips Spark's run (it needs Maven Central).

``--delta-spark-version V`` adds the fair exactly-once peer, Structured Streaming into a Delta table
(io.delta:delta-spark_2.13:V); delta-spark and spark-sql-kafka must exist for the installed
pyspark (Maven Central lags PyPI): for pyspark 4.2.0 use delta-spark 4.4.0 (see ``docs/benchmarks.md``).

``--memory-sweep`` runs Chandy again at 50,000 and at 2,000,000 records per checkpoint (bounded
by ``--write-buffer-bytes``), and at 2,000,000 with an unbounded buffer (the whole checkpoint held
at once, as before the buffer existed), each in a new SparkContext (so with new Python workers),
and prints a Spark Python worker's peak RSS in each (sampled from /proc every 50 ms).

A warm-up checkpoint into a scratch table runs first, so that the order of the runs does not
decide who pays for starting Spark's workers.

Prints records/s of each, the ratio, and the per-checkpoint (per-micro-batch) overhead: for
Chandy the checkpoint's end-to-end time minus its Spark job; for Spark the batch's
``triggerExecution`` minus ``addBatch`` (offset logging, planning, commit).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka.admin import NewTopic

from benchmarks.decoded_records import FORMATS, chandy_value_options, decode_column, run_floor, value_encoder
from benchmarks.procs import PeakWorkerRss, environment, kafka_servers, spread
from chandy.connectors.spark.options import CHECKPOINT_PHASES, PipelineOptions
from chandy.connectors.spark.pipeline import Pipeline
from chandy.coordinator.kafka import config as kafka_config
from chandy.flights import topic_record_count

PARTITIONS = 8


def produce(servers: str, topic: str, records: int, value_format: str = "raw") -> None:
    """``records`` values of ``value_format`` (:func:`benchmarks.decoded_records.value_encoder`)
    over :data:`PARTITIONS` partitions, once (a topic that already holds them is reused)."""
    if topic_record_count(servers, topic) == records:
        return
    admin = kafka_config.admin_client(servers)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result()
    time.sleep(1)
    producer = kafka_config.producer(servers, overrides={"linger.ms": 50, "batch.num.messages": 10000,
                                                         "queue.buffering.max.messages": 1_000_000,
                                                         "compression.type": "lz4"})
    encode = value_encoder(value_format, topic)
    started = time.monotonic()
    for i in range(records):
        value = encode(i)
        while True:
            try:
                producer.produce(topic, value, f"k{i % 1000}".encode(), partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 50_000 == 0:
            producer.poll(0)
    producer.flush(300)
    print(f"produced {records:,} {value_format} records in {time.monotonic() - started:.1f} s", flush=True)


def warm_up(spark, servers: str, topic: str, root: Path, value_format: str = "raw") -> None:
    """One small checkpoint into a scratch table, so that the first measured run does not pay
    for starting Spark's Python workers and the broker's transaction coordinator."""
    options = PipelineOptions(table_uri=str(root / f"warm-up-{uuid.uuid4().hex[:6]}"), bootstrap_servers=servers,
                              topics=(topic,), max_records_per_checkpoint=1000, parallelism=PARTITIONS,
                              max_checkpoints=1, prefix=f"warm{uuid.uuid4().hex[:6]}",
                              **chandy_value_options(value_format))
    Pipeline(options, spark=spark).run()


def _phase_summary(values: dict[str, list[float]]) -> dict[str, dict[str, float]]:
    out = {}
    for name, series in values.items():
        ordered = sorted(series)
        if ordered:
            out[name] = {"median": statistics.median(ordered), "p95": ordered[min(len(ordered) - 1,
                                                                                  int(0.95 * len(ordered)))]}
    return out


def run_chandy(spark, servers: str, topic: str, per_batch: int, root: Path, sink: str = "delta",
               write_buffer_bytes: int | None = None, parallelism: int | None = None,
               value_format: str = "raw") -> dict:
    """One Chandy run to the topic's end; ``parallelism`` None is the pipeline's default. Its rate
    is taken from the first checkpoint's trigger to the last one's completion: the job's start
    (Spark's session is shared, the preflight, the Python workers' warm-up) is paid once per run,
    not per record."""
    progress = []
    table, catalog = str(root / f"chandy-table-{uuid.uuid4().hex[:6]}"), {}
    if sink == "iceberg":
        table, catalog = f"iceberg://bench/b.t{uuid.uuid4().hex[:6]}", {"warehouse": str(root / "iceberg")}
    options = PipelineOptions(table_uri=table, bootstrap_servers=servers, topics=(topic,),
                              max_records_per_checkpoint=per_batch // PARTITIONS, parallelism=parallelism,
                              stop_when_drained=True, prefix=f"bench{uuid.uuid4().hex[:6]}",
                              catalog_properties=catalog, **chandy_value_options(value_format),
                              **({} if write_buffer_bytes is None else {"write_buffer_bytes": write_buffer_bytes}))
    pipeline = Pipeline(options, spark=spark)
    with PeakWorkerRss() as rss:
        summary = pipeline.run(on_progress=progress.append)
    ok = [p for p in progress if p.succeeded]
    # records/s between the first checkpoint's trigger and the last one's completion (the job's
    # start-up, preflight and warm-up, paid once per run, are not the steady rate)
    seconds = progress[-1].elapsed_s - (progress[0].elapsed_s - progress[0].checkpoint_duration_ms / 1000)
    overheads = [p.checkpoint_duration_ms - p.spark_job_ms for p in ok]
    phases = _phase_summary({name: [p.phases_ms[name] for p in ok if p.phases_ms] for name in CHECKPOINT_PHASES})
    return {"records": summary.records_landed, "seconds": seconds, "batches": len(ok), "worker_mib": rss.peak_mib,
            "subtasks": pipeline.parallelism,
            "overhead_ms": statistics.median(overheads) if overheads else 0.0,
            "batch_ms": statistics.median(p.checkpoint_duration_ms for p in ok) if ok else 0.0, "phases": phases}


def run_structured_streaming(spark, servers: str, topic: str, per_batch: int, root: Path,
                             sink: str = "parquet", value_format: str = "raw") -> dict:
    """Spark's own exactly-once path: ``readStream.format("kafka")``, ``from_json`` / ``from_avro``
    for decoded values, into ``sink`` (parquet, or delta through delta-spark),
    ``trigger(availableNow=True)``. Its rate is taken from its first micro-batch's start to its
    last one's end (as Chandy's over its checkpoints): the query's start is paid once per run."""
    name = f"spark-{sink}-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    stream = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", servers).option("subscribe", topic)
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(per_batch))
              .option("includeHeaders", "true").option("kafka.isolation.level", "read_committed").load())
    query = (decode_column(value_format)(stream).writeStream.format(sink).option("path", str(root / name))
             .option("checkpointLocation", str(root / f"{name}-checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination()
    wall = time.monotonic() - started
    batches = [p for p in query.recentProgress if p.get("numInputRows", 0) > 0]
    records = spark.read.format(sink).load(str(root / name)).count()
    overheads = [p["durationMs"]["triggerExecution"] - p["durationMs"].get("addBatch", 0) for p in batches]
    keys = sorted({k for p in batches for k in p["durationMs"]})
    breakdown = _phase_summary({k: [float(p["durationMs"].get(k, 0)) for p in batches] for k in keys})
    seconds = wall
    if batches:
        import datetime

        def start_ms(p: dict) -> float:
            return datetime.datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp() * 1000

        seconds = (start_ms(batches[-1]) + batches[-1]["durationMs"]["triggerExecution"] - start_ms(batches[0])) / 1000
    return {"records": records, "seconds": seconds, "wall_seconds": wall, "batches": len(batches),
            "worker_mib": None,  # no Python
            "overhead_ms": statistics.median(overheads) if overheads else 0.0,
            "batch_ms": statistics.median(p["durationMs"]["triggerExecution"] for p in batches) if batches else 0.0,
            "phases": breakdown}


@contextlib.contextmanager
def _schema_registry(args: argparse.Namespace, root: Path) -> Iterator[None]:
    """With Protobuf values: a Schema Registry (Apicurio, as the tests start it) for their schema."""
    if "protobuf" not in (args.formats if args.suite else [args.value_format]):
        yield
        return
    from benchmarks.decoded_records import use_registry
    from tests.fixtures.schema_registry import SchemaRegistryProcess, resolve_apicurio

    registry = SchemaRegistryProcess(resolve_apicurio(), root / "registry.log")
    use_registry(registry.start(), root / "pageview.desc")
    try:
        yield
    finally:
        registry.stop()


RESULTS = Path(__file__).resolve().parent / "results" / "throughput.json"
#: delta-spark built for pyspark 4.2 (the benchmarks' environment: pyproject's ``bench`` extra)
DELTA_SPARK_FOR_BENCH = "4.4.0"
SYSTEMS = ("chandy", "ss_parquet", "ss_delta", "floor")


def _phase_order(name: str) -> tuple[int, str]:
    """Chandy's phases in their order, then Structured Streaming's by name."""
    return (CHECKPOINT_PHASES.index(name), "") if name in CHECKPOINT_PHASES else (len(CHECKPOINT_PHASES), name)


def run_suite(spark, servers: str, root: Path, args: argparse.Namespace) -> dict:
    """Every (format, size, system) row ``args.runs`` times; returns the JSON result."""
    rows: dict[str, dict[str, dict[str, list[dict]]]] = {}
    for value_format in args.formats:
        topic = f"bench-{value_format}-{args.records}"
        produce(servers, topic, args.records, value_format)
        warm_up(spark, servers, topic, root, value_format)
        for size in args.sizes:
            per_system: dict[str, list[dict]] = {name: [] for name in SYSTEMS}
            for number in range(args.runs):
                per_system["chandy"].append(run_chandy(spark, servers, topic, size, root, value_format=value_format))
                if not args.no_structured_streaming and (value_format != "protobuf" or args.spark_protobuf):
                    per_system["ss_parquet"].append(
                        run_structured_streaming(spark, servers, topic, size, root, value_format=value_format))
                    if not args.no_ss_delta:
                        per_system["ss_delta"].append(run_structured_streaming(spark, servers, topic, size, root,
                                                                               sink="delta", value_format=value_format))
                if size == max(args.sizes) and value_format != "protobuf":  # the floor decodes raw, JSON, Avro
                    per_system["floor"].append(run_floor(servers, topic, PARTITIONS, value_format, root,
                                                         per_file=size // max(1, os.cpu_count() or 1)))
                print(f"{value_format} {size:,} run {number + 1}: " + ", ".join(
                    f"{name} {runs[-1]['records'] / runs[-1]['seconds']:,.0f}/s"
                    for name, runs in per_system.items() if runs), flush=True)
            rows.setdefault(value_format, {})[str(size)] = {k: v for k, v in per_system.items() if v}
    summary: dict = {}
    for value_format, sizes in rows.items():
        for size, systems in sizes.items():
            for name, runs in systems.items():
                entry = {"records_per_s": spread([r["records"] / r["seconds"] for r in runs]),
                         "records": runs[0]["records"], "batches": runs[0]["batches"],
                         "batch_ms": spread([r["batch_ms"] for r in runs]),
                         "overhead_ms": spread([r["overhead_ms"] for r in runs])}
                phases = {k for r in runs for k in r.get("phases", {})}
                entry["phases_ms"] = {k: {q: statistics.median(r["phases"][k][q] for r in runs if k in r["phases"])
                                          for q in ("median", "p95")}
                                      for k in sorted(phases, key=_phase_order)}
                if runs[0].get("worker_mib"):
                    entry["worker_mib"] = spread([r["worker_mib"] for r in runs])
                summary.setdefault(value_format, {}).setdefault(size, {})[name] = entry
    return {"benchmark": "throughput", "environment": environment(),
            "config": {"records": args.records, "partitions": PARTITIONS, "runs": args.runs, "sizes": args.sizes,
                       "delta_spark": args.delta_spark_version, "master": "local[*]"},
            "summary": summary, "runs": rows}


def report_suite(result: dict, args: argparse.Namespace) -> None:
    """Print the suite's tables (median [min, max] records/s and the ratios) and write ``args.out``."""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    env = result["environment"]
    print(f"\n{result['config']['records']:,} records per run, {PARTITIONS} partitions, median of "
          f"{result['config']['runs']} runs [min, max]; pyspark {env['pyspark']}, {env['cores']} cores, "
          f"{env['memory_gib']} GiB")
    for value_format, sizes in result["summary"].items():
        for size, systems in sizes.items():
            cells = []
            for name, entry in systems.items():
                r = entry["records_per_s"]
                cells.append(f"{name} {r['median']:,.0f} [{r['min']:,.0f}, {r['max']:,.0f}]")
            chandy = systems["chandy"]["records_per_s"]["median"]
            ratios = [f"x{name} {chandy / systems[name]['records_per_s']['median']:.2f}"
                      for name in ("ss_parquet", "ss_delta", "floor") if name in systems]
            print(f"{value_format:5} {int(size):>9,}/batch  " + "  ".join(cells) + "  Chandy " + " ".join(ratios))
            for name in ("chandy", "ss_parquet"):
                if name in systems and systems[name]["phases_ms"]:
                    phases = ", ".join(f"{k} {v['median']:.0f}/{v['p95']:.0f}" for k, v in
                                       systems[name]["phases_ms"].items())
                    print(f"      {name} phases ms (median/p95): {phases}")
    print(f"written to {args.out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=5_000_000)
    parser.add_argument("--per-batch", type=int, default=500_000, help="records per checkpoint / micro-batch")
    parser.add_argument("--topic", default=None)
    parser.add_argument("--connector-version", default=None,
                        help="spark-sql-kafka-0-10 version (default: pyspark's own; Maven Central may lag PyPI)")
    parser.add_argument("--sink", choices=["delta", "iceberg", "both"], default="delta",
                        help="Chandy's table format(s): iceberg or both add a row for Apache Iceberg")
    parser.add_argument("--no-structured-streaming", action="store_true", help="skip Spark Structured Streaming")
    parser.add_argument("--delta-spark-version", default=None, metavar="VERSION",
                        help="also run Structured Streaming into Delta with io.delta:delta-spark_2.13:VERSION (the "
                             "exactly-once peer; it must be built for the installed pyspark, e.g. 4.4.0 for 4.2)")
    parser.add_argument("--write-buffer-bytes", type=int, default=None,
                        help="Chandy's --write-buffer-bytes (default: the pipeline's)")
    parser.add_argument("--parallelism", type=int, action="append", default=None, metavar="N",
                        help="Chandy's subtasks (default: the pipeline's default, one per partition capped at "
                             "the local cores); repeat it for a Chandy row per value")
    parser.add_argument("--memory-sweep", action="store_true",
                        help="also run Chandy at 50,000 and 2,000,000 records per checkpoint, and at 2,000,000 with an "
                             "unbounded write buffer, printing a Python worker's peak RSS in each")
    parser.add_argument("--value-format", choices=FORMATS, default="raw",
                        help="raw bytes, or decoded JSON / Avro values (benchmarks/decoded_records.py)")
    parser.add_argument("--suite", action="store_true",
                        help="raw, JSON and Avro at 50,000 and 500,000 per batch, --runs runs each, with the floor; "
                             "writes --out")
    parser.add_argument("--runs", type=int, default=5, help="with --suite: runs per row (the median is reported)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[50_000, 500_000],
                        help="with --suite: records per checkpoint / micro-batch")
    parser.add_argument("--formats", choices=FORMATS, nargs="+", default=list(FORMATS), help="with --suite")
    parser.add_argument("--out", type=Path, default=RESULTS, help="with --suite: the JSON results")
    parser.add_argument("--spark-protobuf", action="store_true",
                        help="Structured Streaming's from_protobuf for Protobuf rows: needs "
                             "org.apache.spark:spark-protobuf_2.13 from Maven Central (without it, Protobuf rows are "
                             "Chandy's alone)")
    parser.add_argument("--no-ss-delta", action="store_true",
                        help="with --suite: skip Structured Streaming into Delta (its rows take the longest)")
    args = parser.parse_args()
    if args.suite:
        args.records = args.records if args.records != 5_000_000 else 1_000_000
        args.delta_spark_version = args.delta_spark_version or DELTA_SPARK_FOR_BENCH
    import pyspark
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    with kafka_servers() as (servers, root), _schema_registry(args, root):
        topic = args.topic or f"bench-{args.value_format}-{args.records}"
        if not args.suite:
            produce(servers, topic, args.records, args.value_format)
        builder = (SparkSession.builder.master("local[*]").appName("chandy-vs-structured-streaming")
                   .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", str(PARTITIONS))
                   .config("spark.sql.streaming.numRecentProgressUpdates", "10000")
                   .config("spark.ui.showConsoleProgress", "false"))
        packages = []
        if not args.no_structured_streaming:
            version = args.connector_version or pyspark.__version__
            packages.append(f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version}")
            if args.suite or args.value_format == "avro":
                packages.append(f"org.apache.spark:spark-avro_2.13:{version}")
            if args.spark_protobuf:
                packages.append(f"org.apache.spark:spark-protobuf_2.13:{version}")
        if args.delta_spark_version:
            packages.append(f"io.delta:delta-spark_2.13:{args.delta_spark_version}")
            builder = (builder.config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
                       .config("spark.sql.catalog.spark_catalog", "org.apache.spark.sql.delta.catalog.DeltaCatalog"))
        if packages:
            builder = builder.config("spark.jars.packages", ",".join(packages))
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("WARN")
        iceberg = structured = structured_delta = None
        chandy_runs: list[dict] = []
        sweep: list[tuple[str, dict]] = []
        if args.suite:
            suite = run_suite(spark, servers, root, args)
            spark.stop()
            report_suite(suite, args)
            return
        warm_up(spark, servers, topic, root)
        if args.sink in ("delta", "both"):
            for parallelism in args.parallelism or [None]:
                chandy_runs.append(run_chandy(spark, servers, topic, args.per_batch, root,
                                              write_buffer_bytes=args.write_buffer_bytes, parallelism=parallelism,
                                              value_format=args.value_format))
        if args.sink in ("iceberg", "both"):
            iceberg = run_chandy(spark, servers, topic, args.per_batch, root, sink="iceberg",
                                 write_buffer_bytes=args.write_buffer_bytes, value_format=args.value_format)
        if not args.no_structured_streaming and (args.value_format != "protobuf" or args.spark_protobuf):
            structured = run_structured_streaming(spark, servers, topic, args.per_batch, root,
                                                  value_format=args.value_format)
            if args.delta_spark_version:
                structured_delta = run_structured_streaming(spark, servers, topic, args.per_batch, root,
                                                            sink="delta", value_format=args.value_format)
        if args.memory_sweep:
            for per_batch, buffer, label in ((50_000, args.write_buffer_bytes, "bounded"),
                                             (2_000_000, args.write_buffer_bytes, "bounded"),
                                             (2_000_000, 1 << 40, "unbounded (one part per checkpoint)")):
                # a new SparkContext starts new Python workers: a worker's RSS never shrinks
                # back (glibc and Arrow's allocator keep what earlier runs used)
                spark.stop()
                spark = builder.getOrCreate()
                sweep.append((f"{per_batch:>9,} per checkpoint, {label}",
                              run_chandy(spark, servers, topic, per_batch, root, write_buffer_bytes=buffer,
                                         value_format=args.value_format)))
        spark.stop()
    print(f"\n{args.records:,} {args.value_format} records, 8 partitions, {args.per_batch:,} records per batch, local[*]")
    print(f"{'':34} {'records':>10} {'seconds':>8} {'records/s':>10} {'batches':>8} {'batch ms':>9} "
          f"{'overhead ms':>12} {'worker MiB':>11}")
    rows = [(f"Chandy (Delta, {r['subtasks']} subtasks)", r) for r in chandy_runs]
    rows += [("Chandy (exactly-once Iceberg)", iceberg), ("Structured Streaming -> Parquet", structured),
             ("Structured Streaming -> Delta", structured_delta)]
    for name, r in rows:
        if r is not None:
            worker = "-" if r["worker_mib"] is None else f"{r['worker_mib']:,.0f}"
            print(f"{name:34} {r['records']:>10,} {r['seconds']:>8.1f} {r['records'] / r['seconds']:>10,.0f} "
                  f"{r['batches']:>8} {r['batch_ms']:>9,.0f} {r['overhead_ms']:>12,.0f} {worker:>11}")

    def rate(r: dict) -> float:
        return r["records"] / r["seconds"]

    for run in chandy_runs:
        subtasks = f"{run['subtasks']} subtasks"
        if structured:
            print(f"throughput ratio Chandy ({subtasks}) / Structured Streaming (Parquet): "
                  f"{rate(run) / rate(structured):.2f}")
        if structured_delta:
            print(f"throughput ratio Chandy ({subtasks}) / Structured Streaming (Delta): "
                  f"{rate(run) / rate(structured_delta):.2f}")
    chandy = chandy_runs[0] if chandy_runs else None
    if iceberg and chandy:
        print(f"throughput ratio Iceberg / Delta (both Chandy): {rate(iceberg) / rate(chandy):.2f}")
    if iceberg and structured:
        print(f"throughput ratio Chandy Iceberg / Spark: {rate(iceberg) / rate(structured):.2f}")


    if sweep:
        print(f"\npeak RSS of one Spark Python worker (MiB), Chandy into Delta, {args.value_format} values:")
        for label, r in sweep:
            print(f"  {label:50} {r['worker_mib']:>7,.0f} MiB  ({r['records'] / r['seconds']:,.0f} records/s)")
        print(f"  2,000,000 / 50,000 per checkpoint, bounded: {sweep[1][1]['worker_mib'] / sweep[0][1]['worker_mib']:.2f}")


if __name__ == "__main__":
    main()

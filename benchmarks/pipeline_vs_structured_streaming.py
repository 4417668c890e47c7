"""Chandy's Kafka-to-lake pipeline next to Spark Structured Streaming, same data, same machine, same run.

Run: ``.venv/bin/python benchmarks/pipeline_vs_structured_streaming.py`` (``--records``, ``--per-batch``,
``--sink delta|iceberg|both``, ``--no-structured-streaming``).
Uses ``$CHANDY_BOOTSTRAP_SERVERS`` or starts an embedded broker.

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
pyspark (Maven Central lags PyPI): for pyspark 4.2.0 use delta-spark 4.4.0 (see the README).

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
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka.admin import NewTopic

from benchmarks.procs import PeakWorkerRss
from chandy.broker import EmbeddedKafkaBroker
from chandy.connectors.spark.options import PipelineOptions
from chandy.connectors.spark.pipeline import Pipeline
from chandy.coordinator.kafka import config as kafka_config
from chandy.flights import topic_record_count

PARTITIONS = 8


def produce(servers: str, topic: str, records: int) -> None:
    if topic_record_count(servers, topic) == records:
        return
    admin = kafka_config.admin_client(servers)
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result()
    time.sleep(1)
    producer = kafka_config.producer(servers, overrides={"linger.ms": 50, "batch.num.messages": 10000,
                                                         "queue.buffering.max.messages": 1_000_000,
                                                         "compression.type": "lz4"})
    payload = os.urandom(90).hex()[:180]  # ~200 bytes with the counter
    started = time.monotonic()
    for i in range(records):
        while True:
            try:
                producer.produce(topic, f"{i:012d}:{payload}".encode(), f"k{i % 1000}".encode(), partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 50_000 == 0:
            producer.poll(0)
    producer.flush(300)
    print(f"produced {records:,} records in {time.monotonic() - started:.1f} s", flush=True)


def warm_up(spark, servers: str, topic: str, root: Path) -> None:
    """One small checkpoint into a scratch table, so that the first measured run does not pay
    for starting Spark's Python workers and the broker's transaction coordinator."""
    options = PipelineOptions(table_uri=str(root / "warm-up"), bootstrap_servers=servers, topics=(topic,),
                              max_records_per_checkpoint=1000, parallelism=PARTITIONS, max_checkpoints=1,
                              prefix=f"warm{uuid.uuid4().hex[:6]}")
    Pipeline(options, spark=spark).run()


def run_chandy(spark, servers: str, topic: str, per_batch: int, root: Path, sink: str = "delta",
               write_buffer_bytes: int | None = None, parallelism: int | None = None) -> dict:
    """One Chandy run to the topic's end; ``parallelism`` None is the pipeline's default."""
    progress = []
    table, catalog = str(root / f"chandy-table-{uuid.uuid4().hex[:6]}"), {}
    if sink == "iceberg":
        table, catalog = f"iceberg://bench/b.t{uuid.uuid4().hex[:6]}", {"warehouse": str(root / "iceberg")}
    options = PipelineOptions(table_uri=table, bootstrap_servers=servers, topics=(topic,),
                              max_records_per_checkpoint=per_batch // PARTITIONS, parallelism=parallelism,
                              stop_when_drained=True, prefix=f"bench{uuid.uuid4().hex[:6]}",
                              catalog_properties=catalog,
                              **({} if write_buffer_bytes is None else {"write_buffer_bytes": write_buffer_bytes}))
    started = time.monotonic()
    pipeline = Pipeline(options, spark=spark)
    with PeakWorkerRss() as rss:
        summary = pipeline.run(on_progress=progress.append)
    seconds = time.monotonic() - started
    ok = [p for p in progress if p.succeeded]
    overheads = [p.checkpoint_duration_ms - p.spark_job_ms for p in ok]
    return {"records": summary.records_landed, "seconds": seconds, "batches": len(ok), "worker_mib": rss.peak_mib,
            "subtasks": pipeline.parallelism,
            "overhead_ms": statistics.median(overheads) if overheads else 0.0,
            "batch_ms": statistics.median(p.checkpoint_duration_ms for p in ok) if ok else 0.0}


def run_structured_streaming(spark, servers: str, topic: str, per_batch: int, root: Path,
                             sink: str = "parquet") -> dict:
    """Spark's own exactly-once path: ``readStream.format("kafka")`` into ``sink`` (parquet, or
    delta through delta-spark), ``trigger(availableNow=True)``."""
    name = f"spark-{sink}-{uuid.uuid4().hex[:6]}"
    started = time.monotonic()
    stream = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", servers).option("subscribe", topic)
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(per_batch))
              .option("includeHeaders", "true").option("kafka.isolation.level", "read_committed").load())
    query = (stream.writeStream.format(sink).option("path", str(root / name))
             .option("checkpointLocation", str(root / f"{name}-checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination()
    seconds = time.monotonic() - started
    batches = [p for p in query.recentProgress if p.get("numInputRows", 0) > 0]
    records = spark.read.format(sink).load(str(root / name)).count()
    overheads = [p["durationMs"]["triggerExecution"] - p["durationMs"].get("addBatch", 0) for p in batches]
    return {"records": records, "seconds": seconds, "batches": len(batches), "worker_mib": None,  # no Python
            "overhead_ms": statistics.median(overheads) if overheads else 0.0,
            "batch_ms": statistics.median(p["durationMs"]["triggerExecution"] for p in batches) if batches else 0.0}


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
    args = parser.parse_args()
    import pyspark
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    broker = None
    servers = os.environ.get("CHANDY_BOOTSTRAP_SERVERS")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if not servers:
            broker = EmbeddedKafkaBroker(root / "kafka", heap="1g")
            servers = broker.up().bootstrap_servers
        try:
            topic = args.topic or f"bench-{args.records}"
            produce(servers, topic, args.records)
            builder = (SparkSession.builder.master("local[*]").appName("chandy-vs-structured-streaming")
                       .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", str(PARTITIONS)))
            packages = []
            if not args.no_structured_streaming:
                packages.append(f"org.apache.spark:spark-sql-kafka-0-10_2.13:{args.connector_version or pyspark.__version__}")
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
            warm_up(spark, servers, topic, root)
            if args.sink in ("delta", "both"):
                for parallelism in args.parallelism or [None]:
                    chandy_runs.append(run_chandy(spark, servers, topic, args.per_batch, root,
                                                  write_buffer_bytes=args.write_buffer_bytes, parallelism=parallelism))
            if args.sink in ("iceberg", "both"):
                iceberg = run_chandy(spark, servers, topic, args.per_batch, root, sink="iceberg",
                                     write_buffer_bytes=args.write_buffer_bytes)
            if not args.no_structured_streaming:
                structured = run_structured_streaming(spark, servers, topic, args.per_batch, root)
                if args.delta_spark_version:
                    structured_delta = run_structured_streaming(spark, servers, topic, args.per_batch, root,
                                                                sink="delta")
            if args.memory_sweep:
                for per_batch, buffer, label in ((50_000, args.write_buffer_bytes, "bounded"),
                                                 (2_000_000, args.write_buffer_bytes, "bounded"),
                                                 (2_000_000, 1 << 40, "unbounded (one part per checkpoint)")):
                    # a new SparkContext starts new Python workers: a worker's RSS never shrinks
                    # back (glibc and Arrow's allocator keep what earlier runs used)
                    spark.stop()
                    spark = builder.getOrCreate()
                    sweep.append((f"{per_batch:>9,} per checkpoint, {label}",
                                  run_chandy(spark, servers, topic, per_batch, root, write_buffer_bytes=buffer)))
            spark.stop()
        finally:
            if broker is not None:
                broker.down()
    print(f"\n{args.records:,} records of ~200 bytes, 8 partitions, {args.per_batch:,} records per batch, local[*]")
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
        print("\npeak RSS of one Spark Python worker (MiB), Chandy into Delta:")
        for label, r in sweep:
            print(f"  {label:50} {r['worker_mib']:>7,.0f} MiB  ({r['records'] / r['seconds']:,.0f} records/s)")
        print(f"  2,000,000 / 50,000 per checkpoint, bounded: {sweep[1][1]['worker_mib'] / sweep[0][1]['worker_mib']:.2f}")


if __name__ == "__main__":
    main()

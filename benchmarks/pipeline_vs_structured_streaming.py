"""Chandy's Kafka-to-lake pipeline next to Spark Structured Streaming, same data, same machine, same run.

Run: ``.venv/bin/python benchmarks/pipeline_vs_structured_streaming.py`` (``--records``, ``--per-batch``).
Uses ``$CHANDY_BOOTSTRAP_SERVERS`` or starts an embedded broker.

1. Produces N records (default 5,000,000) of about 200 bytes over 8 partitions, once (a topic
   that already holds them is reused).
2. Chandy: the exactly-once pipeline into a Delta table, ``max.records.per.checkpoint`` = B / 8.
3. Spark: ``readStream.format("kafka")`` (spark-sql-kafka-0-10 from Maven Central through
   ``spark.jars.packages``) with ``maxOffsetsPerTrigger`` = B, writing Parquet with a checkpoint
   location, ``trigger(availableNow=True)``.
Both in one SparkSession (``local[*]``), raw key/value/metadata columns, no decoding.

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

from chandy.broker import EmbeddedKafkaBroker
from chandy.flights import topic_record_count
from connectors.spark.pipeline import Pipeline, PipelineOptions
from coordinator.kafka import config as kafka_config

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


def run_chandy(spark, servers: str, topic: str, per_batch: int, root: Path) -> dict:
    progress = []
    options = PipelineOptions(table_uri=str(root / "chandy-table"), bootstrap_servers=servers, topics=(topic,),
                              max_records_per_checkpoint=per_batch // PARTITIONS, parallelism=PARTITIONS,
                              stop_when_drained=True, prefix=f"bench{uuid.uuid4().hex[:6]}")
    started = time.monotonic()
    summary = Pipeline(options, spark=spark).run(on_progress=progress.append)
    seconds = time.monotonic() - started
    ok = [p for p in progress if p.succeeded]
    overheads = [p.checkpoint_duration_ms - p.spark_job_ms for p in ok]
    return {"records": summary.records_landed, "seconds": seconds, "batches": len(ok),
            "overhead_ms": statistics.median(overheads) if overheads else 0.0,
            "batch_ms": statistics.median(p.checkpoint_duration_ms for p in ok) if ok else 0.0}


def run_structured_streaming(spark, servers: str, topic: str, per_batch: int, root: Path) -> dict:
    started = time.monotonic()
    stream = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", servers).option("subscribe", topic)
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", str(per_batch))
              .option("includeHeaders", "true").option("kafka.isolation.level", "read_committed").load())
    query = (stream.writeStream.format("parquet").option("path", str(root / "spark-table"))
             .option("checkpointLocation", str(root / "spark-checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination()
    seconds = time.monotonic() - started
    batches = [p for p in query.recentProgress if p.get("numInputRows", 0) > 0]
    records = spark.read.parquet(str(root / "spark-table")).count()
    overheads = [p["durationMs"]["triggerExecution"] - p["durationMs"].get("addBatch", 0) for p in batches]
    return {"records": records, "seconds": seconds, "batches": len(batches),
            "overhead_ms": statistics.median(overheads) if overheads else 0.0,
            "batch_ms": statistics.median(p["durationMs"]["triggerExecution"] for p in batches) if batches else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=5_000_000)
    parser.add_argument("--per-batch", type=int, default=500_000, help="records per checkpoint / micro-batch")
    parser.add_argument("--topic", default=None)
    parser.add_argument("--connector-version", default=None,
                        help="spark-sql-kafka-0-10 version (default: pyspark's own; Maven Central may lag PyPI)")
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
            spark = (SparkSession.builder.master("local[*]").appName("chandy-vs-structured-streaming")
                     .config("spark.jars.packages", f"org.apache.spark:spark-sql-kafka-0-10_2.13:{args.connector_version or pyspark.__version__}")
                     .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", str(PARTITIONS))
                     .getOrCreate())
            spark.sparkContext.setLogLevel("WARN")
            chandy = run_chandy(spark, servers, topic, args.per_batch, root)
            structured = run_structured_streaming(spark, servers, topic, args.per_batch, root)
            spark.stop()
        finally:
            if broker is not None:
                broker.down()
    print(f"\n{args.records:,} records of ~200 bytes, 8 partitions, {args.per_batch:,} records per batch, local[*]")
    print(f"{'':28} {'records':>10} {'seconds':>8} {'records/s':>10} {'batches':>8} {'batch ms':>9} {'overhead ms':>12}")
    for name, r in (("Chandy (exactly-once Delta)", chandy), ("Spark Structured Streaming", structured)):
        print(f"{name:28} {r['records']:>10,} {r['seconds']:>8.1f} {r['records'] / r['seconds']:>10,.0f} "
              f"{r['batches']:>8} {r['batch_ms']:>9,.0f} {r['overhead_ms']:>12,.0f}")
    ratio = (chandy["records"] / chandy["seconds"]) / (structured["records"] / structured["seconds"])
    print(f"throughput ratio Chandy / Spark: {ratio:.2f}")


if __name__ == "__main__":
    main()

"""Many routed tables: the same records routed by a field to 10, 100 or 1,000 Delta tables, with the
routed tables committed one after another (``--commit-threads 1``, before issue 57) and side by
side (``--commit-threads 8``, the default), on a local disk and on a local S3 API server (moto).

Run: ``.venv/bin/python benchmarks/routed_tables.py`` (``--records``, ``--tables 10 100 1000``,
``--threads 1 8``, ``--store local s3``, ``--runs``, ``--per-batch``). Uses
``$CHANDY_BOOTSTRAP_SERVERS`` or starts an embedded broker; ``--store s3`` starts ``moto_server``.

1. Produces N JSON records (default 400,000) ``{"id", "region", "amount"}`` in 8 partitions, the
   ``region`` of record i being ``r<i mod T>`` for each table count T (one topic per T).
2. Chandy lands each topic (``--route-field region --route '(r[0-9]+)=<root>/t/$1'``, ``--table
   <root>/all``, ``max.records.per.checkpoint`` = B / 8) into new tables, in one SparkSession
   (``local[*]``), ``--runs`` times each (median [min, max]).
3. With ``--delta-rs-floor``, beside them: delta-rs alone writing the same number of records per
   table and checkpoint into as many new tables (``write_deltalake`` append with the checkpoint's
   app transaction, ``--threads`` tables at once), no Kafka, no Spark, no decoding: the rate no
   writer of one Delta commit per table and checkpoint passes on this machine.
4. With ``--whole-command``, instead: ``chandy pipeline run ... --until-drained`` in a new process
   per run (a cold start, the default checkpointing: no cap per checkpoint), alternating 10 and
   1,000 tables, timed from the command's start to its exit, the way issue 57 measured it
   (36.8 s for 1,000 tables against 17.1 s for 10, at the issue).
Prints records/s from the first checkpoint's trigger to the last one's completion and the median
``lake_commit`` phase (every table's commit of a checkpoint), the ratio of 1,000 tables to 10 for
each thread count and of 8 threads to 1, and writes them with the versions to
``benchmarks/results/routed_tables.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka.admin import NewTopic

from benchmarks.procs import environment, kafka_servers, spread
from chandy.broker import free_port
from chandy.connectors.spark.options import PipelineOptions
from chandy.connectors.spark.pipeline import Pipeline
from chandy.coordinator.kafka import config as kafka_config
from chandy.flights import topic_record_count

PARTITIONS = 8
RESULTS = Path(__file__).resolve().parent / "results" / "routed_tables.json"
DDL = "id BIGINT, region STRING, amount DOUBLE"


def produce(servers: str, records: int, tables: int) -> str:
    """The topic of ``records`` records over ``tables`` regions (reused when it holds them)."""
    topic = f"bench-routed-{records}-{tables}"
    if topic_record_count(servers, topic) == records:
        return topic
    admin = kafka_config.admin_client(servers)  # held until the topic exists: a dropped client cancels its requests
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result()
    producer = kafka_config.producer(servers, overrides={"linger.ms": 20, "queue.buffering.max.messages": 500_000})
    for i in range(records):
        value = f'{{"id":{i},"region":"r{i % tables}","amount":{i * 7 % 1000}.5}}'.encode()
        while True:
            try:
                producer.produce(topic, value, str(i).encode(), partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(120)
    return topic


@contextlib.contextmanager
def s3_store(log: Path) -> Iterator[str]:
    """A local S3 API server (``moto_server``) with a bucket; yields the bucket's URL. Its settings
    go to the environment under delta-rs's names, where the pipeline and its workers read them."""
    import boto3

    executable = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")
    if executable is None:
        raise SystemExit("moto_server is not installed: pip install -e '.[test]'")
    port = free_port()
    process = subprocess.Popen([executable, "-H", "127.0.0.1", "-p", str(port)], stdout=log.open("wb"),
                               stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
                           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"})
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="testing", aws_secret_access_key="testing",
                     region_name="us-east-1").create_bucket(Bucket=bucket)
        yield f"s3://{bucket}"
    finally:
        process.terminate()
        process.wait(10)


def run(spark, servers: str, topic: str, per_batch: int, root: str, threads: int) -> dict:
    """One run to the topic's end into new tables under ``root``: records/s and the median lake_commit (ms)."""
    progress: list = []
    base = f"{root}/r-{uuid.uuid4().hex[:6]}"
    options = PipelineOptions(table_uri=f"{base}/all", bootstrap_servers=servers, topics=(topic,), value_format="json",
                              value_schema=DDL, route_field="region", routes=(f"(r[0-9]+)={base}/t/$1",),
                              commit_threads=threads, max_records_per_checkpoint=per_batch // PARTITIONS,
                              stop_when_drained=True, prefix=f"bench{uuid.uuid4().hex[:6]}")
    summary = Pipeline(options, spark=spark).run(on_progress=progress.append)
    ok = [p for p in progress if p.succeeded]
    seconds = progress[-1].elapsed_s - (progress[0].elapsed_s - progress[0].checkpoint_duration_ms / 1000)
    return {"records": summary.records_landed, "seconds": seconds, "records_per_s": summary.records_landed / seconds,
            "checkpoints": len(ok), "lake_commit_ms": statistics.median(p.phases_ms.get("lake_commit", 0.0) for p in ok)}


def delta_rs_floor(records: int, per_batch: int, tables: int, threads: int, root: str) -> dict:
    """delta-rs alone landing ``records`` in checkpoints of ``per_batch`` spread over ``tables``
    new tables (one ``write_deltalake`` append with an app transaction per table and checkpoint,
    ``threads`` at once): records/s and the median ms per checkpoint."""
    import concurrent.futures

    import pyarrow as pa
    from deltalake import write_deltalake
    from deltalake.transaction import CommitProperties, Transaction

    base = f"{root}/floor-{uuid.uuid4().hex[:6]}"
    job = uuid.uuid4().hex
    per_table = max(1, per_batch // tables)
    rows = pa.table({"id": pa.array(range(per_table), pa.int64()), "region": ["r"] * per_table,
                     "amount": pa.array([0.5] * per_table)})
    spent = []
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        for checkpoint in range(1, max(1, records // per_batch) + 1):
            started = time.monotonic()
            list(pool.map(lambda i, c=checkpoint: write_deltalake(
                f"{base}/t{i}", rows, mode="append",
                commit_properties=CommitProperties(app_transactions=[Transaction(job, c)])), range(tables)))
            spent.append(time.monotonic() - started)
    landed = per_table * tables * len(spent)
    return {"records_per_s": landed / sum(spent), "checkpoint_ms": statistics.median(spent) * 1000}


def whole_command(servers: str, topic: str, root: str) -> dict:
    """One cold ``chandy pipeline run`` of ``topic`` into new tables under ``root``, default
    checkpointing, to the topic's end: seconds from start to exit."""
    base = f"{root}/w-{uuid.uuid4().hex[:6]}"
    command = [sys.executable, "-m", "chandy.cli", "pipeline", "run", "--table", f"{base}/all", "--bootstrap-servers",
               servers, "--topic", topic, "--value-format", "json", "--value-schema", DDL, "--route-field", "region",
               "--route", f"(r[0-9]+)={base}/t/$1", "--until-drained", "--prefix", f"w{uuid.uuid4().hex[:6]}"]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"chandy pipeline run exited {done.returncode}: {done.stderr[-2000:]}")
    return {"seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=400_000)
    parser.add_argument("--tables", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--store", nargs="+", choices=["local", "s3"], default=["local", "s3"])
    parser.add_argument("--per-batch", type=int, default=100_000, help="records per checkpoint")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--delta-rs-floor", action="store_true",
                        help="also time delta-rs alone committing as many tables per checkpoint")
    parser.add_argument("--whole-command", action="store_true",
                        help="time cold `chandy pipeline run` commands at default checkpointing (local disk)")
    args = parser.parse_args()
    if args.whole_command:
        return main_whole_command(args)
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    result: dict = {"config": {"records": args.records, "per_batch": args.per_batch, "runs": args.runs}, "runs": {}}
    with kafka_servers() as (servers, root), contextlib.ExitStack() as stack:
        topics = {tables: produce(servers, args.records, tables) for tables in args.tables}
        roots = {"local": str(root / "lake")}
        if "s3" in args.store:
            roots["s3"] = stack.enter_context(s3_store(root / "moto.log"))
        spark = (SparkSession.builder.master("local[*]").appName("chandy-routed-tables")
                 .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
        spark.sparkContext.setLogLevel("WARN")
        run(spark, servers, topics[min(args.tables)], args.per_batch, roots["local"], 1)  # warm-up
        result["environment"] = environment()
        for store in args.store:
            for tables in args.tables:
                for threads in args.threads:
                    outcomes = []
                    for n in range(args.runs):
                        outcome = run(spark, servers, topics[tables], args.per_batch, roots[store], threads)
                        outcomes.append(outcome)
                        print(f"{store} {tables} tables, {threads} thread(s), run {n + 1}: "
                              f"{outcome['records_per_s']:,.0f} records/s, lake_commit {outcome['lake_commit_ms']:.0f} ms, "
                              f"{outcome['checkpoints']} checkpoints", flush=True)
                    result["runs"][f"{store}/{tables}/{threads}"] = {
                        "records_per_s": spread([o["records_per_s"] for o in outcomes]),
                        "lake_commit_ms": spread([o["lake_commit_ms"] for o in outcomes])}
                    if args.delta_rs_floor:
                        floors = [delta_rs_floor(args.records, args.per_batch, tables, threads, roots[store])
                                  for _ in range(args.runs)]
                        result["runs"][f"{store}/{tables}/{threads}/delta-rs"] = {
                            "records_per_s": spread([f["records_per_s"] for f in floors]),
                            "checkpoint_ms": spread([f["checkpoint_ms"] for f in floors])}
                        print(f"{store} {tables} tables, {threads} thread(s), delta-rs alone: "
                              f"{statistics.median(f['records_per_s'] for f in floors):,.0f} records/s", flush=True)
        spark.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    env = result["environment"]
    print(f"\n{args.records:,} JSON records routed by a field, {args.per_batch:,} per checkpoint, median of {args.runs} "
          f"runs [min, max]; pyspark {env['pyspark']}, deltalake {env.get('deltalake')}, {env['cores']} cores")
    runs = result["runs"]
    for key, r in runs.items():
        rate = r["records_per_s"]
        phase = (f"lake_commit {r['lake_commit_ms']['median']:,.0f} ms" if "lake_commit_ms" in r
                 else f"a checkpoint {r['checkpoint_ms']['median']:,.0f} ms")
        print(f"{key:27} {rate['median']:>9,.0f} [{rate['min']:,.0f}, {rate['max']:,.0f}] records/s, {phase}")
    for store in args.store:
        for threads in args.threads:
            few, many = runs.get(f"{store}/{min(args.tables)}/{threads}"), runs.get(f"{store}/{max(args.tables)}/{threads}")
            if few and many:
                print(f"{store}, {threads} thread(s): {max(args.tables)} tables / {min(args.tables)} tables "
                      f"x{many['records_per_s']['median'] / few['records_per_s']['median']:.2f}")
            floor = runs.get(f"{store}/{max(args.tables)}/{threads}/delta-rs")
            if few and floor:
                print(f"{store}, {threads} thread(s): delta-rs alone into {max(args.tables)} tables / Chandy into "
                      f"{min(args.tables)} tables x{floor['records_per_s']['median'] / few['records_per_s']['median']:.2f}")
        for tables in args.tables:
            one, most = runs.get(f"{store}/{tables}/{min(args.threads)}"), runs.get(f"{store}/{tables}/{max(args.threads)}")
            if one and most:
                print(f"{store}, {tables} tables: {max(args.threads)} threads / {min(args.threads)} "
                      f"x{most['records_per_s']['median'] / one['records_per_s']['median']:.2f}")
    print(f"written to {args.out}")


def main_whole_command(args: argparse.Namespace) -> None:
    """``--whole-command``: each table count's cold command ``--runs`` times, interleaved."""
    result: dict = {"config": {"records": args.records, "runs": args.runs, "whole_command": True}, "runs": {}}
    seconds: dict[int, list[float]] = {tables: [] for tables in args.tables}
    with kafka_servers() as (servers, root):
        topics = {tables: produce(servers, args.records, tables) for tables in args.tables}
        result["environment"] = environment()
        for n in range(args.runs):
            for tables in args.tables:
                outcome = whole_command(servers, topics[tables], str(root / "lake"))
                seconds[tables].append(outcome["seconds"])
                print(f"{tables} tables, run {n + 1}: {outcome['seconds']:.1f} s, "
                      f"{args.records / outcome['seconds']:,.0f} records/s", flush=True)
    for tables, values in seconds.items():
        result["runs"][f"whole/{tables}"] = {"seconds": spread(values),
                                             "records_per_s": spread([args.records / v for v in values])}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    env = result["environment"]
    print(f"\n{args.records:,} JSON records routed by a field, whole cold command, default checkpointing, median of "
          f"{args.runs} [min, max]; pyspark {env['pyspark']}, deltalake {env.get('deltalake')}, {env['cores']} cores")
    for key, r in result["runs"].items():
        print(f"{key:12} {r['seconds']['median']:.1f} s [{r['seconds']['min']:.1f}, {r['seconds']['max']:.1f}], "
              f"{r['records_per_s']['median']:,.0f} records/s")
    few, many = min(args.tables), max(args.tables)
    if few != many:
        rates = {n: result["runs"][f"whole/{n}"]["records_per_s"]["median"] for n in (few, many)}
        print(f"{many} tables / {few} tables x{rates[many] / rates[few]:.2f}")
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()

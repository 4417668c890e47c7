"""Checkpoint end-to-end latency and coordinator-log replay speed, each next to its Kafka floor.

Run: ``.venv/bin/python benchmarks/checkpoint_latency.py`` (or ``make bench``); uses
``$CHANDY_BOOTSTRAP_SERVERS`` or starts an embedded broker in a temporary directory.

1. The floors, with raw confluent-kafka (no Chandy code): produce → consume round trips of single
   messages; and the *checkpoint floor*, the Kafka operations a checkpoint cannot avoid, in order:
   the trigger transaction (begin, produce to the control topic and the log, commit), the worker's
   consume of the trigger, the ack's produce and the coordinator's consume of it, the completion
   transaction, and the worker's consume of the completion (p50/p99, ms).
2. Checkpoint end-to-end latency with 1, 16, 64, 256 and 1,000 subtasks: a manual trigger until its
   future completes (trigger transaction, workers' acks, ``_metadata`` write, completion
   transaction), every subtask a real subtask attempt registered with one
   :class:`~chandy.coordinator.kafka.host.ParticipantHost` (one control consumer and one acks producer
   for all, as a Flink TaskExecutor hosts its tasks) in a worker process of its own
   (``--workers thread``: in the coordinator's process). Targets: 1,000-subtask p50 ≤ 250 ms;
   16-subtask p50 ≤ 1.5 × the checkpoint floor.
3. Replay: a coordinator log of N records (default 1,000,000; per checkpoint the ID counter,
   PENDING, COMPLETED and the tombstone of the checkpoint it subsumes, as a coordinator with
   ``state.checkpoints.num-retained`` 1 writes them) replayed with the coordinator's own
   ``load_state`` (newest record per key decoded and folded), next to a plain consume of the same
   topic (no decoding), in records/s; and ``chandy log replay``'s fold of every record with its
   timeline. Target: ``load_state`` ≥ 0.5 × the plain consume.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, TopicPartition
from confluent_kafka.admin import NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.history import write_history
from chandy.broker import EmbeddedKafkaBroker
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.log import load_state, read_log
from chandy.coordinator.kafka.replay import replay
from chandy.demo import run_checkpoints
from chandy.roundtrip import round_trip


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


def checkpoint_floor(servers: str, samples: int) -> dict:
    """The Kafka operations of one checkpoint with raw confluent-kafka clients (see the module
    docstring), ``samples`` times; per sample the ms from the trigger transaction's begin to the
    worker's consume of the completion."""
    from confluent_kafka import Consumer, Producer

    run = uuid.uuid4().hex[:8]
    control, acks, log_topic = f"floor-{run}-control", f"floor-{run}-acks", f"floor-{run}-log"
    admin = kafka_config.admin_client(servers)
    for future in admin.create_topics([NewTopic(t, 1, 1) for t in (control, acks, log_topic)]).values():
        future.result()
    base = {"bootstrap.servers": servers}
    coordinator = Producer({**base, "transactional.id": f"floor-{run}", "linger.ms": 0, "enable.idempotence": True})
    coordinator.init_transactions(30)
    worker_producer = Producer({**base, "linger.ms": 0, "acks": "all"})

    def reader(topic: str) -> Consumer:
        consumer = Consumer({**base, "group.id": f"floor-{run}-{topic}", "enable.auto.commit": False,
                             "isolation.level": "read_committed", "fetch.wait.max.ms": 10})
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        return consumer

    worker, coordinator_acks = reader(control), reader(acks)

    def consume_one(consumer: Consumer) -> None:
        while True:
            message = consumer.poll(10)
            if message is None:
                raise TimeoutError("checkpoint floor: a message did not arrive within 10 s")
            if message.error() is None:
                return

    def transaction(value: bytes) -> None:
        coordinator.begin_transaction()
        coordinator.produce(control, value)
        coordinator.produce(log_topic, value, b"checkpoint")
        coordinator.commit_transaction(30)

    latencies = []
    try:
        for i in range(samples + 3):
            start = time.perf_counter()
            transaction(b"trigger %d" % i)
            consume_one(worker)
            worker_producer.produce(acks, b"ack %d" % i)
            worker_producer.flush(30)
            consume_one(coordinator_acks)
            transaction(b"complete %d" % i)
            consume_one(worker)
            if i >= 3:  # warm-up
                latencies.append((time.perf_counter() - start) * 1000)
    finally:
        worker.close()
        coordinator_acks.close()
        admin.delete_topics([control, acks, log_topic])
    return {"samples": samples, "p50_ms": round(pct(latencies, 0.5), 2), "p99_ms": round(pct(latencies, 0.99), 2)}


def checkpoint_latency(servers: str, subtasks: int, checkpoints: int, tmp: Path, worker_process: bool) -> dict:
    result = run_checkpoints(servers, f"file://{tmp}/chk", subtasks=subtasks, checkpoints=checkpoints, warmup=3,
                             worker_process=worker_process)
    assert all(r.status == "COMPLETED" and r.num_acknowledged == subtasks for r in result.records)
    latencies = result.latencies_ms
    return {"subtasks": subtasks, "checkpoints": checkpoints, "p50_ms": round(pct(latencies, 0.5), 2),
            "p99_ms": round(pct(latencies, 0.99), 2), "mean_ms": round(statistics.fmean(latencies), 2)}


def replay_speed(servers: str, records: int) -> dict:
    job = uuid.uuid4().hex
    topic = f"bench-log-{uuid.uuid4().hex[:6]}"
    admin = kafka_config.admin_client(servers)
    admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact", "min.compaction.lag.ms": "3600000"})])[topic].result()
    start = time.perf_counter()
    write_history(servers, topic, 0, job, records)
    produce_s = time.perf_counter() - start

    start = time.perf_counter()
    consumer = kafka_config.consumer(servers, overrides={"enable.partition.eof": True, "fetch.wait.max.ms": 10, "fetch.queue.backoff.ms": 1,
                                                         "fetch.max.bytes": 52428800,
                                                         "max.partition.fetch.bytes": 10485760})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    _, end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
    seen = 0
    done = False
    while not done:
        for message in consumer.consume(num_messages=10_000, timeout=0.05):
            if message.error() is not None:
                done = message.offset() >= end
                continue
            seen += 1
    consumer.close()
    plain_s = time.perf_counter() - start

    state, stats = load_state(servers, topic, job, timeout_s=120)
    replay_s = stats.seconds
    assert stats.read == records, (stats.read, records)
    # `chandy log replay`: every record decoded and folded, plus a timeline entry per record
    start = time.perf_counter()
    timeline = replay(read_log(servers, topic, job_id=job, timeout_s=120), job_id=job)
    timeline_s = time.perf_counter() - start
    assert timeline.records == records
    assert state.equals_ignoring_counters(timeline.states[job]), "load_state and the full fold disagree"
    admin.delete_topics([topic])
    return {"records": records, "produce_s": round(produce_s, 1), "plain_consume_s": round(plain_s, 2),
            "plain_consume_records_per_s": round(seen / plain_s), "replay_s": round(replay_s, 2),
            "replay_records_per_s": round(records / replay_s), "ratio_replay_to_plain": round(plain_s / replay_s, 3),
            "timeline_replay_s": round(timeline_s, 2), "timeline_records_per_s": round(records / timeline_s)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subtasks", default="1,16,64,256,1000",
                        help="comma-separated subtask counts (default 1,16,64,256,1000)")
    parser.add_argument("--checkpoints", type=int, default=100, help="timed checkpoints per count (default 100)")
    parser.add_argument("--round-trips", type=int, default=1000, help="floor round trips (default 1000)")
    parser.add_argument("--log-records", type=int, default=1_000_000, help="log size for replay (default 1,000,000)")
    parser.add_argument("--workers", choices=("process", "thread"), default="process",
                        help="host the subtasks in a worker process of their own (default) or in the coordinator's")
    parser.add_argument("--floor-samples", type=int, default=50, help="checkpoint floor samples (default 50)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    import os

    broker = None
    servers = os.environ.get("CHANDY_BOOTSTRAP_SERVERS")
    with tempfile.TemporaryDirectory() as tmp:
        if not servers:
            broker = EmbeddedKafkaBroker(Path(tmp) / "kafka", heap="1g")
            servers = broker.up().bootstrap_servers
        try:
            floor = round_trip(servers, messages=args.round_trips)
            results = {"floor": {"round_trips": floor.count, "p50_ms": round(floor.p50_ms, 2),
                                 "p99_ms": round(floor.p99_ms, 2)},
                       "checkpoint_floor": checkpoint_floor(servers, args.floor_samples),
                       "workers": args.workers, "checkpoints": []}
            for n in (int(x) for x in args.subtasks.split(",") if x.strip()):
                results["checkpoints"].append(checkpoint_latency(servers, n, args.checkpoints, Path(tmp),
                                                                 args.workers == "process"))
            if args.log_records > 0:
                results["replay"] = replay_speed(servers, args.log_records)
        finally:
            if broker is not None:
                broker.down()
    if args.json:
        print(json.dumps(results))
        return
    f = results["floor"]
    cf = results["checkpoint_floor"]
    print(f"produce→consume floor ({f['round_trips']} msgs): p50 {f['p50_ms']} ms, p99 {f['p99_ms']} ms")
    print(f"checkpoint floor, raw confluent-kafka ({cf['samples']} samples: trigger transaction, consume, ack "
          f"produce+consume, completion transaction, consume): p50 {cf['p50_ms']} ms, p99 {cf['p99_ms']} ms")
    print(f"subtasks hosted in: {'a worker process' if results['workers'] == 'process' else 'the coordinator process'}")
    print(f"{'subtasks':>8} {'checkpoints':>11} {'p50 ms':>8} {'p99 ms':>8} {'p50/checkpoint floor':>20}")
    for c in results["checkpoints"]:
        print(f"{c['subtasks']:>8} {c['checkpoints']:>11} {c['p50_ms']:>8} {c['p99_ms']:>8} "
              f"{c['p50_ms'] / cf['p50_ms']:>20.2f}")
    if "replay" in results:
        r = results["replay"]
        print(f"log of {r['records']:,} records: replay {r['replay_records_per_s']:,} records/s ({r['replay_s']} s), "
              f"plain consume {r['plain_consume_records_per_s']:,} records/s ({r['plain_consume_s']} s), "
              f"replay/plain speed {r['ratio_replay_to_plain']}")
        print(f"`chandy log replay` (fold + timeline) of the same log: {r['timeline_records_per_s']:,} records/s "
              f"({r['timeline_replay_s']} s)")


if __name__ == "__main__":
    main()

"""Recovery: a SIGKILLed coordinator's successor, over a long log, to its first completed checkpoint.

Each run gives a new job a coordinator log of N records (default 100,000: the history of a
long-running job, see :mod:`benchmarks.history`), starts a coordinator process (A) over it with
a worker process's subtasks acknowledging, lets A complete checkpoints and SIGKILLs it in the
middle of one, then starts the successor process (B) and times, on B's side:

- ``spawn → first checkpoint``: from the moment the parent starts B's process (a fresh
  interpreter: imports included) to B's first completed checkpoint. Target: ≤ 2 s.
- ``start → first checkpoint``: from ``CoordinatorService.start`` to it (fencing A with
  ``init_transactions``, replaying the log, aborting A's pending checkpoint, restoring A's latest
  completed checkpoint, one checkpoint).
- of which ``load_state``: the replay alone.

Next to it, the floor of the replay, with raw confluent-kafka in the same run: a plain consume of
the same log partition (no decoding). Prints one line per run and the medians.

    .venv/bin/python benchmarks/recovery.py [--records 100000] [--runs 5] [--subtasks 4]

Uses ``$CHANDY_BOOTSTRAP_SERVERS`` or starts an embedded broker in a temporary directory. With
``RECOVERY_DEBUG=1`` the successor also prints how long each phase of its start took (topics,
``init_transactions``, ``load_state``, the ack reader, the coordinator's start) and the parent
profiles three more ``load_state`` calls of the same log.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from benchmarks.history import write_history
from chandy.broker import EmbeddedKafkaBroker
from chandy.coordinator.completed_checkpoint_store import CompletedCheckpointStore
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.host import ParticipantHost
from chandy.coordinator.kafka.log import partition_for
from chandy.coordinator.kafka.runtime import CoordinatorService
from chandy.coordinator.kafka.topics import ChandyTopics, ensure_topics
from chandy.coordinator.messages import StateHandle
from chandy.coordinator.options import CheckpointingOptions


def _coordinator(servers: str, job: str, prefix: str, checkpoint_dir: str, subtasks: int, spawned_at: float,
                 role: str, conn: Any) -> None:
    """A coordinator process. ``role`` "A": complete 3 checkpoints, say so, and keep checkpointing
    until killed. "B" (the successor): start, complete one checkpoint, report the times."""
    imported_at = time.time()
    import os
    logging.basicConfig(level=logging.INFO if os.environ.get("RECOVERY_DEBUG") and role == "B" else logging.WARNING,
                        format="%(relativeCreated)6d ms %(name)s %(message)s")
    if os.environ.get("RECOVERY_DEBUG") and role == "B":
        import functools

        import chandy.coordinator.kafka.runtime as rt
        from chandy.coordinator.checkpoint_coordinator import CheckpointCoordinator

        def timed(owner: Any, name: str) -> None:
            original = getattr(owner, name)

            @functools.wraps(original)
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                t = time.time()
                try:
                    return original(*args, **kwargs)
                finally:
                    print(f"    {name}: {1000 * (time.time() - t):.0f} ms (ends {1000 * (time.time() - spawned_at):.0f} ms after spawn)", flush=True)
            setattr(owner, name, wrapper)

        for owner, name in ((rt, "ensure_topics"), (rt.LogWriter, "init"), (rt, "load_state"), (rt.AckReader, "assign"),
                            (CheckpointCoordinator, "start"), (rt.LeaderElection, "join")):
            timed(owner, name)
    service = CoordinatorService(job, servers, CheckpointingOptions(interval_ms=0, checkpoint_dir=checkpoint_dir),
                                 {"worker": subtasks}, prefix=prefix)
    start = time.time()
    service.start(periodic=False)
    started = time.time()
    if role == "A":
        for _ in range(3):
            service.trigger_checkpoint().result(60)
        conn.send({"ready": True})
        while True:  # killed in the middle of one of these
            service.trigger_checkpoint().result(60)
    restored = CompletedCheckpointStore.latest(service.snapshot_state())
    record = service.trigger_checkpoint().result(60)
    done = time.time()
    load = service.load_stats
    conn.send({"spawn_to_first_s": done - spawned_at, "imports_s": imported_at - spawned_at,
               "start_to_first_s": done - start, "start_s": started - start,
               "load_s": load.seconds if load else None, "read": load.read if load else None,
               "applied": load.applied if load else None, "epoch": service.epoch,
               "restored": restored.checkpoint_id if restored else None, "first": record.checkpoint_id,
               "status": str(record.status)})
    service.stop()


def _plain_consume(servers: str, topic: str, partition: int) -> tuple[int, float]:
    """(messages, seconds) of a plain consume of ``topic``'s ``partition`` to its end."""
    start = time.perf_counter()
    consumer = kafka_config.consumer(servers, overrides={"enable.partition.eof": True, "fetch.wait.max.ms": 10, "fetch.queue.backoff.ms": 1,
                                                         "fetch.max.bytes": 52428800,
                                                         "max.partition.fetch.bytes": 10485760})
    tp = TopicPartition(topic, partition, OFFSET_BEGINNING)
    _, end = consumer.get_watermark_offsets(tp, timeout=30)
    consumer.assign([tp])
    seen = 0
    import os
    debug = os.environ.get("RECOVERY_DEBUG")
    t_assign = time.perf_counter() - start
    while True:
        message = consumer.poll(5)
        if debug and seen == 0:
            print(f"  assign {t_assign:.3f} s, first message {time.perf_counter() - start:.3f} s", flush=True)
        if message is None:
            raise TimeoutError(f"plain consume of {topic}[{partition}] stalled")
        if message.error() is not None:
            if (message.offset() or 0) >= end:
                break
            continue
        seen += 1
        if message.offset() + 1 >= end:
            break
    if debug:
        print(f"  last message {time.perf_counter() - start:.3f} s, end {end}, last offset {message.offset()}", flush=True)
    consumer.close()
    return seen, time.perf_counter() - start


def one_run(servers: str, records: int, subtasks: int, tmp: Path) -> dict:
    job = uuid.uuid4().hex
    prefix = f"recovery-{job[:8]}"
    topics = ChandyTopics(prefix)
    admin = kafka_config.admin_client(servers)
    ensure_topics(admin, topics)
    partitions = len(admin.list_topics(topics.coordinator_log, timeout=30).topics[topics.coordinator_log].partitions)
    partition = partition_for(job, partitions)
    write_history(servers, topics.coordinator_log, partition, job, records, subsume_last=True)

    handle = StateHandle("inline", None, b"x" * 64, 64)
    host = ParticipantHost(servers, prefix=prefix).start()
    now = host.control_end_offsets()
    for i in range(subtasks):
        host.register(job, "worker", i, snapshot=lambda cid, t: [handle], report_ready=False, start_offsets=now)
    host.flush()
    context = multiprocessing.get_context("spawn")
    checkpoint_dir = f"file://{tmp}/chk-{job[:8]}"
    try:
        parent, child = context.Pipe()
        a = context.Process(target=_coordinator, args=(servers, job, prefix, checkpoint_dir, subtasks, time.time(),
                                                       "A", child), daemon=True)
        a.start()
        if not parent.poll(120):
            raise TimeoutError("coordinator A completed no checkpoints within 120 s")
        parent.recv()
        time.sleep(0.05)
        a.kill()  # SIGKILL
        a.join()
        parent, child = context.Pipe()
        b = context.Process(target=_coordinator, args=(servers, job, prefix, checkpoint_dir, subtasks, time.time(),
                                                       "B", child), daemon=True)
        b.start()
        if not parent.poll(120):
            raise TimeoutError("the successor completed no checkpoint within 120 s")
        result = parent.recv()
        b.join(30)
    finally:
        host.close()
    if os.environ.get("RECOVERY_DEBUG"):
        import cProfile
        import pstats

        from chandy.coordinator.kafka.log import load_state
        for _ in range(3):
            profile = cProfile.Profile()
            profile.enable()
            _, stats = load_state(servers, topics.coordinator_log, job)
            profile.disable()
            print(f"  load_state in the parent: {stats.seconds:.2f} s, read {stats.read}", flush=True)
        pstats.Stats(profile).sort_stats("tottime").print_stats(8)
    seen, plain_s = _plain_consume(servers, topics.coordinator_log, partition)
    result.update(records=seen, plain_consume_s=plain_s)
    assert result["status"] == "COMPLETED" and result["restored"] is not None and result["first"] > result["restored"]
    assert result["read"] >= records, result
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000, help="coordinator log records (default 100,000)")
    parser.add_argument("--runs", type=int, default=5, help="kill/recover runs (default 5)")
    parser.add_argument("--subtasks", type=int, default=4, help="subtasks acknowledging (default 4)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    broker = None
    servers = kafka_config.bootstrap_from_env()
    with tempfile.TemporaryDirectory() as tmp:
        if not servers:
            broker = EmbeddedKafkaBroker(Path(tmp) / "kafka", heap="1g")
            servers = broker.up().bootstrap_servers
        try:
            print(f"{'run':>3} {'log records':>11} {'spawn→first s':>13} {'imports s':>9} {'start→first s':>13} "
                  f"{'load_state s':>12} {'plain consume s':>15} {'restored':>8} {'first':>5}")
            results = []
            for run in range(1, args.runs + 1):
                r = one_run(servers, args.records, args.subtasks, Path(tmp))
                results.append(r)
                print(f"{run:>3} {r['records']:>11,} {r['spawn_to_first_s']:>13.2f} {r['imports_s']:>9.2f} "
                      f"{r['start_to_first_s']:>13.2f} {r['load_s']:>12.2f} {r['plain_consume_s']:>15.2f} "
                      f"{r['restored']:>8} {r['first']:>5}", flush=True)
        finally:
            if broker is not None:
                broker.down()
    spawn = statistics.median(r["spawn_to_first_s"] for r in results)
    start = statistics.median(r["start_to_first_s"] for r in results)
    load = statistics.median(r["load_s"] for r in results)
    plain = statistics.median(r["plain_consume_s"] for r in results)
    print(f"median: spawn→first checkpoint {spawn:.2f} s (target ≤ 2 s: ratio {spawn / 2:.2f}), "
          f"start→first {start:.2f} s; load_state {load:.2f} s vs plain consume {plain:.2f} s "
          f"(replay/plain speed {plain / load:.2f})")


if __name__ == "__main__":
    main()

"""Soak: ``chandy checkpoint demo`` for many checkpoints (default 10,000), resources sampled.

Starts an embedded broker of its own, runs ``chandy checkpoint demo --checkpoints N`` (a
coordinator and its workers in one process) and samples that process every second from /proc:
resident memory (VmRSS), threads and open file descriptors; and the size on disk of the job's
coordinator-log partition. Prints the samples at 10 % steps, then RSS at the start (after the
first 10 % of the run, once caches and Kafka clients are warm), at the end and the growth in %,
the same for threads and descriptors, the log's size, and the topics left behind afterwards (the
demo deletes its own: none should remain). Without Spark, no lock is needed:

    .venv/bin/python benchmarks/soak_checkpoints.py --checkpoints 10000

Exit code 1 when RSS grew by 10 % or more, or a topic was left behind.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.procs import status
from chandy.broker import EmbeddedKafkaBroker
from chandy.coordinator.kafka import config as kafka_config

ROOT = Path(__file__).resolve().parents[1]




def _log_bytes(kraft: Path) -> int:
    """Bytes of the coordinator log's segments (``.log`` files; indexes are preallocated)."""
    return sum(f.stat().st_size for f in kraft.glob("chandy-demo-*.coordinator-log-*/*.log"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=10_000)
    parser.add_argument("--subtasks", type=int, default=4)
    parser.add_argument("--interval-s", type=float, default=1.0, help="sampling interval (s)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="chandy-soak-") as tmp:
        broker = EmbeddedKafkaBroker(Path(tmp) / "kafka")
        info = broker.up()
        try:
            env = {**os.environ, "CHANDY_BOOTSTRAP_SERVERS": info.bootstrap_servers, "COLUMNS": "200"}
            started = time.monotonic()
            demo = subprocess.Popen(
                [sys.executable, "-m", "chandy.cli", "checkpoint", "demo", "--subtasks", str(args.subtasks),
                 "--checkpoints", str(args.checkpoints)],
                cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            samples: list[tuple[float, dict[str, int], int]] = []
            while demo.poll() is None:
                try:
                    samples.append((time.monotonic() - started, status(demo.pid), _log_bytes(Path(tmp) / "kafka" / "kraft")))
                except (OSError, AttributeError):
                    pass
                time.sleep(args.interval_s)
            out = demo.communicate()[0]
            took = time.monotonic() - started
            leftover = sorted(t for t in kafka_config.admin_client(info.bootstrap_servers).list_topics(timeout=10).topics
                              if t.startswith("chandy-demo-"))
        finally:
            broker.down()
    if demo.returncode != 0 or len(samples) < 10:
        print(f"the demo exited {demo.returncode} after {took:.0f} s with {len(samples)} samples:\n{out}")
        return 1
    print(f"{args.checkpoints} checkpoints, {args.subtasks} subtasks, {took:.0f} s "
          f"({args.checkpoints / took:.1f} checkpoints/s), {len(samples)} samples")
    print(f"{'t s':>6} {'RSS MiB':>8} {'threads':>7} {'fds':>5} {'log KiB':>8}")
    for i in range(0, 11):
        t, s, log_bytes = samples[min(len(samples) - 1, i * (len(samples) - 1) // 10)]
        print(f"{t:>6.0f} {s['rss_kb'] / 1024:>8.1f} {s['threads']:>7} {s['fds']:>5} {log_bytes / 1024:>8.0f}")
    # the steady state: samples with the running demo's thread count (not start-up, not shutdown)
    threads = [s["threads"] for _, s, _ in samples]
    plateau = max(set(threads), key=threads.count)
    steady = [s for t, s, _ in samples if s["threads"] == plateau]
    warm = steady[len(steady) // 10]
    end = steady[-1]
    growth = (end["rss_kb"] - warm["rss_kb"]) / warm["rss_kb"] * 100
    print(f"RSS start (10 % into the steady state, {plateau} threads) {warm['rss_kb'] / 1024:.1f} MiB, end {end['rss_kb'] / 1024:.1f} MiB, growth "
          f"{growth:+.1f} %; threads {warm['threads']} -> {end['threads']}; fds {warm['fds']} -> {end['fds']}; "
          f"coordinator log {samples[-1][2] / 1024:.0f} KiB on disk; topics left behind: {leftover or 'none'}")
    print(out.strip().splitlines()[-2] if out.strip() else "")
    return 0 if growth < 10 and not leftover else 1


if __name__ == "__main__":
    sys.exit(main())

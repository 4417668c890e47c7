"""Embedded broker start times and the produce → consume round-trip floor on loopback.

Run: ``.venv/bin/python benchmarks/roundtrip_latency.py [--messages 1000]`` (or ``make bench``).

Prints, for the pinned Apache Kafka release:
- jar resolution into an empty cache (Maven; from Maven Central unless ~/.m2 already holds them),
- cold start: a new data directory (KRaft format + JVM start + first metadata answer),
- warm start: the same directory again after a clean stop,
- p50 / p99 / mean latency of N single-message round trips (produce, flush, consume back,
  decode and compare), cycling through every control and ack message type.
Later benchmarks compare the coordinator against this floor.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from chandy.broker import KAFKA_VERSION, EmbeddedKafkaBroker, resolve_kafka_jars
from chandy.roundtrip import round_trip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1000, help="round trips to time (default 1000)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        resolve_kafka_jars(KAFKA_VERSION, cache_dir=root / "cache")
        resolve_s = time.perf_counter() - start

        broker = EmbeddedKafkaBroker(root / "kafka", cache_dir=root / "cache")
        start = time.perf_counter()
        info = broker.up()
        cold_s = time.perf_counter() - start
        broker.down()
        start = time.perf_counter()
        info = broker.up()
        warm_s = time.perf_counter() - start
        try:
            result = round_trip(info.bootstrap_servers, messages=args.messages)
        finally:
            broker.down()

    figures = {
        "kafka_version": KAFKA_VERSION,
        "jar_resolution_s": round(resolve_s, 2),
        "cold_start_s": round(cold_s, 2),
        "warm_start_s": round(warm_s, 2),
        "round_trips": result.count,
        "p50_ms": round(result.p50_ms, 3),
        "p99_ms": round(result.p99_ms, 3),
        "mean_ms": round(result.mean_ms, 3),
    }
    if args.json:
        print(json.dumps(figures))
        return
    print(f"Apache Kafka {KAFKA_VERSION}, embedded, 127.0.0.1")
    print(f"  jar resolution (empty cache)   {resolve_s:7.2f} s")
    print(f"  cold start (new data dir)      {cold_s:7.2f} s")
    print(f"  warm start (same data dir)     {warm_s:7.2f} s")
    print(f"  produce→consume round trip over {result.count} messages:")
    print(f"    p50 {result.p50_ms:.3f} ms   p99 {result.p99_ms:.3f} ms   mean {result.mean_ms:.3f} ms")


if __name__ == "__main__":
    main()

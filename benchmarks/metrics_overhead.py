"""What the Prometheus exporter costs a checkpoint: end-to-end latency with and without it, same run.

Run: ``.venv/bin/python benchmarks/metrics_overhead.py`` (about a minute; no Spark); uses
``$CHANDY_BOOTSTRAP_SERVERS`` or starts an embedded broker in a temporary directory.

Each round runs a coordinator and ``--subtasks`` worker participants for ``--checkpoints``
manual checkpoints back to back (``chandy.demo.run_checkpoints``, latency = trigger call until
its future completes), once without metrics and once with ``metrics_port`` set and a scraper
GETting ``/metrics`` every ``--scrape-interval-ms`` (100 ms by default: 150 times more often than
Prometheus' default 15 s, to make the cost visible). The two variants alternate over
``--rounds`` rounds so drift on a shared machine hits both alike. Prints p50/p99/mean of each,
the ratio with/without, and the scrapes served.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from chandy.broker import EmbeddedKafkaBroker
from chandy.demo import run_checkpoints


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered) + 0.5) - 1))]


class Scraper:
    """GETs ``/metrics`` of a coordinator every ``interval_ms`` until stopped; counts the scrapes
    and checks each answer carries ``numberOfCompletedCheckpoints``."""

    def __init__(self, interval_ms: int) -> None:
        self.interval_s = interval_ms / 1000
        self.scrapes = 0
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self, service) -> None:
        url = f"http://127.0.0.1:{service.metrics_server.port}/metrics"

        def run() -> None:
            while not self.stop.wait(self.interval_s):
                try:
                    with urllib.request.urlopen(url, timeout=5) as response:
                        body = response.read().decode()
                except OSError:
                    continue  # the service stopped
                assert "numberOfCompletedCheckpoints" in body
                self.scrapes += 1

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(10)


def one_round(servers: str, tmp: Path, subtasks: int, checkpoints: int, metrics: bool, scrape_ms: int) -> tuple[list[float], int]:
    scraper = Scraper(scrape_ms) if metrics else None
    try:
        result = run_checkpoints(servers, f"file://{tmp}/chk", subtasks=subtasks, checkpoints=checkpoints, warmup=3,
                                 metrics_port=0 if metrics else None,
                                 on_started=scraper.start if scraper is not None else None)
    finally:
        if scraper is not None:
            scraper.close()
    assert all(r.status == "COMPLETED" and r.num_acknowledged == subtasks for r in result.records)
    return result.latencies_ms, scraper.scrapes if scraper is not None else 0


def summarize(latencies: list[float]) -> dict[str, float]:
    return {"checkpoints": len(latencies), "p50_ms": round(pct(latencies, 0.5), 2), "p99_ms": round(pct(latencies, 0.99), 2),
            "mean_ms": round(statistics.fmean(latencies), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--subtasks", type=int, default=4, help="worker participants (default 4)")
    parser.add_argument("--checkpoints", type=int, default=60, help="timed checkpoints per round and variant (default 60)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--scrape-interval-ms", type=int, default=100, help="scrape period with metrics (default 100)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    broker = None
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        servers = os.environ.get("CHANDY_BOOTSTRAP_SERVERS")
        if not servers:
            broker = EmbeddedKafkaBroker(tmp / "kafka", heap="1g")
            servers = broker.up().bootstrap_servers
        without: list[float] = []
        with_metrics: list[float] = []
        scrapes = 0
        try:
            for _ in range(args.rounds):
                without += one_round(servers, tmp, args.subtasks, args.checkpoints, False, args.scrape_interval_ms)[0]
                latencies, served = one_round(servers, tmp, args.subtasks, args.checkpoints, True, args.scrape_interval_ms)
                with_metrics += latencies
                scrapes += served
        finally:
            if broker is not None:
                broker.down()
    a, b = summarize(without), summarize(with_metrics)
    results = {"subtasks": args.subtasks, "scrape_interval_ms": args.scrape_interval_ms, "scrapes": scrapes,
               "without_metrics": a, "with_metrics": b,
               "ratio_p50": round(b["p50_ms"] / a["p50_ms"], 3), "ratio_p99": round(b["p99_ms"] / a["p99_ms"], 3)}
    if args.json:
        print(json.dumps(results))
        return
    print(f"checkpoint end-to-end latency, {args.subtasks} subtasks, {args.rounds} alternating rounds")
    print(f"{'':28}{'checkpoints':>12}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}")
    for label, s in (("without metrics", a), (f"with metrics (scrape {args.scrape_interval_ms} ms)", b)):
        print(f"{label:28}{s['checkpoints']:>12}{s['p50_ms']:>10.2f}{s['p99_ms']:>10.2f}{s['mean_ms']:>10.2f}")
    print(f"ratio with/without: p50 {results['ratio_p50']:.3f}, p99 {results['ratio_p99']:.3f} ({scrapes} scrapes served)")


if __name__ == "__main__":
    main()

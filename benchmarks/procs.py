"""Processes of a benchmark run, read from /proc (Linux): descendants, command lines, RSS, threads
and descriptors, Spark's forked Python workers, and a sampler of their peak RSS. Shared by the
benchmarks that watch Spark (the soak, the kill campaign, the throughput comparison)."""

from __future__ import annotations

import contextlib
import os
import re
import statistics
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid``."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def cmdline(pid: int) -> str:
    """``pid``'s command line, space-separated ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def status(pid: int) -> dict[str, int]:
    """``rss_kb``, ``threads`` and ``fds`` of ``pid``.

    Raises:
        OSError: the process is gone.
    """
    text = Path(f"/proc/{pid}/status").read_text()
    rss = re.search(r"^VmRSS:\s+(\d+) kB", text, re.M)
    threads = re.search(r"^Threads:\s+(\d+)", text, re.M)
    return {"rss_kb": int(rss.group(1)) if rss else 0, "threads": int(threads.group(1)) if threads else 0,
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def python_workers(driver_pid: int) -> list[int]:
    """Spark's forked Python workers under the driver: children of a ``pyspark.daemon`` process."""
    daemons = [p for p in descendants(driver_pid) if "pyspark.daemon" in cmdline(p)]
    return [child for daemon in daemons for child in descendants(daemon) if "pyspark.daemon" in cmdline(child)]


class PeakWorkerRss:
    """Samples the RSS of every Python worker under ``driver_pid`` every ``interval_s`` seconds
    while in its ``with`` block; ``peak_mib`` is the largest single worker seen (MiB)."""

    def __init__(self, driver_pid: int | None = None, interval_s: float = 0.05) -> None:
        self.driver_pid = driver_pid or os.getpid()
        self.interval_s = interval_s
        self.peak_mib = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-worker-rss", daemon=True)

    def _run(self) -> None:
        workers: list[int] = []
        rounds = 0
        while not self._stop.is_set():
            if rounds % 20 == 0:  # walking /proc is slow; workers come and go rarely
                workers = python_workers(self.driver_pid)
            rounds += 1
            for pid in workers:
                try:
                    self.peak_mib = max(self.peak_mib, status(pid)["rss_kb"] / 1024)
                except OSError:
                    continue
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakWorkerRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def environment() -> dict[str, object]:
    """What a result was measured with: versions of Chandy, Python, pyspark, pyarrow, deltalake,
    confluent-kafka (librdkafka), the Kafka broker jars, and the machine's cores and memory (GiB)."""
    import platform

    import confluent_kafka
    import deltalake
    import pyarrow
    import pyspark

    import chandy

    with open("/proc/meminfo") as meminfo:
        kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
    return {"chandy": chandy.__version__, "python": platform.python_version(), "pyspark": pyspark.__version__,
            "pyarrow": pyarrow.__version__, "deltalake": deltalake.__version__,
            "confluent_kafka": confluent_kafka.__version__, "librdkafka": confluent_kafka.libversion()[0],
            "cores": os.cpu_count(), "memory_gib": round(kib / 1024 / 1024, 1)}


@contextlib.contextmanager
def kafka_servers(heap: str = "1g") -> Iterator[tuple[str, Path]]:
    """A scratch directory and Kafka's bootstrap servers: ``$CHANDY_BOOTSTRAP_SERVERS``, else an
    embedded broker started in that directory and stopped on exit. Yields (servers, directory)."""
    from chandy.broker import EmbeddedKafkaBroker

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        servers = os.environ.get("CHANDY_BOOTSTRAP_SERVERS")
        if servers:
            yield servers, root
            return
        broker = EmbeddedKafkaBroker(root / "kafka", heap=heap)
        try:
            yield broker.up().bootstrap_servers, root
        finally:
            broker.down()


def spread(values: list[float]) -> dict[str, float]:
    """The median, min and max of several runs' ``values``."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}

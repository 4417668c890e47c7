"""What one table's commit costs per checkpoint, Chandy's guarded commit next to delta-rs's own
append: the fixed cost every routed table pays in every checkpoint, whatever its records (issue 57).

Run: ``.venv/bin/python benchmarks/delta_commit_cost.py`` (``--tables``, ``--checkpoints``,
``--runs``, ``--store local|s3``, ``--out``). No Spark, no Kafka: one process, a local disk, or
with ``--store s3`` a local S3 API server (``moto_server``), where it also counts the requests
each side sends per table and checkpoint (from the server's request log; the Chandy side's
include its tasks' file writes, as delta-rs's include its own).

For each of ``--tables`` (100) new Delta tables and ``--checkpoints`` (12) checkpoints, 100 rows
in 2 files per table per checkpoint:

- *Chandy*: the committer's read of the job's checkpoint in the table (``committed_checkpoint``)
  and ``DeltaLakeSink.commit`` of the files with the job's offsets of 8 partitions (its
  idempotence check, the app transactions of the checkpoint and of the offsets, the
  ``commitInfo``, the read back of the commit it made);
- *delta-rs*: ``write_deltalake(mode="append")`` of the same rows with the checkpoint's app
  transaction: one write and one commit, no check, no read back (what a writer that neither skips
  a replayed checkpoint nor records its offsets pays).

The files are written before the clock starts for Chandy (its tasks write them); delta-rs's write
includes them, so the baseline is an upper bound of its commit alone. Prints the median ms per
table and checkpoint over the checkpoints after the second (tables created, the log warm), median
of ``--runs`` (3) [min, max], and the ratio; writes ``benchmarks/results/delta_commit_cost.json``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa

from benchmarks.procs import environment, spread
from chandy.connectors.lake.delta import DeltaLakeSink

JOB = "0123456789abcdef0123456789abcdef"
RESULTS = Path(__file__).resolve().parent / "results" / "delta_commit_cost.json"
ROWS = pa.table({"id": pa.array(range(100), pa.int64()), "amount": pa.array([0.5] * 100)})


class Requests:
    """The requests an S3 API server logged (``moto_server``'s log: one line per request), counted
    from :meth:`mark` on; a local disk has none."""

    def __init__(self, log: Path | None) -> None:
        self.log, self.counts, self._from = log, collections.Counter(), 0

    def _lines(self) -> list[str]:
        time.sleep(0.3)  # the server's log is line-buffered: let its last lines land
        assert self.log is not None
        return [line for line in self.log.read_text(errors="replace").splitlines() if '" ' in line and ' HTTP/' in line]

    def mark(self) -> None:
        if self.log is not None:
            self._from = len(self._lines())

    def count(self) -> None:
        """Add the requests since :meth:`mark`, by method."""
        if self.log is not None:
            for line in self._lines()[self._from:]:
                method = line.split('"', 2)[1].split(" ", 1)[0]
                self.counts[method] += 1


def chandy_run(tables: int, checkpoints: int, root: str | None = None, requests: Requests | None = None) -> float:
    """ms per table and checkpoint of the committer's read and commit, checkpoints 3 on."""
    root = root or tempfile.mkdtemp(prefix="chandy-commit-cost-")
    sinks = [DeltaLakeSink(f"{root}/t{i}") for i in range(tables)]
    spent, counted = 0.0, 0
    for checkpoint in range(1, checkpoints + 1):
        if requests is not None and checkpoint == 3:
            requests.mark()
        for sink in sinks:
            files = [f for subtask in range(2)
                     for f in sink.write_files(ROWS.slice(subtask * 50, 50), job_id=JOB, checkpoint_id=checkpoint,
                                               subtask=subtask, attempt=0)]
            started = time.perf_counter()
            done = sink.committed_checkpoint(JOB)
            sink.commit(JOB, checkpoint, files, offsets={("t", p): checkpoint * 100 for p in range(8)}, checked_at=done)
            if checkpoint > 2:
                spent += time.perf_counter() - started
                counted += 1
    if requests is not None:
        requests.count()
    return spent / counted * 1000


def delta_rs_run(tables: int, checkpoints: int, root: str | None = None, requests: Requests | None = None) -> float:
    """ms per table and checkpoint of delta-rs's append with an app transaction, checkpoints 3 on."""
    from deltalake import write_deltalake
    from deltalake.transaction import CommitProperties, Transaction

    root = root or tempfile.mkdtemp(prefix="delta-rs-commit-cost-")
    spent, counted = 0.0, 0
    for checkpoint in range(1, checkpoints + 1):
        if requests is not None and checkpoint == 3:
            requests.mark()
        for i in range(tables):
            started = time.perf_counter()
            write_deltalake(f"{root}/t{i}", ROWS, mode="append",
                            commit_properties=CommitProperties(app_transactions=[Transaction(JOB, checkpoint)]))
            if checkpoint > 2:
                spent += time.perf_counter() - started
                counted += 1
    if requests is not None:
        requests.count()
    return spent / counted * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, default=100)
    parser.add_argument("--checkpoints", type=int, default=12)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--store", choices=["local", "s3"], default="local")
    parser.add_argument("--out", type=Path, default=None, help=f"default {RESULTS.name} (local), "
                        f"{RESULTS.stem}_s3.json (s3)")
    args = parser.parse_args()
    if args.checkpoints < 3:
        parser.error("--checkpoints must be at least 3 (the first two are not counted)")
    out = args.out or (RESULTS if args.store == "local" else RESULTS.with_name(f"{RESULTS.stem}_s3.json"))
    chandy, delta_rs = [], []
    with contextlib.ExitStack() as stack:
        log, bucket = None, None
        if args.store == "s3":
            from benchmarks.routed_tables import s3_store

            log = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "moto.log"
            bucket = stack.enter_context(s3_store(log))
        ours, theirs = Requests(log), Requests(log)
        for n in range(args.runs):  # alternated, so both see the same machine
            chandy.append(chandy_run(args.tables, args.checkpoints, bucket and f"{bucket}/chandy-{n}", ours))
            delta_rs.append(delta_rs_run(args.tables, args.checkpoints, bucket and f"{bucket}/delta-rs-{n}", theirs))
    result = {"config": {"tables": args.tables, "checkpoints": args.checkpoints, "runs": args.runs,
                         "store": args.store},
              "environment": environment(),
              "ms_per_table_checkpoint": {"chandy": spread(chandy), "delta_rs_append": spread(delta_rs)},
              "ratio": statistics.median(chandy) / statistics.median(delta_rs)}
    counted = args.runs * args.tables * (args.checkpoints - 2)
    if log is not None:
        result["requests_per_table_checkpoint"] = {
            name: {method: n / counted for method, n in sorted(r.counts.items())} | {"all": sum(r.counts.values()) / counted}
            for name, r in (("chandy", ours), ("delta_rs_append", theirs))}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    env = result["environment"]
    print(f"{args.tables} tables x {args.checkpoints} checkpoints on {args.store}, median of {args.runs} runs "
          f"[min, max]; deltalake {env.get('deltalake')}, {env['cores']} cores")
    for name, values in (("Chandy read + guarded commit", chandy), ("delta-rs write_deltalake append", delta_rs)):
        s = spread(values)
        print(f"{name:32} {s['median']:6.2f} ms [{s['min']:.2f}, {s['max']:.2f}] per table and checkpoint")
    for name, per in result.get("requests_per_table_checkpoint", {}).items():
        print(f"{name}: {per['all']:.2f} requests per table and checkpoint "
              f"({', '.join(f'{m} {v:.2f}' for m, v in per.items() if m != 'all')})")
    print(f"Chandy / delta-rs x{result['ratio']:.2f}; written to {out}")


if __name__ == "__main__":
    main()

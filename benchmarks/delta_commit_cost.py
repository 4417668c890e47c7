"""What one table's commit costs per checkpoint, Chandy's guarded commit next to delta-rs's own
append: the fixed cost every routed table pays in every checkpoint, whatever its records (issue 57).

Run: ``.venv/bin/python benchmarks/delta_commit_cost.py`` (``--tables``, ``--checkpoints``,
``--runs``, ``--out``). No Spark, no Kafka: one process, a local disk.

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


def chandy_run(tables: int, checkpoints: int) -> float:
    """ms per table and checkpoint of the committer's read and commit, checkpoints 3 on."""
    root = tempfile.mkdtemp(prefix="chandy-commit-cost-")
    sinks = [DeltaLakeSink(f"{root}/t{i}") for i in range(tables)]
    spent, counted = 0.0, 0
    for checkpoint in range(1, checkpoints + 1):
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
    return spent / counted * 1000


def delta_rs_run(tables: int, checkpoints: int) -> float:
    """ms per table and checkpoint of delta-rs's append with an app transaction, checkpoints 3 on."""
    from deltalake import write_deltalake
    from deltalake.transaction import CommitProperties, Transaction

    root = tempfile.mkdtemp(prefix="delta-rs-commit-cost-")
    spent, counted = 0.0, 0
    for checkpoint in range(1, checkpoints + 1):
        for i in range(tables):
            started = time.perf_counter()
            write_deltalake(f"{root}/t{i}", ROWS, mode="append",
                            commit_properties=CommitProperties(app_transactions=[Transaction(JOB, checkpoint)]))
            if checkpoint > 2:
                spent += time.perf_counter() - started
                counted += 1
    return spent / counted * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tables", type=int, default=100)
    parser.add_argument("--checkpoints", type=int, default=12)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.checkpoints < 3:
        parser.error("--checkpoints must be at least 3 (the first two are not counted)")
    chandy, delta_rs = [], []
    for _ in range(args.runs):  # alternated, so both see the same machine
        chandy.append(chandy_run(args.tables, args.checkpoints))
        delta_rs.append(delta_rs_run(args.tables, args.checkpoints))
    result = {"config": {"tables": args.tables, "checkpoints": args.checkpoints, "runs": args.runs},
              "environment": environment(),
              "ms_per_table_checkpoint": {"chandy": spread(chandy), "delta_rs_append": spread(delta_rs)},
              "ratio": statistics.median(chandy) / statistics.median(delta_rs)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    env = result["environment"]
    print(f"{args.tables} tables x {args.checkpoints} checkpoints, median of {args.runs} runs [min, max]; "
          f"deltalake {env.get('deltalake')}, {env['cores']} cores")
    for name, values in (("Chandy read + guarded commit", chandy), ("delta-rs write_deltalake append", delta_rs)):
        s = spread(values)
        print(f"{name:32} {s['median']:6.2f} ms [{s['min']:.2f}, {s['max']:.2f}] per table and checkpoint")
    print(f"Chandy / delta-rs x{result['ratio']:.2f}; written to {args.out}")


if __name__ == "__main__":
    main()

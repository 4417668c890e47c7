"""Upsert cost against table size: the per-checkpoint merge of ``--cdc`` changes into Delta and
Iceberg tables of 100,000, 1,000,000 and 10,000,000 rows, for two change streams.

Run: ``.venv/bin/python benchmarks/upsert_cost.py`` (``--sizes``, ``--changes``, ``--checkpoints``,
``--sink delta|iceberg|both``, ``--stream database|uniform|both``, ``--out``). No Kafka, no Spark:
the merge is the lake commit, which is what grows with the table, so the benchmark drives the
sink's own path (``write_files`` of a checkpoint's change files as the tasks write them, then
``commit_changes``: Delta ``MERGE`` through delta-rs, Iceberg delete + append through pyiceberg).

1. A table of S rows (ids 0 to S-1, in id order, as a database's rows arrive) is built with plain
   appends of 1,000,000 rows (the files a job would have written: one per append).
2. ``--checkpoints`` checkpoints (default 5) of C changes each (default 10,000) are merged, each
   timed from the call to its return:
   - ``database``: a database's usual shape: 20 % inserts of new ids (above the largest), the
     rest updates (90 %) and deletes (10 %) of ids among the newest 5 % of the table;
   - ``uniform``: updates and deletes of ids drawn uniformly from the whole table.
Prints the median per-checkpoint merge time (ms) and changes/s per size, stream and format, and
the ratio of the largest size's time to the middle one's, and writes them with the versions to
``benchmarks/results/upsert_cost.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa

from benchmarks.procs import environment
from chandy.connectors.lake.changes import OP_COLUMN
from chandy.connectors.lake.tables import open_sink

RESULTS = Path(__file__).resolve().parent / "results" / "upsert_cost.json"
JOB = "0123456789abcdef0123456789abcdef"
CHUNK = 1_000_000


def rows(ids: list[int] | range, offset: int, ops: list[str] | None = None) -> pa.Table:
    """Rows of ``ids`` (name and amount derived from the id and ``offset``), with Kafka's columns
    (offsets from ``offset``) and, with ``ops``, the change operation column."""
    n = len(ids)
    data = {"id": pa.array(ids, pa.int64()), "name": pa.array([f"n{i}-{offset}" for i in ids]),
            "amount": pa.array([float((i * 7 + offset) % 1000) for i in ids]),
            "topic": pa.array(["cdc"] * n), "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(range(offset, offset + n), pa.int64())}
    if ops is not None:
        data[OP_COLUMN] = pa.array(ops)
    return pa.table(data)


def build(sink, size: int) -> int:
    """Append ``size`` rows to ``sink`` in chunks of ``CHUNK``; returns the next offset."""
    checkpoint, offset = 0, 0
    for start in range(0, size, CHUNK):
        checkpoint += 1
        ids = range(start, min(size, start + CHUNK))
        files = sink.write_files(rows(ids, offset), job_id=JOB, checkpoint_id=checkpoint, subtask=0, attempt=0)
        sink.commit(JOB, checkpoint, files, offsets={("cdc", 0): offset + len(ids)})
        offset += len(ids)
    return offset


def changes(stream: str, size: int, count: int, next_id: int, rng: random.Random) -> tuple[list[int], list[str], int]:
    """(ids, ops, the next new id) of one checkpoint's ``count`` changes of ``stream``."""
    ids, ops = [], []
    if stream == "database":
        inserts = count // 5
        ids += list(range(next_id, next_id + inserts))
        ops += ["c"] * inserts
        next_id += inserts
        recent = max(1, size // 20)
        for _ in range(count - inserts):
            ids.append(rng.randrange(max(0, next_id - recent), next_id))
            ops.append("d" if rng.random() < 0.1 else "u")
    else:
        for _ in range(count):
            ids.append(rng.randrange(0, next_id))
            ops.append("d" if rng.random() < 0.1 else "u")
    return ids, ops, next_id


def measure(sink_kind: str, size: int, stream: str, count: int, checkpoints: int, root: Path) -> dict:
    """Build a table of ``size`` rows, then time ``checkpoints`` merges of ``count`` changes."""
    name = f"t{size}_{stream}"
    if sink_kind == "delta":
        sink = open_sink(str(root / name))
    else:
        sink = open_sink(f"iceberg://bench/b.{name}", catalog_properties={"warehouse": str(root / "iceberg")})
    built = time.monotonic()
    offset = build(sink, size)
    built_s = time.monotonic() - built
    rng = random.Random(7)
    next_id, times = size, []
    first = (size + CHUNK - 1) // CHUNK + 1
    for checkpoint in range(first, first + checkpoints):
        ids, ops, next_id = changes(stream, size, count, next_id, rng)
        files = sink.write_files(rows(ids, offset, ops), job_id=JOB, checkpoint_id=checkpoint, subtask=0, attempt=0)
        files = [dataclasses.replace(f, id_columns=("id",)) for f in files]
        offset += len(ids)
        started = time.monotonic()
        sink.commit_changes(JOB, checkpoint, files, offsets={("cdc", 0): offset})
        times.append((time.monotonic() - started) * 1000)
    merge_ms = statistics.median(times)
    return {"build_s": built_s, "merge_ms": merge_ms, "merge_ms_all": times, "changes_per_s": count / merge_ms * 1000}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--changes", type=int, default=10_000, help="changes per checkpoint")
    parser.add_argument("--checkpoints", type=int, default=5, help="timed merges per table (the median is reported)")
    parser.add_argument("--sink", choices=["delta", "iceberg", "both"], default="both")
    parser.add_argument("--stream", choices=["database", "uniform", "both"], default="both")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    sinks = ["delta", "iceberg"] if args.sink == "both" else [args.sink]
    streams = ["database", "uniform"] if args.stream == "both" else [args.stream]
    import pyiceberg

    result: dict = {"environment": {**environment(), "pyiceberg": pyiceberg.__version__}, "config": {
        "changes": args.changes, "checkpoints": args.checkpoints, "sizes": args.sizes}, "runs": {}}
    for sink_kind in sinks:
        for stream in streams:
            for size in args.sizes:
                with tempfile.TemporaryDirectory(prefix="chandy-upsert-") as root:
                    outcome = measure(sink_kind, size, stream, args.changes, args.checkpoints, Path(root))
                result["runs"][f"{sink_kind}/{stream}/{size}"] = outcome
                print(f"{sink_kind} {stream} {size:,} rows: merge {outcome['merge_ms']:,.0f} ms median "
                      f"({', '.join(f'{t:,.0f}' for t in outcome['merge_ms_all'])}), {outcome['changes_per_s']:,.0f} "
                      f"changes/s (table built in {outcome['build_s']:.1f} s)", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    env = result["environment"]
    print(f"\n{args.changes:,} changes per checkpoint, median of {args.checkpoints} checkpoints; deltalake "
          f"{env.get('deltalake')}, pyiceberg {env.get('pyiceberg')}, {env['cores']} cores")
    sizes = sorted(args.sizes)
    for sink_kind in sinks:
        for stream in streams:
            cells = [f"{size:,}: {result['runs'][f'{sink_kind}/{stream}/{size}']['merge_ms']:,.0f} ms" for size in sizes]
            line = f"{sink_kind:7} {stream:8} " + ", ".join(cells)
            if len(sizes) >= 2:
                big, mid = (result["runs"][f"{sink_kind}/{stream}/{s}"]["merge_ms"] for s in (sizes[-1], sizes[-2]))
                line += f"; {sizes[-1]:,} / {sizes[-2]:,} x{big / mid:.2f}"
            print(line)
    print(f"written to {args.out}")


if __name__ == "__main__":
    main()

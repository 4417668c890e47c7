"""The performance tables of ``docs/benchmarks.md`` (section "Performance"), generated from the
benchmarks' JSON results.

Run: ``.venv/bin/python benchmarks/results_table.py`` prints them (Markdown); ``--write`` replaces
what lies between ``<!-- performance:begin -->`` and ``<!-- performance:end -->`` in
``docs/benchmarks.md`` (``--write FILE``: in another Markdown file). Reads ``benchmarks/results/throughput.json``
(``pipeline_vs_structured_streaming.py --suite``), ``benchmarks/results/binary_formats.json`` (the same
with ``--formats raw avro protobuf``) and ``benchmarks/results/end_to_end_latency.json``
(``end_to_end_latency.py``); a missing file's table is left out.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
#: The page that holds the tables, between the markers (tests/cli/test_benchmark_results.py checks it).
DOCUMENT = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
BEGIN, END = "<!-- performance:begin -->", "<!-- performance:end -->"
NAMES = {"chandy": "Chandy → Delta", "ss_parquet": "Structured Streaming → Parquet",
         "ss_delta": "Structured Streaming → Delta", "floor": "floor (confluent-kafka + pyarrow, no Spark)"}
FORMAT_NAMES = {"raw": "raw bytes", "json": "JSON, declared schema", "avro": "Avro", "protobuf": "Protobuf (registry)"}


def _cell(spread: dict, digits: int = 0, unit: str = "") -> str:
    return f"{spread['median']:,.{digits}f}{unit} ({spread['min']:,.{digits}f}–{spread['max']:,.{digits}f})"


def _environment(result: dict) -> str:
    env = result["environment"]
    return (f"Chandy {env['chandy']}, pyspark {env['pyspark']}, pyarrow {env['pyarrow']}, deltalake "
            f"{env['deltalake']}, confluent-kafka {env['confluent_kafka']} (librdkafka {env['librdkafka']}), "
            f"Python {env['python']}, {env['cores']} cores, {env['memory_gib']} GiB")


def throughput_table(result: dict, title: str = "Throughput") -> str:
    config = result["config"]
    ran_delta = any("ss_delta" in systems for sizes in result["summary"].values() for systems in sizes.values())
    delta = f"; delta-spark {config['delta_spark']}" if ran_delta else ""
    lines = [f"{title}: records/s, median of {config['runs']} runs (min–max), {config['records']:,} records "
             f"per run over {config['partitions']} partitions, `{config['master']}`, each system from its first "
             f"batch's start to its last one's commit{delta}. {_environment(result)}.",
             "", "| values | per checkpoint / batch | " + " | ".join(NAMES.values()) + " | Chandy ÷ SS Parquet | "
             "Chandy ÷ SS Delta | Chandy ÷ floor | Chandy ÷ Chandy raw bytes |", "|---" * (len(NAMES) + 6) + "|"]
    for value_format, sizes in result["summary"].items():
        for size, systems in sizes.items():
            cells = [_cell(systems[name]["records_per_s"]) if name in systems else "–" for name in NAMES]
            chandy = systems["chandy"]["records_per_s"]["median"]
            ratios = [f"{chandy / systems[name]['records_per_s']['median']:.2f}×" if name in systems else "–"
                      for name in ("ss_parquet", "ss_delta", "floor")]
            raw = result["summary"].get("raw", {}).get(size, {}).get("chandy")
            ratios.append(f"{chandy / raw['records_per_s']['median']:.2f}×" if value_format != "raw" and raw else "–")
            lines.append(f"| {FORMAT_NAMES.get(value_format, value_format)} | {int(size):,} | " + " | ".join(cells)
                         + " | " + " | ".join(ratios) + " |")
    phase_rows = []
    for value_format, sizes in result["summary"].items():
        for size, systems in sizes.items():
            for name in ("chandy", "ss_parquet"):
                entry = systems.get(name, {})
                phases = entry.get("phases_ms")
                if phases:
                    text = ", ".join(f"{k} {v['median']:,.0f} / {v['p95']:,.0f}" for k, v in phases.items())
                    phase_rows.append(f"| {FORMAT_NAMES.get(value_format, value_format)} | {int(size):,} | "
                                      f"{NAMES[name]} | {entry['overhead_ms']['median']:,.0f} | {text} |")
    if phase_rows:
        lines += ["", "Where a checkpoint's (a micro-batch's) time goes, ms, median / p95 (Chandy: "
                  "`PipelineProgress.phases_ms`; Structured Streaming: its progress's `durationMs`), and the "
                  "overhead, the median of each batch's end-to-end time minus its Spark job (Structured "
                  "Streaming: `triggerExecution` minus `addBatch`):", "",
                  "| values | per batch | system | overhead | phases |", "|---|---|---|---|---|", *phase_rows]
    return "\n".join(lines)


def latency_table(result: dict) -> str:
    config = result["config"]
    lines = [f"End-to-end latency, seconds from a record's Kafka timestamp to the commit that made it visible, "
             f"median of {config['runs']} runs (min–max): {config['partitions']} partitions, the system started and "
             f"idle for {config['idle']:.0f} s, then {config['rate']:,} records/s for {config['duration']:.0f} s; "
             f"steady state: records produced {config['steady_after']:.0f} s after the first. Chandy "
             f"`--checkpoint-interval {config['interval_ms']}`; Structured Streaming `processingTime` 1 s into "
             f"Parquet. {_environment(result)}.", "",
             "| system | records measured | p50 | p95 | p99 | max |", "|---|---|---|---|---|---|"]
    names = {"chandy": "Chandy → Delta", "structured-streaming": "Structured Streaming → Parquet"}
    for system, windows in result["summary"].items():
        for window, quantiles in windows.items():
            cells = [_cell(quantiles[q], 2) for q in ("p50", "p95", "p99", "max")]
            lines.append(f"| {names.get(system, system)} | {window} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def binary_formats_table(result: dict) -> str:
    """The Avro and Protobuf rows measured after issue 45's decoders (raw bytes in the same runs)."""
    return throughput_table(result, "Avro and Protobuf after issue 45's decoders (raw bytes in the same runs; "
                                    "Structured Streaming's from_protobuf needs spark-protobuf, which this machine's "
                                    "Maven mirror lacks)")


def tables() -> str:
    parts = []
    for name, render in (("throughput.json", throughput_table), ("binary_formats.json", binary_formats_table),
                         ("end_to_end_latency.json", latency_table)):
        path = RESULTS / name
        if path.exists():
            parts.append(render(json.loads(path.read_text())))
    parts.append("_Generated by `benchmarks/results_table.py` from `benchmarks/results/`._")
    return "\n\n".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", type=Path, nargs="?", const=DOCUMENT, metavar="FILE",
                        help="fill the performance markers of FILE (default: docs/benchmarks.md)")
    args = parser.parse_args()
    text = tables()
    if args.write is None:
        print(text)
        return
    document = args.write.read_text()
    if BEGIN not in document or END not in document:
        sys.exit(f"{args.write} has no {BEGIN} ... {END} markers")
    head, rest = document.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    args.write.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


if __name__ == "__main__":
    main()

"""The performance tables (``docs/benchmarks.md``, section "Performance") are the committed benchmark
results, rendered (issue 32): a table edited by hand, or results re-measured without regenerating
it, fails here."""

from __future__ import annotations

import json

from benchmarks.results_table import BEGIN, DOCUMENT, END, RESULTS, tables
from tests.fixtures import REPO_ROOT


def test_the_performance_section_is_generated_from_the_committed_results() -> None:
    assert DOCUMENT == REPO_ROOT / "docs" / "benchmarks.md"
    page = DOCUMENT.read_text()
    assert page.count(BEGIN) == 1 and page.count(END) == 1
    block = page.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert block == tables().strip(), "run: .venv/bin/python benchmarks/results_table.py --write docs/benchmarks.md"
    # the README points at the page and holds no copy of the tables
    readme = (REPO_ROOT / "README.md").read_text()
    assert BEGIN not in readme and END not in readme and "docs/benchmarks.md" in readme


def test_the_committed_results_are_medians_of_five_runs_with_their_environment() -> None:
    throughput = json.loads((RESULTS / "throughput.json").read_text())
    latency = json.loads((RESULTS / "end_to_end_latency.json").read_text())
    for result in (throughput, latency):
        assert result["config"]["runs"] >= 5
        assert {"pyspark", "cores", "memory_gib", "chandy"} <= set(result["environment"])
    for sizes in throughput["summary"].values():
        for systems in sizes.values():
            for entry in systems.values():
                spread = entry["records_per_s"]
                assert spread["min"] <= spread["median"] <= spread["max"]
    assert set(throughput["summary"]) == {"raw", "json", "avro"}
    assert set(latency["summary"]) == {"chandy", "structured-streaming"}


def test_the_binary_formats_results_measure_avro_and_protobuf_beside_raw_bytes_in_one_run() -> None:
    """Issue 45's benchmark: Avro beside Structured Streaming's from_avro and Chandy's own raw rate,
    Protobuf beside raw, at 50,000 and 500,000 records per checkpoint, medians of five runs."""
    result = json.loads((RESULTS / "binary_formats.json").read_text())
    assert result["config"]["runs"] >= 5 and {"pyspark", "cores", "pyarrow"} <= set(result["environment"])
    summary = result["summary"]
    assert set(summary) == {"raw", "avro", "protobuf"}
    for value_format in summary:
        assert set(summary[value_format]) == {"50000", "500000"}
    assert all("ss_parquet" in summary[f][size] for f in ("raw", "avro") for size in ("50000", "500000"))

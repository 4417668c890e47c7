"""Table maintenance while the pipeline runs, on a real broker, real Spark and a real Delta table:
compaction (``chandy lake optimize`` from another thread, and ``--optimize-every``) during a run
keeps every (topic, partition, offset) exactly once and the committer's record of what landed;
vacuum afterwards deletes only the compacted-away files."""

from __future__ import annotations

import dataclasses
import threading
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner
from deltalake import DeltaTable

from chandy.cli import main
from chandy.connectors.lake.delta import DeltaLakeSink
from chandy.connectors.spark.options import PipelineOptions
from chandy.connectors.spark.pipeline import Pipeline
from chandy.connectors.spark.verify import verify_table
from tests.fixtures.lake_pipeline import all_offsets, make_topic, produce, topic_ends

pytestmark = pytest.mark.integration


def test_optimize_during_a_run_keeps_every_record_exactly_once(lake_spark, kafka_bootstrap_servers, tmp_path: Path) -> None:
    topic = make_topic(kafka_bootstrap_servers, [f"a-{i}".encode() for i in range(600)])
    table = str(tmp_path / "t")
    options = PipelineOptions(table_uri=table, bootstrap_servers=kafka_bootstrap_servers, topics=(topic,),
                              stop_when_drained=True, prefix=f"lm{uuid.uuid4().hex[:6]}", max_records_per_checkpoint=25,
                              optimize_every=3, restart_backoff_initial_ms=100)
    stop = threading.Event()
    outside: list[str] = []
    errors: list[BaseException] = []

    def optimize_from_outside() -> None:  # another operator running `chandy lake optimize` meanwhile
        while not stop.wait(0.3):
            if not DeltaTable.is_deltatable(table):
                continue
            result = CliRunner().invoke(main, ["lake", "optimize", "--table", table])
            if result.exit_code != 0:
                errors.append(RuntimeError(result.output))
                return
            outside.append(result.output)

    thread = threading.Thread(target=optimize_from_outside)
    thread.start()
    pipeline = Pipeline(options, spark=lake_spark)
    try:
        summary = pipeline.run()
    finally:
        stop.set()
        thread.join()
    assert not errors, errors
    assert summary.records_landed == 600 and summary.checkpoints_completed >= 12
    history = DeltaTable(table).history()
    optimizes = [c for c in history if c["operation"] == "OPTIMIZE"]
    removed = sum(int(c["operationMetrics"]["numFilesRemoved"]) for c in optimizes)
    assert removed > 0, "no compaction removed a file while the pipeline ran"
    pipeline_commits = [c for c in history if c.get("chandy.job_id") == pipeline.job_id]
    # compactions happened between the pipeline's commits, not only after them
    assert min(c["version"] for c in optimizes) < max(c["version"] for c in pipeline_commits)
    assert verify_table(pipeline.sink, kafka_bootstrap_servers, [topic]) == (600, 0, 0)
    progress = pipeline.sink.progress(pipeline.job_id)
    assert progress.offsets == topic_ends(kafka_bootstrap_servers, topic)
    assert progress.checkpoint_id == DeltaTable(table).transaction_version(pipeline.job_id)
    # the record survived compaction: a restart lands only what is new
    produce(kafka_bootstrap_servers, topic, [f"b-{i}".encode() for i in range(50)])
    again = Pipeline(options, spark=lake_spark).run()
    assert again.records_landed == 50
    sink = DeltaLakeSink(table)
    assert verify_table(sink, kafka_bootstrap_servers, [topic]) == (650, 0, 0)
    # vacuum deletes the compacted-away files only; the table still reads every row once
    sink.optimize()
    compacted = sink.removed_files()
    assert compacted
    result = CliRunner().invoke(main, ["lake", "vacuum", "--table", table, "--retention-hours", "0"])
    assert result.exit_code == 0, result.output
    assert not any((tmp_path / "t" / p).exists() for p in compacted)
    assert len(DeltaTable(table).file_uris()) >= 1
    rows = DeltaTable(table).to_pyarrow_table().select(["topic", "partition", "offset"]).to_pylist()
    keys = [(r["topic"], r["partition"], r["offset"]) for r in rows]
    assert len(keys) == len(set(keys)) == 650 and set(keys) == all_offsets(kafka_bootstrap_servers, topic)


def test_vacuum_every_deletes_what_the_jobs_compactions_removed_while_it_runs(lake_spark, kafka_bootstrap_servers,
                                                                              tmp_path: Path) -> None:
    """Issue 47 (maintenance inside the job): --optimize-every 2 --vacuum-every 2
    --vacuum-retention-hours 0 compacts and then vacuums while the pipeline runs: the table's
    history holds VACUUM commits between the pipeline's, the files compactions removed are gone
    from storage, and every record is still in the table exactly once."""
    topic = make_topic(kafka_bootstrap_servers, [f"v-{i}".encode() for i in range(300)])
    table = tmp_path / "t"
    options = PipelineOptions(table_uri=str(table), bootstrap_servers=kafka_bootstrap_servers, topics=(topic,),
                              stop_when_drained=True, prefix=f"lv{uuid.uuid4().hex[:6]}", max_records_per_checkpoint=25,
                              optimize_every=2, vacuum_every=2, vacuum_retention_hours=0.0,
                              restart_backoff_initial_ms=100)
    pipeline = Pipeline(options, spark=lake_spark)
    assert pipeline.run().records_landed == 300
    history = DeltaTable(str(table)).history()
    vacuums = [c for c in history if c["operation"] == "VACUUM END"]
    assert vacuums, [c["operation"] for c in history]
    pipeline_commits = [c["version"] for c in history if c.get("chandy.job_id") == pipeline.job_id]
    assert min(c["version"] for c in vacuums) < max(pipeline_commits)  # while the job ran, not after it
    compacted = sum(int(c["operationMetrics"]["numFilesRemoved"]) for c in history if c["operation"] == "OPTIMIZE")
    assert compacted > 0
    # every file a compaction removed is gone: storage holds exactly the data files the table
    # references (beside its log, whose checkpoints are Parquet files too)
    referenced = {Path(u).name for u in DeltaTable(str(table)).file_uris()}
    assert {p.name for p in table.rglob("*.parquet") if "_delta_log" not in p.parts} == referenced
    assert verify_table(pipeline.sink, kafka_bootstrap_servers, [topic]) == (300, 0, 0)


@pytest.mark.slow
def test_expire_snapshots_every_keeps_the_last_snapshots_of_an_iceberg_table(lake_spark, kafka_bootstrap_servers,
                                                                            tmp_path: Path) -> None:
    """Iceberg's names for the same maintenance (`--expire-snapshots-every 2 --retain-last 3`,
    with `--optimize-every 2` and a retention of 0 hours): while the pipeline runs, snapshots
    beyond the 3 newest are expired, the files only they referenced are gone from storage, and
    every record is in the table exactly once. Slow (`-m slow`)."""
    from chandy.cli.pipeline import options_from_cli
    from tests.fixtures.exactly_once import iceberg_table

    topic = make_topic(kafka_bootstrap_servers, [f"v-{i}".encode() for i in range(300)])
    warehouse, name = tmp_path / "wh", f"lake.t{uuid.uuid4().hex[:6]}"
    command = main.commands["pipeline"].commands["run"]
    params = dict(command.make_context("run", [
        "--table", f"iceberg://local/{name}", "--topic", topic, "--until-drained", "--prefix", f"le{uuid.uuid4().hex[:6]}",
        "--max-records-per-checkpoint", "25", "--optimize-every", "2", "--expire-snapshots-every", "2",
        "--retain-last", "3", "--retention-hours", "0", "--catalog-property", f"warehouse={warehouse}"]).params)
    for extra in ("bootstrap_servers", "data_dir", "verify", "schema_registry_url"):
        params.pop(extra)
    options = options_from_cli(params, kafka_bootstrap_servers)
    assert (options.vacuum_every, options.vacuum_retain_last, options.vacuum_retention_hours) == (2, 3, 0.0)
    pipeline = Pipeline(dataclasses.replace(options, restart_backoff_initial_ms=100), spark=lake_spark)
    progress = pipeline.run()
    assert progress.records_landed == 300
    table = iceberg_table(warehouse, name)
    # each completed checkpoint committed a snapshot, each compaction another: expiries ran, and
    # every one of them kept the 3 newest
    assert 3 <= len(table.snapshots()) < progress.checkpoints_completed, (len(table.snapshots()), progress)
    referenced = {Path(f.file_path).name for s in table.snapshots()
                  for f in (t.file for t in table.scan(snapshot_id=s.snapshot_id).plan_files())}
    assert {p.name for p in warehouse.rglob("*.parquet")} == referenced
    assert verify_table(pipeline.sink, kafka_bootstrap_servers, [topic]) == (300, 0, 0)

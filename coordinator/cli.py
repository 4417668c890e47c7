"""The ``chandy`` command line. It only parses arguments and calls the library.

Every :class:`~coordinator.errors.ChandyError` becomes a one-line message on stderr and exit
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

from coordinator.errors import ChandyError

console = Console()
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
    from connectors.kafka import config as kafka_config
    from connectors.kafka.broker import EmbeddedKafkaBroker

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
    """The embedded single-node Apache Kafka broker (KRaft, 127.0.0.1)."""


@kafka.command()
@data_dir_option
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Client port (default: last one, else free).")
@click.option("--heap", default="512m", show_default=True, help="JVM heap (-Xmx).")
@click.option("--timeout", type=float, default=120.0, show_default=True, help="Seconds to wait for the broker.")
@click.option("--override", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Broker property under its standard name (repeatable), e.g. log.retention.hours=1.")
@_handle_errors
def up(data_dir: Path | None, port: int | None, heap: str, timeout: float, overrides: tuple[str, ...]) -> None:
    """Start the broker (idempotent) and print its bootstrap address."""
    from connectors.kafka.broker import KAFKA_VERSION, EmbeddedKafkaBroker

    broker = EmbeddedKafkaBroker(data_dir, port=port, heap=heap, broker_overrides=_parse_settings(overrides, "--override"))
    already = broker.status()
    start = time.monotonic()
    with err_console.status(f"starting Apache Kafka {KAFKA_VERSION} (first start fetches its jars from Maven Central)"):
        info = broker.up(timeout_s=timeout)
    took = time.monotonic() - start
    if already is not None:
        err_console.print(f"already running (pid {info.pid}), data in {info.data_dir}")
    else:
        err_console.print(f"Apache Kafka {info.kafka_version} up in {took:.1f} s (pid {info.pid}), data in {info.data_dir}")
    click.echo(info.bootstrap_servers)


@kafka.command()
@data_dir_option
@click.option("--timeout", type=float, default=30.0, show_default=True, help="Seconds before SIGKILL.")
@_handle_errors
def down(data_dir: Path | None, timeout: float) -> None:
    """Stop the broker cleanly."""
    from connectors.kafka.broker import EmbeddedKafkaBroker

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
    from connectors.kafka import config as kafka_config
    from connectors.kafka.broker import EmbeddedKafkaBroker

    info = EmbeddedKafkaBroker(data_dir).status()
    if info is None:
        if fmt == "json":
            click.echo(json.dumps({"running": False}))
        else:
            err_console.print("not running")
        sys.exit(1)
    metadata = kafka_config.admin_client(info.bootstrap_servers).list_topics(timeout=10)
    topics = {name: len(t.partitions) for name, t in sorted(metadata.topics.items()) if not name.startswith("__")}
    if fmt == "json":
        click.echo(json.dumps({"running": True, "kafka_version": info.kafka_version, "bootstrap_servers":
                               info.bootstrap_servers, "pid": info.pid, "data_dir": info.data_dir,
                               "log_file": info.log_file, "topics": topics}))
        return
    console.print(f"Apache Kafka {info.kafka_version} at [bold]{info.bootstrap_servers}[/] "
                  f"(pid {info.pid}, up {time.time() - info.started_at:.0f} s)")
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
    from connectors.kafka.roundtrip import round_trip

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
@_handle_errors
def checkpoint_demo(bootstrap_servers: str | None, data_dir: Path | None, subtasks: int, count: int,
                    checkpoint_dir: str | None) -> None:
    """Run a coordinator and SUBTASKS workers on this machine for COUNT checkpoints; show the statistics."""
    import tempfile

    from coordinator.demo import run_checkpoints

    servers = _bootstrap(bootstrap_servers, data_dir)
    with tempfile.TemporaryDirectory() as tmp, Progress(
        TextColumn("checkpoints"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
        TimeElapsedColumn(), console=err_console,
    ) as progress:
        task = progress.add_task("", total=count)
        result = run_checkpoints(
            servers, checkpoint_dir or f"file://{tmp}", subtasks=subtasks, checkpoints=count,
            on_checkpoint=lambda r, ms: progress.update(task, advance=1, description=f"#{r.checkpoint_id} {ms:.0f} ms"),
        )
    summary = result.stats["summary"]["end_to_end_duration"]
    table = Table("job", "subtasks", "completed", "failed", "p50 ms", "p99 ms", "max ms",
                  title="checkpoints (end to end, coordinator clock)")
    counts = result.stats["counts"]
    table.add_row(result.job_id, str(subtasks), str(counts["completed"]), str(counts["failed"]),
                  f"{summary['p50']:.0f}", f"{summary['p99']:.0f}", f"{summary['max']:.0f}")
    console.print(table)


# -- chandy topics ---------------------------------------------------------------------------
@main.group()
def topics() -> None:
    """Chandy's four topics (control, acks, coordinator-log, checkpoint-events)."""


@topics.command("ensure")
@bootstrap_option
@data_dir_option
@click.option("--prefix", default="chandy", show_default=True, help="Topic name prefix.")
@click.option("--partitions", type=click.IntRange(1), default=1, show_default=True)
@click.option("--replication-factor", type=click.IntRange(1), default=1, show_default=True)
@_handle_errors
def topics_ensure(bootstrap_servers: str | None, data_dir: Path | None, prefix: str, partitions: int,
                  replication_factor: int) -> None:
    """Create the missing topics with explicit settings, then check them all."""
    from connectors.kafka import config as kafka_config
    from connectors.kafka.topics import ChandyTopics, ensure_topics

    admin = kafka_config.admin_client(_bootstrap(bootstrap_servers, data_dir))
    created = ensure_topics(admin, ChandyTopics(prefix), partitions=partitions, replication_factor=replication_factor)
    err_console.print(f"created: {', '.join(created) or 'none'}; all four checked")


@topics.command("check")
@bootstrap_option
@data_dir_option
@click.option("--prefix", default="chandy", show_default=True, help="Topic name prefix.")
@_handle_errors
def topics_check(bootstrap_servers: str | None, data_dir: Path | None, prefix: str) -> None:
    """Check that the topics exist and the coordinator log is compacted (exit 2 if not)."""
    from connectors.kafka import config as kafka_config
    from connectors.kafka.topics import ChandyTopics, check_topics

    check_topics(kafka_config.admin_client(_bootstrap(bootstrap_servers, data_dir)), ChandyTopics(prefix))
    err_console.print("ok")


if __name__ == "__main__":  # pragma: no cover
    main()

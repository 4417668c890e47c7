"""``chandy kafka``: the embedded Apache Kafka broker or cluster.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from chandy.cli.app import (
    bootstrap_option,
    console,
    data_dir_option,
    err_console,
    handle_errors,
    main,
    parse_settings,
    resolve_bootstrap,
)


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
@handle_errors
def up(data_dir: Path | None, port: int | None, heap: str, timeout: float, overrides: tuple[str, ...],
       nodes: int | None, security: str | None, scram_users: tuple[str, ...], tls: bool | None) -> None:
    """Start the broker or cluster (idempotent; restarts dead nodes) and print its bootstrap address."""
    from chandy.broker import KAFKA_VERSION, EmbeddedKafkaBroker

    broker = EmbeddedKafkaBroker(data_dir, port=port, heap=heap, broker_overrides=parse_settings(overrides, "--override"),
                                 nodes=nodes, security=security, tls=tls,
                                 scram_users=parse_settings(scram_users, "--scram-user"))
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
@handle_errors
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
@handle_errors
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
    from chandy.coordinator.kafka.topics import log_history_settings

    admin = kafka_config.admin_client(info.bootstrap_servers, dict(info.client_settings))
    metadata = admin.list_topics(timeout=10)
    topics = {name: len(t.partitions) for name, t in sorted(metadata.topics.items()) if not name.startswith("__")}
    # how far back each coordinator log's replays stay exact (issue 35)
    histories = [log_history_settings(admin, name) for name in topics if name.endswith(".coordinator-log")]
    alive = set(EmbeddedKafkaBroker(data_dir).alive_nodes())
    nodes = [{"node_id": n.node_id, "pid": n.pid, "port": n.port, "alive": n.node_id in alive} for n in info.nodes]
    if fmt == "json":
        click.echo(json.dumps({"running": True, "kafka_version": info.kafka_version, "bootstrap_servers":
                               info.bootstrap_servers, "pid": info.pid, "data_dir": info.data_dir,
                               "log_file": info.log_file, "topics": topics, "nodes": nodes,
                               "security": info.security, "tls": info.tls,
                               "coordinator_logs": {h.topic: {"min.compaction.lag.ms": h.min_compaction_lag_ms,
                                                              "delete.retention.ms": h.delete_retention_ms,
                                                              "segment.ms": h.segment_ms} for h in histories}}))
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
    for history in histories:
        console.print(f"history of {history.describe()}")


@kafka.command()
@bootstrap_option
@data_dir_option
@click.option("--messages", "-n", type=click.IntRange(1), default=1000, show_default=True)
@handle_errors
def roundtrip(bootstrap_servers: str | None, data_dir: Path | None, messages: int) -> None:
    """Produce every Chandy message type and consume it back; print the latency (ms)."""
    from chandy.roundtrip import round_trip

    servers = resolve_bootstrap(bootstrap_servers, data_dir)
    with Progress(TextColumn("round trips"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console) as progress:
        task = progress.add_task("rt", total=messages)
        result = round_trip(servers, messages=messages, on_progress=lambda n: progress.update(task, completed=n))
    table = Table("messages", "p50 ms", "p99 ms", "mean ms", title=f"produce → consume on {servers}")
    table.add_row(str(result.count), f"{result.p50_ms:.2f}", f"{result.p99_ms:.2f}", f"{result.mean_ms:.2f}")
    console.print(table)


# -- chandy checkpoint -----------------------------------------------------------------------

"""``chandy events`` and ``chandy ui``: the public checkpoint events, followed in a terminal or a browser.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from chandy.cli.app import (
    bootstrap_option,
    data_dir_option,
    handle_errors,
    main,
    parse_settings,
    resolve_bootstrap,
)


# -- chandy events ----------------------------------------------------------------------------
@main.group()
def events() -> None:
    """The public checkpoint events."""


def _event_types() -> list[str]:
    from chandy.coordinator.kafka.subscriber import EVENT_TYPES

    return list(EVENT_TYPES)


def _describe(event: Any) -> str:
    """One line for a terminal: job, checkpoint, type and what the type carries."""
    if event.event_type == "LAKE_COMMITTED":
        extra = (f" {event.table_uri} {'snapshot' if event.table_format == 'iceberg' else 'version'} "
                 f"{event.table_version}, {event.records_added} records in {event.files_added} files")
    elif event.end_to_end_duration_ms is not None:
        extra = f" {event.end_to_end_duration_ms} ms, {event.num_acknowledged}/{event.num_subtasks} acks"
    elif event.job_status:
        extra = f" {event.job_status}"
    else:
        extra = ""
    reason = f" ({event.failure_reason})" if event.failure_reason else ""
    return f"{event.job_id[:8]} #{event.checkpoint_id} {event.event_type}{reason}{extra}"


@events.command("tail")
@click.option("--job", "job_id", default=None, help="Only this job's events.")
@click.option("--type", "event_types", multiple=True, type=click.Choice(_event_types()),
              help="Only events of this type (repeatable), e.g. --type LAKE_COMMITTED: the checkpoint's records are "
                   "readable in the table; COMPLETED is Flink's checkpoint completion, before the lake commit.")
@click.option("--from-beginning", is_flag=True, help="Start at the earliest event (default: new events only).")
@click.option("--group-id", default=None, help="Resume this consumer group's position (overrides --from-beginning).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--max-events", type=click.IntRange(1), default=None, help="Stop after this many events.")
@click.option("--prefix", default="chandy", show_default=True)
@bootstrap_option
@data_dir_option
@handle_errors
def events_tail(job_id: str | None, event_types: tuple[str, ...], from_beginning: bool, group_id: str | None, fmt: str,
                max_events: int | None, prefix: str, bootstrap_servers: str | None, data_dir: Path | None) -> None:
    """Follow checkpoint events (Ctrl-C stops)."""
    import dataclasses

    from chandy.coordinator.kafka.subscriber import subscribe

    start = "committed" if group_id else ("earliest" if from_beginning else "latest")
    seen = 0
    with subscribe(resolve_bootstrap(bootstrap_servers, data_dir), job_id=job_id, start=start, group_id=group_id,
                   prefix=prefix, event_types=event_types or None) as subscription:
        try:
            for event in subscription:
                click.echo(json.dumps(dataclasses.asdict(event)) if fmt == "json" else _describe(event))
                seen += 1
                if max_events is not None and seen >= max_events:
                    break
        except KeyboardInterrupt:
            pass


@events.command("wait")
@click.option("--job", "job_id", required=True, help="The job's ID (chandy job list shows it).")
@click.option("--checkpoint", "checkpoint_id", type=click.IntRange(1), default=None,
              help="Wait until this checkpoint (or a later one, which holds it) is in the table.")
@click.option("--until-event-time", "until_event_time", default=None, metavar="MS|ISO-8601",
              help="Wait until the table is complete up to this event time (ms since the epoch, or e.g. "
                   "2026-11-27T10:00:00Z; without a zone: UTC): a LAKE_COMMITTED whose valid_through_ms, the "
                   "minimum over the job's partitions of the newest Kafka timestamp landed, is at or past it. "
                   "With --checkpoint: both.")
@click.option("--table", "table_uri", default=None, help="Only commits to this table (a job may write several).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(0, min_open=True), default=60.0, show_default=True,
              help="Seconds to wait.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--prefix", default="chandy", show_default=True)
@bootstrap_option
@data_dir_option
@handle_errors
def events_wait(job_id: str, checkpoint_id: int | None, until_event_time: str | None, table_uri: str | None,
                timeout_s: float, fmt: str, prefix: str, bootstrap_servers: str | None, data_dir: Path | None) -> None:
    """Wait until a checkpoint's records are in the lake (its LAKE_COMMITTED event), or until the
    table is complete up to an event time (--until-event-time: a downstream job waiting for an
    hour to close), for shell scripts and schedulers. Prints the table and its version; exits 0
    when it is, 124 on timeout (as GNU timeout), 3 when the job ended first, 1 on any other error
    (2: neither --checkpoint nor --until-event-time, or a time that does not parse)."""
    import dataclasses

    from chandy.connectors.kafka.source.offsets import OffsetsSpecError, parse_timestamp_ms
    from chandy.connectors.lake.uri import normalize_table_uri
    from chandy.coordinator.kafka.subscriber import LakeCommitWaitError, wait_for_lake_commit

    if checkpoint_id is None and until_event_time is None:
        raise click.UsageError("give --checkpoint, --until-event-time, or both")
    until_ms = None
    if until_event_time is not None:
        try:
            until_ms = parse_timestamp_ms(until_event_time, "--until-event-time")
        except OffsetsSpecError as exc:
            raise click.BadParameter(str(exc), param_hint="--until-event-time") from None
    try:
        event = wait_for_lake_commit(resolve_bootstrap(bootstrap_servers, data_dir), job_id, checkpoint_id,
                                     table_uri=normalize_table_uri(table_uri) if table_uri else None,
                                     until_event_time_ms=until_ms, timeout_s=timeout_s, prefix=prefix)
    except LakeCommitWaitError as exc:
        click.echo(f"Error: {exc}", err=True)
        raise SystemExit(124 if exc.reason == "timeout" else 3) from None
    click.echo(json.dumps(dataclasses.asdict(event)) if fmt == "json" else _describe(event))


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
@handle_errors
def ui(host: str, port: int, prefix: str, history_size: int, consumer_conf: tuple[str, ...],
       bootstrap_servers: str | None, data_dir: Path | None) -> None:
    """Serve every job's checkpoints, read from the checkpoint events topic: the dashboard at /,
    and Flink's REST shapes at /jobs, /jobs/{id}/checkpoints, /jobs/{id}/checkpoints/details/{n}
    and /health. Read-only: it never touches a coordinator. Ctrl-C stops."""
    from chandy.ui.server import serve

    servers = resolve_bootstrap(bootstrap_servers, data_dir)
    try:
        serve(servers, host=host, port=port, prefix=prefix, history_size=history_size,
              consumer_overrides=parse_settings(consumer_conf),
              on_listening=lambda url: click.echo(f"chandy ui: {url} (events of {prefix}.checkpoint-events on {servers})"))
    except KeyboardInterrupt:
        pass


# -- chandy topics ---------------------------------------------------------------------------

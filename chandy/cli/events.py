"""``chandy events`` and ``chandy ui``: the public checkpoint events, followed in a terminal or a browser.
"""

from __future__ import annotations

import json
from pathlib import Path

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


@events.command("tail")
@click.option("--job", "job_id", default=None, help="Only this job's events.")
@click.option("--from-beginning", is_flag=True, help="Start at the earliest event (default: new events only).")
@click.option("--group-id", default=None, help="Resume this consumer group's position (overrides --from-beginning).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--max-events", type=click.IntRange(1), default=None, help="Stop after this many events.")
@click.option("--prefix", default="chandy", show_default=True)
@bootstrap_option
@data_dir_option
@handle_errors
def events_tail(job_id: str | None, from_beginning: bool, group_id: str | None, fmt: str, max_events: int | None,
                prefix: str, bootstrap_servers: str | None, data_dir: Path | None) -> None:
    """Follow checkpoint events (Ctrl-C stops)."""
    import dataclasses

    from chandy.coordinator.kafka.subscriber import subscribe

    start = "committed" if group_id else ("earliest" if from_beginning else "latest")
    seen = 0
    with subscribe(resolve_bootstrap(bootstrap_servers, data_dir), job_id=job_id, start=start, group_id=group_id,
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

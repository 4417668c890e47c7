"""``chandy checkpoint``, ``chandy savepoint``, ``chandy job``: operating running jobs through control requests, and the checkpoint demo.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from chandy.cli.app import (
    bootstrap_option,
    console,
    data_dir_option,
    err_console,
    handle_errors,
    job_option,
    main,
    metrics_port_option,
    prefix_option,
    request_timeout_option,
    resolve_bootstrap,
)


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
@handle_errors
def checkpoint_demo(bootstrap_servers: str | None, data_dir: Path | None, subtasks: int, count: int,
                    checkpoint_dir: str | None, pause_ms: int, prefix: str | None, keep_topics: bool,
                    metrics_port: int | None) -> None:
    """Run a coordinator and SUBTASKS workers on this machine for COUNT checkpoints; show the statistics."""
    import tempfile

    from chandy.demo import run_checkpoints

    servers = resolve_bootstrap(bootstrap_servers, data_dir)
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


def _print_metrics_url(service: Any) -> None:
    if service.metrics_server is not None:
        err_console.print(f"metrics: http://127.0.0.1:{service.metrics_server.port}/metrics (job {service.job_id})")


def request_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options of every command that sends a control request (after the command's own):
    ``--prefix``, ``-b``, ``--data-dir``, ``--timeout``; errors become one line and an exit code."""
    command = handle_errors(command)
    for option in (request_timeout_option, data_dir_option, bootstrap_option, prefix_option):
        command = option(command)
    return command


def _request(kind_name: str, job_id: str, prefix: str, bootstrap_servers: str | None, data_dir: Path | None,
             timeout_s: float, *, target_directory: str | None = None, drain: bool = False) -> None:
    """Send one control request, show its progress, print the pointer or the reason; exit 1 on
    failure (refused, failed, not running, no answer in time)."""
    from chandy.coordinator.kafka.requests import ControlRequestType, RequestError, RequestStatus, send_request

    kind = ControlRequestType(kind_name)
    servers = resolve_bootstrap(bootstrap_servers, data_dir)
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
@request_options
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
@request_options
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
@request_options
def job_stop(job_id: str, with_savepoint: bool, drain: bool, target_directory: str | None, prefix: str,
             bootstrap_servers: str | None, data_dir: Path | None, timeout_s: float) -> None:
    """Stop a running job with a savepoint, committed to the lake and the consumer group; print its pointer."""
    if not with_savepoint:
        raise click.UsageError("stopping without a savepoint is `chandy job cancel`")
    _request("STOP_WITH_SAVEPOINT", job_id, prefix, bootstrap_servers, data_dir, timeout_s,
             target_directory=target_directory, drain=drain)


@job.command("cancel")
@job_option
@request_options
def job_cancel(job_id: str, prefix: str, bootstrap_servers: str | None, data_dir: Path | None,
               timeout_s: float) -> None:
    """Cancel a running job: no savepoint, the checkpoint in flight is aborted (Flink's `flink cancel`)."""
    _request("CANCEL", job_id, prefix, bootstrap_servers, data_dir, timeout_s)


@job.command("list")
@prefix_option
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@bootstrap_option
@data_dir_option
@handle_errors
def job_list(prefix: str, fmt: str, bootstrap_servers: str | None, data_dir: Path | None) -> None:
    """Jobs seen on the checkpoint-events topic: status, coordinator, last checkpoint and savepoint."""
    import dataclasses

    from chandy.coordinator.kafka.requests import list_jobs

    with err_console.status("reading the checkpoint events"):
        jobs = list_jobs(resolve_bootstrap(bootstrap_servers, data_dir), prefix=prefix)
    if fmt == "json":
        for summary in jobs:
            click.echo(json.dumps(dataclasses.asdict(summary)))
        return
    table = Table("job", "name", "status", "coordinator", "last checkpoint", "last savepoint", title=f"jobs ({prefix})")
    for s in jobs:
        table.add_row(s.job_id, s.name if s.name and s.name != s.job_id else "-", s.status,
                      "running" if s.coordinator_running else "-",
                      str(s.last_checkpoint) if s.last_checkpoint is not None else "-", s.last_savepoint or "-")
    console.print(table)

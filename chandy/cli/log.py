"""``chandy log``: the coordinator's event-sourced log, replayed and exported (read-only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from chandy.cli.app import (
    bootstrap_option,
    console,
    data_dir_option,
    err_console,
    handle_errors,
    main,
    resolve_bootstrap,
)


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
@handle_errors
def log_replay(job_id: str | None, until_checkpoint: int | None, until: str | None, fmt: str, from_file: Path | None,
               prefix: str, bootstrap_servers: str | None, data_dir: Path | None) -> None:
    """Show what the coordinator knew: a timeline and the resulting state."""
    _register_connector_log_kinds()
    from chandy.coordinator.kafka.log import LoadStats
    from chandy.coordinator.kafka.replay import read_logged, replay
    from chandy.coordinator.kafka.topics import ChandyTopics

    servers = None if from_file else resolve_bootstrap(bootstrap_servers, data_dir)
    stats = LoadStats()
    topic = ChandyTopics(prefix).coordinator_log
    with err_console.status("replaying the coordinator log"):
        result = replay(read_logged(servers, topic, from_file=from_file, job_id=job_id, stats=stats),
                        job_id=job_id, until_checkpoint=until_checkpoint, until_ms=_parse_time(until))
    history = _history_settings(servers, topic)
    if fmt == "json":
        for entry in result.timeline:
            click.echo(json.dumps(entry))
        for job, state in sorted(result.states.items()):
            horizon = result.horizons.get(job)
            click.echo(json.dumps({"event": "state", "job_id": job, **_state_json(state),
                                   "history_horizon": None if horizon is None else {
                                       "checkpoint_id": horizon.checkpoint_id, "timestamp": horizon.timestamp_ms,
                                       "offset": horizon.offset, "reason": horizon.reason}}))
        if history is not None:  # on stderr: stdout is the log's content, the same as from an export
            err_console.print(f"history: {history.describe()}")
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
    for horizon in result.horizons.values():
        console.print(f"history: {horizon.describe()}")
    if history is not None:
        console.print(f"history: {history.describe()}")
    err_console.print(f"{result.records} records replayed; skipped: {stats.skipped_bad} bad, {stats.skipped_unknown} "
                      "of unknown kinds")


def _history_settings(servers: str | None, topic: str) -> Any:
    """The live log's :class:`~chandy.coordinator.kafka.topics.LogHistorySettings` (None when
    replaying a file, or when the settings cannot be described: the replay is still shown)."""
    if servers is None:
        return None
    from confluent_kafka import KafkaException

    from chandy.coordinator.kafka import config as kafka_config
    from chandy.coordinator.kafka.topics import log_history_settings

    try:
        return log_history_settings(kafka_config.admin_client(servers), topic, timeout_s=10)
    except KafkaException:  # e.g. no DescribeConfigs grant: the replay itself was read
        return None


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
    importlib.import_module("chandy.connectors.lake")


@log_group.command("export")
@click.option("--job", "job_id", default=None, help="Job ID (default: every job).")
@click.option("--output", "-o", type=click.Path(dir_okay=False, path_type=Path), required=True)
@click.option("--prefix", default="chandy", show_default=True)
@bootstrap_option
@data_dir_option
@handle_errors
def log_export(job_id: str | None, output: Path, prefix: str, bootstrap_servers: str | None, data_dir: Path | None) -> None:
    """Write the coordinator log to a file, for `chandy log replay --from-file` elsewhere."""
    from chandy.coordinator.kafka.replay import export_log
    from chandy.coordinator.kafka.topics import ChandyTopics

    count = export_log(resolve_bootstrap(bootstrap_servers, data_dir), ChandyTopics(prefix).coordinator_log, output, job_id=job_id)
    err_console.print(f"{count} records written to {output}")


# -- chandy events ----------------------------------------------------------------------------

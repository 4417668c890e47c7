"""``chandy topics``: Chandy's five topics, created, checked and given their minimal ACLs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from chandy.cli.app import (
    bootstrap_option,
    data_dir_option,
    err_console,
    handle_errors,
    main,
    parse_settings,
    resolve_bootstrap,
)


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

    servers = resolve_bootstrap(bootstrap_servers, data_dir)
    admin_settings = parse_settings(settings)
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
@click.option("--log-min-compaction-lag-ms", "log_history_ms", type=click.IntRange(0), default=None,
              help="min.compaction.lag.ms (and delete.retention.ms) of a new coordinator log: how far back "
                   "`chandy log replay --until` stays exact; the log keeps every record that long  "
                   "[default: 604800000, 7 days]")
@admin_settings_option
@handle_errors
def topics_ensure(bootstrap_servers: str | None, data_dir: Path | None, prefix: str, partitions: int,
                  log_partitions: int, replication_factor: int | None, log_history_ms: int | None,
                  settings: tuple[str, ...]) -> None:
    """Create the missing topics with explicit settings, then check them all.

    Size the coordinator log with --log-partitions (default 50, as Kafka's __consumer_offsets): each
    job's records live in the partition its job ID hashes to, and a coordinator replays only that
    one, so its start does not grow with other jobs' history. The count is fixed once created."""
    from chandy.coordinator.kafka.topics import ChandyTopics, ensure_topics, log_history_settings

    _, admin = _admin(bootstrap_servers, data_dir, settings)
    topics = ChandyTopics(prefix)
    history = {} if log_history_ms is None else {"min_compaction_lag_ms": log_history_ms}
    created = ensure_topics(admin, topics, partitions=partitions, log_partitions=log_partitions,
                            replication_factor=replication_factor, **history)
    err_console.print(f"created: {', '.join(created) or 'none'}; all five checked")
    current = log_history_settings(admin, topics.coordinator_log)
    err_console.print(f"history: {current.describe()}")
    if log_history_ms is not None and current.min_compaction_lag_ms != log_history_ms:
        err_console.print(f"[yellow]the coordinator log existed with another min.compaction.lag.ms; change it with "
                          f"kafka-configs.sh --alter --entity-type topics --entity-name {topics.coordinator_log} "
                          f"--add-config min.compaction.lag.ms={log_history_ms},delete.retention.ms={log_history_ms}[/]")


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
@handle_errors
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
@handle_errors
def topics_check(bootstrap_servers: str | None, data_dir: Path | None, prefix: str, settings: tuple[str, ...]) -> None:
    """Check that the topics exist and the coordinator log is compacted (exit 2 if not)."""
    from chandy.coordinator.kafka.topics import ChandyTopics, check_topics

    check_topics(_admin(bootstrap_servers, data_dir, settings)[1], ChandyTopics(prefix))
    err_console.print("ok")


# -- control requests: operate a running job from anywhere -------------------------------------------

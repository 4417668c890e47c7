"""``chandy lake``: table maintenance, safe while a pipeline writes the table.
"""

from __future__ import annotations

from typing import Any

import click

from chandy.cli.app import (
    catalog_property_option,
    console,
    err_console,
    handle_errors,
    main,
    parse_settings,
)

#: ``--storage-option``: as ``chandy pipeline run``'s (see chandy.coordinator.filesystems)
storage_option = click.option(
    "--storage-option", "storage_conf", multiple=True, metavar="KEY=VALUE",
    help="Storage setting under delta-rs's name (AWS_REGION, AWS_ENDPOINT_URL, ...), mapped for fsspec and "
         "pyiceberg; the environment's are read too (repeatable).")


# -- chandy lake ------------------------------------------------------------------------------
@main.group()
def lake() -> None:
    """Table maintenance, safe while a pipeline writes the table."""


def _lake_sink(table_uri: str, storage_conf: tuple[str, ...], catalog_conf: tuple[str, ...]) -> Any:
    from chandy.connectors.lake.tables import open_sink

    return open_sink(table_uri, storage_options=parse_settings(storage_conf, "--storage-option"),
                     catalog_properties=parse_settings(catalog_conf, "--catalog-property"))


@lake.command("optimize")
@click.option("--table", "table_uri", required=True, help="Table URL (a Delta path/URL or iceberg://catalog/ns.table).")
@click.option("--target-size", type=click.IntRange(1), default=None, metavar="BYTES",
              help="Size of the compacted files (default: delta-rs's 100 MiB).")
@storage_option
@catalog_property_option
@handle_errors
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
@click.option("--retain-last", type=click.IntRange(1), default=1, show_default=True,
              help="Iceberg: keep the M newest snapshots whatever their age (ExpireSnapshots.retainLast).")
@click.option("--dry-run", is_flag=True, help="List the files instead of deleting them.")
@storage_option
@catalog_property_option
@handle_errors
def lake_vacuum(table_uri: str, retention_hours: float, retain_last: int, dry_run: bool, storage_conf: tuple[str, ...],
                catalog_conf: tuple[str, ...]) -> None:
    """Delete data files the table no longer references (compacted away) after a retention; files of
    in-flight checkpoints are never touched (they are not yet in the table's log as removed)."""
    sink = _lake_sink(table_uri, storage_conf, catalog_conf)
    files = sink.vacuum(retention_hours=retention_hours, dry_run=dry_run, retain_last=retain_last)
    for path in files:
        console.print(path)
    err_console.print(f"{len(files)} file(s) {'would be' if dry_run else ''} deleted".replace("  ", " "))


# -- chandy demo -----------------------------------------------------------------------------

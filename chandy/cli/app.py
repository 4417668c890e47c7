"""The ``chandy`` command group, and what its command modules share: the consoles, error handling, the
bootstrap servers and ``-X`` settings, common options.

Every :class:`~chandy.coordinator.errors.ChandyError` becomes a one-line message on stderr and exit
code 2; Kafka settings are passed through as ``-X key=value`` under librdkafka's names.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from chandy.coordinator.errors import ChandyError

#: rich's consoles of the CLI. On a terminal they fit its width; into a pipe or a file they never
#: hard-wrap (rich would assume 80 columns and break every longer line, so logs and ``| less`` got
#: broken records): one record per line, tables as wide as their content
PIPE_WIDTH = 1_000_000


def _console(*, stderr: bool) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr, soft_wrap=stderr)
    return Console(stderr=stderr, soft_wrap=True, width=PIPE_WIDTH)


console = _console(stderr=False)


#: ``chandy pipeline run``'s exit code for a job canceled with ``chandy job cancel`` (0 would read as success)
EXIT_CANCELED = 4


err_console = _console(stderr=True)


def handle_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ChandyError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)

    return wrapper


def parse_settings(values: tuple[str, ...], option: str = "-X") -> dict[str, str]:
    settings: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"expected key=value, got {item!r}", param_hint=option)
        settings[key.strip()] = value
    return settings


def resolve_bootstrap(bootstrap_servers: str | None, data_dir: Path | None) -> str:
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


# -- control requests: operate a running job from anywhere -------------------------------------------
job_option = click.option("--job", "job_id", required=True, metavar="JOB_ID", help="The job's ID.")


prefix_option = click.option("--prefix", default="chandy", show_default=True, help="Topic name prefix.")


request_timeout_option = click.option(
    "--timeout", "timeout_s", type=click.FloatRange(1), default=120.0, show_default=True,
    help="Seconds to wait for the answer; the request expires after them, so it never fires later.")

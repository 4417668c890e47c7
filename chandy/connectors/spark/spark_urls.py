"""Where Spark runs, as URLs say it: a master URL that runs the executors in the driver's JVM, and a
Spark Connect URL's address and its loggable form. No Spark, no Chandy: options, preflight and the
session read them."""

from __future__ import annotations

import re


def redact_remote(remote: str) -> str:
    """A Spark Connect URL fit for a log line: its ``token`` parameter hidden."""
    return re.sub(r"(;\s*token=)[^;]*", r"\1***", remote)


def connect_address(remote: str) -> tuple[str, int]:
    """The (host, port) of a Spark Connect URL ``sc://host[:port][/;params]`` (port 15002 when not
    given, as pyspark's ``ChannelBuilder.default_port``)."""
    from urllib.parse import urlsplit

    netloc = remote[len("sc://"):].split("/", 1)[0].split(";", 1)[0]
    parts = urlsplit(f"//{netloc}")
    return parts.hostname or netloc, parts.port or 15002


def is_local_master(master: str) -> bool:
    """Whether ``master`` runs the executors inside the driver's JVM (``local``, ``local[N]``,
    ``local[N,F]``, ``local[*]``); ``local-cluster[...]``, ``spark://``, ``yarn`` and ``k8s://`` do not."""
    return master == "local" or master.startswith("local[")

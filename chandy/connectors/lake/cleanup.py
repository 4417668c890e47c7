"""Which data files of a job are on storage: what a restore's or an abort's cleanup
(``LakeSink.delete_unreferenced``) lists before it reads the table.

A sink writes a job's data files as :data:`~chandy.connectors.lake.sink.DATA_FILE_NAME` names them,
in the data directory (the table root for Delta, ``data/`` for Iceberg) or in its hive-style
partition directories (``<column>=<value>/``, nested). :func:`job_files` walks exactly those
directories, and never one whose name holds no ``=``: not ``_delta_log/`` (one file per table
version: on an object store, listing it costs more than the data files once a pipeline has
committed for a while), ``_chandy_checkpoints/`` or Iceberg's ``metadata/``. Nor a directory that
is the root of another table (it holds ``_delta_log/`` or ``metadata/``: :data:`TABLE_MARKERS`),
however hive-like its name: a routed table at ``lake/events/region=eu`` beside ``--table
lake/events`` holds files of the same job and log, which the outer table references nowhere, and
its cleanup would delete them from under the routed table's commits (issue 54, finding A).
On a local disk it reads directories with ``os.scandir``
(fsspec's ``ls`` would ``stat`` each of a large table's files); elsewhere with the file system's
``ls`` (one listing request per directory and page of results).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

from chandy.connectors.lake.sink import DATA_FILE_NAME

log = logging.getLogger(__name__)

#: the directories that make a directory a table's root: Delta's log, Iceberg's metadata
TABLE_MARKERS = frozenset({"_delta_log", "metadata"})


def _entries(fs: Any, path: str) -> list[tuple[str, bool]]:
    """(name, is a directory) of each entry of directory ``path`` of ``fs``; none when it does not exist."""
    from fsspec.implementations.local import LocalFileSystem

    try:
        if isinstance(fs, LocalFileSystem):
            with os.scandir(path) as entries:
                return [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
        return [(str(info["name"]).rstrip("/").rsplit("/", 1)[-1], info.get("type") == "directory")
                for info in fs.ls(path, detail=True)]
    except FileNotFoundError:
        return []


def job_files(fs: Any, root: str, job_id: str, *, data_dir: str = "", log_id: str | None = None,
              keep_checkpoints_after: int | None = None) -> dict[str, int]:
    """The data files of job ``job_id`` (named with ``job_id[:8]``) under ``root`` (fsspec's form
    of the table root on ``fs``): their paths relative to ``root`` (``data_dir`` first, when the
    sink writes its files under one) and the checkpoint each belongs to. Files of checkpoints above
    ``keep_checkpoints_after`` (in flight) are left out, with ``log_id`` so are files another
    coordinator log of the job wrote (named with another log ID: see
    :func:`~chandy.connectors.lake.sink.coordinator_log_id`; a file named without one, written
    before log IDs, is every log's), and so is anything outside the data directory and its
    partition directories, or inside another table's root (see the module docstring)."""
    found: dict[str, int] = {}
    top = f"{data_dir.strip('/')}/" if data_dir.strip("/") else ""
    pending = [top]
    while pending:
        directory = pending.pop()
        entries = _entries(fs, f"{root}/{directory}".rstrip("/"))
        if directory != top and any(is_dir and name in TABLE_MARKERS for name, is_dir in entries):
            log.debug("cleanup of %s: %s is another table's root, not listed", root, directory)
            continue
        for name, is_dir in entries:
            if is_dir:
                if "=" in name:  # a partition directory, as both formats name them
                    pending.append(f"{directory}{name}/")
                continue
            match = DATA_FILE_NAME.match(name)
            if match is None or not job_id.startswith(match["job"]):
                continue
            if log_id is not None and match["log"] not in (None, log_id):
                continue
            checkpoint = int(match["checkpoint"])
            if keep_checkpoints_after is None or checkpoint <= keep_checkpoints_after:
                found[f"{directory}{name}"] = checkpoint
    return found


def delete_files(fs: Any, root: str, paths: Iterable[str]) -> list[str]:
    """Delete ``paths`` (relative to ``root`` on ``fs``), in order; returns those deleted (a file
    already gone was deleted by another cleanup of the same table, and is left out)."""
    deleted = []
    for relative in paths:
        try:
            fs.rm(f"{root}/{relative}")
        except FileNotFoundError:
            continue
        deleted.append(relative)
    if deleted:
        log.info("deleted %d data file(s) no completed checkpoint references", len(deleted))
    return deleted

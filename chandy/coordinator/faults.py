"""Crash points for the exactly-once tests: ``CHANDY_CRASH_AT=<point>@<checkpoint id>`` kills the
whole pipeline (its process group, with SIGKILL) when the named point is reached for that
checkpoint. Unset (always, outside tests), a crash point costs one dictionary lookup.

Points, in protocol order: ``task-read`` (a task is reading its ranges), ``task-written`` (a
task wrote its files, before its ack), ``before-complete`` (all acks in, before the checkpoint
is completed), ``before-lake-commit`` (completed, before the lake commit), ``before-lake-event``
(lake committed, before its ``LAKE_COMMITTED`` event is published), ``before-offset-commit``
(lake committed and its event handed to the log writer, before the consumer-group offsets are
committed). With routing (``--route``), ``between-table-commits`` follows each routed table's
commit, before the next table's (:data:`ROUTED_POINTS`).
"""

from __future__ import annotations

import os
import signal

ENV = "CHANDY_CRASH_AT"
#: The process group to kill; the pipeline driver sets it, since Spark's Python workers run in
#: a process group of their own (pyspark's daemon calls setpgid). ``@<path>``: the group is the
#: number in that file, which the driver writes (:func:`arm`): the Python workers of a Spark
#: Connect server inherit the server's environment, not the client's, so a test starts the server
#: with ``CHANDY_CRASH_AT`` and ``CHANDY_CRASH_PGID=@<path>`` and a task's crash point kills the client.
PGID_ENV = "CHANDY_CRASH_PGID"
POINTS = ("task-read", "task-written", "before-complete", "before-lake-commit", "before-lake-event",
          "before-offset-commit")
#: the points of a job that routes records to many tables, in protocol order
ROUTED_POINTS = (*POINTS[:4], "between-table-commits", *POINTS[4:])


def arm() -> None:
    """In the pipeline's driver, with ``CHANDY_CRASH_AT`` or ``CHANDY_CRASH_PGID`` set: make a
    crash point reached in a task kill the driver's process group too (:data:`PGID_ENV`)."""
    target = os.environ.get(PGID_ENV, "")
    if target.startswith("@"):
        with open(target[1:], "w") as handle:
            handle.write(str(os.getpgid(0)))
    elif os.environ.get(ENV):
        os.environ[PGID_ENV] = str(os.getpgid(0))


def crash_point(point: str, checkpoint_id: int) -> None:
    """SIGKILL the process group if ``CHANDY_CRASH_AT`` (``point@N``, or several, comma-separated)
    names this point and checkpoint."""
    wanted = os.environ.get(ENV)
    if not wanted:
        return
    for spec in wanted.split(","):
        name, _, checkpoint = spec.strip().partition("@")
        if name == point and checkpoint == str(checkpoint_id):
            target = os.environ.get(PGID_ENV) or str(os.getpgid(0))
            if target.startswith("@"):
                with open(target[1:]) as handle:
                    target = handle.read().strip()
            os.killpg(int(target), signal.SIGKILL)

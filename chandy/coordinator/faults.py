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
#: a process group of their own (pyspark's daemon calls setpgid).
PGID_ENV = "CHANDY_CRASH_PGID"
POINTS = ("task-read", "task-written", "before-complete", "before-lake-commit", "before-lake-event",
          "before-offset-commit")
#: the points of a job that routes records to many tables, in protocol order
ROUTED_POINTS = (*POINTS[:4], "between-table-commits", *POINTS[4:])


def crash_point(point: str, checkpoint_id: int) -> None:
    """SIGKILL the process group if ``CHANDY_CRASH_AT`` names this point and checkpoint."""
    wanted = os.environ.get(ENV)
    if not wanted:
        return
    name, _, checkpoint = wanted.partition("@")
    if name == point and checkpoint == str(checkpoint_id):
        os.killpg(int(os.environ.get(PGID_ENV) or os.getpgid(0)), signal.SIGKILL)

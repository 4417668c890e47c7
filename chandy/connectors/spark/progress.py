"""What a pipeline run reports: each checkpoint's progress (:class:`PipelineProgress`, with where
its time went, :data:`CHECKPOINT_PHASES`) and the run's summary (:class:`PipelineSummary`).
Re-exported by :mod:`chandy.connectors.spark.options`."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class PipelineProgress:
    """After each checkpoint: what landed, how long it took, and the lag per partition (records)."""

    checkpoint_id: int
    succeeded: bool
    records_in_checkpoint: int
    records_landed: int
    checkpoints_completed: int
    checkpoints_failed: int
    checkpoint_duration_ms: float
    elapsed_s: float
    lag: dict[tuple[str, int], int]
    message: str | None = None
    spark_job_ms: float = 0.0  # of checkpoint_duration_ms, the Spark job (read, transform, write, ack)
    bad_records: int = 0  # this run, in completed checkpoints
    dead_lettered: int = 0  # of those, published to the dead-letter topic
    tombstones_skipped: int = 0
    #: where checkpoint_duration_ms went, in ms (:data:`CHECKPOINT_PHASES`); empty for a failed one
    phases_ms: Mapping[str, float] = dataclasses.field(default_factory=dict)


#: The phases of one checkpoint, in order, as :attr:`PipelineProgress.phases_ms` names them (ms).
#: They are the gaps between its milestones, so they add up to its end-to-end time:
#: ``trigger``: the round's start to its offset ranges fixed (the trigger's log record, the
#: enumerator's snapshot); ``tasks``: to the last subtask's ack (the Spark tasks read, decode,
#: transform and write); ``finalize``: to completion (``_metadata`` written, dead letters read);
#: ``lake_commit``: to the end of the table commit and its LAKE_COMMITTED event; ``job_end``: the
#: driver still waiting for its Spark job call to return (task results, Spark's bookkeeping) after
#: that; ``notify``: the rest (the COMPLETED log transaction's commit, the consumer-group offset
#: commit, the hand-over to the driver).
CHECKPOINT_PHASES = ("trigger", "tasks", "finalize", "lake_commit", "notify", "job_end")


@dataclasses.dataclass(frozen=True)
class PipelineSummary:
    """The end of a run: rows this run committed (``records_landed``: those of a checkpoint its
    restore committed included, written by a crashed attempt or run, so that the runs' counts add
    up to the table's rows), its checkpoints, seconds, why it stopped, and the signal that stopped
    it (if any); :func:`verify_table` compares the table with the topics."""

    table_uri: str
    job_id: str
    records_landed: int
    checkpoints_completed: int
    checkpoints_failed: int
    seconds: float
    stopped_because: str = "drained"
    bad_records: int = 0
    dead_lettered: int = 0
    tombstones_skipped: int = 0
    signal: int | None = None
    notices: tuple[str, ...] = ()
    canceled: bool = False  # by a CANCEL request (``chandy job cancel``)
    restarts: int = 0  # times the restart strategy restarted the job in this run
    #: --no-fail-on-data-loss: offsets partitions' logs moved back below the job's position by (at least
    #: that many records of a recreated or truncated log skipped; Spark's failOnDataLoss)
    offsets_lost: int = 0

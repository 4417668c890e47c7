"""The Kafka source's own kinds of coordinator-log records, registered with the coordinator's
generic log (:func:`chandy.coordinator.records.register_record_kind`):

- ``splits`` (:class:`SplitAssignmentRecord`, entity the operator ID): the enumerator's split
  assignment, written when it changes (Flink keeps it in the enumerator's checkpoint; Chandy also
  logs it so ``chandy log replay`` shows who reads what);
- ``offsets`` (:class:`OffsetCommitRecord`, entity the consumer group): the offsets committed to
  a consumer group on ``notifyCheckpointComplete``.

Both fold as "latest per entity", as the compacted topic keeps them; the Avro schemas
(``chandy.v1.SplitAssignmentRecord``, ``chandy.v1.OffsetCommitRecord``) are unchanged, so logs
written before the registry existed read the same. Importing this module registers the kinds.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from chandy.coordinator.records import LogRecordBase, register_record_kind


@dataclasses.dataclass(frozen=True)
class SplitAssignment:
    """One split and the reader subtask it is assigned to (-1: not yet assigned)."""

    split_id: str
    topic: str
    partition: int
    subtask_index: int
    starting_offset: int
    stopping_offset: int | None = None


@dataclasses.dataclass(frozen=True)
class SplitAssignmentRecord(LogRecordBase):
    """A source enumerator's split assignment (kind ``splits``, entity the operator ID)."""

    SCHEMA: ClassVar[str] = "chandy.v1.SplitAssignmentRecord"
    KIND: ClassVar[str] = "splits"

    job_id: str
    operator_id: str
    checkpoint_id: int
    splits: tuple[SplitAssignment, ...]
    timestamp: int

    @property
    def entity_id(self) -> str:
        return self.operator_id


@dataclasses.dataclass(frozen=True)
class TopicPartitionOffset:
    """A Kafka offset (the next record to read) of one topic partition."""

    topic: str
    partition: int
    offset: int


@dataclasses.dataclass(frozen=True)
class OffsetCommitRecord(LogRecordBase):
    """Offsets committed to a consumer group for a checkpoint (kind ``offsets``, entity the group)."""

    SCHEMA: ClassVar[str] = "chandy.v1.OffsetCommitRecord"
    KIND: ClassVar[str] = "offsets"

    job_id: str
    group_id: str
    checkpoint_id: int
    offsets: tuple[TopicPartitionOffset, ...]
    timestamp: int

    @property
    def entity_id(self) -> str:
        return self.group_id


def _describe_splits(r: SplitAssignmentRecord) -> dict[str, Any]:
    return {"event": "splits_assigned", "operator_id": r.operator_id, "checkpoint_id": r.checkpoint_id,
            "splits": [{"split": s.split_id, "subtask": s.subtask_index, "offset": s.starting_offset} for s in r.splits]}


def _describe_offsets(r: OffsetCommitRecord) -> dict[str, Any]:
    return {"event": "offsets_committed", "group_id": r.group_id, "checkpoint_id": r.checkpoint_id,
            "offsets": {f"{o.topic}-{o.partition}": o.offset for o in r.offsets}}


register_record_kind(SplitAssignmentRecord, describe=_describe_splits)
register_record_kind(OffsetCommitRecord, describe=_describe_offsets)

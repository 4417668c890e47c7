"""The lake committer's own kind of coordinator-log record (registered with
:func:`chandy.coordinator.records.register_record_kind`):

- ``lake-commits`` (:class:`LakeCommitRecord`, entity the table URI): the newest checkpoint whose
  ``LAKE_COMMITTED`` event was published, written in the same Kafka transaction as the event.

It folds as "latest per entity", which is what the compacted topic keeps. Importing this module
registers the kind.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from chandy.coordinator.records import LogRecordBase, register_record_kind

#: the key kind of :class:`LakeCommitRecord`
LAKE_COMMITS_KIND = "lake-commits"


@dataclasses.dataclass(frozen=True)
class LakeCommitRecord(LogRecordBase):
    """Checkpoint ``checkpoint_id`` of job ``job_id`` was announced as landed in ``table_uri`` at
    ``table_version`` (Delta version or Iceberg snapshot ID); ``timestamp`` in ms."""

    SCHEMA: ClassVar[str] = "chandy.v1.LakeCommitRecord"
    KIND: ClassVar[str] = LAKE_COMMITS_KIND

    job_id: str
    table_uri: str
    checkpoint_id: int
    table_version: int | None
    timestamp: int

    @property
    def entity_id(self) -> str:
        return self.table_uri


def _describe(r: LakeCommitRecord) -> dict[str, Any]:
    return {"event": "lake_committed", "checkpoint_id": r.checkpoint_id, "table_uri": r.table_uri,
            "table_version": r.table_version}


register_record_kind(LakeCommitRecord, describe=_describe)

"""Pieces shared by the integration tests and the processes they start and kill."""

from __future__ import annotations

import json


class RecordingHook:
    """A master hook whose data is {"checkpoint": id}; it records restores and resets."""

    def __init__(self, identifier: str = "recording-hook") -> None:
        self.identifier = identifier
        self.restored: list = []
        self.resets = 0

    def get_identifier(self) -> str:
        return self.identifier

    def trigger_checkpoint(self, checkpoint_id, timestamp, executor):
        return executor.submit(lambda: {"checkpoint": checkpoint_id})

    def restore_checkpoint(self, checkpoint_id, checkpoint_data) -> None:
        self.restored.append((checkpoint_id, checkpoint_data))

    def reset(self) -> None:
        self.resets += 1

    def close(self) -> None:
        pass

    def create_checkpoint_data_serializer(self):
        return self

    def get_version(self) -> int:
        return 1

    def serialize(self, obj) -> bytes:
        return json.dumps(obj).encode()

    def deserialize(self, version: int, serialized: bytes):
        return json.loads(serialized)

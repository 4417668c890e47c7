"""CheckpointListener: what is told when checkpoints complete or abort (Flink's CheckpointListener).

The Checkpoint Subsuming Contract: notifications are best effort and may be skipped, and
checkpoints overlap. ``notify_checkpoint_complete(N)`` therefore means "everything up to and
including checkpoint N is committed": an implementation commits all side effects of checkpoints
<= N that it has not committed yet, never only those of N. ``notify_checkpoint_aborted(N)`` does
not mean data is to be discarded: the next completed checkpoint covers the longer span.

Called on the coordinator's mailbox thread, after the completion (or abort) is durable in the
coordinator log. An exception is logged and does not revoke the checkpoint.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class CheckpointListener(Protocol):
    """Receives checkpoint completion and abort notifications (see the module docstring)."""

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed; under subsumption, so did all checkpoints below it."""
        ...

    def notify_checkpoint_aborted(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` was aborted (best effort; rarely needed)."""
        ...

"""Master hooks: Flink's MasterTriggerRestoreHook, and the versioned serializer of their data.

A hook is called by the checkpoint coordinator when a checkpoint is triggered (its data, via a
future, is stored in ``_metadata`` under the hook's identifier) and when a checkpoint is restored
(its data is given back). When a job restarts with no checkpoint at all, ``reset()`` is called
instead. Identifiers map data to hooks also when resuming a savepoint taken by another job, like
operator UIDs; registering a second hook with an identifier already in use is refused.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Iterable
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from chandy.coordinator.errors import ChandyError
from chandy.coordinator.storage import MasterState

log = logging.getLogger(__name__)

T = TypeVar("T")


class HookRestoreError(ChandyError):
    """A checkpoint holds hook state that no registered hook claims (and that is not allowed)."""


@runtime_checkable
class SimpleVersionedSerializer(Protocol[T]):
    """Flink's SimpleVersionedSerializer: bytes with a version, so the format can evolve."""

    def get_version(self) -> int:
        """The version written by :meth:`serialize`."""
        ...

    def serialize(self, obj: T) -> bytes:
        ...

    def deserialize(self, version: int, serialized: bytes) -> T:
        """Read ``serialized`` written with ``version`` (which may be older than the current)."""
        ...


@runtime_checkable
class MasterTriggerRestoreHook(Protocol, Generic[T]):
    """Flink's MasterTriggerRestoreHook<T>, in snake_case.

    Every method is called on the coordinator's mailbox thread; ``trigger_checkpoint`` must not
    block: it returns a future (or None for no data) and does slow work on ``executor``.
    """

    def get_identifier(self) -> str:
        """Unique identifier of this hook within the job; keys its data in ``_metadata``."""
        ...

    def trigger_checkpoint(
        self, checkpoint_id: int, timestamp: int, executor: concurrent.futures.Executor
    ) -> concurrent.futures.Future[T] | None:
        """Called when checkpoint ``checkpoint_id`` is triggered (``timestamp`` in ms).

        Returns a future of the data to store, or None. A failed future fails the checkpoint.
        """
        ...

    def restore_checkpoint(self, checkpoint_id: int, checkpoint_data: T | None) -> None:
        """Called when the job restores checkpoint ``checkpoint_id``; data may be None."""
        ...

    def reset(self) -> None:
        """Called when the job restarts without any checkpoint to restore."""
        ...

    def close(self) -> None:
        """Called when the job shuts down."""
        ...

    def create_checkpoint_data_serializer(self) -> SimpleVersionedSerializer[T] | None:
        """The serializer of this hook's data, or None when it stores none."""
        ...


class MasterHooks:
    """The registered hooks of one job, keyed by identifier (Flink's ``MasterHooks`` utilities)."""

    def __init__(self) -> None:
        self._hooks: dict[str, MasterTriggerRestoreHook[Any]] = {}

    def add(self, hook: MasterTriggerRestoreHook[Any]) -> bool:
        """Register ``hook``; returns False (and keeps the first) when the identifier is taken,
        as Flink's ``CheckpointCoordinator.addMasterHook``."""
        identifier = hook.get_identifier()
        if not identifier:
            raise ValueError("a master hook needs a non-empty identifier")
        if identifier in self._hooks:
            log.warning("master hook %r already registered; dropping the duplicate", identifier)
            return False
        self._hooks[identifier] = hook
        return True

    def __iter__(self):
        return iter(self._hooks.values())

    def __len__(self) -> int:
        return len(self._hooks)

    def trigger(self, checkpoint_id: int, timestamp: int, executor: concurrent.futures.Executor
                ) -> dict[str, concurrent.futures.Future[Any]]:
        """Trigger every hook; returns the futures of those that store data, by identifier.

        A hook that raises synchronously yields a failed future, which fails the checkpoint.
        """
        futures: dict[str, concurrent.futures.Future[Any]] = {}
        for identifier, hook in self._hooks.items():
            try:
                future = hook.trigger_checkpoint(checkpoint_id, timestamp, executor)
            except Exception as exc:  # noqa: BLE001 - a hook's failure fails this checkpoint only
                future = concurrent.futures.Future()
                future.set_exception(exc)
            if future is not None:
                futures[identifier] = future
        return futures

    def serialize(self, identifier: str, data: Any) -> MasterState | None:
        """``data`` of hook ``identifier`` as a :class:`MasterState`, or None when it keeps none."""
        serializer = self._hooks[identifier].create_checkpoint_data_serializer()
        if serializer is None or data is None:
            return None
        return MasterState(identifier, serializer.get_version(), serializer.serialize(data))

    def restore(self, checkpoint_id: int, states: Iterable[MasterState], *, allow_non_restored_state: bool = False) -> None:
        """Give each hook its data from a restored checkpoint (None when the checkpoint has none).

        Raises:
            HookRestoreError: state for an identifier no hook has, unless ``allow_non_restored_state``.
        """
        by_id = {s.identifier: s for s in states}
        unclaimed = sorted(set(by_id) - set(self._hooks))
        if unclaimed and not allow_non_restored_state:
            raise HookRestoreError(
                f"checkpoint {checkpoint_id} holds master hook state for {', '.join(unclaimed)} "
                "that no registered hook restores (allow non-restored state to skip it)"
            )
        for identifier, hook in self._hooks.items():
            state = by_id.get(identifier)
            data = None
            if state is not None:
                serializer = hook.create_checkpoint_data_serializer()
                if serializer is not None:
                    data = serializer.deserialize(state.version, state.data)
            hook.restore_checkpoint(checkpoint_id, data)

    def reset(self) -> None:
        """``reset()`` every hook: restart with no checkpoint."""
        for hook in self._hooks.values():
            hook.reset()

    def close(self) -> None:
        """``close()`` every hook, logging (not raising) failures."""
        for identifier, hook in self._hooks.items():
            try:
                hook.close()
            except Exception:
                log.exception("closing master hook %r failed", identifier)

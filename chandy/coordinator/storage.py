"""Checkpoint storage on any fsspec file system, laid out as Flink's AbstractFsCheckpointStorageAccess.

```
<base>/<job id>/chk-<N>/_metadata        a completed checkpoint's metadata (exclusive state beside it)
<base>/<job id>/shared/                  state shared between checkpoints
<base>/<job id>/taskowned/               state owned by the workers, not released by the coordinator
<savepoint dir>/savepoint-<job id[:6]>-<12 random hex>/_metadata
```

A checkpoint pointer is the URL of a checkpoint or savepoint directory, or of its ``_metadata``
file; :meth:`CheckpointStorage.resolve_checkpoint` accepts both. Locations are sent to workers
as *path references*: the magic bytes ``05 5F 3F 18`` followed by the UTF-8 path
(``encodePathAsReference``).

``_metadata`` is a versioned binary file, written once (never overwritten) and atomically:

```
magic "CHKM" (4 bytes) | format version (u32 BE) | body length (u64 BE) | body | CRC-32 of body (u32 BE)
```

The body is a single-object encoded ``chandy.v1.CheckpointMetadata`` Avro record. Any file that
is shorter, has another magic, another version, a wrong length or checksum, raises a
:class:`MetadataFormatError` naming the file.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import struct
import uuid
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import fsspec

from chandy.coordinator import serde
from chandy.coordinator.errors import ChandyError
from chandy.coordinator.filesystems import is_local, open_filesystem, to_url
from chandy.coordinator.messages import StateHandle
from chandy.schemas.codec import SingleObjectCodec, WireFormatError

log = logging.getLogger(__name__)

CHECKPOINT_DIR_PREFIX = "chk-"
CHECKPOINT_SHARED_STATE_DIR = "shared"
CHECKPOINT_TASK_OWNED_STATE_DIR = "taskowned"
METADATA_FILE_NAME = "_metadata"
SAVEPOINT_DIR_PREFIX = "savepoint-"

#: Magic number of a path reference (Flink's AbstractFsCheckpointStorageAccess.REFERENCE_MAGIC_NUMBER).
REFERENCE_MAGIC_NUMBER = b"\x05\x5f\x3f\x18"
#: Magic bytes and format version of ``_metadata`` files.
METADATA_MAGIC = b"CHKM"
METADATA_VERSION = 1
_HEADER = struct.Struct(">4sIQ")
_TRAILER = struct.Struct(">I")


class CheckpointStorageError(ChandyError):
    """Checkpoint storage could not be used (I/O, or a location that already exists)."""


class CheckpointPointerError(CheckpointStorageError):
    """A pointer does not resolve to a checkpoint or savepoint (missing directory or ``_metadata``)."""


class MetadataFormatError(CheckpointStorageError):
    """A ``_metadata`` file is truncated, corrupt, foreign or of an unknown version."""


class PathReferenceError(CheckpointStorageError):
    """Bytes that are not a path reference (wrong magic number)."""


# -- metadata ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class MasterState:
    """One master hook's checkpoint data, as written by its versioned serializer."""

    identifier: str
    version: int
    data: bytes


@dataclasses.dataclass(frozen=True)
class SubtaskState:
    """The state handles one subtask attempt acknowledged."""

    subtask_index: int
    attempt_number: int
    state_handles: tuple[StateHandle, ...] = ()


@dataclasses.dataclass(frozen=True)
class OperatorState:
    """An operator's coordinator state and its subtasks' state handles."""

    operator_id: str
    coordinator_state: bytes | None = None
    subtask_states: tuple[SubtaskState, ...] = ()


@dataclasses.dataclass(frozen=True)
class CheckpointMetadata:
    """What ``_metadata`` holds (Flink's CheckpointMetadata). Times in ms since the Unix epoch."""

    SCHEMA = "chandy.v1.CheckpointMetadata"

    job_id: str
    checkpoint_id: int
    checkpoint_type: str
    trigger_timestamp: int
    completion_timestamp: int
    master_states: tuple[MasterState, ...] = ()
    operator_states: tuple[OperatorState, ...] = ()
    properties: dict[str, str] = dataclasses.field(default_factory=dict)

    #: the ``properties`` key naming the coordinator log whose coordinator wrote this ``_metadata``
    #: (``CheckpointCoordinator.coordinator_log``: its transactional ID and the log's incarnation)
    COORDINATOR_LOG = "coordinator-log"

    @property
    def coordinator_log(self) -> str | None:
        """The coordinator log whose coordinator wrote this ``_metadata`` (None: not recorded, as
        before Chandy recorded it, or a runtime without a log)."""
        return self.properties.get(self.COORDINATOR_LOG) or None

    def operator(self, operator_id: str) -> OperatorState | None:
        """The state of ``operator_id``, or None."""
        return next((o for o in self.operator_states if o.operator_id == operator_id), None)

    @property
    def state_size(self) -> int:
        """Bytes of all state handles plus coordinator and master states."""
        size = sum(len(m.data) for m in self.master_states)
        for op in self.operator_states:
            size += len(op.coordinator_state or b"")
            size += sum(h.state_size for s in op.subtask_states for h in s.state_handles)
        return size


def serialize_metadata(metadata: CheckpointMetadata) -> bytes:
    """The bytes of a ``_metadata`` file (see the module docstring for the layout)."""
    body = SingleObjectCodec().encode(CheckpointMetadata.SCHEMA, serde.to_avro(metadata))
    return _HEADER.pack(METADATA_MAGIC, METADATA_VERSION, len(body)) + body + _TRAILER.pack(zlib.crc32(body))


def deserialize_metadata(data: bytes, where: str = "<bytes>") -> CheckpointMetadata:
    """Parse a ``_metadata`` file's bytes.

    Raises:
        MetadataFormatError: truncated, foreign magic, unknown version, bad length or checksum,
            or a body that does not decode; the message names ``where``.
    """
    if len(data) < _HEADER.size:
        raise MetadataFormatError(f"{where}: truncated _metadata ({len(data)} bytes, header needs {_HEADER.size})")
    magic, version, length = _HEADER.unpack_from(data)
    if magic != METADATA_MAGIC:
        raise MetadataFormatError(f"{where}: not a Chandy _metadata file (magic {magic.hex(' ')}, expected 43 48 4b 4d)")
    if version != METADATA_VERSION:
        raise MetadataFormatError(f"{where}: _metadata format version {version} is not supported (this Chandy reads {METADATA_VERSION})")
    end = _HEADER.size + length
    if len(data) < end + _TRAILER.size:
        raise MetadataFormatError(f"{where}: truncated _metadata ({len(data)} bytes of {end + _TRAILER.size})")
    if len(data) > end + _TRAILER.size:
        raise MetadataFormatError(f"{where}: {len(data) - end - _TRAILER.size} unexpected bytes after the _metadata body")
    body = data[_HEADER.size:end]
    (crc,) = _TRAILER.unpack_from(data, end)
    if zlib.crc32(body) != crc:
        raise MetadataFormatError(f"{where}: _metadata checksum mismatch (corrupt file)")
    try:
        return serde.from_avro(CheckpointMetadata, SingleObjectCodec().decode(body).value)
    except WireFormatError as exc:
        raise MetadataFormatError(f"{where}: _metadata body does not decode: {exc.problem}") from exc
    except (TypeError, ValueError, KeyError) as exc:
        raise MetadataFormatError(f"{where}: _metadata body is not a CheckpointMetadata: {exc}") from exc


# -- path references ---------------------------------------------------------------------------
def encode_path_as_reference(path: str) -> bytes:
    """``05 5F 3F 18`` + the UTF-8 path (Flink's ``encodePathAsReference``)."""
    return REFERENCE_MAGIC_NUMBER + path.encode("utf-8")


def decode_path_from_reference(reference: bytes) -> str:
    """The path inside a reference made by :func:`encode_path_as_reference`.

    Raises:
        PathReferenceError: the bytes do not start with the magic number, or hold no path.
    """
    if not reference.startswith(REFERENCE_MAGIC_NUMBER):
        raise PathReferenceError(f"not a path reference: starts with {reference[:4].hex(' ') or 'nothing'}, expected 05 5f 3f 18")
    if len(reference) == len(REFERENCE_MAGIC_NUMBER):
        raise PathReferenceError("path reference holds no path")
    try:
        return reference[len(REFERENCE_MAGIC_NUMBER):].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PathReferenceError(f"path reference is not UTF-8: {exc}") from exc


# -- locations -------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class CheckpointStorageLocation:
    """Where one checkpoint or savepoint writes: its directory and ``_metadata`` (URLs)."""

    checkpoint_id: int
    directory: str
    metadata_file: str
    is_savepoint: bool = False

    @property
    def reference(self) -> bytes:
        """The location as a path reference, as sent to workers in the trigger."""
        return encode_path_as_reference(self.directory)

    @property
    def external_pointer(self) -> str:
        """The pointer a user restores from: the directory URL."""
        return self.directory


def _join(*parts: str) -> str:
    return "/".join(p.rstrip("/") if i == 0 else p.strip("/") for i, p in enumerate(parts))


class CheckpointStorage:
    """One job's checkpoint storage (Flink's FsCheckpointStorageAccess) on fsspec.

    Args:
        checkpoint_dir: base URL (``state.checkpoints.dir``), e.g. ``file:///data/chk`` or ``s3://b/chk``.
        job_id: the job's ID; its checkpoints live under ``<checkpoint_dir>/<job_id>``.
        savepoint_dir: default savepoint URL (``state.savepoints.dir``), or None.
        storage_options: fsspec options for the file system, under fsspec's names; or a function
            that gives them, called at each file system use: credentials that a catalog vends
            with a table and renews (:meth:`~chandy.connectors.lake.sink.SchemaChecked.task_storage_options`).
    """

    def __init__(
        self,
        checkpoint_dir: str,
        job_id: str,
        *,
        savepoint_dir: str | None = None,
        storage_options: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        self.job_id = job_id
        self._storage_options = storage_options if callable(storage_options) else dict(storage_options or {})
        self.fs, base = open_filesystem(checkpoint_dir, self.storage_options)
        self.base_url = to_url(self.fs, base, like=checkpoint_dir)
        self.job_dir = _join(self.base_url, job_id)
        self.shared_dir = _join(self.job_dir, CHECKPOINT_SHARED_STATE_DIR)
        self.task_owned_dir = _join(self.job_dir, CHECKPOINT_TASK_OWNED_STATE_DIR)
        self.default_savepoint_dir = savepoint_dir

    @property
    def storage_options(self) -> dict[str, Any]:
        """The file system's options as they are now (see the class's ``storage_options``)."""
        given = self._storage_options
        return dict(given() if callable(given) else given)

    def _fs_for(self, url: str) -> tuple[fsspec.AbstractFileSystem, str]:
        return open_filesystem(url, self.storage_options)

    def initialize_base_locations(self) -> None:
        """Create ``<job>/shared`` and ``<job>/taskowned`` (Flink's initializeBaseLocationsForCheckpoint)."""
        for url in (self.shared_dir, self.task_owned_dir):
            fs, path = self._fs_for(url)
            fs.makedirs(path, exist_ok=True)

    def checkpoint_directory(self, checkpoint_id: int) -> str:
        """``<base>/<job id>/chk-<N>`` (Flink's createCheckpointDirectory)."""
        return _join(self.job_dir, f"{CHECKPOINT_DIR_PREFIX}{checkpoint_id}")

    def initialize_location_for_checkpoint(self, checkpoint_id: int) -> CheckpointStorageLocation:
        """Create and return checkpoint ``checkpoint_id``'s directory."""
        directory = self.checkpoint_directory(checkpoint_id)
        fs, path = self._fs_for(directory)
        fs.makedirs(path, exist_ok=True)
        return CheckpointStorageLocation(checkpoint_id, directory, _join(directory, METADATA_FILE_NAME))

    def initialize_location_for_savepoint(self, checkpoint_id: int, target: str | None = None) -> CheckpointStorageLocation:
        """Create ``<target or default savepoint dir>/savepoint-<job id[:6]>-<12 hex>``.

        Raises:
            CheckpointStorageError: no target and no default savepoint directory.
        """
        base = target or self.default_savepoint_dir
        if not base:
            raise CheckpointStorageError(
                "no savepoint target directory given and no default (state.savepoints.dir) configured"
            )
        fs, base_path = self._fs_for(base)
        for _ in range(10):  # the random part makes collisions unlikely; retry if one happens
            name = f"{SAVEPOINT_DIR_PREFIX}{self.job_id[:6]}-{secrets.token_hex(6)}"
            path = _join(base_path, name)
            if not fs.exists(path):
                fs.makedirs(path, exist_ok=False)
                directory = to_url(fs, path, like=base)
                return CheckpointStorageLocation(checkpoint_id, directory, _join(directory, METADATA_FILE_NAME), True)
        raise CheckpointStorageError(f"could not create a unique savepoint directory under {base}")

    def write_metadata(self, location: CheckpointStorageLocation, metadata: CheckpointMetadata) -> int:
        """Write ``_metadata`` once and atomically; returns its size in bytes.

        On a local file system the bytes go to a temporary file that is renamed into place; on
        object stores a single PUT is atomic by itself.

        Raises:
            CheckpointStorageError: ``_metadata`` already exists, or the write failed.
        """
        data = serialize_metadata(metadata)
        fs, path = self._fs_for(location.metadata_file)
        if fs.exists(path):
            raise CheckpointStorageError(f"{location.metadata_file} already exists; _metadata is written once")
        try:
            if is_local(fs):
                tmp = f"{path}.inprogress-{uuid.uuid4().hex}"
                fs.pipe_file(tmp, data)
                try:
                    os.link(tmp, path)  # atomic and exclusive: fails if another writer got there first
                except FileExistsError as exc:
                    raise CheckpointStorageError(f"{location.metadata_file} already exists; _metadata is written once") from exc
                finally:
                    os.unlink(tmp)
            else:
                fs.pipe_file(path, data)
        except OSError as exc:
            raise CheckpointStorageError(f"could not write {location.metadata_file}: {exc}") from exc
        return len(data)

    def resolve_checkpoint(self, pointer: str) -> tuple[str, CheckpointMetadata]:
        """Resolve a pointer (directory or ``_metadata`` URL) and read its metadata.

        Returns (the checkpoint directory URL, its metadata).

        Raises:
            CheckpointPointerError: nothing there, or a directory without ``_metadata``.
            MetadataFormatError: the ``_metadata`` file is not readable as such.
        """
        return resolve_checkpoint_pointer(pointer, self.storage_options)

    def dispose_location(self, directory: str, *, owner: str | None = None) -> bool:
        """Delete a checkpoint's directory and everything in it (a subsumed or aborted
        checkpoint); returns whether it did. With ``owner`` (the disposing coordinator's log,
        ``CheckpointMetadata.coordinator_log``), a directory whose ``_metadata`` names another
        coordinator log is kept: two logs of one job (two topic prefixes) or two incarnations of
        a lost log hand out the same checkpoint IDs into this directory, and the other log's
        completed checkpoint N must survive this log's abort of its own N (found by the
        commit-protocol simulation, issue 54: seed 1008235 of cdc-two-logs-faults)."""
        fs, path = self._fs_for(directory)
        if not fs.exists(path):
            return False
        if owner is not None:
            metadata_path = _join(path, METADATA_FILE_NAME)
            try:
                written_by = deserialize_metadata(fs.cat_file(metadata_path), metadata_path).coordinator_log
            except (FileNotFoundError, MetadataFormatError):
                written_by = None  # none yet, or unreadable: this coordinator's to dispose
            if written_by is not None and written_by != owner:
                log.warning("not deleting %s: its _metadata was written by coordinator log %s, not by this one (%s)",
                            directory, written_by, owner)
                return False
        fs.rm(path, recursive=True)
        return True


def resolve_checkpoint_pointer(pointer: str, storage_options: dict[str, Any] | None = None) -> tuple[str, CheckpointMetadata]:
    """Flink's ``resolveCheckpointPointer``: a directory or ``_metadata`` URL to (directory, metadata).

    Raises:
        CheckpointPointerError: empty pointer, nothing there, or a directory without ``_metadata``.
        MetadataFormatError: the ``_metadata`` file is not readable as such.
    """
    if not pointer or not pointer.strip():
        raise CheckpointPointerError("empty checkpoint pointer")
    fs, path = open_filesystem(pointer, storage_options)
    path = path.rstrip("/")
    if not fs.exists(path):
        raise CheckpointPointerError(f"checkpoint pointer {pointer} does not exist")
    if fs.isdir(path):
        directory, metadata_path = path, f"{path}/{METADATA_FILE_NAME}"
        if not fs.exists(metadata_path):
            raise CheckpointPointerError(
                f"{pointer} is a directory without {METADATA_FILE_NAME}: not a completed checkpoint or savepoint"
            )
    else:
        metadata_path = path
        directory = path.rsplit("/", 1)[0]
        if not path.endswith("/" + METADATA_FILE_NAME) and path != METADATA_FILE_NAME:
            raise CheckpointPointerError(f"{pointer} is a file, but not a {METADATA_FILE_NAME} file")
    where = to_url(fs, metadata_path, like=pointer)
    return to_url(fs, directory, like=pointer), deserialize_metadata(fs.cat_file(metadata_path), where)

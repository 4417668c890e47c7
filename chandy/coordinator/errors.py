"""The root of Chandy's typed errors, re-exported for the coordinator and the layers above
(defined in :mod:`chandy.schemas.errors`, the lowest layer, so the wire format's errors share it)."""

from chandy.schemas.errors import ChandyError

__all__ = ["ChandyError", "SuppressRestartsError"]


class SuppressRestartsError(ChandyError):
    """A failure a restart would meet again (Flink's ``SuppressRestartsException``): a schema that
    does not fit the table, a table that disagrees with the checkpoint about what landed. It fails
    the job at once, whatever its restart strategy."""

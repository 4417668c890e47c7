"""The root of Chandy's typed errors, re-exported for the coordinator and the layers above
(defined in :mod:`chandy.schemas.errors`, the lowest layer, so the wire format's errors share it)."""

from chandy.schemas.errors import ChandyError

__all__ = ["ChandyError"]

"""The root of Chandy's typed errors, in the lowest layer so that every layer can derive from it.

Every error Chandy raises on purpose derives from :class:`ChandyError`, so a caller can catch
all of them in one place (the CLI turns them into a one-line message and exit code 2) while each
package keeps its own, more precise subclasses (``schemas.codec.WireFormatError``,
``chandy.coordinator.failure.CheckpointException``, ``chandy.connectors.spark.options.PipelineError``, ...).
"""


class ChandyError(Exception):
    """Base class of every error Chandy raises on purpose."""

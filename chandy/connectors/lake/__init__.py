"""Lake sinks and the lake committer. Delta Lake (deltalake / delta-rs) is the default,
Apache Iceberg (pyiceberg) for ``iceberg://`` URIs; a sink is anything with the methods of
:class:`chandy.connectors.lake.tables.LakeSink` (see :func:`chandy.connectors.lake.tables.open_sink`)."""

# importing the package registers the lake committer's log-record kind with the coordinator's log
from chandy.connectors.lake import log_records

__all__ = ["log_records"]

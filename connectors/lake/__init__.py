"""Lake sinks and the lake committer. Delta Lake (deltalake / delta-rs) is the default; a sink
is anything with the methods of :class:`connectors.lake.delta.DeltaLakeSink`."""

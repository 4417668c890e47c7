"""Chandy's connectors: Apache Kafka (embedded broker, clients, topics, source coordinator),
the Spark pipeline and the lake sinks."""

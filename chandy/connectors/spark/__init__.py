"""Chandy on Apache Spark: Python data sources for offset ranges and lake files, and the
exactly-once Kafka-to-lake pipeline built on them."""

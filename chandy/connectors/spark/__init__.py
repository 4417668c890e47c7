"""Chandy on Apache Spark: Python data sources for offset ranges and lake files, and the
exactly-once Kafka-to-lake pipeline built on them: its driver (:mod:`~chandy.connectors.spark.driver`)
and its tasks (:mod:`~chandy.connectors.spark.task`)."""

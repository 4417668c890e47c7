"""Apache Kafka for Chandy: the embedded broker, client configuration and topic management."""

"""Shared fixtures: the real Kafka broker fixture lives in the package (connectors.kafka.testing)."""

pytest_plugins = ["connectors.kafka.testing"]

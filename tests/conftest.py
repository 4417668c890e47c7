"""Shared fixtures, from tests/fixtures/: the real Kafka broker (tests.fixtures.kafka), a real Schema
Registry (tests.fixtures.schema_registry), an Iceberg REST catalog (tests.fixtures.iceberg_rest)."""

pytest_plugins = ["tests.fixtures.kafka", "tests.fixtures.lake_pipeline", "tests.fixtures.object_store", "tests.fixtures.pipeline",
                  "tests.fixtures.schema_registry", "tests.fixtures.spark_connect", "tests.fixtures.iceberg_rest"]

"""Shared fixtures, from tests/fixtures/: the real Kafka broker (tests.fixtures.kafka)."""

pytest_plugins = ["tests.fixtures.kafka", "tests.fixtures.lake_pipeline", "tests.fixtures.object_store", "tests.fixtures.pipeline"]

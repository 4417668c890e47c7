"""Shared fixtures, from tests/fixtures/: the real Kafka broker (tests.fixtures.kafka), a real Schema
Registry (tests.fixtures.schema_registry), an Iceberg REST catalog (tests.fixtures.iceberg_rest).

Every Spark driver JVM the tests start (in this process or in a pipeline process a test runs) maps
its classes from the class-data archive ``make test`` builds (tests.fixtures.spark_jvm), when it exists."""

import os

from tests.fixtures import spark_jvm

os.environ["SPARK_SUBMIT_OPTS"] = f"{os.environ.get('SPARK_SUBMIT_OPTS', '')} {spark_jvm.java_options()}".strip()

pytest_plugins = ["tests.fixtures.kafka", "tests.fixtures.lake_pipeline", "tests.fixtures.object_store", "tests.fixtures.pipeline",
                  "tests.fixtures.schema_registry", "tests.fixtures.spark_connect", "tests.fixtures.iceberg_rest",
                  "tests.fixtures.catalog_proxy"]

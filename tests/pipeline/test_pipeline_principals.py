"""Without a server: which settings each Kafka client of a pipeline gets. The driver (the
coordinator, its enumerator and offset commits) connects with ``-X`` (producers included), the
Spark tasks (source reads, acks) as the worker principal of ``--worker-property``, with none of
the driver's credentials; without ``--worker-property`` the tasks use the driver's settings."""

from __future__ import annotations

from chandy.connectors.spark.options import PipelineOptions
from chandy.coordinator.kafka import config as kafka_config

DRIVER = {**kafka_config.sasl_settings("coordinator", "c-pw", protocol="SASL_SSL"), "ssl.ca.location": "/ca.pem",
          "fetch.wait.max.ms": 20}


def _options(**extra) -> PipelineOptions:
    return PipelineOptions(table_uri="/tmp/t", bootstrap_servers="b:9092", topics=("orders",),
                           consumer_overrides=DRIVER, **extra)


def test_the_tasks_act_as_the_worker_and_carry_none_of_the_coordinators_credentials() -> None:
    options = _options(producer_overrides={"linger.ms": 5},
                       worker_overrides={"sasl.username": "worker", "sasl.password": "w-pw"})
    # the driver: -X for its consumers, and the same principal for its producers
    assert options.driver_producer_overrides == {**kafka_config.security_settings(DRIVER), "linger.ms": 5}
    for tasks in (options.task_consumer_overrides, options.task_producer_overrides):
        assert tasks["sasl.username"] == "worker" and tasks["sasl.password"] == "w-pw"
        assert tasks["security.protocol"] == "SASL_SSL" and tasks["ssl.ca.location"] == "/ca.pem"
        assert "c-pw" not in tasks.values()
    assert options.task_consumer_overrides["fetch.wait.max.ms"] == 20
    assert options.task_producer_overrides["linger.ms"] == 5


def test_without_a_worker_principal_the_tasks_use_the_drivers_settings() -> None:
    options = _options()
    assert options.task_consumer_overrides == DRIVER
    assert options.task_producer_overrides == options.driver_producer_overrides == kafka_config.security_settings(DRIVER)

"""No Docker engine runs here: the compose file must at least parse and name its services."""


import yaml

from tests.fixtures import REPO_ROOT

ROOT = REPO_ROOT


def test_compose_file_parses_with_kafka_spark_and_chandy() -> None:
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    assert {"kafka", "spark-master", "spark-worker", "chandy"} <= set(compose["services"])
    assert compose["services"]["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert (ROOT / "docker" / "Dockerfile").read_text().startswith("# Chandy")

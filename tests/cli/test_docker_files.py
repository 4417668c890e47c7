"""No Docker engine runs here: the compose file must at least parse and name its services."""


import yaml

from tests.fixtures import REPO_ROOT

ROOT = REPO_ROOT


def test_compose_file_parses_with_kafka_spark_and_chandy() -> None:
    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    assert {"kafka", "spark-master", "spark-worker", "chandy"} <= set(compose["services"])
    assert compose["services"]["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert (ROOT / "docker" / "Dockerfile").read_text().startswith("# Chandy")


def test_compose_adds_prometheus_scraping_chandy_and_grafana_with_the_dashboard() -> None:
    import json

    compose = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())
    assert {"prometheus", "grafana"} <= set(compose["services"])
    scrape = yaml.safe_load((ROOT / "docker" / "prometheus" / "prometheus.yml").read_text())
    assert scrape["scrape_configs"][0]["static_configs"][0]["targets"] == ["chandy:9249"]
    dashboard = json.loads((ROOT / "docker" / "grafana" / "dashboards" / "chandy.json").read_text())
    assert all(t["expr"].count("flink_") >= 1 for p in dashboard["panels"] for t in p["targets"])


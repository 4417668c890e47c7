"""One definition per pipeline setting (issue 26): ``chandy pipeline run``'s options are derived
from :class:`PipelineOptions`' fields (their :class:`Flag`), so a command line and the options it
gives cannot drift apart. Without servers: click parses, nothing runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click
import pytest

from chandy.cli.app import main
from chandy.cli.pipeline import options_from_cli
from chandy.connectors.spark.options import PipelineOptions, cli_flags


def _parse(args: list[str]) -> tuple[PipelineOptions, dict]:
    command = main.commands["pipeline"].commands["run"]
    context = command.make_context("run", args)
    values = dict(context.params)
    extra = {k: values.pop(k) for k in ("bootstrap_servers", "data_dir", "verify", "schema_registry_url")}
    if extra["schema_registry_url"]:
        values["schema_registry"] = (*values["schema_registry"], f"url={extra['schema_registry_url']}")
    return options_from_cli(values, extra["bootstrap_servers"]), extra


def test_every_setting_but_the_resolved_bootstrap_is_a_cli_option_defined_once() -> None:
    flagged = {f.name for f, _ in cli_flags()}
    assert {f.name for f in dataclasses.fields(PipelineOptions)} - flagged == {
        "bootstrap_servers", "restart_backoff_initial_ms", "restart_backoff_max_ms"}
    spellings = [d.split("/")[0] for _, flag in cli_flags() for d in flag.decls]
    assert len(spellings) == len(set(spellings))


def test_defaults_on_the_command_line_are_the_dataclass_defaults(tmp_path: Path) -> None:
    options, _ = _parse(["--table", str(tmp_path / "t"), "--topic", "orders", "-b", "k:9092"])
    assert options == PipelineOptions(table_uri=str(tmp_path / "t"), bootstrap_servers="k:9092", topics=("orders",))


def test_a_command_line_becomes_the_options_it_spells(tmp_path: Path) -> None:
    schema = tmp_path / "schema.avsc"
    schema.write_text('{"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}')
    options, extra = _parse([
        "--table", str(tmp_path / "t"), "--topic", "a", "--topic", "b", "-b", "k:9092", "--checkpoint-interval", "250",
        "-X", "fetch.min.bytes=1", "-X", "client.id=x", "--conf", "spark.ui.enabled=false", "--value-format", "avro",
        "--value-schema", f"@{schema}", "--avro-framing", "confluent", "--schema-registry-property", "a=b",
        "--schema-registry-url", "http://r:8081", "--no-schema-evolution", "--standby", "--partition-by", "topic",
        "--write-buffer-bytes", "1024", "--kafka-retry-timeout", "5000", "--verify", "--ship-code"])
    assert extra["verify"] is True
    assert options.topics == ("a", "b") and options.checkpoint_interval_ms == 250
    assert dict(options.consumer_overrides) == {"fetch.min.bytes": "1", "client.id": "x"}
    assert dict(options.spark_conf) == {"spark.ui.enabled": "false"}
    assert options.value_schema == schema.read_text() and options.avro_framing == "confluent"
    assert dict(options.schema_registry) == {"a": "b", "url": "http://r:8081"}
    assert options.schema_evolution is False and options.standby is True and options.ship_code is True
    assert options.partition_by == ("topic",) and options.write_buffer_bytes == 1024
    assert options.kafka_retry_timeout_ms == 5000


def test_bounds_and_choices_come_from_the_field() -> None:
    command = main.commands["pipeline"].commands["run"]
    for args, wrong in ((["--checkpoint-timeout", "0"], "--checkpoint-timeout"), (["--tombstones", "maybe"], "--tombstones")):
        try:
            command.make_context("run", ["--table", "t", "--topic", "a", *args])
        except click.BadParameter as exc:
            assert wrong in exc.format_message() or wrong in str(exc.param_hint or exc.param.opts)
        else:
            raise AssertionError(f"{args} was accepted")


def test_a_registry_url_implies_confluent_framing_and_no_value_schema(monkeypatch, tmp_path: Path) -> None:
    """Issue 45: `--value-format avro --schema-registry-url URL` alone is a complete command line
    (the registry's framing, the subject's latest version as the table's schema); an explicit
    --avro-framing still wins, and --value-subject without a registry is refused."""
    from click.testing import CliRunner

    import chandy.cli.pipeline as cli

    ran: list[PipelineOptions] = []
    monkeypatch.setattr(cli, "run_pipeline_with_progress", lambda options, verify: ran.append(options))
    base = ["pipeline", "run", "--table", str(tmp_path / "t"), "--topic", "orders", "-b", "k:9092", "--value-format", "avro"]
    result = CliRunner().invoke(main, [*base, "--schema-registry-url", "http://r:8081", "--value-subject", "com.acme.Order"])
    assert result.exit_code == 0, result.output
    assert ran[-1].avro_framing == "confluent" and ran[-1].value_schema is None
    assert ran[-1].resolved_value_subject == "com.acme.Order" and dict(ran[-1].schema_registry) == {"url": "http://r:8081"}
    result = CliRunner().invoke(main, [*base, "--schema-registry-url", "http://r:8081", "--avro-framing", "raw"])
    assert result.exit_code != 0 and "needs --value-format avro --avro-framing confluent" in result.output
    result = CliRunner().invoke(main, [*base, "--value-subject", "x"])
    assert result.exit_code != 0 and "Avro values need a value schema (--value-schema) or a Schema Registry" in result.output
    schema = '{"type": "record", "name": "R", "fields": [{"name": "a", "type": "long"}]}'
    result = CliRunner().invoke(main, [*base, "--value-schema", schema, "--value-subject", "x", "--schema-registry-url", "u"])
    assert result.exit_code != 0 and "--value-subject names the Schema Registry subject" in result.output
    defaults = PipelineOptions(table_uri="t", bootstrap_servers="k:1", topics=("orders",), value_format="avro",
                               avro_framing="confluent", schema_registry={"url": "http://r:8081"})
    assert defaults.resolved_value_subject == "orders-value"  # TopicNameStrategy


def test_routing_by_record_name_and_keys_as_columns_from_the_command_line(tmp_path: Path) -> None:
    """Issue 45's options: --route-by record-name, --key-format avro, a registry URL, several
    topics without --value-subject."""
    options, _ = _parse(["--table", str(tmp_path / "t"), "--topic", "a", "--topic", "b", "-b", "k:9092",
                         "--value-format", "avro", "--key-format", "avro", "--schema-registry-url", "http://r:8081",
                         "--avro-framing", "confluent",
                         "--route-by", "record-name", "--route", r"com\.acme\.(\w+)=lake/$1"])
    assert (options.route_by, options.key_format, options.avro_framing) == ("record-name", "avro", "confluent")
    assert options.routes == (r"com\.acme\.(\w+)=lake/$1",) and options.routes_per_subject
    assert options.schema_registry == {"url": "http://r:8081"}


def test_maintenance_under_the_issue_trackers_names_is_the_same_setting(tmp_path: Path) -> None:
    """Iceberg users' ``--expire-snapshots-every N --retain-last M`` and Delta users'
    ``--vacuum-every N --retention-hours H`` spell the same settings as ``--vacuum-every`` and
    ``--vacuum-retention-hours`` (one definition, several names)."""
    table = ["--table", str(tmp_path / "t"), "--topic", "orders", "-b", "k:9092"]
    iceberg, _ = _parse([*table, "--expire-snapshots-every", "5", "--retain-last", "3"])
    assert (iceberg.vacuum_every, iceberg.vacuum_retain_last) == (5, 3)
    delta, _ = _parse([*table, "--vacuum-every", "7", "--retention-hours", "24"])
    assert (delta.vacuum_every, delta.vacuum_retention_hours, delta.vacuum_retain_last) == (7, 24.0, 1)
    with pytest.raises(click.BadParameter, match="0 is not in the range x>=1"):
        _parse([*table, "--retain-last", "0"])

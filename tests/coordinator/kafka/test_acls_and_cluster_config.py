"""Without a server: the minimal ACLs of ``chandy topics acls`` (who may do what on which topic,
a pipeline's source, group and dead-letter topics included), principal spelling, a client's
settings as another principal, and the configuration the embedded broker writes for a three-node cluster,
for SASL/SCRAM with StandardAuthorizer and for TLS; security settings pass under librdkafka's names."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AclOperation, ResourcePatternType, ResourceType

from chandy.broker import BrokerStartError, EmbeddedKafkaBroker, KafkaLauncherError
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.acls import AclError, chandy_acls, principal
from chandy.coordinator.kafka.topics import ChandyTopics, default_replication_factor


def _grants(acls, who: str) -> set[tuple[str, str, str]]:
    return {(a.resource_type.name, a.name, a.operation.name) for a in acls if a.principal == who}


def test_only_the_coordinator_writes_control_log_and_events() -> None:
    topics = ChandyTopics("p")
    acls = chandy_acls(topics, coordinator="coord", workers=["w1", "User:w2"], readers=["r"])
    writers = {(a.name, a.principal) for a in acls if a.operation == AclOperation.WRITE}
    for name in (topics.control, topics.coordinator_log, topics.checkpoint_events):
        assert {who for n, who in writers if n == name} == {"User:coord"}, name
    assert {who for n, who in writers if n == topics.acks} == {"User:w1", "User:w2"}
    assert ("TRANSACTIONAL_ID", "p-coordinator-", "WRITE") in _grants(acls, "User:coord")
    txn = [a for a in acls if a.resource_type == ResourceType.TRANSACTIONAL_ID]
    assert [a.pattern for a in txn] == [ResourcePatternType.PREFIXED] and txn[0].principal == "User:coord"


def test_workers_and_readers_get_exactly_what_they_use() -> None:
    topics = ChandyTopics("p")
    acls = chandy_acls(topics, workers=["w"], readers=["r"], reader_group_prefix="dash-")
    assert _grants(acls, "User:w") == {("TOPIC", "p.acks", "WRITE"), ("TOPIC", "p.control", "READ"),
                                       ("GROUP", "chandy-unmanaged", "DESCRIBE")}
    assert _grants(acls, "User:r") == {("TOPIC", "p.checkpoint-events", "READ"), ("GROUP", "dash-", "READ")}
    assert all(a.binding().principal.startswith("User:") for a in acls)


def test_a_pipelines_source_group_and_dead_letters() -> None:
    topics = ChandyTopics("p")
    base = chandy_acls(topics, coordinator="c", workers=["w"])
    acls = chandy_acls(topics, coordinator="c", workers=["w"], source_topics=["orders", "refunds", "orders"],
                       group="landing", dead_letter_topics=["orders-dlq"])
    # only the pipeline's rows are added, each once
    assert _grants(acls, "User:c") - _grants(base, "User:c") == {
        ("TOPIC", "orders", "READ"), ("TOPIC", "refunds", "READ"),  # the enumerator: offsets, offset commits
        ("GROUP", "landing", "READ"),  # commit.offsets.on.checkpoint
        ("TOPIC", "orders-dlq", "WRITE")}  # bad records, in the completion transaction
    assert _grants(acls, "User:w") - _grants(base, "User:w") == {("TOPIC", "orders", "READ"), ("TOPIC", "refunds", "READ")}
    assert len(acls) == len({a.binding() for a in acls})
    pipeline_rows = [a for a in acls if a.name in ("orders", "refunds", "landing", "orders-dlq")]
    assert {a.pattern for a in pipeline_rows} == {ResourcePatternType.LITERAL}
    # the workers (Spark tasks) never write the dead-letter topic nor touch the group
    assert not [a for a in acls if a.principal == "User:w" and a.name in ("landing", "orders-dlq")]
    # assign-only consumers' throwaway group: DESCRIBE (FindCoordinator) only, for both
    unmanaged = [a for a in acls if a.name == kafka_config.UNMANAGED_GROUP]
    assert {(a.principal, a.operation) for a in unmanaged} == {("User:c", AclOperation.DESCRIBE),
                                                               ("User:w", AclOperation.DESCRIBE)}
    # the chandy topics' rows are unchanged by the pipeline's
    assert [a for a in acls if a.name.startswith("p.") or a.name.startswith("p-")] == \
        [a for a in base if a.name.startswith("p.") or a.name.startswith("p-")]


def test_a_pipelines_resources_need_their_principals() -> None:
    topics = ChandyTopics("p")
    with pytest.raises(AclError, match="coordinator"):
        chandy_acls(topics, workers=["w"], group="landing")
    with pytest.raises(AclError, match="coordinator"):
        chandy_acls(topics, workers=["w"], dead_letter_topics=["dlq"])
    with pytest.raises(AclError, match="at least one"):
        chandy_acls(topics, readers=["r"], source_topics=["orders"])
    for bad in ({"source_topics": [""]}, {"group": " "}, {"dead_letter_topics": ["dlq", ""]}):
        with pytest.raises(AclError, match="must not be empty"):
            chandy_acls(topics, coordinator="c", workers=["w"], **bad)
    # workers alone may be given their source topics (e.g. applied separately from the coordinator)
    assert _grants(chandy_acls(topics, workers=["w"], source_topics=["orders"]), "User:w") >= {("TOPIC", "orders", "READ")}


def test_principals() -> None:
    assert principal("alice") == "User:alice"
    assert principal("User:alice") == "User:alice"
    for bad in ("", "  ", "User:", ":alice"):
        with pytest.raises(AclError):
            principal(bad)


def test_security_settings_keep_librdkafka_names() -> None:
    settings = {**kafka_config.sasl_settings("w", "pw"), "ssl.ca.location": "/ca.pem", "linger.ms": 5,
                "isolation.level": "read_committed"}
    assert kafka_config.security_settings(settings) == {
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "w",
        "sasl.password": "pw", "ssl.ca.location": "/ca.pem"}
    assert kafka_config.security_settings(None) == {}


def test_a_client_as_another_principal_keeps_none_of_the_first_ones_credentials() -> None:
    driver = {**kafka_config.sasl_settings("coordinator", "c-pw", protocol="SASL_SSL"), "ssl.ca.location": "/ca.pem",
              "fetch.max.bytes": 1000, "ssl.key.location": "/coordinator.key", "sasl.oauthbearer.client.secret": "s"}
    worker = kafka_config.as_principal(driver, {"sasl.username": "worker", "sasl.password": "w-pw"})
    assert worker == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "ssl.ca.location": "/ca.pem",
                      "fetch.max.bytes": 1000, "sasl.username": "worker", "sasl.password": "w-pw"}
    # settings without credentials are the same principal, laid over the first
    assert kafka_config.as_principal(driver, {"fetch.max.bytes": 5}) == {**driver, "fetch.max.bytes": 5}
    assert kafka_config.as_principal(driver, None) == driver
    # credentials given once (-X) reach a producer; its own settings win
    assert kafka_config.with_security_of(driver, {"linger.ms": 5, "sasl.username": "other"}) == {
        **kafka_config.security_settings(driver), "linger.ms": 5, "sasl.username": "other"}


def test_replication_follows_the_cluster() -> None:
    assert [default_replication_factor(n) for n in (1, 2, 3, 5)] == [1, 1, 3, 3]
    specs = ChandyTopics("p").specs(replication_factor=3)
    assert {s.config["min.insync.replicas"] for s in specs} == {"2"}


def _properties(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if line)


def test_three_node_cluster_configuration(tmp_path: Path) -> None:
    broker = EmbeddedKafkaBroker(tmp_path, nodes=3)
    ports = {1: (9001, 9101), 2: (9002, 9102), 3: (9003, 9103)}
    props = [_properties(broker._write_server_properties(n, ports, {})) for n in (1, 2, 3)]
    assert [p["node.id"] for p in props] == ["1", "2", "3"]
    assert {p["controller.quorum.voters"] for p in props} == {"1@127.0.0.1:9101,2@127.0.0.1:9102,3@127.0.0.1:9103"}
    assert props[1]["listeners"] == "PLAINTEXT://127.0.0.1:9002,CONTROLLER://127.0.0.1:9102"
    assert props[2]["log.dirs"] == str(tmp_path / "node-3" / "kraft")
    for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor", "default.replication.factor"):
        assert props[0][key] == "3"
    assert props[0]["transaction.state.log.min.isr"] == props[0]["min.insync.replicas"] == "2"


def test_sasl_scram_configuration(tmp_path: Path) -> None:
    broker = EmbeddedKafkaBroker(tmp_path, security="sasl-scram", scram_users={"worker": "pw"})
    credentials = broker._credentials()
    props = _properties(broker._write_server_properties(1, {1: (9001, 9101)}, credentials))
    assert props["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert props["super.users"] == "User:admin"
    assert props["allow.everyone.if.no.acl.found"] == "false"
    assert props["listeners"].startswith("SASL_PLAINTEXT://127.0.0.1:9001")
    assert props["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert credentials["worker"] == "pw" and len(credentials["admin"]) >= 16
    assert (tmp_path / "credentials.json").stat().st_mode & 0o077 == 0
    assert broker._client_settings(credentials)["sasl.username"] == "admin"


def test_bad_arguments_are_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(KafkaLauncherError, match="at least one node"):
        EmbeddedKafkaBroker(tmp_path, nodes=0)
    with pytest.raises(KafkaLauncherError, match="unknown security"):
        EmbeddedKafkaBroker(tmp_path, security="kerberos")
    with pytest.raises(KafkaLauncherError, match="--add-scram"):
        EmbeddedKafkaBroker(tmp_path, security="sasl-scram", scram_users={"w": "a,b"})
    with pytest.raises(KafkaLauncherError, match="need --security sasl-scram"):
        EmbeddedKafkaBroker(tmp_path, scram_users={"w": "pw"})


def test_a_data_directory_keeps_what_it_was_made_with(tmp_path: Path) -> None:
    (tmp_path / "layout.json").write_text('{"nodes": 3, "security": "sasl-scram", "tls": true}')
    again = EmbeddedKafkaBroker(tmp_path)  # `chandy kafka up` without arguments
    assert (again.nodes, again.security, again.tls) == (3, "sasl-scram", True)
    # restarting it without authentication is refused before anything starts
    with pytest.raises(BrokerStartError, match="security=sasl-scram"):
        EmbeddedKafkaBroker(tmp_path, security="none").up()
    with pytest.raises(BrokerStartError, match="nodes=3"):
        EmbeddedKafkaBroker(tmp_path, nodes=1).up()

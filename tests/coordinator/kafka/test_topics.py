"""Chandy's topics against a real broker: created with explicit settings, and a coordinator log
that is not compacted is an error."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import ConfigResource, NewTopic

from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.topics import ChandyTopics, TopicError, check_topics, ensure_topics

pytestmark = pytest.mark.integration


def _configs(admin, name: str) -> dict[str, str]:
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    return {k: v.value for k, v in admin.describe_configs([resource])[resource].result().items()}


def test_ensure_creates_the_five_topics_with_explicit_settings(kafka_bootstrap_servers: str, topic_prefix: str) -> None:
    admin = kafka_config.admin_client(kafka_bootstrap_servers)
    topics = ChandyTopics(topic_prefix)
    created = ensure_topics(admin, topics, partitions=3)
    assert sorted(created) == sorted([topics.control, topics.acks, topics.coordinator_log, topics.checkpoint_events,
                                      topics.requests])
    log = _configs(admin, topics.coordinator_log)
    assert log["cleanup.policy"] == "compact"
    # issue 35: the history a replay can show exactly is the events topic's 7 days
    assert log["min.compaction.lag.ms"] == log["delete.retention.ms"] == str(7 * 24 * 3600 * 1000)
    from chandy.coordinator.kafka.topics import log_history_settings

    settings = log_history_settings(admin, topics.coordinator_log)
    assert settings.min_compaction_lag_ms == 7 * 24 * 3600 * 1000 and settings.segment_ms == 3600 * 1000
    assert "min.compaction.lag.ms=604800000 (7 d: records younger are never compacted)" in settings.describe()
    assert _configs(admin, topics.control)["cleanup.policy"] == "delete"
    assert len(admin.list_topics(timeout=10).topics[topics.acks].partitions) == 3
    # the requests topic has one partition whatever the others have: its owner leads the job
    assert len(admin.list_topics(timeout=10).topics[topics.requests].partitions) == 1
    assert _configs(admin, topics.requests)["cleanup.policy"] == "delete"
    # a second call finds them all and creates nothing
    assert ensure_topics(admin, topics) == []


def test_a_coordinator_log_without_compaction_is_an_error(kafka_bootstrap_servers: str, topic_prefix: str) -> None:
    admin = kafka_config.admin_client(kafka_bootstrap_servers)
    topics = ChandyTopics(topic_prefix)
    admin.create_topics([NewTopic(topics.coordinator_log, 1, 1, config={"cleanup.policy": "delete"})])[
        topics.coordinator_log
    ].result()
    with pytest.raises(TopicError, match=rf"{topics.coordinator_log} has cleanup.policy=delete.*compact"):
        ensure_topics(admin, topics)


def test_missing_topics_are_named(kafka_bootstrap_servers: str, topic_prefix: str) -> None:
    admin = kafka_config.admin_client(kafka_bootstrap_servers)
    with pytest.raises(TopicError, match=rf"missing Chandy topics: {topic_prefix}\.acks"):
        check_topics(admin, ChandyTopics(topic_prefix))


def test_a_log_deleted_and_created_again_is_another_incarnation(kafka_bootstrap_servers: str, topic_prefix: str) -> None:
    """The coordinator log's incarnation is its Kafka topic ID (KIP-516): the same topic described
    twice has one ID; deleted and created again under its name, another, and a start that began
    on the old one (``check_same_incarnation``) refuses to go on; a topic that does not exist is a
    TopicError naming it."""
    import re
    import time

    from chandy.coordinator.kafka.topics import LogReplacedError, check_same_incarnation, log_incarnation
    from tests.fixtures.kafka import create_again

    admin = kafka_config.admin_client(kafka_bootstrap_servers)
    topics = ChandyTopics(topic_prefix)
    ensure_topics(admin, topics, log_partitions=3)
    first = log_incarnation(admin, topics.coordinator_log, timeout_s=30)
    assert first.partitions == 3 and first.topic_id and first == log_incarnation(admin, topics.coordinator_log)
    check_same_incarnation(admin, topics.coordinator_log, first)  # unchanged: no error

    missing = f"{topic_prefix}.no-such-topic"
    with pytest.raises(TopicError, match=rf"describing topic {re.escape(missing)} \(its ID and partitions\) failed"):
        log_incarnation(admin, missing, timeout_s=2)

    admin.delete_topics([topics.coordinator_log], operation_timeout=30)[topics.coordinator_log].result()
    create_again(admin, topics.coordinator_log, 1)
    deadline = time.monotonic() + 60
    second = log_incarnation(admin, topics.coordinator_log, timeout_s=30)
    while second.partitions != 1 and time.monotonic() < deadline:  # the new topic's metadata spreads
        time.sleep(0.2)
        second = log_incarnation(admin, topics.coordinator_log, timeout_s=30)
    assert second.topic_id != first.topic_id and second.partitions == 1
    with pytest.raises(LogReplacedError, match=re.escape(f"{topics.coordinator_log} was deleted and created again while "
                                                         f"it was replayed (topic ID {first.topic_id}, now {second.topic_id})")):
        check_same_incarnation(admin, topics.coordinator_log, first)

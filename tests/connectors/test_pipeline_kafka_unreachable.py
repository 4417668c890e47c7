"""A pipeline whose coordinator stopped while Kafka is gone says Kafka is unreachable, never that a
newer coordinator fenced it (issue 44, item 9; no Spark: the method alone)."""

from __future__ import annotations

import types

import pytest

from tests.coordinator.kafka.test_kafka_unreachable import dead_port


def test_a_pipeline_stopped_while_kafka_is_gone_says_kafka_is_unreachable_not_fenced() -> None:
    """``Pipeline._fenced_message`` read the log for the newer epoch and raised librdkafka's
    KafkaException ("Failed to get metadata") with a traceback when Kafka was gone."""
    from chandy.connectors.spark.options import PipelineFencedError, PipelineKafkaError
    from chandy.connectors.spark.pipeline import Pipeline

    servers = f"127.0.0.1:{dead_port()}"
    run = types.SimpleNamespace(
        job_id="job", service=types.SimpleNamespace(epoch=2, stop_reason="log writer stopped: this coordinator no "
                                                                          "longer leads its job"),
        options=types.SimpleNamespace(bootstrap_servers=servers, prefix="p", consumer_overrides={}))
    with pytest.raises(PipelineKafkaError) as raised:
        Pipeline._fenced_message(run)  # type: ignore[arg-type]
    assert not isinstance(raised.value, PipelineFencedError)
    assert str(raised.value).startswith(
        "job job: this coordinator stopped writing (log writer stopped: this coordinator no longer leads its job), and "
        "whether a newer coordinator took over cannot be known: coordinator log p.coordinator-log: Kafka is "
        f"unreachable: no metadata from {servers}")
    assert raised.value.__suppress_context__ and raised.value.__cause__ is None  # one line, no chained traceback

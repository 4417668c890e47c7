"""Which producer errors mean "a newer coordinator fenced this one" (the coordinator stops as
fenced, never writing again) and which only stop it (pure logic, no broker)."""

from __future__ import annotations

from confluent_kafka import KafkaError

from chandy.coordinator.kafka.log_writer import is_fencing


def test_fenced_and_fatal_producer_errors_count_as_fencing() -> None:
    assert is_fencing(KafkaError(KafkaError._FENCED))
    assert is_fencing(KafkaError(KafkaError.PRODUCER_FENCED))
    assert is_fencing(KafkaError(KafkaError.INVALID_PRODUCER_EPOCH))
    # produce() on a producer in its fatal state: the code says it, fatal() does not (found by CI)
    raised = KafkaError(KafkaError._FATAL, "Unable to produce message: Local: Fatal error")
    assert not raised.fatal() and is_fencing(raised)


def test_retriable_and_plain_errors_do_not() -> None:
    assert not is_fencing(KafkaError(KafkaError._TIMED_OUT))
    assert not is_fencing(KafkaError(KafkaError.NOT_ENOUGH_REPLICAS))
    assert not is_fencing(KafkaError(KafkaError._TRANSPORT))

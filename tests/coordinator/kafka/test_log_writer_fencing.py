"""The log writer's reading of librdkafka's transactional errors (coordinator/kafka/runtime.py:
LogWriter._commit): a fencing error is a CoordinatorFencedError wherever it appears, including
in the abort that follows an abortable commit error (a newer coordinator fenced this one in
between), so the process exits as fenced (3) and not as failed."""

from __future__ import annotations

import threading

import pytest
from confluent_kafka import KafkaError, KafkaException

from chandy.coordinator.environment import Batch
from chandy.coordinator.kafka.log_writer import CoordinatorFencedError, LogWriteError, LogWriter
from chandy.coordinator.kafka.topics import is_retriable
from chandy.coordinator.state import EpochClaim


class _Producer:
    """Stands in for librdkafka's transactional calls only: each call takes the next outcome."""

    def __init__(self, commits: list[KafkaError | None], aborts: list[KafkaError | None]) -> None:
        self.commits, self.aborts, self.calls = commits, aborts, []

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def commit_transaction(self, timeout: float) -> None:
        self.calls.append("commit")
        error = self.commits.pop(0)
        if error is not None:
            raise KafkaException(error)

    def abort_transaction(self, timeout: float) -> None:
        self.calls.append("abort")
        error = self.aborts.pop(0)
        if error is not None:
            raise KafkaException(error)


def _writer(producer: _Producer) -> LogWriter:
    writer = LogWriter.__new__(LogWriter)
    writer.producer = producer
    writer._produce = lambda batch: None
    writer.job_id, writer.retry_timeout_s = "job", 2.0
    return writer


ABORTABLE = KafkaError(KafkaError._STATE, "abortable", txn_requires_abort=True)
FENCED = KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True)


def test_an_abortable_commit_error_is_aborted_and_the_transaction_redone() -> None:
    producer = _Producer(commits=[ABORTABLE, None], aborts=[None])
    _writer(producer)._commit([(Batch(), None)])
    assert producer.calls == ["begin", "commit", "abort", "begin", "commit"]


def test_fenced_during_the_abort_is_reported_as_fenced() -> None:
    producer = _Producer(commits=[ABORTABLE], aborts=[FENCED])
    with pytest.raises(CoordinatorFencedError, match="fenced by a newer instance"):
        _writer(producer)._commit([(Batch(), None)])
    assert producer.calls == ["begin", "commit", "abort"]


def test_fenced_at_the_commit_is_reported_as_fenced_without_an_abort() -> None:
    producer = _Producer(commits=[FENCED], aborts=[])
    with pytest.raises(CoordinatorFencedError):
        _writer(producer)._commit([(Batch(), None)])
    assert producer.calls == ["begin", "commit"]


RETRIABLE = KafkaError(KafkaError._TIMED_OUT, "the transaction coordinator's broker died", retriable=True)


def test_a_retriable_commit_error_is_retried_through_a_brokers_death() -> None:
    """Issue 36: a broker's death answers the commit with a retriable error for a while; the
    writer retries the commit itself (with backoff) instead of stopping the coordinator."""
    producer = _Producer(commits=[RETRIABLE] * 6 + [None], aborts=[])
    _writer(producer)._commit([(Batch(), None)])
    assert producer.calls == ["begin"] + ["commit"] * 7


def test_a_retriable_error_past_the_retry_timeout_stops_the_writer() -> None:
    producer = _Producer(commits=[RETRIABLE] * 10_000, aborts=[])
    writer = _writer(producer)
    writer.retry_timeout_s = 0.3
    with pytest.raises(LogWriteError, match="broker died"):  # not fenced: nobody else took over
        writer._commit([(Batch(), None)])


@pytest.mark.parametrize("code", [KafkaError._DESTROY_BROKER, KafkaError._UNKNOWN_PARTITION, KafkaError.OFFSET_NOT_AVAILABLE,
                                  KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                                  KafkaError._TRANSPORT])
def test_a_restarting_broker_s_errors_are_retried(code: int) -> None:
    """What a client sees while a broker restarts (a rolling restart, issue 36) is retried:
    ``_DESTROY_BROKER`` is a request whose broker left the client's metadata before it answered."""
    assert is_retriable(KafkaError(code))


@pytest.mark.parametrize("code", [KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.PRODUCER_FENCED,
                                  KafkaError.GROUP_AUTHORIZATION_FAILED])
def test_authorization_and_fencing_are_not_retried(code: int) -> None:
    assert not is_retriable(KafkaError(code))


class _OffsetsProducer(_Producer):
    """A transactional producer whose ``send_offsets_to_transaction`` blocks forever when
    ``stuck`` (librdkafka issues 5456 and 5511: the group's coordinator left the metadata)."""

    def __init__(self, stuck: bool) -> None:
        super().__init__(commits=[None], aborts=[])
        self.stuck, self.released = stuck, threading.Event()

    def init_transactions(self, timeout: float) -> None:
        self.calls.append("init")

    def send_offsets_to_transaction(self, offsets, metadata, timeout: float) -> None:
        self.calls.append("send_offsets")
        if self.stuck:
            self.released.wait()


def _offsets_writer(first: _OffsetsProducer, second: _OffsetsProducer, *, leading: bool) -> LogWriter:
    writer = _writer(first)
    del writer._produce  # the real one: it sends the batch's offsets
    writer.job_id, writer.codec, writer.topics = "job", None, None
    writer._group_metadata = lambda group_id: object()
    writer._new_producer = lambda: second
    writer._stuck_producers = []
    writer._batch_versions = {}
    writer.still_leading = lambda: leading
    writer.epoch = lambda: EpochClaim(3, "me")
    writer.newest_epoch = lambda: (EpochClaim(3, "me"), {})  # no other coordinator wrote to the log
    writer._replayed_versions = {}
    writer._check_reachable = lambda: None  # Kafka answers
    return writer


def test_a_stuck_send_offsets_gets_a_new_producer_that_writes_the_transaction_again(monkeypatch) -> None:
    """Issue 36 (rolling restart): ``send_offsets_to_transaction`` can block past its timeout; the
    writer then makes a new producer (its init_transactions aborts the stuck transaction) and
    writes the whole group again with it, while the coordinator still leads its job."""
    from chandy.coordinator.environment import SourceOffsets
    from chandy.coordinator.kafka import log_writer

    monkeypatch.setattr(log_writer, "SEND_OFFSETS_STUCK_S", 0.2)
    stuck, fresh = _OffsetsProducer(stuck=True), _OffsetsProducer(stuck=False)
    writer = _offsets_writer(stuck, fresh, leading=True)
    writer._commit([(Batch(source_offsets=[SourceOffsets("group", (("t", 0, 5),))]), None)])
    assert stuck.calls == ["begin", "send_offsets"]
    assert fresh.calls == ["init", "begin", "send_offsets", "commit"] and writer.producer is fresh
    stuck.released.set()


def test_a_stuck_producer_is_not_replaced_once_the_coordinator_no_longer_leads(monkeypatch) -> None:
    from chandy.coordinator.environment import SourceOffsets
    from chandy.coordinator.kafka import log_writer

    monkeypatch.setattr(log_writer, "SEND_OFFSETS_STUCK_S", 0.2)
    stuck, fresh = _OffsetsProducer(stuck=True), _OffsetsProducer(stuck=False)
    writer = _offsets_writer(stuck, fresh, leading=False)
    with pytest.raises(CoordinatorFencedError, match="no longer leads"):
        writer._commit([(Batch(source_offsets=[SourceOffsets("group", (("t", 0, 5),))]), None)])
    assert fresh.calls == []  # a new producer would fence the coordinator that leads now
    stuck.released.set()


def test_a_stuck_producers_replacement_stops_when_the_log_holds_a_newer_epoch(monkeypatch) -> None:
    """Issue 44, item 2: the replacement's init_transactions fenced whatever producer held the
    transactional ID, a newer coordinator's too; the writer then reads the log's newest epoch and,
    finding one above its own, stops as fenced before writing anything."""
    from chandy.coordinator.environment import SourceOffsets
    from chandy.coordinator.kafka import log_writer

    monkeypatch.setattr(log_writer, "SEND_OFFSETS_STUCK_S", 0.2)
    stuck, fresh = _OffsetsProducer(stuck=True), _OffsetsProducer(stuck=False)
    writer = _offsets_writer(stuck, fresh, leading=True)
    writer.newest_epoch = lambda: (EpochClaim(4, "newer"), {})
    with pytest.raises(CoordinatorFencedError, match=r"another coordinator of job job wrote to its log \(the newest "
                                                     r"epoch record: epoch 4, coordinator newer; this one: epoch 3"):
        writer._commit([(Batch(source_offsets=[SourceOffsets("group", (("t", 0, 5),))]), None)])
    assert fresh.calls == ["init"]  # nothing written by the replacement
    stuck.released.set()


def test_a_stuck_producers_replacement_stops_when_another_coordinator_holds_the_same_epoch(monkeypatch) -> None:
    """Found by the commit-protocol simulation (stuck-writers, seed 37): a restart that replayed the
    log before this coordinator's epoch record landed takes the same epoch number; the epoch
    record's coordinator ID tells the two apart."""
    from chandy.coordinator.environment import SourceOffsets
    from chandy.coordinator.kafka import log_writer

    monkeypatch.setattr(log_writer, "SEND_OFFSETS_STUCK_S", 0.2)
    stuck, fresh = _OffsetsProducer(stuck=True), _OffsetsProducer(stuck=False)
    writer = _offsets_writer(stuck, fresh, leading=True)
    writer.newest_epoch = lambda: (EpochClaim(3, "other"), {})
    with pytest.raises(CoordinatorFencedError, match="epoch 3, coordinator other; this one: epoch 3, coordinator me"):
        writer._commit([(Batch(source_offsets=[SourceOffsets("group", (("t", 0, 5),))]), None)])
    assert fresh.calls == ["init"]
    stuck.released.set()


@pytest.mark.parametrize("log_changed", [False, True])
def test_a_coordinator_whose_epoch_record_never_landed_writes_on_only_over_an_unchanged_log(
        monkeypatch, log_changed: bool) -> None:
    """Found by the commit-protocol simulation (stuck-writers, seed 22): this coordinator's first
    transaction (its epoch record) is the stuck one, so the log's newest epoch record is still the
    one it replaced. It writes on only if the log holds exactly what its replay found: the
    coordinator it replaced may have unstuck itself and written on after that replay."""
    from chandy.coordinator.environment import SourceOffsets
    from chandy.coordinator.kafka import log_writer
    from chandy.coordinator.records import LogKey

    monkeypatch.setattr(log_writer, "SEND_OFFSETS_STUCK_S", 0.2)
    stuck, fresh = _OffsetsProducer(stuck=True), _OffsetsProducer(stuck=False)
    writer = _offsets_writer(stuck, fresh, leading=True)
    key = LogKey("job", "checkpoint", "1")
    writer._replayed_versions = {key: 1}
    writer.newest_epoch = lambda: (EpochClaim(2, "replaced"), {key: 2 if log_changed else 1})
    batch = Batch(source_offsets=[SourceOffsets("group", (("t", 0, 5),))])
    if log_changed:
        with pytest.raises(CoordinatorFencedError, match="epoch 2, coordinator replaced; this one: epoch 3"):
            writer._commit([(batch, None)])
        assert fresh.calls == ["init"]
    else:
        writer._commit([(batch, None)])
        assert fresh.calls == ["init", "begin", "send_offsets", "commit"]
    stuck.released.set()


def test_an_election_lost_to_a_kafka_outage_is_a_write_failure_not_fencing(monkeypatch) -> None:
    """Issue 44, item 9: with the only broker gone the election is lost too; that is an outage (a
    LogWriteError, which the restart strategy restarts), never reported as fencing."""
    from chandy.coordinator.environment import SourceOffsets
    from chandy.coordinator.kafka import log_writer
    from chandy.coordinator.kafka.config import KafkaUnreachableError
    from chandy.coordinator.kafka.log_writer import LogWriteError

    monkeypatch.setattr(log_writer, "SEND_OFFSETS_STUCK_S", 0.2)
    stuck, fresh = _OffsetsProducer(stuck=True), _OffsetsProducer(stuck=False)
    writer = _offsets_writer(stuck, fresh, leading=False)

    def unreachable() -> None:
        raise KafkaUnreachableError("no broker of 127.0.0.1:9 answered")

    writer._check_reachable = unreachable
    with pytest.raises(LogWriteError, match="no broker of 127.0.0.1:9 answered"):
        writer._commit([(Batch(source_offsets=[SourceOffsets("group", (("t", 0, 5),))]), None)])
    assert fresh.calls == []
    stuck.released.set()

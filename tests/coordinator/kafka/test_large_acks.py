"""An acknowledgement of many lake files over a real broker (issue 44, item 8): an ack of 10,000
files went over Kafka's 1 MB default (21 MB: every file's handle carried its Arrow schema) and failed
with MSG_SIZE_TOO_LARGE on every retry. Now it carries each schema once and is compressed, and its
checkpoint completes with every file in ``_metadata``; an ack that still does not fit fails at once
with an error naming its checkpoint, subtask and size, and declines its checkpoint."""

from __future__ import annotations

import os
import uuid

import pytest

from chandy.connectors.lake.sink import DataFile, data_files_from_handles, data_files_to_handles
from chandy.coordinator.failure import CheckpointException
from chandy.coordinator.kafka.participant import AckSender, AckTooLargeError, CheckpointParticipant
from chandy.coordinator.kafka.runtime import CoordinatorService
from chandy.coordinator.messages import StateHandle
from chandy.coordinator.storage import resolve_checkpoint_pointer
from tests.connectors.lake.test_file_handles import files
from tests.fixtures.workers import options

pytestmark = pytest.mark.integration

OPERATOR = "lake-sink"


@pytest.fixture
def job() -> str:
    return uuid.uuid4().hex


def files_in_metadata(tmp_path, job: str, checkpoint_id: int) -> list[DataFile]:
    _, metadata = resolve_checkpoint_pointer(f"file://{tmp_path}/chk/{job}/chk-{checkpoint_id}")
    operator = metadata.operator(OPERATOR)
    assert operator is not None
    return data_files_from_handles(h for s in operator.subtask_states for h in s.state_handles)


def test_an_ack_of_10000_files_completes_its_checkpoint(kafka_bootstrap_servers, topic_prefix, job, tmp_path) -> None:
    written = files(10_000)
    handles = data_files_to_handles(written)
    service = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path), {OPERATOR: 1},
                                 prefix=topic_prefix).start()
    participant = CheckpointParticipant(kafka_bootstrap_servers, job, OPERATOR, 0, prefix=topic_prefix,
                                        snapshot=lambda checkpoint_id, trigger: handles).start()
    try:
        record = service.trigger_checkpoint().result(60)
        assert (record.checkpoint_id, record.status, record.num_acknowledged) == (1, "COMPLETED", 1)
        assert record.state_size == sum(f.size for f in written)
    finally:
        participant.close()
        service.stop()
    assert files_in_metadata(tmp_path, job, 1) == written


def test_an_ack_over_the_producers_limit_names_its_checkpoint_subtask_and_size(kafka_bootstrap_servers,
                                                                               topic_prefix, job) -> None:
    sender = AckSender(kafka_bootstrap_servers, job, prefix=topic_prefix,
                       producer_overrides={"message.max.bytes": 1_000_000})
    try:
        with pytest.raises(AckTooLargeError, match=(
                rf"the acknowledgement of checkpoint 7 by subtask 3 of operator {OPERATOR} \(attempt 2, 10001 state "
                rf"handles\) of job {job} is 2,\d\d\d,\d\d\d bytes, too large for Kafka \(.*\): over the producer's "
                r"message.max.bytes \(1,000,000 bytes, checked before compression")):
            sender.acknowledge(1, 7, OPERATOR, 3, 2, data_files_to_handles(files(10_000)))
    finally:
        sender.close()


def test_an_ack_the_broker_refuses_even_compressed_declines_its_checkpoint(kafka_bootstrap_servers, topic_prefix,
                                                                           job, tmp_path) -> None:
    incompressible = [StateHandle("inline", None, os.urandom(3_000_000), 3_000_000)]  # over the topic's 1 MB
    service = CoordinatorService(job, kafka_bootstrap_servers, options(tmp_path), {OPERATOR: 1},
                                 prefix=topic_prefix).start()
    participant = CheckpointParticipant(kafka_bootstrap_servers, job, OPERATOR, 0, prefix=topic_prefix,
                                        snapshot=lambda checkpoint_id, trigger: incompressible).start()
    try:
        with pytest.raises(CheckpointException, match=(
                rf"CHECKPOINT_DECLINED: declined by {OPERATOR}\[0\] attempt 0: the acknowledgement of checkpoint 1 "
                rf"by subtask 0 of operator {OPERATOR} \(attempt 0, 1 state handles\) of job {job} is 3,00\d,\d\d\d "
                r"bytes, too large for Kafka \(Broker: Message size too large\): the broker refused it even compressed "
                rf"\(zstd\): over the max.message.bytes of topic {topic_prefix}.acks")):
            service.trigger_checkpoint().result(60)  # at once, not at the checkpoint's timeout
    finally:
        participant.close()
        service.stop()

"""A synthetic coordinator-log history for the benchmarks: what a long-running job leaves behind.

Per checkpoint, the records a coordinator with ``state.checkpoints.num-retained`` 1 writes: the
checkpoint ID counter, the PENDING record, the COMPLETED record and the tombstone of the
checkpoint the new one subsumes. ``subsume_last=True`` also tombstones the newest checkpoint, so
the history restores nothing (a later real coordinator's checkpoints are the only ones retained).
"""

from __future__ import annotations

from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.log import KEY_VERSION_HEADER, encode_record
from chandy.coordinator.records import CheckpointIdCounterRecord, CheckpointRecord, LogKey, LogRecord, Tombstone
from chandy.schemas.codec import SingleObjectCodec


def history(job: str, records: int, *, epoch: int = 1, subsume_last: bool = False) -> list[LogRecord]:
    """``records`` log records of job ``job`` (4 per checkpoint, IDs from 1), in log order."""
    out: list[LogRecord] = []
    checkpoint_id = 0
    base = 1_700_000_000_000
    while len(out) < records:
        checkpoint_id += 1
        pending = CheckpointRecord(job, checkpoint_id, "CHECKPOINT", "PENDING", epoch, base + checkpoint_id,
                                   base + checkpoint_id, 16)
        completed = CheckpointRecord(job, checkpoint_id, "CHECKPOINT", "COMPLETED", epoch, base + checkpoint_id,
                                     base + checkpoint_id + 40, 16, 16, 4096, f"file:///chk/{job}/chk-{checkpoint_id}")
        out += [CheckpointIdCounterRecord(job, checkpoint_id + 1), pending, completed]
        if checkpoint_id > 1:
            out.append(Tombstone(LogKey(job, "checkpoint", str(checkpoint_id - 1))))
    out = out[:records]
    if subsume_last:
        newest = max(r.checkpoint_id for r in out if isinstance(r, CheckpointRecord))
        out[-1] = Tombstone(LogKey(job, "checkpoint", str(newest)))  # the log keeps its length
    return out


def write_history(servers: str, topic: str, partition: int, job: str, records: int, **kwargs: bool) -> int:
    """Produce :func:`history` to ``topic``'s ``partition`` (not transactional: a log written and
    committed long ago reads the same); returns the number of records written."""
    codec = SingleObjectCodec()
    producer = kafka_config.producer(servers, overrides={"linger.ms": 20, "batch.num.messages": 10000,
                                                         "queue.buffering.max.messages": 1_000_000,
                                                         "compression.type": "lz4"})
    written = 0
    versions: dict = {}  # the key version header, as the coordinator's LogWriter writes it
    for record in history(job, records, **kwargs):
        key, value = encode_record(codec, record)
        version = versions.get(record.key(), 0)
        versions[record.key()] = version + 1
        while True:
            try:
                producer.produce(topic, value, key, partition=partition,
                                 headers=[(KEY_VERSION_HEADER, str(version).encode())])
                break
            except BufferError:
                producer.poll(0.1)
        written += 1
        if written % 10000 == 0:
            producer.poll(0)
    producer.flush(120)
    return written

"""Kafka clients and lake sinks pooled per Python worker process, reused across Spark tasks and
checkpoints.

Spark reuses its Python workers (``spark.python.worker.reuse``, true by default), so a process
runs many tasks of many micro-batches one after the other. Creating a librdkafka client per task
costs its threads, a bootstrap connection, a metadata round trip and, under SASL, an
authentication: spark-sql-kafka avoids the same cost by caching its consumers per executor
(``KafkaDataConsumer``), and this module does it for Chandy's tasks.

- :func:`range_reader` lends a :class:`~chandy.connectors.kafka.source.reader.KafkaRangeReader` (its
  consumer is not thread-safe: a reader is lent to one task at a time; a reader whose task failed
  is closed, not returned, as its consumer may be in any state).
- :func:`ack_sender` returns one shared :class:`~chandy.coordinator.kafka.participant.AckSender` per
  (servers, job, prefix, settings); a librdkafka producer is thread-safe. A failed task's
  sender is discarded (:func:`discard_sender`).
- :func:`task_sink` returns one lake sink per table and settings: its table URI parsed, its
  filesystem (and, for Iceberg, its location) resolved once per process, not per task.

Clients are keyed by every setting they were created with (credentials included, so a pooled
client never serves another principal) and closed at interpreter exit (:func:`close_all`). A
Spark worker forked by PySpark's daemon ends with ``os._exit``, which skips that: its connections
simply drop, which loses nothing (every ack was flushed when it was sent, and the readers only
assign partitions, they neither join a group nor commit).
"""

from __future__ import annotations

import atexit
import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from chandy.connectors.kafka.source.reader import KafkaRangeReader
from chandy.connectors.lake.tables import LakeSink, open_sink
from chandy.coordinator.kafka.participant import AckSender

_Key = tuple[Any, ...]

_lock = threading.Lock()
_idle_readers: dict[_Key, list[KafkaRangeReader]] = {}
_senders: dict[_Key, AckSender] = {}
_sinks: dict[_Key, LakeSink] = {}
#: clients created and loans served since the process started (for tests and the benchmarks)
stats = {"readers_created": 0, "readers_lent": 0, "senders_created": 0, "sinks_opened": 0}


def _settings_key(settings: Mapping[str, Any] | None) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((str(k), repr(v)) for k, v in (settings or {}).items()))


@contextlib.contextmanager
def range_reader(bootstrap_servers: str, consumer_overrides: Mapping[str, Any] | None = None) -> Iterator[KafkaRangeReader]:
    """Lend a range reader for ``bootstrap_servers`` with ``consumer_overrides`` (librdkafka
    names) for the ``with`` block: an idle pooled one, else a new one. It goes back to the pool
    when the block ends normally and is closed when the block raises."""
    key = (bootstrap_servers, _settings_key(consumer_overrides))
    with _lock:
        idle = _idle_readers.get(key)
        reader = idle.pop() if idle else None
        stats["readers_lent"] += 1
    if reader is None:
        reader = KafkaRangeReader(bootstrap_servers, dict(consumer_overrides or {}))
        with _lock:
            stats["readers_created"] += 1
    try:
        yield reader
    except BaseException:
        reader.close()
        raise
    with _lock:
        _idle_readers.setdefault(key, []).append(reader)


def ack_sender(bootstrap_servers: str, job_id: str, *, prefix: str,
               producer_overrides: Mapping[str, Any] | None = None) -> AckSender:
    """The process's :class:`AckSender` for (``bootstrap_servers``, ``job_id``, ``prefix``,
    ``producer_overrides``), created on first use. Do not close it; :func:`close_all` does."""
    key = (bootstrap_servers, job_id, prefix, _settings_key(producer_overrides))
    with _lock:
        sender = _senders.get(key)
        if sender is None:
            sender = _senders[key] = AckSender(bootstrap_servers, job_id, prefix=prefix,
                                               producer_overrides=dict(producer_overrides or {}))
            stats["senders_created"] += 1
        return sender


def task_sink(table_uri: str, *, partition_by: tuple[str, ...] = (), storage_options: Mapping[str, Any] | None = None,
              catalog_properties: Mapping[str, Any] | None = None, add_columns: bool = False,
              location: str | None = None, table_properties: Mapping[str, str] | None = None) -> LakeSink:
    """The process's lake sink for ``table_uri`` and these settings (those of
    :func:`~chandy.connectors.lake.tables.open_sink`), opened on first use and shared by every
    task after it: a sink holds configuration and a filesystem, no per-checkpoint state."""
    key = (table_uri, tuple(partition_by), _settings_key(storage_options), _settings_key(catalog_properties),
           add_columns, location, _settings_key(table_properties))
    with _lock:
        sink = _sinks.get(key)
        if sink is None:
            sink = _sinks[key] = open_sink(table_uri, partition_by=partition_by, storage_options=storage_options,
                                           catalog_properties=catalog_properties, add_columns=add_columns,
                                           location=location, table_properties=table_properties)
            stats["sinks_opened"] += 1
        return sink


def discard_sender(sender: AckSender) -> None:
    """Take ``sender`` out of the pool and flush it: after a failed task, whose producer may be
    the cause (a fatal idempotence error stays fatal); the next task creates a new one."""
    with _lock:
        for key in [k for k, v in _senders.items() if v is sender]:
            del _senders[key]
    with contextlib.suppress(Exception):
        sender.close()


def close_all() -> None:
    """Close every pooled client (idle readers, senders after flushing): at interpreter exit,
    or by a test."""
    with _lock:
        readers = [r for idle in _idle_readers.values() for r in idle]
        senders = list(_senders.values())
        _idle_readers.clear()
        _senders.clear()
    for reader in readers:
        with contextlib.suppress(Exception):
            reader.close()
    for sender in senders:
        with contextlib.suppress(Exception):
            sender.close()


atexit.register(close_all)

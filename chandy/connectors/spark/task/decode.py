"""The task's decode stage: raw Kafka batches into the table's columns with the job's
:class:`~chandy.formats.decoder.ValueDecoder`, routed per subject when each table has its own
writer schemas (:mod:`chandy.connectors.spark.task.route`); bad records and skipped tombstones go
to the subtask's dead-letter file (:mod:`chandy.connectors.spark.task.dead_letters`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa

from chandy.connectors.spark.task.dead_letters import DeadLetterFile
from chandy.connectors.spark.task.options import TaskOptions
from chandy.connectors.spark.task.route import decode_routed, routes_before_decoding
from chandy.connectors.spark.task.tables import RoutedTables
from chandy.formats.decoder import ValueDecoder, decode_batches


def decode_with_dead_letters(options: TaskOptions, batches: Iterator[pa.RecordBatch], subtask: int,
                             tables: RoutedTables | None = None) -> Iterator[pa.RecordBatch]:
    """Decode a subtask's batches with ``options.decoder`` (routed per subject: each table's
    records with its own columns, :mod:`chandy.connectors.spark.task.route`, read from ``tables``,
    the subtask's one :class:`RoutedTables`); bad records (and the count of skipped tombstones)
    are written, at the end of the input, to the checkpoint's dead-letter file of this subtask
    (see :mod:`chandy.connectors.spark.task.dead_letters`)."""
    assert options.decoder is not None
    dead = DeadLetterFile(options.checkpoint_dir, options.job_id, options.checkpoint_id, subtask,
                          options.storage_options)
    if routes_before_decoding(options):
        yield from decode_routed(options, batches, (tables or RoutedTables(options)).fields_of_table, dead)
    elif options.router is not None and options.unrouted == "dead-letter":
        yield from without_unrouted(options, _with_raw(batches, options.decoder, dead), dead.add)
    else:
        yield from decode_batches(batches, options.decoder, dead.add, dead.add_skipped)
    dead.close()


def _with_raw(batches: Iterator[pa.RecordBatch], decoder: ValueDecoder,
              dead: Any) -> Iterator[tuple[pa.RecordBatch, pa.RecordBatch]]:
    """(raw batch, decoded batch) pairs, bad records and skipped tombstones noted in ``dead``."""
    for batch in batches:
        decoded, bad, skipped = decoder.decode(batch)
        if bad is not None:
            dead.add(bad)
        if skipped:
            dead.add_skipped(skipped)
        yield batch, decoded


def without_unrouted(options: TaskOptions, batches: Iterator[tuple[pa.RecordBatch, pa.RecordBatch]],
                     on_bad: Callable[[pa.RecordBatch], None]) -> Iterator[pa.RecordBatch]:
    """``--unrouted dead-letter``: the decoded rows no ``--route`` rule matches are bad records
    (dead letters, or the micro-batch fails under ``--errors-tolerance none``); the rest pass."""
    import pyarrow.compute as pc

    assert options.router is not None and options.decoder is not None
    router = options.router
    rule = f"route {router.field or 'topic'}"
    for raw, batch in batches:
        table = pa.Table.from_batches([batch])
        keys = router.keys(table)
        distinct = pc.unique(keys).to_pylist()
        unrouted = [k for k in distinct if router.table_for(k) is None]
        if not unrouted:
            yield batch
            continue
        mask = pc.fill_null(pc.is_in(keys, value_set=pa.array(unrouted, pa.string())), True)
        gone = table.filter(mask)
        where = set(zip(gone["topic"].to_pylist(), gone["partition"].to_pylist(), gone["offset"].to_pylist(),
                        strict=True))
        rows = [i for i, tpo in enumerate(zip(raw.column("topic").to_pylist(), raw.column("partition").to_pylist(),
                                              raw.column("offset").to_pylist(), strict=True)) if tpo in where]
        on_bad(options.decoder.refuse(raw, rows, "Unrouted",
                                      f"no --route rule matches its {rule} (--unrouted dead-letter)"))
        yield batch.filter(pc.invert(mask).combine_chunks())

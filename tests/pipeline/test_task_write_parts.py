"""A subtask's bounded-memory write (connectors/spark/task/write.py): batches regrouped into parts
of at least write_buffer_bytes, and a column's type checked across the parts of one checkpoint as
concat_evolving checks it within one part."""

from __future__ import annotations

import pyarrow as pa
import pytest

from chandy.connectors.spark.task.write import buffered
from chandy.connectors.spark.task.write import check_same_types as _check_same_types
from chandy.formats.evolution import SchemaChangeError


def _batch(offsets: range, as_text: bool = False) -> pa.RecordBatch:
    values = pa.array([str(o) for o in offsets]) if as_text else pa.array(list(offsets), pa.int64())
    return pa.record_batch({"topic": ["t"] * len(offsets), "partition": [0] * len(offsets),
                            "offset": list(offsets), "v": values})


def test_parts_hold_at_least_the_limit_and_nothing_is_lost_or_reordered() -> None:
    batches = [_batch(range(i * 10, i * 10 + 10)) for i in range(7)]
    limit = batches[0].nbytes * 3
    parts = list(buffered(iter(batches), limit))
    assert [len(p) for p in parts] == [3, 3, 1]
    assert [b for p in parts for b in p] == batches
    assert all(sum(b.nbytes for b in p) >= limit for p in parts[:-1])
    assert list(buffered(iter([]), limit)) == []
    assert [len(p) for p in buffered(iter(batches), 1)] == [1] * 7


def test_a_type_change_between_parts_is_refused_naming_the_column_and_both_ranges() -> None:
    seen: dict = {}
    _check_same_types(pa.Table.from_batches([_batch(range(0, 5))]), seen, "checkpoint 4: ")
    _check_same_types(pa.Table.from_batches([_batch(range(5, 9))]), seen, "checkpoint 4: ")  # same types pass
    with pytest.raises(SchemaChangeError) as error:
        _check_same_types(pa.Table.from_batches([_batch(range(9, 12), as_text=True)]), seen, "checkpoint 4: ")
    message = str(error.value)
    assert message.startswith("checkpoint 4: field v changed type: int64 at ")
    assert "[0, 4]" in message and "[9, 11]" in message and "string" in message


def test_a_worker_opens_the_sink_once_per_table_and_settings(tmp_path) -> None:
    """Issue 26: the lake sink is opened once per Python worker and reused by every task and
    micro-batch after (its table URI parsed once), and a sink of other settings is another one."""
    from chandy.connectors.spark.task import clients

    before = clients.stats["sinks_opened"]
    uri = str(tmp_path / "t")
    first = clients.task_sink(uri, partition_by=("topic",), storage_options={"a": "1"})
    again = clients.task_sink(uri, partition_by=("topic",), storage_options={"a": "1"})
    assert again is first and clients.stats["sinks_opened"] - before == 1
    other = clients.task_sink(uri, partition_by=("topic",), storage_options={"a": "1"}, add_columns=True)
    assert other is not first and other.add_columns and clients.stats["sinks_opened"] - before == 2

"""What a Spark task of one micro-batch needs from the driver: one typed, picklable
:class:`TaskOptions` (set by the driver's micro-batch, :mod:`chandy.connectors.spark.driver.micro_batch`)."""

from __future__ import annotations

import base64
import dataclasses
import pickle
from collections.abc import Mapping
from typing import Any

from chandy.connectors.lake.routing import Router
from chandy.formats.decoder import ValueDecoder

#: the data source option that holds the encoded :class:`TaskOptions`
TASK_OPTION = "chandy.task"

#: Arrow bytes a subtask holds before it writes them as lake files (``--write-buffer-bytes``): small
#: enough that a Python worker's peak RSS is the same at 50,000 and 2,000,000 records per checkpoint
#: (measured: 297 and 294 MiB; 365 MiB holding a whole 2,000,000-record checkpoint), large enough
#: that a part is a file of several MB.
DEFAULT_WRITE_BUFFER_BYTES = 16 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class TaskOptions:
    """What a Spark task of micro-batch N needs, as one typed, picklable object.

    It reaches the tasks in the closure of an RDD function, or as the single data source option
    :data:`TASK_OPTION` (:meth:`encode` / :meth:`decode`), never as loose strings.
    ``table_fields`` are the table's columns (name -> Delta type JSON) when the table exists, so
    a task refuses data of another shape before writing anything (with ``add_columns``, schema
    evolution, new columns pass and only other types are refused); ``decoder`` decodes values in
    the task (None: raw Kafka columns); ``checkpoint_dir`` is where dead letters go.
    ``write_buffer_bytes`` bounds a subtask's memory: it writes its records as lake files
    whenever the Arrow batches it holds reach that size (bytes), not once per checkpoint.
    """

    table_uri: str
    job_id: str
    checkpoint_id: int
    epoch: int
    operator_id: str
    bootstrap_servers: str
    prefix: str
    checkpoint_dir: str
    partition_by: tuple[str, ...] = ()
    storage_options: Mapping[str, str] = dataclasses.field(default_factory=dict)
    producer_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    consumer_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    max_task_failures: int = 1
    table_fields: Mapping[str, Any] | None = None
    #: routed tables' columns (table URI -> as ``table_fields``) as the driver's committer last
    #: read them; a routed table not named here is read by the task (issue 57: 1,000 routed tables
    #: were opened by every subtask in every checkpoint)
    routed_table_fields: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    decoder: ValueDecoder | None = None
    batch_size: int = 20_000
    catalog_properties: Mapping[str, str] = dataclasses.field(default_factory=dict)
    add_columns: bool = False
    table_location: str | None = None  # Iceberg: the table's root URL, so tasks need no catalog
    write_buffer_bytes: int = DEFAULT_WRITE_BUFFER_BYTES  # Arrow bytes a subtask holds before writing them as files
    #: routing to many tables (``--route``): rows go to the table their rule names, unrouted ones
    #: to ``table_uri`` (None: every row to ``table_uri``)
    router: Router | None = None
    unrouted: str = "table"  # "table": unrouted rows go to table_uri; "dead-letter": they are bad records
    #: ``--cdc``: rows are changes, written as change files (merged at the lake commit, never appended)
    changes: bool = False
    #: Spark's ``failOnDataLoss``: offsets of a range that Kafka no longer holds fail the task
    #: (``KafkaDataLossError``); False skips them, with a warning in the task's log
    fail_on_data_loss: bool = True
    #: ``--table-property``: set on tables the tasks' sinks create, and their files' Parquet codec
    table_properties: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: the ID of the coordinator log (in the incarnation the checkpoint's coordinator replayed)
    #: the data files are named with (``coordinator_log_id``); None: named without one
    log_id: str | None = None

    def encode(self) -> str:
        return base64.b64encode(pickle.dumps(self)).decode()

    @classmethod
    def decode(cls, text: str) -> TaskOptions:
        options = pickle.loads(base64.b64decode(text))
        if not isinstance(options, cls):
            raise TypeError(f"{TASK_OPTION} holds a {type(options).__name__}, not TaskOptions")
        return options

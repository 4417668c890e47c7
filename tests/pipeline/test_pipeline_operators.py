"""Exactly-once under ordinary operator actions, on a real broker, real Spark and a real Delta
table: the same table spelled differently, a lost coordinator log, another job on the same
partitions, an existing table of another schema, bad records (fail, skip, dead-letter), and
failures that say why in one line, before Spark starts where they can."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pyarrow as pa
import pytest
from confluent_kafka import TopicPartition
from deltalake import DeltaTable, write_deltalake

from chandy.connectors.kafka.source.reader import KafkaRangeReader
from chandy.connectors.kafka.source.split import KafkaPartitionSplit
from chandy.connectors.spark.options import PipelineError, PipelineOptions, default_job_id
from chandy.connectors.spark.pipeline import Pipeline
from chandy.connectors.spark.verify import verify_table
from chandy.coordinator.kafka import config as kafka_config
from tests.fixtures import REPO_ROOT
from tests.fixtures.pipeline import all_offsets, group_offsets, landed, make_topic, options, produce

pytestmark = pytest.mark.integration

ROOT = REPO_ROOT


def test_one_table_spelled_four_ways_is_one_job(spark, kafka_bootstrap_servers, tmp_path, monkeypatch) -> None:
    topic = make_topic(kafka_bootstrap_servers, [f"a-{i}".encode() for i in range(100)])
    prefix = f"op{uuid.uuid4().hex[:6]}"
    (tmp_path / "lake").mkdir()
    monkeypatch.chdir(tmp_path)
    spellings = ["lake/orders", f"{tmp_path}/lake//orders/", f"file://{tmp_path}/lake/orders",
                 f"{tmp_path}/x/../lake/orders"]
    assert len({default_job_id(s, [topic]) for s in spellings}) == 1
    first = Pipeline(options(kafka_bootstrap_servers, topic, spellings[0], prefix), spark=spark).run()
    assert first.records_landed == 100
    produce(kafka_bootstrap_servers, topic, [f"b-{i}".encode() for i in range(50)])
    again = [Pipeline(options(kafka_bootstrap_servers, topic, s, prefix), spark=spark).run() for s in spellings[1:]]
    assert [s.records_landed for s in again] == [50, 0, 0]
    rows = landed(str(tmp_path / "lake" / "orders"))
    assert len(rows) == len(set(rows)) == 150 and set(rows) == all_offsets(kafka_bootstrap_servers, topic)
    # a relative path is relative to where it is run: two directories, two tables, two jobs
    assert default_job_id("lake", [topic]) != default_job_id(f"{tmp_path}/elsewhere/lake", [topic])


def test_a_lost_coordinator_log_resumes_from_the_table(spark, kafka_bootstrap_servers, tmp_path) -> None:
    topic = make_topic(kafka_bootstrap_servers, [f"a-{i}".encode() for i in range(200)])
    table = str(tmp_path / "t")
    first = Pipeline(options(kafka_bootstrap_servers, topic, table, f"op{uuid.uuid4().hex[:6]}",
                             max_records_per_checkpoint=40), spark=spark)
    assert first.run().records_landed == 200
    version_before = DeltaTable(table).transaction_version(first.job_id)
    assert version_before is not None and version_before >= 3
    produce(kafka_bootstrap_servers, topic, [f"b-{i}".encode() for i in range(100)])
    # a new prefix: the coordinator log (and its checkpoint IDs) starts from nothing
    lost = options(kafka_bootstrap_servers, topic, table, f"op{uuid.uuid4().hex[:6]}", max_records_per_checkpoint=40)
    with pytest.raises(PipelineError, match="refusing to guess"):
        Pipeline(PipelineOptions(**{**lost.__dict__, "resume_from_table": False}), spark=spark).run()
    resumed = Pipeline(lost, spark=spark)
    summary = resumed.run()
    assert summary.records_landed == 100
    assert any("resuming from the table's offsets" in n for n in summary.notices)
    assert DeltaTable(table).transaction_version(first.job_id) > version_before  # IDs continued above the table's
    rows = landed(table)
    assert len(rows) == len(set(rows)) == 300 and set(rows) == all_offsets(kafka_bootstrap_servers, topic)
    ends = {p: max(o for t, q, o in rows if q == p) + 1 for p in range(2)}
    assert group_offsets(kafka_bootstrap_servers, f"chandy-{first.job_id}", topic) == ends
    # issue 44, item 1: lost again, with each --starting-offsets: the table's offsets always win
    # (with `latest` the records produced while the job was down used to be skipped, silently)
    for i, starting in enumerate(("latest", "committed", "earliest")):
        produce(kafka_bootstrap_servers, topic, [f"{starting}-{j}".encode() for j in range(30)])
        again = options(kafka_bootstrap_servers, topic, table, f"op{uuid.uuid4().hex[:6]}",
                        max_records_per_checkpoint=40, starting_offsets=starting)
        assert Pipeline(again, spark=spark).run().records_landed == 30, starting
        rows = landed(table)
        assert len(rows) == len(set(rows)) == 330 + 30 * i, starting
        assert set(rows) == all_offsets(kafka_bootstrap_servers, topic), starting


def test_another_job_on_the_same_partitions_is_refused(spark, kafka_bootstrap_servers, tmp_path) -> None:
    topic = make_topic(kafka_bootstrap_servers, [f"a-{i}".encode() for i in range(20)])
    table = str(tmp_path / "t")
    prefix = f"op{uuid.uuid4().hex[:6]}"
    Pipeline(options(kafka_bootstrap_servers, topic, table, prefix, job_id="job-a"), spark=spark).run()
    version = DeltaTable(table).version()
    with pytest.raises(PipelineError, match="landed by job job-a.*--job-id job-a"):
        Pipeline(options(kafka_bootstrap_servers, topic, table, prefix, job_id="job-b"), spark=spark).run()
    assert DeltaTable(table).version() == version


def test_a_table_of_another_schema_is_refused_before_anything_is_written(spark, kafka_bootstrap_servers, tmp_path) -> None:
    topic = make_topic(kafka_bootstrap_servers, [json.dumps({"flight": i}).encode() for i in range(20)])
    table = str(tmp_path / "t")
    write_deltalake(table, pa.table({"flight": pa.array(["x"], pa.string())}))
    with pytest.raises(PipelineError, match=r"column flight is integer in the data but string in the table"):
        Pipeline(options(kafka_bootstrap_servers, topic, table, f"op{uuid.uuid4().hex[:6]}", value_format="json",
                         value_schema="flight INT"), spark=spark).run()
    with pytest.raises(PipelineError, match=r"column key \(binary\) is not in the table"):
        Pipeline(options(kafka_bootstrap_servers, topic, table, f"op{uuid.uuid4().hex[:6]}"), spark=spark).run()
    # with a transform the schema is known only when the data is: the tasks refuse before writing
    with pytest.raises(PipelineError, match=r"LakeSchemaError: .*column flight is integer in the data"):
        Pipeline(options(kafka_bootstrap_servers, topic, table, f"op{uuid.uuid4().hex[:6]}", value_format="json",
                         value_schema="flight INT", transform="tests.transforms.flights:identity"), spark=spark).run()
    assert DeltaTable(table).version() == 0 and DeltaTable(table).to_pyarrow_table().num_rows == 1


BAD = [b'{"flight": 1, "carrier": "UA"}', b"{not json", b'{"flight": "seven", "carrier": "AA"}', None, b"",
       b'{"flight": 2, "carrier": "DL"}', b"[1, 2]", b'{"flight": 3, "carrier": "B6"}']


def test_a_bad_record_fails_the_micro_batch_naming_where_it_is(spark, kafka_bootstrap_servers, tmp_path) -> None:
    """A deterministic error fails the job: FAILED in the log and on the events topic, with the
    reason (issue 33: it read SUSPENDED, which Flink keeps for a JobManager that lost leadership)."""
    from chandy.coordinator.kafka.log import load_state
    from chandy.coordinator.kafka.topics import ChandyTopics
    from chandy.coordinator.records import JobStatus
    from tests.fixtures.workers import read_events, wait_for

    topic = make_topic(kafka_bootstrap_servers, BAD, partitions=1)
    table, prefix = str(tmp_path / "t"), f"op{uuid.uuid4().hex[:6]}"
    pipeline = Pipeline(options(kafka_bootstrap_servers, topic, table, prefix, value_format="json",
                                value_schema="flight INT, carrier STRING"), spark=spark)
    with pytest.raises(PipelineError, match=rf"BadRecordError: topic {topic} partition 0 offset 1: JsonParseError"):
        pipeline.run()
    assert not DeltaTable.is_deltatable(table)
    state, _ = load_state(kafka_bootstrap_servers, ChandyTopics(prefix).coordinator_log, pipeline.job_id)
    assert state.job_status is JobStatus.FAILED and "BadRecordError" in (state.job_status_reason or "")
    changes = wait_for(lambda: [(e.job_status, e.failure_message) for e in read_events(
        kafka_bootstrap_servers, ChandyTopics(prefix).checkpoint_events, pipeline.job_id, expected=100, timeout_s=2)
        if e.event_type == "JOB_STATUS_CHANGED"], what="the JOB_STATUS_CHANGED event")
    assert [status for status, _ in changes] == ["FAILED"] and "BadRecordError" in (changes[0][1] or ""), changes


def test_bad_records_go_to_the_dead_letter_topic_exactly_once(spark, kafka_bootstrap_servers, tmp_path) -> None:
    topic = make_topic(kafka_bootstrap_servers, BAD * 5, partitions=2)
    dlq = make_topic(kafka_bootstrap_servers, [], partitions=1)
    table = str(tmp_path / "t")
    run = Pipeline(options(kafka_bootstrap_servers, topic, table, f"op{uuid.uuid4().hex[:6]}", value_format="json",
                           value_schema="flight INT, carrier STRING", errors_tolerance="all",
                           dead_letter_topic=dlq, max_records_per_checkpoint=7), spark=spark)
    summary = run.run()
    rows = DeltaTable(table).to_pyarrow_table().to_pylist()
    assert sorted(r["flight"] for r in rows) == sorted([1, 2, 3] * 5)
    assert summary.bad_records == summary.dead_lettered == 25
    reader = KafkaRangeReader(kafka_bootstrap_servers)
    consumer = kafka_config.consumer(kafka_bootstrap_servers)
    high = consumer.get_watermark_offsets(TopicPartition(dlq, 0), timeout=10, cached=False)[1]
    letters = list(reader.read(KafkaPartitionSplit(dlq, 0, 0, high)))
    consumer.close()
    reader.close()
    assert len(letters) == 25
    headers = [dict(m.headers()) for m in letters]
    assert {h["__connect.errors.exception.class.name"] for h in headers} == {
        b"JsonParseError", b"TypeMismatch", b"Tombstone", b"EmptyValue"}
    assert {m.value() for m in letters} == {b"{not json", b'{"flight": "seven", "carrier": "AA"}', None, b"", b"[1, 2]"}
    assert all(h["__connect.errors.topic"] == topic.encode() for h in headers)
    assert verify_table(run.sink, kafka_bootstrap_servers, [topic], dead_letter_topic=dlq) == (15, 0, 0)


def test_tombstones_can_be_skipped_or_kept_as_null_rows(spark, kafka_bootstrap_servers, tmp_path) -> None:
    topic = make_topic(kafka_bootstrap_servers, [b'{"flight": 1}', None, b'{"flight": 2}'], partitions=1)
    skip = Pipeline(options(kafka_bootstrap_servers, topic, str(tmp_path / "skip"), f"op{uuid.uuid4().hex[:6]}",
                            value_format="json", value_schema="flight INT", tombstones="skip"), spark=spark).run()
    assert skip.tombstones_skipped == 1 and DeltaTable(str(tmp_path / "skip")).to_pyarrow_table().num_rows == 2
    Pipeline(options(kafka_bootstrap_servers, topic, str(tmp_path / "null"), f"op{uuid.uuid4().hex[:6]}",
                     value_format="json", value_schema="flight INT", tombstones="null"), spark=spark).run()
    rows = DeltaTable(str(tmp_path / "null")).to_pyarrow_table().to_pylist()
    assert sorted((r["offset"], r["flight"]) for r in rows) == [(0, 1), (1, None), (2, 2)]


def test_an_avro_record_with_a_bad_header_names_its_topic(spark, kafka_bootstrap_servers, tmp_path) -> None:
    schema = json.dumps({"type": "record", "name": "F", "fields": [{"name": "flight", "type": "long"}]})
    topic = make_topic(kafka_bootstrap_servers, [b"\x00\x00\x00\x00\x01\x02", b"\xc3\x01garbage"], partitions=1)
    with pytest.raises(PipelineError, match=rf"topic {topic} partition 0 offset 0: WireFormatError"):
        Pipeline(options(kafka_bootstrap_servers, topic, str(tmp_path / "t"), f"op{uuid.uuid4().hex[:6]}",
                         value_format="avro", value_schema=schema), spark=spark).run()


def chandy(*args: str, timeout: float = 300, **popen) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    return subprocess.run([sys.executable, "-m", "chandy.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env, **popen)


def test_bad_settings_fail_before_spark_in_one_line(kafka_bootstrap_servers, tmp_path) -> None:
    topic = make_topic(kafka_bootstrap_servers, [b"x"])
    table = str(tmp_path / "t")
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    cases = [
        (["-b", "127.0.0.1:1", "--topic", topic, "--table", table], "cannot reach Kafka at 127.0.0.1:1"),
        (["-b", kafka_bootstrap_servers, "--topic", topic, "--table", table, "-X", "no.such.setting=1"],
         "no.such.setting"),
        (["-b", kafka_bootstrap_servers, "--topic", topic, "--table", table, "--value-format", "json",
          "--value-schema", "s STRUCT<a: INT, b: STRING, c: FOO>"], "expected a Spark SQL type"),
        (["-b", kafka_bootstrap_servers, "--topic", topic, "--table", str(blocker / "t")], "is not writable"),
    ]
    for args, expected in cases:
        started = time.monotonic()
        result = chandy("pipeline", "run", *args, timeout=60)
        last = result.stderr.strip().splitlines()[-1]
        assert result.returncode == 2, result.stderr
        assert expected in last and last.startswith("error: "), result.stderr
        assert "Traceback" not in result.stderr and "SparkContext" not in result.stderr
        assert time.monotonic() - started < 40


def start_after_first_commit(args: list[str], table: str) -> subprocess.Popen:
    """Start ``chandy <args>`` and return once the table has its first commit after creation."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    process = subprocess.Popen([sys.executable, "-m", "chandy.cli", *args], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (DeltaTable.is_deltatable(table) and DeltaTable(table).version() >= 1):
        time.sleep(0.5)
    return process


def test_sigterm_finishes_the_checkpoint_in_flight_and_exits_143(kafka_bootstrap_servers, tmp_path) -> None:
    topic = make_topic(kafka_bootstrap_servers, [f"v-{i}".encode() for i in range(3000)])
    table = str(tmp_path / "t")
    prefix = f"op{uuid.uuid4().hex[:6]}"
    args = ["pipeline", "run", "--table", table, "--topic", topic, "-b", kafka_bootstrap_servers, "--prefix", prefix,
            "--max-records-per-checkpoint", "50", "--until-drained", "--master", "local[2]"]
    process = start_after_first_commit(args, table)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 143, err[-2000:]
    assert "stopped by SIGTERM" in out
    partial = landed(table)
    assert 0 < len(partial) < 3000 and len(partial) == len(set(partial))
    finished = chandy(*args)
    assert finished.returncode == 0, finished.stderr[-2000:]
    rows = landed(table)
    assert len(rows) == len(set(rows)) == 3000


def test_a_fenced_run_stops_at_once_and_says_so(kafka_bootstrap_servers, tmp_path) -> None:
    from chandy.coordinator.kafka.runtime import CoordinatorService
    from chandy.coordinator.options import CheckpointingOptions

    topic = make_topic(kafka_bootstrap_servers, [f"v-{i}".encode() for i in range(20000)])
    table = str(tmp_path / "t")
    prefix = f"op{uuid.uuid4().hex[:6]}"
    args = ["pipeline", "run", "--table", table, "--topic", topic, "-b", kafka_bootstrap_servers, "--prefix", prefix,
            "--max-records-per-checkpoint", "20", "--until-drained", "--master", "local[2]"]
    process = start_after_first_commit(args, table)
    job_id = default_job_id(table, [topic])
    newer = CoordinatorService(job_id, kafka_bootstrap_servers,
                               CheckpointingOptions(checkpoint_dir=f"file://{tmp_path}/other"), {"lake-sink": 2},
                               prefix=prefix)
    fenced_at = time.monotonic()
    newer.start(periodic=False)
    try:
        out, err = process.communicate(timeout=120)
        took = time.monotonic() - fenced_at
    finally:
        newer.stop()
    assert process.returncode == 3, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert f"fenced by a newer coordinator (epoch {newer.epoch})" in last
    assert took < 60  # not the checkpoint timeout (300 s)
    rows = landed(table)
    assert len(rows) == len(set(rows))


def _timestamps(servers: str, topic: str, partitions: int = 2) -> dict[tuple[str, int, int], int]:
    """Every record of ``topic`` and its Kafka timestamp (ms), read by a plain consumer."""
    consumer = kafka_config.consumer(servers)
    reader = KafkaRangeReader(servers)
    found = {}
    for p in range(partitions):
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)
        found |= {(topic, p, m.offset()): m.timestamp()[1] for m in reader.read(KafkaPartitionSplit(topic, p, low, high))}
    consumer.close()
    reader.close()
    return found


def test_a_backfill_of_a_time_window_lands_exactly_its_records_then_stops(spark, kafka_bootstrap_servers,
                                                                          tmp_path) -> None:
    """Issue 47 (Spark's startingOffsetsByTimestamp / endingOffsets, Flink's timestamp initializer
    and setBounded): --starting-offsets timestamp:T1 --ending-offsets timestamp:T2 lands exactly
    the records whose Kafka timestamps are in [T1, T2), as a plain consumer reads them, and stops
    (not drained: more records follow T2); a run stopped mid-backfill lands the rest exactly once."""
    topic = make_topic(kafka_bootstrap_servers, [])
    # an hour ago, in whole seconds: inside the broker's retention (7 days), which deletes older
    # records while the test runs (a fixed date here failed once the date was two months past)
    base = (int(time.time()) - 3600) * 1000
    producer = kafka_config.producer(kafka_bootstrap_servers)
    for i in range(300):  # 100 records before the window, 100 in it, 100 after
        producer.produce(topic, f"v-{i}".encode(), f"k{i}".encode(), partition=i % 2, timestamp=base + i * 1000)
    producer.flush(30)
    t1, t2 = base + 100_000, base + 200_000
    window = {r for r, ts in _timestamps(kafka_bootstrap_servers, topic).items() if t1 <= ts < t2}
    assert len(window) == 100
    table, prefix = str(tmp_path / "t"), f"op{uuid.uuid4().hex[:6]}"
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t1 / 1000))
    assert __import__("datetime").datetime.fromisoformat(iso).timestamp() * 1000 == t1
    opts = options(kafka_bootstrap_servers, topic, table, prefix, stop_when_drained=False, starting_offsets=f"timestamp:{iso}",
                   ending_offsets=f"timestamp:{t2}", max_records_per_checkpoint=20)
    first = Pipeline(PipelineOptions(**{**opts.__dict__, "max_checkpoints": 2}), spark=spark).run()
    assert 0 < first.records_landed < 100  # stopped mid-backfill
    rest = Pipeline(opts, spark=spark).run()
    assert rest.stopped_because.startswith("reached --ending-offsets")
    rows = landed(table)
    assert len(rows) == len(set(rows)) == 100 and set(rows) == window
    assert first.records_landed + rest.records_landed == 100
    with pytest.raises(PipelineError, match=r"--ending-offsets: 'earliest' is not one of latest"):
        PipelineOptions(**{**opts.__dict__, "ending_offsets": "earliest"})
    # issue 54, finding H: a JSON map naming partition 0 only ended partition 1 at earliest, and the
    # run exited 0 "reached --ending-offsets" having landed nothing of it; refused, as Spark does
    version = DeltaTable(table).version()
    with pytest.raises(PipelineError, match=rf"--ending-offsets names no offset for {topic}-1: JSON offsets must name "
                                            "every partition"):
        Pipeline(PipelineOptions(**{**opts.__dict__, "ending_offsets": json.dumps({topic: {"0": 250}})}), spark=spark).run()
    assert DeltaTable(table).version() == version


def test_a_topic_recreated_below_the_jobs_position_ends_the_job_naming_it(spark, kafka_bootstrap_servers,
                                                                          tmp_path) -> None:
    """Issue 54, finding B: when a partition's log ends below the job's position (the topic deleted
    and created again), the job saw no lag, read nothing, said nothing, and once the new log grew
    past its old position skipped every record below it for good. As Spark's failOnDataLoss
    ("offset was changed from X to Y"), the run now ends in one line naming the partition and both
    offsets; --no-fail-on-data-loss goes on from the job's position (the table holds the offsets
    below it) once the new log reaches it, with a notice, and counts the offsets lost once."""
    from tests.fixtures.kafka import create_again

    topic = make_topic(kafka_bootstrap_servers, [f"v{i}".encode() for i in range(10)], partitions=1)
    table, prefix = str(tmp_path / "t"), f"op{uuid.uuid4().hex[:6]}"
    opts = options(kafka_bootstrap_servers, topic, table, prefix)
    assert Pipeline(opts, spark=spark).run().records_landed == 10
    admin = kafka_config.admin_client(kafka_bootstrap_servers)
    admin.delete_topics([topic])[topic].result(30)
    create_again(admin, topic, 1)
    produce(kafka_bootstrap_servers, topic, [f"new{i}".encode() for i in range(3)], 1)
    with pytest.raises(PipelineError, match=rf"KafkaDataLossError: {topic}-0: the log ends at offset 3, below the job's "
                                            r"position 10 \(offset was changed from 10 to 3\): the topic was deleted and "
                                            r"created again, or an unclean leader election truncated the log"):
        Pipeline(opts, spark=spark).run()
    # the job is FAILED for good (a restart would meet the same log): a plain run is refused, naming
    # the checkpoint to restore, and restoring it with --no-fail-on-data-loss goes on
    with pytest.raises(PipelineError, match=r"restore it with --from-savepoint PATH.*the latest: \S+\)") as refused:
        Pipeline(PipelineOptions(**{**opts.__dict__, "fail_on_data_loss": False}), spark=spark).run()
    found = re.search(r"the latest: (\S+)\)", str(refused.value))
    assert found is not None
    going_on = Pipeline(PipelineOptions(**{**opts.__dict__, "fail_on_data_loss": False,
                                           "from_savepoint": found.group(1)}), spark=spark).run()
    assert going_on.records_landed == 0 and going_on.offsets_lost == 7
    assert any(notice.startswith(f"data loss: {topic}-0: the log ends at offset 3") and "going on from offset 10 once the "
               "new log reaches it" in notice for notice in going_on.notices), going_on.notices
    assert len(landed(table)) == 10
    # the new log past the old position: the job reads on from it, exactly once
    produce(kafka_bootstrap_servers, topic, [f"more{i}".encode() for i in range(12)], 1)
    more = Pipeline(PipelineOptions(**{**opts.__dict__, "fail_on_data_loss": False}), spark=spark).run()
    assert more.records_landed == 5 and more.offsets_lost == 0 and not any("data loss" in n for n in more.notices)
    assert sorted(o for _, _, o in landed(table)) == list(range(10)) + list(range(10, 15))


def test_records_gone_from_kafka_end_the_job_then_are_skipped_only_when_asked(spark, kafka_bootstrap_servers,
                                                                                tmp_path) -> None:
    """Spark's failOnDataLoss: offsets of a checkpoint's range deleted before they were read (as
    retention deletes them while a job is down) end the job with KafkaDataLossError naming them,
    without a restart loop, and nothing of that checkpoint lands nor reaches the consumer group;
    the failed job restored from its latest checkpoint with --no-fail-on-data-loss then lands
    exactly the records still in Kafka, once."""
    topic = make_topic(kafka_bootstrap_servers, [f"v{i}".encode() for i in range(200)], partitions=1)
    table, prefix = str(tmp_path / "t"), f"op{uuid.uuid4().hex[:6]}"
    opts = options(kafka_bootstrap_servers, topic, table, prefix, group_id="g-" + prefix,
                   max_records_per_checkpoint=50)
    first = Pipeline(PipelineOptions(**{**opts.__dict__, "max_checkpoints": 1}), spark=spark).run()
    assert first.records_landed == 50
    admin = kafka_config.admin_client(kafka_bootstrap_servers)
    admin.delete_records([TopicPartition(topic, 0, 120)])[TopicPartition(topic, 0, 120)].result(30)
    # found when the enumerator fixes the ranges (the log start 120 above the position 50), before any task reads
    with pytest.raises(PipelineError, match=rf"KafkaDataLossError: {topic}-0: offsets \[50, 120\) are no longer in "
                                            r"Kafka \(the log start offset moved above the job's position 50 to 120; "
                                            r"the log holds \[120, 200\)\).*--no-fail-on-data-loss"):
        Pipeline(opts, spark=spark).run()
    # a plain restart of the FAILED job is refused, naming the checkpoint to restore
    with pytest.raises(PipelineError, match=r"restore it with --from-savepoint PATH.*the latest: \S+\)") as refused:
        Pipeline(PipelineOptions(**{**opts.__dict__, "fail_on_data_loss": False}), spark=spark).run()
    found = re.search(r"the latest: (\S+)\)", str(refused.value))
    assert found is not None
    latest = found.group(1)
    assert sorted(o for _, _, o in landed(table)) == list(range(50))
    assert group_offsets(kafka_bootstrap_servers, "g-" + prefix, topic, 1) == {0: 50}
    rest = Pipeline(PipelineOptions(**{**opts.__dict__, "fail_on_data_loss": False, "from_savepoint": latest}),
                    spark=spark).run()
    offsets = sorted(o for _, _, o in landed(table))
    assert offsets == list(range(50)) + list(range(120, 200))
    assert rest.records_landed == 80
    assert group_offsets(kafka_bootstrap_servers, "g-" + prefix, topic, 1) == {0: 200}



def test_min_records_per_checkpoint_waits_for_enough_records_up_to_the_max_trigger_delay(
        spark, kafka_bootstrap_servers, tmp_path) -> None:
    """Issue 47 (Spark's minOffsetsPerTrigger with maxTriggerDelay): with 10 records waiting and
    --min-records-per-checkpoint 50, a running job triggers no checkpoint (without the option it
    lands the 10 at once); 45 more arrive and one checkpoint lands all 55; then 5 records wait
    until --max-trigger-delay (2 s) has passed and land in a checkpoint of their own."""
    import threading

    topic = make_topic(kafka_bootstrap_servers, [f"m{i}".encode() for i in range(10)], partitions=1)
    table, prefix = str(tmp_path / "t"), f"op{uuid.uuid4().hex[:6]}"
    opts = options(kafka_bootstrap_servers, topic, table, prefix, stop_when_drained=False, max_checkpoints=1,
                   checkpoint_interval_ms=100, min_records_per_checkpoint=50, max_trigger_delay_ms=600_000)
    pipeline = Pipeline(opts, spark=spark)
    results: list = []
    thread = threading.Thread(target=lambda: results.append(pipeline.run()))
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while pipeline.service is None or pipeline.service.coordinator is None:  # not yet leading its job
            assert time.monotonic() < deadline and thread.is_alive(), "the job never started"
            time.sleep(0.1)
        time.sleep(3)  # 30 intervals of 100 ms: without the minimum, checkpoint 1 would hold the 10
        produce(kafka_bootstrap_servers, topic, [f"n{i}".encode() for i in range(45)], 1)
        thread.join(120)
    finally:
        if thread.is_alive():
            pipeline.request_stop()
            thread.join(60)
    assert results and results[0].records_landed == 55 and len(landed(table)) == 55
    produce(kafka_bootstrap_servers, topic, [f"o{i}".encode() for i in range(5)], 1)
    delayed = Pipeline(PipelineOptions(**{**opts.__dict__, "max_trigger_delay_ms": 2000}), spark=spark)
    started = time.monotonic()
    assert delayed.run().records_landed == 5
    assert time.monotonic() - started >= 2.0  # held back for the delay, then triggered with 5 < 50
    assert sorted(o for _, _, o in landed(table)) == list(range(60))


def test_each_commit_says_up_to_which_event_time_the_table_is_complete(spark, kafka_bootstrap_servers,
                                                                        tmp_path) -> None:
    """Issue 47 (the completeness watermark, Kafka Connect Iceberg sink's valid-through
    timestamp): every LAKE_COMMITTED event and Delta commit carries, per partition, the newest
    Kafka timestamp landed and their minimum, as read back with fastavro and deltalake; a restart
    that lands only partition 0 keeps partition 1's time from the table, so the minimum never
    claims what partition 1 has not landed."""
    from tests.fixtures import exactly_once

    topic = make_topic(kafka_bootstrap_servers, [])
    base = (int(time.time()) - 600) * 1000  # inside the broker's retention
    producer = kafka_config.producer(kafka_bootstrap_servers)
    for i in range(40):  # partition 0 at base + i s, partition 1 stamped a minute earlier
        producer.produce(topic, f"v{i}".encode(), partition=i % 2, timestamp=base + i * 1000 - 60_000 * (i % 2))
    producer.flush(30)
    table, prefix = str(tmp_path / "t"), f"op{uuid.uuid4().hex[:6]}"
    opts = options(kafka_bootstrap_servers, topic, table, prefix, max_records_per_checkpoint=10)
    first = Pipeline(opts, spark=spark).run()
    newest = {0: base + 38_000, 1: base + 39_000 - 60_000}
    events = [e for e in exactly_once.read_events(kafka_bootstrap_servers, prefix, first.job_id)
              if e["event_type"] == "LAKE_COMMITTED"]
    assert len(events) == first.checkpoints_completed == 2
    last = events[-1]
    assert {(t["topic"], t["partition"]): t["event_time_ms"] for t in last["event_times"]} == \
        {(topic, 0): newest[0], (topic, 1): newest[1]}
    assert last["valid_through_ms"] == newest[1]
    assert events[0]["valid_through_ms"] < last["valid_through_ms"]  # checkpoint 1 landed 10 of each
    assert DeltaTable(table).history(1)[0]["chandy.valid_through_ms"] == str(newest[1])
    for i in range(40, 46):  # only partition 0 gets more
        producer.produce(topic, f"v{i}".encode(), partition=0, timestamp=base + i * 1000)
    producer.flush(30)
    again = Pipeline(opts, spark=spark).run()
    assert again.records_landed == 6
    commit = DeltaTable(table).history(1)[0]
    assert json.loads(commit["chandy.event_time_ms"]) == {topic: {"0": base + 45_000, "1": newest[1]}}
    assert commit["chandy.valid_through_ms"] == str(newest[1])


def test_a_partition_never_read_holds_the_completeness_watermark_back_until_idle(spark, kafka_bootstrap_servers,
                                                                                tmp_path) -> None:
    """Issue 54, finding F, end to end: a topic of three partitions whose partition 2 never gets a
    record. Every assigned partition holds ``valid_through_ms`` back until read (a Flink watermark
    without idleness): the table's commits and the LAKE_COMMITTED events (read back with deltalake
    and fastavro) carry no watermark, though partitions 0 and 1 are read. With
    ``--source-idle-timeout`` (Flink's ``withIdleness``) partition 2 stops holding it back once
    idle, and the event names it in ``idle_partitions``."""
    from tests.fixtures import exactly_once

    topic = make_topic(kafka_bootstrap_servers, [], partitions=3)
    base = (int(time.time()) - 600) * 1000
    producer = kafka_config.producer(kafka_bootstrap_servers)
    for i in range(20):  # partitions 0 and 1 only
        producer.produce(topic, f"v{i}".encode(), partition=i % 2, timestamp=base + i * 1000)
    producer.flush(30)
    table, prefix = str(tmp_path / "t"), f"op{uuid.uuid4().hex[:6]}"
    first = Pipeline(options(kafka_bootstrap_servers, topic, table, prefix), spark=spark).run()
    events = [e for e in exactly_once.read_events(kafka_bootstrap_servers, prefix, first.job_id)
              if e["event_type"] == "LAKE_COMMITTED"]
    assert events and all(e["valid_through_ms"] is None for e in events)
    assert {(t["partition"], t["event_time_ms"]) for t in events[-1]["event_times"]} == {(0, base + 18_000),
                                                                                       (1, base + 19_000)}
    assert "chandy.valid_through_ms" not in DeltaTable(table).history(1)[0]
    assert json.loads(DeltaTable(table).history(1)[0]["chandy.event_time_ms"]) == {
        topic: {"0": base + 18_000, "1": base + 19_000}}
    idle_table, idle_prefix = str(tmp_path / "idle"), f"op{uuid.uuid4().hex[:6]}"
    idle_opts = options(kafka_bootstrap_servers, topic, idle_table, idle_prefix, max_records_per_checkpoint=4,
                        checkpoint_interval_ms=300, source_idle_timeout_ms=200)
    second = Pipeline(idle_opts, spark=spark).run()
    events = [e for e in exactly_once.read_events(kafka_bootstrap_servers, idle_prefix, second.job_id)
              if e["event_type"] == "LAKE_COMMITTED"]
    assert len(events) >= 3
    last = events[-1]
    assert last["valid_through_ms"] == base + 18_000  # partitions 0 and 1 read, partition 2 idle
    assert {(p["topic"], p["partition"]) for p in last["idle_partitions"]} >= {(topic, 2)}
    assert DeltaTable(idle_table).history(1)[0]["chandy.valid_through_ms"] == str(base + 18_000)


def test_a_table_partitioned_by_the_day_and_a_bucket_of_the_kafka_record(spark, kafka_bootstrap_servers,
                                                                         tmp_path) -> None:
    """Issue 47 (partition transforms): --partition-by day(timestamp) --partition-by bucket(4,
    offset) on raw records: the Delta table is partitioned by timestamp_day and offset_bucket,
    each row's timestamp_day is its Kafka timestamp's UTC date, and every record lands once."""
    topic = make_topic(kafka_bootstrap_servers, [])
    base = (int(time.time()) - 86_400) * 1000  # yesterday and today, inside the broker's retention
    producer = kafka_config.producer(kafka_bootstrap_servers)
    for i in range(40):
        producer.produce(topic, f"v{i}".encode(), partition=i % 2, timestamp=base + (i // 20) * 86_400_000)
    producer.flush(30)
    table, prefix = str(tmp_path / "t"), f"op{uuid.uuid4().hex[:6]}"
    opts = options(kafka_bootstrap_servers, topic, table, prefix, partition_by=("day(timestamp)", "bucket(4, offset)"))
    assert Pipeline(opts, spark=spark).run().records_landed == 40
    delta = DeltaTable(table)
    assert delta.metadata().partition_columns == ["timestamp_day", "offset_bucket"]
    rows = delta.to_pyarrow_table().to_pylist()
    assert len({(r["partition"], r["offset"]) for r in rows}) == len(rows) == 40
    assert all(r["timestamp_day"] == r["timestamp"].astimezone(__import__("datetime").UTC).date() for r in rows)
    assert {r["offset_bucket"] for r in rows} <= {0, 1, 2, 3} and len({r["timestamp_day"] for r in rows}) == 2


def test_a_transaction_left_open_by_a_killed_coordinator_does_not_stall_the_next_start(kafka_bootstrap_servers,
                                                                                        tmp_path) -> None:
    """A coordinator SIGKILLed between send_offsets_to_transaction and its commit leaves the
    group's offsets unstable (KIP-447) until the next coordinator fences it. The start's check of
    a group ahead of the table runs before that fencing: it reads the group's stable offsets at
    once instead of waiting 30 s for stable ones and failing with a traceback (a standby's
    take-over did, once in four clean-clone CI runs), and moves a group ahead of the table back."""
    from confluent_kafka import Producer

    topic = make_topic(kafka_bootstrap_servers, [f"v{i}".encode() for i in range(20)], partitions=1)
    table, prefix = str(tmp_path / "t"), f"op{uuid.uuid4().hex[:6]}"
    opts = options(kafka_bootstrap_servers, topic, table, prefix, group_id=f"g-{prefix}")
    group = kafka_config.consumer(kafka_bootstrap_servers, group_id=opts.group_id)
    group.commit(offsets=[TopicPartition(topic, 0, 12)], asynchronous=False)  # ahead of the table's 8
    producer = Producer({"bootstrap.servers": kafka_bootstrap_servers, "transactional.id": f"tx-{prefix}"})
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.send_offsets_to_transaction([TopicPartition(topic, 0, 15)], group.consumer_group_metadata(), 30)
    try:  # the transaction stays open, as a killed coordinator's does
        started = time.monotonic()
        Pipeline(opts)._rewind_group_past_table({(topic, 0): 8})
        assert time.monotonic() - started < 20  # read_committed waited 30 s for stable offsets, then raised
    finally:
        producer.abort_transaction(30)  # what the next coordinator's fencing does
        group.close()
    assert group_offsets(kafka_bootstrap_servers, opts.group_id, topic, 1) == {0: 8}

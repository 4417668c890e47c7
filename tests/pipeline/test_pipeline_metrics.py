"""The pipeline's metrics on its coordinator's Prometheus endpoint, scraped while it runs on a real
broker, real Spark and a real Delta table (run under ``flock /tmp/chandy-spark.lock``)."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from chandy.connectors.spark.options import PipelineOptions, PipelineProgress
from chandy.connectors.spark.pipeline import Pipeline
from tests.fixtures.lake_pipeline import make_topic
from tests.fixtures.ui import get

pytestmark = pytest.mark.integration


def test_pipeline_and_checkpoint_metrics_are_scraped_while_it_runs(lake_spark, kafka_bootstrap_servers, tmp_path: Path):
    import time

    produced_ms = time.time() * 1000
    topic = make_topic(kafka_bootstrap_servers, [b"v%d" % i for i in range(300)], partitions=2)
    pipeline = Pipeline(PipelineOptions(table_uri=str(tmp_path / "table"), bootstrap_servers=kafka_bootstrap_servers,
                                        topics=(topic,), stop_when_drained=True, max_records_per_checkpoint=100,
                                        prefix=f"pm{uuid.uuid4().hex[:6]}", metrics_port=0), spark=lake_spark)
    scrapes: list[tuple[PipelineProgress, dict]] = []

    def scrape(progress: PipelineProgress) -> None:
        assert pipeline.service is not None and pipeline.service.metrics_server is not None
        status, text = get(f"http://127.0.0.1:{pipeline.service.metrics_server.port}/metrics")
        assert status == 200
        scrapes.append((progress, {(s.name, tuple(sorted(s.labels.items()))): s.value
                                   for f in text_string_to_metric_families(text) for s in f.samples}))

    summary = pipeline.run(on_progress=scrape)
    ended_ms = time.time() * 1000
    assert summary.records_landed == 300 and summary.checkpoints_completed == 2
    job = pipeline.job_id
    scope = (("host", socket.gethostname()), ("job_id", job), ("job_name", f"{topic} -> {pipeline.options.table_uri}"))
    task = ("task_name", "Source: kafka-source -> lake-sink")

    def operator(name: str, subtask: int = 0, *extra: tuple[str, str]) -> tuple:
        return tuple(sorted((*scope, task, ("operator_name", name), ("subtask_index", str(subtask)), *extra)))

    sink, source = operator("lake-sink"), operator("kafka-source")
    op = "flink_taskmanager_job_task_operator_"
    first, last = scrapes[0][1], scrapes[-1][1]
    assert first[(op + "numRecordsOut", sink)] == scrapes[0][0].records_landed == 200  # 100 per partition
    assert first[(op + "numRecordsIn", source)] == 200
    assert first[(op + "pendingRecords", operator("kafka-source", 0, ("partition", "0"), ("topic", topic)))] == 50
    assert last[(op + "numRecordsOut", sink)] == 300
    assert last[(op + "pendingRecords", operator("kafka-source", 1, ("partition", "1"), ("topic", topic)))] == 0
    assert last[(op + "lastMicroBatchDuration", sink)] == pytest.approx(scrapes[-1][0].checkpoint_duration_ms)
    assert last[(op + "numRecordsOutPerSecond", sink)] > 0 and last[(op + "numRecordsInPerSecond", source)] > 0
    assert 0 < last[(op + "lastLakeCommitDuration", sink)] < last[(op + "lastMicroBatchDuration", sink)]
    assert last[("flink_jobmanager_job_numberOfCompletedCheckpoints", scope)] == 2
    assert last[("flink_jobmanager_job_lastCompletedCheckpointId", scope)] == scrapes[-1][0].checkpoint_id
    assert not any(name in ("numRecordsOut", "pendingRecords") for name, _ in last)  # 0.1's names only on request
    # issue 33: Flink's currentFetchEventTimeLag per subtask: the records were produced before the
    # run, and fetched during it
    lags = {dict(labels)["subtask_index"]: value for (name, labels), value in last.items()
            if name == op + "currentFetchEventTimeLag"}
    assert lags, "no currentFetchEventTimeLag served"
    assert all(0 <= lag <= ended_ms - produced_ms + 1000 for lag in lags.values()), lags
    # issue 47: the rest of Flink's job and Kafka-source names dashboards query
    assert last[("flink_jobmanager_numRunningJobs", (("host", socket.gethostname()),))] == 1
    assert last[("flink_jobmanager_job_restartingTime", scope)] == 0  # no restart in this run
    assert first[(op + "KafkaSourceReader_commitsSucceeded", source)] == 1
    assert last[(op + "KafkaSourceReader_commitsSucceeded", source)] == 2
    assert last[(op + "KafkaSourceReader_commitsFailed", source)] == 0
    assert 0 <= last[(op + "sourceIdleTime", source)] < ended_ms - produced_ms
    emitted = {dict(labels)["subtask_index"]: value for (name, labels), value in last.items()
               if name == op + "currentEmitEventTimeLag"}
    assert emitted == lags  # chained in one task: a record is emitted to the writer as it is fetched
    assert last[("flink_taskmanager_job_task_checkpointAlignmentTime", tuple(sorted((*scope, task,
                                                                                     ("subtask_index", "0")))))] == 0
    # the records' key and value bytes per second (make_topic keys record i as k<i>)
    read = sum(len(b"v%d" % i) + len(f"k{i}") for i in range(300))
    assert last[(op + "KafkaSourceReader_KafkaConsumer_bytes_consumed_rate", source)] == pytest.approx(
        read / scrapes[-1][0].elapsed_s)
    # records per Fetch request, from the tasks' librdkafka statistics: at least one record a request
    # (every range read has records), at most the 300 the run read
    per_request = last[(op + "KafkaSourceReader_KafkaConsumer_records_per_request_avg", source)]
    assert 1 <= per_request <= 300, per_request


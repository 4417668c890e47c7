"""The coordinator's Prometheus endpoint and `chandy ui`'s REST endpoints (Flink's shapes), on a
real broker with worker participants."""

from __future__ import annotations

import socket
import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families

from chandy.coordinator.failure import CheckpointException
from chandy.coordinator.kafka.metrics import MetricsError
from chandy.coordinator.kafka.runtime import CoordinatorService
from tests.fixtures.ui import chandy_ui, get, get_json, running_job
from tests.fixtures.workers import options, wait_for

pytestmark = pytest.mark.integration


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_metrics_endpoint_shows_flinks_checkpoint_gauges_with_the_job_label(kafka_bootstrap_servers, topic_prefix, tmp_path):
    """Flink's Prometheus reporter's names and labels (issue 33): flink_jobmanager_job_<metric>
    with job_id, job_name and host; an operator's numberOfSubtasks under the operator scope."""
    with running_job(kafka_bootstrap_servers, topic_prefix, tmp_path, metrics_port=0) as service:
        assert service.metrics_server is not None
        port = service.metrics_server.port
        job = (("host", socket.gethostname()), ("job_id", service.job_id), ("job_name", f"job of {topic_prefix}"))
        before = scrape(port)
        assert before[("flink_jobmanager_job_numberOfCompletedCheckpoints", job)] == 0
        assert before[("flink_jobmanager_job_lastCompletedCheckpointId", job)] == -1
        assert before[("flink_jobmanager_job_lastCheckpointDuration", job)] == -1
        record = service.trigger_checkpoint().result(30)
        after = scrape(port)
        stats = service.stats()
        assert after[("flink_jobmanager_job_numberOfCompletedCheckpoints", job)] >= 1
        assert after[("flink_jobmanager_job_lastCompletedCheckpointId", job)] == record.checkpoint_id
        assert after[("flink_jobmanager_job_lastCheckpointDuration", job)] == stats["latest"]["completed"]["end_to_end_duration"]
        assert after[("flink_jobmanager_job_lastCheckpointSize", job)] == 14  # two subtasks, 7 bytes each
        assert after[("flink_jobmanager_job_totalNumberOfCheckpoints", job)] == 1
        assert after[("flink_jobmanager_job_numberOfInProgressCheckpoints", job)] == 0
        assert after[("flink_jobmanager_job_numRestarts", job)] == 0  # the job's first coordinator
        assert after[("flink_jobmanager_job_uptime", job)] > before[("flink_jobmanager_job_uptime", job)] > 0
        operator = (*job, ("operator_name", "src"), ("subtask_index", "0"), ("task_name", "src"))
        assert after[("flink_taskmanager_job_task_operator_numberOfSubtasks", tuple(sorted(operator)))] == 2
        assert not any(name == "lastCheckpointDuration" for name, _ in after)  # Chandy 0.1's names: only on request
        assert after[("flink_jobmanager_job_runningState", job)] == 1 and after[("flink_jobmanager_job_failedState", job)] == 0
        service.fail_job("a test fails it").result(10)  # FAILED is FAILED (issue 33), not SUSPENDED
        failed = scrape(port)
        assert failed[("flink_jobmanager_job_failedState", job)] == 1
        assert failed[("flink_jobmanager_job_runningState", job)] == failed[("flink_jobmanager_job_suspendedState", job)] == 0
    with pytest.raises(OSError):  # stopping the coordinator stops its metrics server
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def test_failed_checkpoints_are_counted_under_flinks_and_on_request_chandy_0_1s_names(
        kafka_bootstrap_servers, topic_prefix, tmp_path):
    with running_job(kafka_bootstrap_servers, topic_prefix, tmp_path, metrics_port=0, decline={1},
                     metrics_legacy_names=True) as service:
        with pytest.raises(CheckpointException):
            service.trigger_checkpoint().result(30)
        values = scrape(service.metrics_server.port)
        job = (("host", socket.gethostname()), ("job_id", service.job_id), ("job_name", f"job of {topic_prefix}"))
        assert values[("flink_jobmanager_job_numberOfFailedCheckpoints", job)] == 1
        assert values[("flink_jobmanager_job_numberOfCompletedCheckpoints", job)] == 0
        assert values[("numberOfFailedCheckpoints", (("job_id", service.job_id),))] == 1
        assert values[("numberOfCompletedCheckpoints", (("job_id", service.job_id),))] == 0
        assert values[("numberOfSubtasks", (("job_id", service.job_id), ("operator", "src")))] == 2


def test_a_taken_metrics_port_fails_the_start_with_a_typed_error(kafka_bootstrap_servers, topic_prefix, tmp_path):
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        service = CoordinatorService(uuid.uuid4().hex, kafka_bootstrap_servers, options(tmp_path), {"src": 1},
                                     prefix=topic_prefix, metrics_port=port)
        with pytest.raises(MetricsError, match=f":{port}"):
            service.start(periodic=False)
        assert service.coordinator is None and service.metrics_server is None


def test_rest_endpoints_serve_flinks_shapes_from_the_events_topic(kafka_bootstrap_servers, topic_prefix, tmp_path):
    with running_job(kafka_bootstrap_servers, topic_prefix, tmp_path, decline={2}) as service, \
            chandy_ui(kafka_bootstrap_servers, topic_prefix) as url:
        job = service.job_id
        first = service.trigger_checkpoint().result(30)
        with pytest.raises(CheckpointException):
            service.trigger_checkpoint().result(30)
        pointer = service.trigger_savepoint().result(30)
        expected = service.stats()

        def counts():
            status, body = get_json(f"{url}jobs/{job}/checkpoints")
            return body["counts"] if status == 200 and body["counts"]["total"] == 3 and body["counts"]["in_progress"] == 0 \
                else None

        assert wait_for(counts, what="the three checkpoints in chandy ui") == {
            "restored": 0, "total": 3, "in_progress": 0, "completed": 2, "failed": 1}
        status, body = get_json(f"{url}jobs/{job}/checkpoints")
        assert status == 200
        assert [c["id"] for c in body["history"]] == [3, 2, 1]
        assert body["latest"]["savepoint"]["external_path"] == pointer
        assert body["latest"]["failed"]["failure_reason"] == "CHECKPOINT_DECLINED"
        assert set(body["summary"]["end_to_end_duration"]) == {"min", "max", "avg", "p50", "p90", "p95", "p99", "p999"}

        status, details = get_json(f"{url}jobs/{job}/checkpoints/details/{first.checkpoint_id}")
        assert status == 200
        coordinator_view = next(c for c in expected["history"] if c["id"] == first.checkpoint_id)
        assert details["id"] == first.checkpoint_id and details["status"] == "COMPLETED"
        assert details["end_to_end_duration"] == coordinator_view["end_to_end_duration"]
        assert details["state_size"] == 14 and details["num_acknowledged_subtasks"] == 2 and details["num_subtasks"] == 2
        assert details["trigger_timestamp"] == coordinator_view["trigger_timestamp"]
        assert details["external_path"] == first.external_pointer and details["is_savepoint"] is False

        status, jobs = get_json(f"{url}jobs")
        assert status == 200 and {"id": job, "status": "RUNNING", "name": f"job of {topic_prefix}"}.items() <= next(
            j for j in jobs["jobs"] if j["id"] == job).items()
        # issue 33: Flink's GET /jobs/:jobid (its vertices) and GET /jobs/:jobid/checkpoints/config
        status, details = get_json(f"{url}jobs/{job}")
        assert status == 200 and (details["jid"], details["name"], details["state"]) == (job, f"job of {topic_prefix}",
                                                                                        "RUNNING")
        assert [(v["id"], v["parallelism"], v["status"]) for v in details["vertices"]] == [("src", 2, "RUNNING")]
        assert details["start-time"] <= first.trigger_timestamp and details["end-time"] == -1 and details["duration"] > 0
        status, config = get_json(f"{url}jobs/{job}/checkpoints/config")
        o = service.options
        assert status == 200 and config["mode"] == "exactly_once"
        assert (config["interval"], config["timeout"], config["min_pause"], config["max_concurrent"],
                config["tolerable_failed_checkpoints"], config["num_retained"]) == (
            o.interval_ms, o.timeout_ms, o.min_pause_ms, o.max_concurrent, o.tolerable_failed, o.num_retained)
        assert config["externalization"] == {"enabled": True, "delete_on_cancellation": False}
        status, health = get_json(f"{url}health")
        assert status == 200 and health["status"] == "UP" and health["events_read"] >= 6

        for path, code, words in [
            (f"jobs/{'0' * 32}/checkpoints", 404, "not found"),
            (f"jobs/{'0' * 32}/checkpoints/details/1", 404, "not found"),
            (f"jobs/{'0' * 32}", 404, "not found"),
            (f"jobs/{'0' * 32}/checkpoints/config", 404, "not found"),
            (f"jobs/{job}/checkpoints/details/999", 404, "checkpoint 999"),
            (f"jobs/{job}/checkpoints/details/abc", 400, "integer"),
            ("nothing/here", 404, "not found"),
        ]:
            status, error = get_json(url + path)
            assert status == code, path
            assert list(error) == ["errors"] and words in error["errors"][0].lower(), (path, error)

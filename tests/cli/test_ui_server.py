"""`chandy ui`'s server before it reads anything (no broker reachable): /health says STARTING
with 503 and why, /jobs is empty, writes are refused with 405, the dashboard's assets are served."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

import pytest

from chandy.coordinator.kafka.jobs_view import JobsViewReader
from chandy.ui.server import UiHttpServer


@pytest.fixture(scope="module")
def server():
    reader = JobsViewReader("127.0.0.1:9", prefix="nobroker",
                            consumer_overrides={"socket.connection.setup.timeout.ms": 1000})
    http = UiHttpServer(reader, "127.0.0.1", 0)
    reader.start()
    thread = threading.Thread(target=http.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    yield http.url
    http.shutdown()
    http.server_close()
    reader.close()


def request(url: str, method: str = "GET") -> tuple[int, str, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read()


def test_health_is_503_until_the_events_topic_is_read(server):
    status, content_type, body = request(server + "health")
    assert status == 503 and content_type == "application/json"
    health = json.loads(body)
    assert health["status"] == "STARTING" and health["topic"] == "nobroker.checkpoint-events"
    assert health["events_read"] == 0


def test_the_dashboard_polls_a_status_that_is_200_while_starting_and_has_an_icon(server):
    """Issue 33: a starting server logs no error in the browser console (a 503 would), and the
    browser's own request for /favicon.ico is answered."""
    status, content_type, body = request(server + "ui/status")
    assert status == 200 and json.loads(body)["status"] == "STARTING"
    status, content_type, body = request(server + "favicon.ico")
    assert status == 200 and content_type == "image/svg+xml" and body.startswith(b"<svg")
    assert b'/static/favicon.svg' in request(server)[2]


def test_no_jobs_yet_and_read_only(server):
    assert json.loads(request(server + "jobs")[2]) == {"jobs": []}
    status, _, body = request(server + "jobs", method="POST")
    assert status == 405 and "read-only" in json.loads(body)["errors"][0]
    status, _, body = request(server + "jobs/abc/checkpoints", method="DELETE")
    assert status == 405


def test_the_dashboard_and_its_assets_are_served(server):
    status, content_type, body = request(server)
    assert status == 200 and content_type.startswith("text/html") and b'<svg id="chart"' in body
    status, content_type, body = request(server + "static/app.js")
    assert status == 200 and content_type.startswith("text/javascript") and b"setInterval(refresh" in body
    status, content_type, _ = request(server + "static/style.css")
    assert status == 200 and content_type.startswith("text/css")
    assert request(server + "static/missing.js")[0] == 404

"""``chandy ui``: a read-only REST server and checkpoint dashboard for every job, from the events topic.

Endpoints (JSON bodies in Flink's REST shapes, see :mod:`chandy.coordinator.checkpoint_view`):

=============================================== ==================================================
``GET /health``                                 ``{"status": "UP"|"STARTING", "topic", "events_read",
                                                "skipped", "error"}``; 503 until the topic is read
``GET /ui/status``                              the same body, always 200 (what the dashboard polls)
``GET /favicon.ico``                            the dashboard's icon (SVG)
``GET /jobs``                                   ``{"jobs": [{"id", "status", "epoch",
                                                "last_event_timestamp", "counts"}]}``
``GET /jobs/{job_id}/checkpoints``              Flink's ``CheckpointingStatistics``
``GET /jobs/{job_id}/checkpoints/details/{id}`` Flink's ``CheckpointStatistics``
``GET /``                                       the dashboard (HTML, polls the endpoints above)
=============================================== ==================================================

Errors answer as Flink's REST API does: a status and ``{"errors": ["what was wrong"]}`` (404 for
an unknown job, checkpoint or path, 400 for a checkpoint ID that is not an integer, 405 for
other methods). The server is the standard library's ``ThreadingHTTPServer``; the page's assets
are package data (``chandy/ui/static``), no build step.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from chandy.coordinator.errors import ChandyError
from chandy.coordinator.kafka.jobs_view import JobsViewReader

log = logging.getLogger(__name__)

_STATIC = {"/": ("index.html", "text/html; charset=utf-8"),
           "/index.html": ("index.html", "text/html; charset=utf-8"),
           "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
           "/static/style.css": ("style.css", "text/css; charset=utf-8"),
           # a browser asks for /favicon.ico by itself: answered, so its console shows no 404
           "/favicon.ico": ("favicon.svg", "image/svg+xml"),
           "/static/favicon.svg": ("favicon.svg", "image/svg+xml")}
_CHECKPOINTS = re.compile(r"^/jobs/([^/]+)/checkpoints/?$")
_DETAILS = re.compile(r"^/jobs/([^/]+)/checkpoints/details/([^/]+)/?$")
_JOB = re.compile(r"^/jobs/([^/]+)/?$")
_CONFIG = re.compile(r"^/jobs/([^/]+)/checkpoints/config/?$")
_LAKE = re.compile(r"^/jobs/([^/]+)/lake-commits/?$")


class UiServerError(ChandyError):
    """The UI server cannot start (port taken, bad address)."""


class _ApiError(Exception):
    def __init__(self, status: HTTPStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


def _unknown_job(reader: JobsViewReader, job_id: str) -> _ApiError:
    """Flink's 404 for a job ID the events topic has not shown."""
    return _ApiError(HTTPStatus.NOT_FOUND, f"Job {job_id} not found (no checkpoint event of it on {reader.topic})")


def route(reader: JobsViewReader, path: str) -> tuple[HTTPStatus, dict[str, Any]]:
    """The status and JSON body of ``GET path`` (query string removed) against ``reader``.

    Raises:
        _ApiError: 404 (unknown job, checkpoint or path) or 400 (a checkpoint ID that is not an integer).
    """
    if path in ("/health", "/ui/status"):
        up = reader.reading
        health = {"status": "UP" if up else "STARTING", "topic": reader.topic, "events_read": reader.events_read,
                  "skipped": reader.skipped, "error": reader.error}
        # /health answers 503 until the topic is read (for probes); the dashboard polls /ui/status,
        # the same body always with 200, so a starting server logs no error in the browser console
        return (HTTPStatus.OK if up or path == "/ui/status" else HTTPStatus.SERVICE_UNAVAILABLE), health
    if path in ("/jobs", "/jobs/"):
        return HTTPStatus.OK, {"jobs": reader.jobs()}
    for pattern, read in ((_JOB, reader.job_details), (_LAKE, reader.lake_commits), (_CHECKPOINTS, reader.checkpoints)):
        match = pattern.match(path)
        if match:
            body = read(match.group(1))
            if body is None:
                raise _unknown_job(reader, match.group(1))
            return HTTPStatus.OK, body
    match = _CONFIG.match(path)
    if match:
        if not reader.has_job(match.group(1)):
            raise _unknown_job(reader, match.group(1))
        config = reader.checkpoint_config(match.group(1))
        if config is None:
            raise _ApiError(HTTPStatus.NOT_FOUND, f"Job {match.group(1)} has not triggered a checkpoint yet: its "
                                                  "checkpointing configuration is not known")
        return HTTPStatus.OK, config
    match = _DETAILS.match(path)
    if match:
        job_id, raw_id = match.groups()
        try:
            checkpoint_id = int(raw_id)
        except ValueError:
            raise _ApiError(HTTPStatus.BAD_REQUEST, f"checkpoint ID must be an integer, got {raw_id!r}") from None
        if not reader.has_job(job_id):
            raise _unknown_job(reader, job_id)
        details = reader.checkpoint_details(job_id, checkpoint_id)
        if details is None:
            raise _ApiError(HTTPStatus.NOT_FOUND,
                            f"Could not find checkpointing statistics for checkpoint {checkpoint_id} of job {job_id}")
        return HTTPStatus.OK, details
    raise _ApiError(HTTPStatus.NOT_FOUND, f"Not found: {path}")


class _Handler(BaseHTTPRequestHandler):
    server: UiHttpServer
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in _STATIC:
            name, content_type = _STATIC[path]
            self._send(HTTPStatus.OK, resources.files("chandy.ui").joinpath("static", name).read_bytes(), content_type)
            return
        try:
            status, body = route(self.server.reader, path)
        except _ApiError as exc:
            status, body = exc.status, {"errors": [str(exc)]}
        self._send(status, json.dumps(body).encode(), "application/json")

    def _not_allowed(self) -> None:
        body = {"errors": [f"{self.command} is not supported: this server is read-only"]}
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, json.dumps(body).encode(), "application/json")

    do_POST = do_PUT = do_PATCH = do_DELETE = _not_allowed

    def _send(self, status: HTTPStatus, payload: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("%s %s", self.address_string(), fmt % args)


class UiHttpServer(ThreadingHTTPServer):
    """The HTTP server of ``chandy ui`` (see the module docstring) over a :class:`JobsViewReader`."""

    daemon_threads = True

    def __init__(self, reader: JobsViewReader, host: str = "127.0.0.1", port: int = 8081) -> None:
        self.reader = reader
        try:
            super().__init__((host, port), _Handler)
        except OSError as exc:
            raise UiServerError(f"cannot serve the UI on {host}:{port}: {exc.strerror or exc}") from exc

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host if isinstance(host, str) else host.decode()}:{port}/"


def serve(bootstrap_servers: str, *, host: str = "127.0.0.1", port: int = 8081, prefix: str = "chandy",
          history_size: int = 100, consumer_overrides: dict[str, Any] | None = None,
          ready: threading.Event | None = None, on_listening: Any = None) -> None:
    """Read ``<prefix>.checkpoint-events`` and serve the REST endpoints and the dashboard on
    ``host:port`` until interrupted (KeyboardInterrupt); ``port=0`` picks a free port, reported
    to ``on_listening(url)``.

    Raises:
        UiServerError: the address cannot be bound.
    """
    reader = JobsViewReader(bootstrap_servers, prefix=prefix, history_size=history_size,
                            consumer_overrides=consumer_overrides)
    try:
        server = UiHttpServer(reader, host, port)
    except UiServerError:
        reader.close()
        raise
    reader.start()
    if on_listening is not None:
        on_listening(server.url)
    if ready is not None:
        ready.set()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        reader.close()

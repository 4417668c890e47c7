"""Issue 45: a Schema Registry behind TLS, basic auth or a bearer token, reached with the settings
under confluent-kafka ``SchemaRegistryClient``'s own names (``--schema-registry-property``), by the
driver (the subject's latest version) and by the tasks' decoders (each record's writer schema).

TLS is a real Apicurio Registry serving HTTPS only, with a self-signed certificate made here by
``openssl``. Apicurio 2.x authenticates through an OpenID Connect server only, so basic auth and
bearer tokens are checked by a small authenticating proxy in front of the session's registry: what
is tested is that Chandy hands the credentials to the client, and that a refusal is one line
naming the registry. Without Spark."""

from __future__ import annotations

import base64
import http.server
import json
import subprocess
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import Schema

from chandy.formats.avro import avro_columns
from chandy.formats.decoder import ValueDecoder
from chandy.formats.records import to_record_batch
from chandy.formats.registry import RegistryError, latest_schema, registry_client
from tests.fixtures.avro_values import confluent_framed
from tests.fixtures.messages import FakeMessage as Message
from tests.fixtures.schema_registry import SchemaRegistryProcess, resolve_apicurio

pytestmark = pytest.mark.integration

SCHEMA = {"type": "record", "name": "Payment", "namespace": "com.acme", "fields": [
    {"name": "id", "type": "long"}, {"name": "amount", "type": "double"}]}



def _decodes_with(settings: dict[str, str], schema_id: int) -> list[dict]:
    """What a task's decoder reads of two records framed with ``schema_id``, through ``settings``."""
    columns, names = avro_columns(SCHEMA)
    decoder = ValueDecoder("avro", columns, names, ("offset",), avro_framing="confluent",
                           schema_registry=tuple(sorted(settings.items())), as_written=True)
    batch = to_record_batch([Message(0, confluent_framed(schema_id, SCHEMA, {"id": 1, "amount": 2.5})),
                             Message(1, confluent_framed(schema_id, SCHEMA, {"id": 2, "amount": -1.0}))])
    return decoder.decode(batch, vectorized=False)[0].to_pylist()


@pytest.fixture(scope="module")
def tls_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(base URL, CA file) of an Apicurio Registry serving HTTPS only, its certificate self-signed for 127.0.0.1."""
    root = tmp_path_factory.mktemp("registry-tls")
    cert, key = root / "cert.pem", root / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    registry = SchemaRegistryProcess(resolve_apicurio(), root / "registry.log", tls=(cert, key))
    try:
        yield registry.start(), cert
    finally:
        registry.stop()


def test_a_registry_over_tls_is_read_with_its_ca_and_refused_in_one_line_without(tls_registry) -> None:
    url, ca = tls_registry
    settings = {"url": url, "ssl.ca.location": str(ca)}
    subject = f"payments-{uuid.uuid4().hex[:6]}-value"
    schema_id = registry_client(settings).register_schema(subject, Schema(json.dumps(SCHEMA), "AVRO"))
    assert latest_schema(settings, subject).schema_id == schema_id
    assert _decodes_with(settings, schema_id) == [{"offset": 0, "id": 1, "amount": 2.5},
                                                  {"offset": 1, "id": 2, "amount": -1.0}]
    with pytest.raises(RegistryError, match=rf"Schema Registry {url} is unreachable \(.*CERTIFICATE_VERIFY_FAILED"):
        latest_schema({"url": url, "max.retries": "0"}, subject)


class _AuthProxy(http.server.ThreadingHTTPServer):
    """Forwards GET and POST to ``upstream`` when the request's Authorization header is ``expected``
    (None: any); 401 otherwise; the next ``failures`` requests are answered 503 (a registry restarting)."""

    def __init__(self, upstream: str, expected: str | None) -> None:
        self.upstream, self.expected, self.failures, self.requests = upstream.rstrip("/"), expected, 0, 0
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _AuthProxy

    def _forward(self) -> None:
        self.server.requests += 1
        if self.server.failures > 0 or (self.server.expected is not None
                                        and self.headers.get("Authorization") != self.server.expected):
            unavailable = self.server.failures > 0
            self.server.failures -= 1 if unavailable else 0
            self.send_response(503 if unavailable else 401)
            body = b'{"error_code": 503, "message": "Unavailable"}' if unavailable else \
                b'{"error_code": 401, "message": "Unauthorized"}'
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        length = int(self.headers.get("Content-Length") or 0)
        request = urllib.request.Request(self.server.upstream + self.path, method=self.command,
                                         data=self.rfile.read(length) if length else None,
                                         headers={"Content-Type": self.headers.get("Content-Type", "application/json")})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                status, body = response.status, response.read()
        except urllib.error.HTTPError as exc:
            status, body = exc.code, exc.read()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _forward

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def auth_proxy(schema_registry_url: str) -> Iterator[_AuthProxy]:
    proxy = _AuthProxy(schema_registry_url, None)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    try:
        yield proxy
    finally:
        proxy.shutdown()
        proxy.server_close()


@pytest.mark.parametrize("kind", ["basic", "bearer"])
def test_credentials_under_the_clients_names_reach_the_registry(kind, auth_proxy, schema_registry_url) -> None:
    if kind == "basic":
        auth_proxy.expected = "Basic " + base64.b64encode(b"chandy:s3cret").decode()
        good = {"basic.auth.user.info": "chandy:s3cret"}
        bad = {**good, "basic.auth.user.info": "chandy:wrong"}
    else:
        auth_proxy.expected = "Bearer t0ken"
        good = {"bearer.auth.credentials.source": "STATIC_TOKEN", "bearer.auth.token": "t0ken",
                "bearer.auth.logical.cluster": "lsrc-1", "bearer.auth.identity.pool.id": "pool-1"}
        bad = {**good, "bearer.auth.token": "stale"}
    url = f"http://127.0.0.1:{auth_proxy.server_address[1]}"
    subject = f"payments-{uuid.uuid4().hex[:6]}-value"
    schema_id = registry_client({"url": schema_registry_url}).register_schema(subject, Schema(json.dumps(SCHEMA), "AVRO"))
    settings = {"url": url, **good}
    assert latest_schema(settings, subject).schema_id == schema_id
    assert [r["id"] for r in _decodes_with(settings, schema_id)] == [1, 2]
    with pytest.raises(RegistryError, match=rf"Schema Registry {url}: the latest version of subject {subject}: .*401"):
        latest_schema({"url": url, **bad}, subject)
    with pytest.raises(RegistryError, match=rf"Schema Registry {url}: the latest version of subject {subject}: .*401"):
        latest_schema({"url": url}, subject)


def test_settings_are_checked_and_numbers_may_be_text() -> None:
    """The CLI gives every --schema-registry-property as text: numeric ones are converted, an unknown
    one or a number that is not one is a RegistryError naming the registry, not "unreachable"."""
    url = "http://127.0.0.1:9"
    assert registry_client({"url": url, "max.retries": "0", "retries.wait.ms": "50"}).get_schema is not None
    with pytest.raises(RegistryError, match=rf"Schema Registry {url}: bad settings .*Unrecognized properties: no.such"):
        latest_schema({"url": url, "no.such": "x"}, "s-value")
    with pytest.raises(RegistryError, match=rf"Schema Registry {url}: bad settings .*many"):
        latest_schema({"url": url, "max.retries": "many"}, "s-value")


def test_a_tasks_client_rides_through_a_registry_that_is_unavailable_for_a_while(auth_proxy,
                                                                               schema_registry_url) -> None:
    """A task's decoder retries a registry answering 503 (restarting) up to
    ``TASK_MAX_RETRIES`` times with the client's backoff; the driver's start gives up after the
    client's default 3 retries, in one line."""
    from chandy.formats.registry import TASK_MAX_RETRIES, task_settings

    url = f"http://127.0.0.1:{auth_proxy.server_address[1]}"
    subject = f"payments-{uuid.uuid4().hex[:6]}-value"
    schema_id = registry_client({"url": schema_registry_url}).register_schema(subject, Schema(json.dumps(SCHEMA), "AVRO"))
    auth_proxy.failures = 6
    settings = task_settings({"url": url, "retries.wait.ms": "20"})
    assert settings["max.retries"] == str(TASK_MAX_RETRIES) and TASK_MAX_RETRIES > 6
    assert [r["id"] for r in _decodes_with(settings, schema_id)] == [1, 2]
    assert auth_proxy.requests == 7
    auth_proxy.failures = 6
    with pytest.raises(RegistryError, match=rf"Schema Registry {url}: the latest version of subject {subject}: .*503"):
        latest_schema({"url": url, "retries.wait.ms": "20"}, subject)

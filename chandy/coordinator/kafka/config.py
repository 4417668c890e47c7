"""Kafka client configuration: the one place where Chandy builds librdkafka settings.

Every setting is a librdkafka property under its standard name (``bootstrap.servers``,
``isolation.level``, ``transactional.id``, ...), as confluent-kafka-python takes them. Callers
pass their own settings through ``overrides``; those win over Chandy's defaults, so nothing a user
knows from Kafka is renamed or hidden.

Every client built here (producer, consumer, AdminClient; the Spark tasks' too, which are built
here in the executors) logs through :data:`LIBRDKAFKA_LOGGER` with librdkafka's connection errors
rate-limited (``logger`` and ``error_cb``: :class:`LibrdkafkaLog`, :func:`on_client_error`): while
a broker is gone each client would log a line per reconnect attempt (measured: 5,327 lines in 61 s
with the only broker down), and the process now logs one line per broker (and log level) per
:data:`CONNECTION_ERROR_INTERVAL_S`, with the count of those it held back.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from chandy.coordinator.errors import ChandyError

#: Environment variable that points Chandy (and its test fixture) at an existing cluster.
BOOTSTRAP_SERVERS_ENV = "CHANDY_BOOTSTRAP_SERVERS"

KafkaConfig = dict[str, Any]

#: The ``group.id`` of consumers that only ``assign()`` and never commit (librdkafka's Python
#: binding requires one). librdkafka still looks its coordinator up (FindCoordinator), which on a
#: cluster with ACLs needs DESCRIBE on this group (``coordinator/kafka/acls.py`` grants it).
UNMANAGED_GROUP = "chandy-unmanaged"

#: Settings of a consumer that reads offset ranges with a known end (a coordinator-log catch-up, a
#: subtask's split), where any wait is pure loss. ``enable.partition.eof``: the end is reported.
#: ``fetch.wait.max.ms`` 10: a fetch at the end of a transactional partition (its last offsets are
#: markers) finds no record, and the broker would hold it 500 ms. ``fetch.queue.backoff.ms`` 1:
#: librdkafka pauses fetching for 1,000 ms once its queue holds ``queued.min.messages``, which any
#: range longer than that reaches (measured: 100,000 log records behind transaction markers load in
#: 1.2 s with the defaults, 0.36 s with these; a 250,000-record split reads in 1.5 s, 0.7 s).
BOUNDED_READ: Mapping[str, Any] = {"enable.partition.eof": True, "fetch.wait.max.ms": 10, "fetch.queue.backoff.ms": 1}

#: A split reader's settings (``KafkaRangeReader``): :data:`BOUNDED_READ`, and
#: ``queued.min.messages`` 20,000 (librdkafka: 100,000), so that a short range does not make the
#: consumer fetch and decompress ~100,000 records past its end before the reader stops (measured
#: with the CPU busy, as in a Spark task: 6,000 records of a long partition in 62 ms instead of
#: 108 ms; a 250,000-record range no slower). ``auto.offset.reset`` error: a range whose offsets
#: are gone (retention, DeleteRecords, a topic created again) is reported, never jumped over
#: (``KafkaRangeReader.read_batches``, Spark's ``failOnDataLoss``).
RANGE_READ: Mapping[str, Any] = {**BOUNDED_READ, "queued.min.messages": 20_000, "auto.offset.reset": "error"}

#: Bytes an acknowledgement may take *before* compression (``message.max.bytes`` of
#: :data:`REPORTS_PRODUCER`): 64 MiB. An ack carries its subtask's state handles (a pipeline task's:
#: about 210 bytes a data file, plus each distinct schema once) and librdkafka checks this limit
#: against the uncompressed message (an ack of 10,000 files is 2.1 MB, over the 1,000,000
#: default); the broker then checks the compressed batch against the acks topic's
#: ``max.message.bytes`` (1 MB by default), which the same ack meets (:data:`COMPRESSION`: 100 KB).
ACK_MESSAGE_MAX_BYTES = 64 * 1024 * 1024

#: A worker's producer of acks, declines and attempt reports (``<prefix>.acks``): not idempotent,
#: and one request in flight per broker, so retries keep the order. The coordinator drops a
#: duplicate ack, so idempotence buys nothing here, and it costs an InitProducerId before the first
#: send: librdkafka asks the same broker again and again, and a broker that has just restarted can
#: answer COORDINATOR_LOAD_IN_PROGRESS for minutes (it has no producer-ID block yet), during which
#: no ack leaves the task (seen in a rolling restart, issue 36).
#: ``message.max.bytes`` is :data:`ACK_MESSAGE_MAX_BYTES`.
REPORTS_PRODUCER: Mapping[str, Any] = {"enable.idempotence": False, "max.in.flight.requests.per.connection": 1,
                                       "message.max.bytes": ACK_MESSAGE_MAX_BYTES}

#: ``compression.type`` of every producer built here (Chandy's own messages, acks and the
#: coordinator's transactions included): zstd, as an ack's state handles repeat their paths and
#: property names (measured, an ack of 10,000 data files: 2,101,485 bytes, a batch of 100,415 bytes
#: on the broker; lz4: 258,512; none: refused, over the topic's 1 MB).
COMPRESSION: Mapping[str, Any] = {"compression.type": "zstd"}

#: librdkafka's own log lines go through Python logging under this name (not raw to stderr).
LIBRDKAFKA_LOGGER = logging.getLogger("chandy.librdkafka")

#: seconds between two lines about one broker's connection errors (:class:`ConnectionErrorLimiter`)
CONNECTION_ERROR_INTERVAL_S = 30.0


class KafkaUnreachableError(ChandyError):
    """No broker of ``bootstrap.servers`` answered: Kafka is down or unreachable from here (not
    a refusal, and nothing that says another coordinator took over)."""


#: librdkafka errors that say no broker answered (a refused or dropped connection, a name that does
#: not resolve, every broker down, a metadata request that timed out), not that one refused a request
UNREACHABLE_ERRORS = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE,
                                KafkaError._TIMED_OUT})


def is_unreachable(error: KafkaError) -> bool:
    """Whether ``error`` means Kafka did not answer (:data:`UNREACHABLE_ERRORS`)."""
    return error.code() in UNREACHABLE_ERRORS


def check_reachable(bootstrap_servers: str, overrides: Mapping[str, Any] | None = None,
                    timeout_s: float = 5.0) -> None:
    """Ask ``bootstrap_servers`` for the cluster's metadata (an AdminClient with ``overrides``,
    e.g. :func:`security_settings`), waiting at most ``timeout_s`` seconds.

    Raises:
        KafkaUnreachableError: no broker answered (names the servers and librdkafka's error).
    """
    admin = admin_client(bootstrap_servers, overrides)
    try:
        admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        if error is not None and not is_unreachable(error):
            return  # a broker answered, with an error of its own (an ACL): Kafka is there
        raise KafkaUnreachableError(f"Kafka is unreachable: no broker of {bootstrap_servers} answered within "
                                    f"{timeout_s:g} s ({error.str() if error is not None else exc})") from None


class ConnectionErrorLimiter:
    """Lets one line a broker through per ``interval_s`` seconds and counts the others (thread-safe).

    :meth:`admit` says whether a line about ``broker`` is logged and, if so, how many about it were
    held back since the last one logged; ``clock`` is in seconds (``time.monotonic``)."""

    def __init__(self, interval_s: float = CONNECTION_ERROR_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}  # broker -> when its last line was let through
        self._held: dict[str, int] = {}  # broker -> lines held back since

    def admit(self, broker: str) -> int | None:
        """None: hold this line about ``broker`` back (counted); else log it, with the count of
        lines about ``broker`` held back since its previous line (0 for the first)."""
        now = self.clock()
        with self._lock:
            last = self._last.get(broker)
            if last is not None and now - last < self.interval_s:
                self._held[broker] = self._held.get(broker, 0) + 1
                return None
            self._last[broker] = now
            return self._held.pop(broker, 0)


#: the process's limiter of librdkafka's connection errors, shared by every client
CONNECTION_ERRORS = ConnectionErrorLimiter()

#: librdkafka's log facility of a broker connection's failure (refused, dropped, resolve, TLS, SASL)
_FAIL_FACILITY = "FAIL"
#: the first ``host:port`` of a line (``[thrd:...]`` stripped), with an optional ``proto://``
_BROKER = re.compile(r"(?:[a-z_]+://)?(?P<address>\[[0-9A-Fa-f:.]+\]:\d+|[A-Za-z0-9_.\-]+:\d+)")
_THREAD_PREFIX = re.compile(r"^\[thrd:[^\]]*\]:\s*")


def broker_of(text: str) -> str | None:
    """The broker (``host:port``) a librdkafka line is about, if it names one."""
    match = _BROKER.search(_THREAD_PREFIX.sub("", text))
    return match.group("address") if match else None


def _limited(level: int, key: str, line: str, what: str = "connection errors") -> None:
    """Log ``line`` at ``level`` unless :data:`CONNECTION_ERRORS` holds it back for ``key`` (a
    broker) at that level: an INFO line ("Disconnected" from an idle connection) does not take the
    place of the ERROR lines that follow. ``what`` names the lines in the note on the count."""
    held = CONNECTION_ERRORS.admit(f"{key} {what} {logging.getLevelName(level)}")
    if held is None:
        return
    interval = f"{CONNECTION_ERRORS.interval_s:g} s"
    note = (f" ({held} more {what} of {key} suppressed in the last {interval})" if held
            else f" ({what} of {key}: one line per {interval})")
    LIBRDKAFKA_LOGGER.log(level, "%s%s", line, note)


class LibrdkafkaLog:
    """The ``logger`` every client is given: librdkafka's lines to :data:`LIBRDKAFKA_LOGGER`, a
    broker connection's failures (facility ``FAIL``: refused, dropped, unresolvable) rate-limited
    per broker by :data:`CONNECTION_ERRORS`. confluent-kafka calls ``log(level, "%s [%s] %s",
    facility, client name, text)`` with a Python logging level."""

    def log(self, level: int, msg: str, *args: Any) -> None:
        if len(args) == 3 and args[0] == _FAIL_FACILITY:
            facility, client, text = (str(a) for a in args)
            broker = broker_of(text)
            if broker is not None:
                _limited(level, broker, f"{facility} [{client}] {text}")
                return
        LIBRDKAFKA_LOGGER.log(level, msg, *args)


def on_client_error(error: KafkaError) -> None:
    """The ``error_cb`` every client is given (librdkafka's errors that no call returns). A broker's
    transport or resolve failure is the ``FAIL`` line :class:`LibrdkafkaLog` logged already; "all
    brokers are down" and any other error are logged, rate-limited per error and broker."""
    if error.code() in (KafkaError._TRANSPORT, KafkaError._RESOLVE):
        return
    if error.code() == KafkaError._ALL_BROKERS_DOWN:
        _limited(logging.ERROR, "all brokers", f"Kafka is unreachable: {error.str()}")
        return
    broker = broker_of(error.str())
    _limited(logging.ERROR if error.fatal() else logging.WARNING, broker or "the cluster",
             f"Kafka client error {error.name()}: {error.str()}", what=f"{error.name()} errors")


#: the ``logger`` setting of every client (:class:`LibrdkafkaLog`)
LIBRDKAFKA_LOG = LibrdkafkaLog()


def _merge(base: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> KafkaConfig:
    conf = {"logger": LIBRDKAFKA_LOG, "error_cb": on_client_error, **base}
    if overrides:
        conf.update(overrides)
    return conf


def admin_config(bootstrap_servers: str, overrides: Mapping[str, Any] | None = None) -> KafkaConfig:
    """librdkafka settings for an AdminClient on ``bootstrap_servers`` (``host:port[,...]``)."""
    return _merge({"bootstrap.servers": bootstrap_servers}, overrides)


def producer_config(
    bootstrap_servers: str,
    *,
    transactional_id: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> KafkaConfig:
    """librdkafka settings for a producer.

    The producer is idempotent (``enable.idempotence``), so retries never duplicate a record;
    with ``transactional_id`` it is transactional, which is how the coordinator is fenced
    (a second producer with the same ``transactional.id`` fences the first). Its batches are
    compressed (:data:`COMPRESSION`).
    """
    base: KafkaConfig = {
        "bootstrap.servers": bootstrap_servers,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 0,
        **COMPRESSION,
    }
    if transactional_id is not None:
        base["transactional.id"] = transactional_id
    return _merge(base, overrides)


def consumer_config(
    bootstrap_servers: str,
    *,
    group_id: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> KafkaConfig:
    """librdkafka settings for a consumer that reads committed data only.

    ``isolation.level=read_committed`` always (Chandy's topics are written transactionally) and
    ``enable.auto.commit=false``: Chandy commits offsets itself, on checkpoint completion.
    Without ``group_id`` a throwaway ``group.id`` (:data:`UNMANAGED_GROUP`) is set, as librdkafka
    requires one; such a consumer must use ``assign()`` and never commit.
    """
    base: KafkaConfig = {
        "bootstrap.servers": bootstrap_servers,
        "group.id": group_id if group_id is not None else UNMANAGED_GROUP,
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
    }
    return _merge(base, overrides)


#: librdkafka settings (exact keys, then prefixes) that say how to connect and authenticate:
#: every client of one principal needs the same ones, whatever else it sets.
SECURITY_KEYS = ("security.protocol", "client.dns.lookup")
SECURITY_PREFIXES = ("sasl.", "ssl.")


def security_settings(settings: Mapping[str, Any] | None) -> KafkaConfig:
    """The connection and authentication settings among ``settings`` (``security.protocol``,
    ``sasl.*``, ``ssl.*``) under their librdkafka names: what an AdminClient or a second
    producer needs to act as the same principal as the client ``settings`` were given for."""
    return {key: value for key, value in (settings or {}).items()
            if key in SECURITY_KEYS or key.startswith(SECURITY_PREFIXES)}


#: librdkafka settings (exact keys, then prefixes) that name a principal and prove it: user names,
#: passwords, OAuth and Kerberos settings, client certificates and keys. A CA (``ssl.ca.*``) or
#: ``security.protocol`` is not one: clients of different principals share them.
CREDENTIAL_KEYS = ("sasl.username", "sasl.password", "ssl_key", "ssl_certificate")
CREDENTIAL_PREFIXES = ("sasl.oauthbearer.", "sasl.kerberos.", "ssl.key.", "ssl.keystore.", "ssl.certificate.",
                       "ssl.engine.")


def _is_credential(key: str) -> bool:
    return key in CREDENTIAL_KEYS or key.startswith(CREDENTIAL_PREFIXES)


def with_security_of(source: Mapping[str, Any] | None, overrides: Mapping[str, Any] | None) -> KafkaConfig:
    """``overrides`` completed with the connection and authentication settings of ``source``
    (:func:`security_settings`); ``overrides`` win. A process given its credentials once (e.g.
    ``chandy pipeline run -X sasl.username=...``) then connects every client, its producers
    included, as the same principal."""
    return {**security_settings(source), **(overrides or {})}


def as_principal(settings: Mapping[str, Any] | None, principal: Mapping[str, Any] | None) -> KafkaConfig:
    """``settings`` for a client that acts as another principal: when ``principal`` holds
    credentials (``sasl.username``, ``sasl.password``, ``sasl.oauthbearer.*``, ``sasl.kerberos.*``,
    ``ssl.key.*``, ``ssl.keystore.*``, ``ssl.certificate.*``), every credential of ``settings`` is
    dropped, so none of them travels with the client, and ``principal`` is laid over the rest
    (``security.protocol``, ``sasl.mechanism``, ``ssl.ca.location`` and non-security settings
    carry over unless ``principal`` sets them). Without credentials in ``principal`` its settings
    are simply laid over ``settings`` (the same principal). E.g. a pipeline's Spark tasks: the
    driver's settings as the worker's principal."""
    settings, principal = dict(settings or {}), dict(principal or {})
    if any(_is_credential(key) for key in principal):
        settings = {key: value for key, value in settings.items() if not _is_credential(key)}
    return {**settings, **principal}


def sasl_settings(username: str, password: str, *, mechanism: str = "SCRAM-SHA-512",
                  protocol: str = "SASL_PLAINTEXT") -> KafkaConfig:
    """librdkafka settings to authenticate as ``username`` with SASL (``security.protocol``,
    ``sasl.mechanism``, ``sasl.username``, ``sasl.password``), e.g. SCRAM-SHA-512 over
    plaintext; use ``protocol="SASL_SSL"`` together with ``ssl.*`` settings for TLS."""
    return {"security.protocol": protocol, "sasl.mechanism": mechanism, "sasl.username": username,
            "sasl.password": password}


def admin_client(bootstrap_servers: str, overrides: Mapping[str, Any] | None = None) -> AdminClient:
    """An :class:`AdminClient` built from :func:`admin_config`."""
    return AdminClient(admin_config(bootstrap_servers, overrides))


def producer(
    bootstrap_servers: str,
    *,
    transactional_id: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Producer:
    """A :class:`Producer` built from :func:`producer_config`."""
    return Producer(producer_config(bootstrap_servers, transactional_id=transactional_id, overrides=overrides))


def consumer(
    bootstrap_servers: str,
    *,
    group_id: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Consumer:
    """A :class:`Consumer` built from :func:`consumer_config`."""
    return Consumer(consumer_config(bootstrap_servers, group_id=group_id, overrides=overrides))


def bootstrap_from_env() -> str | None:
    """The bootstrap servers named by ``CHANDY_BOOTSTRAP_SERVERS``, or None when unset or empty."""
    value = os.environ.get(BOOTSTRAP_SERVERS_ENV, "").strip()
    return value or None

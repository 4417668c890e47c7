"""Kafka client configuration: the one place where Chandy builds librdkafka settings.

Every setting is a librdkafka property under its standard name (``bootstrap.servers``,
``isolation.level``, ``transactional.id``, ...), as confluent-kafka-python takes them. Callers
pass their own settings through ``overrides``; those win over Chandy's defaults, so nothing a user
knows from Kafka is renamed or hidden.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

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
#: 108 ms; a 250,000-record range no slower).
RANGE_READ: Mapping[str, Any] = {**BOUNDED_READ, "queued.min.messages": 20_000}

#: A worker's producer of acks, declines and attempt reports (``<prefix>.acks``): not idempotent,
#: and one request in flight per broker, so retries keep the order. The coordinator drops a
#: duplicate ack, so idempotence buys nothing here, and it costs an InitProducerId before the first
#: send: librdkafka asks the same broker again and again, and a broker that has just restarted can
#: answer COORDINATOR_LOAD_IN_PROGRESS for minutes (it has no producer-ID block yet), during which
#: no ack leaves the task (seen in a rolling restart, issue 36).
REPORTS_PRODUCER: Mapping[str, Any] = {"enable.idempotence": False, "max.in.flight.requests.per.connection": 1}

#: librdkafka's own log lines go through Python logging under this name (not raw to stderr).
LIBRDKAFKA_LOGGER = logging.getLogger("chandy.librdkafka")


def _merge(base: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> KafkaConfig:
    conf = {"logger": LIBRDKAFKA_LOGGER, **base}
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
    (a second producer with the same ``transactional.id`` fences the first).
    """
    base: KafkaConfig = {
        "bootstrap.servers": bootstrap_servers,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 0,
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

"""The Schema Registry (Confluent's REST API, or a compatible one such as Apicurio's ``ccompat``):
one client per process and settings, and the subject's latest schema a job starts from.

Settings are ``confluent_kafka.schema_registry.SchemaRegistryClient``'s, under its names (``url``,
``basic.auth.user.info``, ``bearer.auth.*``, ``ssl.ca.location``, ...), as the serializers take them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chandy.coordinator.errors import ChandyError


class RegistryError(ChandyError):
    """The Schema Registry refused Chandy's settings or request, or could not be reached (the
    message names its URL and the subject); the pipeline's start fails with it. Not a
    :class:`~chandy.formats.errors.FormatError`: a registry that is down may answer after a
    restart, so a task that meets it is retried."""


_REGISTRY_CLIENTS: dict[tuple[tuple[str, str], ...], Any] = {}
#: the client's settings that must be numbers (the CLI gives every value as text)
_NUMERIC = ("timeout", "cache.capacity", "cache.latest.ttl.sec", "max.retries", "retries.wait.ms", "retries.max.wait.ms")


def registry_client(settings: Mapping[str, str]) -> Any:
    """One ``confluent_kafka.schema_registry.SchemaRegistryClient`` per process and settings
    (``SchemaRegistryClient.new_client``: a ``mock://`` URL gives its in-process registry); the
    numeric settings (``max.retries``, ``retries.wait.ms``, ``timeout``, ...) may be given as text.

    Raises:
        RegistryError: a setting the client does not know, or a numeric one that is not a number.
    """
    key = tuple(sorted((k, str(v)) for k, v in settings.items()))
    if key not in _REGISTRY_CLIENTS:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        conf: dict[str, Any] = dict(settings)
        try:
            for name in _NUMERIC:
                if isinstance(conf.get(name), str):
                    text = conf[name]
                    conf[name] = float(text) if "." in text else int(text)
            _REGISTRY_CLIENTS[key] = SchemaRegistryClient.new_client(conf)
        except (TypeError, ValueError) as exc:  # the client's own checks, a number that does not parse
            raise RegistryError(f"Schema Registry {settings.get('url')}: bad settings (--schema-registry-property, "
                                f"SchemaRegistryClient's names): {exc}") from exc
    return _REGISTRY_CLIENTS[key]


#: a task's client retries a registry that is down or answers 5xx/429/408 this often (the client's
#: exponential backoff, with full jitter, from ``retries.wait.ms`` (1 s) up to ``retries.max.wait.ms``
#: (20 s): at most about 2 minutes, as the running pipeline rides through Kafka's outages; the
#: driver's start keeps the client's default of 3, so an unreachable registry fails the start soon)
TASK_MAX_RETRIES = 10


def task_settings(settings: Mapping[str, str]) -> dict[str, str]:
    """``settings`` for the clients of the Spark tasks: ``max.retries`` :data:`TASK_MAX_RETRIES`
    unless given."""
    return {"max.retries": str(TASK_MAX_RETRIES), **settings}


def latest_schema(settings: Mapping[str, str], subject: str, schema_type: str = "AVRO") -> Any:
    """The latest version of ``subject`` (``confluent_kafka.schema_registry.RegisteredSchema``:
    ``schema.schema_str``, ``schema_id``, ``version``), which must be of ``schema_type`` (the
    registry's ``AVRO``, ``JSON`` or ``PROTOBUF``); the registry's ``GET
    /subjects/{subject}/versions/latest``.

    Raises:
        RegistryError: the registry unreachable or refusing (its URL, the subject and why), the
            subject unknown, or its latest version of another type.
    """
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    url = settings.get("url")
    client = registry_client(settings)
    try:
        latest = client.get_latest_version(subject)
    except SchemaRegistryError as exc:
        known = (" (no such subject: producers register <topic>-value under TopicNameStrategy; name another with "
                 "--value-subject)") if exc.http_status_code == 404 else ""
        raise RegistryError(f"Schema Registry {url}: the latest version of subject {subject}: {exc}{known}") from exc
    except Exception as exc:  # the HTTP client's connection errors, a bad URL: say which registry
        raise RegistryError(f"Schema Registry {url} is unreachable ({type(exc).__name__}: {exc}): the table's "
                            f"schema comes from its subject {subject}") from exc
    found = getattr(latest.schema, "schema_type", None) or "AVRO"
    if found != schema_type:
        raise RegistryError(f"Schema Registry {url}: subject {subject} holds a {found} schema, not {schema_type}")
    return latest

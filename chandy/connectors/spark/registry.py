"""The Schema Registry (Confluent's REST API, or a compatible one such as Apicurio's ``ccompat``):
one client per process and settings, and the subject's latest schema a job starts from.

Settings are ``confluent_kafka.schema_registry.SchemaRegistryClient``'s, under its names (``url``,
``basic.auth.user.info``, ``bearer.auth.*``, ``ssl.ca.location``, ...), as the serializers take them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from chandy.connectors.spark.options import PipelineError

_REGISTRY_CLIENTS: dict[tuple[tuple[str, str], ...], Any] = {}


def registry_client(settings: Mapping[str, str]) -> Any:
    """One ``confluent_kafka.schema_registry.SchemaRegistryClient`` per process and settings
    (``SchemaRegistryClient.new_client``: a ``mock://`` URL gives its in-process registry)."""
    key = tuple(sorted(settings.items()))
    if key not in _REGISTRY_CLIENTS:
        from confluent_kafka.schema_registry import SchemaRegistryClient

        _REGISTRY_CLIENTS[key] = SchemaRegistryClient.new_client(dict(settings))
    return _REGISTRY_CLIENTS[key]


def latest_schema(settings: Mapping[str, str], subject: str, schema_type: str = "AVRO") -> Any:
    """The latest version of ``subject`` (``confluent_kafka.schema_registry.RegisteredSchema``:
    ``schema.schema_str``, ``schema_id``, ``version``), which must be of ``schema_type`` (the
    registry's ``AVRO``, ``JSON`` or ``PROTOBUF``); the registry's ``GET
    /subjects/{subject}/versions/latest``.

    Raises:
        PipelineError: the registry unreachable or refusing (its URL, the subject and why), the
            subject unknown, or its latest version of another type.
    """
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    url = settings.get("url")
    try:
        latest = registry_client(settings).get_latest_version(subject)
    except SchemaRegistryError as exc:
        known = (" (no such subject: producers register <topic>-value under TopicNameStrategy; name another with "
                 "--value-subject)") if exc.http_status_code == 404 else ""
        raise PipelineError(f"Schema Registry {url}: the latest version of subject {subject}: {exc}{known}") from exc
    except Exception as exc:  # the HTTP client's connection errors, a bad URL: say which registry
        raise PipelineError(f"Schema Registry {url} is unreachable ({type(exc).__name__}: {exc}): the table's "
                            f"schema comes from its subject {subject}") from exc
    found = getattr(latest.schema, "schema_type", None) or "AVRO"
    if found != schema_type:
        raise PipelineError(f"Schema Registry {url}: subject {subject} holds a {found} schema, not {schema_type}")
    return latest

"""The minimal Kafka ACLs of Chandy's topics: who may write what (``chandy topics acls``).

Workers trust a control message's coordinator epoch when it is higher than any they have seen;
only Kafka's authorisation can stop a forged one (docs/design.md, "Who may write the
coordinator's topics"). With ``StandardAuthorizer`` (or any authorizer that denies what no ACL
allows), these bindings give each role exactly what it uses:

| principal   | resource                                   | operations                  |
| ----------- | ------------------------------------------ | --------------------------- |
| coordinator | topic ``control``, ``checkpoint-events``   | WRITE                       |
| coordinator | topic ``coordinator-log``                  | WRITE, READ                 |
| coordinator | topic ``acks``                             | READ                        |
| coordinator | every topic of :meth:`ChandyTopics.specs`  | DESCRIBE, DESCRIBE_CONFIGS  |
| coordinator | transactional.id ``<prefix>-coordinator-`` (prefixed) | WRITE            |
| coordinator | topic ``requests``; group ``<prefix>-coordinator-`` (prefixed) | READ (election) |
| coordinator | group ``chandy-unmanaged``                 | DESCRIBE                    |
| worker      | topic ``acks``                             | WRITE                       |
| worker      | topic ``control``                          | READ                        |
| worker      | group ``chandy-unmanaged``                 | DESCRIBE                    |
| reader      | topic ``checkpoint-events``                | READ                        |
| reader      | group ``<reader group prefix>`` (prefixed) | READ                        |

A pipeline (``chandy pipeline run``) adds its own resources, named by ``source_topics``,
``group`` and ``dead_letter_topics``; its driver is the coordinator's principal and its Spark
tasks the worker's (docs/design.md, "The pipeline's principals"):

| principal   | resource                                   | operations | for                          |
| ----------- | ------------------------------------------ | ---------- | ---------------------------- |
| coordinator | each source topic                          | READ       | the enumerator: metadata, offsets, offset commits |
| coordinator | group ``<group>`` (the pipeline's group.id) | READ      | offset commits on notifyCheckpointComplete |
| coordinator | each dead-letter topic                     | WRITE      | bad records, in the checkpoint's completion transaction |
| worker      | each source topic                          | READ       | Spark tasks fetch their offset ranges |

WRITE and READ imply DESCRIBE (Kafka's ACL rules), so the clients see their topics' metadata and
list their offsets; DESCRIBE_CONFIGS lets the coordinator check the topics' settings at start.
``chandy-unmanaged`` is the ``group.id`` of consumers that only assign partitions
(:data:`~chandy.coordinator.kafka.config.UNMANAGED_GROUP`, which librdkafka's Python binding requires):
nothing ever joins it or commits to it, but librdkafka looks up its coordinator, which Kafka
allows with DESCRIBE only; without it such a consumer reports GROUP_AUTHORIZATION_FAILED, which
fails a reader of a range or of the coordinator log.
Nobody but a super user creates or deletes the topics (``chandy topics ensure`` as an
administrator; the source and dead-letter topics likewise). Workers and readers assign
partitions themselves or use the reader groups; the coordinator's own protocol commits no
consumer offsets, only a pipeline's source does, to its ``group``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from chandy.coordinator.errors import ChandyError
from chandy.coordinator.kafka.config import UNMANAGED_GROUP
from chandy.coordinator.kafka.topics import ChandyTopics

#: Consumer groups a reader may use by default: the throwaway groups of ``chandy events tail``
#: and :func:`~chandy.coordinator.kafka.subscriber.subscribe` without a group.
DEFAULT_READER_GROUP_PREFIX = "chandy-events-"


class AclError(ChandyError):
    """A principal is malformed, or the cluster refused to create an ACL."""


@dataclasses.dataclass(frozen=True)
class ChandyAcl:
    """One ALLOW binding: ``principal`` (``User:name``) may ``operation`` on ``resource_type``
    ``name`` (LITERAL or PREFIXED pattern), from any host."""

    role: str
    principal: str
    resource_type: ResourceType
    name: str
    pattern: ResourcePatternType
    operation: AclOperation

    def binding(self) -> AclBinding:
        """The :class:`confluent_kafka.admin.AclBinding` for ``create_acls``."""
        return AclBinding(self.resource_type, self.name, self.pattern, self.principal, "*", self.operation,
                          AclPermissionType.ALLOW)

    def row(self) -> tuple[str, str, str, str, str, str]:
        """(role, principal, resource type, name, pattern, operation) as Kafka names them."""
        return (self.role, self.principal, self.resource_type.name, self.name, self.pattern.name, self.operation.name)


def principal(name: str) -> str:
    """``User:<name>`` for a bare user name; a ``Type:name`` principal as it is.

    Raises:
        AclError: an empty name or type.
    """
    kind, sep, rest = name.partition(":")
    if sep:
        if not kind or not rest:
            raise AclError(f"principal {name!r} must be Type:name, e.g. User:coordinator")
        return name
    if not name.strip():
        raise AclError("a principal name must not be empty")
    return f"User:{name}"


def chandy_acls(
    topics: ChandyTopics,
    *,
    coordinator: str | None = None,
    workers: Iterable[str] = (),
    readers: Iterable[str] = (),
    reader_group_prefix: str = DEFAULT_READER_GROUP_PREFIX,
    source_topics: Iterable[str] = (),
    group: str | None = None,
    dead_letter_topics: Iterable[str] = (),
) -> list[ChandyAcl]:
    """The minimal ACLs (module docstring's tables) for the given principals (``User:x`` or ``x``).

    The coordinator's ``transactional.id`` is ``<prefix>-coordinator-<job id>``, so one PREFIXED
    binding covers every job under ``topics.prefix``. A pipeline's ``source_topics`` are read by
    the coordinator (its source enumerator) and by the workers (its Spark tasks); its consumer
    ``group`` (Flink's ``commit.offsets.on.checkpoint``) and its ``dead_letter_topics`` (Kafka
    Connect's ``errors.deadletterqueue.topic.name``) are the coordinator's. All LITERAL.

    Raises:
        AclError: a malformed principal or resource name; a ``group`` or dead-letter topic
            without a coordinator, or source topics without a coordinator or a worker, to give them to.
    """
    topic = ResourceType.TOPIC
    literal, prefixed = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    op = AclOperation
    acls: list[ChandyAcl] = []
    workers, readers = list(workers), list(readers)
    sources = _names(source_topics, "source topic")
    dead_letters = _names(dead_letter_topics, "dead-letter topic")
    if group is not None:
        _names([group], "group")
    if coordinator is None and (group is not None or dead_letters):
        raise AclError("a pipeline's consumer group and dead-letter topics are the coordinator's (the driver commits "
                       "offsets and publishes bad records): name the coordinator's principal too")
    if sources and coordinator is None and not workers:
        raise AclError("source topics are read by the coordinator and the workers: name at least one of them")
    if coordinator is not None:
        who = principal(coordinator)
        grants = [
            (topics.control, (op.WRITE,)),
            (topics.checkpoint_events, (op.WRITE,)),
            (topics.coordinator_log, (op.WRITE, op.READ)),
            (topics.acks, (op.READ,)),
        ]
        acls += [ChandyAcl("coordinator", who, topic, name, literal, o) for name, ops in grants for o in ops]
        # the start-up check (ensure_topics, check_topics) sees every topic Chandy owns and its settings
        acls += [ChandyAcl("coordinator", who, topic, spec.name, literal, o) for spec in topics.specs()
                 for o in (op.DESCRIBE, op.DESCRIBE_CONFIGS)]
        acls.append(ChandyAcl("coordinator", who, ResourceType.TRANSACTIONAL_ID, f"{topics.prefix}-coordinator-",
                              prefixed, op.WRITE))
        requests = getattr(topics, "requests", None)  # control requests and the leader election, where present
        if requests is not None:
            acls.append(ChandyAcl("coordinator", who, topic, requests, literal, op.READ))
            acls.append(ChandyAcl("coordinator", who, ResourceType.GROUP, f"{topics.prefix}-coordinator-",
                                  prefixed, op.READ))
        acls.append(ChandyAcl("coordinator", who, ResourceType.GROUP, UNMANAGED_GROUP, literal, op.DESCRIBE))
        # a pipeline's source enumerator: topic metadata, list offsets and offset commits (OffsetCommit
        # needs READ on the topic and the group); the completion transaction publishes its dead letters
        acls += [ChandyAcl("coordinator", who, topic, name, literal, op.READ) for name in sources]
        if group is not None:
            acls.append(ChandyAcl("coordinator", who, ResourceType.GROUP, group, literal, op.READ))
        acls += [ChandyAcl("coordinator", who, topic, name, literal, op.WRITE) for name in dead_letters]
    for worker in workers:
        who = principal(worker)
        acls.append(ChandyAcl("worker", who, topic, topics.acks, literal, op.WRITE))
        acls.append(ChandyAcl("worker", who, topic, topics.control, literal, op.READ))
        acls.append(ChandyAcl("worker", who, ResourceType.GROUP, UNMANAGED_GROUP, literal, op.DESCRIBE))
        acls += [ChandyAcl("worker", who, topic, name, literal, op.READ) for name in sources]  # Spark tasks' fetches
    for reader in readers:
        who = principal(reader)
        acls.append(ChandyAcl("reader", who, topic, topics.checkpoint_events, literal, op.READ))
        acls.append(ChandyAcl("reader", who, ResourceType.GROUP, reader_group_prefix, prefixed, op.READ))
    return acls


def _names(names: Iterable[str], what: str) -> list[str]:
    """``names`` in order without repeats.

    Raises:
        AclError: an empty name.
    """
    unique: list[str] = []
    for name in names:
        if not name or not name.strip():
            raise AclError(f"a {what} name must not be empty")
        if name not in unique:
            unique.append(name)
    return unique


def apply_acls(admin: AdminClient, acls: Iterable[ChandyAcl], timeout_s: float = 30.0) -> int:
    """Create the bindings (Kafka's ``CreateAcls``; creating an existing one is a no-op).
    Returns how many were sent. The admin must be allowed to ALTER the cluster (a super user).

    Raises:
        AclError: the cluster refused one (the message names it and Kafka's error).
    """
    bindings = {acl.binding(): acl for acl in acls}
    if not bindings:
        return 0
    for binding, future in admin.create_acls(list(bindings), request_timeout=timeout_s).items():
        try:
            future.result()
        except KafkaException as exc:
            acl = bindings[binding]
            raise AclError(f"could not create ACL {' '.join(acl.row()[1:])}: {exc.args[0].str()}") from exc
    return len(bindings)


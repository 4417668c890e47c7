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
| worker      | topic ``acks``                             | WRITE                       |
| worker      | topic ``control``                          | READ                        |
| reader      | topic ``checkpoint-events``                | READ                        |
| reader      | group ``<reader group prefix>`` (prefixed) | READ                        |

WRITE and READ imply DESCRIBE (Kafka's ACL rules), so the clients see their topics' metadata;
DESCRIBE_CONFIGS lets the coordinator check the topics' settings at start. Nobody but a super
user creates or deletes the topics (``chandy topics ensure`` as an administrator). Workers and
readers assign partitions themselves or use the reader groups; the coordinator commits no
consumer offsets, so it needs no group.
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

from coordinator.errors import ChandyError
from coordinator.kafka.topics import ChandyTopics

#: Consumer groups a reader may use by default: the throwaway groups of ``chandy events tail``
#: and :func:`~coordinator.kafka.subscriber.subscribe` without a group.
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
) -> list[ChandyAcl]:
    """The minimal ACLs (module docstring's table) for the given principals (``User:x`` or ``x``).

    The coordinator's ``transactional.id`` is ``<prefix>-coordinator-<job id>``, so one PREFIXED
    binding covers every job under ``topics.prefix``.

    Raises:
        AclError: a malformed principal.
    """
    topic = ResourceType.TOPIC
    literal, prefixed = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    op = AclOperation
    acls: list[ChandyAcl] = []
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
    for worker in workers:
        who = principal(worker)
        acls.append(ChandyAcl("worker", who, topic, topics.acks, literal, op.WRITE))
        acls.append(ChandyAcl("worker", who, topic, topics.control, literal, op.READ))
    for reader in readers:
        who = principal(reader)
        acls.append(ChandyAcl("reader", who, topic, topics.checkpoint_events, literal, op.READ))
        acls.append(ChandyAcl("reader", who, ResourceType.GROUP, reader_group_prefix, prefixed, op.READ))
    return acls


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


"""The election of a job's leader coordinator, so that a standby can take over (Flink's JobManager
high availability; the consumer-group protocol as Kafka Connect's distributed herder uses it).

Every coordinator process of a job joins the consumer group ``<prefix>-coordinator-<job id>`` on
the single-partition requests topic with the ``cooperative-sticky`` assignor; the member that owns
the partition is the leader and the only one that reads requests
(:class:`~chandy.coordinator.kafka.requests.RequestHandler`). When the leader dies, its session
times out (:data:`ELECTION_SESSION_TIMEOUT_MS`), the partition moves to a standby, which then
starts its coordinator; the transactional ``init_transactions`` of that start fences whatever is
left of the old leader, so two coordinators never both write, whatever the election says. Members
carry their role in ``client.id``: a standby leads only once no active run's member remains.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition

from chandy.coordinator.errors import ChandyError
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.control_request import ControlRequest
from chandy.coordinator.kafka.log import load_state
from chandy.coordinator.kafka.topics import ChandyTopics
from chandy.schemas.codec import Codec, SingleObjectCodec, WireFormatError, location_of

log = logging.getLogger(__name__)

#: The session timeout (ms) of the election group: how long a dead leader keeps the partition.
ELECTION_SESSION_TIMEOUT_MS = 1500


def election_group(prefix: str, job_id: str) -> str:
    """The consumer group whose single active member is the job's leader coordinator."""
    return f"{prefix}-coordinator-{job_id}"


# -- the coordinator side ---------------------------------------------------------------------------
class LeaderElection:
    """Membership of the job's election group; the owner of the requests partition leads.

    A thread polls the group's consumer (heartbeats, rebalances) and hands every request of the
    job to :attr:`on_request` once set (requests that arrive before are kept in order). Read
    :attr:`is_leader`; :meth:`wait_until_leader` blocks a standby until it leads.

    Args:
        bootstrap_servers: Kafka ``bootstrap.servers``.
        topics: the job's topics (the requests topic is ``topics.requests``).
        job_id: the job.
        consumer_overrides: librdkafka settings under their own names (``session.timeout.ms``
            defaults to :data:`ELECTION_SESSION_TIMEOUT_MS`; the broker's
            ``group.min.session.timeout.ms`` must allow it).
    """

    def __init__(self, bootstrap_servers: str, topics: ChandyTopics, job_id: str, *,
                 consumer_overrides: Mapping[str, Any] | None = None, codec: Codec | None = None,
                 standby: bool = False) -> None:
        self.topics = topics
        self.job_id = job_id
        self.group_id = election_group(topics.prefix, job_id)
        self.codec = codec or SingleObjectCodec()
        self.standby = standby
        self.bootstrap_servers = bootstrap_servers
        self._consumer_overrides = dict(consumer_overrides or {})
        #: the epoch of the coordinator this process runs, when its runtime tells (compared with the
        #: log's newest when leadership is lost: :meth:`_explain_loss`)
        self.coordinator_epoch: Callable[[], int | None] | None = None
        self._admin = kafka_config.admin_client(bootstrap_servers, kafka_config.security_settings(consumer_overrides))
        overrides = {"partition.assignment.strategy": "cooperative-sticky",
                     "session.timeout.ms": ELECTION_SESSION_TIMEOUT_MS, "heartbeat.interval.ms": 300,
                     # earliest: a request sent before this member owned the partition is still read;
                     # old ones are past their deadline and skipped
                     "auto.offset.reset": "earliest", "enable.auto.commit": True, "enable.auto.offset.store": False,
                     "enable.partition.eof": False, **(consumer_overrides or {}),
                     # what a standby reads of the others: is an active run still a member?
                     "client.id": STANDBY_CLIENT_ID if standby else ACTIVE_CLIENT_ID}
        self.consumer = kafka_config.consumer(bootstrap_servers, group_id=self.group_id, overrides=overrides)
        self.is_leader = threading.Event()
        self.joined = threading.Event()  # a member of the group (its first rebalance is done)
        self.on_request: Callable[[ControlRequest], None] | None = None
        self.on_lost: Callable[[], None] | None = None
        self.became_leader_at: float | None = None
        self._led = False
        self.bad_requests = 0
        self._backlog: list[ControlRequest] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"chandy-election-{job_id[:8]}", daemon=True)

    def join(self) -> LeaderElection:
        """Join the group (non-blocking); returns self."""
        self.consumer.subscribe([self.topics.requests], on_assign=self._assigned, on_revoke=self._revoked,
                                on_lost=self._lost)
        self._thread.start()
        return self

    def wait_until_leader(self, timeout_s: float | None = None, stop: threading.Event | None = None) -> bool:
        """Block until this member leads (True), ``timeout_s`` passes or ``stop`` is set (False).

        A standby leads only once it owns the requests partition *and* no active run of the job
        is a member of the group: a standby that joined before the active run's coordinator did
        (both started at once) owns the partition at once, yet the active run is alive and must
        not be fenced by it; the standby waits until that member is gone (its session timed out,
        or it left on stop)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            if self.is_leader.wait(0.1) and (not self.standby or self._no_active_member()):
                if self.standby and not self._led:
                    self.became_leader_at = time.monotonic()  # the moment a standby may lead, not its assignment's
                    self._led = True
                return True
            if (stop is not None and stop.is_set()) or self._stop.is_set():
                return False
            if deadline is not None and time.monotonic() > deadline:
                return False

    def _no_active_member(self) -> bool:
        try:
            return active_members(self._admin, self.group_id) == 0
        except (KafkaException, concurrent.futures.TimeoutError) as exc:  # unreachable for a moment: ask again
            log.debug("describing group %s: %s", self.group_id, exc)
            time.sleep(0.2)
            return False

    def attach(self, handler: Callable[[ControlRequest], None]) -> None:
        """Deliver requests to ``handler`` from now on, the ones already received first."""
        with self._lock:
            self.on_request = handler
            backlog, self._backlog = self._backlog, []
        for request in backlog:
            handler(request)

    def close(self) -> None:
        """Leave the group (a standby then takes over at once, without waiting for a timeout)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        try:
            self.consumer.close()
        except Exception as exc:  # noqa: BLE001 - closing is best effort; the session then times out
            log.debug("closing the election consumer: %s", exc)

    def _assigned(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self.joined.set()
        if partitions and not self.is_leader.is_set():
            self.became_leader_at = time.monotonic()
            log.info("job %s: this process leads (group %s)", self.job_id, self.group_id)
            self.is_leader.set()

    def _revoked(self, consumer: Any, partitions: list[TopicPartition], *, lost: bool = False) -> None:
        if partitions and self.is_leader.is_set() and self._stop.is_set():
            self.is_leader.clear()  # leaving the group on close: a standby leads next
            log.info("job %s: left group %s", self.job_id, self.group_id)
        elif partitions and self.is_leader.is_set():
            self.is_leader.clear()
            # why, in a thread of its own: the answer may take Kafka's timeout, and this one heartbeats
            threading.Thread(target=self._explain_loss, args=(lost,), name=f"chandy-election-loss-{self.job_id[:8]}",
                             daemon=True).start()
            if self.on_lost is not None:
                self.on_lost()

    def _lost(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self._revoked(consumer, partitions, lost=True)

    def _explain_loss(self, lost: bool) -> None:
        """Log, in one line, why this process no longer leads, as far as Kafka can tell: a loss
        (the session ended) happens when the broker is gone as much as when a newer coordinator
        takes over, so a newer coordinator is named only when the log holds a newer epoch than
        this process's coordinator (:attr:`coordinator_epoch`) or another member owns the requests
        partition; with Kafka unreachable, that is what the line says."""
        how = (f"its session in group {self.group_id} ended (Kafka heard nothing from it for "
               f"{ELECTION_SESSION_TIMEOUT_MS} ms)" if lost else f"group {self.group_id} revoked its partition")
        security = kafka_config.security_settings(self._consumer_overrides)
        try:
            state, _ = load_state(self.bootstrap_servers, self.topics.coordinator_log, self.job_id,
                                  consumer_overrides=security, timeout_s=10.0)
            leaders = [f"{m.client_id}@{m.host}" for m in self._members_owning_requests()]
        except kafka_config.KafkaUnreachableError as exc:
            log.warning("job %s: this process no longer leads: %s; %s: whether a newer coordinator leads cannot be "
                        "known until Kafka answers", self.job_id, how, exc)
            return
        except (ChandyError, KafkaException, concurrent.futures.TimeoutError) as exc:
            log.warning("job %s: this process no longer leads: %s; the coordinator log or the group could not be "
                        "read to tell whether a newer coordinator leads (%s)", self.job_id, how, exc)
            return
        mine = self.coordinator_epoch() if self.coordinator_epoch is not None else None
        if mine is not None and state.epoch > mine:
            log.warning("job %s: leadership lost: %s, and a newer coordinator (epoch %d, this one %d) leads; it "
                        "fences this one", self.job_id, how, state.epoch, mine)
        elif leaders:
            log.warning("job %s: leadership lost: %s, and another member leads group %s (%s); the log's newest "
                        "coordinator epoch is %d", self.job_id, how, self.group_id, ", ".join(leaders), state.epoch)
        else:
            log.warning("job %s: this process no longer leads: %s; no other member leads group %s and the log's "
                        "newest coordinator epoch is %d%s: no newer coordinator is known, and this process rejoins",
                        self.job_id, how, self.group_id, state.epoch,
                        "" if mine is None else f" (this coordinator's is {mine})")

    def _members_owning_requests(self) -> list[Any]:
        """The other members of the group that own the requests partition now.

        Raises:
            KafkaException: the group could not be described within 10 s (:func:`describe_group`).
        """
        description = describe_group(self._admin, self.group_id, 10.0)
        me = self.consumer.memberid()
        return [m for m in description.members if m.member_id != me and m.assignment is not None
                and any(tp.topic == self.topics.requests for tp in m.assignment.topic_partitions)]

    def _run(self) -> None:
        key = self.job_id.encode()
        while not self._stop.is_set():
            try:
                message = self.consumer.poll(0.2)
            except Exception as exc:  # noqa: BLE001 - a closed consumer ends the loop; anything else is logged
                if self._stop.is_set():
                    return
                log.warning("election consumer: %s", exc)
                continue
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("election consumer: %s", error)
                continue
            try:
                if message.key() == key:
                    self._deliver(message)
                self.consumer.store_offsets(message)
            except Exception as exc:  # noqa: BLE001 - the election thread must outlive one bad message or a closed mailbox
                log.warning("election consumer: a request at %s was not handed over: %s", location_of(message), exc)

    def _deliver(self, message: Message) -> None:
        try:
            decoded = self.codec.decode(message.value(), location_of(message))
            if decoded.name != ControlRequest.SCHEMA:
                raise WireFormatError(f"{decoded.name} is not a control request", location_of(message))
            request = ControlRequest.from_avro(decoded.value)
        except (WireFormatError, TypeError, KeyError, ValueError) as exc:
            self.bad_requests += 1
            log.warning("skipping a bad control request: %s", exc)
            return
        with self._lock:
            handler = self.on_request
            if handler is None:
                self._backlog.append(request)
                return
        handler(request)


#: ``client.id`` of an election member that runs the job's coordinator (a run without ``--standby``)
ACTIVE_CLIENT_ID = "chandy-election-active"
#: ``client.id`` of an election member that waits to take over (``--standby``)
STANDBY_CLIENT_ID = "chandy-election-standby"


#: seconds one DescribeConsumerGroups attempt may take before it is sent again
DESCRIBE_ATTEMPT_S = 2.0
#: the errors of a group coordinator that is not ready yet: a broker that has just started creates
#: ``__consumer_offsets`` on the first group request and answers these meanwhile (and librdkafka
#: may hold such a request until its whole timeout instead of asking again)
_COORDINATOR_NOT_READY = (KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                          KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.REQUEST_TIMED_OUT, KafkaError._TIMED_OUT)


def describe_group(admin: Any, group: str, timeout_s: float = 10.0) -> Any:
    """Consumer group ``group``'s description (``confluent_kafka.ConsumerGroupDescription``; an
    unknown group is described with no member) through ``admin`` (an ``AdminClient``), within
    ``timeout_s`` seconds: each attempt is bounded by :data:`DESCRIBE_ATTEMPT_S` and a coordinator
    not ready yet (a broker that has just started) is asked again, as Kafka's Java admin client
    retries these errors.

    Raises:
        KafkaException: another error, or the coordinator still not ready at ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        attempt_s = max(0.1, min(DESCRIBE_ATTEMPT_S, deadline - time.monotonic()))
        future = admin.describe_consumer_groups([group], request_timeout=attempt_s)[group]
        try:
            return future.result(attempt_s + 1)
        except (KafkaException, concurrent.futures.TimeoutError) as exc:
            error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
            not_ready = error is None or (isinstance(error, KafkaError) and error.code() in _COORDINATOR_NOT_READY)
            if not not_ready or time.monotonic() + 0.2 >= deadline:
                if isinstance(exc, KafkaException):
                    raise
                raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"describing group {group}")) from exc
            time.sleep(0.2)


def active_members(admin: Any, group: str, timeout_s: float = 10.0) -> int:
    """How many members of election group ``group`` are active runs (``client.id``
    :data:`ACTIVE_CLIENT_ID`), through ``admin`` (an ``AdminClient``); an unknown group has none.

    Raises:
        KafkaException: the group could not be described within ``timeout_s`` (see :func:`describe_group`).
    """
    description = describe_group(admin, group, timeout_s)
    return sum(1 for m in description.members if m.client_id == ACTIVE_CLIENT_ID)


def group_has_members(admin: Any, group: str, timeout_s: float = 10.0) -> bool:
    """Whether consumer group ``group`` has a member (an unknown group, or one that cannot be
    described within ``timeout_s``, has none), through ``admin`` (an ``AdminClient``)."""
    try:
        description = describe_group(admin, group, timeout_s)
    except KafkaException as exc:  # a group that cannot be described is a job with no coordinator known
        log.debug("describing group %s: %s", group, exc)
        return False
    return bool(description.members)


def coordinator_running(bootstrap_servers: str, prefix: str, job_id: str, *, timeout_s: float = 10.0,
                        overrides: Mapping[str, Any] | None = None) -> bool:
    """Whether a coordinator of ``job_id`` is running: its election group has a member."""
    admin = kafka_config.admin_client(bootstrap_servers, overrides=overrides)
    return group_has_members(admin, election_group(prefix, job_id), timeout_s)



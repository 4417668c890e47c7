"""Many subtask attempts in one process over one consumer and one producer (a Flink TaskExecutor).

(A third client, a consumer that is never polled, answers end-offset queries.)

A :class:`CheckpointParticipant` owns two Kafka clients; a process hosting hundreds of subtasks
cannot afford that (librdkafka starts several threads per client: at 2,000 clients a process runs
out of thread-local storage). A :class:`ParticipantHost` reads ``<prefix>.control``
(read_committed) with ONE consumer, produces to ``<prefix>.acks`` with ONE producer, and
dispatches every control message to the subtask attempts registered with it, keyed by
(job ID, operator ID, subtask index), with the same semantics as a lone participant:

- TriggerCheckpoint goes to every registered subtask of the job (or of the operators it names);
  each subtask's ``snapshot`` returns its state handles and it acknowledges, or declines if
  ``snapshot`` raises (CHECKPOINT_DECLINED, or the reason of a :class:`CheckpointException`);
- NotifyCheckpointComplete / NotifyCheckpointAborted go to every registered subtask of the job;
- an OperatorEvent goes to the one attempt it addresses (operator, subtask, attempt number);
- control messages of a coordinator epoch older than the newest seen for the job are dropped;
- a subtask attempt only sees control messages written after it registered (a lone participant
  starts at the control topic's end): registering a new attempt of a subtask replaces the old one,
  and triggers already in the topic when it registered are dropped for it (counted in
  :attr:`SubtaskSlot.dropped_before_registration`), as Flink sends a trigger to the execution
  attempt current when the checkpoint was triggered and never to a later one.

Callbacks run on the host's thread, one at a time, in control-topic order; a blocking
``snapshot`` delays every subtask of the host. Acknowledgements of one poll batch are produced
together and flushed once (a 1,000-subtask trigger costs one flush, not 1,000).
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from chandy.coordinator.errors import ChandyError
from chandy.coordinator.failure import CheckpointFailureReason
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.participant import AckTooLargeError, Snapshot, ack_too_large, deliver_control, run_snapshot
from chandy.coordinator.kafka.topics import ChandyTopics, TopicError, watermark_offsets
from chandy.coordinator.messages import (
    MESSAGE_TYPES,
    AcknowledgeCheckpoint,
    DeclineCheckpoint,
    OperatorEventMessage,
    SubtaskAttemptFailed,
    SubtaskAttemptReady,
    TriggerCheckpoint,
)
from chandy.coordinator.operator_coordinator import OperatorEvent
from chandy.schemas.codec import Codec, SingleObjectCodec, WireFormatError, location_of

log = logging.getLogger(__name__)



class HostError(ChandyError):
    """A :class:`ParticipantHost` was used wrongly (not started, closed, unknown subtask)."""


@dataclasses.dataclass
class SubtaskSlot:
    """One registered subtask attempt of a :class:`ParticipantHost` (returned by
    :meth:`ParticipantHost.register`). Callbacks as in :class:`CheckpointParticipant`;
    ``start_offsets`` maps control partition → first offset this attempt sees."""

    host: ParticipantHost
    job_id: str
    operator_id: str
    subtask_index: int
    attempt_number: int
    snapshot: Snapshot
    on_complete: Callable[[int], None] | None
    on_aborted: Callable[[int], None] | None
    on_event: Callable[[OperatorEvent], None] | None
    start_offsets: dict[int, int]
    dropped_before_registration: int = 0
    active: bool = True

    def send_event(self, event: OperatorEvent) -> None:
        """Send an operator event to this operator's coordinator (flushed at once)."""
        self.host._send(OperatorEventMessage(self.job_id, self.host.max_epoch.get(self.job_id, 0), self.operator_id,
                                             self.subtask_index, self.attempt_number, event.event_type, event.payload,
                                             _now()), flush=True)

    def fail(self, reason: str) -> None:
        """Report this attempt failed (SubtaskAttemptFailed: the coordinator resets the subtask)
        and unregister it."""
        self.host._send(SubtaskAttemptFailed(self.job_id, self.operator_id, self.subtask_index, self.attempt_number,
                                             reason, _now()), flush=True)
        self.host.unregister(self)


def _now() -> int:
    return int(time.time() * 1000)


class ParticipantHost:
    """Hosts many subtask attempts over one control consumer and one acks producer.

    Args:
        bootstrap_servers: Kafka ``bootstrap.servers``.
        prefix: topic prefix; codec: wire format (default single-object encoding).
        consumer_overrides, producer_overrides: librdkafka settings of the two clients.

    Use: ``host = ParticipantHost(servers, prefix=p).start()``, then :meth:`register` each
    subtask attempt (it reports SubtaskAttemptReady), :meth:`close` at the end.

    Raises:
        TopicError: (start) the control topic does not exist.
        HostError: register before start or after close.
    """

    def __init__(self, bootstrap_servers: str, *, prefix: str = "chandy", codec: Codec | None = None,
                 consumer_overrides: dict[str, Any] | None = None,
                 producer_overrides: dict[str, Any] | None = None) -> None:
        self.topics = ChandyTopics(prefix)
        self.codec = codec or SingleObjectCodec()
        self.max_epoch: dict[str, int] = {}
        self.dropped_stale = 0
        self.bad_messages = 0
        overrides = {**kafka_config.REPORTS_PRODUCER, "linger.ms": 1, **(producer_overrides or {})}
        self._producer_settings = kafka_config.producer_config(bootstrap_servers, overrides=overrides)
        self.producer = kafka_config.producer(bootstrap_servers, overrides=overrides)
        self.consumer = kafka_config.consumer(bootstrap_servers, overrides={"fetch.wait.max.ms": 10,
                                                                             **(consumer_overrides or {})})
        # watermark queries on the polling consumer from another thread wait behind its poll
        # (observed: minutes); a second, never-polled consumer answers them
        self._offsets = kafka_config.consumer(bootstrap_servers, overrides=consumer_overrides)
        self._slots: dict[tuple[str, str, int], SubtaskSlot] = {}
        self._by_job: dict[bytes, list[SubtaskSlot]] = {}
        self._lock = threading.Lock()
        self._partitions: list[int] = []
        self._started = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chandy-participant-host", daemon=True)

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, timeout_s: float = 30.0) -> ParticipantHost:
        """Read the control topic from its current end on the host's thread."""
        metadata = self.consumer.list_topics(self.topics.control, timeout=timeout_s)
        topic = metadata.topics.get(self.topics.control)
        if topic is None or topic.error is not None or not topic.partitions:
            raise TopicError(f"control topic {self.topics.control} does not exist (start the coordinator first, "
                             "or create the topics with `chandy topics ensure`)")
        self._partitions = sorted(topic.partitions)
        ends = self._ends(timeout_s)
        self.consumer.assign([TopicPartition(self.topics.control, p, ends[p]) for p in self._partitions])
        self._started = True
        self._thread.start()
        return self

    def control_end_offsets(self, timeout_s: float = 30.0) -> dict[int, int]:
        """Control partition → its current end offset (one broker query per partition): pass it as ``start_offsets`` to :meth:`register` many
        subtasks without a query each."""
        return self._ends(timeout_s)

    def _ends(self, timeout_s: float) -> dict[int, int]:
        return {p: watermark_offsets(self._offsets, TopicPartition(self.topics.control, p), timeout_s)[1] for p in self._partitions}

    def register(self, job_id: str, operator_id: str, subtask_index: int, attempt_number: int = 0, *,
                 snapshot: Snapshot | None = None, on_complete: Callable[[int], None] | None = None,
                 on_aborted: Callable[[int], None] | None = None,
                 on_event: Callable[[OperatorEvent], None] | None = None, report_ready: bool = True,
                 start_offsets: dict[int, int] | None = None, timeout_s: float = 30.0) -> SubtaskSlot:
        """Register subtask attempt (job, operator, subtask, attempt): from now on it receives the
        control messages written after this call; a previous attempt of the same subtask stops
        receiving anything (``start_offsets``, from :meth:`control_end_offsets`, moves "now" to an
        earlier query). Reports SubtaskAttemptReady unless ``report_ready`` is false (then call
        :meth:`flush` after a batch of registrations, or nothing reaches the broker until the next
        control message is handled).

        Raises:
            HostError: the host is not started or is closed.
        """
        if not self._started or self._stop.is_set():
            raise HostError(f"register {operator_id}/{subtask_index}: the participant host is not running")
        slot = SubtaskSlot(self, job_id, operator_id, subtask_index, attempt_number,
                           snapshot or (lambda checkpoint_id, trigger: ()), on_complete, on_aborted, on_event,
                           dict(start_offsets) if start_offsets is not None else self._ends(timeout_s))
        with self._lock:
            old = self._slots.get((job_id, operator_id, subtask_index))
            if old is not None:
                old.active = False
            self._slots[(job_id, operator_id, subtask_index)] = slot
            self._rebuild(job_id)
        self._send(SubtaskAttemptReady(job_id, operator_id, subtask_index, attempt_number, socket.gethostname(),
                                       _now()), flush=report_ready)
        return slot

    def unregister(self, slot: SubtaskSlot) -> None:
        """Stop dispatching to ``slot`` (no-op if a newer attempt already replaced it)."""
        with self._lock:
            slot.active = False
            key = (slot.job_id, slot.operator_id, slot.subtask_index)
            if self._slots.get(key) is slot:
                del self._slots[key]
                self._rebuild(slot.job_id)

    def _rebuild(self, job_id: str) -> None:
        # copy-on-write list: the host thread iterates its snapshot without the lock
        self._by_job[job_id.encode()] = [s for (j, _, _), s in self._slots.items() if j == job_id]

    def subtasks(self) -> int:
        """Number of registered subtask attempts."""
        return len(self._slots)

    def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until every produced message is on the broker.

        Raises:
            ChandyError: messages still undelivered after ``timeout_s`` seconds."""
        if self.producer.flush(timeout_s) > 0:
            raise ChandyError(f"participant host: messages to {self.topics.acks} not delivered within {timeout_s} s")

    def close(self) -> None:
        """Stop the host's thread, flush the producer and close both clients."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(10)
        if self._thread.is_alive():
            # a subtask callback still runs on it: closing the consumer under a thread that may
            # poll again is undefined in librdkafka; leave it to the process's exit
            log.warning("participant host: its thread is still in a subtask callback after 10 s; "
                        "the control consumer is left open")
        else:
            self.consumer.close()
        self._offsets.close()
        self.producer.flush(10)

    # -- sending -----------------------------------------------------------------------------------
    def _send(self, message: Any, *, flush: bool = False) -> None:
        """Produce ``message`` to the acks topic (and wait for every message with ``flush``).

        Raises:
            AckTooLargeError: ``message`` is over the producer's ``message.max.bytes``.
        """
        value = self.codec.encode(message.SCHEMA, message.to_avro(), topic=self.topics.acks)
        while True:
            try:
                self.producer.produce(self.topics.acks, value, message.job_id.encode())
                break
            except BufferError:
                self.producer.poll(0.05)
            except KafkaException as exc:
                if exc.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE:
                    raise ack_too_large(message, len(value), self.topics.acks, self._producer_settings,
                                        exc.args[0]) from None
                raise
        if flush:
            self.flush()

    # -- the control loop --------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            message = self.consumer.poll(0.1)
            produced = False
            # drain what is already fetched, then flush the batch's acks once
            while message is not None:
                produced |= self._dispatch(message)
                message = self.consumer.poll(0)
            if produced:
                try:
                    self.flush()
                except ChandyError as exc:
                    log.warning("%s", exc)
            else:
                self.producer.poll(0)

    def _dispatch(self, message: Any) -> bool:
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("control consumer: %s", error)
            return False
        slots = self._by_job.get(message.key())
        if not slots:
            return False
        try:
            decoded = self.codec.decode(message.value(), location_of(message))
            cls = MESSAGE_TYPES.get(decoded.name)
            if cls is None:
                raise WireFormatError(f"{decoded.name} is not a control message", location_of(message))
            control = cls.from_avro(decoded.value)
        except Exception as exc:  # noqa: BLE001 - one bad message must not stop the loop
            self.bad_messages += 1
            log.warning("skipping a control message that failed to decode: %s", exc)
            return False
        epoch = getattr(control, "epoch", None)
        if epoch is not None:
            newest = self.max_epoch.get(control.job_id, 0)
            if epoch < newest:
                self.dropped_stale += 1
                log.info("dropping %s of epoch %d (newest seen %d)", type(control).__name__, epoch, newest)
                return False
            self.max_epoch[control.job_id] = epoch
        partition, offset = message.partition(), message.offset()
        produced = False
        if epoch is not None and epoch > newest:
            produced |= self._report_ready_again(slots)
        for slot in slots:
            if not slot.active:
                continue
            if offset < slot.start_offsets.get(partition, 0):
                if isinstance(control, TriggerCheckpoint):
                    slot.dropped_before_registration += 1
                continue
            try:
                produced |= self._deliver(slot, control)
            except Exception as exc:  # noqa: BLE001 - one failing callback must not stop the others
                self.bad_messages += 1
                log.warning("subtask %s/%d: control message %s failed: %s", slot.operator_id, slot.subtask_index,
                            type(control).__name__, exc)
        return produced

    def _report_ready_again(self, slots: list[SubtaskSlot]) -> bool:
        """A coordinator of a newer epoch leads the job (a restart or a standby's take-over): its
        acks reader started at the acks topic's end, so it never saw the readiness reported to its
        predecessor. Report every running attempt ready again, as Flink's TaskExecutors register
        their slots with a newly elected JobMaster; the coordinator triggers only once every subtask
        has (``CheckpointingOptions.wait_for_running_subtasks``). True if anything was sent."""
        sent = False
        for slot in slots:
            if slot.active:
                self._send(SubtaskAttemptReady(slot.job_id, slot.operator_id, slot.subtask_index, slot.attempt_number,
                                               socket.gethostname(), _now()))
                sent = True
        return sent

    def _deliver(self, slot: SubtaskSlot, control: Any) -> bool:
        return deliver_control(slot, control, lambda trigger: self._take_checkpoint(slot, trigger))

    def _take_checkpoint(self, slot: SubtaskSlot, trigger: TriggerCheckpoint) -> None:
        outcome = run_snapshot(slot.snapshot, trigger)
        if outcome.decline is not None:
            self._decline(slot, trigger, *outcome.decline)
            return
        try:
            self._send(AcknowledgeCheckpoint(slot.job_id, trigger.epoch, trigger.checkpoint_id, slot.operator_id,
                                             slot.subtask_index, slot.attempt_number, outcome.handles, outcome.metrics,
                                             _now()))
        except AckTooLargeError as exc:  # decline now, naming why, rather than let the checkpoint expire
            log.error("%s", exc)
            self._decline(slot, trigger, CheckpointFailureReason.CHECKPOINT_DECLINED, str(exc))

    def _decline(self, slot: SubtaskSlot, trigger: TriggerCheckpoint, reason: CheckpointFailureReason,
                 message: str) -> None:
        self._send(DeclineCheckpoint(slot.job_id, trigger.epoch, trigger.checkpoint_id, slot.operator_id,
                                     slot.subtask_index, slot.attempt_number, reason.value, message, _now()))

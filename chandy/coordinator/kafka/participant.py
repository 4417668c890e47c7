"""The worker side: what a process taking part in checkpoints uses (one subtask attempt).

A :class:`CheckpointParticipant` reads ``<prefix>.control`` (read_committed) for its job and:

- on TriggerCheckpoint: calls ``snapshot(checkpoint_id, trigger)``, which returns the attempt's
  state handles, and acknowledges with them; if ``snapshot`` raises, it declines with
  CHECKPOINT_DECLINED (or the reason of a raised :class:`CheckpointException`);
- on NotifyCheckpointComplete / NotifyCheckpointAborted: calls ``on_complete`` / ``on_aborted``
  (subsuming contract: "N complete" covers every checkpoint up to N);
- on an OperatorEvent addressed to its (operator, subtask, attempt): calls ``on_event``;
- drops every control message from a coordinator epoch older than the newest it has seen.

It reports ``SubtaskAttemptReady`` when started and ``SubtaskAttemptFailed`` on :meth:`fail`,
and sends operator events to its coordinator with :meth:`send_event`. Callbacks run on the
participant's thread, one at a time, in control-topic order.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from chandy.coordinator.errors import ChandyError, SuppressRestartsError
from chandy.coordinator.failure import CheckpointException, CheckpointFailureReason
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.topics import ChandyTopics, TopicError, watermark_offsets
from chandy.coordinator.messages import (
    MESSAGE_TYPES,
    AcknowledgeCheckpoint,
    CheckpointMetrics,
    DeclineCheckpoint,
    NotifyCheckpointAborted,
    NotifyCheckpointComplete,
    OperatorEventMessage,
    StateHandle,
    SubtaskAttemptFailed,
    SubtaskAttemptReady,
    TriggerCheckpoint,
)
from chandy.coordinator.operator_coordinator import OperatorEvent
from chandy.schemas.codec import Codec, SingleObjectCodec, WireFormatError, location_of

log = logging.getLogger(__name__)

Snapshot = Callable[[int, TriggerCheckpoint], Iterable[StateHandle]]



@dataclasses.dataclass(frozen=True)
class SnapshotOutcome:
    """What a subtask's ``snapshot`` gave for a trigger: its state handles and metrics to
    acknowledge with, or (reason, message) to decline with."""

    handles: tuple[StateHandle, ...] = ()
    metrics: CheckpointMetrics = dataclasses.field(default_factory=CheckpointMetrics)
    decline: tuple[CheckpointFailureReason, str] | None = None


def run_snapshot(snapshot: Snapshot, trigger: TriggerCheckpoint) -> SnapshotOutcome:
    """Call ``snapshot`` for ``trigger``: a :class:`CheckpointException` declines with its reason,
    any other exception with CHECKPOINT_DECLINED (Flink's ``declineCheckpoint``); the sync
    duration (ms) and the handles' size (bytes) are the acknowledgement's metrics."""
    start = time.monotonic()
    try:
        handles = tuple(snapshot(trigger.checkpoint_id, trigger))
    except CheckpointException as exc:
        return SnapshotOutcome(decline=(exc.reason, str(exc)))
    except Exception as exc:  # noqa: BLE001 - any failure of the snapshot declines
        return SnapshotOutcome(decline=(CheckpointFailureReason.CHECKPOINT_DECLINED, f"{type(exc).__name__}: {exc}"))
    took = int((time.monotonic() - start) * 1000)
    return SnapshotOutcome(handles, CheckpointMetrics(sync_duration_ms=took,
                                                      bytes_persisted=sum(h.state_size for h in handles)))


def deliver_control(subtask: Any, control: Any, take_checkpoint: Callable[[TriggerCheckpoint], None]) -> bool:
    """Hand one control message to a subtask attempt (``subtask`` has ``operator_id``,
    ``subtask_index``, ``attempt_number`` and the ``on_complete`` / ``on_aborted`` / ``on_event``
    callbacks of :class:`CheckpointParticipant`): a trigger for its operator is taken, a
    notification goes to its callback, an operator event only to the attempt it names. True when
    a checkpoint was taken (an ack or a decline is on its way)."""
    if isinstance(control, TriggerCheckpoint):
        if control.operator_ids and subtask.operator_id not in control.operator_ids:
            return False
        take_checkpoint(control)
        return True
    if isinstance(control, NotifyCheckpointComplete):
        if subtask.on_complete is not None:
            subtask.on_complete(control.checkpoint_id)
    elif isinstance(control, NotifyCheckpointAborted):
        if subtask.on_aborted is not None:
            subtask.on_aborted(control.checkpoint_id)
    elif isinstance(control, OperatorEventMessage):
        if (control.operator_id, control.subtask_index, control.attempt_number) == (
                subtask.operator_id, subtask.subtask_index, subtask.attempt_number) and subtask.on_event is not None:
            subtask.on_event(OperatorEvent(control.event_type, control.payload))
    return False

class AckTooLargeError(SuppressRestartsError):
    """A message to ``<prefix>.acks`` (an acknowledgement, with its state handles) does not fit in a
    Kafka message even compressed: over the producer's ``message.max.bytes`` before compression,
    or refused by the broker (``max.message.bytes`` of the acks topic) after. It fails the same way
    however often it is sent again, so nothing retries it, and a restart would meet it again."""


def _sent_by(message: Any) -> str:
    """Who sent ``message``, for an error: the checkpoint and subtask of an acknowledgement."""
    if isinstance(message, AcknowledgeCheckpoint):
        return (f"the acknowledgement of checkpoint {message.checkpoint_id} by subtask {message.subtask_index} of "
                f"operator {message.operator_id} (attempt {message.attempt_number}, {len(message.state_handles)} state "
                f"handles) of job {message.job_id}")
    return f"{type(message).__name__} of job {getattr(message, 'job_id', '?')}"


def ack_too_large(message: Any, size: int, topic: str, settings: Mapping[str, Any], error: KafkaError) -> AckTooLargeError:
    """The :class:`AckTooLargeError` of ``message`` (``size`` bytes encoded) that Kafka refused with
    ``error`` (MSG_SIZE_TOO_LARGE), by a producer of ``settings``: at ``produce()``, over its
    ``message.max.bytes`` before compression; in the delivery report, over the topic's limit after."""
    limit = int(settings.get("message.max.bytes", 1_000_000))
    compression = settings.get("compression.type", "none")
    if size > limit:
        why = (f"over the producer's message.max.bytes ({limit:,} bytes, checked before compression; raise it "
               "with --worker-property / --producer-property message.max.bytes=N)")
    else:
        how = "not compressed (compression.type none)" if compression == "none" else f"even compressed ({compression})"
        why = (f"the broker refused it {how}: over the max.message.bytes of topic {topic} (1,048,588 bytes by "
               "default; raise it with kafka-configs --alter)")
    return AckTooLargeError(f"{_sent_by(message)} is {size:,} bytes, too large for Kafka ({error.str()}): {why}; "
                            "fewer files per checkpoint (--max-records-per-checkpoint, fewer partition values) make "
                            "smaller acks")


class AckSender:
    """Sends a subtask attempt's acknowledgements, declines and reports to ``<prefix>.acks``
    without reading the control topic: for workers that learn of a checkpoint some other way
    (a Spark task is handed its checkpoint ID by the driver). Keyed by job ID, like every Chandy
    message. Its producer is :data:`~chandy.coordinator.kafka.config.REPORTS_PRODUCER` (zstd,
    ``message.max.bytes`` :data:`~chandy.coordinator.kafka.config.ACK_MESSAGE_MAX_BYTES`) under
    ``producer_overrides``."""

    def __init__(self, bootstrap_servers: str, job_id: str, *, prefix: str = "chandy", codec: Codec | None = None,
                 producer_overrides: dict[str, Any] | None = None) -> None:
        self.job_id = job_id
        self.topic = ChandyTopics(prefix).acks
        self.codec = codec or SingleObjectCodec()
        self._key = job_id.encode()
        overrides = {**kafka_config.REPORTS_PRODUCER, **(producer_overrides or {})}
        self.settings = kafka_config.producer_config(bootstrap_servers, overrides=overrides)  # its limits, for errors
        self.producer = kafka_config.producer(bootstrap_servers, overrides=overrides)

    def send(self, message: Any, timeout_s: float = 30.0) -> None:
        """Produce one message and wait until the broker has it.

        Raises:
            AckTooLargeError: the message does not fit in a Kafka message (names the checkpoint,
                the subtask and the size in bytes); sending it again would fail the same way.
            ChandyError: the message was not delivered within ``timeout_s`` seconds, or the
                broker refused it (the message says why, e.g. an authorization error).
        """
        errors: list[Any] = []
        value = self.codec.encode(message.SCHEMA, message.to_avro(), topic=self.topic)
        try:
            self.producer.produce(self.topic, value, self._key, on_delivery=lambda error, _: errors.append(error))
        except KafkaException as exc:
            error = exc.args[0]
            if error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                raise ack_too_large(message, len(value) + len(self._key), self.topic, self.settings, error) from None
            raise
        if self.producer.flush(timeout_s) > 0:
            raise ChandyError(f"{type(message).__name__} for job {self.job_id} not delivered within {timeout_s} s")
        if errors and errors[0] is not None and errors[0].code() == KafkaError.MSG_SIZE_TOO_LARGE:
            raise ack_too_large(message, len(value) + len(self._key), self.topic, self.settings, errors[0])
        if errors and errors[0] is not None:  # e.g. TOPIC_AUTHORIZATION_FAILED: this principal may not write acks
            raise ChandyError(f"{type(message).__name__} for job {self.job_id} not delivered to {self.topic}: "
                              f"{errors[0].str()}")

    def acknowledge(self, epoch: int, checkpoint_id: int, operator_id: str, subtask_index: int, attempt_number: int,
                    handles: Iterable[StateHandle], metrics: CheckpointMetrics | None = None) -> None:
        """Acknowledge checkpoint ``checkpoint_id`` of coordinator ``epoch`` with ``handles``."""
        self.send(AcknowledgeCheckpoint(self.job_id, epoch, checkpoint_id, operator_id, subtask_index, attempt_number,
                                        tuple(handles), metrics or CheckpointMetrics(), int(time.time() * 1000)))

    def decline(self, epoch: int, checkpoint_id: int, operator_id: str, subtask_index: int, attempt_number: int,
                reason: CheckpointFailureReason, message: str) -> None:
        """Decline checkpoint ``checkpoint_id``: it aborts."""
        self.send(DeclineCheckpoint(self.job_id, epoch, checkpoint_id, operator_id, subtask_index, attempt_number,
                                    reason.value, message, int(time.time() * 1000)))

    def close(self) -> None:
        self.producer.flush(10)


class CheckpointParticipant:
    """One subtask attempt's side of the checkpoint protocol (see the module docstring).

    Args:
        bootstrap_servers: Kafka ``bootstrap.servers``.
        job_id, operator_id, subtask_index, attempt_number: who this attempt is.
        snapshot: takes (checkpoint ID, trigger) and returns state handles; may block (it runs
            on the participant's thread; control messages wait behind it).
        on_complete, on_aborted: checkpoint notifications (checkpoint ID).
        on_event: operator events from the coordinator.
        prefix: topic prefix; codec: wire format (default single-object encoding).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        job_id: str,
        operator_id: str,
        subtask_index: int,
        attempt_number: int = 0,
        *,
        snapshot: Snapshot | None = None,
        on_complete: Callable[[int], None] | None = None,
        on_aborted: Callable[[int], None] | None = None,
        on_event: Callable[[OperatorEvent], None] | None = None,
        prefix: str = "chandy",
        codec: Codec | None = None,
        consumer_overrides: dict[str, Any] | None = None,
        producer_overrides: dict[str, Any] | None = None,
    ) -> None:
        self.job_id = job_id
        self.operator_id = operator_id
        self.subtask_index = subtask_index
        self.attempt_number = attempt_number
        self.snapshot = snapshot or (lambda checkpoint_id, trigger: ())
        self.on_complete = on_complete
        self.on_aborted = on_aborted
        self.on_event = on_event
        self.topics = ChandyTopics(prefix)
        self.codec = codec or SingleObjectCodec()
        self.max_epoch = 0
        self.dropped_stale = 0
        self.bad_messages = 0
        self._key = job_id.encode()
        self.sender = AckSender(bootstrap_servers, job_id, prefix=prefix, codec=self.codec,
                                producer_overrides=producer_overrides)
        self.consumer = kafka_config.consumer(bootstrap_servers, overrides={"fetch.wait.max.ms": 10,
                                                                             **(consumer_overrides or {})})
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"chandy-participant-{operator_id}-{subtask_index}", daemon=True)

    def _now(self) -> int:
        return int(time.time() * 1000)

    def _send(self, message: Any) -> None:
        self.sender.send(message)

    def start(self, timeout_s: float = 30.0) -> CheckpointParticipant:
        """Read the control topic from its current end, then report this attempt ready."""
        metadata = self.consumer.list_topics(self.topics.control, timeout=timeout_s)
        topic = metadata.topics.get(self.topics.control)
        if topic is None or topic.error is not None or not topic.partitions:
            raise TopicError(f"control topic {self.topics.control} does not exist (start the coordinator first, "
                             "or create the topics with `chandy topics ensure`)")
        assignment = []
        for p in sorted(metadata.topics[self.topics.control].partitions):
            _, high = watermark_offsets(self.consumer, TopicPartition(self.topics.control, p), timeout_s)
            assignment.append(TopicPartition(self.topics.control, p, high))
        self.consumer.assign(assignment)
        self._thread.start()
        self._send(SubtaskAttemptReady(self.job_id, self.operator_id, self.subtask_index, self.attempt_number,
                                       socket.gethostname(), self._now()))
        return self

    def send_event(self, event: OperatorEvent) -> None:
        """Send an operator event to this operator's coordinator."""
        self._send(OperatorEventMessage(self.job_id, self.max_epoch, self.operator_id, self.subtask_index,
                                        self.attempt_number, event.event_type, event.payload, self._now()))

    def fail(self, reason: str) -> None:
        """Report this attempt failed (the coordinator resets the subtask) and stop."""
        self._send(SubtaskAttemptFailed(self.job_id, self.operator_id, self.subtask_index, self.attempt_number,
                                        reason, self._now()))
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(10)
        self.consumer.close()
        self.sender.close()

    # -- the control loop --------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            polled = self.consumer.poll(0.1)
            # poll, not consume(n): consume waits for its whole timeout unless n messages arrive
            for message in () if polled is None else (polled,):
                error = message.error()
                if error is not None:
                    if error.code() != KafkaError._PARTITION_EOF:
                        log.warning("control consumer: %s", error)
                    continue
                if message.key() != self._key:
                    continue
                try:
                    decoded = self.codec.decode(message.value(), location_of(message))
                    cls = MESSAGE_TYPES.get(decoded.name)
                    if cls is None:
                        raise WireFormatError(f"{decoded.name} is not a control message", location_of(message))
                    self._handle(cls.from_avro(decoded.value))
                except Exception as exc:  # noqa: BLE001 - one bad message (or callback) must not stop the loop
                    self.bad_messages += 1
                    log.warning("skipping a control message that failed: %s", exc)

    def _handle(self, message: Any) -> None:
        epoch = getattr(message, "epoch", None)
        if epoch is not None:
            if epoch < self.max_epoch:
                self.dropped_stale += 1
                log.info("dropping %s of epoch %d (newest seen %d)", type(message).__name__, epoch, self.max_epoch)
                return
            if epoch > self.max_epoch:
                # a newer coordinator leads (restart, take-over): its acks reader started after this
                # attempt reported ready, so report again (ParticipantHost._report_ready_again)
                self._send(SubtaskAttemptReady(self.job_id, self.operator_id, self.subtask_index, self.attempt_number,
                                               socket.gethostname(), self._now()))
            self.max_epoch = epoch
        deliver_control(self, message, self._take_checkpoint)

    def _take_checkpoint(self, trigger: TriggerCheckpoint) -> None:
        outcome = run_snapshot(self.snapshot, trigger)
        if outcome.decline is not None:
            self._decline(trigger, *outcome.decline)
            return
        try:
            self.sender.acknowledge(trigger.epoch, trigger.checkpoint_id, self.operator_id, self.subtask_index,
                                    self.attempt_number, outcome.handles, outcome.metrics)
        except AckTooLargeError as exc:  # decline now, naming why, rather than let the checkpoint expire
            log.error("%s", exc)
            self._decline(trigger, CheckpointFailureReason.CHECKPOINT_DECLINED, str(exc))

    def _decline(self, trigger: TriggerCheckpoint, reason: CheckpointFailureReason, message: str) -> None:
        self.sender.decline(trigger.epoch, trigger.checkpoint_id, self.operator_id, self.subtask_index,
                            self.attempt_number, reason, message)

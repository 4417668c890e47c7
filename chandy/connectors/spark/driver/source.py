"""The source's offsets as the driver reads them between checkpoints (:class:`SourceOffsets`): the
lag (records between the job's positions and the last stable offsets), the data loss no trigger
would see (Spark's ``failOnDataLoss``), and ``--ending-offsets`` (Spark's ``endingOffsets``,
Flink's ``setBounded``)."""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from chandy.connectors.lake.sink import TP
from chandy.connectors.spark.driver.coordinator import JobCoordinator
from chandy.connectors.spark.driver.state import DriverState
from chandy.connectors.spark.options import PipelineError, PipelineKafkaError
from chandy.coordinator.kafka import config as kafka_config
from chandy.coordinator.kafka.topics import OffsetsUnavailableError, watermark_offsets

log = logging.getLogger(__name__)

#: seconds a source-offset read may keep failing retriably before it is asked with a new client
LAG_CLIENT_RENEW_S = 20.0


class SourceOffsets:
    """Reads the source partitions' offsets with one consumer of the driver's settings (made
    when first needed, closed by :meth:`close_lag_client`), and the enumerator's positions on the
    coordinator's mailbox. ``coordinator`` records the job FAILED on data loss."""

    def __init__(self, state: DriverState, coordinator: JobCoordinator) -> None:
        self.state = state
        self.coordinator = coordinator
        self._lag_consumer: Any = None  # reads the source's last stable offsets
        self._offsets_lost_before = 0  # of the run's offsets lost, those of the attempts before this one
        self._data_loss_seen = 0  # the source's data-loss warnings of this attempt already noticed

    def new_attempt(self) -> None:
        """A new attempt's enumerator counts its data loss from zero: keep the run's so far."""
        self._offsets_lost_before, self._data_loss_seen = self.state.offsets_lost, 0

    def lag(self) -> dict[TP, int]:
        """Records between the job's positions (the last completed checkpoint's ends) and the last
        stable offsets, per (topic, partition); 0 for a partition that is gone; in a bounded run,
        nothing past ``--ending-offsets``.

        Each poll also runs the source's check of the data loss no trigger would see
        (:meth:`~chandy.connectors.kafka.source.enumerator.KafkaSourceEnumerator.check_log_ends`,
        Spark's ``failOnDataLoss``): a partition whose log ends below the job's position (the topic
        deleted and created again, an unclean leader election) shows no lag, and once its new log
        grew past the position every record below it would be skipped in silence. With
        ``--no-fail-on-data-loss`` the job goes on from its position (the table holds the offsets
        below it: :attr:`~chandy.connectors.kafka.source.enumerator.KafkaSourceOptions.sink_holds_offsets`),
        with a notice, and :attr:`DriverState.offsets_lost` counts the offsets the log moved back by.

        A read that keeps failing retriably for :data:`LAG_CLIENT_RENEW_S` gets a new client (a
        client whose metadata lost the partition while brokers restarted can answer "unknown
        partition" for minutes); reads go on for ``--kafka-retry-timeout`` in all.

        Raises:
            PipelineKafkaError: a fatal error, or retriable ones past ``--kafka-retry-timeout``.
            PipelineError: ``--fail-on-data-loss`` (the default) and a partition whose log ends
                below the job's position or is gone: ``KafkaDataLossError: ...`` in one line naming
                the partition, both offsets and the likely causes (the job is FAILED first).
        """
        from chandy.connectors.kafka.source.reader import KafkaDataLossError

        positions, missing = self.state.enumerator_call(lambda e: (dict(e.committed_end), e.missing))
        logs = self._log_ends(sorted(positions), missing)
        try:
            positions = self.state.enumerator_call(lambda e: e.check_log_ends(logs))
        except KafkaDataLossError as exc:  # FAILED for good (a restart would meet the same log), as at a trigger
            self.coordinator.record_failure(f"KafkaDataLossError: {exc}")
            raise PipelineError(f"KafkaDataLossError: {exc}") from exc
        self.sync_data_loss()
        lag = {}
        for tp, log_now in logs.items():
            if log_now is None:
                lag[tp] = 0
                continue
            high = log_now[1]
            if self.state.ending_offsets is not None:  # a bounded run: nothing past its end is lag
                high = min(high, self.state.ending_offsets.get(tp, high))
            lag[tp] = max(0, high - positions.get(tp, high))
        return lag

    def _log_ends(self, partitions: list[TP], missing: Any) -> dict[TP, tuple[int, int] | None]:
        """Each partition's log (low and high watermark offsets, the high one the last stable
        offset under read_committed), or None for one that is gone (``missing`` ones are asked
        first); retried as :meth:`lag` says.

        Raises:
            PipelineKafkaError: a fatal error, or retriable ones past ``--kafka-retry-timeout``.
        """
        from chandy.connectors.kafka.source.data_loss import UNKNOWN_PARTITION_ERRORS, partition_gone

        opts = self.state.options
        logs: dict[TP, tuple[int, int] | None] = {}
        deadline = time.monotonic() + opts.kafka_retry_timeout_ms / 1000
        for tp in partitions:
            if tp in missing and partition_gone(self._lag_client(), tp):
                logs[tp] = None
                continue
            while tp not in logs:
                try:
                    logs[tp] = watermark_offsets(self._lag_client(), TopicPartition(*tp), timeout_s=max(
                        0.1, min(LAG_CLIENT_RENEW_S, deadline - time.monotonic())))
                except OffsetsUnavailableError as exc:
                    if not exc.retriable or time.monotonic() >= deadline:
                        if exc.code in UNKNOWN_PARTITION_ERRORS and partition_gone(self._lag_client(), tp):
                            logs[tp] = None
                            break
                        waited = f"; retried for {opts.kafka_retry_timeout_ms} ms in all" if exc.retriable else ""
                        raise PipelineKafkaError(f"reading the source's offsets failed: {exc}{waited}") from exc
                    log.warning("job %s: %s; reading with a new client", self.state.job_id, exc)
                    self.close_lag_client()
        return logs

    def sync_data_loss(self) -> None:
        """The source's data-loss warnings of this attempt (``--no-fail-on-data-loss``; Spark's
        ``failOnDataLoss=false``) as notices, and its offsets lost into :attr:`DriverState.offsets_lost`.

        Raises:
            ChandyError: the coordinator stopped.
        """
        seen = self._data_loss_seen
        lost, warnings = self.state.enumerator_call(lambda e: (e.offsets_lost, e.data_loss[seen:]))
        for warning in warnings:
            self.state.notice(f"data loss: {warning}")
        self._data_loss_seen += len(warnings)
        self.state.offsets_lost = self._offsets_lost_before + lost

    def resolve_ending_offsets(self) -> None:
        """``--ending-offsets``, resolved once, when the run starts (Spark's ``endingOffsets``):
        per partition the offset (exclusive) the run stops at, into :attr:`DriverState.ending_offsets`.

        Raises:
            PipelineKafkaError: the offsets cannot be read.
            PipelineError: JSON offsets that do not name exactly the job's partitions (Spark's rule).
        """
        from chandy.connectors.kafka.source.offsets import ConsumerOffsetsRetriever, OffsetsSpecError, parse_offsets_spec

        state = self.state
        spec = state.options.ending_offsets
        if spec is None or state.ending_offsets is not None:
            return
        initializer = parse_offsets_spec(spec, "--ending-offsets", ending=True)
        try:
            ends = initializer.get_partition_offsets(state.partitions, ConsumerOffsetsRetriever(self._lag_client()))
        except KafkaException as exc:
            raise PipelineKafkaError(f"reading --ending-offsets {spec} failed: {exc.args[0]}") from exc
        except OffsetsSpecError as exc:
            raise PipelineError(str(exc)) from exc
        state.ending_offsets = dict(ends)
        where = ", ".join(f"{t}-{p}@{o}" for (t, p), o in sorted(ends.items())[:6])
        more = "" if len(ends) <= 6 else f" and {len(ends) - 6} more"
        state.notice(f"bounded run (--ending-offsets {spec}): stops once every partition reaches its end ({where}{more})")

    def reached_ending_offsets(self) -> bool:
        """Whether a bounded run read every partition up to its end (False when unbounded)."""
        ending = self.state.ending_offsets
        if ending is None:
            return False
        ends = self.state.enumerator_call(lambda e: dict(e.committed_end))
        return all(ends.get(tp, -1) >= stop for tp, stop in ending.items())

    def _lag_client(self) -> Any:
        if self._lag_consumer is None:
            self._lag_consumer = kafka_config.consumer(self.state.options.bootstrap_servers,
                                                       overrides=dict(self.state.options.consumer_overrides))
        return self._lag_consumer

    def close_lag_client(self) -> None:
        """Close the consumer that reads the source's offsets (a new one is made when needed)."""
        consumer, self._lag_consumer = self._lag_consumer, None
        if consumer is not None:
            consumer.close()

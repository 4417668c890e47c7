"""The Kafka source coordinator, modelled on Flink's KafkaSource: splits, offset initializers,
the split enumerator (an operator coordinator that fixes each checkpoint's offset ranges and
commits offsets on checkpoint completion), and the reader side."""

# importing the package registers the source's log-record kinds with the coordinator's log
from chandy.connectors.kafka.source import log_records

__all__ = ["log_records"]

"""The Kafka source coordinator, modelled on Flink's KafkaSource: splits, offset initializers,
the split enumerator (an operator coordinator that fixes each checkpoint's offset ranges and
commits offsets on checkpoint completion), and the reader side."""

"""The coordinator's Kafka runtime: client configuration (config.py, the one place Kafka clients
are made), Chandy's topics (topics.py), the transactional log writer, ack reader and service
(runtime.py), log loading (log.py) and replay (replay.py), the worker side (participant.py) and
checkpoint-event subscribers (subscriber.py). It depends on the pure core in ``coordinator``;
the core never imports it."""

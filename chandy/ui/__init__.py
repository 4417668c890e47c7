"""``chandy ui``: the read-only REST server (Flink's checkpoint shapes) and the checkpoint dashboard."""

"""Which topics a Kafka source reads: a list of names or a regex, as Flink's KafkaSubscriber
(``TopicListSubscriber`` / ``TopicPatternSubscriber``). One function, used by the enumerator,
the pipeline and verification alike."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence


def subscribed_topics(available: Iterable[str], topics: Sequence[str] = (), topic_pattern: str | None = None) -> list[str]:
    """The topics among ``available`` that the source reads, sorted.

    With ``topics``, those that exist; with ``topic_pattern``, those whose whole name matches it
    (Java's ``Pattern.matcher(topic).matches()``), never Kafka's internal ``__`` topics.
    """
    names = set(available)
    if topics:
        return sorted(t for t in topics if t in names)
    if topic_pattern is None:
        return []
    pattern = re.compile(topic_pattern)
    return sorted(t for t in names if pattern.fullmatch(t) and not t.startswith("__"))

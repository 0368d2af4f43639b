"""Which topics are never tiered: RocketMQ's ``MessageStoreTopicFilter``."""

from __future__ import annotations

__all__ = ["is_filtered_topic"]

_SYSTEM_TOPICS = frozenset({
    "TBW102", "SCHEDULE_TOPIC_XXXX", "BenchmarkTest", "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRACE_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC",
    "SELF_TEST_TOPIC", "OFFSET_MOVED_EVENT", "CHECKPOINT_TOPIC",
})  # fmt: skip


def is_filtered_topic(topic: str) -> bool:
    """Topics never tiered (RocketMQ's ``MessageStoreTopicFilter``: system topics, the
    ``rmq_sys_`` ones (timer wheel, revive), light message queues)."""
    return (not topic or topic in _SYSTEM_TOPICS or topic.startswith("rmq_sys_")
            or topic.startswith("%LMQ%"))

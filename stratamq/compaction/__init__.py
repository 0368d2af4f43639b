"""Compaction topics (seed 001; Apache RocketMQ's ``store/kv``): the latest value per key, with
tombstones, split out of the CommitLog into per topic/queue CompactionLogs and compacted in
rounds. Plugged into a ``MessageStore`` through its seams (``CompactionStore.plug_into``); the
store imports nothing from here. Formats: ``docs/formats/compaction-log.md`` and
``docs/formats/compaction-batch-cq.md``.
"""

from stratamq.compaction.offset_map import OffsetMap
from stratamq.compaction.policy import (
    StaticPolicies,
    TopicPolicies,
    TopicPolicy,
    policies_from_topics_json,
    policy_from_attributes,
)
from stratamq.compaction.round import RoundReport
from stratamq.compaction.service import CompactionStore

__all__ = ["CompactionStore", "OffsetMap", "RoundReport", "StaticPolicies", "TopicPolicies",
           "TopicPolicy", "policies_from_topics_json", "policy_from_attributes"]

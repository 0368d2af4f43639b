"""The embedded message store: CommitLog, ConsumeQueues, dispatch, flush and recovery."""

from stratamq.store.message_store import MessageStore
from stratamq.store.results import (
    GetMessageResult,
    GetMessageStatus,
    PutMessageResult,
    PutMessageStatus,
)

__all__ = [
    "GetMessageResult",
    "GetMessageStatus",
    "MessageStore",
    "PutMessageResult",
    "PutMessageStatus",
]

"""The embedded message store: CommitLog, ConsumeQueues, dispatch, flush and recovery.

``MessageStore`` is imported on first use (PEP 562): the settings module imports the index
file's layout from this package, and the store imports the settings.
"""

from typing import TYPE_CHECKING, Any

from stratamq.store.results import (
    GetMessageResult,
    GetMessageStatus,
    PutMessageResult,
    PutMessageStatus,
)

if TYPE_CHECKING:
    from stratamq.store.message_store import MessageStore


def __getattr__(name: str) -> Any:
    if name == "MessageStore":
        from stratamq.store.message_store import MessageStore

        return MessageStore
    raise AttributeError(f"module 'stratamq.store' has no attribute {name!r}")


__all__ = [
    "GetMessageResult",
    "GetMessageStatus",
    "MessageStore",
    "PutMessageResult",
    "PutMessageStatus",
]

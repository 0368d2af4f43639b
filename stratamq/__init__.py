"""StrataMQ: a message store and broker on Apache RocketMQ's store design."""

from stratamq.config import FlushDiskType, StoreConfig
from stratamq.message import Host, Message, StoredMessage
from stratamq.store import (
    GetMessageResult,
    GetMessageStatus,
    MessageStore,
    PutMessageResult,
    PutMessageStatus,
)

__all__ = [
    "FlushDiskType",
    "GetMessageResult",
    "GetMessageStatus",
    "Host",
    "Message",
    "MessageStore",
    "PutMessageResult",
    "PutMessageStatus",
    "StoreConfig",
    "StoredMessage",
]
__version__ = "0.1.0"

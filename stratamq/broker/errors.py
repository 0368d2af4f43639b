"""The one exception RPC handlers turn into a response status (never a crash)."""

from __future__ import annotations

from stratamq.message import RecordCorrupt

__all__ = ["BrokerError", "damage_text"]


class BrokerError(Exception):
    """A request the broker refuses: ``code`` is an ``apache.rocketmq.v2.Code`` value.

    Raised anywhere below a handler (validation, ACL, the pop engine); the handler answers
    ``Status(code, message)`` and the broker keeps serving.
    """

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def damage_text(exc: RecordCorrupt) -> str:
    """A damaged stored record, said with where it is (for a status message and the log)."""
    at_queue = f"queue offset {exc.queue_offset}, " if exc.queue_offset is not None else ""
    return (f"the stored message at {at_queue}CommitLog offset {exc.position} is damaged "
            f"({exc.reason}); it cannot be served until the store is repaired")

"""The one exception RPC handlers turn into a response status (never a crash)."""

from __future__ import annotations

__all__ = ["BrokerError"]


class BrokerError(Exception):
    """A request the broker refuses: ``code`` is an ``apache.rocketmq.v2.Code`` value.

    Raised anywhere below a handler (validation, ACL, the pop engine); the handler answers
    ``Status(code, message)`` and the broker keeps serving.
    """

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

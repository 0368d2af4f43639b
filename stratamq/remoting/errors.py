"""Refusals as remoting responses: RocketMQ's response codes for the broker's errors.

The logic the gRPC adapter shares (``Lookup``, ACL) raises ``BrokerError`` with a gRPC
``Code``; ``error_response`` answers it with the response code a RocketMQ 4 broker uses for
the same refusal. Remoting-only checks raise ``RemotingError`` with a response code directly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb

from stratamq.broker.errors import BrokerError
from stratamq.remoting.codec import RemotingCommand
from stratamq.remoting.codes import ResponseCode

__all__ = ["RemotingError", "answer_in", "error_response"]

Code = pb.Code

_BY_GRPC_CODE = {
    int(Code.TOPIC_NOT_FOUND): ResponseCode.TOPIC_NOT_EXIST,
    int(Code.UNAUTHORIZED): ResponseCode.NO_PERMISSION,
    int(Code.FORBIDDEN): ResponseCode.NO_PERMISSION,
    int(Code.CONSUMER_GROUP_NOT_FOUND): ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
    int(Code.ILLEGAL_FILTER_EXPRESSION): ResponseCode.SUBSCRIPTION_PARSE_FAILED,
    int(Code.MESSAGE_BODY_TOO_LARGE): ResponseCode.MESSAGE_ILLEGAL,
    int(Code.MESSAGE_CORRUPTED): ResponseCode.MESSAGE_ILLEGAL,
    int(Code.ILLEGAL_TOPIC): ResponseCode.INVALID_PARAMETER,
    int(Code.ILLEGAL_CONSUMER_GROUP): ResponseCode.INVALID_PARAMETER,
    int(Code.TOO_MANY_REQUESTS): ResponseCode.SYSTEM_BUSY,
}


class RemotingError(Exception):
    """A refusal with a remoting response code and RocketMQ-like remark."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def error_response(request: RemotingCommand,
                   exc: BrokerError | RemotingError) -> RemotingCommand:
    if isinstance(exc, RemotingError):
        return request.response(exc.code, exc.message)
    return request.response(_BY_GRPC_CODE.get(int(exc.code), ResponseCode.SYSTEM_ERROR),
                            exc.message)


async def answer_in(run: Callable[..., Any], fn: Callable[..., RemotingCommand],
                    request: RemotingCommand, *args: Any) -> RemotingCommand:
    """``fn(request, *args)`` through ``run`` (the broker's executor), a refusal it raises
    answered with its response code."""
    try:
        return await run(fn, request, *args)
    except (BrokerError, RemotingError) as exc:
        return error_response(request, exc)

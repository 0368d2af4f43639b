"""The admin service's tiered-storage methods (``/stratamq.admin.v1.Admin/<Method>``, JSON
bodies, same errors and ACL as ``broker/admin.py``); registered as a second handler of the same
service so that module stays as it is.

* ``TierStatus {}`` -> ``{"queues": [ROW]}``
* ``TierFlush {"timeout_s"?}`` -> ``{"committed": bool, "queues": [ROW]}``: upload everything
  dispatched so far and answer once it is committed (``committed`` false if ``timeout_s``,
  default 60, ran out first)

ROW is ``{"topic", "queue_id", "local_min_offset", "local_max_offset", "tier_min_offset",
"tier_max_offset", "tier_committed_offset", "tier_bytes", "lag_messages", "lag_bytes"}``
(``stratamq tier status`` prints the same rows). Both answer ``FAILED_PRECONDITION`` when the
broker runs without a tier.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb

from stratamq.broker.admin import _dumps, _loads
from stratamq.broker.errors import BrokerError
from stratamq.broker.metadata import MetadataError
from stratamq.broker.ports import Call
from stratamq.broker.rpc import call_of
from stratamq.client.admin import SERVICE

if TYPE_CHECKING:
    from stratamq.broker.server import Broker

__all__ = ["tier_admin_handler"]


class _NoTier(Exception):
    """The broker runs without a tier."""


def _local(broker: Broker) -> Callable[[str, int], tuple[int, int] | None]:
    def held(topic: str, queue_id: int) -> tuple[int, int] | None:
        offsets = broker.store.local_source.offsets(topic, queue_id)
        return None if offsets is None else (offsets.low, offsets.high)

    return held


def tier_admin_handler(broker: Broker) -> grpc.GenericRpcHandler:
    def status(req: dict[str, Any]) -> dict[str, Any]:
        return {"queues": broker.tiered.status(_local(broker),
                                               broker.store.local_source.topics)}

    def flush(req: dict[str, Any]) -> dict[str, Any]:
        timeout = req.get("timeout_s", 60)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise MetadataError("invalid", "timeout_s must be a positive number of seconds")
        committed = broker.tiered.flush(float(timeout))
        return {"committed": committed,
                "queues": broker.tiered.status(_local(broker), broker.store.local_source.topics)}

    methods = {"TierStatus": (status, "Get"), "TierFlush": (flush, "Update")}

    def make(method: Callable[[dict[str, Any]], dict[str, Any]], action: str) -> Callable:
        def work(request: bytes, call: Call) -> bytes:
            req = _loads(request)
            broker.lookup.authorize(call, "Cluster", action)
            if getattr(broker, "tiered", None) is None:
                raise _NoTier()
            return _dumps(method(req))

        async def handle(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            try:
                return await broker.run(work, request, call_of(context))
            except _NoTier:
                await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                    "tiered storage is off on this broker "
                                    "(tieredBackendServiceProvider is not set)")
            except MetadataError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            except BrokerError as exc:
                code = (grpc.StatusCode.UNAUTHENTICATED if exc.code == pb.Code.UNAUTHORIZED
                        else grpc.StatusCode.PERMISSION_DENIED)
                await context.abort(code, exc.message)
            except OSError as exc:
                await context.abort(grpc.StatusCode.UNAVAILABLE, f"tier: {exc}")
            raise AssertionError("unreachable")  # context.abort raises

        return grpc.unary_unary_rpc_method_handler(handle)

    return grpc.method_handlers_generic_handler(
        SERVICE, {name: make(fn, action) for name, (fn, action) in methods.items()})

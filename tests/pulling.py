"""Reading a queue through a broker's ``PullMessage``, from an offset to its end, as the tests
that compare what a broker serves with what was written do."""

from __future__ import annotations

import grpc
from rocketmq.grpc_protocol import definition_pb2 as pb
from rocketmq.grpc_protocol import service_pb2 as svc
from rocketmq.grpc_protocol import service_pb2_grpc


def pull_queue(endpoint: str, topic: str, queue_id: int, *, start: int = 0,
               group: str = "test-reader", batch_size: int = 64,
               records: bool = False) -> list[pb.Message]:
    """Every message of ``topic``/``queue_id`` from ``start`` on, in queue order, pulling until a
    reply brings no message or a status other than OK. ``records``: bodies are whole CommitLog
    records (StrataMQ's ``x-stratamq-pull-format: records``, the Spark source's way)."""
    metadata = (("x-stratamq-pull-format", "records"),) if records else ()
    out: list[pb.Message] = []
    offset = start
    with grpc.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        while True:
            request = svc.PullMessageRequest(
                group=pb.Resource(name=group), offset=offset, batch_size=batch_size,
                message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=queue_id),
                filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"))
            request.long_polling_timeout.FromMilliseconds(0)
            status, next_offset, got = pb.OK, offset, []
            for reply in stub.PullMessage(request, metadata=metadata, timeout=30):
                kind = reply.WhichOneof("content")
                if kind == "status":
                    status = reply.status.code
                elif kind == "message":
                    got.append(reply.message)
                else:
                    next_offset = reply.next_offset
            if status != pb.OK or not got:
                return out
            out += got
            if next_offset <= offset:
                return out
            offset = next_offset

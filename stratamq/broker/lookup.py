"""Topic, group and queue lookups for requests, with access control and auto-creation.

Shared by the client, send, receive and pull logic. Free of I/O except the metadata writes an
auto-created topic or group makes (``MetadataStore``), so a caller on an event loop runs the
calls that may create (routes, heartbeats, receives) in its executor.

Thread-safety: any thread (``MetadataStore`` serialises its own writes).
"""

from __future__ import annotations

from typing import Any

from rocketmq.grpc_protocol import definition_pb2 as pb

from stratamq.broker.errors import BrokerError
from stratamq.broker.metadata import GroupConfig, MetadataError, MetadataStore, TopicConfig
from stratamq.broker.ports import Call
from stratamq.broker.validate import check_group, check_topic
from stratamq.config import BrokerConfig
from stratamq.store.filter import TagFilter

__all__ = ["Lookup"]

Code = pb.Code


class Lookup:
    """Configs of the topics and groups requests name; ``acl`` None: access control off."""

    def __init__(self, meta: MetadataStore, config: BrokerConfig, acl: Any = None) -> None:
        self.meta = meta
        self.config = config
        self.acl = acl

    def authorize(self, call: Call, resource: str, action: str) -> None:
        """Raise UNAUTHORIZED / FORBIDDEN unless the caller may; a no-op without ACL."""
        if self.acl is not None:
            self.acl.authorize(call.metadata, resource, action)

    def topic(self, name: str, *, create: bool = False, queues: int | None = None
              ) -> TopicConfig:
        # System topics (e.g. the timer's rmq_sys_wheel_timer, holding not-yet-due DELAY
        # messages) are internal: neither routed, written, read nor auto-created for clients.
        # A topic loaded from stored data under a name today's rule refuses is served as it is.
        cfg = self.meta.topic(name)
        if cfg is None or not cfg.stored_name:
            check_topic(name)
        if cfg is None and create and self.config.auto_create_topic_enable:
            # (queues: the count a remoting producer asked for, else defaultTopicQueueNums)
            cfg = self.meta.create_topic(name, queues or self.config.default_topic_queue_nums,
                                         exist_ok=True)
        if cfg is None:
            raise BrokerError(Code.TOPIC_NOT_FOUND, f"topic {name!r} does not exist")
        return cfg

    def group(self, name: str, call: Call) -> GroupConfig:
        """The group's config; an unknown group is created when autoCreateSubscriptionGroup
        is on, and with ACL only for an account that may create groups (the admin): any
        signed-in client could otherwise fill the broker with groups."""
        cfg = self.meta.group(name)
        if cfg is None or not cfg.stored_name:  # (stored_name: see topic)
            check_group(name)
        if cfg is None and self.config.auto_create_subscription_group:
            try:
                self.authorize(call, f"Group:{name}", "Create")
            except BrokerError as exc:
                if exc.code != Code.FORBIDDEN:
                    raise
                raise BrokerError(Code.FORBIDDEN, f"group {name!r} does not exist, and only "
                                  "an admin account may create it (stratamq group create)"
                                  ) from None
            try:
                cfg = self.meta.create_group(name, exist_ok=True)
            except MetadataError as exc:
                raise BrokerError(Code.ILLEGAL_CONSUMER_GROUP, str(exc)) from None
        if cfg is None:
            raise BrokerError(Code.CONSUMER_GROUP_NOT_FOUND, f"group {name!r} does not exist")
        if not cfg.consume_enable:
            raise BrokerError(Code.FORBIDDEN, f"group {name!r} has consumeEnable=false")
        return cfg

    def subscription(self, call: Call, group_name: str,
                     topic_name: str) -> tuple[GroupConfig, TopicConfig]:
        """Check that the caller may consume ``topic_name`` as ``group_name``; both configs."""
        self.authorize(call, f"Group:{group_name}", "Sub")
        self.authorize(call, f"Topic:{topic_name}", "Sub")
        return self.group(group_name, call), self.topic(topic_name)

    def named_queue(self, mq: pb.MessageQueue) -> tuple[TopicConfig, int]:
        """The topic config and checked queue id a request's ``message_queue`` names."""
        topic = self.topic(mq.topic.name)
        return topic, self.queue_id(topic, mq.id)

    @staticmethod
    def queue_id(topic: TopicConfig, qid: int) -> int:
        if not 0 <= qid < topic.queue_count:
            raise BrokerError(Code.BAD_REQUEST,
                              f"queue {qid} out of range: topic {topic.name!r} has "
                              f"{topic.queue_count} queues")
        return qid

    @staticmethod
    def filter(expr: pb.FilterExpression) -> TagFilter:
        if expr.type == pb.SQL:
            raise BrokerError(Code.ILLEGAL_FILTER_EXPRESSION,
                              "SQL92 filter expressions are not supported; use tags")
        try:
            return TagFilter(expr.expression or "*")
        except ValueError as exc:
            raise BrokerError(Code.ILLEGAL_FILTER_EXPRESSION, str(exc)) from None

    @staticmethod
    def check_batch_size(batch_size: int, most: int = 1024) -> None:
        if not 1 <= batch_size <= most:
            raise BrokerError(Code.BAD_REQUEST, f"batch_size must be 1..{most}, not {batch_size}")

    def poll_ms(self, wanted_ms: int, call: Call) -> int:
        """How long a receive or pull may wait: capped by the broker
        (``grpcClientConsumerMaxLongPollingTimeoutMillis``, 20 s as the proxy), and short
        enough to answer before the client gives up on the call. Unlike the proxy, which raises
        a shorter wait to its 5 s minimum (and answers ILLEGAL_POLLING_TIME when the deadline
        leaves less), a shorter wait is honoured: an empty queue is answered sooner, never
        later."""
        poll = min(wanted_ms, self.config.max_long_polling_time_mills)
        if call.time_remaining is not None:
            poll = max(0, min(poll, int((call.time_remaining - 1.0) * 1000)))
        return poll

"""The gRPC broker that the official Apache RocketMQ 5 clients use (see ``server.py``)."""

from stratamq.broker.errors import BrokerError
from stratamq.broker.server import Broker, NullMetrics

__all__ = ["Broker", "BrokerError", "NullMetrics"]

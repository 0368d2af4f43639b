"""Clients of a running StrataMQ broker (the official RocketMQ clients cover messaging)."""

from stratamq.client.admin import AdminClient, AdminError

__all__ = ["AdminClient", "AdminError"]

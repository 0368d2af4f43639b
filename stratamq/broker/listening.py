"""The broker's listening ports: the gRPC server (its options, its port, plaintext or TLS) and
the 4.x remoting front door, on a port of its own or sharing the gRPC port (it then takes the
port and relays gRPC's connections to gRPC on a loopback port).

Each function is handed the narrow things it uses; ``Broker.start`` (server.py) decides which
ports to bind and in what order. Errors are OSErrors without an errno, worded for the CLI to
print as they are.
"""

from __future__ import annotations

import socket
from typing import Any

import grpc

from stratamq.config import BrokerConfig, BrokerRole, StoreConfig
from stratamq.remoting.transport import listen_socket

__all__ = ["add_grpc_port", "grpc_server", "host_port", "remoting_identity",
           "shared_listener", "start_remoting"]


def host_port(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def grpc_server(max_message_size: int) -> grpc.aio.Server:
    """The gRPC server, taking and sending messages up to ``max_message_size`` (plus 1 MiB
    of framing). Made on the event loop it will serve on."""
    max_len = max_message_size + 1024 * 1024
    return grpc.aio.server(options=[
        ("grpc.max_receive_message_length", max_len),
        ("grpc.max_send_message_length", max_len),
        ("grpc.so_reuseport", 0),
        # gRPC Core holds calls that arrive faster than the loop takes them, and cancels
        # those past 1,000 (3,000 at worst): thousands of clients reconnecting at once
        # (a broker restart) would lose their first calls. Take them all, for 60 s.
        ("grpc.server.max_pending_requests", 100_000),
        ("grpc.server.max_pending_requests_hard_limit", 100_000),
        ("grpc.server_max_unrequested_time_in_server", 60)])


def add_grpc_port(server: grpc.aio.Server, address: str,
                  credentials: grpc.ServerCredentials | None) -> int:
    """Bind ``address`` (TLS with ``credentials``, else plaintext); the port bound (0 if
    gRPC could not)."""
    try:
        if credentials is not None:
            return server.add_secure_port(address, credentials)
        return server.add_insecure_port(address)
    except RuntimeError as exc:
        raise OSError(f"cannot listen on {address}: {exc}") from None


def shared_listener(host: str, port: int) -> socket.socket:
    """The port both protocols share, bound now (so a listen port of 0 is known at once)."""
    try:
        return listen_socket(host, port)
    except OSError as exc:  # (no errno: the CLI names the reason, as for gRPC's)
        raise OSError(f"cannot listen on {host_port(host, port)}: {exc.strerror or exc}"
                      ) from None


def remoting_identity(cfg: BrokerConfig, store_config: StoreConfig) -> dict[str, str]:
    """What the remoting front door says this broker is (``RemotingFrontend.identity``)."""
    return {"clusterName": cfg.broker_cluster_name, "brokerName": cfg.broker_name,
            # RocketMQ's ids: 0 the master, a slave's above (clients send to 0).
            "brokerId": "1" if store_config.broker_role is BrokerRole.SLAVE else "0",
            "haServerAddr": ""}


async def start_remoting(remoting: Any, cfg: BrokerConfig, store_config: StoreConfig,
                         listen_host: str, grpc_port: int,
                         shared: socket.socket | None) -> None:
    """Start the ``RemotingFrontend`` on ``remotingListenPort``, or on ``shared`` (then
    relaying gRPC's connections to ``grpc_port`` on loopback), and register with the
    NameServers."""
    from stratamq.remoting.broker import registered_host

    try:
        await remoting.start(
            listen_host, cfg.remoting_listen_port,
            ("127.0.0.1", grpc_port) if shared is not None else None,
            registered_host(store_config.broker_ip, listen_host),
            cfg.namesrv_addr, cfg.register_name_server_period,
            store_config.max_message_size, listener=shared)
    except OSError as exc:  # (no errno: the CLI prints it as it is)
        raise OSError(f"cannot listen on {listen_host}:{cfg.remoting_listen_port} "
                      f"(remotingListenPort): {exc.strerror or exc}") from None

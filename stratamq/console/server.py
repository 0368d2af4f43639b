"""Running the console: ``serve`` in the foreground (``stratamq console``) or
``ConsoleThread`` beside a broker (``consoleListenPort``), both under uvicorn."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading

import uvicorn

from stratamq.client.connection import BrokerEndpoint
from stratamq.console.app import Console
from stratamq.console.broker_api import ConsoleBroker

log = logging.getLogger(__name__)


def split_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as (host, port); ValueError says what is wrong."""
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"must be HOST:PORT with a port 0..65535, not {listen!r}")
    return host.strip("[]"), int(port)


def _bound_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound here so a busy port fails at once and port 0 is known.

    Made with IPPROTO_TCP named: asyncio sets TCP_NODELAY on the connections it accepts only
    from a socket whose proto says TCP. Without it a kept-alive connection (every browser's)
    waited ~40 ms per page: the response's second write sat in Nagle's buffer until the
    browser's delayed ACK of the first."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


class ConsoleServer:
    """The console app on a bound socket; ``port`` is the one bound."""

    def __init__(self, endpoint: BrokerEndpoint, listen: str, *, read_only: bool = False,
                 sample_interval_s: float = 15.0) -> None:
        host, port = split_listen(listen)
        self.sock = _bound_socket(host, port)
        self.host, self.port = host, self.sock.getsockname()[1]
        self.broker = ConsoleBroker(endpoint)
        app = Console(self.broker, read_only=read_only,
                      sample_interval_s=sample_interval_s).app()
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on",
                                                    access_log=False))

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def run(self) -> None:
        """Serve until SIGINT/SIGTERM (uvicorn's handlers) or ``stop``."""
        try:
            asyncio.run(self.server.serve(sockets=[self.sock]))
        finally:
            self.sock.close()
            self.broker.close()

    def stop(self) -> None:
        self.server.should_exit = True


class ConsoleThread:
    """The console inside another process (the broker): served from a daemon thread, its own
    event loop; uvicorn's signal handlers stay the host's."""

    def __init__(self, server: ConsoleServer) -> None:
        self.server = server  # (uvicorn installs signal handlers from the main thread only)
        self.thread = threading.Thread(target=server.run, name="console", daemon=True)

    def start(self) -> ConsoleThread:
        self.thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self.server.stop()
        self.thread.join(timeout)

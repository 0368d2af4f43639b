"""An S3-compatible HTTP server on loopback for the tiered-storage tests (no tests here).

moto's server mode (``moto.server.ThreadedMotoServer``): a real HTTP server the tier talks to
through s3fs, as it would talk to AWS or MinIO. Its objects live in this test process, so the
server can be stopped (connections refused) and started again on the same port with its
objects intact: an outage in the middle of an upload. Broker subprocesses reach it over TCP
like any client.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid

from moto.server import ThreadedMotoServer

# Credentials for the standard AWS chain s3fs reads (moto accepts any); set before any client.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "stratamq-test")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "stratamq-test-secret")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
logging.getLogger("werkzeug").setLevel(logging.ERROR)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """``start()`` / ``stop()`` any number of times; the port and the objects stay."""

    def __init__(self) -> None:
        self.port = _free_port()
        self._server: ThreadedMotoServer | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> S3Server:
        deadline = time.monotonic() + 30
        while True:
            try:
                server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
                server.start()
                break
            except OSError:  # the port is still in TIME_WAIT after a stop
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self._server = server
        self._wait_listening()
        return self

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"moto did not listen on {self.port}")

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def new_bucket(self, fs) -> str:
        name = f"tier-{uuid.uuid4().hex[:12]}"
        fs.mkdir(name)
        return name

    def filesystem(self):
        import s3fs

        return s3fs.S3FileSystem(client_kwargs={"endpoint_url": self.endpoint},
                                 skip_instance_cache=True, use_listings_cache=False)

"""Web console benchmark: each page's time against the admin RPCs it calls, in the same run.

    python bench/console.py [--topics 1000] [--groups 1000] [--samples 50]

A broker subprocess on an empty store gets ``--topics`` topics and ``--groups`` groups; a
console serves it from this process. Per page, ``--samples`` GETs of the page (HTTP, through
the whole stack: uvicorn, Starlette, the templates) alternate with the same admin RPCs made
directly with ``AdminClient``, so a noisy neighbour hits both. Prints JSON lines:

* ``env``: interpreter, CPUs, the settings.
* ``page`` per page: p50/p95 of the page and of its RPCs (ms), ``ratio`` = page p95 over RPC
  p95 (the issue's target: at most 2), ``ratio_p50`` the same of the medians (steadier on a
  loaded machine), the page's size in bytes.

Pages are fetched over one kept-alive HTTP connection with the console's cookie sent back, as
a browser fetches them (a fresh connection per page would time TCP set-up and hide what a
browser waits for on a reused one: Nagle's stall, before the console set TCP_NODELAY).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stratamq.client.admin import AdminClient
from stratamq.client.connection import BrokerEndpoint
from stratamq.client.messaging import MessagingClient
from stratamq.console.server import ConsoleServer, ConsoleThread


def _start_broker(root: Path) -> tuple[subprocess.Popen, str]:
    conf = root / "broker.conf"
    conf.write_text("grpcThreadPoolNums=16\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "stratamq.cli", "broker", "start", "--store", str(root / "store"),
         "--listen", "127.0.0.1:0", "--config", str(conf)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    m = re.search(r"listening on (\S+)", line)
    if not m:
        proc.kill()
        raise SystemExit(f"broker did not start: {line!r}")
    return proc, m.group(1)


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000, 2)


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=50)
    args = parser.parse_args()
    print(json.dumps({"env": {"python": platform.python_version(), "cpus": os.cpu_count(),
                              "topics": args.topics, "groups": args.groups,
                              "samples": args.samples}}), flush=True)
    root = Path(tempfile.mkdtemp(prefix="stratamq-bench-console-"))
    proc, console = None, None
    try:
        proc, endpoint = _start_broker(root)
        with AdminClient(endpoint, timeout=60) as admin:
            for i in range(args.topics):
                admin.call("CreateTopic", topic=f"Topic{i:04d}", queues=4)
            for i in range(args.groups):
                admin.call("CreateGroup", group=f"Group{i:04d}")
            with MessagingClient(endpoint) as client:
                for i in range(64):
                    client.send("Topic0000", f"body {i}".encode(), keys=[f"k{i}"])
            # The sampler's first sample is taken at start; an hour's interval keeps it quiet.
            console = ConsoleThread(ConsoleServer(BrokerEndpoint(endpoint), "127.0.0.1:0",
                                                  sample_interval_s=3600))
            console.start()
            messaging = MessagingClient(endpoint)
            pages: list[tuple[str, str, Callable[[], Any]]] = [
                ("overview", "/", lambda: (admin.call("BrokerStatus"),
                                           _optional(admin, "TierStatus"),
                                           _optional(admin, "HaStatus", "ha"))),
                ("topics", "/topics", lambda: admin.call("ListTopics")),
                ("topic", "/topics/Topic0000", lambda: (
                    admin.call("TopicRoute", topic="Topic0000"),
                    admin.call("TopicStatus", topic="Topic0000"), admin.call("ListTopics"))),
                ("groups", "/groups", lambda: admin.call("ListGroups")),
                ("group", "/groups/Group0000",
                 lambda: admin.call("GroupProgress", group="Group0000")),
                ("message", "/messages?topic=Topic0000&queue=0&offset=0",
                 lambda: messaging.get("Topic0000", 0, 0, group="stratamq-console")),
                ("dlq", "/dlq?group=Group0000", lambda: _optional(
                    admin, "TopicStatus", topic="%DLQ%Group0000")),
            ]
            browser = http.client.HTTPConnection(console.server.host, console.server.port,
                                                 timeout=120)
            cookie: dict[str, str] = {}  # the console's CSRF cookie, once it set one
            for name, path, rpcs in pages:
                page_t, rpc_t, size = [], [], 0
                for _ in range(args.samples):
                    def get(path: str = path) -> None:
                        nonlocal size
                        browser.request("GET", path, headers=cookie)
                        reply = browser.getresponse()
                        size = len(reply.read())
                        given = reply.getheader("set-cookie")
                        if given:  # kept, as a browser keeps it
                            cookie["Cookie"] = given.split(";", 1)[0]
                        if reply.status != 200:
                            raise SystemExit(f"{path}: HTTP {reply.status}")

                    page_t.append(_timed(get))
                    rpc_t.append(_timed(rpcs))
                print(json.dumps({"page": name, "path": path, "bytes": size,
                                  "page_p50_ms": _pct(page_t, 0.5),
                                  "page_p95_ms": _pct(page_t, 0.95),
                                  "rpc_p50_ms": _pct(rpc_t, 0.5), "rpc_p95_ms": _pct(rpc_t, 0.95),
                                  "ratio": round(_pct(page_t, 0.95) / max(_pct(rpc_t, 0.95),
                                                                            0.01), 2),
                                  "ratio_p50": round(_pct(page_t, 0.5) / max(_pct(rpc_t, 0.5),
                                                                             0.01), 2),
                                  "target": 2.0}), flush=True)
            browser.close()
            messaging.channel.close()
    finally:
        if console is not None:
            console.stop()
        if proc is not None:
            proc.terminate()
            proc.wait(60)
        shutil.rmtree(root, ignore_errors=True)


def _optional(admin: AdminClient, method: str, service: str | None = None,
              **request: Any) -> Any:
    from stratamq.broker.replication import SERVICE as HA_SERVICE
    from stratamq.client.admin import AdminError

    try:
        if service is not None:
            return admin.call_service(HA_SERVICE, method, **request)
        return admin.call(method, **request)
    except AdminError:
        return None


if __name__ == "__main__":
    main()

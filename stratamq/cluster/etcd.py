"""``Coordination`` on etcd v3, through etcd's gRPC gateway (JSON over HTTP) with ``etcd3gw``.

Why this client: ``etcd3gw`` is OpenStack's etcd v3 client (used by tooz, released through
2026), synchronous (the broker's roles run on threads, like the HA link), and speaks the
gateway's JSON, so it carries no generated protobuf code that would have to match the
protobuf runtime this project pins for the RocketMQ client (``etcd3``, the best known
client, is unmaintained and pinned to old protobuf; ``aetcd`` is maintained but asyncio-only
and ships generated gRPC stubs). etcd 3.4 (Debian's ``etcd-server``) and later serve the
gateway on the client port at ``/v3/``.

Requests go to one member at a time; a member that cannot be reached is skipped for the next
one (``etcdEndpoints`` lists them all), so one dead member changes nothing. Every request has
a timeout of a third of the lease TTL at most: a broker learns in time that it cannot renew.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from etcd3gw import exceptions as etcd_exceptions
from etcd3gw.client import Etcd3Client

from stratamq.cluster.coordination import (
    CoordinationError,
    CoordinationUnavailable,
    KeyValue,
    LeaseLost,
    WatchEvent,
)

__all__ = ["EtcdCoordination", "parse_endpoints"]

log = logging.getLogger(__name__)


def _b64(data: bytes | str) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode()


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def _prefix_end(prefix: str) -> str:
    """etcd's range end for "every key starting with prefix": the prefix with its last byte
    incremented (bytes 0xff are dropped first)."""
    raw = bytearray(prefix.encode())
    while raw and raw[-1] == 0xFF:
        raw.pop()
    if not raw:
        return _b64(b"\0")  # every key
    raw[-1] += 1
    return _b64(bytes(raw))


def _raw(data: bytes | str | None) -> bytes:
    if data is None:
        return b""
    return data.encode() if isinstance(data, str) else data


def _text(data: bytes | str | None) -> str:
    return _raw(data).decode()


def parse_endpoints(endpoints: str) -> list[tuple[str, str, int]]:
    """``etcdEndpoints`` (comma-separated URLs; ``host:port`` means http) as (scheme, host,
    port); ValueError names a bad one."""
    out = []
    for item in (e.strip() for e in endpoints.split(",")):
        if not item:
            continue
        url = urlsplit(item if "://" in item else f"http://{item}")
        if url.scheme not in ("http", "https") or not url.hostname or url.port is None:
            raise ValueError(f"etcdEndpoints: {item!r} is not http(s)://host:port")
        out.append((url.scheme, url.hostname, url.port))
    if not out:
        raise ValueError("etcdEndpoints is empty")
    return out


def _kv(item: dict[str, Any]) -> KeyValue:
    return KeyValue(_unb64(item.get("key")).decode(), _unb64(item.get("value")),
                    int(item.get("mod_revision", 0)), int(item.get("lease", 0)))


class EtcdCoordination:
    """``Coordination`` on the etcd members at ``endpoints``; see the module docstring."""

    def __init__(self, endpoints: str, timeout_s: float = 2.0,
                 retry_s: float | None = None) -> None:
        self.timeout = timeout_s
        # How long a call keeps asking while no member answers (an election takes ~1-2 s);
        # 0: one pass over the members (a caller with its own loop and deadlines).
        self.retry_s = max(3.0, 2 * timeout_s) if retry_s is None else retry_s
        self._clients = [Etcd3Client(host=host, port=port, protocol=scheme, timeout=timeout_s)
                         for scheme, host, port in parse_endpoints(endpoints)]
        self._current = 0
        self._lock = threading.Lock()
        self.requests = 0  # sent, for the benchmark's "etcd requests per broker per second"

    # -- transport -----------------------------------------------------------------------------

    def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``/v3/<path>`` on the current member, else the next ones. While
        no member answers, the members are asked again for up to ``retry_s``: when a member
        dies, the others need an election (etcd's election timeout, longer on a loaded
        machine) before they answer, and one dead member of three must change nothing."""
        deadline = time.monotonic() + self.retry_s
        pause = 0.05
        while True:
            try:
                return self._call_once(path, body)
            except CoordinationUnavailable:
                if time.monotonic() + pause >= deadline:
                    raise
            time.sleep(pause)  # the members are electing a leader or unreachable: ask again
            pause = min(pause * 2, 0.5)

    def _call_once(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            start = self._current
        errors = []
        for i in range(len(self._clients)):
            index = (start + i) % len(self._clients)
            client = self._clients[index]
            self.requests += 1
            try:
                reply = client.post(client.get_url(path), json=body)
            except (etcd_exceptions.ConnectionFailedError,
                    etcd_exceptions.ConnectionTimeoutError) as exc:
                errors.append(f"{client.host}:{client.port}: {exc or type(exc).__name__}")
                continue
            except etcd_exceptions.Etcd3Exception as exc:
                detail = str(getattr(exc, "detail_text", "") or exc)
                if "lease not found" in detail:
                    raise LeaseLost(detail) from None
                if "no leader" in detail or "timed out" in detail or "unavailable" in detail:
                    errors.append(f"{client.host}:{client.port}: {detail}")
                    continue  # this member lost its quorum: another may have one
                raise CoordinationError(detail) from None
            if index != start:
                with self._lock:
                    self._current = index
            return reply if isinstance(reply, dict) else {}
        raise CoordinationUnavailable("etcd unreachable: " + "; ".join(errors))

    # -- leases --------------------------------------------------------------------------------

    def grant(self, ttl_ms: int) -> int:
        reply = self._call("/lease/grant", {"TTL": max(1, -(-ttl_ms // 1000))})
        return int(reply["ID"])

    def keep_alive(self, lease: int) -> int:
        reply = self._call("/lease/keepalive", {"ID": lease})
        ttl = int((reply.get("result") or {}).get("TTL", 0))
        if ttl <= 0:  # etcd answers a lapsed lease's keep-alive with TTL 0 (or absent)
            raise LeaseLost(f"lease {lease:x} has lapsed")
        return ttl * 1000

    def revoke(self, lease: int) -> None:
        with contextlib.suppress(LeaseLost):  # lapsed already: nothing to revoke
            self._call("/kv/lease/revoke", {"ID": lease})

    def lease_age_ms(self, lease: int) -> int | None:
        """How long ago ``lease`` was granted or last renewed (None: it has lapsed)."""
        reply = self._call("/kv/lease/timetolive", {"ID": lease})
        ttl, granted = int(reply.get("TTL", -1)), int(reply.get("grantedTTL", 0))
        return None if ttl < 0 else max(0, granted - ttl) * 1000

    # -- keys ----------------------------------------------------------------------------------

    def put(self, key: str, value: bytes, lease: int = 0) -> None:
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = lease
        self._call("/kv/put", body)

    def get(self, key: str) -> KeyValue | None:
        kvs = self._call("/kv/range", {"key": _b64(key)}).get("kvs") or []
        return _kv(kvs[0]) if kvs else None

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        reply = self._call("/kv/range", {"key": _b64(prefix), "range_end": _prefix_end(prefix),
                                         "sort_order": "ASCEND", "sort_target": "KEY"})
        return [_kv(item) for item in reply.get("kvs") or []]

    def get_prefixes(self, *prefixes: str) -> list[list[KeyValue]]:
        ranges = [{"request_range": {"key": _b64(p), "range_end": _prefix_end(p),
                                     "sort_order": "ASCEND", "sort_target": "KEY"}}
                  for p in prefixes]
        reply = self._call("/kv/txn", {"compare": [], "success": ranges, "failure": []})
        responses = reply.get("responses") or []
        if len(responses) != len(prefixes):
            raise CoordinationError(f"etcd answered {len(responses)} ranges for "
                                    f"{len(prefixes)}")
        return [[_kv(item) for item in (r.get("response_range") or {}).get("kvs") or []]
                for r in responses]

    def _txn(self, compare: list[dict[str, Any]], puts: list[dict[str, Any]]) -> bool:
        reply = self._call("/kv/txn", {"compare": compare, "success": puts, "failure": []})
        return bool(reply.get("succeeded", False))  # JSON leaves a false out

    @staticmethod
    def _puts(key: str, value: bytes, lease: int, also: tuple[tuple[str, bytes], ...]
              ) -> list[dict[str, Any]]:
        first: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            first["lease"] = lease
        return [{"request_put": first},
                *({"request_put": {"key": _b64(k), "value": _b64(v)}} for k, v in also)]

    def create(self, key: str, value: bytes, lease: int = 0,
               also: tuple[tuple[str, bytes], ...] = (),
               unchanged: tuple[tuple[str, int], ...] = ()) -> bool:
        compare = [{"key": _b64(key), "result": "EQUAL", "target": "CREATE",
                    "create_revision": 0},
                   *({"key": _b64(k), "result": "EQUAL", "target": "MOD", "mod_revision": r}
                     for k, r in unchanged)]
        return self._txn(compare, self._puts(key, value, lease, also))

    def swap(self, key: str, revision: int, value: bytes, lease: int = 0,
             also: tuple[tuple[str, bytes], ...] = ()) -> bool:
        return self._txn([{"key": _b64(key), "result": "EQUAL", "target": "MOD",
                           "mod_revision": revision}], self._puts(key, value, lease, also))

    def put_if(self, key: str, value: bytes,
               unchanged: tuple[tuple[str, int], ...]) -> bool:
        compare = [{"key": _b64(k), "result": "EQUAL", "target": "MOD", "mod_revision": r}
                   for k, r in unchanged]
        return self._txn(compare, self._puts(key, value, 0, ()))

    def delete_if(self, key: str, revision: int) -> bool:
        reply = self._call("/kv/txn", {
            "compare": [{"key": _b64(key), "result": "EQUAL", "target": "MOD",
                         "mod_revision": revision}],
            "success": [{"request_delete_range": {"key": _b64(key)}}], "failure": []})
        return bool(reply.get("succeeded", False))

    def increment(self, key: str) -> int:
        while True:
            current = self.get(key)
            if current is None:
                if self.create(key, b"1"):
                    return 1
                continue
            value = int(current.value.decode() or 0) + 1
            if self.swap(key, current.mod_revision, str(value).encode()):
                return value

    # -- watch ---------------------------------------------------------------------------------

    def watch_prefix(self, prefix: str, on_event: Callable[[WatchEvent], None]
                     ) -> Callable[[], None]:
        stop = threading.Event()
        cancels: list[Callable[[], None]] = []

        def run() -> None:
            while not stop.is_set():
                client = self._clients[self._current]
                try:
                    events, cancel = client.watch_prefix(prefix)
                    cancels.append(cancel)
                    on_event(WatchEvent(prefix, None))  # anything missed meanwhile: read again
                    for event in events:
                        if stop.is_set():
                            break
                        kv: Any = event.get("kv") or {}  # etcd3gw has decoded its base64
                        deleted = event.get("type") == "DELETE"
                        on_event(WatchEvent(_text(kv.get("key")),
                                            None if deleted else _raw(kv.get("value"))))
                except Exception as exc:  # a member gone: watch through the next one
                    log.debug("etcd watch of %s ended: %s", prefix, exc)
                    with self._lock:
                        self._current = (self._current + 1) % len(self._clients)
                    stop.wait(self.timeout)

        thread = threading.Thread(target=run, daemon=True, name=f"etcd-watch {prefix}")
        thread.start()

        def cancel_all() -> None:
            stop.set()
            for cancel in cancels:
                try:
                    cancel()
                except Exception as exc:
                    log.debug("cancelling an etcd watch: %s", exc)

        return cancel_all

    def close(self) -> None:
        for client in self._clients:
            session = getattr(client, "session", None)
            if session is not None:
                session.close()

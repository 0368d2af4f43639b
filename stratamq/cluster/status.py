"""What etcd says about a cluster, one object per broker group (``stratamq cluster status``),
and a planned switch of a group's master (``stratamq cluster elect``).

The shape of a group is a contract (issue 28)::

    {"cluster", "brokerName", "masterBrokerId", "masterEpoch", "syncStateSet": [ids],
     "brokers": [{"brokerId", "endpoint", "role", "maxOffset", "leaseAgeMs"}]}

``masterBrokerId`` and ``masterEpoch`` are null while a group has no master; ``leaseAgeMs``
is how long ago the broker last renewed its lease (etcd's granted TTL less its remaining
TTL, so whole seconds). Read from etcd directly (``--etcd``) or through any broker of the
cluster (``--endpoint``: the broker reads its etcd).
"""

from __future__ import annotations

import json
import time
from typing import Any

from stratamq.cluster.coordination import Coordination
from stratamq.cluster.member import group_keys

__all__ = ["ElectError", "group_status", "request_election"]


class ElectError(ValueError):
    """A planned switch that cannot happen (the message says why)."""


def _json(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def group_status(coord: Coordination, prefix: str, cluster: str) -> list[dict[str, Any]]:
    """Every group of the cluster under ``prefix``, sorted by name."""
    brokers: dict[str, list[tuple[dict[str, Any], int]]] = {}
    for kv in coord.get_prefix(f"{prefix}/brokers/"):
        group = kv.key[len(f"{prefix}/brokers/"):].rpartition("/")[0]
        brokers.setdefault(group, []).append((_json(kv.value), kv.lease))
    groups: dict[str, dict[str, dict[str, Any]]] = {}
    for kv in coord.get_prefix(f"{prefix}/groups/"):
        group, _, name = kv.key[len(f"{prefix}/groups/"):].rpartition("/")
        groups.setdefault(group, {})[name] = _json(kv.value)
    out = []
    for name in sorted(set(brokers) | set(groups)):
        keys = groups.get(name, {})
        master, sss = keys.get("master") or {}, keys.get("syncStateSet") or {}
        members = []
        for reg, lease in sorted(brokers.get(name, []),
                                 key=lambda r: int(r[0].get("brokerId", -1))):
            members.append({"brokerId": reg.get("brokerId"), "endpoint": reg.get("endpoint"),
                            "role": reg.get("role"), "maxOffset": reg.get("maxOffset"),
                            "leaseAgeMs": coord.lease_age_ms(lease) if lease else None})
        out.append({"cluster": cluster, "brokerName": name,
                    "masterBrokerId": master.get("brokerId"),
                    "masterEpoch": master.get("epoch"),
                    "syncStateSet": sorted(sss.get("brokerIds") or []),
                    "brokers": members})
    return out


def request_election(coord: Coordination, prefix: str, cluster: str, group: str,
                     broker_id: int | None, timeout_s: float = 30.0) -> dict[str, Any]:
    """RocketMQ's ``electMaster``: make ``broker_id`` the master of ``group`` (None: let the
    policy choose; a live master then stays, as ``DefaultElectPolicy`` keeps it). Returns the
    group's status once the switch is done; ElectError when it cannot be or did not happen."""
    def current() -> dict[str, Any]:
        for g in group_status(coord, prefix, cluster):
            if g["brokerName"] == group:
                return g
        raise ElectError(f"no broker group {group!r} in cluster {cluster!r} (etcd prefix "
                         f"{prefix})")

    status = current()
    if broker_id is None or status["masterBrokerId"] == broker_id:
        return status
    live = {b["brokerId"] for b in status["brokers"]}
    if broker_id not in live:
        raise ElectError(f"broker {broker_id} of {group} is not alive (registered: "
                         f"{sorted(live)})")
    if status["masterBrokerId"] is not None and broker_id not in status["syncStateSet"]:
        raise ElectError(f"broker {broker_id} is not in {group}'s SyncStateSet "
                         f"{status['syncStateSet']}: it may lack acknowledged messages")
    coord.put(group_keys(prefix, group)["elect"], json.dumps({"brokerId": broker_id}).encode())
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = current()
        if status["masterBrokerId"] == broker_id:
            return status
        time.sleep(0.2)
    raise ElectError(f"broker {broker_id} did not become master of {group} within "
                     f"{timeout_s:g} s (status: {json.dumps(status)})")

"""`bench/cluster.py --quick` runs its throughput and scale parts end to end (real etcd members,
real broker processes) and prints the JSON lines the docs quote. No timing thresholds: the
figures are this machine's; only their presence and consistency are checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quick_throughput_and_scale_print_both_numbers_and_etcd_counts(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "cluster.py"), "--quick",
                           "--only", "throughput,scale"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines()]

    rounds = [x for x in lines if x.get("part") == "throughput"]
    assert {x["mode"] for x in rounds} == {"controller", "standalone"}
    assert all(x["messages"] > 0 for x in rounds)
    [throughput] = [x for x in lines if x.get("summary") == "throughput"]
    # Refused sends (a master fenced on a starved machine) are counted, never hidden.
    for mode in ("controller", "standalone"):
        assert throughput[f"{mode}FailedRpcs"] == sum(
            x["failed_rpcs"] for x in rounds if x["mode"] == mode)
    assert throughput["controllerMsgsPerS"] > 0 and throughput["standaloneMsgsPerS"] > 0
    assert throughput["ratio"] == round(
        throughput["controllerMsgsPerS"] / throughput["standaloneMsgsPerS"], 3)

    [scale] = [x for x in lines if x.get("part") == "scale"]
    assert scale["groups"] == 2 and scale["brokers"] == 4 and scale["etcdMembers"] == 3
    # Counted by etcd itself: every live broker renews its lease (it reads its group only on a
    # watched change and every sixth pass, which a short window may not see).
    assert scale["etcdRequestsPerBrokerPerS"] > 0
    assert "LeaseKeepAlive" in scale["byMethod"]
    assert scale["clientCountedPerBrokerPerS"] > 0
    [summary] = [x for x in lines if x.get("summary") == "scale"]
    assert summary["groups"] == [2]
    # Nothing the bench started outlives it: its temporary directory is gone.
    assert not list(tmp_path.glob("stratamq-bench-cluster-*"))

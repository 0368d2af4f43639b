"""A compaction store in a process of its own, for the crash tests to kill.

    python compaction_proc.py round ROOT NOW_MS   one round of every queue (sealing first), then
                                                  print the queue read from its start, as JSON
    python compaction_proc.py put ROOT SEED       put forever (keys of a small set, some
                                                  tombstones), printing each acknowledged put
                                                  as a JSON line, with the flush thread running

``STRATAMQ_COMPACTION_KILL_AT`` (see stratamq/compaction/swap.py) makes a round kill the process
at that step.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from compaction_util import close, compact, open_store, put, read_from, small_config  # noqa: E402


def rows(store) -> list[list]:
    return [[m.queue_offset, m.properties.get("KEYS"), m.body.decode()] for m in read_from(store)]


def main() -> None:
    command, root = sys.argv[1], Path(sys.argv[2])
    cfg = small_config(root, flush_interval_consume_queue=20)
    if command == "round":
        store, comp = open_store(cfg)
        compact(store, comp, now_ms=int(sys.argv[3]))
        print(json.dumps(rows(store)), flush=True)
        close(store, comp)
    elif command == "put":
        rng = random.Random(int(sys.argv[3]))
        store, comp = open_store(cfg, start=True)
        i = 0
        while True:
            key = f"k{rng.randrange(40)}"
            value = b"" if rng.random() < 0.1 else b"v%d" % i
            offset = put(store, key, value)
            print(json.dumps([offset, key, value.decode()]), flush=True)
            i += 1
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main()

"""A tiered compaction store in a process of its own, for test_compaction_tier.py to kill.

    python compaction_tier_proc.py round ROOT TIER NOW_MS   one round of every queue (sealing
                                                            first) and its upload to the tier

``STRATAMQ_COMPACTION_KILL_AT`` (stratamq/compaction/swap.py) makes the process SIGKILL itself
at that step (``tier-files-uploaded``, ``tier-manifest-written``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_compaction_tier import open_tiered, tier_settings  # noqa: E402


def main() -> None:
    command, root, tier_dir, now = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    if command != "round":
        raise SystemExit(f"unknown command {command!r}")
    parts = open_tiered(root, tier_settings("posix", tier_dir))
    parts.compact(now)
    parts.close()
    print("done", flush=True)


if __name__ == "__main__":
    main()

"""The ``stratamq`` command line: one module per command group, attached to ``main``.

Output shapes here are contracts: ``store dump`` prints one JSON object per message,
``store verify`` one JSON summary (exit 1 on any inconsistency), ``bench ...`` one JSON line.
Adding a command group is one import line below.
"""

from stratamq.cli import bench, demo, store  # noqa: F401  (they attach to main)
from stratamq.cli.app import main

__all__ = ["main"]

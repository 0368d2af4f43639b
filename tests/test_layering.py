"""The store is the middle: replication, tiering, compaction, the broker, Spark and the CLI plug
into its seams, and it imports none of them (nor the record codec's users import the store)."""

from __future__ import annotations

import ast
from pathlib import Path

import stratamq

PACKAGE = Path(stratamq.__file__).parent
OUTSIDE_THE_STORE = ("stratamq.broker", "stratamq.ha", "stratamq.tiered", "stratamq.compaction",
                     "stratamq.spark", "stratamq.cli", "stratamq.client", "stratamq.benchmarks")


def imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_the_store_imports_none_of_the_parts_that_plug_into_it():
    leaves = [PACKAGE / "message.py", PACKAGE / "config.py", PACKAGE / "config_file.py",
              PACKAGE / "names.py", PACKAGE / "fileutil.py", *sorted((PACKAGE / "store").rglob(
                  "*.py"))]
    offending = {str(p.relative_to(PACKAGE)): sorted(
        m for m in imports_of(p) if m.startswith(OUTSIDE_THE_STORE)) for p in leaves}
    assert {k: v for k, v in offending.items() if v} == {}

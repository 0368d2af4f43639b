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


def test_the_broker_and_the_cli_load_no_spark_and_say_how_to_get_it():
    """PySpark, pyarrow and pandas are the ``spark`` extra: the broker, the store and the CLI
    load none of them, and a Spark command without them says how to install them."""
    import subprocess
    import sys

    loaded = subprocess.run([sys.executable, "-c", (
        "import sys, stratamq.cli, stratamq.broker.server, stratamq.store.message_store\n"
        "print(sorted(m for m in ('pyspark', 'pyarrow', 'pandas') if m in sys.modules))")],
        capture_output=True, text=True, timeout=60)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "[]", loaded.stderr
    # The same interpreter with PySpark made unimportable, as on a broker-only install.
    hidden = subprocess.run([sys.executable, "-c", (
        "import importlib.abc, sys\n"
        "class Hide(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('pyspark', 'pyarrow'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "from stratamq.cli import main\n"
        "main(['spark', 'export', '--store', 'x', '--out', 'y'])")],
        capture_output=True, text=True, timeout=60)
    assert hidden.returncode == 1, hidden.stderr
    assert "pip install 'stratamq[spark]'" in hidden.stderr


def test_the_transaction_engine_is_free_of_any_client_protocol():
    """``stratamq/transactions`` serves the gRPC adapter and, later, the 4.x remoting protocol:
    it imports neither the broker nor gRPC nor the protocol's generated modules."""
    outside = ("stratamq.broker", "stratamq.cli", "stratamq.client", "grpc", "rocketmq",
               "google.protobuf")
    offending = {str(p.relative_to(PACKAGE)): sorted(
        m for m in imports_of(p) if m.startswith(outside))
        for p in sorted((PACKAGE / "transactions").rglob("*.py"))}
    assert {k: v for k, v in offending.items() if v} == {}


def test_no_handler_imports_the_broker_back():
    """The admin, compaction-topic and replication handlers get the narrow parts they use
    (``AdminParts``, ``ReplicationParts``), never the ``Broker``: none imports server.py."""
    handlers = [PACKAGE / "broker" / name for name in (
        "admin.py", "compaction_topics.py", "replication.py", "transactions.py")]
    handlers += sorted((PACKAGE / "remoting").glob("*.py"))
    assert {str(p.relative_to(PACKAGE)) for p in handlers
            if "stratamq.broker.server" in imports_of(p)} == set()

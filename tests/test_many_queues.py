"""More ConsumeQueues than the process may open files: the store keeps serving.

Each test runs in a subprocess whose open-file limit is lowered to 256, then writes to three
times as many queues: without a bound on mapped ConsumeQueue files the dispatcher died there
with EMFILE and acknowledged messages became unreadable."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import textwrap

LIMIT = 256
QUEUES = 3 * LIMIT


def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          capture_output=True, text=True, timeout=600, preexec_fn=_limited)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stratamq.cli", *args], capture_output=True,
                          text=True, timeout=600, preexec_fn=_limited)


WRITE_AND_READ = """
    import json, resource, sys
    from stratamq.config import StoreConfig
    from stratamq.message import Message
    from stratamq.store.map_budget import budget
    from stratamq.store.message_store import MessageStore

    root, queues, write = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "write"
    assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == LIMIT_VALUE
    cfg = StoreConfig(store_path_root_dir=root, mapped_file_size_commit_log=1 << 20,
                      mapped_file_size_consume_queue=20 * 2, store_type=sys.argv[4])
    with MessageStore(cfg) as s:
        if write:
            for round_ in range(3):  # 3 units a queue, 2 a file: 2 files a queue
                batch = [Message("Many", b"%d-%d" % (q, round_), queue_id=q)
                         for q in range(queues)]
                assert s.put_messages(batch).ok
            s.wait_dispatched()
        bad = []
        for q in range(queues):
            got = s.get_messages("G", "Many", q, 0, max_count=10)
            with got:
                bodies = [m.body for m in got.messages()]
            if bodies != [b"%d-%d" % (q, r) for r in range(3)]:
                bad.append((q, bodies))
        print(json.dumps({"bad": bad[:5], "bad_count": len(bad), "mapped": len(budget),
                          "limit": budget.limit}))
""".replace("LIMIT_VALUE", str(LIMIT))


def test_more_queues_than_open_files_are_written_read_and_recovered(tmp_path):
    root = str(tmp_path / "store")
    done = _run(WRITE_AND_READ, root, str(QUEUES), "write", "default")
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["bad_count"] == 0, report
    assert report["mapped"] <= report["limit"] <= LIMIT
    again = _run(WRITE_AND_READ, root, str(QUEUES), "read", "default")  # a restart
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout)["bad_count"] == 0
    verified = _cli("store", "verify", "--store", root)
    assert verified.returncode == 0, verified.stdout[-2000:] + verified.stderr[-2000:]
    summary = json.loads(verified.stdout)
    assert summary["ok"] and summary["queues"] == QUEUES and summary["units"] == 3 * QUEUES
    migrated = _cli("store", "migrate-cq", "--store", root, "--to", "rocksdb")
    assert migrated.returncode == 0, migrated.stdout[-2000:] + migrated.stderr[-2000:]
    assert json.loads(migrated.stdout)["ok"]
    on_rocksdb = _run(WRITE_AND_READ, root, str(QUEUES), "read", "defaultRocksDB")
    assert on_rocksdb.returncode == 0, on_rocksdb.stderr[-3000:]
    assert json.loads(on_rocksdb.stdout)["bad_count"] == 0

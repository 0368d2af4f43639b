"""The export pipeline as an ordinary PySpark application under ``spark-submit``, on a cluster.

``local-cluster[2,1,1024]`` starts a real standalone Master and two Workers, each launching its
own executor JVM with its own Python workers: nothing is shared with the driver's process, so
the data source's partitions, options and code must travel the way they do on any cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds
from conftest import REFERENCE_MESSAGES, reference_body

from stratamq.spark import export

SPARK_SUBMIT = Path(sys.executable).with_name("spark-submit")


def test_export_runs_unchanged_under_spark_submit_on_a_cluster(reference_store, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("PYSPARK_DRIVER_PYTHON", None)  # spark-submit runs the app with PYSPARK_PYTHON
    done = subprocess.run(
        [str(SPARK_SUBMIT), "--master", "local-cluster[2,1,1024]",
         "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.session.timeZone=UTC",
         export.__file__, "--store", str(reference_store), "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # spark-submit merges the app's stderr (progress, Spark's log) into its stdout: the
    # progress is whole lines, and the JSON summary still has a line of its own.
    lines = done.stdout.splitlines()
    summary = json.loads([line for line in lines if line.startswith("{\"exported\": ")][-1])
    assert summary["exported"] == REFERENCE_MESSAGES
    # Progress with the total, known up front, and no JVM class names in Spark's lines once
    # the application runs.
    total = f"{REFERENCE_MESSAGES:,}"
    assert f"export {total} of {total} rows (100%" in "\n".join(lines)
    started = next(i for i, line in enumerate(lines) if line.startswith("export "))
    assert not [line for line in lines[started:] if "org.apache." in line]

    table = ds.dataset(out, format="parquet", partitioning="hive").to_table(
        columns=["topic", "queue_id", "queue_offset", "body"])
    assert table.num_rows == REFERENCE_MESSAGES
    rows = {(t, q, o): b for t, q, o, b in zip(*(table.column(c).to_pylist() for c in
                                                 ("topic", "queue_id", "queue_offset", "body")))}
    for i in range(REFERENCE_MESSAGES):  # the reference README's placement of message i
        assert rows[(f"BenchTopic{i % 4}", (i // 4) % 4, i // 16)] == reference_body(i)


def _submit(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
           "STRATAMQ_PROGRESS_EVERY_S": "0"}
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    return subprocess.run(
        [str(SPARK_SUBMIT), "--master", "local-cluster[2,1,1024]",
         "--conf", "spark.ui.enabled=false", *args],
        env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)


def test_rebuild_under_spark_submit_equals_what_rocketmq_wrote(reference_copy, reference_store,
                                                                tmp_path):
    """The reference store's ConsumeQueues and index deleted, then rebuilt on a two-executor
    cluster: every file is byte for byte the one Apache RocketMQ's own dispatcher wrote (its
    ConsumeQueue files of 1,000 units come from broker.conf, as on the broker)."""
    from stratamq.spark.pipelines import rebuild

    shutil.rmtree(reference_copy / "consumequeue")
    shutil.rmtree(reference_copy / "index")
    conf = tmp_path / "broker.conf"
    conf.write_text("mappedFileSizeConsumeQueue=20000\n")
    done = _submit([rebuild.__file__, "--store", str(reference_copy), "--what", "all",
                    "--config", str(conf)], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # spark-submit passes the application's stdout and stderr on as its stdout.
    lines = done.stdout.splitlines()
    summary = json.loads([line for line in lines if line.startswith("{\"ok\": ")][-1])
    assert summary["records"] == REFERENCE_MESSAGES
    assert summary["index_entries"] == 2 * REFERENCE_MESSAGES  # UNIQ_KEY and KEYS each
    # A line per stage with rows and bytes against the total known up front; no JVM class.
    assert "rebuild read: done, 20,000 rows, 25.0 MB" in "\n".join(lines)
    for stage in ("write consumequeue", "write index"):
        assert any(line.startswith(f"rebuild {stage}: done, ") for line in lines), stage
    started = next(i for i, line in enumerate(lines) if line.startswith("rebuild "))
    assert not [line for line in lines[started:] if "org.apache." in line]

    def files(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
                if p.is_file()}

    assert files(reference_copy / "consumequeue") == files(reference_store / "consumequeue")
    [ours] = (reference_copy / "index").iterdir()
    [theirs] = (reference_store / "index").iterdir()
    assert ours.read_bytes() == theirs.read_bytes()


def test_offload_under_spark_submit_then_served_from_the_tier(reference_store, tmp_path):
    """The reference store offloaded by a two-executor cluster; a store with that tier and
    nothing local serves every queue whole."""
    from stratamq import tiered
    from stratamq.config import StoreConfig
    from stratamq.spark.pipelines import offload
    from stratamq.store.message_store import MessageStore

    tier = tmp_path / "tier"
    done = _submit([offload.__file__, "--store", str(reference_store), "--tier", str(tier),
                    "--partition-mb", "4"], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    summary = json.loads([line for line in lines if line.startswith("{\"ok\": ")][-1])
    assert summary["messages"] == REFERENCE_MESSAGES and not summary["noop"]
    for stage in ("read", "write", "index"):
        assert any(line.startswith(f"offload {stage}: done, ") for line in lines), stage
    started = next(i for i, line in enumerate(lines) if line.startswith("offload "))
    assert not [line for line in lines[started:] if "org.apache." in line]

    config = StoreConfig(store_path_root_dir=str(tmp_path / "empty"),
                         tiered_backend_service_provider="posix",
                         tiered_store_file_path=str(tier))
    store = MessageStore(config)
    tier_store = tiered.wire(store, cluster="DefaultCluster", broker="broker-a",
                             background=False)
    store.open()
    try:
        for i in range(0, REFERENCE_MESSAGES, 1999):  # REFERENCE.md's placement of message i
            topic, queue_id, offset = f"BenchTopic{i % 4}", (i // 4) % 4, i // 16
            with store.get_messages("g", topic, queue_id, offset, 1) as got:
                [msg] = list(got.messages())
            assert bytes(msg.body) == reference_body(i)
        assert sum(store.get_max_offset_in_queue(f"BenchTopic{t}", q)
                   for t in range(4) for q in range(4)) == REFERENCE_MESSAGES
    finally:
        store.close()
        tier_store.close()


def test_compact_under_spark_submit(tmp_path):
    """A compaction topic compacted by a two-executor cluster: the latest value per key."""
    from compaction_util import TOPIC, as_table, put, read_from, small_config
    from test_spark_compact import _open, _write_topics

    from stratamq.spark.pipelines import compact

    root = tmp_path / "store"
    _write_topics(root)
    store, compaction = _open(root)
    try:
        for i in range(900):
            put(store, f"k{i % 50}", b"v%d" % i, i % 2)
        assert store.wait_dispatched()
    finally:
        store.close()
        compaction.close()
    conf = tmp_path / "broker.conf"
    cfg = small_config(root)
    conf.write_text(f"mappedFileSizeCommitLog={cfg.mapped_file_size_commit_log}\n"
                    f"maxMessageSize={cfg.max_message_size}\n"
                    f"compactionMappedFileSize={cfg.compaction_mapped_file_size}\n"
                    f"compactionCqMappedFileSize={cfg.compaction_cq_mapped_file_size}\n")
    done = _submit([compact.__file__, "--store", str(root), "--topic", TOPIC, "--config",
                    str(conf)], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    summary = json.loads([line for line in lines if line.startswith("{\"ok\": ")][-1])
    assert summary["removed"] > 700 and len(summary["queues"]) == 2
    for stage in ("reduce", "rewrite"):
        assert any(line.startswith(f"compact {stage}: done, ") for line in lines), stage
    store, compaction = _open(root)
    try:
        for q in (0, 1):
            messages = read_from(store, 0, q)
            assert as_table(messages) == {f"k{k}": b"v%d" % max(
                i for i in range(900) if i % 50 == k) for k in range(q, 50, 2)}
            assert len(messages) < 60  # the superseded values are gone
    finally:
        store.close()
        compaction.close()

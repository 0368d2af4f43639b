"""The Spark source reads no half message: not with every topic, not with a pattern that
matches the half topic's name; a committed one is read once, from its real topic."""

from __future__ import annotations

from conftest_spark import spark_session  # noqa: F401  (the shared `spark` fixture)

from stratamq.config import StoreConfig
from stratamq.message import Host, Message, Prop
from stratamq.store.message_store import MessageStore
from stratamq.transactions.messages import (
    HALF_TOPIC,
    committed_message,
    half_message,
    op_message,
)


def test_spark_reads_no_half_message(spark, tmp_path):
    root = tmp_path / "store"
    cfg = StoreConfig(store_path_root_dir=str(root), mapped_file_size_commit_log=16 * 1024,
                      mapped_file_size_consume_queue=50 * 20)
    with MessageStore(cfg).open() as s:
        assert s.put_message(Message("Tx", b"plain", 0, {Prop.UNIQ_KEY: "p"})).ok
        assert s.put_message(half_message(Message("Tx", b"half-open", 0,
                                                  {Prop.UNIQ_KEY: "o"}), "Tx")).ok
        done = s.put_message(half_message(Message("Tx", b"half-committed", 0,
                                                  {Prop.UNIQ_KEY: "c"}), "Tx"))
        s.wait_dispatched()
        assert s.put_message(committed_message(s.look_message_by_offset(done.physical_offset))).ok
        assert s.put_message(op_message([done.queue_offset], Host("127.0.0.1", 0))).ok
        s.wait_dispatched()
    for reader in (spark.read.format("stratamq"),
                   spark.read.format("stratamq").option("topics", ".*")):
        rows = reader.load(str(root)).select("topic", "body").collect()
        assert HALF_TOPIC not in {r.topic for r in rows}
        bodies = [bytes(r.body) for r in rows if r.topic == "Tx"]
        assert sorted(bodies) == [b"half-committed", b"plain"]

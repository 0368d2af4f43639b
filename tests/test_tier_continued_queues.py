"""A queue whose history is only in the tier continues after it.

A broker that lost its local files (a replaced disk), or that adopted a retired broker's
offloaded history, has empty local ConsumeQueues but a tier that holds queue offsets 0..N-1.
Its next message must get offset N: offset 0 again would hide the first message of the history
from every consumer and give two messages one offset. Likewise its CommitLog starts past the
history's CommitLog offsets, so an offset message id names one message, old or new."""

from __future__ import annotations

import shutil

from test_tier_store import TOPIC, fill, open_tiered, read_all, tier_config

from stratamq import record as codec
from stratamq.message import Message


def test_new_messages_follow_the_history_only_the_tier_holds(tmp_path):
    config = tier_config(tmp_path)
    store, tier = open_tiered(config)
    try:
        fill(store, 300)
        history = {q: read_all(store, q) for q in (0, 1)}
        assert tier.flush(60)
    finally:
        store.close()
        tier.close()
    for lost in ("commitlog", "consumequeue", "index"):  # the local disk is gone; config stays
        shutil.rmtree(config.root / lost)

    store, tier = open_tiered(config)
    try:
        assert read_all(store, 0) == history[0]  # served by the tier
        result = store.put_message(Message(TOPIC, b"after the history", 0))
        assert result.ok and result.queue_offset == 150
        assert store.wait_dispatched()
        after = read_all(store, 0)
        assert {k: v for k, v in after.items() if k < 150} == history[0]
        assert codec.decode(after[150]).body == b"after the history"
        history_end = max(codec.decode(r).physical_offset + len(r)
                          for q in (0, 1) for r in history[q].values())
        assert result.messages[0].physical_offset >= history_end
        first = codec.decode(history[0][0])
        assert store.look_message_by_msg_id(first.msg_id).body == first.body
        assert store.look_message_by_msg_id(result.messages[0].msg_id).body == (
            b"after the history")
        assert store.get_max_offset_in_queue(TOPIC, 0) == 151
        assert store.get_min_offset_in_queue(TOPIC, 0) == 0
    finally:
        store.close()
        tier.close()
    store, tier = open_tiered(config)  # and after a restart, from the local queue it started
    try:
        result = store.put_message(Message(TOPIC, b"one more", 0))
        assert result.ok and result.queue_offset == 151
    finally:
        store.close()
        tier.close()

"""``stratamq store query`` and ``stratamq store offset-by-time``: lookups through the index
and the ConsumeQueues. Both open the store read-only, so a RocketMQ directory is not changed.
"""

from __future__ import annotations

import click

from stratamq.cli.common import emit, message_json, open_store, store_type_option
from stratamq.cli.store import store


@store.command("query")
@click.option("--store", "store_dir", required=True, help="Store root directory.")
@store_type_option
@click.option("--topic", default=None, help="Topic the key belongs to (needed with --key).")
@click.option("--key", default=None, help="A message key (a word of KEYS) or unique id.")
@click.option("--msg-id", default=None, help="A unique client id or an offset message id.")
@click.option("--begin", type=int, default=0, show_default=True,
              help="Earliest store time, ms since the epoch.")
@click.option("--end", type=int, default=None, help="Latest store time, ms (default: now on).")
@click.option("--max", "max_num", type=click.IntRange(min=1), default=64, show_default=True,
              help="At most this many messages (newest first).")
def store_query(store_dir: str, topic: str | None, key: str | None, msg_id: str | None,
                begin: int, end: int | None, max_num: int) -> None:
    """Print messages found by key or message id, as JSON lines in the dump shape."""
    if (key is None) == (msg_id is None):
        raise click.UsageError("give exactly one of --key (with --topic) or --msg-id")
    if key is not None and topic is None:
        raise click.UsageError("--key needs --topic (keys are indexed per topic)")
    if end is not None and end < begin:
        raise click.UsageError(f"--end {end} is before --begin {begin}")
    s = open_store(store_dir, read_only=True)
    try:
        if topic is not None and topic not in s.topics():
            raise click.ClickException(f"topic {topic!r} not found in {store_dir}")
        if s.index is None:
            raise click.ClickException("the index is disabled (messageIndexEnable=false)")
        if msg_id is not None:
            msg = s.look_message_by_msg_id(msg_id, topic)
            if msg is None:
                raise click.ClickException(f"no message with id {msg_id!r} in {store_dir}")
            emit(message_json(msg))
            return
        assert key is not None and topic is not None
        for msg in s.query_messages(topic, key, max_num, begin, end):
            emit(message_json(msg))
    finally:
        s.close()


@store.command("offset-by-time")
@click.option("--store", "store_dir", required=True, help="Store root directory.")
@store_type_option
@click.option("--topic", required=True, help="Topic.")
@click.option("--queue-id", type=int, required=True, help="Queue id.")
@click.option("--timestamp", type=int, required=True, help="Store time, ms since the epoch.")
def store_offset_by_time(store_dir: str, topic: str, queue_id: int, timestamp: int) -> None:
    """Print the first queue offset whose message was stored at or after --timestamp."""
    s = open_store(store_dir, read_only=True)
    try:
        queues = s.topics()
        if topic not in queues:
            raise click.ClickException(f"topic {topic!r} not found in {store_dir}")
        if queue_id not in queues[topic]:
            raise click.ClickException(
                f"topic {topic!r} has no queue {queue_id} (queues: {queues[topic]})"
            )
        offset = s.get_offset_in_queue_by_time(topic, queue_id, timestamp)
        min_offset = s.get_min_offset_in_queue(topic, queue_id)
        max_offset = s.get_max_offset_in_queue(topic, queue_id)
        store_ts = None
        if offset < max_offset:
            with s.get_messages("stratamq-cli", topic, queue_id, offset, max_count=1) as got:
                msgs = list(got.messages())
                store_ts = msgs[0].store_timestamp if msgs else None
        emit({
            "topic": topic,
            "queue_id": queue_id,
            "timestamp": timestamp,
            "offset": offset,
            "min_offset": min_offset,
            "max_offset": max_offset,
            "store_timestamp": store_ts,
        })
    finally:
        s.close()

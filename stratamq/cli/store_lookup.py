"""``stratamq store query`` and ``stratamq store offset-by-time``: lookups through the index
and the ConsumeQueues. Both open the store read-only, so a RocketMQ directory is not changed.

A lookup that cannot see everything says so on stderr: index files skipped as damaged, records
with keys that no index file covers (files removed), and index entries that lead to a corrupt
record, which is named by its CommitLog offset rather than reported as "not found".
"""

from __future__ import annotations

import struct

import click

from stratamq.cli.common import (
    TIME,
    close_store,
    emit,
    message_json,
    open_store,
    output_option,
    store_options,
    warn,
)
from stratamq.cli.store import store
from stratamq.record import parse_offset_msg_id
from stratamq.store.inspect import IndexGap, index_gaps, record_problem_at
from stratamq.store.message_store import MessageStore

NO_END = 2**63 - 1


def _index_warnings(s: MessageStore, store_dir: str, begin: int, end: int) -> list[str]:
    """Why the index may miss messages stored in [begin, end] (ms)."""
    assert s.index is not None
    out = [f"index file {name} is skipped: {why}" for name, why in s.index.dropped]

    def overlaps(gap: IndexGap) -> bool:
        return gap.first_timestamp <= end and (gap.until_timestamp is None
                                               or gap.until_timestamp >= begin)

    for gap in index_gaps(s.parts(), first_only=True):
        if not overlaps(gap):
            continue
        until = ("to the end of the log" if gap.until_timestamp is None else
                 f"until index coverage resumes (records stored from {gap.until_timestamp})")
        out.append(f"no index file covers the CommitLog's records with keys from offset "
                   f"{gap.first} (stored at {gap.first_timestamp}) {until}: their keys and ids "
                   f"cannot be found. Run `stratamq store verify --store {store_dir}` to "
                   f"rebuild the index")
    return out


def _offset_id_problem(s: MessageStore, msg_id: str) -> str | None:
    """If ``msg_id`` is an offset message id of this store, why its record cannot be read."""
    try:
        host, phys = parse_offset_msg_id(msg_id)
    except ValueError:
        return None
    try:
        first = s.look_message_by_offset(s.min_physical_offset)
    except (ValueError, struct.error):  # the log's first record is damaged: no host to match
        first = None
    # A unique client id has the same form: only trust it as an offset id of this store.
    if first is None or first.store_host != host:
        return None
    return record_problem_at(s.parts(), phys)


def _corrupt_hits(s: MessageStore, topics: list[str], key: str, begin: int, end: int,
                  found: set[int]) -> list[str]:
    """Problems of the records the index points at for ``key`` that the lookup did not return
    (hash collisions with intact records of other keys are not problems)."""
    assert s.index is not None
    out = []
    for topic in topics:
        for phys in s.index.query_offsets(topic, key, max(0, begin - 1000), end):
            if phys in found:
                continue
            found.add(phys)
            problem = record_problem_at(s.parts(), phys, known_start=True)
            if problem is not None:
                out.append(f"an index entry for {key!r} in topic {topic!r} points at CommitLog "
                           f"offset {phys}: {problem}")
    return out


@store.command("query")
@click.option("--store", "store_dir", required=True, help="Store root directory.")
@store_options
@click.option("--topic", default=None, help="Topic the key belongs to (needed with --key).")
@click.option("--key", default=None, help="A message key (a word of KEYS) or unique id.")
@click.option("--msg-id", default=None, help="A unique client id or an offset message id.")
@click.option("--begin", type=TIME, default=0, show_default=True,
              help="Earliest store time: epoch ms or ISO 8601.")
@click.option("--end", type=TIME, default=None,
              help="Latest store time: epoch ms or ISO 8601 (default: now on).")
@click.option("--max", "max_num", type=click.IntRange(min=1), default=64, show_default=True,
              help="At most this many messages (newest first).")
@output_option
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
                for text in _index_warnings(s, store_dir, 0, NO_END):
                    warn(text)
                msg_id = msg_id.strip()
                problems = [p for p in [_offset_id_problem(s, msg_id)] if p is not None]
                problems += _corrupt_hits(s, [topic] if topic is not None else list(s.topics()),
                                          msg_id, 0, NO_END, set())
                if problems:
                    raise click.ClickException(f"no readable message with id {msg_id!r}: "
                                               + "; ".join(problems))
                raise click.ClickException(f"no message with id {msg_id!r} in {store_dir}")
            emit(message_json(msg))
            return
        assert key is not None and topic is not None
        for text in _index_warnings(s, store_dir, begin, NO_END if end is None else end):
            warn(text)
        found = s.query_messages(topic, key, max_num, begin, end)
        for msg in found:
            emit(message_json(msg))
        problems = _corrupt_hits(s, [topic], key, begin, NO_END if end is None else end,
                                 {m.physical_offset for m in found})
    finally:
        close_store(s)
    if problems:
        if found:
            for text in problems:
                click.echo(f"error: {text}", err=True)
            raise click.ClickException(f"{len(problems)} records found for key {key!r} are "
                                       "corrupt (listed above); the readable ones were printed")
        raise click.ClickException(f"no readable message with key {key!r}: "
                                   + "; ".join(problems))


@store.command("offset-by-time")
@click.option("--store", "store_dir", required=True, help="Store root directory.")
@store_options
@click.option("--topic", required=True, help="Topic.")
@click.option("--queue-id", type=int, required=True, help="Queue id.")
@click.option("--timestamp", type=TIME, required=True,
              help="Store time: epoch ms or ISO 8601 (2026-11-23T10:00:00Z).")
@output_option(report=True)
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
        close_store(s)

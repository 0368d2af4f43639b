"""``stratamq demo``: write and read messages through an embedded store."""

from __future__ import annotations

import time
from pathlib import Path

import click

from stratamq.cli.app import main, os_error_text, prepare_store_dir
from stratamq.config import StoreConfig
from stratamq.message import Message, Prop
from stratamq.store.message_store import MessageStore, StoreLocked


@main.command()
@click.option("--store", "store_dir", default="./demo-data", show_default=True,
              help="Store directory for the demo (its own: not the broker's ./data).")
@click.option("--messages", type=click.IntRange(min=1), default=1000, show_default=True,
              help="How many messages to write and read back.")
def demo(store_dir: str, messages: int) -> None:
    """Write messages through an embedded store, read them back and say what happened."""
    prepare_store_dir(store_dir)
    config = StoreConfig(store_path_root_dir=store_dir)
    try:
        s = MessageStore(config).open()
    except StoreLocked as exc:
        raise click.ClickException(str(exc)) from None
    except (OSError, ValueError) as exc:  # a read-only mount, a file where a directory goes
        text = os_error_text(exc) if isinstance(exc, OSError) else str(exc)
        raise click.ClickException(f"cannot open store {store_dir}: {text}") from None
    with s:
        crashed = s.recovery is not None and s.recovery.abnormal
        click.echo(f"store {Path(store_dir).resolve()} opened "
                   f"({'after a crash' if crashed else 'clean'}; "
                   f"CommitLog {s.min_physical_offset}..{s.max_physical_offset})")
        topics = ["DemoOrders", "DemoPayments"]
        started = time.perf_counter()
        first_offsets: dict[tuple[str, int], int] = {}
        for i in range(messages):
            topic = topics[i % 2]
            queue_id = (i // 2) % 4
            msg = Message(topic, f"demo message {i} at {time.time():.3f}".encode(), queue_id,
                          properties={Prop.TAGS: "even" if i % 2 == 0 else "odd",
                                      Prop.KEYS: f"demo-{i}"},
                          born_timestamp=int(time.time() * 1000))
            put = s.put_message(msg)
            if not put.ok:
                raise click.ClickException(f"put failed: {put.status.value} {put.error}")
            first_offsets.setdefault((topic, queue_id), put.queue_offset)
        put_s = time.perf_counter() - started
        s.wait_dispatched()
        click.echo(f"put {messages} messages in {put_s * 1000:.1f} ms "
                   f"({messages / put_s:,.0f} msg/s)")
        read = 0
        for (topic, queue_id), first in sorted(first_offsets.items()):
            with s.get_messages("demo", topic, queue_id, first, max_count=messages) as got:
                msgs = list(got.messages())
            read += len(msgs)
            click.echo(f"  {topic}/{queue_id}: read {len(msgs)} from offset {first}; "
                       f"last: {msgs[-1].body.decode()!r} (msg id {msgs[-1].msg_id})")
        click.echo(f"read back {read} messages; queues now hold "
                   f"{sum(s.get_max_offset_in_queue(t, q) for t, q in first_offsets)} in total")
    click.echo("store closed cleanly (checkpoint written, abort marker removed)")

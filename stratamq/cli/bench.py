"""``stratamq bench ...``: benchmarks that print one JSON line."""

from __future__ import annotations

import click

from stratamq.cli.app import main, prepare_store_dir
from stratamq.cli.common import emit
from stratamq.config import StoreConfig


@main.group()
def bench() -> None:
    """Benchmarks that print one JSON line."""


@bench.command("store")
@click.option("--messages", type=click.IntRange(min=1), required=True,
              help="How many messages to put.")
@click.option("--body-size", type=click.IntRange(min=0), required=True,
              help="Bytes of each message body.")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True,
              help="Messages per put call.")
@click.option("--flush", type=click.Choice(["async", "sync"]), default="async", show_default=True,
              help="ASYNC_FLUSH or SYNC_FLUSH (group commit).")
@click.option("--store", "store_dir", default=None,
              help="Directory for the bench store (must be empty; default: a temp dir).")
def bench_store(messages: int, body_size: int, batch: int, flush: str,
                store_dir: str | None) -> None:
    """Put N messages (K per call), read them all back, print throughput."""
    from stratamq.benchmarks.store_bench import run_store_bench

    limit = StoreConfig().max_message_size  # the bench store runs with the defaults
    if body_size > limit:
        raise click.BadParameter(f"{body_size} bytes is more than maxMessageSize ({limit})",
                                 param_hint="'--body-size'")
    if store_dir is not None:
        prepare_store_dir(store_dir, fresh=True)
    try:
        result = run_store_bench(messages=messages, body_size=body_size, batch=batch,
                                 flush=flush, store_dir=store_dir)
    except (OSError, RuntimeError, ValueError) as exc:  # a put refused, a disk full, ...
        raise click.ClickException(f"bench failed: {exc}") from None
    emit(result)

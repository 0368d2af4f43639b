"""``stratamq bench ...``: benchmarks that print one JSON line."""

from __future__ import annotations

import click

from stratamq.cli.app import main
from stratamq.cli.common import emit


@main.group()
def bench() -> None:
    """Benchmarks that print one JSON line."""


@bench.command("store")
@click.option("--messages", type=click.IntRange(min=1), required=True)
@click.option("--body-size", type=click.IntRange(min=0), required=True)
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--flush", type=click.Choice(["async", "sync"]), default="async", show_default=True)
@click.option("--store", "store_dir", default=None, help="Directory for the bench store.")
def bench_store(messages: int, body_size: int, batch: int, flush: str,
                store_dir: str | None) -> None:
    """Put N messages (K per call), read them all back, print throughput."""
    from stratamq.benchmarks.store_bench import run_store_bench

    emit(run_store_bench(messages=messages, body_size=body_size, batch=batch, flush=flush,
                          store_dir=store_dir))

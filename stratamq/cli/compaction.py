"""``stratamq compaction run|status``: compaction topics (``cleanup.policy=COMPACTION``).

``run`` compacts every queue of the compaction topics (or of ``--topic``) once, now: the file
being written is sealed first, so the round covers everything written so far. It prints one
JSON object per queue: ``topic``, ``queue_id``, ``records_read``, ``kept``, ``removed``,
``tombstones_dropped``, ``bytes_before``, ``bytes_after`` (and the round's other figures;
``skipped`` says why a queue had nothing to do). ``status`` prints one JSON object per queue with
its files, bytes, offsets and last round. Either works on a store directory (``--store``, which
must not be open elsewhere for ``run``) or on a running broker (``--endpoint``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from stratamq.cli.admin import Connection, optional_endpoint_option
from stratamq.cli.app import main
from stratamq.cli.common import (
    close_store,
    compaction_of,
    config_option,
    emit_rows,
    open_store,
    output_option,
    warn,
)


@main.group()
def compaction() -> None:
    """Compaction topics: the latest value per key (cleanup.policy=COMPACTION)."""


def _where(store_dir: str | None, endpoint: Connection | None) -> None:
    if (store_dir is None) == (endpoint is None):
        raise click.UsageError("give exactly one of --store DIR or --endpoint HOST:PORT")


def _endpoint_call(endpoint: Connection, method: str, topic: str | None) -> list[dict[str, Any]]:
    from stratamq.client.admin import AdminClient, AdminError

    with AdminClient(endpoint) as client:
        try:
            reply = client.call(method, **({"topic": topic} if topic else {}))
        except AdminError as exc:
            raise click.ClickException(str(exc)) from None
    return list(reply.get("queues", []))


def where_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--store DIR`` or ``--endpoint HOST:PORT`` (with the ACL keys and TLS options of every
    admin command, ``cli/admin.py``: ``endpoint`` is then a ``Connection``), and ``--topic``."""
    command = click.option("--topic", default=None, help="Only this compaction topic.")(command)
    command = optional_endpoint_option("A running broker, HOST:PORT.")(command)
    command = click.option("--store", "store_dir", default=None,
                           help="Store root directory.")(command)
    return output_option(config_option(command))


def _offline(store_dir: str, *, read_only: bool) -> Any:
    s = open_store(store_dir, read_only=read_only)
    comp = compaction_of(s)
    if comp is None:
        close_store(s)
        raise click.ClickException(
            f"store {store_dir} has no compaction topic (no topic with cleanup.policy="
            "COMPACTION in config/topics.json, and no compaction/ directory)")
    return s, comp


@compaction.command("run")
@where_options
def compaction_run(store_dir: str | None, endpoint: Connection | None,
                   topic: str | None) -> None:
    """Compact every queue (of --topic) once, now, and print what each round did."""
    _where(store_dir, endpoint)
    if endpoint is not None:
        rows = _endpoint_call(endpoint, "CompactionRun", topic)
    else:
        assert store_dir is not None
        s, comp = _offline(store_dir, read_only=False)
        try:
            if topic is not None and comp.policies.policy(topic) is None and not comp.queues(
                    topic):
                raise click.ClickException(f"topic {topic!r} is not a compaction topic of "
                                           f"{store_dir} (cleanup.policy=COMPACTION)")
            rows = [r.to_json() for r in comp.run_now(topic)]
        finally:
            close_store(s)
    if not rows:
        warn("no compaction queue holds any message yet")
    emit_rows(rows)


@compaction.command("status")
@where_options
def compaction_status(store_dir: str | None, endpoint: Connection | None,
                      topic: str | None) -> None:
    """One line per compaction queue: files, bytes, offsets, cleaned-to and the last round."""
    _where(store_dir, endpoint)
    if endpoint is not None:
        rows = _endpoint_call(endpoint, "CompactionStatus", topic)
    else:
        assert store_dir is not None
        s, comp = _offline(store_dir, read_only=True)
        try:
            rows = [r for r in comp.status() if topic is None or r["topic"] == topic]
        finally:
            close_store(s)
    emit_rows(rows)

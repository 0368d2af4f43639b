"""``stratamq topic ...`` and ``stratamq group ...`` against a running broker (JSON output)."""

from __future__ import annotations

import click

from stratamq.cli.app import main
from stratamq.cli.common import emit

TYPES = click.Choice(["NORMAL", "FIFO", "DELAY", "TRANSACTION"], case_sensitive=False)
endpoint_option = click.option("--endpoint", required=True, help="Broker HOST:PORT.")


def _call(endpoint: str, method: str, **request: object) -> dict:
    from stratamq.client.admin import AdminClient, AdminError

    with AdminClient(endpoint) as client:
        try:
            return client.call(method, **request)
        except AdminError as exc:
            raise click.ClickException(str(exc)) from None


@main.group()
def topic() -> None:
    """Create, change, delete and list topics of a running broker."""


@topic.command("create")
@endpoint_option
@click.option("--topic", "name", required=True)
@click.option("--queues", type=int, default=8, show_default=True)
@click.option("--type", "mtype", type=TYPES, default="NORMAL", show_default=True)
def topic_create(endpoint: str, name: str, queues: int, mtype: str) -> None:
    """Create a topic; fails if it exists."""
    emit(_call(endpoint, "CreateTopic", topic=name, queues=queues, type=mtype.upper())["topic"])


@topic.command("update")
@endpoint_option
@click.option("--topic", "name", required=True)
@click.option("--queues", type=int, default=None)
@click.option("--type", "mtype", type=TYPES, default=None)
def topic_update(endpoint: str, name: str, queues: int | None, mtype: str | None) -> None:
    """Change a topic's queue count or message type."""
    emit(_call(endpoint, "UpdateTopic", topic=name, queues=queues,
               type=mtype.upper() if mtype else None)["topic"])


@topic.command("delete")
@endpoint_option
@click.option("--topic", "name", required=True)
def topic_delete(endpoint: str, name: str) -> None:
    """Delete a topic's metadata and consumer state (data goes with retention)."""
    emit(_call(endpoint, "DeleteTopic", topic=name))


@topic.command("list")
@endpoint_option
def topic_list(endpoint: str) -> None:
    """One JSON line per topic."""
    for t in _call(endpoint, "ListTopics")["topics"]:
        emit(t)


@main.group()
def group() -> None:
    """Consumer groups of a running broker and their progress."""


@group.command("create")
@endpoint_option
@click.option("--group", "name", required=True)
@click.option("--retry-max-times", type=int, default=None,
              help="Deliveries after the first before %DLQ% (default retryMaxTimes, 16).")
@click.option("--orderly/--no-orderly", default=False, help="Consume in FIFO order.")
def group_create(endpoint: str, name: str, retry_max_times: int | None, orderly: bool) -> None:
    emit(_call(endpoint, "CreateGroup", group=name, retry_max_times=retry_max_times,
               orderly=orderly)["group"])


@group.command("list")
@endpoint_option
def group_list(endpoint: str) -> None:
    """One JSON line per group."""
    for g in _call(endpoint, "ListGroups")["groups"]:
        emit(g)


@group.command("progress")
@endpoint_option
@click.option("--group", "name", required=True)
def group_progress(endpoint: str, name: str) -> None:
    """Per-queue max offset, consumed offset, in-flight count and lag, as one JSON object."""
    emit(_call(endpoint, "GroupProgress", group=name))

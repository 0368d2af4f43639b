"""``stratamq message send | consume | get``: a console producer and consumer, and a look at
one queue offset, against a running broker (JSON lines)."""

from __future__ import annotations

import base64
import sys
import time
from typing import Any

import click

from stratamq.cli.admin import Connection, endpoint_option
from stratamq.cli.app import main
from stratamq.cli.common import TIME, emit


@main.group()
def message() -> None:
    """Send, consume and look up messages on a running broker."""


def _client(conn: Connection) -> Any:
    from stratamq.client.messaging import MessagingClient

    return MessagingClient(conn)


def _fail(exc: Exception) -> click.ClickException:
    import grpc

    if isinstance(exc, grpc.RpcError) and exc.code() is grpc.StatusCode.UNAVAILABLE:
        return click.ClickException("no broker reachable")
    return click.ClickException(str(exc))


def message_row(m: Any) -> dict[str, Any]:
    """A received message as one JSON object; the body as text when it is UTF-8."""
    sp = m.system_properties
    row: dict[str, Any] = {
        "topic": m.topic.name, "queue_id": sp.queue_id, "queue_offset": sp.queue_offset,
        "message_id": sp.message_id, "tag": sp.tag or None, "keys": list(sp.keys),
        "properties": dict(m.user_properties),
        "born_timestamp": sp.born_timestamp.ToMilliseconds(),
        "store_timestamp": sp.store_timestamp.ToMilliseconds(),
        "delivery_attempt": sp.delivery_attempt or None,
    }
    try:
        row["body"] = bytes(m.body).decode("utf-8")
    except UnicodeDecodeError:
        row["body_b64"] = base64.b64encode(m.body).decode("ascii")
    return row


def _properties(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE, not {pair!r}",
                                     param_hint="--property")
        out[key] = value
    return out


@message.command("send")
@endpoint_option
@click.option("--topic", required=True, help="Topic to send to.")
@click.option("--body", default=None,
              help="The message body; without it, each line of standard input is a message.")
@click.option("--tag", default=None, help="Message tag.")
@click.option("--key", "keys", multiple=True, help="A message key (repeatable).")
@click.option("--property", "props", multiple=True, help="A user property KEY=VALUE.")
@click.option("--message-group", default=None, help="FIFO message group.")
@click.option("--deliver-at", type=TIME, default=None,
              help="DELAY topics: delivery time (epoch ms or ISO 8601).")
def message_send(endpoint: Connection, topic: str, body: str | None, tag: str | None,
                 keys: tuple[str, ...], props: tuple[str, ...], message_group: str | None,
                 deliver_at: int | None) -> None:
    """Send one message, or one per line of standard input (a console producer); prints the
    message id and queue offset of each."""
    properties = _properties(props)
    bodies = [body.encode()] if body is not None else (
        line.rstrip("\n").encode() for line in sys.stdin)
    with _client(endpoint) as client:
        for data in bodies:
            try:
                emit(client.send(topic, data, tag=tag, keys=keys, properties=properties,
                                 message_group=message_group, deliver_at_ms=deliver_at))
            except Exception as exc:
                raise _fail(exc) from None


@message.command("consume")
@endpoint_option
@click.option("--topic", required=True, help="Topic to consume.")
@click.option("--group", required=True, help="Consumer group (its progress is kept).")
@click.option("--max", "max_messages", type=click.IntRange(min=1), default=None,
              help="Stop after this many messages (default: until idle).")
@click.option("--idle", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="Stop when nothing arrived for this many seconds.")
@click.option("--tag", "tag_expression", default="*", show_default=True,
              help="Tag filter: * or TagA||TagB.")
@click.option("--no-ack", is_flag=True, default=False,
              help="Do not ack: the messages are delivered again after their invisible time.")
def message_consume(endpoint: Connection, topic: str, group: str, max_messages: int | None,
                    idle: float, tag_expression: str, no_ack: bool) -> None:
    """Receive (and ack) messages as JSON lines: a console consumer."""
    received = 0
    idle_until = time.monotonic() + idle
    with _client(endpoint) as client:
        while max_messages is None or received < max_messages:
            left = idle_until - time.monotonic()
            if left <= 0:
                break
            batch = min(32, (max_messages - received) if max_messages else 32)
            try:
                got = client.receive(group, topic, batch=batch, tag_expression=tag_expression,
                                     wait_ms=max(1, int(min(left, 20.0) * 1000)))
                for m in got:
                    emit(message_row(m))
                    if not no_ack:
                        client.ack(group, topic, m)
            except Exception as exc:
                raise _fail(exc) from None
            if got:
                received += len(got)
                idle_until = time.monotonic() + idle


@message.command("get")
@endpoint_option
@click.option("--topic", required=True, help="Topic.")
@click.option("--queue", "queue_id", type=click.IntRange(min=0), required=True, help="Queue id.")
@click.option("--offset", type=click.IntRange(min=0), required=True, help="Queue offset.")
def message_get(endpoint: Connection, topic: str, queue_id: int, offset: int) -> None:
    """The message at one queue offset (mqadmin queryMsgByOffset); exit 1 if there is none."""
    with _client(endpoint) as client:
        try:
            found = client.get(topic, queue_id, offset)
        except Exception as exc:
            raise _fail(exc) from None
    if found is None:
        raise click.ClickException(f"no message at {topic}/{queue_id} offset {offset}")
    emit(message_row(found))

"""``stratamq message send | consume | get | query``: a console producer and consumer, and
lookups of messages by queue offset, id, key or store time, against a running broker (JSON
lines; ``get`` and ``query`` take ``--output table``)."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from stratamq.cli.admin import Connection, _call, endpoint_option
from stratamq.cli.app import main
from stratamq.cli.common import TIME, emit, output_option


@main.group()
def message() -> None:
    """Send, consume and look up messages on a running broker."""


def message_row(m: Any) -> dict[str, Any]:
    from stratamq.client.messaging import message_row as row

    return row(m)


def _client(conn: Connection) -> Any:
    from stratamq.client.messaging import MessagingClient

    return MessagingClient(conn)


def _fail(exc: Exception, where: str) -> click.ClickException:
    import grpc

    from stratamq.client.connection import broker_answered

    if isinstance(exc, grpc.RpcError):
        if not broker_answered(exc):
            return click.ClickException(f"UNAVAILABLE: no broker reachable at {where}")
        return click.ClickException(f"{exc.code().name}: {exc.details()}")
    return click.ClickException(str(exc))


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
                raise _fail(exc, endpoint.endpoint) from None


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
                raise _fail(exc, endpoint.endpoint) from None
            if got:
                received += len(got)
                idle_until = time.monotonic() + idle


@message.command("get")
@endpoint_option
@click.option("--msg-id", default=None,
              help="A message id: the unique client id or the offset message id "
                   "(mqadmin queryMsgById).")
@click.option("--topic", default=None, help="Topic (with --queue and --offset).")
@click.option("--queue", "queue_id", type=click.IntRange(min=0), default=None, help="Queue id.")
@click.option("--offset", type=click.IntRange(min=0), default=None, help="Queue offset.")
@output_option(report=True)
def message_get(endpoint: Connection, msg_id: str | None, topic: str | None,
                queue_id: int | None, offset: int | None) -> None:
    """The message with --msg-id, or at one queue offset (--topic, --queue, --offset:
    mqadmin queryMsgByOffset), found locally or in the tier; exit 1 if there is none."""
    if msg_id is not None:
        if topic is not None or queue_id is not None or offset is not None:
            raise click.UsageError("give --msg-id, or --topic with --queue and --offset")
        emit(_call(endpoint, "ViewMessage", msg_id=msg_id)["message"])
        return
    if topic is None or queue_id is None or offset is None:
        raise click.UsageError("give --msg-id, or --topic with --queue and --offset")
    with _client(endpoint) as client:
        try:
            found = client.get(topic, queue_id, offset)
        except Exception as exc:
            raise _fail(exc, endpoint.endpoint) from None
    if found is None:
        raise click.ClickException(f"no message at {topic}/{queue_id} offset {offset}")
    emit(message_row(found))


@message.command("query")
@endpoint_option
@click.option("--topic", required=True, help="Topic to search.")
@click.option("--key", default=None, help="A message key (a word of KEYS) or unique id.")
@click.option("--msg-id", default=None, help="A unique client id or an offset message id.")
@click.option("--begin", type=TIME, default=None,
              help="Earliest store time (epoch ms or ISO 8601); with --end alone: every "
                   "message stored between them.")
@click.option("--end", type=TIME, default=None, help="Latest store time (epoch ms or ISO 8601).")
@click.option("--max", "max_num", type=click.IntRange(min=1), default=64, show_default=True,
              help="At most this many messages (capped by the broker's maxMsgsNumBatch).")
@output_option
def message_query(endpoint: Connection, topic: str, key: str | None, msg_id: str | None,
                  begin: int | None, end: int | None, max_num: int) -> None:
    """Messages of a topic by key, by id, or by store time, from the broker's index and its
    tier alike (mqadmin queryMsgByKey / queryMsgById): one JSON line each (by key newest
    first, by time oldest first)."""
    if key is not None and msg_id is not None:
        raise click.UsageError("give one of --key, --msg-id or --begin with --end")
    if key is None and msg_id is None and (begin is None or end is None):
        raise click.UsageError("give --key, --msg-id, or --begin and --end")
    if msg_id is not None and (begin is not None or end is not None):
        raise click.UsageError("--msg-id takes no --begin/--end")
    if begin is not None and end is not None and end < begin:
        raise click.UsageError(f"--end {end} is before --begin {begin}")
    reply = _call(endpoint, "QueryMessage", topic=topic, key=key, msg_id=msg_id, begin=begin,
                   end=end, max=max_num)
    for row in reply["messages"]:
        emit(row)
    if msg_id is not None and not reply["messages"]:
        raise click.ClickException(f"no message with id {msg_id!r} in topic {topic!r}")

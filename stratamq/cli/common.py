"""Helpers every CLI module shares: JSON output, opening a store, the dump shape."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click

from stratamq.config import StoreConfig
from stratamq.message import StoredMessage
from stratamq.store.consume_queue_store import STORE_TYPE_FILES, STORE_TYPES
from stratamq.store.message_store import MessageStore, StoreLocked
from stratamq.store.results import GetMessageStatus


def emit(obj: Any) -> None:
    click.echo(json.dumps(obj, separators=(",", ":"), ensure_ascii=False))


_STORE_TYPE_KEY = "stratamq.store_type"


def _remember_store_type(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.meta[_STORE_TYPE_KEY] = value


def store_type_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--store-type default|defaultRocksDB`` for a ``stratamq store ...`` command.

    One line per command: the value goes to the click context and ``open_store`` picks it up,
    so the command's own signature does not change. Without it a store opens with the type
    recorded in its directory."""
    return click.option(
        "--store-type", type=click.Choice(list(STORE_TYPES)), default=None, expose_value=False,
        callback=_remember_store_type, is_eager=True,
        help="ConsumeQueue store to use (default: the type recorded in the store directory).",
    )(command)


def open_store(store_dir: str, *, read_only: bool, store_type: str | None = None) -> MessageStore:
    root = Path(store_dir)
    if not (root / "commitlog").is_dir():
        raise click.ClickException(f"no store at {root}: it has no commitlog/ directory")
    if store_type is None:
        ctx = click.get_current_context(silent=True)
        store_type = ctx.meta.get(_STORE_TYPE_KEY) if ctx is not None else None
    config = StoreConfig(store_path_root_dir=str(root),
                         store_type=store_type or STORE_TYPE_FILES)
    try:
        return MessageStore(config, read_only=read_only,
                            force_store_type=store_type is not None).open()
    except StoreLocked as exc:
        raise click.ClickException(str(exc)) from None
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"cannot open store {root}: {exc}") from None


def message_json(msg: StoredMessage) -> dict[str, Any]:
    """The dump shape: one message as JSON-ready values."""
    return {
        "topic": msg.topic,
        "queue_id": msg.queue_id,
        "queue_offset": msg.queue_offset,
        "commitlog_offset": msg.physical_offset,
        "size": msg.total_size,
        "sys_flag": msg.sys_flag,
        "born_timestamp": msg.born_timestamp,
        "born_host": str(msg.born_host),
        "store_timestamp": msg.store_timestamp,
        "store_host": str(msg.store_host),
        "reconsume_times": msg.reconsume_times,
        "tags": msg.tags,
        "keys": msg.keys,
        "properties": msg.properties,
        "body_crc": msg.body_crc,
        "body_b64": base64.b64encode(msg.decompressed_body()).decode("ascii"),
    }


def iter_queue(store: MessageStore, topic: str, queue_id: int) -> Iterator[StoredMessage]:
    """Every message of one queue in queue order."""
    offset = store.get_min_offset_in_queue(topic, queue_id)
    while True:
        result = store.get_messages("stratamq-cli", topic, queue_id, offset, max_count=256,
                                    max_bytes=64 * 1024 * 1024)
        with result:
            if result.status not in (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE,
                                     GetMessageStatus.MESSAGE_WAS_REMOVING):
                return
            yield from result.messages()
            if result.next_begin_offset <= offset:
                return
            offset = result.next_begin_offset

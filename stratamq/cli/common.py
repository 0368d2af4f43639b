"""Helpers every CLI module shares: JSON output, opening a store, the dump shape."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from stratamq.config import StoreConfig
from stratamq.message import StoredMessage
from stratamq.store.message_store import MessageStore, StoreLocked
from stratamq.store.results import GetMessageStatus


def emit(obj: Any) -> None:
    click.echo(json.dumps(obj, separators=(",", ":"), ensure_ascii=False))


def open_store(store_dir: str, *, read_only: bool) -> MessageStore:
    root = Path(store_dir)
    if not (root / "commitlog").is_dir():
        raise click.ClickException(f"no store at {root}: it has no commitlog/ directory")
    try:
        return MessageStore(StoreConfig(store_path_root_dir=str(root)), read_only=read_only).open()
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

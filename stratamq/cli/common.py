"""Helpers every CLI module shares: JSON output, opening a store, the dump shape, and the
warnings a read-only command prints when the store holds more than it can show."""

from __future__ import annotations

import base64
import struct
import weakref
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import click

from stratamq import record as codec
from stratamq.cli.output import emit as emit  # re-exported: every CLI module emits
from stratamq.cli.output import emit_rows as emit_rows
from stratamq.cli.output import output_option as output_option
from stratamq.compaction.layout import CompactionLayout
from stratamq.compaction.policy import policies_from_topics_json
from stratamq.compaction.service import CompactionStore
from stratamq.compaction.tiering import link as link_compaction_tier
from stratamq.config import BrokerConfig, StoreConfig
from stratamq.config_file import BrokerConf, read_broker_conf
from stratamq.message import RecordCorrupt, StoredMessage
from stratamq.store.consume_queue_store import (
    ROCKSDB_CQ_DIR,
    STORE_TYPE_FILES,
    STORE_TYPE_ROCKSDB,
    STORE_TYPES,
    read_store_type,
)
from stratamq.store.inspect import UndispatchedScan
from stratamq.store.layout import CONSUMEQUEUE_DIR, StoreLayout
from stratamq.store.mapped_file_queue import MappedFileQueue
from stratamq.store.message_store import MessageStore, StoreLocked
from stratamq.store.results import GetMessageStatus
from stratamq.tiered import TieredStore, tiering_enabled
from stratamq.tiered import wire as wire_tier
from stratamq.tiered.location import LOCATION_FILE, TierLocation, read_location
from stratamq.tiered.naming import METADATA_FILE as TIER_METADATA_FILE


def warn(text: str) -> None:
    """One ``warning: ...`` line on stderr: stdout keeps its contract shape."""
    click.echo(f"warning: {text}", err=True)


_STORE_TYPE_KEY = "stratamq.store_type"
_CONFIG_KEY = "stratamq.config"


def _remember(key: str) -> Callable[[click.Context, click.Parameter, str | None], None]:
    def callback(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
        if value is not None:
            ctx.meta[key] = value

    return callback


def config_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--config broker.conf`` for an offline command: the store is opened with the settings
    the broker runs with (segment and index sizes, store type, ...), not the defaults, which
    could make a repair treat files of the configured size as damaged."""
    return click.option(
        "--config", "config_file", type=click.Path(dir_okay=False), default=None,
        expose_value=False, callback=_remember(_CONFIG_KEY), is_eager=True,
        help="broker.conf the broker runs with (its store settings are used).",
    )(command)


def store_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--store-type default|defaultRocksDB`` and ``--config broker.conf`` for a ``stratamq
    store ...`` command.

    One line per command: the values go to the click context and ``open_store`` picks them up,
    so the command's own signature does not change. Without --store-type a store opens with the
    type recorded in its directory."""
    command = click.option(
        "--store-type", type=click.Choice(list(STORE_TYPES)), default=None, expose_value=False,
        callback=_remember(_STORE_TYPE_KEY), is_eager=True,
        help="ConsumeQueue store to use (default: the type recorded in the store directory).",
    )(command)
    return config_option(command)


def read_conf(path: str | None) -> BrokerConf:
    """A ``broker.conf`` for a command: keys RocketMQ has and StrataMQ does not use are named
    once on stderr, values with a ``#`` in them warned about, and any other unknown key stops
    the command (a typo must not leave a setting at its default)."""
    ctx = click.get_current_context(silent=True)
    cached = ctx.meta.get(_CONF_KEY) if ctx is not None else None
    if cached is not None and cached[0] == path:
        return cached[1]
    conf = _read_conf(path)
    if ctx is not None:
        ctx.meta[_CONF_KEY] = (path, conf)
    return conf


_CONF_KEY = "stratamq.conf"


def _read_conf(path: str | None) -> BrokerConf:
    try:
        conf = read_broker_conf(path)
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"cannot read config {path}: {exc}") from None
    if conf.unknown:
        raise click.ClickException(
            f"unknown settings in {path}: {conf.unknown_text()} (stratamq config show lists "
            "every key)")
    if conf.ignored:
        warn(f"{path}: RocketMQ settings StrataMQ does not use, ignored: "
             f"{', '.join(conf.ignored)}")
    for text in conf.warnings:
        warn(f"{path}: {text}")
    return conf


def store_config(store_dir: str | Path, store_type: str | None = None) -> StoreConfig:
    """The StoreConfig an offline command opens ``store_dir`` with: ``--config``'s store
    settings (else the defaults), rooted at ``store_dir``."""
    ctx = click.get_current_context(silent=True)
    path = ctx.meta.get(_CONFIG_KEY) if ctx is not None else None
    config = read_conf(path).store if path is not None else StoreConfig()
    config = replace(config, store_path_root_dir=str(store_dir))
    if store_type is not None:
        config = replace(config, store_type=store_type)
    return config


def open_store(store_dir: str, *, read_only: bool, store_type: str | None = None) -> MessageStore:
    """Open ``store_dir`` as ``--store-type`` / ``--config`` say, with tiered storage plugged
    in when the config turns it on (reads then reach the tier too; nothing is uploaded)."""
    return open_store_tiered(store_dir, read_only=read_only, store_type=store_type)[0]


def broker_names() -> tuple[str, str]:
    """(brokerClusterName, brokerName) from ``--config``: they name the tier's directories."""
    ctx = click.get_current_context(silent=True)
    path = ctx.meta.get(_CONFIG_KEY) if ctx is not None else None
    broker = read_conf(path).broker if path is not None else BrokerConfig()
    return broker.broker_cluster_name, broker.broker_name


def open_store_tiered(store_dir: str, *, read_only: bool, store_type: str | None = None,
                      when_locked: str = "") -> tuple[MessageStore, TieredStore | None]:
    """``open_store`` plus the store's tier (None when the config has none); close the tier
    after the store. ``when_locked``: what to do instead when a broker has the store open."""
    root = Path(store_dir)
    if not (root / "commitlog").is_dir():
        raise click.ClickException(f"no store at {root}: it has no commitlog/ directory")
    if store_type is None:
        ctx = click.get_current_context(silent=True)
        store_type = ctx.meta.get(_STORE_TYPE_KEY) if ctx is not None else None
    if read_only:
        _refuse_missing_rocksdb(root, store_type)
    config = store_config(root, store_type)
    cluster, broker = broker_names()
    config, recorded = _recorded_tier(root, config, read_only)
    if recorded is not None:
        cluster, broker = recorded.cluster, recorded.broker
    tier = None
    try:
        store = MessageStore(config, read_only=read_only, force_store_type=store_type is not None)
        try:
            tier = wire_tier(store, cluster=cluster, broker=broker, background=False)
        except OSError as exc:
            if recorded is None:
                raise
            warn(f"the store's history in its {recorded.describe()} (recorded in "
                 f"{LOCATION_FILE}) cannot be read: {exc}; only the local part is shown: "
                 "messages the local store no longer holds are left out")
            store = MessageStore(config=replace(config, tiered_backend_service_provider="",
                                                message_store_plug_in=""),
                                 read_only=read_only, force_store_type=store_type is not None)
        _plug_compaction(store, config, read_only)
        link_compaction_tier(_COMPACTION.get(store), tier)  # compacted files in the tier
        store.open()
        compaction = _COMPACTION.get(store)
        if compaction is not None and not read_only:
            compaction.flush()  # what the open replayed into it is durable: clean-up may go on
        return store, tier
    except StoreLocked as exc:
        raise click.ClickException(f"{exc}{when_locked}") from None
    except (OSError, ValueError, RuntimeError) as exc:
        where = "its tier" if tier is None and tiering_enabled(config) else f"store {root}"
        raise click.ClickException(f"cannot open {where}: {exc}") from None


def _recorded_tier(root: Path, config: StoreConfig, read_only: bool
                   ) -> tuple[StoreConfig, TierLocation | None]:
    """For a command run without a tier in ``--config``: the tier the store directory records
    (``tiered/location.py``), read by a read-only command so it shows the whole history; a
    read-write command is told it works on the local part only (it must not upload or adopt
    without the broker's settings)."""
    if tiering_enabled(config):
        return config, None
    try:
        recorded = read_location(root)
    except ValueError as exc:
        warn(f"{exc}; its tier, if any, is not read")
        return config, None
    if recorded is None:
        if read_only and (root / TIER_METADATA_FILE).exists():
            warn(f"this store has tier metadata ({TIER_METADATA_FILE}) but no record of where "
                 f"its tier is ({LOCATION_FILE}, written by brokers since it exists): messages "
                 "only in the tier are left out; give the broker's --config to read them")
        return config, None
    if not read_only:
        warn(f"this store has a {recorded.describe()} (recorded in {LOCATION_FILE}); without "
             "the broker's --config this command works on the local part only")
        return config, None
    return recorded.apply(config), recorded


# The compaction store plugged into each store an offline command opened (see open_store).
_COMPACTION: weakref.WeakKeyDictionary[MessageStore, CompactionStore] = (
    weakref.WeakKeyDictionary())


def _plug_compaction(store: MessageStore, config: StoreConfig, read_only: bool) -> None:
    """Compaction topics (``cleanup.policy=COMPACTION`` in ``config/topics.json``) are read
    from their CompactionLogs, and a read-write open splits new records into them, as the
    broker does; otherwise clean-up could delete CommitLog files not yet split out."""
    layout = StoreLayout(config.root)
    if not config.enable_compaction:
        return
    policies = policies_from_topics_json(layout.topics_file)
    if not policies.topics() and not CompactionLayout(layout).queues_on_disk():
        return  # (a RocketMQ store has a compaction/ directory of its own, without queues)
    _COMPACTION[store] = CompactionStore(config, policies, read_only=read_only).plug_into(store)


def compaction_of(store: MessageStore) -> CompactionStore | None:
    """The compaction store ``open_store`` plugged into ``store`` (None: no compaction
    topics)."""
    return _COMPACTION.get(store)


def close_store(store: MessageStore) -> None:
    """Close a store ``open_store`` opened, and its compaction store (flushed, checkpointed)."""
    store.close()
    compaction = _COMPACTION.pop(store, None)
    if compaction is not None:
        compaction.close()


def _refuse_missing_rocksdb(root: Path, forced: str | None) -> None:
    """A store recorded as ``defaultRocksDB`` without its RocksDB would open with no queue at
    all and a read-only command would show an empty store: say what is wrong instead. (A
    read-write open rebuilds the RocksDB from the CommitLog: ``store verify`` does that.)"""
    try:
        recorded = read_store_type(root)
    except ValueError as exc:
        raise click.ClickException(f"cannot open store {root}: {exc}") from None
    if (forced or recorded) != STORE_TYPE_ROCKSDB or (root / ROCKSDB_CQ_DIR / "CURRENT").exists():
        return
    if MappedFileQueue.size_on_disk(root / "commitlog") is None:
        return  # no data: nothing to miss
    cq_dir = root / CONSUMEQUEUE_DIR
    has_files = cq_dir.is_dir() and any(cq_dir.iterdir())
    how = (f"it still has ConsumeQueue files: read them with --store-type {STORE_TYPE_FILES}, "
           f"or build the RocksDB store from the CommitLog: stratamq store migrate-cq --store "
           f"{root} --store-type {STORE_TYPE_FILES} --to rocksdb" if has_files else
           f"rebuild it from the CommitLog with a read-write open: stratamq store verify "
           f"--store {root} (stratamq store migrate-cq needs a ConsumeQueue store to start from)")
    raise click.ClickException(
        f"store {root} uses ConsumeQueue store type {STORE_TYPE_ROCKSDB} (config/storeType) "
        f"but its RocksDB ConsumeQueue store {ROCKSDB_CQ_DIR}/ is missing, so every queue would "
        f"look empty; {how}")


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


class CorruptRecord(NamedTuple):
    """A record a queue points at that does not decode (or fails its body CRC)."""

    topic: str
    queue_id: int
    queue_offset: int
    commitlog_offset: int
    reason: str

    def __str__(self) -> str:
        return (f"corrupt record at CommitLog offset {self.commitlog_offset} "
                f"({self.topic}/{self.queue_id}@{self.queue_offset}): {self.reason}")


def iter_queue(store: MessageStore, topic: str, queue_id: int,
               on_corrupt: Callable[[CorruptRecord], None] | None = None
               ) -> Iterator[StoredMessage]:
    """Every message of one queue in queue order.

    A record that does not decode, or whose body fails its CRC, goes to ``on_corrupt`` (named
    by its CommitLog offset) and is not yielded if it does not decode; a CRC failure is still
    yielded, since its fields are readable. Without ``on_corrupt`` it raises RecordCorrupt."""
    offset = store.get_min_offset_in_queue(topic, queue_id)
    while True:
        result = store.get_messages("stratamq-cli", topic, queue_id, offset, max_count=256,
                                    max_bytes=64 * 1024 * 1024)
        with result:
            if result.status not in (GetMessageStatus.FOUND, GetMessageStatus.NO_MATCHED_MESSAGE,
                                     GetMessageStatus.MESSAGE_WAS_REMOVING):
                return
            for record in result.records:
                phys = record.physical_offset
                try:
                    msg = record.decode()
                except (RecordCorrupt, ValueError, struct.error) as exc:
                    reason = exc.reason if isinstance(exc, RecordCorrupt) else str(exc)
                    if on_corrupt is None:
                        raise RecordCorrupt(phys, reason) from None
                    on_corrupt(CorruptRecord(topic, queue_id, record.queue_offset, phys, reason))
                    continue
                if on_corrupt is not None and codec.body_crc(msg.body) != msg.body_crc:
                    on_corrupt(CorruptRecord(topic, queue_id, record.queue_offset, phys,
                                             "body CRC mismatch"))
                yield msg
            if result.next_begin_offset <= offset:
                return
            offset = result.next_begin_offset


def read_only_warnings(store: MessageStore, store_dir: str,
                       scan: UndispatchedScan | None = None) -> list[str]:
    """What a read-only command cannot show: records behind a recovery cut, records no
    ConsumeQueue holds yet, and damaged records met while scanning the CommitLog."""
    out: list[str] = []
    rec = store.recovery
    verify = f"stratamq store verify --store {store_dir}"
    if rec is not None and rec.records_after_cut:
        out.append(
            f"the CommitLog has a corrupt record at {rec.end_offset} with "
            f"{rec.records_after_cut} valid records after it ({rec.problem}); the log is read "
            f"only up to it, so they are not shown. Run `{verify}` to check the store (like any "
            f"read-write open, it cuts the log there: copy the store first to keep them)")
    elif rec is not None and rec.dropped_units:
        out.append(
            f"{rec.dropped_units} ConsumeQueue units point past the end of the CommitLog at "
            f"{rec.end_offset} ({rec.problem or 'its records are gone'}); those messages are "
            f"not shown. Run `{verify}` for the details")
    if scan is not None and scan.records:
        out.append(
            f"{scan.records} records in the CommitLog are in no ConsumeQueue "
            f"({scan.queues_text()}); they are not shown. Run `{verify}` to re-dispatch them")
    if scan is not None and scan.corrupt:
        more = len(scan.corrupt) - 1
        out.append(f"{scan.corrupt[0]}" + (f" (and {more} more damaged places)" if more else "")
                   + f"; run `{verify}` for the details")
    return out


class TimeParam(click.ParamType):
    """A point in time: epoch milliseconds, or ISO 8601 (``2026-11-23T10:00:00Z``,
    ``2026-11-23 10:00:00+01:00``; without an offset, local time). Becomes epoch ms."""

    name = "TIME"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if text.lstrip("-").isdigit():
            return int(text)
        try:
            from datetime import datetime

            return int(datetime.fromisoformat(text).timestamp() * 1000)
        except ValueError:
            self.fail(f"{value!r} is neither epoch milliseconds nor an ISO 8601 time "
                      "(e.g. 2026-11-23T10:00:00Z)", param, ctx)


TIME = TimeParam()

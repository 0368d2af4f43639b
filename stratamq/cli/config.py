"""``stratamq config show``: every setting, its value, default, unit, range and source."""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Any

import click

from stratamq.cli.app import main
from stratamq.cli.common import emit, read_conf
from stratamq.cli.output import print_table
from stratamq.config import BrokerConfig, StoreConfig


@main.group()
def config() -> None:
    """Settings (broker.conf keys, RocketMQ's names)."""


def _text(value: Any) -> str:
    if isinstance(value, Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def settings_rows(store: StoreConfig, broker: BrokerConfig, from_file: dict[str, str]
                  ) -> list[dict[str, str]]:
    """One row per setting: what it is now and where that came from."""
    rows = []
    for section, obj in (("store", store), ("broker", broker)):
        for f in dataclasses.fields(obj):
            key = f.metadata["key"]
            written = from_file.get(key)
            source = "default" if written is None else (
                "file" if written == key else f"file ({written})")
            meta = f.metadata
            rows.append({"key": key, "value": _text(getattr(obj, f.name)),
                         "default": _text(f.default), "unit": meta["unit"],
                         "range": (f"{meta['minimum']}..{meta['maximum']}"
                                   if meta["minimum"] is not None else ""),
                         "source": source, "section": section, "doc": meta["doc"]})
    return rows


@config.command("show")
@click.option("--config", "config_file", type=click.Path(dir_okay=False), default=None,
              help="broker.conf to read (default: none, every setting at its default).")
@click.option("--output", type=click.Choice(["json", "table"]), default="json",
              show_default=True, help="JSON lines, or a table for people.")
def config_show(config_file: str | None, output: str) -> None:
    """Every setting: key, value, default, unit, range and source (default or file)."""
    if config_file is not None:
        conf = read_conf(config_file)
        rows = settings_rows(conf.store, conf.broker, conf.from_file)
    else:
        rows = settings_rows(StoreConfig(), BrokerConfig(), {})
    if output == "json":
        for row in rows:
            emit(row)
        return
    columns = ["key", "value", "default", "unit", "range", "source"]
    print_table(columns, [[row[c] for c in columns] for row in rows])

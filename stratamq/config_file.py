"""Reading ``broker.conf`` the way RocketMQ users write it.

The file is Java properties, parsed by a Java-properties library (``jproperties``): ``key=value``,
``key: value`` and ``key value``, ``\\`` continuation lines, ``\\uXXXX`` and other escapes,
``#`` and ``!`` comment lines. As in Java, a ``#`` after a value is part of the value: such a
value is reported as a warning, since it is almost always a comment someone meant.

Keys fall into four groups:

* StrataMQ's settings (``config.py``, RocketMQ's names where RocketMQ has the setting);
* aliases: older StrataMQ names of a setting (``metricsPrometheusPort``);
* keys a stock Apache RocketMQ broker knows and StrataMQ does not use (``namesrvAddr``,
  ``brokerPermission``, ...; ``data/rocketmq-broker-keys.txt``): reported once as ignored, so an
  existing ``broker.conf`` starts a broker unchanged;
* anything else: an error, with the closest known key suggested (a typo must not leave a
  setting at its default).
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path

from jproperties import Properties

from stratamq.config import BrokerConfig, StoreConfig, from_props

__all__ = ["ALIASES", "BrokerConf", "load_broker_conf", "read_broker_conf",
           "rocketmq_broker_keys"]

# Old StrataMQ key -> the RocketMQ key it stands for.
ALIASES = {"metricsPrometheusPort": "metricsPromExporterPort"}


@cache
def rocketmq_broker_keys() -> frozenset[str]:
    text = resources.files("stratamq").joinpath("data/rocketmq-broker-keys.txt").read_text(
        encoding="utf-8")
    return frozenset(line.strip() for line in text.splitlines()
                     if line.strip() and not line.startswith("#"))


def _keys(cls: type) -> set[str]:
    return {f.metadata["key"] for f in dataclasses.fields(cls)}


@dataclass
class BrokerConf:
    """What a ``broker.conf`` says: both configs, and what was not taken from it."""

    store: StoreConfig
    broker: BrokerConfig
    unknown: list[str] = field(default_factory=list)  # keys neither StrataMQ nor RocketMQ has
    ignored: list[str] = field(default_factory=list)  # RocketMQ keys StrataMQ does not use
    warnings: list[str] = field(default_factory=list)
    from_file: dict[str, str] = field(default_factory=dict)  # StrataMQ key -> the key written

    def unknown_text(self) -> str:
        """The unknown keys, each with the closest known key when one is close."""
        known = sorted(_keys(StoreConfig) | _keys(BrokerConfig) | set(ALIASES)
                       | rocketmq_broker_keys())
        out = []
        for key in self.unknown:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
            out.append(f"{key} (did you mean {close[0]}?)" if close else key)
        return ", ".join(out)


def read_broker_conf(path: str | Path | None = None, text: str | None = None) -> BrokerConf:
    """Parse a ``broker.conf`` (or ``text``). Bad values raise ValueError (InvalidSetting for
    a value out of its range) naming the key, the value and what is allowed; unknown keys are
    returned in ``unknown`` for the caller to refuse."""
    if text is None:
        text = Path(path).read_text(encoding="utf-8") if path is not None else ""
    props = Properties()
    props.load(text.encode("utf-8"), "utf-8")
    store_keys, broker_keys = _keys(StoreConfig), _keys(BrokerConfig)
    store_props: dict[str, str] = {}
    broker_props: dict[str, str] = {}
    conf_unknown: list[str] = []
    ignored: list[str] = []
    warnings: list[str] = []
    from_file: dict[str, str] = {}
    for key, (value, _meta) in props.items():
        written = key
        if " #" in value or "\t#" in value:
            warnings.append(f"{written}={value!r}: Java properties keep a '#' after a value as "
                            "part of the value; put comments on lines of their own")
        key = ALIASES.get(key, key)
        if key in store_keys:
            store_props[key] = value
        elif key in broker_keys:
            broker_props[key] = value
        elif key in rocketmq_broker_keys():
            ignored.append(written)
            continue
        else:
            conf_unknown.append(written)
            continue
        from_file[key] = written
    alias = next((k for k, v in ALIASES.items() if v == "metricsPromExporterPort"
                  and from_file.get(v) == k), None)
    if alias is not None and "metricsExporterType" not in broker_props:
        # The old key alone turned the exporter on (0 meant off): it still does.
        on = broker_props.get("metricsPromExporterPort", "0").strip() not in ("", "0")
        broker_props["metricsExporterType"] = "PROM" if on else "DISABLE"
        from_file["metricsExporterType"] = alias
    try:
        store, broker = (StoreConfig.from_properties(store_props),
                         from_props(BrokerConfig, broker_props))
    except ValueError as exc:
        if not warnings:
            raise
        raise type(exc)(f"{exc} ({'; '.join(warnings)})") from None
    return BrokerConf(store, broker, conf_unknown, ignored, warnings, from_file)


def load_broker_conf(path: str | Path | None = None, text: str | None = None
                     ) -> tuple[StoreConfig, BrokerConfig, list[str]]:
    """``read_broker_conf`` as (store config, broker config, unknown keys)."""
    conf = read_broker_conf(path, text)
    return conf.store, conf.broker, conf.unknown

"""How a setting is declared, checked and read: the machinery behind ``config.py``.

A setting is a dataclass field made by :func:`setting`, carrying its RocketMQ key, unit, doc
and valid range; :func:`validate` refuses a config whose values break them (InvalidSetting
naming the key, the value and what is allowed), :func:`from_props` builds a config from
``broker.conf`` key/values and :func:`as_properties` writes one back. The settings themselves
are in ``store_config.py`` (the store's) and ``config.py`` (the broker's).
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Callable
from dataclasses import field
from enum import Enum
from typing import Any

from stratamq.limits import INT_MAX

__all__ = ["InvalidSetting", "UnknownSettings", "as_properties", "check_host_port",
           "check_hours", "check_ip", "check_name", "check_rate", "from_props", "one_of",
           "range_text", "setting", "settings_table_of", "validate"]


class UnknownSettings(ValueError):
    """A configuration named keys StrataMQ does not know."""


class InvalidSetting(ValueError):
    """A setting's value is of the wrong type or outside its range; the message names the key,
    the value and what is allowed."""


def setting(key: str, default: Any, unit: str, doc: str, *, minimum: int | None = None,
             maximum: int | None = None, check: Callable[[Any], str | None] | None = None) -> Any:
    """One setting. Integer settings must declare ``minimum`` (``maximum`` defaults to INT_MAX);
    ``check(value)`` returns why a value is wrong, or None."""
    if isinstance(default, int) and not isinstance(default, bool):
        if minimum is None:
            raise TypeError(f"setting {key}: an integer setting must declare its minimum")
        maximum = INT_MAX if maximum is None else maximum
    return field(default=default, metadata={"key": key, "unit": unit, "doc": doc,
                                            "minimum": minimum, "maximum": maximum,
                                            "check": check})


def one_of(*choices: str, fold_case: bool = False) -> Callable[[Any], str | None]:
    def check(value: Any) -> str | None:
        got = value.strip().lower() if fold_case and isinstance(value, str) else value
        allowed = [c.lower() for c in choices] if fold_case else list(choices)
        return None if got in allowed else "must be " + "|".join(choices)

    return check


def check_name(value: Any) -> str | None:
    # Names appear in routes, logs and metrics labels: an empty one or one with blanks in it is
    # a typo in broker.conf far more often than a wish.
    if not isinstance(value, str) or not value.strip():
        return "must not be empty"
    if any(c.isspace() or not c.isprintable() for c in value):
        return "must not contain spaces or control characters"
    return None


def check_ip(value: Any) -> str | None:
    # Written into every record and offset message id as 4 or 16 address bytes.
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return "must be an IPv4 or IPv6 address"
    return None


def check_host_port(value: Any) -> str | None:
    if value == "":
        return None
    host, sep, port = str(value).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        return "must be host:port (e.g. 10.0.0.5:10912)"
    return None


def check_hours(value: Any) -> str | None:
    # RocketMQ's isItTimeToDo skips entries it cannot parse, so "99" or "4am" would silently
    # mean "never delete expired files"; refuse them instead.
    parts = [p.strip() for p in str(value).split(";") if p.strip()]
    if not parts or not all(p.isdigit() and 0 <= int(p) <= 23 for p in parts):
        return "must be hours of the day 0..23 separated by ';' (e.g. 04 or 03;15)"
    return None


def validate(obj: Any) -> None:
    """Refuse a config whose values are of the wrong type or out of range (InvalidSetting)."""
    for f in dataclasses.fields(obj):
        meta = f.metadata
        key, value, default = meta["key"], getattr(obj, f.name), f.default
        if isinstance(default, Enum):
            try:
                value = type(default)(value)
            except ValueError:
                choices = "|".join(m.value for m in type(default))
                raise InvalidSetting(f"{key}={value!r} is invalid: must be {choices}") from None
            setattr(obj, f.name, value)  # a plain string becomes the enum the code compares
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise InvalidSetting(f"{key}={value!r} is invalid: must be true or false")
        elif isinstance(default, int):
            low, high = meta["minimum"], meta["maximum"]
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidSetting(f"{key}={value!r} is invalid: must be an integer "
                                     f"{low}..{high} ({meta['unit']})")
            if not low <= value <= high:
                raise InvalidSetting(f"{key}={value} is out of range: must be {low}..{high} "
                                     f"({meta['unit']})")
        check = meta["check"]
        if check is not None:
            problem = check(value)
            if problem is not None:
                raise InvalidSetting(f"{key}={value!r} is invalid: {problem}")


def range_text(f: dataclasses.Field) -> str:
    meta = f.metadata
    if meta["minimum"] is not None:
        return f"{meta['minimum']}..{meta['maximum']}"
    if isinstance(f.default, Enum):
        return "|".join(m.value for m in type(f.default))
    if isinstance(f.default, bool):
        return "true|false"
    return ""


def convert(f: dataclasses.Field, raw: str) -> Any:
    default = f.default
    if isinstance(default, bool):
        if raw.lower() not in ("true", "false"):
            raise ValueError(f"{f.metadata['key']} must be true or false, not {raw!r}")
        return raw.lower() == "true"
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError:
            raise ValueError(f"{f.metadata['key']} must be an integer, not {raw!r}") from None
    if isinstance(default, float):
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"{f.metadata['key']} must be a number, not {raw!r}") from None
    if isinstance(default, Enum):
        try:
            return type(default)(raw)
        except ValueError:
            choices = "|".join(m.value for m in type(default))
            raise ValueError(f"{f.metadata['key']} must be {choices}, not {raw!r}") from None
    return raw


def settings_table_of(cls: type) -> list[dict[str, str]]:
    return [
        {
            "key": f.metadata["key"],
            "default": str(f.default.value if isinstance(f.default, Enum) else f.default),
            "unit": f.metadata["unit"],
            "range": range_text(f),
            "doc": f.metadata["doc"],
        }
        for f in dataclasses.fields(cls)
    ]


def from_props(cls: type, props: dict[str, str], **overrides: Any) -> Any:
    """Build ``cls`` from ``broker.conf``-style key/values; unknown keys raise UnknownSettings."""
    by_key = {f.metadata["key"]: f for f in dataclasses.fields(cls)}
    unknown = sorted(k for k in props if k not in by_key)
    if unknown:
        raise UnknownSettings("unknown settings: " + ", ".join(unknown))
    values = {by_key[k].name: convert(by_key[k], v.strip()) for k, v in props.items()}
    return cls(**{**values, **overrides})


# Settings never shown to a client asking for the broker's config (mqadmin getBrokerConfig).
_SECRET_KEYS = frozenset({"aclSecretKey"})


def as_properties(*configs: Any) -> dict[str, str]:
    """Every setting of ``configs`` (StoreConfig, BrokerConfig) as broker.conf text by key
    (booleans as Java writes them), secrets left out: what ``GET_BROKER_CONFIG`` answers."""
    out: dict[str, str] = {}
    for config in configs:
        for f in dataclasses.fields(config):
            key, value = f.metadata["key"], getattr(config, f.name)
            if key in _SECRET_KEYS:
                continue
            out[key] = (str(value).lower() if isinstance(value, bool)
                        else str(value.value if isinstance(value, Enum) else value))
    return out


def check_rate(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        return "must be a number in (0, 1]"
    return None

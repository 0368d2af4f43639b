"""``config/tieredStoreLocation.json``: where a store's tier is, kept in the store directory so
that offline commands run without the broker's ``--config`` still find it (``store dump``,
``stat``, ``query`` read it; without it they would show the local part only). Spec:
``docs/formats/tier-location.md``.

Written by ``tiered.wire`` when a store is opened for writing with a tier (the broker), only
when its content changes; read by the CLI (``cli/common.open_store_tiered``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from stratamq.config import StoreConfig
from stratamq.fileutil import atomic_write

__all__ = ["LOCATION_FILE", "TierLocation", "read_location", "record_location"]

LOCATION_FILE = "config/tieredStoreLocation.json"
_VERSION = 1


@dataclass(frozen=True)
class TierLocation:
    """The settings that name a tier: provider, root, S3 endpoint and the directories of the
    broker that writes there (cluster, broker)."""

    provider: str
    file_path: str
    s3_endpoint: str
    cluster: str
    broker: str

    def describe(self) -> str:
        return f"{self.provider} tier at {self.file_path} (broker {self.broker})"

    def apply(self, config: StoreConfig) -> StoreConfig:
        """``config`` with this tier's settings."""
        return replace(config, tiered_backend_service_provider=self.provider,
                       tiered_store_file_path=self.file_path,
                       tiered_store_s3_endpoint=self.s3_endpoint)


def _as_json(location: TierLocation) -> bytes:
    return json.dumps({
        "version": _VERSION, "tieredBackendServiceProvider": location.provider,
        "tieredStoreFilePath": location.file_path,
        "tieredStoreS3Endpoint": location.s3_endpoint,
        "brokerClusterName": location.cluster, "brokerName": location.broker,
    }, indent=2).encode("utf-8") + b"\n"


def record_location(root: Path, location: TierLocation) -> None:
    """Write the file under ``root`` (the store root), unless it already says the same."""
    path = root / LOCATION_FILE
    data = _as_json(location)
    try:
        if path.read_bytes() == data:
            return
    except FileNotFoundError:
        pass
    atomic_write(path, data)


def read_location(root: Path) -> TierLocation | None:
    """The tier recorded in the store at ``root``; None if none is. ValueError names a file
    that does not parse."""
    path = root / LOCATION_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ValueError(f"{path} is unreadable: {exc}") from None
    try:
        return TierLocation(str(raw["tieredBackendServiceProvider"]),
                            str(raw["tieredStoreFilePath"]),
                            str(raw.get("tieredStoreS3Endpoint", "")),
                            str(raw["brokerClusterName"]), str(raw["brokerName"]))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path} lacks a field: {exc}") from None

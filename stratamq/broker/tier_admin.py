"""The admin service's tiered-storage methods (``/stratamq.admin.v1.Admin/<Method>``, JSON
bodies, same errors and ACL as ``broker/admin.py``); registered as a second handler of the same
service so that module stays as it is.

* ``TierStatus {}`` -> ``{"queues": [ROW], "lastError", "lastErrorSince"}``
* ``TierFlush {"timeout_s"?}`` -> ``{"committed": bool, "queues": [ROW], "lastError",
  "lastErrorSince"}``: upload everything dispatched so far and answer once it is committed
  (``committed`` false if ``timeout_s``, default 60, at most 600, ran out first; then
  ``lastError`` says why, where the tier failed)

* ``TierClean {}`` -> what ``stratamq store clean --tiered-only`` prints (``store``,
  ``tiered_offset``, ``commitlog_files``, ``deleted``, ``bytes_freed``, ``min_offset``,
  ``min_offset_before``): the local CommitLog files the tier holds are deleted now, while the
  broker serves (``tiered/local_clean.py``)

ROW is ``{"topic", "queue_id", "local_min_offset", "local_max_offset", "tier_min_offset",
"tier_max_offset", "tier_committed_offset", "tier_bytes", "lag_messages", "lag_bytes",
"corrupt_records", "corrupt_offsets", "missing_messages", "missing_ranges", "tier_unverified",
"lastError", "lastErrorSince"}`` (``tier_unverified``: why the tier does not hold what was
committed to the queue, null when it does; the last two the tier's: why its last attempt
failed, null while it works, and since when, epoch ms)
(``stratamq tier status`` prints the same rows; a compaction topic's tier columns are its
compacted files', ``CompactionTier.status_columns``). All answer ``FAILED_PRECONDITION`` when
the broker runs without a tier; ``TierFlush`` and ``TierClean`` too on a SLAVE (it reads its
master's tier, never uploads).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc

from stratamq.broker.admin import json_methods_handler
from stratamq.broker.metadata import MetadataError
from stratamq.client.admin import SERVICE

if TYPE_CHECKING:
    from stratamq.broker.server import Broker

__all__ = ["tier_admin_handler"]


# A flush waits in one of the broker's executor threads (grpcThreadPoolNums): bounded, so a
# caller cannot hold one for as long as it likes.
MAX_FLUSH_WAIT_S = 600


def _local(broker: Broker) -> Callable[[str, int], tuple[int, int] | None]:
    def held(topic: str, queue_id: int) -> tuple[int, int] | None:
        offsets = broker.store.local_source.offsets(topic, queue_id)
        return None if offsets is None else (offsets.low, offsets.high)

    return held


def tier_admin_handler(broker: Broker) -> grpc.GenericRpcHandler:
    def tier() -> Any:
        if getattr(broker, "tiered", None) is None:
            raise MetadataError("precondition", "tiered storage is off on this broker "
                                "(tieredBackendServiceProvider is not set)")
        return broker.tiered

    def status(req: dict[str, Any]) -> dict[str, Any]:
        return {"queues": tier().status(_local(broker), broker.store.local_source.topics),
                **tier().health()}

    def flush(req: dict[str, Any]) -> dict[str, Any]:
        timeout = req.get("timeout_s", 60)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
            raise MetadataError("invalid", "timeout_s must be a positive number of seconds")
        if timeout > MAX_FLUSH_WAIT_S:  # it holds an executor thread while it waits
            raise MetadataError("invalid", f"timeout_s must be at most {MAX_FLUSH_WAIT_S}")
        if tier().uploader is None or tier().uploader.paused:
            raise MetadataError("precondition", "this broker does not upload to the tier (a "
                                "SLAVE reads its master's tier; flush the master)")
        committed = tier().flush(float(timeout))
        return {"committed": committed,
                "queues": tier().status(_local(broker), broker.store.local_source.topics),
                **tier().health()}

    def clean(req: dict[str, Any]) -> dict[str, Any]:
        from stratamq.tiered.local_clean import delete_tiered_commitlog

        if tier().uploader is None or tier().uploader.paused:
            raise MetadataError("precondition", "this broker does not upload to the tier (a "
                                "SLAVE reads its master's tier): nothing local is known to be "
                                "in it")
        return {"store": str(broker.store_config.root),
                **delete_tiered_commitlog(broker.store, tier())}

    return json_methods_handler(
        broker, SERVICE, {"TierStatus": (status, "Get"), "TierFlush": (flush, "Update"),
                          "TierClean": (clean, "Delete")}, broker.run)

"""Deleting the local CommitLog files whose records the tier already holds (``stratamq tier
clean``, ``stratamq store clean --tiered-only``), on a running broker or offline.

Only whole files below the offset under which everything is in the tier, flushed and
dispatched go, and never the file being written; a file a reader still holds is unmapped once
it lets go (``MappedFile.destroy``). The ConsumeQueues are corrected at once (the clean-up's
ConsumeQueue pass): their min offsets move past the deleted records, which are then read from
the tier.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stratamq.store.message_store import MessageStore
    from stratamq.tiered import TieredStore

__all__ = ["delete_tiered_commitlog"]


def delete_tiered_commitlog(store: MessageStore, tier: TieredStore) -> dict[str, Any]:
    """Delete them; ``{"tiered_offset", "commitlog_files", "deleted": {"commitlog"},
    "bytes_freed", "min_offset", "min_offset_before", "tier_unverified"}``: a queue the
    tier does not hold as committed keeps its local records and is listed with the reason.
    ValueError when this tier does not upload (a read-only or SLAVE tier holds nothing of this
    store's own)."""
    if tier.uploader is None:
        raise ValueError("this tier is not uploaded to from this store (a SLAVE reads its "
                         "master's tier): nothing local is known to be in it")
    files = store.commitlog.files
    # Below the verified offset every record is in the tier (its listing and each queue's last
    # record checked now, not only its metadata); the file must also be flushed and dispatched
    # (after an open it always is: the open replays to the end).
    tiered = min(tier.uploader.verify_coverage(), files.flushed_where, store.reput.reput_from)
    before = files.min_offset()
    sizes = {mf.path: mf.file_size for mf in files.files}
    gone = files.delete_below(tiered, store.config.destroy_mapped_file_interval_forcibly)
    if gone and store.cleanup is not None:
        store.cleanup.after_commitlog_deleted()  # queues start past them: reads go to the tier
    return {"tiered_offset": tiered,
            "commitlog_files": [f"commitlog/{mf.path.name}" for mf in gone],
            "deleted": {"commitlog": len(gone)},
            "bytes_freed": sum(sizes[mf.path] for mf in gone),
            "min_offset": files.min_offset(), "min_offset_before": before,
            "tier_unverified": [{"topic": t, "queue_id": q, "reason": why} for (t, q), why
                                in sorted(tier.uploader.coverage.problems.items())]}

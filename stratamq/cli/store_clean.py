"""``stratamq store clean``: run one clean-up pass on a store directory and report it."""

from __future__ import annotations

import click

from stratamq.cli.common import close_store, emit, open_store, open_store_tiered, store_options
from stratamq.cli.store import store


@store.command("clean")
@click.option("--store", "store_dir", required=True, help="Store root directory.")
@store_options
@click.option("--force", is_flag=True,
              help="Also delete the oldest CommitLog files that have not expired "
                   "(at most deleteFileBatchMax; never the newest).")
@click.option("--tiered-only", is_flag=True,
              help="Delete the CommitLog files whose records the tier already holds (all but "
                   "the one being written), whatever their age; nothing else.")
def store_clean(store_dir: str, force: bool, tiered_only: bool) -> None:
    """Delete expired files now, whatever the hour, and print what went as one JSON object.

    Without --force only CommitLog files older than fileReservedTime go (and more if the disk
    is past diskSpaceCleanForciblyRatio), then the ConsumeQueue and index files wholly below
    the CommitLog's new min offset. The store must not be open elsewhere (it is locked).

    With --tiered-only (tiered storage on in --config): the CommitLog files wholly below the
    offset the tier holds everything under go, as one JSON object {"store", "tiered_offset",
    "commitlog_files", "deleted": {"commitlog"}, "bytes_freed", "min_offset",
    "min_offset_before", "tier_unverified"}; the ConsumeQueue files below go at the next
    regular clean-up, and their messages are read from the tier meanwhile. "Holds" is checked
    in the tier itself, not only in its metadata: each queue's tier files as the tier lists
    them, and its last record read back. A queue the tier does not hold as committed keeps
    all its local records (logged at ERROR; listed in "tier_unverified" with the reason).
    """
    if tiered_only:
        if force:
            raise click.UsageError("--tiered-only and --force do not go together")
        emit(clean_tiered(store_dir))
        return
    s = open_store(store_dir, read_only=False)
    try:
        assert s.cleanup is not None  # a store opened for writing always has one
        report = s.cleanup.run_once(force=force, manual=True)
    finally:
        close_store(s)
    emit({"store": store_dir, **report.as_dict()})


def clean_tiered(store_dir: str) -> dict:
    from stratamq.tiered.local_clean import delete_tiered_commitlog

    s, tier = open_store_tiered(store_dir, read_only=False, when_locked=(
        "; on a running broker: stratamq tier clean --endpoint HOST:PORT"))
    try:
        if tier is None or tier.uploader is None:
            raise click.ClickException(
                f"tiered storage is off for {store_dir}: give the broker's --config (with "
                "tieredBackendServiceProvider and tieredStoreFilePath)")
        return {"store": store_dir, **delete_tiered_commitlog(s, tier)}
    finally:
        close_store(s)
        if tier is not None:
            tier.close()

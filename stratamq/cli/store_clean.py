"""``stratamq store clean``: run one clean-up pass on a store directory and report it."""

from __future__ import annotations

import click

from stratamq.cli.common import close_store, emit, open_store, store_options
from stratamq.cli.store import store


@store.command("clean")
@click.option("--store", "store_dir", required=True, help="Store root directory.")
@store_options
@click.option("--force", is_flag=True,
              help="Also delete the oldest CommitLog files that have not expired "
                   "(at most deleteFileBatchMax; never the newest).")
def store_clean(store_dir: str, force: bool) -> None:
    """Delete expired files now, whatever the hour, and print what went as one JSON object.

    Without --force only CommitLog files older than fileReservedTime go (and more if the disk
    is past diskSpaceCleanForciblyRatio), then the ConsumeQueue and index files wholly below
    the CommitLog's new min offset. The store must not be open elsewhere (it is locked).
    """
    s = open_store(store_dir, read_only=False)
    try:
        assert s.cleanup is not None  # a store opened for writing always has one
        report = s.cleanup.run_once(force=force, manual=True)
    finally:
        close_store(s)
    emit({"store": store_dir, **report.as_dict()})

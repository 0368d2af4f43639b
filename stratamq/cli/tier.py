"""``stratamq tier status|flush|clean``: a store's tiered storage, offline (``--store``, with the
broker's ``--config``) or on a running broker (``--endpoint``). JSON lines (contracts):

* ``tier status``: one line per topic/queue: ``{"topic", "queue_id", "local_min_offset",
  "local_max_offset", "tier_min_offset", "tier_max_offset", "tier_committed_offset",
  "tier_bytes", "lag_messages", "lag_bytes", "corrupt_records", "corrupt_offsets",
  "missing_messages", "missing_ranges", "tier_unverified", "lastError", "lastErrorSince"}``
  (offsets are queue offsets; ``tier_max_offset`` counts what is buffered,
  ``tier_committed_offset`` what is in the tier; null where the queue has none). The
  ``corrupt_*`` and ``missing_*`` columns say what the process's reads of the tier found since
  it started: records that failed their checks (never served; the first 100 offsets listed)
  and the ``[from, to)`` queue offsets whose data the tier lost (``tiered/read_damage.py``).
  ``tier_unverified``: why the tier's own listing or last record did not confirm what was
  committed (its local files are kept), null when it did or was not checked; ``lastError``:
  why the tier's last attempt failed, null while it works, ``lastErrorSince`` since when,
  epoch ms. A compaction topic on a posix/s3 tier is held by its compacted files (the tier
  uploader skips its raw stream): its tier columns are the compacted files' (the committed
  offset is past the last one uploaded) and its lag counts only what its CompactionLog has not
  uploaded yet (the file being written, plus one scheduler pass).
* ``tier flush``: uploads everything dispatched so far, waits until it is committed, then
  prints the same lines; exit 1 when it was not all committed in ``--timeout`` seconds.
* ``tier clean``: deletes the local CommitLog files the tier holds, now (one JSON object, as
  ``store clean --tiered-only`` prints); online too, where ``store clean`` finds the store
  locked by the broker.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from stratamq.cli.admin import Connection, optional_endpoint_option
from stratamq.cli.app import main
from stratamq.cli.common import close_store, emit, open_store_tiered, output_option, store_options


def _one_of(store_dir: str | None, endpoint: Connection | None) -> None:
    if (store_dir is None) == (endpoint is None):
        raise click.UsageError("give --store DIR (offline) or --endpoint HOST:PORT (a broker)")


def _remote(endpoint: Connection, method: str, **request: Any) -> dict[str, Any]:
    from stratamq.client.admin import AdminClient, AdminError

    timeout = float(request.get("timeout_s", 0)) + 30
    with AdminClient(endpoint, timeout=timeout) as client:
        try:
            return client.call(method, **request)
        except AdminError as exc:
            raise click.ClickException(str(exc)) from None


def _offline(store_dir: str, read_only: bool,
             action: Callable[[Any, Any], tuple[list[dict[str, Any]], bool]]) -> bool:
    store, tier = open_store_tiered(store_dir, read_only=read_only)
    try:
        if tier is None:
            raise click.ClickException(
                f"tiered storage is off for {store_dir}: give the broker's --config (with "
                "tieredBackendServiceProvider and tieredStoreFilePath)")
        rows, ok = action(store, tier)
    finally:
        close_store(store)
        if tier is not None:
            tier.close()
    for row in rows:
        emit(row)
    return ok


def _local(store: Any) -> Callable[[str, int], tuple[int, int] | None]:
    def held(topic: str, queue_id: int) -> tuple[int, int] | None:
        offsets = store.local_source.offsets(topic, queue_id)
        return None if offsets is None else (offsets.low, offsets.high)

    return held


def _endpoint_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--store DIR``, or ``--endpoint HOST:PORT`` with the ACL keys and TLS options of every
    admin command (``cli/admin.py``): ``endpoint`` is then a ``Connection``."""
    command = optional_endpoint_option(
        "A running broker's HOST:PORT (instead of --store).")(command)
    return click.option("--store", "store_dir", default=None,
                        help="Store root directory (the broker must not be running).")(command)


@main.group()
def tier() -> None:
    """Tiered storage: what the tier holds, and uploading now."""


@tier.command("status")
@_endpoint_options
@store_options
@output_option
def tier_status(store_dir: str | None, endpoint: Connection | None) -> None:
    """Per topic/queue: local and tier offsets, bytes in the tier, upload lag (JSON lines).

    A compaction topic (posix/s3 tier) shows its compacted files in the tier; its lag is what
    its CompactionLog has not uploaded yet (the file being written), never its raw stream."""
    _one_of(store_dir, endpoint)
    if endpoint is not None:
        for row in _remote(endpoint, "TierStatus")["queues"]:
            emit(row)
        return
    assert store_dir is not None
    _offline(store_dir, True,
             lambda store, t: (t.status(_local(store), store.local_source.topics), True))


@tier.command("flush")
@_endpoint_options
@store_options
@output_option
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=300.0,
              show_default=True, help="Seconds to wait for the uploads to be committed.")
def tier_flush(store_dir: str | None, endpoint: Connection | None, timeout: float) -> None:
    """Upload everything dispatched so far, now; exit once it is committed (JSON lines: the
    status after it). Exit 1 if it was not all committed in --timeout seconds."""
    _one_of(store_dir, endpoint)
    last_error = None
    if endpoint is not None:
        reply = _remote(endpoint, "TierFlush", timeout_s=timeout)
        for row in reply["queues"]:
            emit(row)
        ok = bool(reply["committed"])
        last_error = reply.get("lastError")
    else:
        assert store_dir is not None

        def flush(store: Any, t: Any) -> tuple[list[dict[str, Any]], bool]:
            committed = t.flush(timeout)
            return t.status(_local(store), store.local_source.topics), committed

        ok = _offline(store_dir, False, flush)
    if not ok:
        why = (f": the tier's last error: {last_error}" if last_error else
               " (the tier is unreachable or refused the uploads: see the log with -v)")
        raise click.ClickException(
            f"not everything was committed to the tier in {timeout:g} s{why}")


@tier.command("clean")
@_endpoint_options
@store_options
@output_option(report=True)
def tier_clean(store_dir: str | None, endpoint: Connection | None) -> None:
    """Delete the local CommitLog files whose records the tier already holds (all but the one
    being written), whatever their age: on a running broker (--endpoint) or on a stopped
    one's store (--store, with its --config; the same as store clean --tiered-only). Prints
    what went as one JSON object; their messages are then read from the tier."""
    _one_of(store_dir, endpoint)
    if endpoint is not None:
        emit(_remote(endpoint, "TierClean"))
        return
    assert store_dir is not None
    from stratamq.cli.store_clean import clean_tiered

    emit(clean_tiered(store_dir))

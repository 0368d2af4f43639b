"""Retention: delete old CommitLog files, then the ConsumeQueue and index files that pointed
into them, and refuse puts while the disk is dangerously full.

RocketMQ's ``CleanCommitLogService`` and ``CleanConsumeQueueService`` (seed 004, section 1.8),
as one service:

* **When CommitLog files go.** A file is *expired* once its last modification is older than
  ``fileReservedTime`` hours. Expired files are deleted, oldest first, when the local hour is
  one of ``deleteWhen`` ("04", or "03;04;05"), or at any hour once disk usage passes
  ``diskMaxUsedSpaceRatio`` (75 %). Past ``diskSpaceCleanForciblyRatio`` (85 %) the oldest
  files go even if not expired (``cleanFileForciblyEnable``), as ``diskFullPolicy`` allows:
  ``REFUSE_PUTS`` (the default) only files below both the consumption floor (every message
  consumed by every group with progress on its topic; ``consumption.py``) or below what the
  record holders (a tier) keep; ``DELETE_OLDEST`` (RocketMQ's behaviour) the oldest files
  anyway, each file that took unconsumed messages logged at ERROR with the groups and counts
  and counted (``unconsumed_deleted_files`` / ``_messages``). At most ``deleteFileBatchMax``
  files go in one pass, ``deleteCommitLogFilesInterval`` ms apart. The first unexpired file
  stops a pass (files age in log order), and the file being written never goes.
* **Disk full.** Past ``diskSpaceWarningLevelRatio`` (90 %) the store is marked disk-full
  (RocketMQ's ``RunningFlags`` DISK_FULL bit) and puts get ``SERVICE_NOT_AVAILABLE`` with a
  "disk full" reason. The put path itself re-reads usage at most every
  ``PUT_CHECK_INTERVAL_MS`` and may set the mark, but only a clean-up pass clears it, once
  usage has fallen below the mark: puts stay refused while the disk stays full, rather than
  flipping with each reading. The ratios are taken as configured (config.py refuses values
  outside 1..99 %), not clamped as RocketMQ clamps them.
* **Readers.** A deleted file leaves the file list at once (no new reader finds it) and its
  name is unlinked, but its map stays until the last reader holding it releases it; the space
  comes back then. Files still held are retried each pass and unmapped by force after
  ``destroyMapedFileIntervalForcibly``; even then a view a reader still has keeps its pages
  (the map cannot close under an exported view), so a reader never sees garbage.
* **ConsumeQueues and index.** Whenever the CommitLog's min offset has moved, every queue's
  files wholly below it go and its min offset moves forward (``delete_expired``); a consumer
  asking below gets ``OFFSET_TOO_SMALL`` and the new min. Index files below it go through
  ``index_service.delete_expired_files`` when the store has an index.
* **Restarts.** Nothing is recorded about a deletion: the CommitLog's min offset is the start
  of its first remaining file, and files are deleted oldest first, so a pass cut short (even by
  SIGKILL) leaves a contiguous log that opens normally; the next pass finishes the rest.

Threads: the ``clean-up`` thread runs a pass every ``cleanResourceInterval`` ms; ``run_once``
may also be called from another thread (the CLI, tests) — passes are serialised by a lock.
``put_refusal`` is called on the put path by any writer thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stratamq.config import DiskFullPolicy, StoreConfig
from stratamq.store.consumption import consumption_floor, unconsumed_below
from stratamq.store.layout import CONSUMEQUEUE_DIR
from stratamq.store.mapped_file import MappedFile
from stratamq.store.mapped_file_queue import MappedFileQueue
from stratamq.store.service import ServiceThread

__all__ = [
    "CleanupReport",
    "CleanupService",
    "DiskUsageProbe",
    "is_time_to_delete",
    "statvfs_used_ratio",
]

log = logging.getLogger(__name__)

PUT_CHECK_INTERVAL_MS = 300  # the put path re-reads disk usage at most this often

DiskUsageProbe = Callable[[Path], float]
"""Returns the used fraction (0.0..1.0) of the file system holding a path."""


def statvfs_used_ratio(path: Path) -> float:
    """Used fraction of the file system holding ``path``, as RocketMQ computes it
    ((total - free) / total, blocks reserved for root counting as free)."""
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    if total <= 0:
        return 0.0
    return (total - st.f_bfree * st.f_frsize) / total


def is_time_to_delete(delete_when: str, now_ms: int) -> bool:
    """True if the local hour of ``now_ms`` is one of the ``;``-separated hours of
    ``deleteWhen`` (RocketMQ's ``UtilAll.isItTimeToDo``); malformed entries are ignored."""
    hour = time.localtime(now_ms / 1000).tm_hour
    for part in delete_when.split(";"):
        part = part.strip()
        if part.isdigit() and int(part) == hour:
            return True
    return False


@dataclass
class CleanupReport:
    """What one pass did. Paths are relative to the store root."""

    triggers: list[str] = field(default_factory=list)  # time, space, forcibly, manual, force
    disk_used_before: float = 0.0  # fraction of the fullest store file system
    disk_used_after: float = 0.0
    disk_full: bool = False  # puts are refused after this pass
    min_offset_before: int = 0
    min_offset: int = 0  # the CommitLog's min offset after this pass
    commitlog_files: list[str] = field(default_factory=list)
    consumequeue_files: list[str] = field(default_factory=list)
    index_files: list[str] = field(default_factory=list)
    # Counts as each store reports them: files for file ConsumeQueues, units for RocksDB
    # (which has no per-queue files to name).
    consumequeue_deleted: int = 0
    index_deleted: int = 0
    bytes_freed: int = 0  # disk blocks of the deleted files (freed once no reader holds them)
    held_by_readers: list[str] = field(default_factory=list)  # deleted, map still alive
    # Forced clean-up under REFUSE_PUTS stopped at a file holding unconsumed messages:
    # {"file", "groups": {"group topic": count}} (None: it did not).
    held_for_consumers: dict[str, Any] | None = None
    # Under DELETE_OLDEST (or --force): {"group topic": messages} the deleted files took.
    unconsumed_deleted: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "commitlog_files": self.commitlog_files,
            "consumequeue_files": self.consumequeue_files,
            "index_files": self.index_files,
            "deleted": {
                "commitlog": len(self.commitlog_files),
                "consumequeue": self.consumequeue_deleted,
                "index": self.index_deleted,
            },
            "bytes_freed": self.bytes_freed,
            "min_offset": self.min_offset,
            "min_offset_before": self.min_offset_before,
            "triggers": self.triggers,
            "disk_used_percent": round(self.disk_used_before * 100, 2),
            "disk_used_percent_after": round(self.disk_used_after * 100, 2),
            "disk_full": self.disk_full,
            "held_by_readers": self.held_by_readers,
            "held_for_consumers": self.held_for_consumers,
            "unconsumed_deleted": self.unconsumed_deleted,
        }


class CleanupService:
    """Deletes expired files and tracks the disk-full mark for one store.

    It is handed the parts it needs: the CommitLog's file queue, the ConsumeQueue stores (one,
    or two under double write; each has ``delete_expired(min_commitlog_offset) -> int``),
    optionally the index service
    (``delete_expired_files(min_commitlog_offset)``), and ``safe_offset``: the CommitLog offset
    below which records are both dispatched and flushed, so a file is never deleted before the
    ConsumeQueues point at its records or before the flusher has moved past it.
    ``consumed_offsets`` returns the broker's consumed queue offsets (or None while nothing
    is registered: then no message counts as consumed); ``held_elsewhere`` the CommitLog
    offset below which a record holder (a tier) keeps every record, or None.
    ``usage_probe`` and ``clock`` (wall time in ms) are injectable for tests.
    """

    def __init__(
        self,
        config: StoreConfig,
        root: Path,
        commitlog_files: MappedFileQueue,
        consume_queue_stores: Sequence[Any],
        *,
        index_service: Any = None,
        safe_offset: Callable[[], int] | None = None,
        consumed_offsets: Callable[[], Any] | None = None,
        held_elsewhere: Callable[[], int | None] | None = None,
        usage_probe: DiskUsageProbe | None = None,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self.config = config
        self.root = root
        self.commitlog_files = commitlog_files
        self.consume_queue_stores = list(consume_queue_stores)
        self.index_service = index_service
        self.safe_offset = safe_offset or (lambda: commitlog_files.flushed_where)
        self.consumed_offsets = consumed_offsets or (lambda: None)
        self.held_elsewhere = held_elsewhere or (lambda: None)
        # Files deleted while they held unconsumed messages, and those messages (ever, since
        # the store opened): the broker's metric and `broker status`.
        self.unconsumed_deleted_files = 0
        self.unconsumed_deleted_messages = 0
        self._held_note: tuple[str, ...] | None = None  # what the last hold-back log said
        self.usage_probe: DiskUsageProbe = usage_probe or statvfs_used_ratio
        self.clock = clock or (lambda: int(time.time() * 1000))
        self.put_check_interval_ms = PUT_CHECK_INTERVAL_MS
        self._pass_lock = threading.Lock()
        self._service = _CleanupThread(self)
        self._stop = self._service._stop  # a pass in progress stops between two files
        self._hanging: list[MappedFile] = []  # deleted but still mapped by a reader
        self._last_cq_min = -1  # CommitLog min the ConsumeQueues were last cleaned for
        self._disk_full = False
        self._disk_used = 0.0
        self._last_probe = float("-inf")  # monotonic seconds

    # -- thresholds -----------------------------------------------------------------------------

    @property
    def warning_ratio(self) -> float:
        return self.config.disk_space_warning_level_ratio / 100

    @property
    def forcibly_ratio(self) -> float:
        return self.config.disk_space_clean_forcibly_ratio / 100

    @property
    def max_used_ratio(self) -> float:
        return self.config.disk_max_used_space_ratio / 100

    # -- disk usage and the disk-full mark --------------------------------------------------------

    def _probe_paths(self) -> list[Path]:
        """The CommitLog's and the ConsumeQueues' directories (RocketMQ checks both; they are
        usually on one file system), falling back to the root while they do not exist."""
        paths = []
        for p in (self.commitlog_files.directory, self.root / CONSUMEQUEUE_DIR):
            paths.append(p if p.exists() else self.root)
        return list(dict.fromkeys(paths))

    def disk_used(self, *, may_clear: bool = True) -> float:
        """Read disk usage now and update the disk-full mark; returns the used fraction.
        ``may_clear=False`` (the put path) may set the mark but never clears it."""
        used = 0.0
        for path in self._probe_paths():
            try:
                used = max(used, self.usage_probe(path))
            except OSError as exc:  # an unreadable probe must not stop writes or clean-up
                log.warning("cannot read disk usage of %s: %s", path, exc)
        full = used > self.warning_ratio
        if not full and self._disk_full and not may_clear:
            full = True  # only a clean-up pass lifts the mark: no flapping between readings
        if full != self._disk_full:
            if full:
                log.error("disk full: store file system %.1f%% used, past "
                          "diskSpaceWarningLevelRatio %.0f%%; refusing puts",
                          used * 100, self.warning_ratio * 100)
            else:
                log.warning("disk space OK again (%.1f%% used); accepting puts", used * 100)
        self._disk_used = used
        self._disk_full = full
        self._last_probe = time.monotonic()
        return used

    @property
    def disk_full(self) -> bool:
        return self._disk_full

    def put_refusal(self) -> str | None:
        """Why a put must be refused now ("disk full ..."), or None. Cheap: re-reads disk usage
        only when the last reading is older than ``put_check_interval_ms``."""
        if (time.monotonic() - self._last_probe) * 1000 >= self.put_check_interval_ms:
            self.disk_used(may_clear=False)
        if not self._disk_full:
            return None
        return (f"disk full: the store's file system is {self._disk_used * 100:.1f}% used, past "
                f"diskSpaceWarningLevelRatio ({self.warning_ratio * 100:.0f}%); puts resume "
                "once clean-up frees space")

    # -- one pass -------------------------------------------------------------------------------

    def run_once(self, force: bool = False, now_ms: int | None = None, *,
                 manual: bool = False) -> CleanupReport:
        """One clean-up pass.

        ``force`` deletes the oldest CommitLog files even if not expired (what a disk past
        ``diskSpaceCleanForciblyRatio`` triggers), at most ``deleteFileBatchMax``. ``manual``
        deletes expired files whatever the hour or disk usage (RocketMQ's
        ``executeDeleteFilesManually``; what ``stratamq store clean`` does). ``now_ms`` is the
        wall clock used for file ages and ``deleteWhen``.
        """
        with self._pass_lock:
            now = self.clock() if now_ms is None else now_ms
            report = CleanupReport(min_offset_before=self.commitlog_files.min_offset())
            self._retry_hanging()
            self._clean_commitlog(report, now, force=force, manual=manual)
            self._clean_logics(report)
            self._retry_hanging()
            report.min_offset = self.commitlog_files.min_offset()
            report.disk_used_after = self.disk_used()
            report.disk_full = self._disk_full
            report.held_by_readers = [self._rel(mf.path) for mf in self._hanging]
            if report.commitlog_files or report.consumequeue_deleted or report.index_deleted:
                log.info("clean-up %s: %s", report.triggers, report.as_dict())
            return report

    def after_commitlog_deleted(self) -> CleanupReport:
        """The ConsumeQueue and index part of a pass, now: for a caller that deleted CommitLog
        files itself (``tier clean``). Each queue's min offset moves past the records that are
        gone, so reads below it go to the next source of the read chain (the tier) at once,
        instead of the queue skipping to its first local record until the next pass."""
        with self._pass_lock:
            report = CleanupReport(min_offset_before=self.commitlog_files.min_offset())
            self._clean_logics(report)
            report.min_offset = self.commitlog_files.min_offset()
            return report

    def _clean_commitlog(self, report: CleanupReport, now: int, *, force: bool,
                         manual: bool) -> None:
        cfg = self.config
        used = self.disk_used()
        report.disk_used_before = used
        clean_at_once = used > self.forcibly_ratio  # includes past the warning mark
        if is_time_to_delete(cfg.delete_when, now):
            report.triggers.append("time")
        if used > self.max_used_ratio:
            report.triggers.append("space")
        if clean_at_once and cfg.clean_file_forcibly_enable:
            report.triggers.append("forcibly")
        else:
            clean_at_once = False
        if manual:
            report.triggers.append("manual")
        if force:
            report.triggers.append("force")
            clean_at_once = True
        if not report.triggers:
            return
        reserved_ms = cfg.file_reserved_time * 3600 * 1000
        safe = self.safe_offset()
        guard = _ForcedDeletionGuard(self, delete_oldest=force or (
            cfg.disk_full_policy is DiskFullPolicy.DELETE_OLDEST))
        deleted = 0
        # Files age in log order: the first one kept ends the pass, so no gap can open.
        for mf in self.commitlog_files.files[:-1]:  # never the file being written
            if deleted >= cfg.delete_file_batch_max or self._stop.is_set():
                break
            if mf.file_end_offset > safe:
                break  # not yet dispatched or flushed: its records must reach the queues first
            try:
                st = os.stat(mf.path)
            except FileNotFoundError:
                st = None  # removed behind our back: drop it from the list like an expired one
            expired = st is None or now >= st.st_mtime_ns // 1_000_000 + reserved_ms
            if not (expired or clean_at_once):
                break
            if not expired and not guard.may_delete(mf, report):
                break  # REFUSE_PUTS: its messages are not all consumed, nor held by the tier
            # Spread the I/O of many unlinks, as RocketMQ does; close() cuts the wait short.
            pause = cfg.delete_commit_log_files_interval / 1000
            if deleted and pause > 0 and self._stop.wait(pause):
                break
            if not expired:
                guard.count_loss(mf, report)
            gone = self.commitlog_files.delete_below(
                mf.file_end_offset, cfg.destroy_mapped_file_interval_forcibly)
            for dead in gone:
                report.commitlog_files.append(self._rel(dead.path))
                if not dead.closed:
                    self._hanging.append(dead)
            if st is not None:
                report.bytes_freed += st.st_blocks * 512
            deleted += len(gone)
        if report.held_for_consumers is None:
            self._held_note = None
        if (not deleted and report.triggers and used > self.max_used_ratio
                and report.held_for_consumers is None):  # the guard said why, once
            why = ("forced deletion is off (cleanFileForciblyEnable=false)"
                   if used > self.forcibly_ratio and not cfg.clean_file_forcibly_enable
                   else "none is expired, dispatched and flushed, but the one being written")
            log.warning("disk %.1f%% used but no CommitLog file could be deleted: %s",
                        used * 100, why)

    def _clean_logics(self, report: CleanupReport) -> None:
        """ConsumeQueue and index files wholly below the CommitLog's min offset (only when
        that min moved since the last time, as RocketMQ's CleanConsumeQueueService does)."""
        min_offset = self.commitlog_files.min_offset()
        if min_offset <= self._last_cq_min or self._stop.is_set():
            return
        before = self._cq_files()
        for cq_store in self.consume_queue_stores:
            report.consumequeue_deleted += int(cq_store.delete_expired(min_offset) or 0)
        after = {id(mf) for mf in self._cq_files().values()}
        for key, mf in before.items():
            if key not in after:
                report.consumequeue_files.append(self._rel(mf.path))
                report.bytes_freed += mf.file_size
                if not mf.closed:
                    self._hanging.append(mf)
        index = self.index_service
        deleter = getattr(index, "delete_expired_files", None) if index is not None else None
        if deleter is not None:
            removed = deleter(min_offset)
            if isinstance(removed, int):
                report.index_deleted = removed
            elif removed is not None:
                names = [self._rel(Path(getattr(r, "path", r))) for r in removed]
                report.index_files.extend(names)
                report.index_deleted = len(names)
        self._last_cq_min = min_offset

    def _cq_files(self) -> dict[int, MappedFile]:
        """Every ConsumeQueue file of a file-based store, by identity (empty for others)."""
        out: dict[int, MappedFile] = {}
        for cq_store in self.consume_queue_stores:
            for cq in list(cq_store):
                files = getattr(cq, "files", None)  # a RocksDB queue has no files of its own
                for mf in getattr(files, "files", ()):
                    out[id(mf)] = mf
        return out

    def _retry_hanging(self) -> None:
        """Unmap files whose readers let go, or that have waited past the forcible bound."""
        interval = self.config.destroy_mapped_file_interval_forcibly
        still = []
        for mf in self._hanging:
            if not mf.destroy(interval):
                still.append(mf)
        self._hanging = still

    def _rel(self, path: Path) -> str:
        try:
            return str(Path(path).relative_to(self.root))
        except ValueError:
            return str(path)

    # -- the service thread ---------------------------------------------------------------------

    def start(self) -> None:
        self.disk_used()
        self._service.start()

    @property
    def running(self) -> bool:
        return self._service.alive

    def shutdown(self) -> None:
        """Stop the thread (a pass in progress stops between two files)."""
        self._service.shutdown()
        with self._pass_lock:
            # Files still held by readers at shutdown are unmapped when the store closes.
            for mf in self._hanging:
                with contextlib.suppress(OSError):
                    mf.destroy(0)
            self._hanging = []


class _ForcedDeletionGuard:
    """One pass's forced-deletion decisions: whether an unexpired file may go
    (``REFUSE_PUTS``), and what it took when it went anyway (``DELETE_OLDEST``, ``--force``).
    The broker's consumed offsets and the floors are read once per pass, when first needed."""

    def __init__(self, cleanup: CleanupService, *, delete_oldest: bool) -> None:
        self.cleanup = cleanup
        self.delete_oldest = delete_oldest
        self._consumed: Any = None
        self._floor: int | None = None
        self._held: int | None = None
        self._counted: dict[tuple[str, str], int] | None = None  # unconsumed below the last end

    def _read(self) -> None:
        if self._consumed is None:
            c = self.cleanup
            self._consumed = c.consumed_offsets() or {}
            primary = c.consume_queue_stores[0] if c.consume_queue_stores else []
            floor = consumption_floor(primary, self._consumed)
            self._floor = 2**63 - 1 if floor is None else floor
            held = c.held_elsewhere()
            self._held = -1 if held is None else held

    def _unconsumed(self, end: int) -> dict[tuple[str, str], int]:
        c = self.cleanup
        primary = c.consume_queue_stores[0] if c.consume_queue_stores else []
        return unconsumed_below(primary, self._consumed, end)

    def may_delete(self, mf: MappedFile, report: CleanupReport) -> bool:
        if self.delete_oldest:
            return True
        self._read()
        assert self._floor is not None and self._held is not None
        end = mf.file_end_offset
        if end <= self._floor or end <= self._held:
            return True
        holders = self._unconsumed(end)
        named = {f"{g} {t}": n for (g, t), n in sorted(holders.items())}
        report.held_for_consumers = {"file": self.cleanup._rel(mf.path), "groups": named}
        note = tuple(sorted(named))
        if note != self.cleanup._held_note:
            self.cleanup._held_note = note
            log.warning(
                "disk %.1f%% used, past diskSpaceCleanForciblyRatio, but CommitLog file %s "
                "holds messages not yet consumed (%s); diskFullPolicy=REFUSE_PUTS keeps it, "
                "and puts are refused past diskSpaceWarningLevelRatio until consumers catch "
                "up and clean-up frees space", report.disk_used_before * 100, mf.path.name,
                _groups_text(holders))
        return False

    def count_loss(self, mf: MappedFile, report: CleanupReport) -> None:
        """Log at ERROR and count what deleting ``mf`` (unexpired) takes from consumers."""
        self._read()
        assert self._held is not None
        end = mf.file_end_offset
        if end <= self._held:
            return  # the tier keeps every record of it: nothing is lost
        if self._counted is None:
            self._counted = self._unconsumed(mf.file_from_offset)
        below = self._unconsumed(end)
        taken = {k: n - self._counted.get(k, 0) for k, n in below.items()
                 if n > self._counted.get(k, 0)}
        self._counted = below
        if not taken:
            return
        total = sum(taken.values())
        c = self.cleanup
        c.unconsumed_deleted_files += 1
        c.unconsumed_deleted_messages += total
        for (g, t), n in taken.items():
            key = f"{g} {t}"
            report.unconsumed_deleted[key] = report.unconsumed_deleted.get(key, 0) + n
        log.error("deleting CommitLog file %s (disk %.1f%% used, diskFullPolicy=%s) takes %d "
                  "messages not yet consumed: %s", mf.path.name, report.disk_used_before * 100,
                  c.config.disk_full_policy.value if not report.triggers.count("force")
                  else "--force", total, _groups_text(taken))


def _groups_text(counts: dict[tuple[str, str], int]) -> str:
    return ", ".join(f"group {g} topic {t}: {n}" for (g, t), n in sorted(counts.items()))


class _CleanupThread(ServiceThread):
    """Runs a clean-up pass every ``cleanResourceInterval``."""

    def __init__(self, cleanup: CleanupService) -> None:
        super().__init__("clean-up")
        self.cleanup = cleanup

    def run(self) -> None:
        interval = max(self.cleanup.config.clean_resource_interval, 1) / 1000
        while not self.wait(interval):
            try:
                self.cleanup.run_once()
            except Exception:  # keep cleaning on the next round; a failed pass deletes nothing
                log.exception("clean-up pass failed")

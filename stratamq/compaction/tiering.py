"""Compacted files in the tier: what tiered storage holds for a compaction topic.

For a compaction topic the tier holds the CompactionLog's compacted files, not the raw stream
(the tier uploader skips these topics: ``link``). Spec: ``docs/formats/compaction-tier.md``.

- **Upload** (``CompactionTier.upload``), after a round commits and on every scheduler pass:
  each sealed file of the queue the tier does not hold yet (by name and CRC) is uploaded
  through the tier's ``FileSegment`` drivers (posix, s3) under a directory named by the new
  manifest generation (``.../<topic>/<queueId>/COMPACTION/<generation>/COMMIT_LOG|
  CONSUME_QUEUE/<name>``); then the broker's manifest (``tier_format``) is replaced whole,
  naming the queue's new file set; only then are the files it no longer names deleted. A crash
  anywhere leaves the old manifest (old set, whole) or the new one (new set, whole): files not
  named yet are never read, and swept on the next upload.
- **Local retention** (``release_local``): a sealed local file whose bytes the manifest holds
  (same name, same CRC) and whose newest message is older than ``fileReservedTime`` is deleted
  locally with the swap protocol (so a crash cannot leave a log file without its batch CQ);
  the queue's ``tier_floor`` records that reads below it go to the tier. A file the tier does
  not hold is never deleted.
- **Reading**: ``TierSegment`` serves a released file from the tier: its batch CQ units are
  read once (64 bytes per kept message) and cached, records are ranged reads of the log, the
  same bytes, offsets and ids as the local file had.
- **Rounds** need the compacted set locally: before a round of a queue with released files,
  ``restore`` downloads them back (a swap again), so the round sees every key.

Only posix and s3 tiers (the manifest needs a whole-document replace; a memory tier is lost at
exit anyway). Thread-safety: one upload/restore/release per queue at a time (the caller holds
the queue's ``compacting`` lock); the manifest is read-modified-written under ``_lock``.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from stratamq.compaction import bcq_format as bcq
from stratamq.compaction import swap
from stratamq.compaction.segment import Segment
from stratamq.compaction.state_format import SwapManifest
from stratamq.compaction.tier_format import (
    MANIFEST_NAME,
    QueueEntry,
    TierFile,
    TierManifest,
    TierManifestError,
)
from stratamq.config import InvalidSetting
from stratamq.fileutil import fsync_directory
from stratamq.store.layout import parse_segment_name, segment_name
from stratamq.tiered.drivers import AppendResult, FileSegment, TierIOError
from stratamq.tiered.naming import FileSegmentType, cluster_dir, file_name_to_offset
from stratamq.tiered.offloaded import TierDocs

if TYPE_CHECKING:
    from stratamq.compaction.log import CompactionLog
    from stratamq.compaction.service import CompactionStore
    from stratamq.tiered import TieredStore

__all__ = ["CompactionTier", "TierFileCorrupt", "TierSegment", "link"]

log = logging.getLogger(__name__)

COMPACTION_DIR = "COMPACTION"
UPLOAD_CHUNK = 16 * 1024 * 1024  # bytes per upload (one object-store part)


class TierFileCorrupt(OSError):
    """A compacted file read back from the tier is not what the manifest recorded (size, unit
    count or CRC-32): the message names the tier file. Nothing local is changed."""


def verified(tseg: TierSegment) -> tuple[bytes, np.ndarray]:
    """The released file's log bytes and units, checked against its manifest entry (the CRC
    is ``segment_crc``'s: the log bytes, then the units), so bit rot in the tier is never made
    local (and uploaded again as a new generation)."""
    f, log_path, cq_path = tseg.entry, tseg.log_path, tseg.cq_path
    data, units_raw = tseg.log_bytes(), tseg.cq_bytes()
    if len(data) != f.log_bytes or len(units_raw) != f.units * bcq.UNIT_SIZE:
        raise TierFileCorrupt(
            f"tier file {log_path} / {cq_path}: {len(data)} log bytes and "
            f"{len(units_raw) // bcq.UNIT_SIZE} units read back, the manifest has "
            f"{f.log_bytes} and {f.units}: it is damaged or truncated in the tier")
    crc = zlib.crc32(units_raw, zlib.crc32(data))
    if crc != f.crc:
        raise TierFileCorrupt(
            f"tier file {log_path} / {cq_path}: CRC-32 {crc:#010x} of what was read back is "
            f"not the manifest's {f.crc:#010x}: it is damaged in the tier (restore it from a "
            "backup; the queue's local files were left as they are)")
    return data, bcq.units_array(units_raw, f.units)


def segment_crc(seg: Segment) -> int:
    """CRC-32 of a sealed local segment's records then units (cached: a sealed file never
    changes)."""
    if seg.tier_crc is None:
        crc = zlib.crc32(seg.log.buffer[: seg.log_bytes])
        seg.tier_crc = zlib.crc32(seg.cq.buffer[: seg.units * bcq.UNIT_SIZE], crc)
    return seg.tier_crc


class TierSegment:
    """A compacted file served from the tier (see the module docstring). Immutable; its units
    are fetched once, under a lock."""

    sealed = True

    def __init__(self, entry: TierFile, log_file: FileSegment, cq_file: FileSegment) -> None:
        self.entry = entry
        self.name = entry.name
        self.start = entry.start
        self.units = entry.units
        self.first_offset = entry.first_offset
        self.last_offset = entry.last_offset
        self._log, self._cq = log_file, cq_file
        log_file.init_position(entry.log_bytes)
        cq_file.init_position(entry.units * bcq.UNIT_SIZE)
        self._units: np.ndarray | None = None
        self._lock = threading.Lock()

    def units_array(self) -> np.ndarray:
        if self._units is None:
            with self._lock:
                if self._units is None:
                    self._units = bcq.units_array(self.cq_bytes(), self.units)
        return self._units

    @property
    def log_path(self) -> str:
        return self._log.path

    @property
    def cq_path(self) -> str:
        return self._cq.path

    def cq_bytes(self) -> bytes:
        return self._cq.read(0, self.units * bcq.UNIT_SIZE)

    def log_range(self, position: int, size: int) -> bytes:
        """``size`` log bytes from CompactionLog position ``position`` (one ranged read)."""
        return self._log.read(position - self.start, size)

    def log_bytes(self) -> bytes:
        return self._log.read(0, self.entry.log_bytes)

    def index_of(self, queue_offset: int) -> int:
        return int(np.searchsorted(self.units_array()["queue_offset"], queue_offset))

    def index_of_time(self, timestamp_ms: int) -> int:
        return int(np.searchsorted(self.units_array()["store_timestamp"], timestamp_ms))

    def __repr__(self) -> str:
        return f"TierSegment({self.name}@{self.entry.generation}, units={self.units})"


class _Listing:
    """Listing and deleting under the tier root, for the two providers that hold a manifest."""

    def __init__(self, provider: str, fs: Any) -> None:
        self.provider, self.fs = provider, fs

    def names(self, path: str) -> list[str]:
        if self.provider == "posix":
            try:
                return sorted(p.name for p in Path(path).iterdir())
            except FileNotFoundError:
                return []
        try:
            return sorted(str(p).rstrip("/").rsplit("/", 1)[-1]
                          for p in self.fs.ls(path, detail=False, refresh=True))
        except FileNotFoundError:
            return []

    def remove(self, path: str) -> None:
        if self.provider == "posix":
            p = Path(path)
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            return
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(path, recursive=True)


class CompactionTier:
    """The compacted files one broker keeps in its tier (see the module docstring)."""

    def __init__(self, tier: TieredStore, *, reserved_ms: int) -> None:
        factory = tier.factory
        if factory.provider not in ("posix", "s3"):
            raise InvalidSetting(f"compaction topics are tiered on posix or s3 tiers, not "
                                 f"{factory.provider}")
        self.factory = factory
        self.broker = tier.broker
        self.read_only = tier.read_only
        self.reserved_ms = reserved_ms
        self.docs = TierDocs(tier.config, factory.cluster, tier.broker, fs=factory.fs)
        self._listing = _Listing(factory.provider, factory.fs)
        self._lock = threading.Lock()
        self.manifest = TierManifest()
        self._segments: dict[tuple[str, int, str, int], TierSegment] = {}

    # -- the manifest ---------------------------------------------------------------------------

    def load(self) -> TierManifest:
        raw = self.docs.read(MANIFEST_NAME)
        if raw is not None:
            self.manifest = TierManifest.parse(self.docs.path(MANIFEST_NAME), raw)
        return self.manifest

    def entry(self, topic: str, queue_id: int) -> QueueEntry | None:
        return self.manifest.queues.get((topic, queue_id))

    def _file_path(self, topic: str, queue_id: int, generation: int) -> str:
        return f"{self.broker}/{topic}/{queue_id}/{COMPACTION_DIR}/{generation:020d}"

    def _queue_dir(self, topic: str, queue_id: int) -> str:
        return self.factory.full_path(
            f"{cluster_dir(self.factory.cluster)}/{self.broker}/{topic}/{queue_id}/"
            f"{COMPACTION_DIR}")

    def _files(self, topic: str, queue_id: int, f: TierFile) -> tuple[FileSegment, FileSegment]:
        path = self._file_path(topic, queue_id, f.generation)
        return (self.factory.create_segment(FileSegmentType.COMMIT_LOG, path, f.start),
                self.factory.create_segment(FileSegmentType.CONSUME_QUEUE, path, f.start))

    def tier_segments(self, topic: str, queue_id: int, below: int) -> tuple[TierSegment, ...]:
        """The queue's tier files whose offsets are all below ``below`` (the released ones)."""
        entry = self.entry(topic, queue_id)
        if entry is None or below <= 0:
            return ()
        out = []
        for f in entry.files:
            if f.last_offset >= below:
                break
            key = (topic, queue_id, f.name, f.generation)
            seg = self._segments.get(key)
            if seg is None:
                seg = TierSegment(f, *self._files(topic, queue_id, f))
                self._segments[key] = seg
            out.append(seg)
        return tuple(out)

    # -- upload ---------------------------------------------------------------------------------

    def _put(self, segment: FileSegment, data: memoryview) -> None:
        if segment.get_size():
            segment.truncate(0)  # a crashed upload's leftover under a name no manifest has
            segment.init_position(0)
        for at in range(0, len(data), UPLOAD_CHUNK):
            result = segment.append(data[at : at + UPLOAD_CHUNK], 0)
            if result is not AppendResult.SUCCESS:
                raise TierIOError(f"tier file {segment.path}: append {result.value}")
            if not segment.commit():
                raise TierIOError(f"tier file {segment.path}: upload failed (see the log)")

    def upload(self, clog: CompactionLog) -> bool:
        """Make the tier hold the queue's sealed files (the caller holds ``clog.compacting``);
        True if the manifest changed."""
        if self.read_only:
            return False
        topic, queue_id = clog.topic, clog.queue_id
        old = self.entry(topic, queue_id)
        held = {f.name: f for f in old.files} if old is not None else {}
        generation = self.manifest.generation + 1
        files = [seg.entry for seg in clog.tier_only()]
        fresh = 0
        local = [s for s in clog.segments if s.sealed and s.units]
        for seg in local:
            if not seg.hold():
                return False  # swapped out under us: the next pass uploads the new set
            try:
                crc = segment_crc(seg)
                ts = seg.units_array()["store_timestamp"]
                f = held.get(seg.name)
                if f is None or f.crc != crc or f.units != seg.units:
                    f = TierFile(seg.name, generation, seg.units, seg.first_offset,
                                 seg.last_offset, seg.log_bytes, crc, int(ts.min()),
                                 int(ts.max()))
                    log_file, cq_file = self._files(topic, queue_id, f)
                    self._put(log_file, seg.log.buffer[: seg.log_bytes])
                    self._put(cq_file, seg.cq.buffer[: seg.units * bcq.UNIT_SIZE])
                    fresh += 1
                files.append(f)
            finally:
                seg.release()
        files.sort(key=lambda f: f.first_offset)
        if old is not None and fresh == 0 and [f.name for f in files] == \
                [f.name for f in old.files] and old.next_offset >= clog.next_offset:
            return False
        swap.step("tier-files-uploaded")
        entry = QueueEntry(topic, queue_id, max(clog.next_offset, clog.state.next_offset),
                           tuple(files), clog.state)
        with self._lock:
            manifest = self.manifest.with_queue(entry)
            manifest = TierManifest(max(manifest.generation, generation), manifest.queues)
            self.docs.write(MANIFEST_NAME, manifest.to_bytes())
            self.manifest = manifest
        swap.step("tier-manifest-written")
        self.sweep(topic, queue_id)
        log.info("tier holds %d compacted files of %s:%d (%d uploaded), generation %d",
                 len(files), topic, queue_id, fresh, manifest.generation)
        return True

    def sweep(self, topic: str, queue_id: int) -> None:
        """Delete the queue's tier files the manifest does not name (replaced by a later
        upload, or left by one a crash stopped before its manifest)."""
        entry = self.entry(topic, queue_id)
        keep = {(f.generation, f.name) for f in entry.files} if entry else set()
        generations = {g for g, _ in keep}
        base = self._queue_dir(topic, queue_id)
        for gen_name in self._listing.names(base):
            gen = parse_segment_name(gen_name)
            if gen is None:
                continue
            if gen not in generations:
                self._listing.remove(f"{base}/{gen_name}")
                continue
            for kind in (FileSegmentType.COMMIT_LOG, FileSegmentType.CONSUME_QUEUE):
                for name in self._listing.names(f"{base}/{gen_name}/{kind.name}"):
                    offset = file_name_to_offset(name)
                    if offset is not None and (gen, segment_name(offset)) not in keep:
                        self._listing.remove(f"{base}/{gen_name}/{kind.name}/{name}")
        self._segments = {k: v for k, v in self._segments.items()
                          if k[:2] != (topic, queue_id) or (k[3], k[2]) in keep}

    def destroy_topic(self, topic: str) -> None:
        if self.read_only:
            return
        with self._lock:
            doomed = [k for k in self.manifest.queues if k[0] == topic]
            if not doomed:
                return
            manifest = self.manifest.without_topic(topic)
            self.docs.write(MANIFEST_NAME, manifest.to_bytes())
            self.manifest = manifest
        for _t, queue_id in doomed:
            self._listing.remove(self._queue_dir(topic, queue_id))

    def status_columns(self, compaction: CompactionStore, topic: str,
                       queue_id: int) -> dict[str, Any] | None:
        """The tier columns of ``tier status`` for a compaction queue (None for other topics):
        what the manifest holds of it. ``tier_committed_offset`` is past the last compacted
        file in the tier (the file being written is uploaded once sealed, so it is not
        counted as held); ``lag_messages`` / ``lag_bytes`` are the queue offsets and local
        CompactionLog bytes the tier does not hold yet: at most about one file plus one
        scheduler pass, never the raw stream (which the tier uploader skips)."""
        if compaction.policies.policy(topic) is None:
            return None
        entry = self.entry(topic, queue_id)
        files = entry.files if entry is not None else ()
        clog = next((c for c in compaction.queues(topic) if c.queue_id == queue_id), None)
        held = {(f.name, f.units) for f in files}
        committed = files[-1].last_offset + 1 if files else None
        local_next = clog.next_offset if clog is not None else 0
        return {
            "tier_min_offset": files[0].first_offset if files else None,
            "tier_max_offset": committed, "tier_committed_offset": committed,
            "tier_bytes": sum(f.log_bytes + f.units * bcq.UNIT_SIZE for f in files),
            "lag_messages": max(0, local_next - (committed or 0)),
            "lag_bytes": 0 if clog is None else sum(
                s.log_bytes for s in clog.segments if s.units and (s.name, s.units) not in held),
        }

    # -- local retention and restore -----------------------------------------------------------

    def release_local(self, clog: CompactionLog, now_ms: int | None = None) -> int:
        """Delete the local sealed files the tier holds byte for byte and whose newest message
        is older than ``fileReservedTime`` (oldest first, stopping at the first that does not
        qualify, so what stays local is a suffix); the number deleted."""
        entry = self.entry(clog.topic, clog.queue_id)
        if entry is None or self.read_only:
            return 0
        now = int(time.time() * 1000) if now_ms is None else now_ms
        held = {f.name: f for f in entry.files}
        doomed: list[Segment] = []
        for seg in clog.segments:
            f = held.get(seg.name)
            if not seg.sealed or not seg.units or f is None or seg is clog.segments[-1]:
                break
            if not seg.hold():
                break
            try:
                same = f.crc == segment_crc(seg) and f.units == seg.units
                newest = int(seg.units_array()["store_timestamp"].max())
            finally:
                seg.release()
            if not same or newest + self.reserved_ms > now:
                break
            doomed.append(seg)
        if not doomed:
            return 0
        state = clog.state
        floor = max(state.tier_floor, doomed[-1].last_offset + 1)
        new_state = type(state)(state.cleaned_to, max(state.next_offset, clog.next_offset),
                                state.expired_below, list(state.rounds), state.last_round,
                                floor)
        manifest = SwapManifest([s.name for s in doomed], [], new_state)
        manifest.write(clog.paths.manifest)
        clog.swap_in(doomed, manifest, self.tier_segments(clog.topic, clog.queue_id, floor))
        log.info("compaction queue %s:%d: %d local files deleted, the tier holds them "
                 "(offsets below %d)", clog.topic, clog.queue_id, len(doomed), floor)
        return len(doomed)

    def restore(self, clog: CompactionLog) -> int:
        """Download the released files back into the queue (a round needs every key locally);
        the number restored. A crash leaves them released or restored, whole."""
        tier_only = clog.tier_only()
        if not tier_only:
            return 0
        paths = clog.paths
        swap.discard_output(paths)
        for directory in (paths.new_log_dir, paths.new_cq_dir):
            directory.mkdir(parents=True, exist_ok=True)
        try:
            for tseg in tier_only:
                data, units = verified(tseg)
                seg = Segment.create(paths.new_log_file(tseg.start),
                                     paths.new_cq_file(tseg.start), clog.log_size, clog.cq_size)
                try:
                    seg.append_run(data, units.copy())
                    seg.seal()
                    seg.flush()
                finally:
                    seg.close()
            fsync_directory(paths.new_log_dir)
            fsync_directory(paths.new_cq_dir)
        except BaseException:
            swap.discard_output(paths)
            raise
        state = clog.state
        new_state = type(state)(state.cleaned_to, state.next_offset, state.expired_below,
                                list(state.rounds), state.last_round, 0)
        names = [t.name for t in tier_only]
        manifest = SwapManifest(names, names, new_state)
        manifest.write(paths.manifest)
        clog.swap_in([], manifest, ())
        log.info("compaction queue %s:%d: %d files restored from the tier for a round",
                 clog.topic, clog.queue_id, len(names))
        return len(names)


def link(compaction: CompactionStore | None, tier: TieredStore | None) -> CompactionTier | None:
    """Tier ``compaction``'s topics as compacted files in ``tier`` (both plugged into one store,
    before it opens): the tier's uploader skips them and the compaction store uploads, serves
    and restores its compacted files. None (and nothing changed) unless both are there and the
    tier is posix or s3."""
    if compaction is None or tier is None or tier.factory.provider not in ("posix", "s3"):
        return None
    config = compaction.config
    if config.compaction_mapped_file_size > config.tiered_store_commit_log_max_size:
        raise InvalidSetting(
            f"compactionMappedFileSize={config.compaction_mapped_file_size} is larger than "
            f"tieredStoreCommitLogMaxSize={config.tiered_store_commit_log_max_size}: a "
            "compacted file must fit one tier file")
    cq_size = bcq.cq_file_size(config.compaction_cq_mapped_file_size)
    if cq_size > config.tiered_store_consume_queue_max_size:
        raise InvalidSetting(
            f"compactionCqMappedFileSize={cq_size} is larger than "
            f"tieredStoreConsumeQueueMaxSize={config.tiered_store_consume_queue_max_size}: a "
            "batch ConsumeQueue file must fit one tier file")
    ctier = CompactionTier(tier, reserved_ms=config.file_reserved_time * 3600 * 1000)
    try:
        ctier.load()
    except (TierManifestError, OSError) as exc:
        raise TierIOError(f"compaction tier manifest: {exc}") from exc
    if not ctier.read_only:
        # Files a crash left behind an upload (before or after its manifest) go now: the
        # manifest's queues, and the local ones, whose first-ever upload a crash may have
        # stopped before any manifest named the queue.
        local = {(t, q) for t, q in compaction.layout.queues_on_disk()
                 if compaction.policies.policy(t) is not None}
        for topic, queue_id in sorted(set(ctier.manifest.queues) | local):
            try:
                ctier.sweep(topic, queue_id)
            except OSError as exc:
                log.warning("compaction tier: cannot sweep %s:%d: %s", topic, queue_id, exc)
    compaction.tier = ctier
    tier.held_elsewhere = lambda topic, queue_id: ctier.status_columns(compaction, topic,
                                                                       queue_id)
    if tier.uploader is not None:
        tier.uploader.skip_topic = lambda topic: compaction.policies.policy(topic) is not None
    return ctier

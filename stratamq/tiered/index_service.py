"""``IndexStoreService``: the tier's index by key and unique id (RocketMQ's
``tieredstore/index/IndexStoreService``), over files in three states:

* UNSEALED: the newest local file, ``<store>/tiered_index_file/<begin timestamp>``, written
  as records are uploaded (one item per KEYS word and per UNIQ_KEY, pointing into the queue's
  tier CommitLog);
* SEALED: a full local file waiting for upload; it is re-laid out
  (``index_file.compact``, written under ``tiered_index_file/compacting/``) so that a slot's
  items are contiguous;
* UPLOAD: that re-laid-out file in the tier, one segment of the broker's INDEX file
  (``<cluster>/<broker>/rmq_sys_INDEX/0/INDEX/...``). A lookup reads the slot (from a cached
  slot table once one was loaded, else one 8-byte ranged read) and then the slot's items in
  one ranged read.

A query asks every file whose time range overlaps the one asked, newest first, and returns the
items (topic id, queue id, tier CommitLog offset and size) for the caller to read.

Threads: the uploader calls ``put_key`` and ``flush``; ``run_once`` (the uploader's service
thread) uploads one sealed file and drops expired ones; queries from any reading thread. One
lock guards the file lists; uploads of sealed files do their I/O outside it.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from stratamq.store.index_file import build_key, key_hashes, topic_key_hash
from stratamq.tiered.drivers import FileSegment, FileSegmentFactory, TierIOError
from stratamq.tiered.flat_file import FlatAppendFile
from stratamq.tiered.index_file import (
    HEADER_SIZE,
    SLOT,
    SLOT_SIZE,
    IndexItem,
    UnsealedIndexFile,
    compact,
    query_sealed,
    sealed_geometry,
    slot_position,
)
from stratamq.tiered.metadata import MetadataStore
from stratamq.tiered.naming import (
    FILE_COMPACTED_DIRECTORY_NAME,
    FILE_DIRECTORY_NAME,
    FileSegmentType,
    index_file_path,
)

__all__ = ["IndexStoreService", "UploadedIndexFile"]

log = logging.getLogger(__name__)

SLOT_CACHE_BYTES = 64 * 1024 * 1024  # slot tables of uploaded files kept in memory, in all


class UploadedIndexFile:
    """A SEALED file in the tier (one INDEX segment). Geometry is read from its header on
    first use; ``reads`` counts the ranged reads lookups made (for the benchmark)."""

    def __init__(self, segment: FileSegment, service: IndexStoreService) -> None:
        self.segment = segment
        self.service = service
        self.begin_timestamp = -1
        self.slots = 0
        self._lock = threading.Lock()

    @property
    def min_timestamp(self) -> int:
        return self.segment.min_timestamp

    @property
    def max_timestamp(self) -> int:
        return self.segment.max_timestamp

    def _geometry(self) -> None:
        if self.slots:
            return
        with self._lock:
            if not self.slots:
                header = self.segment.read(0, HEADER_SIZE)
                self.service.reads += 1
                begin, _end, slots, _items = sealed_geometry(header, self.segment.commit_position)
                self.begin_timestamp, self.slots = begin, slots

    def query(self, h: int, begin_ms: int, end_ms: int, max_count: int) -> list[IndexItem]:
        self._geometry()
        table = self.service.slot_table(self)
        slot = h % self.slots
        if table is not None:
            position, length = SLOT.unpack_from(table, slot * SLOT_SIZE)
        else:
            position, length = SLOT.unpack(self.segment.read(slot_position(slot), SLOT_SIZE))
            self.service.reads += 1
        if length <= 0 or position <= 0:
            return []
        items = self.segment.read(position, length)
        self.service.reads += 1
        return query_sealed(items, h, self.begin_timestamp, begin_ms, end_ms, max_count)


class IndexStoreService:
    """The tier index of one broker (see the module docstring)."""

    def __init__(self, store_root: Path, factory: FileSegmentFactory, metadata: MetadataStore,
                 broker: str, max_hash_slot_num: int, max_index_num: int, *,
                 read_only: bool = False, slot_cache_bytes: int = SLOT_CACHE_BYTES) -> None:
        self.dir = Path(store_root) / FILE_DIRECTORY_NAME
        self.slots = max_hash_slot_num
        self.max_items = max_index_num
        self.read_only = read_only
        self.metadata = metadata
        self.flat = FlatAppendFile(factory, metadata, FileSegmentType.INDEX,
                                   index_file_path(broker))
        self._lock = threading.RLock()
        # One upload of a sealed file at a time, whoever asks (the scheduler, any number of
        # ``tier flush`` calls): two would both take the oldest file, upload it twice and
        # both try to forget it.
        self._upload_lock = threading.Lock()
        self.unsealed: list[UnsealedIndexFile] = []  # oldest first; the last is written
        self.uploaded: list[UploadedIndexFile] = []
        self._slot_cache: OrderedDict[int, bytes] = OrderedDict()  # segment base -> table
        self._slot_cache_bytes = slot_cache_bytes
        self.reads = 0
        self._cleanup: ThreadPoolExecutor | None = None  # deletes uploaded local files
        self._load()

    def _load(self) -> None:
        if not self.read_only:
            shutil.rmtree(self.dir / FILE_COMPACTED_DIRECTORY_NAME, ignore_errors=True)
            self.check_uploaded()
        self.uploaded = [UploadedIndexFile(s, self) for s in self.flat.segments
                         if s.commit_position]
        uploaded_begins = {u.segment.min_timestamp for u in self.uploaded}
        names = sorted((p for p in self.dir.iterdir() if p.name.isdigit()),
                       key=lambda p: int(p.name)) if self.dir.is_dir() else []
        for path in names:
            try:
                local = UnsealedIndexFile(path, self.slots, self.max_items,
                                          read_only=self.read_only)
            except (OSError, ValueError) as exc:
                log.error("tier index file %s cannot be read, set aside: %s", path, exc)
                if not self.read_only:
                    path.rename(path.with_name(path.name + ".bad"))
                continue
            if local.item_count and local.min_timestamp in uploaded_begins and \
                    not self.read_only:
                # Uploaded, then the process stopped before the local copy went.
                local.close()
                path.unlink()
                continue
            self.unsealed.append(local)

    def reload(self) -> None:
        """The metadata was replaced (a broker elected master took its group's over): the
        uploaded files as it records them now."""
        with self._lock:
            self.flat._recover()
            self.uploaded = [UploadedIndexFile(s, self) for s in self.flat.segments
                             if s.commit_position]
            self._slot_cache.clear()

    # -- writing -------------------------------------------------------------------------------

    def put_key(self, topic: str, topic_id: int, queue_id: int, keys: set[str], offset: int,
                size: int, timestamp: int) -> None:
        if not keys:
            return
        hashes = [topic_key_hash(topic, k) for k in keys]
        with self._lock:
            current = self.unsealed[-1] if self.unsealed else None
            if current is None or current.is_full(len(hashes)):
                current = self._new_file(timestamp)
            if not current.put(hashes, topic_id, queue_id, offset, size, timestamp):
                current = self._new_file(timestamp)
                if not current.put(hashes, topic_id, queue_id, offset, size, timestamp):
                    log.error("tier index: %d keys of one message do not fit an empty index "
                              "file (tieredStoreIndexFileMaxIndexNum=%d)", len(hashes),
                              self.max_items)

    def put_keys(self, topic: str, topic_id: int, queue_id: int, keys: list[str],
                 rows: np.ndarray, offsets: np.ndarray, sizes: np.ndarray,
                 times: np.ndarray) -> None:
        """``put_key`` for many messages of one queue: key ``i`` belongs to message
        ``rows[i]`` (grouped by message), whose tier CommitLog offset, size and store time are
        ``offsets``, ``sizes`` and ``times`` at that row. Keys are hashed in one pass and
        added a file's worth at a time (``put_many``); a message's keys never straddle two
        files."""
        if not keys:
            return
        hashes = np.array(key_hashes([build_key(topic, k) for k in keys]), dtype=np.int64)
        offsets, sizes, times = offsets[rows], sizes[rows], times[rows]
        with self._lock:
            current = self.unsealed[-1] if self.unsealed else None
            done = 0
            while done < len(keys):
                take = min(len(keys) - done, current.room() if current is not None else 0)
                if take < len(keys) - done:  # cut at a message's first key
                    while take > 0 and rows[done + take] == rows[done + take - 1]:
                        take -= 1
                if take == 0:
                    if current is not None and current.item_count == 0:
                        count = int((rows == rows[done]).sum())
                        log.error("tier index: %d keys of one message do not fit an empty "
                                  "index file (tieredStoreIndexFileMaxIndexNum=%d)", count,
                                  self.max_items)
                        done += count
                        continue
                    if current is not None:
                        current.write_header()
                    current = self._new_file(int(times[done]))
                    continue
                assert current is not None
                stop = done + take
                current.put_many(hashes[done:stop], topic_id, queue_id, offsets[done:stop],
                                 sizes[done:stop], times[done:stop])
                done = stop
            if current is not None:
                current.write_header()

    def _new_file(self, timestamp: int) -> UnsealedIndexFile:
        taken = {int(f.path.name) for f in self.unsealed}
        name = max(timestamp, max(taken, default=0) + 1)
        created = UnsealedIndexFile(self.dir / str(name), self.slots, self.max_items,
                                    begin_timestamp=timestamp)
        self.unsealed.append(created)
        log.info("tier index: new file %s", created.path)
        return created

    def flush(self) -> None:
        with self._lock:
            for local in self.unsealed:
                local.flush()

    def seal_current(self) -> None:
        """Seal the file being written (so ``upload_sealed`` takes it), whatever it holds."""
        with self._lock:
            if self.unsealed and self.unsealed[-1].item_count:
                current = self.unsealed[-1]
                self._new_file(current.max_timestamp)

    def seal_idle(self, now_ms: int, idle_ms: int) -> bool:
        """RocketMQ's rolling rule besides a full file: seal the file being written when it
        holds items and took none for ``idle_ms`` (``tieredStoreIndexFileRollingIdleInterval``).
        Never per flush: a sealed file is its whole slot table whatever it holds (about 40 MB
        at the default geometry), so sealing on demand made the tier grow by that per call."""
        with self._lock:
            current = self.unsealed[-1] if self.unsealed else None
            if current is None or not current.item_count or \
                    now_ms - current.end_timestamp <= idle_ms:
                return False
            self._new_file(current.max_timestamp)
            return True

    def upload_sealed(self, record: Callable[[], None] | None = None) -> bool:
        """Compact and upload the oldest sealed file (every local file but the last); True when
        one went; raises TierIOError when the upload failed (retried by the next call).
        ``record`` writes the metadata before the upload (default: the metadata
        store's ``persist``; the uploader passes its own, so that one write carries its
        progress too); the uploaded size needs no write of its own (a start takes it from the
        tier), so it goes with the next one."""
        with self._upload_lock:
            return self._upload_oldest(record)

    def _upload_oldest(self, record: Callable[[], None] | None) -> bool:
        with self._lock:
            if len(self.unsealed) < 2:
                return False
            local = self.unsealed[0]
        if not local.item_count:
            self._drop_local(local)
            return True
        data = compact(local)
        compacting = self.dir / FILE_COMPACTED_DIRECTORY_NAME / local.path.name
        compacting.parent.mkdir(parents=True, exist_ok=True)
        compacting.write_bytes(data)  # the SEALED state on disk, as RocketMQ keeps it
        flat = self.flat
        with flat.lock:
            last = flat.segments[-1] if flat.segments else None
            if last is not None and last.needs_commit():
                segment = last  # a failed upload of this file, retried
            else:
                segment = self._next_segment(last)
                # Recorded with the local file's time range before a byte is uploaded: after a
                # crash past the upload, the start finds the size in the tier
                # (``check_uploaded``) and knows the local file by its begin time, so the
                # size needs no write of its own here (the caller's next persist has it).
                segment.min_timestamp = local.min_timestamp
                segment.max_timestamp = local.max_timestamp
                flat.flush_segment_meta(segment)
                (record or self.metadata.persist)()
                segment.append(data, local.begin_timestamp)
            segment.min_timestamp = local.min_timestamp
            segment.max_timestamp = local.max_timestamp
            if not flat.commit(defer_meta=True):
                raise TierIOError(f"tier index: upload of {local.path} failed (retried "
                                  f"later): {segment.last_error or 'another upload was running'}")
        with self._lock:
            self.uploaded.append(UploadedIndexFile(segment, self))
            self._drop_local(local, compacting, later=True)
        log.info("tier index: %s uploaded as %s (%d items)", local.path.name, segment.path,
                 local.item_count)
        return True

    def _next_segment(self, last: FileSegment | None) -> FileSegment:
        """The INDEX segment the next sealed file goes to (under the flat file's lock), not
        yet persisted: the caller records its time range and persists before uploading."""
        if last is not None and last.append_position == 0:
            size = last.get_size()
            if not size:
                return last  # rolled (and recorded) before a stop, never written
            # Uploaded before a crash and its size unknown at the start (the tier was not
            # reachable then): kept as it is, the next file goes after it.
            last.init_position(size)
            self.flat.flush_segment_meta(last)
            with self._lock:
                self.uploaded.append(UploadedIndexFile(last, self))
        return self.flat.roll(self.flat.append_offset, persist=False)

    def _drop_local(self, local: UnsealedIndexFile, *scratch: Path, later: bool = False) -> None:
        """Forget a local file (empty, or uploaded) and delete it and ``scratch`` files.
        ``later``: on the clean-up thread, off the upload's path (an unlink can take tens of
        milliseconds on a busy disk); a start deletes a copy a stop left behind, recognised
        by its time range."""
        with self._lock:
            self.unsealed.remove(local)
            if later and self._cleanup is None:
                self._cleanup = ThreadPoolExecutor(1, thread_name_prefix="tier-index-cleanup")
            cleanup = self._cleanup if later else None
        if cleanup is not None:
            cleanup.submit(self._delete_local, local, *scratch)
        else:
            self._delete_local(local, *scratch)

    def _delete_local(self, local: UnsealedIndexFile, *scratch: Path) -> None:
        try:
            with self._lock:  # a query checks ``map.closed`` under it
                local.close()
            for path in (local.path, *scratch):
                path.unlink(missing_ok=True)
        except OSError as exc:  # left for the next start to delete
            log.warning("tier index: local file %s not deleted: %s", local.path, exc)

    def destroy_expired(self, expire_timestamp: int) -> int:
        gone = self.flat.destroy_expired(expire_timestamp)
        if gone:
            bases = {s.base_offset for s in gone}
            with self._lock:
                self.uploaded = [u for u in self.uploaded if u.segment.base_offset not in bases]
                for base in bases:
                    self._slot_cache.pop(base, None)
        return len(gone)

    # -- reading -------------------------------------------------------------------------------

    def slot_table(self, uploaded: UploadedIndexFile) -> bytes | None:
        """The file's whole slot table, loaded by one read the first time (kept while the
        tables fit ``slot_cache_bytes``), or None when it is too large to keep."""
        key = uploaded.segment.base_offset
        with self._lock:
            table = self._slot_cache.get(key)
            if table is not None:
                self._slot_cache.move_to_end(key)
                return table
        size = uploaded.slots * SLOT_SIZE
        if size > self._slot_cache_bytes:
            return None
        table = uploaded.segment.read(HEADER_SIZE, size)
        self.reads += 1
        with self._lock:
            self._slot_cache[key] = table
            while sum(len(t) for t in self._slot_cache.values()) > self._slot_cache_bytes:
                self._slot_cache.popitem(last=False)
        return table

    def query(self, topic: str, key: str, max_count: int, begin_ms: int,
              end_ms: int) -> list[IndexItem]:
        """Items for ``topic#key`` stored in [begin_ms, end_ms] (to the second), newest file
        first, each (topic, queue, offset) once."""
        if begin_ms > end_ms or max_count <= 0:
            return []
        h = topic_key_hash(topic, key)
        with self._lock:
            local = list(self.unsealed)
            uploaded = list(self.uploaded)
        found: dict[tuple[int, int, int], IndexItem] = {}
        for f in reversed(local):
            if f.item_count and f.min_timestamp <= end_ms + 1000 and \
                    f.max_timestamp >= begin_ms - 1000:
                with self._lock:
                    if f.map.closed:
                        continue
                    hits = f.query(h, begin_ms - 1000, end_ms, max_count)
                for item in hits:
                    found.setdefault((item.topic_id, item.queue_id, item.offset), item)
        for u in reversed(uploaded):
            if len(found) >= max_count:
                break
            if u.min_timestamp > end_ms + 1000 or u.max_timestamp < begin_ms - 1000:
                continue
            try:
                hits = u.query(h, begin_ms - 1000, end_ms, max_count)
            except (OSError, ValueError) as exc:
                log.warning("tier index file %s cannot be read: %s", u.segment.path, exc)
                continue
            for item in hits:
                found.setdefault((item.topic_id, item.queue_id, item.offset), item)
        return list(found.values())[:max_count]

    def states(self) -> dict[str, int]:
        with self._lock:
            return {"unsealed": 1 if self.unsealed else 0,
                    "sealed": max(0, len(self.unsealed) - 1),
                    "uploaded": len(self.uploaded)}

    def close(self) -> None:
        if self._cleanup is not None:
            self._cleanup.shutdown(wait=True)
        with self._lock:
            for local in self.unsealed:
                local.close()

    def check_uploaded(self) -> None:
        """Make the INDEX file's last segment size the tier's (after a crash)."""
        try:
            self.flat.check_last_size()
        except TierIOError as exc:
            log.warning("tier index: cannot check the last uploaded file: %s", exc)

"""``IndexService``: the index dispatcher and query side over the files in ``<root>/index/``.

Every dispatched record gets one entry per key: its unique client id (``UNIQ_KEY``) first, then
each space-separated word of ``KEYS``, all as ``topic#key`` (RocketMQ's order and form). Files
roll over when full; a new one is named by its creation time. Format:
``docs/formats/index-file.md``.

Threads: ``dispatch`` and ``commit_dispatch`` run on the dispatcher thread only (or the opening
thread during replay; ``close`` after the dispatcher stopped);
``flush`` on the ConsumeQueue flush thread; ``query_offsets`` on any thread;
``delete_expired_files`` on the clean-up thread. The file list is replaced, never changed in
place, so readers iterate a consistent snapshot; each file is held while it is read.

Crash safety: ``load`` trusts an index file only if it is intact and, after a crash, if its
header ends no later than the checkpoint's index timestamp (what the last flush covered).
Untrusted files are deleted and ``replay_from`` says where to re-dispatch the CommitLog from.
Re-dispatching a record that is already indexed adds nothing (see ``dispatch``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from stratamq.record import DispatchInfo, Prop, SysFlag
from stratamq.store.index_file import (
    HASH_BATCH_MIN,
    KEY_SEPARATOR,
    IndexFile,
    IndexFileError,
    file_name_for,
    file_size,
    is_index_file_name,
    key_hashes,
    topic_key_hash,
)
from stratamq.store.index_geometry import infer_geometry

log = logging.getLogger(__name__)

class UnconfirmedGeometry(IndexFileError):
    """No (maxHashSlotNum, maxIndexNum) fits an index file's size and its entries."""


# Appended to an index file whose geometry could not be confirmed: kept, no longer loaded.
UNCONFIRMED_SUFFIX = ".unconfirmed-geometry"

# Keys queued before they are hashed and written regardless of the round's end: enough that
# numpy hashing pays off, few enough to bound memory during a long replay.
PENDING_MAX = 1024
_TRANSACTION_MASK = SysFlag.TRANSACTION_MASK
_ROLLBACK = SysFlag.TRANSACTION_ROLLBACK_TYPE
_UNIQ_KEY = Prop.UNIQ_KEY
_KEYS = Prop.KEYS


def record_keys(info: DispatchInfo) -> list[str]:
    """The keys RocketMQ indexes for a record, in its order: UNIQ_KEY, then each KEYS word."""
    props = info.properties
    out: list[str] = []
    uniq = props.get(Prop.UNIQ_KEY)
    if uniq:
        out.append(uniq)
    keys = props.get(Prop.KEYS)
    if keys:
        out.extend(k for k in keys.split(" ") if k)
    return out


class IndexService:
    """The index files of one store, oldest first."""

    def __init__(self, directory: Path, hash_slot_num: int, index_num: int, *,
                 read_only: bool = False) -> None:
        self.directory = directory
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.read_only = read_only
        self._files: list[IndexFile] = []
        self._lock = threading.Lock()  # replacing the list (roll-over, deletion)
        # Where re-indexing from the CommitLog must start after load (None: nothing to redo).
        self.replay_from: int | None = None
        self.dropped: list[tuple[str, str]] = []  # (file name, why) untrusted on load
        self.set_aside: list[str] = []  # files of an unconfirmed geometry, renamed (kept)
        self.failed_keys = 0  # keys not indexed because writing failed (disk full...)
        self.error: BaseException | None = None
        # Keys dispatched but not yet written, flat, one element per key in RocketMQ's order
        # (a record's UNIQ_KEY, then each KEYS word): its topic, the key, its record's
        # CommitLog offset and store time. Flat because most records carry one key (their
        # message id): a tuple or a list per record cost more than the key's entry.
        self._topics: list[str] = []
        self._keys: list[str] = []
        self._offsets: list[int] = []
        self._stamps: list[int] = []
        # The newest CommitLog offset indexed: records after it need no duplicate check.
        self._indexed_to = -1

    # -- loading --------------------------------------------------------------------------------

    def load(self, abnormal: bool = False, checkpoint_index_timestamp: int = 0) -> None:
        """Map every index file; drop the untrusted ones (read-write) and note ``replay_from``.

        A damaged file, and after a crash a file that ends past the checkpoint's index time,
        is deleted together with every newer file; the CommitLog is then re-indexed from the
        end of the last trusted file. A read-only load never deletes: it skips what it can't
        trust.
        """
        if not self.directory.is_dir():
            return
        paths = sorted(p for p in self.directory.iterdir()
                       if p.is_file() and is_index_file_name(p.name))
        kept: list[IndexFile] = []
        untrusted_from: int | None = None
        configured = (self.hash_slot_num, self.index_num)
        for i, path in enumerate(paths):
            unconfirmed = False
            try:
                geometry = configured
                if path.stat().st_size != file_size(*configured):
                    # Written with other settings (or by a stock RocketMQ): as valid as any.
                    found = infer_geometry(path, (configured,))
                    if found is None:
                        raise UnconfirmedGeometry(f"{path}: its size fits no geometry its entries "
                                             "confirm")
                    geometry = found
                opened = IndexFile(path, *geometry, read_only=self.read_only)
            except (OSError, ValueError) as exc:
                why: str | None = str(exc)
                f: IndexFile | None = None
                unconfirmed = isinstance(exc, UnconfirmedGeometry)
            else:
                f = opened
                why = opened.damage()
                # A read-only reader (e.g. `store query` beside a running broker, whose `abort`
                # marker is present) cannot rebuild, and every hit is checked against its
                # message anyway: only structural damage makes it skip a file.
                if (why is None and abnormal and not self.read_only
                        and opened.end_timestamp > checkpoint_index_timestamp):
                    why = (f"ends at {opened.end_timestamp}, after the checkpoint's index time "
                           f"{checkpoint_index_timestamp}")
            if why is None and f is not None:
                kept.append(f)
                continue
            why = why or "unreadable"
            self.dropped.append((path.name, why))
            if self.read_only:
                log.warning("index file %s skipped: %s", path.name, why)
                if f is not None:
                    f.close()
                continue
            log.warning("index file %s untrusted, rebuilding from the CommitLog: %s",
                        path.name, why)
            if untrusted_from is None:
                untrusted_from = i
                if f is not None and f.damage() is None and f.entries:
                    self.replay_from = f.begin_phy_offset
            if f is not None:
                f.destroy()
            elif unconfirmed:
                # Never delete a file only because its geometry is unknown: set it aside
                # (no longer an index file name) and re-index what it covered.
                path.rename(path.with_name(path.name + UNCONFIRMED_SUFFIX))
                self.set_aside.append(path.name + UNCONFIRMED_SUFFIX)
            else:
                path.unlink(missing_ok=True)
        if untrusted_from is not None:
            # Files after an untrusted one would break newest-first order once it is rebuilt.
            for f in kept[:]:
                if f.name > paths[untrusted_from].name:
                    self.dropped.append((f.name, "newer than an untrusted file"))
                    kept.remove(f)
                    f.destroy()
            if kept:
                self.replay_from = kept[-1].end_phy_offset
            elif self.replay_from is None:
                self.replay_from = 0  # unknown: the whole CommitLog
        elif abnormal and kept and not self.read_only:
            # Trusted files still may lack records after their end; re-dispatch is idempotent.
            self.replay_from = kept[-1].end_phy_offset
        self._files = kept
        self._indexed_to = max((f.end_phy_offset for f in kept if f.entries), default=-1)

    # -- the dispatcher interface ---------------------------------------------------------------

    def dispatch(self, info: DispatchInfo) -> None:
        """Queue the record's keys; they are written at the end of the dispatch round
        (``commit_dispatch``), or sooner once ``PENDING_MAX`` keys wait, so that their
        hashes are computed in one batch. Readers meet the entries by then at the latest:
        the dispatcher commits a round before it counts its records as visible."""
        self.dispatch_batch([info], _never_fails)

    def dispatch_batch(self, infos: list[DispatchInfo],
                       failed: Callable[[DispatchInfo, OSError], None]) -> None:
        """``dispatch`` of each record in order (a dispatch round's run). Nothing is written
        here (``commit_dispatch`` writes), so ``failed`` is never called."""
        topics, keys, offsets, stamps = self._topics, self._keys, self._offsets, self._stamps
        for info in infos:
            if info.sys_flag & _TRANSACTION_MASK == _ROLLBACK:
                continue  # RocketMQ indexes normal, prepared and committed records, not rollbacks
            props = info.properties
            uniq = props.get(_UNIQ_KEY)
            words = props.get(_KEYS)
            if uniq:
                topics.append(info.topic)
                keys.append(uniq)
                offsets.append(info.physical_offset)
                stamps.append(info.store_timestamp)
            if words:
                for word in words.split(" ") if " " in words else (words,):
                    if word:
                        topics.append(info.topic)
                        keys.append(word)
                        offsets.append(info.physical_offset)
                        stamps.append(info.store_timestamp)
        if len(keys) >= PENDING_MAX:
            self.commit_dispatch()

    def commit_dispatch(self) -> None:
        """Write the queued keys' entries (the dispatcher thread, end of each round)."""
        keys = self._keys
        if not keys:
            return
        topics, offsets, stamps = self._topics, self._offsets, self._stamps
        self._topics, self._keys, self._offsets, self._stamps = [], [], [], []
        if len(keys) >= HASH_BATCH_MIN:  # numpy, over every character of the round at once
            hashes = key_hashes([topic + KEY_SEPARATOR + k for topic, k in zip(topics, keys)])
        else:  # the topic's part of the hash is cached: only the key's characters are hashed
            hashes = [topic_key_hash(topic, k) for topic, k in zip(topics, keys)]
        if offsets[0] > self._indexed_to and self._put_round(hashes, offsets, stamps):
            return
        at, n = 0, len(offsets)
        while at < n:  # record by record: this record's keys are those sharing its offset
            phys = offsets[at]
            stop = at + 1
            while stop < n and offsets[stop] == phys:
                stop += 1
            try:
                self._index(phys, stamps[at], hashes[at:stop])
            except OSError as exc:
                # The index is derived data and can be rebuilt from the CommitLog; failing
                # here must not stop ConsumeQueue dispatch (and so consumption) too.
                self.failed_keys += stop - at
                if self.error is None:
                    log.error("indexing stopped working at offset %d: %s", phys, exc)
                self.error = exc
            at = stop

    def _put_round(self, hashes: list[int], offsets: list[int], stamps: list[int]) -> bool:
        """The round's new records into the newest file in one call (``put_records``: the
        bytes of one ``put_keys`` per record, a fraction of the calls). False when they do
        not all fit, or a write failed: the caller then goes record by record (rolling over,
        skipping what was written here, counting what fails)."""
        try:
            f = self._writable_file()
            if not f.put_records(hashes, offsets, stamps):
                return False
        except OSError:
            if self._files and self._files[-1].entries:
                self._indexed_to = max(self._indexed_to, self._files[-1].end_phy_offset)
            return False
        self._indexed_to = offsets[-1]
        self.error = None
        return True

    def _index(self, phys: int, ts: int, hashes: list[int]) -> None:
        if phys <= self._indexed_to:
            # RocketMQ's guard: a record below the newest file's end offset is indexed already
            # (a replay after recovery). The newest record itself may have had only some keys
            # written before a crash, possibly across a roll-over: add just the missing ones.
            holders: list[IndexFile] = []
            for g in reversed(self._files):
                if not g.entries:
                    continue
                if phys < g.end_phy_offset:
                    return
                if phys > g.end_phy_offset:
                    break
                holders.append(g)
                if g.begin_phy_offset != phys:
                    break
            if holders:
                hashes = [h for h in hashes if not any(g.contains(h, phys) for g in holders)]
                if not hashes:
                    return
        f = self._writable_file()
        done = f.put_keys(hashes, phys, ts)
        while done < len(hashes):
            f = self._roll(f)
            added = f.put_keys(hashes[done:], phys, ts)
            if not added:
                raise IndexFileError(f"a new index file {f.name} refused an entry")
            done += added
        self._indexed_to = phys
        self.error = None

    def _writable_file(self) -> IndexFile:
        files = self._files
        if files and not files[-1].is_full():
            return files[-1]
        return self._roll(files[-1] if files else None)

    def _roll(self, previous: IndexFile | None) -> IndexFile:
        """Start a new file where ``previous`` ended; make the full one durable."""
        if self.read_only:
            raise IndexFileError("index is open read-only")
        self.directory.mkdir(parents=True, exist_ok=True)
        now = int(time.time() * 1000)
        name = file_name_for(now)
        # Names sort as creation order; never reuse or go back (clock steps, fast roll-overs).
        while (previous is not None and name <= previous.name) or (self.directory / name).exists():
            now += 1
            name = file_name_for(now)
        f = IndexFile(
            self.directory / name, self.hash_slot_num, self.index_num, create=True,
            begin_phy_offset=previous.end_phy_offset if previous else 0,
            begin_timestamp=previous.end_timestamp if previous else 0,
        )
        with self._lock:
            self._files = [*self._files, f]
        if previous is not None:
            previous.flush()
        return f

    # -- flushing -------------------------------------------------------------------------------

    def flush(self) -> int:
        """Make every entry durable; return the store time of the newest entry so covered (for
        the checkpoint's index timestamp), 0 if there is none."""
        files = self._files
        if not files:
            return 0
        covered = files[-1].end_timestamp  # sampled before flushing: entries up to it are in
        for f in files:
            f.flush()
        return covered

    # -- queries --------------------------------------------------------------------------------

    def query_offsets(self, topic: str, key: str, begin: int = 0,
                      end: int = 2**63 - 1) -> Iterator[int]:
        """CommitLog offsets of records indexed under ``topic#key`` whose entry time lies in
        [begin, end], newest first, across files (candidates: hashes collide, so check the
        record). Entry times are whole seconds after the file's begin time, rounded down."""
        h = topic_key_hash(topic, key)
        for f in reversed(self._files):
            if f.entries and f.is_time_matched(begin, end):
                yield from f.select(h, begin, end)
            if f.begin_timestamp < begin:
                return

    def files(self) -> list[IndexFile]:
        return list(self._files)

    @property
    def max_phy_offset(self) -> int:
        files = self._files
        return files[-1].end_phy_offset if files else 0

    # -- clean-up -------------------------------------------------------------------------------

    def delete_expired_files(self, min_commitlog_offset: int,
                             interval_forcibly_ms: int = 0) -> list[Path]:
        """Delete files whose every entry points below ``min_commitlog_offset`` (the records
        are gone). The newest file is never deleted: it is the one being written."""
        with self._lock:
            files = self._files
            expired = [f for f in files[:-1] if f.end_phy_offset < min_commitlog_offset]
            if not expired:
                return []
            self._files = [f for f in files if f not in expired]
        for f in expired:
            f.destroy(interval_forcibly_ms)
            log.info("deleted index file %s (ends at offset %d, CommitLog min %d)",
                     f.name, f.end_phy_offset, min_commitlog_offset)
        return [f.path for f in expired]

    def close(self) -> None:
        self.commit_dispatch()  # the dispatcher has stopped: write what it left queued
        for f in self._files:
            f.flush()
            f.close()
        self._files = []


def _never_fails(info: DispatchInfo, exc: OSError) -> None:
    raise AssertionError("the index writes nothing while dispatching")  # pragma: no cover


__all__ = ["IndexService", "record_keys"]

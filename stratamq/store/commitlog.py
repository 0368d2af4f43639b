"""The CommitLog: every message of every topic appended to one run of mapped segments.

Contracts: ``append`` may be called from any number of threads; records are encoded outside
the writer lock and only positioned and copied under it, so the lock is held for a copy, not
for encoding. Readers on any thread use ``select`` (zero-copy, reference-counted) or ``read``.
Recovery (``stratamq.store.recovery``) sets the end before the first append.
"""

from __future__ import annotations

import errno
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from stratamq import record as codec
from stratamq.record import (
    END_FILE_MIN_BLANK_LENGTH,
    DispatchInfo,
    Host,
    Message,
    Prop,
    StoredMessage,
    SysFlag,
    tags_hash_code,
)
from stratamq.store.mapped_file import MappedFile, MappedFileError
from stratamq.store.mapped_file_queue import MappedFileQueue
from stratamq.store.results import AppendedMessage, PutMessageResult, PutMessageStatus

RECENT_DISPATCH_LIMIT = 65_536  # records


class CommitLogFull(MappedFileError):
    """No segment could be created for the next record."""


class CommitLog:
    """Appends encoded records and hands out views of stored ones.

    It is handed its segment queue, its store host and a size limit; it knows nothing about
    flushing or dispatch, which watch ``max_offset``.
    """

    def __init__(
        self,
        files: MappedFileQueue,
        store_host: Host,
        max_message_size: int,
        queue_offsets: dict[tuple[str, int], int] | None = None,
    ) -> None:
        self.files = files
        self.store_host = store_host
        self.max_message_size = max_message_size
        self.queue_offsets: dict[tuple[str, int], int] = dict(queue_offsets or {})
        self._lock = threading.Lock()
        self._last_store_timestamp = 0
        self._msg_id_prefix = codec.offset_msg_id(store_host, 0)[:-16]
        self.on_append: Callable[[], None] | None = None  # wakes the dispatcher and flusher
        # What the appender already knows about each new record, so the dispatcher need not
        # decode it again. Only a shortcut: the dispatcher checks each entry's offset against
        # the record it is at and decodes from the log whenever the two disagree (or after a
        # restart). Bounded, so a stalled dispatcher cannot make it grow without limit.
        self.recent_dispatch: deque[DispatchInfo] = deque(maxlen=RECENT_DISPATCH_LIMIT)

    # -- writing --------------------------------------------------------------------------------

    def encode(self, msg: Message) -> codec.EncodedRecord:
        record = codec.encode(msg, self.store_host, max_message_size=self.max_message_size)
        self._check_fits(len(record.data))
        return record

    def _check_fits(self, size: int) -> None:
        """Refuse a record that could not fit in a segment even with nothing else in it."""
        if size + END_FILE_MIN_BLANK_LENGTH > self.files.mapped_file_size:
            raise codec.MessageIllegal(
                f"record of {size} bytes cannot fit in a "
                f"{self.files.mapped_file_size}-byte segment"
            )

    def append(self, messages: Sequence[Message]) -> PutMessageResult:
        """Append messages in order (a batch of one is a single put).

        The messages are the caller's, lent: their ``properties`` dicts are kept (not copied)
        until dispatch, so callers must not change a Message after handing it over."""
        try:
            records = codec.encode_records(messages, self.store_host, self.max_message_size)
            if records:  # the largest record decides for the batch: one check, not one each
                self._check_fits(max([r[1] for r in records]))
        except codec.PropertiesTooLarge as exc:
            return PutMessageResult(PutMessageStatus.PROPERTIES_SIZE_EXCEEDED, error=str(exc))
        except codec.MessageIllegal as exc:
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, error=str(exc))
        if not records:
            return PutMessageResult(PutMessageStatus.MESSAGE_ILLEGAL, error="empty batch")
        if self.files.read_only:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, error="read-only")
        appended: list[AppendedMessage] = []
        failed: PutMessageResult | None = None
        with self._lock:
            # Store time never goes backwards in log order: recovery relies on it.
            now = max(int(time.time() * 1000), self._last_store_timestamp)
            self._last_store_timestamp = now
            try:
                self._append_locked(messages, records, now, appended)
            except OSError as exc:
                # A batch cut short by a failed roll-over: what is listed in ``appended`` was
                # written (it is consumable and will be recovered), the rest was not.
                status = (PutMessageStatus.SERVICE_NOT_AVAILABLE if exc.errno == errno.ENOSPC
                          else PutMessageStatus.CREATE_MAPPED_FILE_FAILED)
                failed = PutMessageResult(
                    status, appended,
                    error=f"{exc}; {len(appended)} of {len(records)} messages were written",
                )
        if appended and self.on_append is not None:
            self.on_append()
        if failed is not None:
            return failed
        return PutMessageResult(PutMessageStatus.PUT_OK, appended)

    def _append_locked(self, messages: Sequence[Message], records: list[tuple[bytes, int, int]],
                       now: int, appended: list[AppendedMessage]) -> None:
        """Copy records into segments. Records bound for one segment are joined into one
        buffer, stamped there and copied in one go; queue offsets and ``appended`` only move
        once a segment's copy succeeded, so a failed roll-over (disk full) leaves no
        half-counted message."""
        mf = self._writable_file()
        start = mf.wrote_position
        batch = bytearray().join([r[0] for r in records])
        if len(batch) + END_FILE_MIN_BLANK_LENGTH > mf.file_size - start:
            self._append_rolling(mf, messages, records, now, appended)
            return
        offsets = self.queue_offsets
        pending_offsets: dict[tuple[str, int], int] = {}
        pending, infos = self._stamp(batch, mf.file_from_offset + start, messages, records,
                                     now, offsets, pending_offsets)
        mf.write_at(start, batch)
        mf.store_timestamp = now
        offsets.update(pending_offsets)
        appended.extend(pending)
        self.recent_dispatch.extend(infos)

    def _stamp(self, batch: bytearray, base: int, messages: Sequence[Message],
               records: Sequence[tuple[bytes, int, int]], now: int,
               offsets: dict[tuple[str, int], int], pending_offsets: dict[tuple[str, int], int],
               ) -> tuple[list[AppendedMessage], list[DispatchInfo]]:
        """Stamp the records laid end to end in ``batch`` (the first lands at physical offset
        ``base``); assign their queue offsets into ``pending_offsets``; return where each
        landed and its dispatch info (both for the caller to publish once the copy is done).

        This is the per-message loop of every put: names are hoisted and tuples built with
        ``tuple.__new__`` (a NamedTuple's own constructor is a Python function call)."""
        pack_positions = codec.STAMP_POSITIONS.pack_into
        pack_timestamp = codec.STAMP_TIMESTAMP.pack_into
        qpos = codec.QUEUE_OFFSET_POS
        new = tuple.__new__
        appended_cls = AppendedMessage
        info_cls = DispatchInfo
        tags_code = tags_hash_code
        tags_key = Prop.TAGS
        # Prepared (0b01) and rolled-back (0b11) transaction types share this bit; not-type
        # and commit do not: SysFlag.is_dispatchable as one bit test.
        undispatchable = SysFlag.TRANSACTION_PREPARED_TYPE
        pending: list[AppendedMessage] = []
        infos: list[DispatchInfo] = []
        prefix = self._msg_id_prefix
        pos = 0
        for msg, (_, size, ts_pos) in zip(messages, records):
            sys_flag = msg.sys_flag
            topic = msg.topic
            queue_id = msg.queue_id
            if sys_flag & undispatchable:
                queue_offset = 0  # prepared/rolled back: no queue position, as in RocketMQ
            else:
                key = (topic, queue_id)
                next_in_batch = pending_offsets.get(key)
                queue_offset = (offsets.get(key, 0) if next_in_batch is None
                                else next_in_batch)
                pending_offsets[key] = queue_offset + 1
            physical_offset = base + pos
            pack_positions(batch, pos + qpos, queue_offset, physical_offset)
            pack_timestamp(batch, pos + ts_pos, now)
            pos += size
            pending.append(new(appended_cls, (physical_offset, size, queue_offset, now, prefix)))
            # Shared, not copied: a Message handed to the store must not be changed afterwards
            # (see ``append``); the dispatcher reads these properties later, on its thread.
            props = msg.properties
            tags = props.get(tags_key)
            infos.append(new(info_cls, (
                topic, queue_id, queue_offset, physical_offset, size,
                tags_code(tags) if tags else 0, now, sys_flag, props,
            )))
        return pending, infos

    def _append_rolling(self, mf: MappedFile, messages: Sequence[Message],
                        records: list[tuple[bytes, int, int]], now: int,
                        appended: list[AppendedMessage]) -> None:
        """The batch does not fit in the current segment: fill segments one by one, each
        ended by a blank record, committing each segment's share before starting the next."""
        i = 0
        n = len(records)
        while i < n:
            start = mf.wrote_position
            free = mf.file_size - start
            j = i
            used = 0
            while j < n and used + records[j][1] + END_FILE_MIN_BLANK_LENGTH <= free:
                used += records[j][1]
                j += 1
            batch = bytearray().join([r[0] for r in records[i:j]])
            offsets = self.queue_offsets
            pending_offsets: dict[tuple[str, int], int] = {}
            pending, infos = self._stamp(batch, mf.file_from_offset + start, messages[i:j],
                                         records[i:j], now, offsets, pending_offsets)
            if j < n:  # the next record does not fit: end this segment
                batch += codec.encode_blank(free - used)
                batch.extend(bytes(free - used - END_FILE_MIN_BLANK_LENGTH))
            mf.write_at(start, batch)
            mf.store_timestamp = now
            offsets.update(pending_offsets)
            appended.extend(pending)
            self.recent_dispatch.extend(infos)
            i = j
            if i < n:
                mf = self._writable_file()

    def _writable_file(self) -> MappedFile:
        mf = self.files.last_mapped_file(start_offset=0, create=True)
        if mf is None:
            raise CommitLogFull("no CommitLog segment to append to")
        return mf

    @property
    def append_lock(self) -> threading.Lock:
        """The lock ``append`` positions and copies under: a writer that puts bytes at the
        log's end another way (a slave's replicated records, a cut) holds it too."""
        return self._lock

    # -- reading --------------------------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        first = self.files.first()
        return first.file_from_offset if first is not None else 0

    @property
    def max_offset(self) -> int:
        return self.files.max_offset()

    def restart_topic(self, topic: str, at_cutoff: Callable[[int], None]) -> int:
        """Start ``topic``'s queue offsets again from 0 (the topic was deleted); return the
        CommitLog offset where its new generation starts. ``at_cutoff(offset)`` runs under the
        append lock: nothing of the new generation is appended before it returns."""
        with self._lock:
            cutoff = self.files.max_offset()
            for key in [k for k in self.queue_offsets if k[0] == topic]:
                del self.queue_offsets[key]
            at_cutoff(cutoff)
        return cutoff

    def select(self, physical_offset: int, size: int) -> tuple[MappedFile, memoryview] | None:
        """A held segment and a zero-copy view of ``size`` bytes at ``physical_offset``.

        The caller releases the segment when done with the view. None if that data is gone
        (deleted) or not yet written.
        """
        mf = self.files.find_by_offset(physical_offset)
        if mf is None or not mf.hold():
            return None
        rel = physical_offset - mf.file_from_offset
        if rel + size > mf.read_position:
            mf.release()
            return None
        return mf, mf.select(rel, size)

    def read(self, physical_offset: int) -> StoredMessage | None:
        """Decode the record at ``physical_offset`` (None if there is no record there)."""
        mf = self.files.find_by_offset(physical_offset)
        if mf is None or not mf.hold():
            return None
        try:
            rel = physical_offset - mf.file_from_offset
            if rel + 8 > mf.read_position:
                return None
            size, magic = codec.read_size_and_magic(mf.buffer, rel)
            if magic == codec.BLANK_MAGIC_CODE or rel + size > mf.read_position:
                return None
            return codec.decode(mf.buffer[rel : rel + size])
        finally:
            mf.release()

    def store_timestamp_at(self, physical_offset: int) -> int | None:
        """Store time of the record at ``physical_offset``, without decoding the rest."""
        mf = self.files.find_by_offset(physical_offset)
        if mf is None or not mf.hold():
            return None
        try:
            return codec.record_store_timestamp(mf.buffer, physical_offset - mf.file_from_offset)
        finally:
            mf.release()

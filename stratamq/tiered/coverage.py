"""``TierCoverage``: what the tier verifiably holds, checked against the tier itself before a
local CommitLog file is deleted because "the tier has it".

The uploader's progress (what it committed, as the metadata records it) says what the tier
*should* hold. A tier can lose objects behind the broker's back (a wiped bucket, a restored
directory): an audit deleted ~900 acknowledged messages that existed nowhere else after the
metadata said 486,859 bytes and the tier held 0. So before that progress is used to delete a
local file, each tier queue is checked:

* every tier file of the queue (CommitLog and ConsumeQueue segments) is at least as large in
  the tier's own listing as what was committed to it;
* the queue's last committed unit, read back from the tier, points at a record whose header
  is that queue's (topic, queue id) at that queue offset.

A queue that fails a check is not held by the tier: its local records are all kept (the
``floor`` stops at its first local record), and the failure is logged at ERROR once per queue
and change, counted, and shown (``problems``). Checks are cached: a sealed tier file is listed
once per size, a queue's last record read once per committed offset; the last file of each
queue is listed again at every verification. The uploader verifies only when a deletion could
depend on it (see ``TierUploader.durable_offset``).

Thread-safety: ``verify`` from one thread at a time (its own lock); ``floor`` from any.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from typing import Protocol

from stratamq import record as codec
from stratamq.tiered.flat_file import FlatAppendFile
from stratamq.tiered.flat_message_file import FlatFileStore, FlatMessageFile

__all__ = ["TierCoverage"]

log = logging.getLogger(__name__)

# Least time between two verifications while some queue fails the check (each lists every
# queue's last tier files); otherwise one is made each time a local file's deletion could
# depend on it (the committed offset passed a CommitLog file's end).
VERIFY_MIN_INTERVAL_S = 30.0


class _LocalQueues(Protocol):
    def offsets(self, topic: str, queue_id: int) -> tuple[int, int] | None: ...

    def units(self, topic: str, queue_id: int, offset: int,
              count: int) -> list[tuple[int, int, int]]: ...


class TierCoverage:
    """The tier's verified coverage of the local CommitLog (see the module docstring)."""

    def __init__(self, files: FlatFileStore, local: _LocalQueues) -> None:
        self.files = files
        self.local = local
        self._lock = threading.Lock()
        self._sealed_ok: set[tuple[str, int, int, int]] = set()  # (path, type, base, size)
        self._last_ok: dict[tuple[str, int], int] = {}  # queue -> committed offset read back
        # queue -> why the tier does not hold what was committed to it (None: it does)
        self.problems: dict[tuple[str, int], str] = {}
        self.unverified_queues = 0  # queues the last verification could not confirm
        self.verifications = 0
        self.verified_at = 0.0  # monotonic time of the last verification (0: never)
        # The CommitLog offset below which the last verification found every record in the
        # tier: the committed progress it was given, lowered to the first local record of
        # each queue it could not confirm. None: never verified.
        self.floor: int | None = None

    def due(self, committed: int, segment_size: int) -> bool:
        """Whether a verification could let a local file go that the last one did not (the
        committed offset passed a CommitLog file's end above the floor); never verified: yes.
        While queues fail the check their first records hold the floor back, so then at most
        every ``VERIFY_MIN_INTERVAL_S``."""
        floor = self.floor
        if floor is None:
            return True
        if segment_size <= 0 or committed // segment_size <= floor // segment_size:
            return False  # no CommitLog file end between them: no deletion waits on it
        return not self.problems or \
            time.monotonic() - self.verified_at >= VERIFY_MIN_INTERVAL_S

    def verify(self, committed: int, skip: set[tuple[str, int]] | None = None) -> int:
        """Check every tier queue (``skip``: queues another part holds) against the tier and
        return the new ``floor``: at most ``committed`` (the uploader's progress now)."""
        with self._lock:
            floor = committed
            problems: dict[tuple[str, int], str] = {}
            for flat in self.files.files():
                key = (flat.topic, flat.queue_id)
                if flat.closed or not flat.is_init() or (skip and key in skip):
                    continue
                why = self._check(flat)
                if why is None:
                    continue
                problems[key] = why
                first = self._first_local(flat)
                if first is not None:
                    floor = min(floor, first)
            for key, why in problems.items():
                if self.problems.get(key) != why:
                    log.error("tier queue %s/%d: %s; its local CommitLog records are kept (not "
                              "deleted as held by the tier)", key[0], key[1], why)
            for key in self.problems.keys() - problems.keys():
                log.warning("tier queue %s/%d: the tier holds what was committed again",
                            *key)
            self.problems = problems
            self.unverified_queues = len(problems)
            self.verifications += 1
            self.verified_at = time.monotonic()
            self.floor = floor
            return floor

    def _first_local(self, flat: FlatMessageFile) -> int | None:
        held = self.local.offsets(flat.topic, flat.queue_id)
        if held is None or held[0] >= held[1]:
            return None
        units = self.local.units(flat.topic, flat.queue_id, held[0], 1)
        return units[0][0] if units else None

    def _check(self, flat: FlatMessageFile) -> str | None:
        """Why the tier does not hold what the queue committed (None: it does)."""
        try:
            for files in (flat.commit_log, flat.consume_queue):
                why = self._check_sizes(files)
                if why is not None:
                    return why
            return self._check_last_record(flat)
        except (OSError, ValueError, struct.error, codec.RecordCorrupt) as exc:
            return f"cannot be verified in the tier: {exc}"

    def _check_sizes(self, files: FlatAppendFile) -> str | None:
        segments = files.segments
        for i, segment in enumerate(segments):
            committed = segment.commit_position
            key = (files.file_path, int(files.file_type), segment.base_offset, committed)
            sealed = i < len(segments) - 1
            if sealed and key in self._sealed_ok:
                continue
            size = segment.get_size()
            if size < committed:
                return (f"tier file {segment.path} holds {size} bytes, {committed} were "
                        "committed to it")
            if sealed:
                self._sealed_ok.add(key)
        return None

    def _check_last_record(self, flat: FlatMessageFile) -> str | None:
        key = (flat.topic, flat.queue_id)
        last = flat.commit_offset - 1
        if last < flat.min_offset() or self._last_ok.get(key) == last + 1:
            return None
        data = flat.record_at(last)
        if data is None:
            return f"its last unit (queue offset {last}) is not in the tier"
        size = codec.check_record(data, 0, len(data), None, check_crc=False)
        info = codec.decode_dispatch_info(data, 0)
        if size != len(data) or (info.topic, info.queue_id, info.queue_offset) != \
                (flat.topic, flat.queue_id, last):
            return (f"the record its last unit (queue offset {last}) points at is "
                    f"{info.topic}/{info.queue_id} at {info.queue_offset}, {size} of "
                    f"{len(data)} bytes")
        self._last_ok[key] = last + 1
        return None

"""Fault the CommitLog's next pages in ahead of the appender, on a thread of their own.

Why: the first store into each page of a fresh segment faults, and the kernel then finds a
page for it, zeroes it and maps it, inside the appender's copy (``MappedFile.write_at``). The
broker's appender is its event loop: under 16-message sends, profiles of the running broker
put a third of the store's time on the loop at that one copy (a 16 KiB batch touches four or
five fresh pages; a page fault costs more in place, on a loaded virtual machine, than alone).
``madvise(MADV_POPULATE_WRITE)`` does the same faulting ahead of time, off the loop and without
the GIL, so the copy lands in pages that are already there. Not one byte of the file changes:
the pages keep the zeros the file holds past its end of data (``populate`` in
``page_populate.py``).

Under ``SYNC_FLUSH`` it faults them in for reading instead (``MADV_POPULATE_READ``, the
``write=False`` of ``Prefaulter``): pages faulted in for writing are dirty, and a group
commit's ``fdatasync`` would write them out as zeros inside a put's wait. Read in, they are in
the page cache, zeroed and mapped, but clean; the appender's store still faults, to make the
page writable, but has nothing left to allocate or zero, which was most of the fault's cost
(profiles of a SYNC_FLUSH broker: the zeroing alone was 5% of the event loop's samples).
Pages faulted in for writing may be written back once as zeros before the appender fills them
(at most once each: the flush after), which ``ASYNC_FLUSH`` can afford. Disk is reserved
before pages are faulted in (``MappedFile.prefault``), so a full disk still shows up as an
ordinary error.
Linux 5.14 and later; elsewhere, or if the kernel refuses, it stops trying and appends fault
their pages in themselves, as before.

Threads: the appender calls ``appended`` after each append (a comparison, and a wake-up once
per ``PREFAULT_STEP``); the service's own thread does the faulting.
"""

from __future__ import annotations

from stratamq.store.mapped_file import MappedFile
from stratamq.store.mapped_file_queue import MappedFileQueue
from stratamq.store.page_populate import populate_supported
from stratamq.store.service import ServiceThread

__all__ = ["PREFAULT_AHEAD", "PREFAULT_STEP", "Prefaulter"]

PREFAULT_AHEAD = 4 * 1024 * 1024  # bytes kept faulted in past the write position
PREFAULT_STEP = 1024 * 1024  # faulted in per call, and how far the appender gets before a wake

class Prefaulter(ServiceThread):
    """Keeps ``PREFAULT_AHEAD`` bytes past the CommitLog's write position faulted in."""

    def __init__(self, files: MappedFileQueue, ahead: int = PREFAULT_AHEAD,
                 step: int = PREFAULT_STEP, write: bool = True) -> None:
        super().__init__("prefault-commitlog")
        self.files = files
        self.write = write  # fault pages in for writing (ASYNC_FLUSH) or reading (SYNC_FLUSH)
        self.ahead = ahead
        self.step = step
        self._file: MappedFile | None = None  # the segment faulted in so far
        self._ready_to = 0  # ... below this position in it
        self.faulted = 0  # bytes faulted in (read by tests and logs)

    def appended(self) -> None:
        """After an append (the appender's thread): wake the thread once the write position
        came within ``ahead - step`` of what is faulted in, or the segment changed."""
        mf = self.files.last()
        if mf is not None and (mf is not self._file
                               or mf.wrote_position + self.ahead - self.step > self._ready_to):
            self.wakeup()

    def run(self) -> None:
        while not self.wait(1.0):
            if not populate_supported():
                return
            self._fault_ahead()

    def _fault_ahead(self) -> None:
        mf = self.files.last()
        if mf is None:
            return
        if mf is not self._file:
            self._file, self._ready_to = mf, 0
        start = max(self._ready_to, mf.wrote_position)
        target = min(mf.file_size, mf.wrote_position + self.ahead)
        while start < target and not self.stopping:
            end = min(target, start + self.step)
            if not mf.prefault(start, end, self.write):
                return
            self.faulted += end - start
            self._ready_to = start = end

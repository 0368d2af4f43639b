"""Faulting a map's pages in without changing a byte (``madvise(MADV_POPULATE_READ|WRITE)``,
Linux 5.14 and later), called through ctypes so it runs without the GIL.

``MappedFile.prefault`` uses it for the CommitLog's prefaulter (``prefault.py`` says why);
where the kernel cannot, ``populate`` says so once and is never asked again.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import sys

__all__ = ["populate", "populate_supported"]

log = logging.getLogger(__name__)

_MADV_POPULATE_READ = 22  # linux/mman.h (Linux 5.14)
_MADV_POPULATE_WRITE = 23
_madvise = None
if sys.platform.startswith("linux"):
    try:
        _madvise = ctypes.CDLL(None, use_errno=True).madvise  # a CDLL call releases the GIL
        _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        _madvise.restype = ctypes.c_int
    except (OSError, AttributeError):
        _madvise = None


def populate(address: int, length: int, write: bool = True) -> bool:
    """Fault the pages of ``[address, address + length)`` in, changing no byte: as a write
    would (``MADV_POPULATE_WRITE``: mapped writable, and dirty), or as a read would
    (``MADV_POPULATE_READ``: in the page cache and mapped, clean; a later store still
    faults, but cheaply, with nothing to allocate or zero). False if the kernel cannot (then
    it is never asked again in this process) or the range could not be populated (a full
    disk, a file cut)."""
    global _madvise
    if _madvise is None or length <= 0:
        return False
    if _madvise(address, length, _MADV_POPULATE_WRITE if write else _MADV_POPULATE_READ) == 0:
        return True
    if ctypes.get_errno() == errno.EINVAL:  # a kernel without MADV_POPULATE_(READ|WRITE)
        log.info("MADV_POPULATE_READ/WRITE is not supported here: segment pages are not "
                 "faulted in ahead of the appender")
        _madvise = None
    return False


def populate_supported() -> bool:
    return _madvise is not None

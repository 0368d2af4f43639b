"""The store directory's ``lock`` file (``docs/formats/checkpoint.md``): one writer per store.

Taken by ``MessageStore.open`` (read-write) and by tools that change a stopped broker's store
(``stratamq ha reseed``); the descriptor holds the lock until it is closed.
"""

from __future__ import annotations

import fcntl
import os

from stratamq.store.layout import StoreLayout

__all__ = ["StoreLocked", "lock_store"]


class StoreLocked(RuntimeError):
    """Another process has the store open."""


def lock_store(layout: StoreLayout) -> int:
    """Take the store directory's lock; the descriptor holds it until closed. StoreLocked
    when another process (or store) holds it."""
    fd = os.open(layout.lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        # flock excludes other StrataMQ stores, even in this process; a POSIX record lock on
        # byte 0 is what Apache RocketMQ takes (FileChannel.tryLock(0, 1, false)), so a
        # RocketMQ broker and StrataMQ never open one directory together either.
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    except OSError:
        os.close(fd)
        raise StoreLocked(f"store {layout.root} is open in another process") from None
    return fd

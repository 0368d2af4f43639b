"""Writing small files so that a crash leaves the old content or the new, never a mix.

One helper for every small state file (``config/storeType``, broker metadata, the timer's
check file): the data goes to ``<name>.tmp``, is fsynced, renamed over the file, and the
directory is fsynced so the rename itself survives a power cut. Without the first fsync a
crash can leave a renamed but empty file (ext4's delayed allocation); without the last, the old
name can come back. A ``.tmp`` left by a crash is never read, and the next write replaces it.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["atomic_write", "fsync_directory"]


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes | memoryview, *, backup: bool = False,
                 size: int | None = None, sync_directory: bool = True) -> None:
    """Replace ``path`` with ``data`` durably: written to ``<name>.tmp`` (extended to ``size``,
    sparse, if given), synced, renamed over, and the directory synced. With ``backup`` the
    previous content is kept as ``<name>.bak`` (renamed, so it is the last good version, whole).
    ``sync_directory=False`` leaves the directory sync to a caller that renames a whole
    directory of such files into place afterwards (the Spark pipelines)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        if size is not None:
            os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)
    if backup and path.exists():
        os.replace(path, path.with_name(path.name + ".bak"))
    os.replace(tmp, path)
    if sync_directory:
        fsync_directory(path.parent)

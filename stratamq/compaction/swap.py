"""The swap protocol: how a round's new files replace the files it compacted, all or nothing.

Spec: ``docs/formats/compaction-log.md`` ("Swap"). A round writes its new log and batch CQ
files into the queue's ``compacting/`` sub-directories and fsyncs them; then:

1. ``swap.json`` is written atomically: the commit point. Before it exists, a crash leaves
   the old set (recovery deletes ``compacting/``); once it exists, recovery rolls forward.
2. For each new file name (log, then batch CQ): the old file of that name is renamed
   ``<name>.deleted`` and the new one is renamed into its place.
3. Old files no new file replaces are renamed ``<name>.deleted``; both directories are fsynced.
4. ``state.json`` is written with the state the manifest carries.
5. ``*.deleted`` files and ``compacting/`` are removed, then ``swap.json``.

Every step is idempotent, judged from the files alone (a new file still in ``compacting/`` is
not moved yet), so recovery simply runs :func:`roll_forward` again from the top: whatever step a
crash interrupted, the result is the new set. No reader ever sees a mix: an open finishes the
swap before it reads, and a running store swaps its in-memory file list under the queue's lock.

``STRATAMQ_COMPACTION_KILL_AT=<step>`` (tests only) makes the process SIGKILL itself when it
reaches that step (:data:`STEPS`), to prove the claim above with real kills.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
from pathlib import Path

from stratamq.compaction.layout import DELETED_SUFFIX, QueuePaths
from stratamq.compaction.state_format import SwapManifest
from stratamq.fileutil import fsync_directory

__all__ = ["KILL_ENV", "STEPS", "discard_output", "recover", "roll_forward", "step"]

log = logging.getLogger(__name__)

KILL_ENV = "STRATAMQ_COMPACTION_KILL_AT"
# Where a test may kill a round: after its output is durable (no manifest yet), after the
# manifest, after the first file moved, after every file moved, after the state is written,
# after the old files are gone (the manifest still there).
STEPS = ("output-written", "manifest-written", "first-file-moved", "files-moved",
         "state-written", "old-files-removed")


def step(name: str) -> None:
    """A named point of a round; SIGKILLs the process if the test hook asks for it here."""
    if os.environ.get(KILL_ENV) == name:
        log.warning("%s=%s: killing the process", KILL_ENV, name)
        os.kill(os.getpid(), signal.SIGKILL)


def _move_in(src_dir: Path, dst_dir: Path, name: str) -> bool:
    src = src_dir / name
    if not src.exists():
        return False  # moved already (a crash after this step)
    dst = dst_dir / name
    if dst.exists():
        os.replace(dst, QueuePaths.deleted(dst))
    os.replace(src, dst)
    return True


def _remove_deleted(directory: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        for path in directory.iterdir():
            if path.name.endswith(DELETED_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()


def roll_forward(paths: QueuePaths, manifest: SwapManifest) -> None:
    """Steps 2-5 of the protocol (see the module docstring); safe to run again after a crash
    anywhere in it."""
    moved = 0
    for name in manifest.with_:
        for src_dir, dst_dir in ((paths.new_log_dir, paths.log_dir),
                                 (paths.new_cq_dir, paths.cq_dir)):
            if _move_in(src_dir, dst_dir, name):
                moved += 1
                if moved == 1:
                    step("first-file-moved")
    for name in sorted(set(manifest.replace) - set(manifest.with_)):
        for directory in (paths.log_dir, paths.cq_dir):
            path = directory / name
            if path.exists():
                os.replace(path, QueuePaths.deleted(path))
    fsync_directory(paths.log_dir)
    fsync_directory(paths.cq_dir)
    step("files-moved")
    manifest.state.write(paths.state)
    step("state-written")
    _remove_deleted(paths.log_dir)
    _remove_deleted(paths.cq_dir)
    discard_output(paths, keep_manifest=True)
    step("old-files-removed")
    paths.manifest.unlink(missing_ok=True)
    fsync_directory(paths.log_dir)


def discard_output(paths: QueuePaths, *, keep_manifest: bool = False) -> None:
    """Remove a round's ``compacting/`` directories (and, unless told, its manifest)."""
    for directory in (paths.new_log_dir, paths.new_cq_dir):
        shutil.rmtree(directory, ignore_errors=True)
    if not keep_manifest:
        paths.manifest.unlink(missing_ok=True)


def recover(paths: QueuePaths) -> str | None:
    """Finish or undo a swap a crash interrupted; what was done (for the log), or None."""
    manifest = SwapManifest.read(paths.manifest)
    if manifest is not None:
        roll_forward(paths, manifest)
        return f"finished the swap of {len(manifest.replace)} compacted files"
    leftovers = [d for d in (paths.new_log_dir, paths.new_cq_dir) if d.exists()]
    _remove_deleted(paths.log_dir)
    _remove_deleted(paths.cq_dir)
    if leftovers:
        discard_output(paths)
        return "discarded the output of a round that had not committed"
    return None

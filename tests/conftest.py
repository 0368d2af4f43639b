"""Shared fixtures: the RocketMQ reference store, small-segment stores, subprocess helpers."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest
import zstandard

# The official RocketMQ client (whose protocol modules the broker imports, so every CLI and
# broker subprocess loads it too) writes its log under ``$HOME/logs``. The whole test session,
# and every subprocess it starts, runs with HOME at a private directory so no test writes to the
# real one.
os.environ["HOME"] = tempfile.mkdtemp(prefix="stratamq-test-home-")

from stratamq.config import StoreConfig  # noqa: E402

PROJECT = Path(__file__).resolve().parents[1]
# The project's own copy of the store Apache RocketMQ 5.3 wrote (tests/data/REFERENCE.md says
# what each message is), so the suite passes on a fresh clone with nothing beside it.
REFERENCE_ARCHIVE = Path(__file__).resolve().parent / "data" / "rocketmq-5.3-store-small.tar.zst"
REFERENCE_NAME = "rmq-reference-store-small"
REFERENCE_MESSAGES = 20_000


def extract_reference(dest: Path) -> Path:
    """Unpack the store Apache RocketMQ 5.3 wrote (sparse files stay sparse)."""
    if not REFERENCE_ARCHIVE.exists():
        pytest.fail(f"reference archive missing: {REFERENCE_ARCHIVE}")
    with (
        REFERENCE_ARCHIVE.open("rb") as raw,
        zstandard.ZstdDecompressor().stream_reader(raw) as stream,
        tarfile.open(fileobj=stream, mode="r|") as tar,
    ):
        tar.extractall(dest, filter="data")
    return dest / REFERENCE_NAME


@pytest.fixture(scope="session")
def reference_store(tmp_path_factory) -> Path:
    """A pristine unpacked reference store: read it, never write it (use reference_copy)."""
    return extract_reference(tmp_path_factory.mktemp("reference"))


@pytest.fixture
def reference_copy(tmp_path) -> Path:
    """A private copy of the reference store that a test may open read-write or damage."""
    return extract_reference(tmp_path / "ref")


def reference_body(i: int) -> bytes:
    """Body of reference message i, as tests/data/REFERENCE.md describes it."""
    unit = b"msg-%010d|" % i
    return (unit * (1024 // len(unit) + 1))[:1024]


@pytest.fixture
def small_config(tmp_path) -> StoreConfig:
    """A store with 64 KiB CommitLog segments and 100-unit ConsumeQueue files: rolls often."""
    return StoreConfig(
        store_path_root_dir=str(tmp_path / "store"),
        mapped_file_size_commit_log=64 * 1024,
        mapped_file_size_consume_queue=100 * 20,
    )


@pytest.fixture
def python_exe() -> str:
    return sys.executable


@contextlib.contextmanager
def mounted_tmpfs(mnt: Path, size: str):
    """A tmpfs of ``size`` (mount's syntax: 8m) at ``mnt`` for the block, unmounted after; the
    test is skipped where mounting is not permitted."""
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here (needs root or CAP_SYS_ADMIN): "
                    f"{done.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


@pytest.fixture
def tmpfs(tmp_path):
    """An 8 MiB tmpfs, mounted for the test and unmounted after: a real, small, full disk."""
    with mounted_tmpfs(tmp_path / "fs", "8m") as mnt:
        yield mnt

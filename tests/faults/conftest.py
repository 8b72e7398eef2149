"""Fixtures of the fault suite: a real small disk (tmpfs), filling it, damaging bytes."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def small_disk(tmp_path) -> Path:
    """A real 8 MB disk (tmpfs) mounted at ``tmp_path / "disk"``; skipped, with the reason,
    where this machine refuses the mount (not root, no tmpfs, a container without the right)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a tmpfs as a small disk here: {exc}")
    if done.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs as a small disk here (run as root): {done.stderr.strip()}"
        )
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)


def fill(disk: Path, leave: int = 0) -> Path:
    """Fill ``disk`` with a file until at most ``leave`` bytes are free (to the block)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        chunk = 1 << 20
        while chunk >= 512:
            if shutil.disk_usage(disk).free - leave < chunk:
                chunk //= 2
                continue
            try:
                os.write(fd, bytes(chunk))
            except OSError:
                chunk //= 2
    finally:
        os.close(fd)
    return filler


def free(disk: Path) -> int:
    return shutil.disk_usage(disk).free


def replace_bytes(path: Path, old: bytes, new: bytes) -> None:
    """Change bytes in a closed database file, where they are stored (one place only)."""
    data = path.read_bytes()
    assert data.count(old) == 1, f"{old!r} is in {path.name} {data.count(old)} times"
    assert len(old) == len(new)
    path.write_bytes(data.replace(old, new))

"""Shared fixtures: a real full filesystem for the write-failure tests."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def full_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on a real filesystem with no space left (a 64 KiB tmpfs filled to the last block): creating a
    file may still work, writing data to it fails with ENOSPC. Needs root (mount); skipped elsewhere."""
    mount = tmp_path / "full"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k,nr_inodes=64", "tmpfs", str(mount)],
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        with open(mount / ".fill", "wb", buffering=0) as fh:
            try:
                while True:
                    fh.write(b"\0" * 4096)
            except OSError:
                pass
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)

"""The bad-input sweep's harness: run a command line in this process on inputs written into a fresh directory,
and check that it is one line naming the problem, exit status 2, nothing on stdout, nothing written or changed in
that directory, and bounded memory and time.

Each test module of the sweep (``test_bad_inputs*.py``) lists its own files and cases and calls
:func:`check_bad_input` for each.
"""

from __future__ import annotations

import contextlib
import resource
import shutil
import signal
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.util import run_cli

PEAK_RSS_GROWTH_BYTES = 1 << 30
SECONDS_PER_CASE = 120  # a bound no correct case comes near, even on a loaded machine


def write_files(directory: Path, files: Mapping[str, str | bytes]) -> Path:
    """Write each `files` entry (text, or bytes written as they are) under `directory`; returns `directory`."""
    for name, content in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return directory


def listing(directory: Path) -> dict[str, bytes]:
    """Every file under `directory` with its content (what a case must leave unchanged)."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


class TookTooLong(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise TookTooLong


@contextlib.contextmanager
def bounded(seconds: int = SECONDS_PER_CASE) -> Iterator[None]:
    """Raise TookTooLong in this (main) thread if the block runs longer than `seconds`."""
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def check_bad_input(
    directory: Path, capsys: pytest.CaptureFixture[str], what: str, args: list[str], message: str
) -> None:
    """Run `args` (``{dir}`` replaced by `directory`) and check the sweep's promises; `message` (``{dir}`` replaced
    too) must appear in the one line on stderr."""
    before = listing(directory)
    rss = peak_rss_bytes()
    try:
        with bounded():
            code, out, err = run_cli([a.format(dir=directory) for a in args], capsys)
    except TookTooLong:
        pytest.fail(f"{what}: still running after {SECONDS_PER_CASE} s")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2, (what, err)
    assert len(lines) == 1, f"{what}: expected one line on stderr, got {lines}"
    assert "error" in lines[0] and message.format(dir=directory) in lines[0], (what, lines[0])
    assert "Traceback" not in err and out == ""
    assert listing(directory) == before, f"{what}: wrote or changed files"
    assert peak_rss_bytes() - rss < PEAK_RSS_GROWTH_BYTES, f"{what}: peak memory grew by over 1 GiB"
    shutil.rmtree(directory / "no", ignore_errors=True)

"""The search drivers' worker pool: same results as serial, and nothing left running when it stops early."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distsim.search.pool import imap_unordered


def _square_plus(shared: int, item: int) -> int:
    return item * item + shared


def _pid_after(shared: float, item: int) -> int:
    time.sleep(shared)
    return os.getpid()


def _fail_on_three(shared: None, item: int) -> int:
    if item == 3:
        raise ValueError("item 3 is bad")
    return item


def _gone(pids: set[int], within_s: float = 60.0) -> bool:
    """True once none of `pids` is alive (polled; a bound, not a timing measurement)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{p}").exists() for p in pids):
            return True
        time.sleep(0.05)
    return False


def test_parallel_results_equal_the_serial_ones() -> None:
    serial = list(imap_unordered(_square_plus, 7, range(20), workers=1))
    parallel = sorted(imap_unordered(_square_plus, 7, range(20), workers=2))
    assert serial == [i * i + 7 for i in range(20)] and parallel == sorted(serial)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to see processes")
def test_stopping_early_terminates_the_workers() -> None:
    results = imap_unordered(_pid_after, 0.2, range(1000), workers=2)
    pids = {next(results), next(results)}
    results.close()  # the caller stops iterating: 998 queued items are dropped
    assert os.getpid() not in pids and _gone(pids)


def test_an_error_in_a_task_reaches_the_caller() -> None:
    with pytest.raises(ValueError, match="item 3 is bad"):
        list(imap_unordered(_fail_on_three, None, range(6), workers=2))


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(x) for x in (task / "children").read_text().split()]
    return out


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs /proc to find the workers")
def test_ctrl_c_stops_a_grid_search_at_once() -> None:
    """SIGINT to the command: status 130, 'aborted', and its workers gone, long before the queue could finish
    (this grid takes minutes to run through)."""
    cmd = [sys.executable, "-m", "distsim", "search", "grid", "--model", "gpt3-175b", "--cluster", "dgx-a100",
           "--global-batch", "1536", "--tp", "1,2,4,8", "--micro-batch-sizes", "1,2,4,8,16,32",
           "--schedules", "gpipe,1f1b,interleaved", "--ignore-memory", "--plan-out", "", "--workers", "2"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(_children(proc.pid)) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        workers = set(_children(proc.pid))
        assert len(workers) == 2, "the search did not start its workers"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)  # exits at once when idle; generous for a busy CI machine
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and err.strip().splitlines()[-1] == "distsim: aborted"
    assert "Traceback" not in err and _gone(workers)

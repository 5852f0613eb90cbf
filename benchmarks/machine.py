"""What every benchmark shares: the machine it ran on, printed beside every figure (CPU model, CPU count, Python),
and the median of repeated timings."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe() -> str:
    """'AMD EPYC, 2 CPUs, python 3.11.7 (x86_64)'."""
    return f"{cpu_model()}, {os.cpu_count()} CPUs, python {platform.python_version()} ({platform.machine()})"


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """The median wall time of `repeats` calls of `fn` and its last result."""
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out

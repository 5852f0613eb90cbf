"""The machine a benchmark ran on, printed beside every figure (CPU model, CPU count, Python)."""

from __future__ import annotations

import os
import platform
from pathlib import Path


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

"""A fixed reference workload and the machine's load: how fast this rank's device is right now.

Each profiling rank times :func:`time_reference` before and after it profiles, so that a profile taken while the
machine was loaded (or whose load changed during the run) says so (see :mod:`distsim.infra.machine_load` for the
judgement). The workload is fixed (the same operations on the same shapes everywhere), so its time compares across
runs of one machine: a square fp32 matmul repeated on the rank's threads (CPU, timed with a monotonic clock) or on the
rank's GPU (timed with CUDA events), in rounds; the reading is the median round, which a single interruption does
not move but a competitor that holds the core for most of the reading does.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch

CPU_SIZE, CPU_PER_ROUND = 256, 32
"""CPU: 32 matmuls of 256 x 256 fp32 per round (1.07 GFLOP; about 12 ms on one 2020s x86 core at ~90 GFLOP/s)."""
CUDA_SIZE, CUDA_PER_ROUND = 2048, 16
"""GPU: 16 matmuls of 2048 x 2048 fp32 per round (275 GFLOP; ~6 ms on an H100, ~35 ms on a T4)."""
ROUNDS, WARMUP_ROUNDS = 7, 1


def reference_workload(device: torch.device | str) -> str:
    """What :func:`time_reference` runs on `device`, in words (recorded with the timings)."""
    cuda = torch.device(device).type == "cuda"
    n, k = (CUDA_SIZE, CUDA_PER_ROUND) if cuda else (CPU_SIZE, CPU_PER_ROUND)
    return f"{k} fp32 matmuls of {n}x{n} per round, median of {ROUNDS} rounds"


def time_reference(device: torch.device | str) -> float:
    """Seconds of the median round of the reference workload on `device` (the rank's threads on CPU)."""
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    n, k = (CUDA_SIZE, CUDA_PER_ROUND) if cuda else (CPU_SIZE, CPU_PER_ROUND)
    gen = torch.Generator(device=dev).manual_seed(0)
    a = torch.randn(n, n, generator=gen, device=dev)
    b = torch.randn(n, n, generator=gen, device=dev) / n**0.5
    c = torch.empty(n, n, device=dev)
    rounds: list[float] = []
    for r in range(WARMUP_ROUNDS + ROUNDS):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(dev)
            start.record()
            for _ in range(k):
                torch.mm(a, b, out=c)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            for _ in range(k):
                torch.mm(a, b, out=c)
            seconds = time.perf_counter() - t0
        if r >= WARMUP_ROUNDS:
            rounds.append(seconds)
    rounds.sort()
    return rounds[len(rounds) // 2]


def machine_load() -> dict[str, Any]:
    """The 1-minute load average and the cores this process may use (read before a rank pins itself)."""
    try:
        load_1m: float | None = round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):  # pragma: no cover - not Unix
        load_1m = None
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return {"loadavg_1m": load_1m, "cores": cores}


def other_cpu_use(window_s: float = 0.5) -> float | None:
    """Cores' worth of CPU time the machine spent over the next `window_s` seconds while this process slept (every
    profiling rank sleeps in the same window, so this is what other processes use); None where /proc/stat is not
    there. Idle on this project's VM it reads 0.00-0.02; with one spinning process 1.00-1.02."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as fh:
            ticks = [int(x) for x in fh.readline().split()[1:9]]
        return sum(ticks), ticks[3] + ticks[4]  # idle + iowait

    try:
        total0, idle0 = sample()
        time.sleep(window_s)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    total = total1 - total0
    cpus = os.cpu_count() or 1
    return round((total - (idle1 - idle0)) / total * cpus, 3) if total > 0 else None

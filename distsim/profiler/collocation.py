"""Measuring collocation: how much a low-priority background job on the same device slows the foreground (DeepPool's
GPU multiplexing, section 5; the figure :mod:`distsim.search.collocate` stretches a collocated foreground's compute by).

The foreground alternates a compute kernel with an idle gap as long (a foreground that leaves idle time, which is
when a background job is worth having); the background runs its own kernels back to back at lower priority, so it
gets the gaps, and any delay it causes the foreground (a kernel the device cannot preempt, a cache it evicted, a
wake-up that waits) shows as longer foreground cycles. Rounds of ``cycles`` cycles alone (the background paused)
and as many collocated alternate, so that drift in the machine's speed affects both alike; then

    f = (median collocated cycle - median cycle alone) / median kernel alone,

the foreground's extra time per second of its compute, kept >= 0 (a negative difference is noise: the background
cannot speed the foreground up).

Per device type (:data:`BACKGROUNDS`):

* **CPU** (the CPU analogue of stream priorities): the foreground (this process, its torch on one thread) and the
  background (a second process running torch GEMMs on one thread) are pinned to the same core
  (``os.sched_setaffinity``); the background runs under ``SCHED_IDLE`` (``os.sched_setscheduler``; where that is
  refused, ``nice 19``), so the kernel's scheduler runs it only when the foreground sleeps and preempts it when the
  foreground wakes. Paused with SIGSTOP, resumed with SIGCONT. Its CPU time (``/proc``) says how much of the
  collocated cycles it ran: it did fill the gaps. Tested (tests/integration/test_profiler_collocation.py).
* **CUDA** (untested: no GPU where this was written): the foreground's kernels on a high-priority stream, the
  background's on a low-priority one of the same device, launched by a thread of this process with at most
  ``IN_FLIGHT`` kernels queued (DeepPool's launch pacing), paused by not launching.

Everything here times torch work, so it lives in the profiler; the record is a
:class:`distsim.sim.profile_db.Collocation`.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import torch

from distsim.sim.profile_db import Collocation

FOREGROUND_GEMM = (128, 1024, 512)
"""(m, k, n) of the foreground's fp32 kernel: about 1-3 ms on one CPU core."""
BACKGROUND_GEMM = (64, 1024, 1024)
"""(m, k, n) of the background's kernel: a small batch's GEMM, about as long."""
ROUNDS = 5
CYCLES = 30
"""Cycles per round and phase: 2 x ROUNDS x CYCLES foreground cycles of about twice the kernel, a second or two."""
IN_FLIGHT = 2
"""CUDA: most background kernels queued at once (launch pacing)."""
LOWEST, HIGHEST = 0, -100
"""CUDA stream priorities (lower is higher): 0 is the default and lowest; torch maps -100 to the device's highest."""
READY_TIMEOUT_S = 60.0
"""Seconds the background process may take to start (it imports torch)."""


class Background(Protocol):
    """A background job on the foreground's device, started paused."""

    method: str
    """How it runs (priority mechanism, kernel), for the record's provenance."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def busy_s(self) -> float | None:
        """Seconds the background has run (while resumed), or None where that is not known."""
        ...


# ------------------------------------------------------------------------------------------------- CPU
def lower_priority() -> str:
    """Run this process at the lowest CPU priority it may take: SCHED_IDLE, else nice 19; returns which."""
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # type: ignore[attr-defined]
        return "SCHED_IDLE"
    os.nice(19)
    return "nice 19"


def background_main() -> None:
    """The CPU background process: pinned to the core in ``DISTSIM_COLLOCATION_CORE``, at the lowest priority, one
    thread running GEMMs until it is killed; says ``ready POLICY`` on stdout once it runs."""
    core = int(os.environ["DISTSIM_COLLOCATION_CORE"])
    os.sched_setaffinity(0, {core})
    policy = lower_priority()
    torch.set_num_threads(1)
    m, k, n = BACKGROUND_GEMM
    a, b = torch.randn(m, k), torch.randn(k, n)
    a @ b
    print("ready", policy, flush=True)
    while True:
        a @ b


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process, from /proc (None where there is none)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class CpuBackground:
    """A second process on the foreground's core at the lowest priority (see the module's notes)."""

    def __init__(self, core: int):
        import distsim

        root = os.path.dirname(os.path.dirname(os.path.abspath(distsim.__file__)))
        env = {**os.environ, "DISTSIM_COLLOCATION_CORE": str(core),
               "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}  # fmt: skip
        code = "from distsim.profiler.collocation import background_main; background_main()"
        self.proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], READY_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready and self.proc.stdout else ""
        if not line.startswith("ready"):
            self.close()
            raise RuntimeError(f"the background process did not start (exit status {self.proc.poll()})")
        self.pause()
        self._start = _cpu_seconds(self.proc.pid)
        m, k, n = BACKGROUND_GEMM
        self.method = (f"background: a second process on core {core} at {line.split(maxsplit=1)[1].strip()}, "
                       f"fp32 {m}x{k}x{n} GEMMs back to back on one thread")  # fmt: skip

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def busy_s(self) -> float | None:
        now = _cpu_seconds(self.proc.pid)
        return None if now is None or self._start is None else now - self._start

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()


@contextlib.contextmanager
def _cpu(device: torch.device) -> Iterator[tuple[Background, Callable[[], None]]]:
    """This process pinned to one core on one torch thread, the background beside it; both restored after."""
    cores = os.sched_getaffinity(0)
    core = max(cores)
    threads = torch.get_num_threads()
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    background = None
    try:
        background = CpuBackground(core)
        yield background, lambda: None
    finally:
        if background is not None:
            background.close()
        torch.set_num_threads(threads)
        os.sched_setaffinity(0, cores)


# ------------------------------------------------------------------------------------------------ CUDA
class CudaBackground:
    """Background GEMMs on a low-priority stream of the device, launched by a thread (untested, see the notes)."""

    def __init__(self, device: torch.device):
        self.stream = torch.cuda.Stream(device, priority=LOWEST)
        m, k, n = BACKGROUND_GEMM
        self.a = torch.randn(m * 16, k, device=device)
        self.b = torch.randn(k, n, device=device)
        torch.cuda.synchronize(device)  # made on the current stream, used on the background's
        self._run, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        self.method = (f"background: fp32 {m * 16}x{k}x{n} GEMMs on a stream of priority {self.stream.priority} "
                       f"launched by a thread, at most {IN_FLIGHT} queued")  # fmt: skip

    def _loop(self) -> None:
        queued: list[torch.cuda.Event] = []
        while not self._stop.is_set():
            if not self._run.wait(0.05):
                continue
            with torch.cuda.stream(self.stream):
                self.a @ self.b
                done = torch.cuda.Event()
                done.record(self.stream)
            queued.append(done)
            if len(queued) >= IN_FLIGHT:
                queued.pop(0).synchronize()  # releases the GIL while it waits

    def pause(self) -> None:
        self._run.clear()
        time.sleep(0.06)  # the thread sees it
        self.stream.synchronize()

    def resume(self) -> None:
        self._run.set()

    def busy_s(self) -> float | None:
        return None

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.stream.synchronize()


@contextlib.contextmanager
def _cuda(device: torch.device) -> Iterator[tuple[Background, Callable[[], None]]]:
    """The background on a low-priority stream; the foreground's kernels go on a high-priority one."""
    stream = torch.cuda.Stream(device, priority=HIGHEST)
    background = CudaBackground(device)
    background.method += f"; foreground on a stream of priority {stream.priority}"
    try:
        with torch.cuda.stream(stream):
            yield background, stream.synchronize  # waits for the foreground's stream only
    finally:
        background.close()


BACKGROUNDS: dict[str, Callable[[torch.device], contextlib.AbstractContextManager[tuple[Background, Any]]]] = {
    "cpu": _cpu,
    "cuda": _cuda,
}
"""Device type -> a context that starts the background (paused) and gives the foreground's synchronisation."""


# ------------------------------------------------------------------------------------------------ measure
def _foreground(device: torch.device, sync: Callable[[], None]) -> Callable[[], float]:
    """The foreground's kernel, timed (seconds, synchronised)."""
    m, k, n = FOREGROUND_GEMM
    a, b = torch.randn(m, k, device=device), torch.randn(k, n, device=device)

    def run() -> float:
        t0 = time.perf_counter()
        a @ b
        sync()
        return time.perf_counter() - t0

    return run


def _cycles(kernel: Callable[[], float], gap_s: float, n: int) -> tuple[list[float], list[float]]:
    """`n` foreground cycles (an idle gap, then the kernel): (kernel seconds, cycle seconds) of each."""
    compute, cycle = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        time.sleep(gap_s)
        compute.append(kernel())
        cycle.append(time.perf_counter() - t0)
    return compute, cycle


def measure_collocation(device: torch.device | str, rounds: int = ROUNDS, cycles: int = CYCLES,
                        progress: Callable[[str], None] | None = None) -> Collocation:  # fmt: skip
    """The slowdown a background job at lower priority causes the foreground on `device` (see the module's notes)."""
    from distsim.profiler.compute import device_name

    dev = torch.device(device)
    if dev.type not in BACKGROUNDS:
        raise ValueError(f"collocation cannot be measured on a {dev.type} device (known: {', '.join(BACKGROUNDS)})")
    with BACKGROUNDS[dev.type](dev) as (background, sync):
        kernel = _foreground(dev, sync)
        for _ in range(3):
            kernel()
        gap = statistics.median(kernel() for _ in range(5))
        compute, alone, collocated, wall = [], [], [], 0.0
        for _ in range(rounds):
            c, t = _cycles(kernel, gap, cycles)
            compute += c
            alone += t
            background.resume()
            _, t = _cycles(kernel, gap, cycles)
            background.pause()
            collocated += t
            wall += sum(t)
        busy = background.busy_s()
        method = background.method
    m, k, n = FOREGROUND_GEMM
    kernel_s, alone_s, collocated_s = (statistics.median(x) for x in (compute, alone, collocated))
    record = Collocation(
        slowdown=max(0.0, (collocated_s - alone_s) / kernel_s),
        compute_s=kernel_s, alone_s=alone_s, collocated_s=collocated_s, cycles=rounds * cycles,
        method=(f"{device_name(dev)}: foreground fp32 {m}x{k}x{n} GEMM then an idle gap as long, {rounds} rounds of "
                f"{cycles} cycles alone and {cycles} collocated; {method}"),
        background_busy=None if busy is None or wall <= 0 else min(1.0, busy / wall),
    )  # fmt: skip
    if progress is not None:
        share = "" if record.background_busy is None else f", the background ran {record.background_busy:.0%} of it"
        progress(f"collocation: foreground cycle {alone_s * 1e3:.3f} ms alone, {collocated_s * 1e3:.3f} ms with a "
                 f"background job ({record.slowdown:+.1%} per second of compute{share})")  # fmt: skip
    return record

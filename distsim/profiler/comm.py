"""Communication profiling with torch.distributed (NCCL on GPU, gloo on CPU), DistSim Sec. 4.2.

* Collectives (all-reduce, all-gather, reduce-scatter) are measured for every group size the two profiled nodes can
  form up to 8 ranks, inside one node (``intra``) and spread over both (``inter``), over a sweep of sizes. Each
  repetition is aligned with a barrier of the group and timed as the maximum over its ranks.
* Point-to-point transfers are timed on both sides; the transfer time is min(send, recv), which removes the time one
  side waited for the other. With gloo a send returns as soon as the kernel has buffered the data, so there the
  receiver's time (after a barrier that starts both sides together) is the transfer time.
* Only one group communicates at a time (a global barrier separates the measurements).
* With gloo (CPUs) each measurement of a reduce-scatter, an all-gather and a p2p transfer carries a note of what gloo
  runs for it (:data:`GLOO_NOTES`): its reduce-scatter is an all-reduce underneath, its all-gather a ring.

Message size conventions match the simulator's cost model: an all-reduce moves a buffer of ``bytes``; an all-gather
produces ``bytes`` (each rank contributes bytes / n); a reduce-scatter consumes ``bytes``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from distsim.sim.profile_db import CommMeasurement, Interference

COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter")
MAX_REPEATS = 50
TIME_BUDGET_S = 1.0
"""Repetitions of one message size grow up to MAX_REPEATS while they fit in about this many seconds."""
GLOO_NOTES = {
    "reduce_scatter": "gloo has no native reduce-scatter: torch's gloo backend copies the input, all-reduces the copy "
    "and keeps this rank's chunk (checked on torch 2.13: torch.profiler shows gloo:all_reduce), so this is an "
    "all-reduce's cost plus two copies, not a ring reduce-scatter's (do not read NCCL costs from it)",
    "all_gather": "gloo's all-gather is native, a ring as NCCL's (n - 1 steps, each passing one rank's part; "
    "gloo:all_gather), gathered into a buffer and then copied into the output",
    "p2p": "gloo's send returns once the data is buffered, so the transfer time is the receiver's time after a "
    "barrier (DistSim's min(send, recv) assumes NCCL, where both calls block until the transfer ends)",
}


def all_gather_single() -> Callable[..., Any]:
    """torch.distributed's all-gather of one tensor into one (``all_gather_into_tensor`` before torch 2.13 renamed
    it ``all_gather_single``)."""
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def reduce_scatter_single() -> Callable[..., Any]:
    """torch.distributed's reduce-scatter of one tensor into one (``reduce_scatter_tensor`` before torch 2.13)."""
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass(frozen=True)
class GroupSpec:
    """One communication group to measure: a collective (or p2p) among global ranks, intra- or inter-node."""

    collective: str
    scope: str
    ranks: tuple[int, ...]

    @property
    def group_size(self) -> int:
        return len(self.ranks)

    def __str__(self) -> str:
        return f"{self.collective} {self.scope}-node over {self.group_size} ranks {list(self.ranks)}"


def plan_groups(nodes: int, procs_per_node: int, max_group: int = 8) -> list[GroupSpec]:
    """Every (collective, scope, group size) two nodes of `procs_per_node` ranks can measure, up to `max_group`."""
    p = procs_per_node
    out: list[GroupSpec] = []
    layouts: list[tuple[str, tuple[int, ...]]] = []
    for n in range(2, min(p, max_group) + 1):
        layouts.append(("intra", tuple(range(n))))
    if nodes >= 2:
        for n in range(2, min(2 * p, max_group) + 1):
            a = (n + 1) // 2
            layouts.append(("inter", tuple(range(a)) + tuple(p + i for i in range(n - a))))
    for scope, ranks in layouts:
        out += [GroupSpec(c, scope, ranks) for c in COLLECTIVE_OPS]
    if p >= 2:
        out.append(GroupSpec("p2p", "intra", (0, 1)))
    if nodes >= 2:
        out.append(GroupSpec("p2p", "inter", (0, p)))
    return out


def sweep_sizes(max_bytes: int, min_bytes: int = 4096, factor: int = 4) -> list[int]:
    """4 KiB, 16 KiB, ... up to max_bytes."""
    out, size = [], min_bytes
    while size <= max_bytes:
        out.append(size)
        size *= factor
    return out


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


class CommBench:
    """Runs on every rank; all ranks must call `measure` with the same arguments in the same order."""

    def __init__(self, device: torch.device, warmup: int = 2, repeats: int = 5,
                 progress: Callable[[str], None] | None = None) -> None:  # fmt: skip
        self.device = device
        self.warmup = warmup
        self.repeats = repeats
        self.progress = progress
        self.rank = dist.get_rank()
        self.backend = dist.get_backend()
        self._groups: dict[tuple[int, ...], object] = {}

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _group(self, ranks: tuple[int, ...]) -> object:
        if ranks not in self._groups:  # every rank creates every group, in the same order
            self._groups[ranks] = dist.new_group(list(ranks))
        return self._groups[ranks]

    def _op(self, spec: GroupSpec, group: object, nbytes: int) -> Callable[[], None]:
        n = spec.group_size
        numel = max(n, nbytes // 4 // n * n)  # float32 elements, divisible by the group size
        x = torch.ones(numel, dtype=torch.float32, device=self.device)
        if spec.collective == "all_reduce":
            return lambda: dist.all_reduce(x, group=group)
        if spec.collective == "all_gather":
            part, out = x[: numel // n].clone(), torch.empty(numel, dtype=torch.float32, device=self.device)
            gather = all_gather_single()
            return lambda: gather(out, part, group=group)
        if spec.collective == "reduce_scatter":
            out = torch.empty(numel // n, dtype=torch.float32, device=self.device)
            scatter = reduce_scatter_single()
            return lambda: scatter(out, x, group=group)
        src, dst = spec.ranks
        if self.rank == src:
            return lambda: dist.send(x, dst)
        return lambda: dist.recv(x, src)

    def measure(self, spec: GroupSpec, sizes: list[int]) -> list[CommMeasurement]:
        """Measure `spec` at every size; returns the measurements on the group's lowest rank, [] elsewhere."""
        group = self._group(spec.ranks)
        member = self.rank in spec.ranks
        p2p = spec.collective == "p2p"
        gloo_p2p = p2p and self.backend == "gloo"
        reduce_op = dist.ReduceOp.MIN if p2p and not gloo_p2p else dist.ReduceOp.MAX
        out = []
        for nbytes in sizes:
            dist.barrier()  # nothing else communicates while this group is measured
            if not member:
                continue
            op = self._op(spec, group, nbytes)
            times: list[float] = []
            reps, rep = self.warmup + self.repeats, 0  # reps grows after the first timing, alike on every member
            while rep < reps:
                dist.barrier(group=group)
                self._sync()
                t0 = time.perf_counter()
                op()
                self._sync()
                seconds = time.perf_counter() - t0
                if gloo_p2p and self.rank == spec.ranks[0]:
                    seconds = 0.0  # the sender's buffered send says nothing: keep the receiver's time
                elapsed = torch.tensor([seconds], dtype=torch.float64)
                dist.all_reduce(elapsed, op=reduce_op, group=group)  # max over ranks; min(send, recv) for p2p
                if rep == 0:  # cheap messages get more repetitions: their latency can be heavy-tailed
                    budget = int(TIME_BUDGET_S / max(float(elapsed.item()), 1e-6))
                    reps = self.warmup + max(self.repeats, min(MAX_REPEATS, budget))
                if rep >= self.warmup:
                    times.append(float(elapsed.item()))
                rep += 1
            if self.rank == spec.ranks[0]:
                note = GLOO_NOTES.get(spec.collective) if self.backend == "gloo" else None
                median, mean = _percentile(times, 0.5), sum(times) / len(times)
                out.append(CommMeasurement(spec.collective, spec.scope, spec.group_size, nbytes, median,
                                           _percentile(times, 0.1), _percentile(times, 0.9), len(times), note,
                                           mean, tuple(times)))  # fmt: skip
                if self.progress:
                    self.progress(f"{spec.collective} {spec.scope} x{spec.group_size} {nbytes:>11,} B: mean "
                                  f"{mean * 1e3:.3f} ms, median {median * 1e3:.3f} ms ({len(times)} runs)")  # fmt: skip
        dist.barrier()
        return out


def _kernel(device: torch.device) -> Callable[[], float]:
    """A ~1-4 ms matmul, timed (stands for a compute event)."""
    a = torch.randn(256, 2048, device=device)
    b = torch.randn(2048, 512, device=device)

    def run() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    return run


def measure_interference(bench: CommBench, ranks: tuple[int, ...], scope: str, nbytes: int) -> Interference | None:
    """Overlap an all-reduce of `nbytes` with compute on every member and compare both with running alone.

    Every rank must call it; returns the result on the group's lowest rank.
    """
    group = bench._group(ranks)
    dist.barrier()
    result = None
    if bench.rank in ranks:
        kernel = _kernel(bench.device)
        for _ in range(3):
            kernel()
        alone = statistics.median(kernel() for _ in range(20))
        x = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=bench.device)
        comm_alone, comm_overlap, during = [], [], []
        for _ in range(4):
            dist.barrier(group=group)
            t0 = time.perf_counter()
            dist.all_reduce(x, group=group)
            comm_alone.append(time.perf_counter() - t0)
        for _ in range(4):
            dist.barrier(group=group)
            t0 = time.perf_counter()
            done: dict[str, float] = {}
            work = dist.all_reduce(x, group=group, async_op=True)
            work.get_future().then(lambda _f, done=done: done.setdefault("t", time.perf_counter()))
            while not work.is_completed():
                during.append(kernel())
            work.wait()
            comm_overlap.append(done.get("t", time.perf_counter()) - t0)
        mine = torch.tensor([
            statistics.median(during) / alone - 1 if during else 0.0,
            statistics.median(comm_overlap) / statistics.median(comm_alone) - 1,
        ], dtype=torch.float64)  # fmt: skip
        dist.all_reduce(mine, op=dist.ReduceOp.SUM, group=group)
        mine /= len(ranks)
        if bench.rank == ranks[0]:
            result = Interference(scope, len(ranks), nbytes, max(0.0, float(mine[0])), max(0.0, float(mine[1])))
            if bench.progress:
                bench.progress(f"interference {scope}: compute {result.compute_slowdown:+.0%} while an all-reduce "
                               f"runs, all-reduce {result.comm_slowdown:+.0%} while computing")  # fmt: skip
    dist.barrier()
    return result

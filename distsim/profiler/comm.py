"""Communication profiling with torch.distributed (NCCL on GPU, gloo on CPU), DistSim Sec. 4.2.

* Collectives (all-reduce, all-gather, reduce-scatter) are measured for every group size the two profiled nodes can
  form up to 8 ranks, inside one node (``intra``) and spread over both (``inter``), over a sweep of sizes. Each
  repetition is aligned with a barrier of the group and timed as the maximum over its ranks.
* Point-to-point transfers are timed on both sides; the transfer time is min(send, recv), which removes the time one
  side waited for the other. With gloo a send returns as soon as the kernel has buffered the data, so there the
  receiver's time (after a barrier that starts both sides together) is the transfer time.
* Only one group communicates at a time (a global barrier separates the measurements).

Message size conventions match the simulator's cost model: an all-reduce moves a buffer of ``bytes``; an all-gather
produces ``bytes`` (each rank contributes bytes / n); a reduce-scatter consumes ``bytes``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from distsim.profile_db import CommMeasurement

COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter")
GLOO_NOTES = {
    "reduce_scatter": "gloo has no native reduce-scatter: torch implements it with an all-reduce, so this is an "
    "all-reduce's cost, not a ring reduce-scatter's (do not read NCCL costs from it)",
    "p2p": "gloo's send returns once the data is buffered, so the transfer time is the receiver's time after a "
    "barrier (DistSim's min(send, recv) assumes NCCL, where both calls block until the transfer ends)",
}


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
            gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in torch 2.13
            return lambda: gather(out, part, group=group)
        if spec.collective == "reduce_scatter":
            out = torch.empty(numel // n, dtype=torch.float32, device=self.device)
            scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
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
            times = []
            for rep in range(self.warmup + self.repeats):
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
                if rep >= self.warmup:
                    times.append(float(elapsed.item()))
            if self.rank == spec.ranks[0]:
                note = GLOO_NOTES.get(spec.collective) if self.backend == "gloo" else None
                median = _percentile(times, 0.5)
                out.append(
                    CommMeasurement(
                        spec.collective,
                        spec.scope,
                        spec.group_size,
                        nbytes,
                        median,
                        _percentile(times, 0.1),
                        _percentile(times, 0.9),
                        len(times),
                        note,
                    )
                )
                if self.progress:
                    self.progress(f"{spec.collective} {spec.scope} x{spec.group_size} {nbytes:>11,} B: "
                                  f"{median * 1e3:.3f} ms")  # fmt: skip
        dist.barrier()
        return out

"""Burst parallelism (DeepPool): every layer data-parallel over its own GPUs, the global batch split over them.

A burst plan gives layer i (a node of the model's layer graph) a device tuple of g_i GPUs. The iteration's B samples
are split over those GPUs as a stages plan splits a micro-batch (:func:`distsim.plan.split_samples`: contiguous
slices, as even as possible, the larger first), so GPU ``devices[k]`` holds slice k. Between a producer on one layout
and a consumer on another, every sample's activations move from the GPU that holds it to the GPU that needs it
(forward), and its gradient back (backward). DeepPool's cost model (ALGORITHMS.md 1.2): the bytes a GPU must move are
the larger of what it sends and what it receives, counting only samples that change GPU; the transfer takes as long as
the busiest GPU's bytes at one link's bandwidth plus a latency. The planner and the simulator both use
:func:`redistribution_cost`, so a plan's transfers cost the same in both.

Pure: no torch, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from distsim.costs import CommEvent, Cost, CostSource
from distsim.plan import split_samples


def shards(batch: int, devices: tuple[int, ...]) -> dict[int, tuple[int, int]]:
    """GPU -> the [lo, hi) slice of the batch's samples it holds (a GPU listed twice is an error upstream)."""
    return dict(zip(devices, split_samples(batch, len(devices)), strict=True))


@dataclass(frozen=True)
class Redistribution:
    """What one layout change moves: per GPU, the samples it sends and receives (those that change GPU)."""

    sent: dict[int, int]
    """GPU -> samples it holds under the source layout that another GPU needs under the destination layout."""
    received: dict[int, int]
    """GPU -> samples it needs under the destination layout that another GPU holds under the source layout."""

    @property
    def busiest_samples(self) -> int:
        """max over GPUs of max(sent, received): DeepPool's per-GPU volume, in samples."""
        gpus = set(self.sent) | set(self.received)
        return max((max(self.sent.get(g, 0), self.received.get(g, 0)) for g in gpus), default=0)

    @property
    def total_samples(self) -> int:
        """Samples that change GPU (each counted once)."""
        return sum(self.sent.values())


def redistribution(batch: int, src: tuple[int, ...], dst: tuple[int, ...]) -> Redistribution:
    """The samples that move when a batch split over `src` is needed split over `dst`: one sweep over both layouts'
    slices in batch order, O(len(src) + len(dst))."""
    have, need = split_samples(batch, len(src)), split_samples(batch, len(dst))
    sent = dict.fromkeys(src, 0)
    received = dict.fromkeys(dst, 0)
    i = j = 0
    while i < len(src) and j < len(dst):
        (lo, hi), (lo2, hi2) = have[i], need[j]
        overlap = min(hi, hi2) - max(lo, lo2)
        if overlap > 0 and src[i] != dst[j]:
            sent[src[i]] += overlap
            received[dst[j]] += overlap
        if hi <= hi2:
            i += 1
        if hi2 <= hi:
            j += 1
    return Redistribution(sent, received)


def scope_of(gpus: set[int] | tuple[int, ...], gpus_per_node: int) -> str:
    """``intra`` when every GPU is on one node, else ``inter``."""
    return "intra" if len({g // gpus_per_node for g in gpus}) <= 1 else "inter"


def redistribution_cost(
    costs: CostSource, gpus_per_node: int, batch: int, bytes_per_sample: float, src: tuple[int, ...],
    dst: tuple[int, ...],
) -> tuple[Cost | None, int]:  # fmt: skip
    """The cost of one direction of a layout change (forward activations, or backward gradients: the same bytes) and
    the busiest GPU's bytes; (None, 0) when nothing moves. Priced as a point-to-point transfer of the busiest GPU's
    bytes over the link the moving GPUs share (intra-node, or a NIC when they span nodes)."""
    moved = redistribution(batch, src, dst)
    nbytes = round(moved.busiest_samples * bytes_per_sample)
    if nbytes <= 0:
        return None, 0
    movers = {g for g, n in moved.sent.items() if n} | {g for g, n in moved.received.items() if n}
    return costs.comm(CommEvent("p2p", nbytes, 2, scope_of(movers, gpus_per_node))), nbytes

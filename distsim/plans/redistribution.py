"""Burst parallelism (DeepPool): every layer data-parallel over its own GPUs, the global batch split over them.

A burst plan gives layer i (a node of the model's layer graph) a device tuple of g_i GPUs. The iteration's B samples
are split over those GPUs as a stages plan splits a micro-batch (:func:`distsim.plans.plan.split_samples`: contiguous
slices, as even as possible, the larger first), so GPU ``devices[k]`` holds slice k. Between a producer on one layout
and a consumer on another, every sample's activations move from the GPU that holds it to the GPU that needs it
(forward), and its gradient back (backward). DeepPool's cost model (ALGORITHMS.md 1.2): the bytes a GPU must move are
the larger of what it sends and what it receives, counting only samples that change GPU; the transfer takes as long as
the busiest GPU's bytes at one link's bandwidth plus a latency. The planner and the simulator both use
:func:`redistribution_cost`, so a plan's transfers cost the same in both.

Pure: no torch, no I/O.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from distsim.plans.plan import MAX_BATCH, check_batch, split_samples
from distsim.sim.costs import CommEvent, Cost, CostSource


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

    @cached_property
    def busiest_samples(self) -> int:
        """max over GPUs of max(sent, received): DeepPool's per-GPU volume, in samples."""
        return max(max(self.sent.values(), default=0), max(self.received.values(), default=0))

    @property
    def total_samples(self) -> int:
        """Samples that change GPU (each counted once)."""
        return sum(self.sent.values())

    @cached_property
    def movers(self) -> frozenset[int]:
        """The GPUs that send or receive anything."""
        return frozenset(g for g, n in self.sent.items() if n) | frozenset(g for g, n in self.received.items() if n)


def _slice_ends(batch: int, count: int) -> np.ndarray:
    """The exclusive ends of :func:`~distsim.plans.plan.split_samples`'s slices, as an array."""
    if not 0 < batch <= MAX_BATCH:  # numpy's int64 would overflow (a planner's batch reaches here unchecked)
        check_batch(batch)
    base, extra = divmod(batch, count)
    return np.cumsum(base + (np.arange(count) < extra))


def slice_bounds(batch: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The [lo, hi) of each of the `count` slices of :func:`~distsim.plans.plan.split_samples`, as two arrays."""
    ends = _slice_ends(batch, count)
    return ends - (batch // count + (np.arange(count) < batch % count)), ends


def _cut(batch: int, src: tuple[int, ...], dst: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """The batch cut at the union of both layouts' slice ends: each piece's end, length, and the index of the source
    and of the destination slice it lies in (both splits are contiguous slices in device order)."""
    have, need = _slice_ends(batch, len(src)), _slice_ends(batch, len(dst))
    cuts = np.union1d(have, need)
    return cuts, np.diff(cuts, prepend=0), np.searchsorted(have, cuts), np.searchsorted(need, cuts)


def redistribution(batch: int, src: tuple[int, ...], dst: tuple[int, ...]) -> Redistribution:
    """The samples that move when a batch split over `src` is needed split over `dst`.

    The pieces between the union of both layouts' slice ends each lie in one source and one destination slice
    (O(len(src) + len(dst)), in numpy: a 1024-GPU layout change is in a planner's inner loop)."""
    _cuts, length, i, j = _cut(batch, src, dst)
    move = (length > 0) & (np.asarray(src)[i] != np.asarray(dst)[j])
    sent = np.bincount(i[move], weights=length[move], minlength=len(src)).astype(np.int64)
    received = np.bincount(j[move], weights=length[move], minlength=len(dst)).astype(np.int64)
    return Redistribution(dict(zip(src, sent.tolist(), strict=True)), dict(zip(dst, received.tolist(), strict=True)))


def pieces(batch: int, src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[int, int, int, int]]:
    """What a layout change does sample by sample: (lo, hi, source GPU, destination GPU) of each piece [lo, hi) of
    the batch, in batch order; a piece whose two GPUs are one stays where it is (the executor moves the others)."""
    cuts, length, i, j = _cut(batch, src, dst)
    return [(int(end - n), int(end), src[a], dst[b]) for end, n, a, b in zip(cuts, length, i, j, strict=True) if n > 0]


def scope_of(gpus: Collection[int], gpus_per_node: int) -> str:
    """``intra`` when every GPU is on one node, else ``inter``."""
    return "intra" if not gpus or min(gpus) // gpus_per_node == max(gpus) // gpus_per_node else "inter"


def redistribution_cost(
    costs: CostSource, gpus_per_node: int, batch: int, bytes_per_sample: float, src: tuple[int, ...],
    dst: tuple[int, ...],
) -> tuple[Cost | None, int]:  # fmt: skip
    """The cost of one direction of a layout change (forward activations, or backward gradients: the same bytes) and
    the busiest GPU's bytes; (None, 0) when nothing moves. Priced as a point-to-point transfer of the busiest GPU's
    bytes over the link the moving GPUs share (intra-node, or a NIC when they span nodes)."""
    return transfer_cost(costs, gpus_per_node, redistribution(batch, src, dst), bytes_per_sample)


def moved_bytes(moved: Redistribution, bytes_per_sample: float) -> int:
    """The busiest GPU's bytes of a layout change (what its transfer is priced by); 0: no transfer at all."""
    return round(moved.busiest_samples * bytes_per_sample)


def transfer_cost(
    costs: CostSource, gpus_per_node: int, moved: Redistribution, bytes_per_sample: float
) -> tuple[Cost | None, int]:
    """:func:`redistribution_cost` of a layout change already worked out (a planner prices one change for many
    tensor sizes)."""
    nbytes = moved_bytes(moved, bytes_per_sample)
    if nbytes <= 0:
        return None, 0
    return costs.comm(CommEvent("p2p", nbytes, 2, scope_of(moved.movers, gpus_per_node))), nbytes

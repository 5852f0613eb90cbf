"""Symmetric classes of a burst plan: GPUs that do the same work at the same times, simulated once.

A burst plan's flow (:mod:`distsim.plans.burst_flow`) is deterministic: every task starts at the latest end of its
dependencies (:mod:`distsim.sim.engine`). Two GPUs of a plan are in one class when their tasks match one for one
with the same durations and with dependencies whose ends are equal, so that every task of one starts and ends when
the matching task of the other does. Then one GPU of the class (the lowest id) is simulated and stands for the
others, as a uniform flow's replica stands for its data-parallel peers: metrics, timelines and traces expand it
(``EventFlow.represents``). Data parallelism over 1,024 GPUs is one simulated GPU; DeepPool's Inception-v3 plan at
1,024 GPUs, a handful.

What makes a GPU's tasks, and so what the class signature (one integer per GPU and *feature*) holds:

* its compute speed (a straggler computes more slowly);
* per layer, whether it runs the layer and on how many samples (its compute, its host's launches, its optimizer
  step's parameters, its gradient all-reduces and the order of all of them on its streams);
* per layout change that moves bytes (one transfer task on the moving GPUs' streams), whether it sends, whether it
  receives (a receiver waits for the transfer, and its streams carry the transfer's rows) and whether it also keeps
  some of its own samples (then it waits for its own producer too);
* per layout change that moves no bytes (no transfer task: a consumer waits for the producers that hold its samples
  directly), those producers by GPU id (its own id written as -1).

GPUs equal in every feature are in one class. By induction over the tasks in emission order, every dependency of a
class's simulated GPU ends when the matching dependency of each member does: a per-GPU task of another GPU is
replaced by the same task of that GPU's class representative (equal ends by induction), and a transfer or all-reduce
is one task for all its members, whose member set is a union of whole classes (every member sends or receives, or
runs the layer). A producer a consumer waits for directly is never in the consumer's own class (its own feature
would name itself -1), so a remote wait stays remote, as the host's launch rule needs. Fair link sharing is left out
(its network tasks would need the load of every instance), as are stochastic runs (noise breaks symmetry).

Pure: no torch, no I/O.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

import numpy as np

from distsim.plans.redistribution import Redistribution, moved_bytes, redistribution, shards, slice_bounds

if TYPE_CHECKING:
    from distsim.core.cluster import Cluster
    from distsim.core.models.graph import Model
    from distsim.plans.plan import Plan

Layout = tuple[int, ...]


def every_gpu(plan: Plan) -> dict[int, tuple[int, ...]]:
    """Every GPU of the plan simulated, standing for itself."""
    return {g: (g,) for g in plan.gpus}


def burst_classes(model: Model, cluster: Cluster, plan: Plan) -> dict[int, tuple[int, ...]]:
    """Simulated GPU -> the GPUs of its class (itself, the lowest id, first), for every GPU of the plan (see the
    module's notes). O(GPUs x (layouts + layout changes)) in numpy: 1,024 GPUs take milliseconds."""
    index: dict[Layout, int] = {}  # layouts as numbers: a 100,000-GPU tuple is slow to hash again and again
    layout = [index.setdefault(devices, len(index)) for devices in plan.burst]
    gpus = np.asarray(sorted(set().union(*index)), dtype=np.int64)
    features = _Features(gpus, plan.strategy.micro_batch_size, list(index))
    if cluster.slowdown:
        features.add("speed", np.unique([cluster.speed_factor(int(g)) for g in gpus], return_inverse=True)[1])
    for k in range(len(index)):
        features.add(("samples", k), features.samples(k))
    out_bytes = [layer.out_bytes for layer in model.layers]
    for v, inputs in enumerate(model.input_layers):
        for u in inputs:
            if layout[u] != layout[v]:  # forward: u's activations to v's layout; backward: their gradient back
                features.change(layout[u], layout[v], out_bytes[u])
                features.change(layout[v], layout[u], out_bytes[u])
    return features.classes()


class _Features:
    """The classes of a plan's GPUs, refined one feature (a column: an integer per GPU) at a time: GPUs stay in one
    class while they agree on every feature so far (a feature met twice counts once). O(GPUs) memory whatever the
    number of features."""

    def __init__(self, gpus: np.ndarray, batch: int, layouts: list[Layout]):
        self.gpus, self.batch, self.layouts = gpus, batch, layouts
        """The plan's GPUs (sorted), its batch, its distinct layouts (a layout below is its index here)."""
        self.ids = np.zeros(len(gpus), dtype=np.int64)
        """Per GPU, its class so far (0 .. classes - 1)."""
        self._seen: set[Hashable] = set()
        self._moved: dict[tuple[int, int], Redistribution] = {}

    def index(self, devices: Layout) -> np.ndarray:
        """Positions of `devices` among the plan's (sorted) GPUs."""
        return np.searchsorted(self.gpus, np.asarray(devices, dtype=np.int64))

    def add(self, key: Hashable, column: np.ndarray) -> None:
        """Split the classes by a feature's values (integers >= -1; below 2^40, so the pairs fit in 64 bits)."""
        if key in self._seen:
            return
        self._seen.add(key)
        column = np.asarray(column, dtype=np.int64) + 1
        pairs = self.ids * (int(column.max()) + 1) + column
        self.ids = np.unique(pairs, return_inverse=True)[1].ravel()

    def samples(self, k: int) -> np.ndarray:
        """Samples each GPU holds under layout `k` (0: it does not run the layer)."""
        layout = self.layouts[k]
        lo, hi = slice_bounds(self.batch, len(layout))
        out = np.zeros(len(self.gpus), dtype=np.int64)
        out[self.index(layout)] = hi - lo
        return out

    def change(self, a: int, b: int, bytes_per_sample: float) -> None:
        """A layout change from layout `a` to `b` of a tensor of `bytes_per_sample`: each GPU's role in its transfer
        (bit 0 sends, bit 1 receives, bit 2 keeps some of its own samples), or, where nothing moves, the producers
        each consumer waits for."""
        src, dst = self.layouts[a], self.layouts[b]
        moved = self._moved.get((a, b))
        if moved is None:
            moved = self._moved[(a, b)] = redistribution(self.batch, src, dst)
        transfer = moved_bytes(moved, bytes_per_sample) > 0
        key = ("change", a, b, transfer)
        if key not in self._seen:
            self.add(key, self._roles(src, dst, moved) if transfer else self._holders(src, dst))

    def _roles(self, src: Layout, dst: Layout, moved: Redistribution) -> np.ndarray:
        n = len(self.gpus)
        sent, received, start, end = (np.zeros(n, dtype=np.int64) for _ in range(4))
        sent[self.index(tuple(moved.sent))] = np.fromiter(moved.sent.values(), dtype=np.int64)
        received[self.index(tuple(moved.received))] = np.fromiter(moved.received.values(), dtype=np.int64)
        start[self.index(src)], end[self.index(src)] = slice_bounds(self.batch, len(src))
        lo, hi = np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
        lo[self.index(dst)], hi[self.index(dst)] = slice_bounds(self.batch, len(dst))
        own = (np.maximum(start, lo) < np.minimum(end, hi)) & (hi > lo)  # GPUs in neither layout: empty slices
        return (sent > 0).astype(np.int64) | (received > 0) << 1 | own << 2

    def _holders(self, src: Layout, dst: Layout) -> np.ndarray:
        """Per consumer GPU, an id of the producers holding its samples (its own id as -1); -1 for the others."""
        have = sorted(shards(self.batch, src).items(), key=lambda x: x[1][0])
        ids: dict[tuple[int, ...], int] = {}
        out = np.full(len(self.gpus), -1, dtype=np.int64)
        for g, k, (lo, hi) in zip(dst, self.index(dst).tolist(), shards(self.batch, dst).values(), strict=True):
            holders = tuple(-1 if h == g else h for h, (a, b) in have if a < hi and b > lo)
            out[k] = ids.setdefault(holders, len(ids))
        return out

    def classes(self) -> dict[int, tuple[int, ...]]:
        """GPUs equal in every feature, as simulated GPU -> its class (lowest id first), by simulated GPU."""
        gpus = self.gpus.tolist()
        _, first, inverse = np.unique(self.ids, return_index=True, return_inverse=True)
        members: dict[int, list[int]] = {}
        for g, c in zip(gpus, first[inverse.ravel()].tolist(), strict=True):
            members.setdefault(gpus[c], []).append(g)
        return {rep: tuple(ms) for rep, ms in sorted(members.items())}

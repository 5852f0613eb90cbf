"""Placement of ranks on GPUs and of GPUs on nodes; from it every collective knows its scope.

Ranks are laid out with tensor parallelism innermost, then data, then pipeline (Megatron-LM's order) unless another
``order`` is given. ``grid[stage, replica, tp_rank]`` is the GPU of that coordinate. Communication *patterns* (the
tp groups of a stage, the dp groups of a stage, the p2p pairs between two stages) are the sets of symmetric
instances that run at the same time; for each instance the placement reports its scope (intra/inter node) and how many
instances share a node's NICs at once.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from distsim.core.cluster import Cluster
from distsim.core.errors import StrategyError
from distsim.core.strategy import Strategy

DIMS = ("tp", "dp", "pp")


@dataclass(frozen=True)
class CommInstance:
    """One concrete group of GPUs doing one instance of a communication pattern."""

    gpus: tuple[int, ...]
    scope: str
    """``intra`` if every GPU is on one node, else ``inter``."""
    sharers: int
    """Instances of the same pattern leaving the busiest node this instance touches at the same time (>= 1)."""


def parse_order(order: str) -> tuple[str, str, str]:
    parts = tuple(p.strip().lower() for p in order.replace("-", ",").split(","))
    if sorted(parts) != sorted(DIMS):
        raise StrategyError(f"rank order must name tp, dp and pp once each (innermost first), got {order!r}")
    return parts  # type: ignore[return-value]


@dataclass(frozen=True)
class Placement:
    strategy: Strategy
    cluster: Cluster
    order: tuple[str, str, str] = ("tp", "dp", "pp")

    @cached_property
    def grid(self) -> np.ndarray:
        """grid[stage, replica, tp_rank] -> GPU id."""
        s = self.strategy
        sizes = {"tp": s.tp, "dp": s.dp, "pp": s.pp}
        stride, strides = 1, {}
        for dim in self.order:
            strides[dim] = stride
            stride *= sizes[dim]
        p = np.arange(s.pp)[:, None, None] * strides["pp"]
        d = np.arange(s.dp)[None, :, None] * strides["dp"]
        t = np.arange(s.tp)[None, None, :] * strides["tp"]
        return p + d + t

    @cached_property
    def coords(self) -> dict[int, tuple[int, int, int]]:
        """GPU -> (stage, replica, tp_rank)."""
        out = {}
        for (p, d, t), gpu in np.ndenumerate(self.grid):
            out[int(gpu)] = (p, d, t)
        return out

    def node(self, gpu: int) -> int:
        return gpu // self.cluster.gpus_per_node

    def stage_gpus(self, stage: int) -> list[int]:
        return [int(g) for g in self.grid[stage].ravel()]

    # ------------------------------------------------------------------------------------------- communication
    def _instances(self, groups: list[tuple[int, ...]]) -> list[CommInstance]:
        return group_instances(groups, self.cluster.gpus_per_node)

    def tp_groups(self, stage: int) -> list[CommInstance]:
        """One instance per replica: the tp ranks of that replica of the stage."""
        return self._instances([tuple(int(g) for g in row) for row in self.grid[stage]])

    def dp_groups(self, stage: int) -> list[CommInstance]:
        """One instance per tp rank: the replicas of the stage holding that shard."""
        return self._instances([tuple(int(g) for g in self.grid[stage, :, t]) for t in range(self.strategy.tp)])

    def p2p_pairs(self, src_stage: int, dst_stage: int) -> list[CommInstance]:
        """One instance per (replica, tp rank): sender in src_stage to the same coordinate in dst_stage.

        Sharing is counted per direction: sends leaving a node compete with each other, not with receives.
        """
        src, dst = self.grid[src_stage].ravel(), self.grid[dst_stage].ravel()
        pairs = [(int(a), int(b)) for a, b in zip(src, dst, strict=True)]
        return pair_instances(pairs, self.cluster.gpus_per_node)


def group_instances(groups: list[tuple[int, ...]], gpus_per_node: int) -> list[CommInstance]:
    """Collectives over `groups` running at once: a group spanning nodes shares each of its nodes' NICs with every
    other spanning group touching that node."""
    nodes_of = [{g // gpus_per_node for g in group} for group in groups]
    load: Counter[int] = Counter()
    for ns in nodes_of:
        if len(ns) > 1:
            load.update(ns)
    out = []
    for group, ns in zip(groups, nodes_of, strict=True):
        if len(ns) > 1:
            out.append(CommInstance(group, "inter", max(load[n] for n in ns)))
        else:
            out.append(CommInstance(group, "intra", 1))
    return out


def pair_instances(pairs: list[tuple[int, int]], gpus_per_node: int) -> list[CommInstance]:
    """Point-to-point transfers (sender, receiver) running at once; sends leaving a node share its NICs, as do
    receives entering one (per direction)."""
    gpn = gpus_per_node
    crossing = [(a, b) for a, b in pairs if a // gpn != b // gpn]
    out_load = Counter(a // gpn for a, _ in crossing)
    in_load = Counter(b // gpn for _, b in crossing)
    out = []
    for a, b in pairs:
        if a // gpn != b // gpn:
            out.append(CommInstance((a, b), "inter", max(out_load[a // gpn], in_load[b // gpn])))
        else:
            out.append(CommInstance((a, b), "intra", 1))
    return out

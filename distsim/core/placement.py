"""Placement of ranks on GPUs and of GPUs on nodes; from it every collective knows its scope.

Ranks are laid out with tensor parallelism innermost, then data, then pipeline (Megatron-LM's order) unless another
``order`` is given. ``grid[stage, replica, tp_rank]`` is the GPU of that coordinate. Communication *patterns* (the
tp groups of a stage, the dp groups of a stage, the p2p pairs between two stages) are the sets of symmetric
instances that run at the same time; for each instance the placement reports its scope (intra/inter node) and how many
instances share a node's NICs at once. Each instance also keeps its :class:`Pattern` (the instances running beside
it), from which fair link sharing reads how the pattern loads each node's NICs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
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
    pattern: Pattern | None = field(default=None, compare=False, repr=False)
    """All instances of the pattern, this one among them (None: not known); not part of the instance's value."""

    def nodes(self, gpus_per_node: int) -> tuple[int, ...]:
        """The nodes its GPUs are on, in order of first appearance."""
        return tuple(dict.fromkeys(g // gpus_per_node for g in self.gpus))


Load = tuple[tuple[int, int], ...]
"""(node, instances) pairs, sorted by node: how many instances of a pattern use a node's NICs in one direction."""


@dataclass(frozen=True, eq=False)
class Pattern:
    """The instances of one communication pattern that run at the same time (the groups or pairs that
    :func:`group_instances` or :func:`pair_instances` placed) and how they load the nodes' NICs, per direction.

    A collective (a ring or tree across nodes) sends and receives through the NICs of every node it spans, once per
    instance however many of its GPUs a node holds; a transfer (sender, receiver) sends through the sender's node's
    NICs and receives through the receiver's. Instances inside one node use no NIC."""

    groups: tuple[tuple[int, ...], ...]
    gpus_per_node: int

    @cached_property
    def collective_load(self) -> tuple[Load, Load]:
        """(sending, receiving) load of the groups run as collectives: per node, the groups spanning nodes that
        touch it (the same both ways)."""
        gpn = self.gpus_per_node
        load: Counter[int] = Counter()
        for group in self.groups:
            nodes = {g // gpn for g in group}
            if len(nodes) > 1:
                load.update(nodes)
        out = tuple(sorted(load.items()))
        return out, out

    @cached_property
    def transfer_load(self) -> tuple[Load, Load]:
        """(sending, receiving) load of the groups run as transfers from their first GPU to their last: per node,
        the transfers crossing nodes that leave it, and those that enter it."""
        gpn = self.gpus_per_node
        sends: Counter[int] = Counter()
        receives: Counter[int] = Counter()
        for group in self.groups:
            a, b = group[0] // gpn, group[-1] // gpn
            if a != b:
                sends[a] += 1
                receives[b] += 1
        return tuple(sorted(sends.items())), tuple(sorted(receives.items()))

    def resources(self, transfer: bool) -> list[tuple[int, ...]]:
        """The NIC resources each instance crossing nodes uses (``2 n``: node n's NICs sending, ``2 n + 1``:
        receiving), run as transfers or as collectives."""
        gpn = self.gpus_per_node
        out = []
        for group in self.groups:
            if transfer:
                a, b = group[0] // gpn, group[-1] // gpn
                if a != b:
                    out.append((2 * a, 2 * b + 1))
            else:
                nodes = sorted({g // gpn for g in group})
                if len(nodes) > 1:
                    out.append(tuple(2 * n + d for n in nodes for d in (0, 1)))
        return out


def shares_evenly(usages: Iterable[tuple[Pattern, bool]]) -> bool:
    """Whether every instance of each pattern sees the same NIC loads, so that one simulated instance can stand for
    all of them under fair link sharing. `usages`: the patterns a flow runs, each as transfers (True) or as
    collectives. Every NIC resource has a load vector (how many instances of each usage use it); the instances of a
    usage must each see the same multiset of load vectors on their resources. Then, whichever tasks are running,
    every instance's least share is the same, and is the least share over all the resources the pattern uses
    (what a symmetric simulation computes). Usages that never run at the same time are compared too (a sufficient
    condition, not a necessary one)."""
    uses = list(usages)
    by_resource: dict[int, list[tuple[int, int]]] = {}
    for k, (pattern, transfer) in enumerate(uses):
        tx, rx = pattern.transfer_load if transfer else pattern.collective_load
        for n, copies in tx:
            by_resource.setdefault(2 * n, []).append((k, copies))
        for n, copies in rx:
            by_resource.setdefault(2 * n + 1, []).append((k, copies))
    vectors = {r: tuple(v) for r, v in by_resource.items()}
    for pattern, transfer in uses:
        seen = None
        for resources in pattern.resources(transfer):
            signature = sorted(vectors[r] for r in resources)
            if seen is None:
                seen = signature
            elif signature != seen:
                return False
    return True


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

    def ep_groups(self, stage: int) -> list[CommInstance]:
        """One instance per (expert-parallel group, tp rank): ep consecutive replicas of the stage holding that
        shard (Megatron-Core carves the expert-parallel groups out of the data-parallel ones, innermost first); the
        group of replica d and tp rank t is at index (d // ep) * tp + t."""
        return self.replica_groups(stage, self.strategy.ep)

    def cp_groups(self, stage: int) -> list[CommInstance]:
        """The context-parallel groups, laid out as :meth:`ep_groups` (cp consecutive replicas: Megatron's
        tp-cp-dp-pp order)."""
        return self.replica_groups(stage, self.strategy.cp)

    def replica_groups(self, stage: int, k: int) -> list[CommInstance]:
        """Groups of k consecutive replicas of the stage, one per (group, tp rank), at index (d // k) * tp + t."""
        tp = self.strategy.tp
        return self._instances([tuple(int(g) for g in self.grid[stage, lo : lo + k, t])
                                for lo in range(0, self.strategy.dp, k) for t in range(tp)])  # fmt: skip

    def p2p_pairs(self, src_stage: int, dst_stage: int) -> list[CommInstance]:
        """One instance per (replica, tp rank): sender in src_stage to the same coordinate in dst_stage.

        Sharing is counted per direction: sends leaving a node compete with each other, not with receives.
        """
        src, dst = self.grid[src_stage].ravel(), self.grid[dst_stage].ravel()
        pairs = [(int(a), int(b)) for a, b in zip(src, dst, strict=True)]
        return pair_instances(pairs, self.cluster.gpus_per_node)

    def shares_evenly(self, collective_pairs: Sequence[tuple[int, int]] = ()) -> bool:
        """:func:`shares_evenly` over every pattern a uniform flow runs: each stage's tp and dp groups (collectives),
        the transfers to the next and previous stage, and the pairs of stages in `collective_pairs` (whose copies
        of tied layers are all-reduced: collectives over pairs)."""
        pp = self.strategy.pp
        usages = []
        for r in range(pp):
            for groups in (self.tp_groups(r), self.dp_groups(r)):
                usages.append((_pattern(groups), False))
            if pp > 1:
                for dst in sorted({(r + 1) % pp, (r - 1) % pp}):
                    usages.append((_pattern(self.p2p_pairs(r, dst)), True))
        for a, b in collective_pairs:
            usages.append((_pattern(self.p2p_pairs(a, b)), False))
        return shares_evenly(usages)


def _pattern(instances: list[CommInstance]) -> Pattern:
    pattern = instances[0].pattern
    assert pattern is not None
    return pattern


def group_instances(groups: list[tuple[int, ...]], gpus_per_node: int) -> list[CommInstance]:
    """Collectives over `groups` running at once: a group spanning nodes shares each of its nodes' NICs with every
    other spanning group touching that node."""
    nodes_of = [{g // gpus_per_node for g in group} for group in groups]
    load: Counter[int] = Counter()
    for ns in nodes_of:
        if len(ns) > 1:
            load.update(ns)
    pattern = Pattern(tuple(groups), gpus_per_node)
    out = []
    for group, ns in zip(groups, nodes_of, strict=True):
        if len(ns) > 1:
            out.append(CommInstance(group, "inter", max(load[n] for n in ns), pattern))
        else:
            out.append(CommInstance(group, "intra", 1, pattern))
    return out


def pair_instances(pairs: list[tuple[int, int]], gpus_per_node: int) -> list[CommInstance]:
    """Point-to-point transfers (sender, receiver) running at once; sends leaving a node share its NICs, as do
    receives entering one (per direction)."""
    gpn = gpus_per_node
    crossing = [(a, b) for a, b in pairs if a // gpn != b // gpn]
    out_load = Counter(a // gpn for a, _ in crossing)
    in_load = Counter(b // gpn for _, b in crossing)
    pattern = Pattern(tuple(pairs), gpn)
    out = []
    for a, b in pairs:
        if a // gpn != b // gpn:
            out.append(CommInstance((a, b), "inter", max(out_load[a // gpn], in_load[b // gpn]), pattern))
        else:
            out.append(CommInstance((a, b), "intra", 1, pattern))
    return out

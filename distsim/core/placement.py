"""Placement of ranks on GPUs and of GPUs on nodes; from it every collective knows its scope.

Ranks are laid out with tensor parallelism innermost, then data, then pipeline (Megatron-LM's order) unless another
``order`` is given. ``grid[stage, replica, tp_rank]`` is the GPU of that coordinate. Communication *patterns* (the
tp groups of a stage, the dp groups of a stage, the p2p pairs between two stages) are the sets of symmetric
instances that run at the same time; for each instance the placement reports its scope (intra/inter node) and how many
instances share a node's NICs at once. Each instance also keeps its :class:`Pattern` (the instances running beside
it), from which fair link sharing reads how the pattern loads each node's NICs.

A placement's patterns are arrays (:class:`Instances`), counted with numpy, and computed once per shape
(:class:`Layout`, shared by every placement of the same degrees, rank order and node size): at 131,072 GPUs a pattern
has 8,192 instances, while a symmetric simulation asks for one of them, and the estimate of a flow's size, the
symmetry check and the flow's builder all ask for the same patterns. :func:`group_instances` and
:func:`pair_instances` place any list of groups (a stages or burst plan's) one by one, with the same results.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np

from distsim.core.cluster import Cluster
from distsim.core.errors import StrategyError
from distsim.core.lazy import RowsOnDemand
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
    :func:`group_instances` or :func:`pair_instances` placed, or a :class:`Placement`'s :class:`Instances`) and how
    they load the nodes' NICs, per direction.

    A collective (a ring or tree across nodes) sends and receives through the NICs of every node it spans, once per
    instance however many of its GPUs a node holds; a transfer (sender, receiver) sends through the sender's node's
    NICs and receives through the receiver's. Instances inside one node use no NIC. `groups` is a tuple of GPU
    tuples or an (instances, GPUs) array; groups of one size are counted with numpy (a placement of 131,072 GPUs
    has patterns of 8,192 instances), groups of different sizes one by one."""

    groups: tuple[tuple[int, ...], ...] | np.ndarray
    gpus_per_node: int
    _usage: dict[bool, tuple[tuple[int, int], ...]] = field(default_factory=dict, init=False, repr=False)

    @cached_property
    def nodes(self) -> np.ndarray | None:
        """The groups' nodes as an (instances, group size) array; None when the groups differ in size."""
        groups = self.groups
        if isinstance(groups, np.ndarray):
            return groups // self.gpus_per_node
        if not groups or len({len(g) for g in groups}) > 1:
            return None
        return np.asarray(groups, dtype=np.int64) // self.gpus_per_node

    @cached_property
    def collective_load(self) -> tuple[Load, Load]:
        """(sending, receiving) load of the groups run as collectives: per node, the groups spanning nodes that
        touch it (the same both ways)."""
        if self.nodes is None:
            load: Counter[int] = Counter()
            for group in self.groups:
                nodes = {g // self.gpus_per_node for g in group}
                if len(nodes) > 1:
                    load.update(nodes)
            out = tuple(sorted(load.items()))
            return out, out
        ordered, first, spans = _spanned(self.nodes)
        out = _counted(ordered[spans][first[spans]])
        return out, out

    @cached_property
    def transfer_load(self) -> tuple[Load, Load]:
        """(sending, receiving) load of the groups run as transfers from their first GPU to their last: per node,
        the transfers crossing nodes that leave it, and those that enter it."""
        if self.nodes is None:
            gpn = self.gpus_per_node
            sends: Counter[int] = Counter()
            receives: Counter[int] = Counter()
            for group in self.groups:
                a, b = group[0] // gpn, group[-1] // gpn
                if a != b:
                    sends[a] += 1
                    receives[b] += 1
            return tuple(sorted(sends.items())), tuple(sorted(receives.items()))
        a, b = self.nodes[:, 0], self.nodes[:, -1]
        crossing = a != b
        return _counted(a[crossing]), _counted(b[crossing])

    def usage(self, transfer: bool) -> tuple[tuple[int, int], ...]:
        """(NIC resource, instances using it) of the whole pattern, run as transfers or as collectives, sorted by
        resource (``2 n``: node n's NICs sending, ``2 n + 1``: receiving): what one simulated instance of a
        symmetric flow loads. Computed once per pattern (every transfer of a symmetric flow asks for it)."""
        found = self._usage.get(transfer)
        if found is None:
            tx, rx = self.transfer_load if transfer else self.collective_load
            found = self._usage[transfer] = tuple(sorted([(2 * n, k) for n, k in tx] + [(2 * n + 1, k) for n, k in rx]))
        return found

    def resources(self, transfer: bool) -> list[tuple[int, ...]]:
        """The NIC resources each instance crossing nodes uses (``2 n``: node n's NICs sending, ``2 n + 1``:
        receiving), run as transfers or as collectives."""
        gpn = self.gpus_per_node
        out = []
        for group in self.groups:
            if transfer:
                a, b = int(group[0]) // gpn, int(group[-1]) // gpn
                if a != b:
                    out.append((2 * a, 2 * b + 1))
            else:
                nodes = sorted({int(g) // gpn for g in group})
                if len(nodes) > 1:
                    out.append(tuple(2 * n + d for n in nodes for d in (0, 1)))
        return out

    def resource_array(self, transfer: bool) -> np.ndarray | None:
        """:meth:`resources` as an (instances crossing nodes, resources) array, in any order within a row; None
        when the groups differ in size or the crossing collectives span different numbers of nodes (their
        resource lists then differ in length)."""
        if self.nodes is None:
            return None
        if transfer:
            a, b = self.nodes[:, 0], self.nodes[:, -1]
            crossing = a != b
            return np.stack([2 * a[crossing], 2 * b[crossing] + 1], axis=1)
        ordered, first, spans = _spanned(self.nodes)
        first = first[spans]
        if not len(first):
            return np.empty((0, 0), dtype=np.int64)
        width = first.sum(axis=1)
        if (width != width[0]).any():
            return None
        nodes = ordered[spans][first].reshape(len(first), int(width[0]))
        return np.stack([2 * nodes, 2 * nodes + 1], axis=2).reshape(len(nodes), -1)


def _spanned(nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(each group's nodes sorted, the first occurrence of each node in its row, the groups spanning nodes) of an
    (instances, group size) array of nodes."""
    ordered = np.sort(nodes, axis=1)
    first = np.ones(ordered.shape, dtype=bool)
    first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    spans = ordered[:, 0] != ordered[:, -1] if ordered.shape[1] else np.zeros(len(ordered), dtype=bool)
    return ordered, first, spans


def _counted(nodes: np.ndarray) -> Load:
    """(node, occurrences) of the nodes in an array, sorted by node (what a Counter's sorted items give)."""
    if not len(nodes):
        return ()
    counts = np.bincount(nodes)
    used = np.flatnonzero(counts)
    return tuple(zip(used.tolist(), counts[used].tolist(), strict=True))


def shares_evenly(usages: Iterable[tuple[Pattern, bool]]) -> bool:
    """Whether every instance of each pattern sees the same NIC loads, so that one simulated instance can stand for
    all of them under fair link sharing. `usages`: the patterns a flow runs, each as transfers (True) or as
    collectives. Every NIC resource has a load vector (how many instances of each usage use it); the instances of a
    usage must each see the same multiset of load vectors on their resources. Then, whichever tasks are running,
    every instance's least share is the same, and is the least share over all the resources the pattern uses
    (what a symmetric simulation computes). Usages that never run at the same time are compared too (a sufficient
    condition, not a necessary one).

    Counted with numpy: each distinct load vector gets a number (a row of a resources x usages matrix), and an
    instance's multiset is its sorted row of numbers."""
    uses = list(usages)
    rows = [pattern.resource_array(transfer) for pattern, transfer in uses]
    if any(r is None and p.nodes is None for r, (p, _) in zip(rows, uses, strict=True)):
        return _shares_evenly_one_by_one(uses)  # groups of different sizes
    if any(r is None for r in rows):  # crossing collectives spanning different numbers of nodes
        return False
    loads = [pattern.transfer_load if transfer else pattern.collective_load for pattern, transfer in uses]
    top = max((n for tx, rx in loads for n, _ in (*tx, *rx)), default=-1)
    matrix = np.zeros((2 * (top + 1), len(uses)), dtype=np.int64)
    for k, (tx, rx) in enumerate(loads):
        for direction, load in enumerate((tx, rx)):
            if load:
                nodes, copies = np.asarray(load, dtype=np.int64).T
                matrix[2 * nodes + direction, k] = copies
    vector = np.unique(matrix, axis=0, return_inverse=True)[1].reshape(-1)
    for resources in rows:
        assert resources is not None
        if len(resources) > 1:
            signatures = np.sort(vector[resources], axis=1)
            if (signatures != signatures[0]).any():
                return False
    return True


def _shares_evenly_one_by_one(uses: list[tuple[Pattern, bool]]) -> bool:
    """:func:`shares_evenly` instance by instance (any groups, of any sizes)."""
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


class Instances(RowsOnDemand[CommInstance]):
    """The instances of one pattern of a placement as arrays: each instance's GPUs, whether it crosses nodes and its
    NIC sharers (what :func:`group_instances` and :func:`pair_instances` compute, counted with numpy). An
    instance's :class:`CommInstance` is built when it is asked for (a flow asks for the few it simulates), once."""

    def __init__(self, groups: np.ndarray, inter: np.ndarray, sharers: np.ndarray, gpus_per_node: int):
        self.groups, self.inter, self.sharers = groups, inter, sharers
        self.pattern = Pattern(groups, gpus_per_node)
        self._built: dict[int, CommInstance] = {}

    @classmethod
    def of_groups(cls, groups: np.ndarray, gpus_per_node: int) -> Instances:
        """Collectives over the rows of `groups`, as :func:`group_instances` places them."""
        ordered, first, spans = _spanned(groups // gpus_per_node)
        load = np.bincount(ordered[spans][first[spans]], minlength=int(ordered.max(initial=0)) + 1)
        sharers = np.where(spans, load[ordered].max(axis=1, initial=0), 1)
        return cls(groups, spans, sharers, gpus_per_node)

    @classmethod
    def of_pairs(cls, src: np.ndarray, dst: np.ndarray, gpus_per_node: int) -> Instances:
        """Transfers src[i] -> dst[i], as :func:`pair_instances` places them."""
        a, b = src // gpus_per_node, dst // gpus_per_node
        crossing = a != b
        top = int(max(a.max(initial=0), b.max(initial=0))) + 1
        sends = np.bincount(a[crossing], minlength=top)
        receives = np.bincount(b[crossing], minlength=top)
        sharers = np.where(crossing, np.maximum(sends[a], receives[b]), 1)
        return cls(np.stack([src, dst], axis=1), crossing, sharers, gpus_per_node)

    @cached_property
    def uniform(self) -> bool:
        """Whether every instance has one scope and one NIC sharing (one instance can stand for all)."""
        return len(self.inter) == 0 or bool((self.inter == self.inter[0]).all() and
                                            (self.sharers == self.sharers[0]).all())  # fmt: skip

    def __len__(self) -> int:
        return len(self.groups)

    def _row(self, i: int) -> CommInstance:
        inst = self._built.get(i)
        if inst is None:
            scope = "inter" if self.inter[i] else "intra"
            inst = self._built[i] = CommInstance(tuple(self.groups[i].tolist()), scope, int(self.sharers[i]),
                                                 self.pattern)  # fmt: skip
        return inst


class Layout:
    """Where the ranks of one shape sit (pp x dp x tp in a rank order, on nodes of some GPUs) and the instances of
    each of its communication patterns, computed once and shared by every :class:`Placement` of the shape
    (:func:`layout_of`): a command asks for the same patterns when it estimates the flow's size, checks symmetry
    and builds the flow, and a grid search asks again for every micro-batch size and schedule."""

    def __init__(self, pp: int, dp: int, tp: int, order: tuple[str, str, str], gpus_per_node: int):
        self.pp, self.dp, self.tp, self.gpus_per_node = pp, dp, tp, gpus_per_node
        sizes = {"tp": tp, "dp": dp, "pp": pp}
        stride, strides = 1, {}
        for dim in order:
            strides[dim] = stride
            stride *= sizes[dim]
        p = np.arange(pp)[:, None, None] * strides["pp"]
        d = np.arange(dp)[None, :, None] * strides["dp"]
        t = np.arange(tp)[None, None, :] * strides["tp"]
        self.grid = p + d + t
        self.grid.flags.writeable = False  # shared by every placement of the shape
        self._instances: dict[tuple, Instances] = {}
        self._evenly: dict[tuple[tuple[int, int], ...], bool] = {}

    def _memo(self, key: tuple, build: Callable[[], Instances]) -> Instances:
        found = self._instances.get(key)
        if found is None:
            found = self._instances[key] = build()
        return found

    def tp_groups(self, stage: int) -> Instances:
        return self._memo(("tp", stage), lambda: Instances.of_groups(self.grid[stage], self.gpus_per_node))

    def dp_groups(self, stage: int) -> Instances:
        return self._memo(("dp", stage), lambda: Instances.of_groups(self.grid[stage].T, self.gpus_per_node))

    def replica_groups(self, stage: int, k: int) -> Instances:
        def build() -> Instances:  # (dp / k groups, k replicas, tp) -> one row per (group, tp rank)
            blocks = self.grid[stage].reshape(self.dp // k, k, self.tp).transpose(0, 2, 1).reshape(-1, k)
            return Instances.of_groups(blocks, self.gpus_per_node)

        return self._memo(("replicas", stage, k), build)

    def p2p_pairs(self, src_stage: int, dst_stage: int) -> Instances:
        return self._memo(("p2p", src_stage, dst_stage), lambda: Instances.of_pairs(
            self.grid[src_stage].ravel(), self.grid[dst_stage].ravel(), self.gpus_per_node))  # fmt: skip

    @cached_property
    def patterns_uniform(self) -> bool:
        """Whether every pattern a uniform flow runs has one scope and NIC sharing over its instances: each stage's
        tp and dp groups, the transfers to the next and previous stage, and those between the first and last
        stage (tied embedding copies)."""
        pp = self.pp
        for r in range(pp):
            patterns = [self.tp_groups(r), self.dp_groups(r)]
            if pp > 1:  # the next and previous stage's transfers, and the tied embedding copies' (first and last)
                patterns += [self.p2p_pairs(r, (r + 1) % pp), self.p2p_pairs(r, (r - 1) % pp)]
                patterns.append(self.p2p_pairs(0, pp - 1))
            if not all(p.uniform for p in patterns):
                return False
        return True

    def shares_evenly(self, collective_pairs: Sequence[tuple[int, int]]) -> bool:
        """:meth:`Placement.shares_evenly`, once per set of `collective_pairs`."""
        key = tuple(collective_pairs)
        found = self._evenly.get(key)
        if found is None:
            pp = self.pp
            usages = []
            for r in range(pp):
                usages += [(self.tp_groups(r).pattern, False), (self.dp_groups(r).pattern, False)]
                if pp > 1:
                    usages += [(self.p2p_pairs(r, dst).pattern, True) for dst in sorted({(r + 1) % pp, (r - 1) % pp})]
            usages += [(self.p2p_pairs(a, b).pattern, False) for a, b in key]
            found = self._evenly[key] = shares_evenly(usages)
        return found


@lru_cache(maxsize=32)
def layout_of(pp: int, dp: int, tp: int, order: tuple[str, str, str], gpus_per_node: int) -> Layout:
    """The :class:`Layout` of a shape, built once per shape while it is among the 32 last asked for."""
    return Layout(pp, dp, tp, order, gpus_per_node)


@dataclass(frozen=True)
class Placement:
    strategy: Strategy
    cluster: Cluster
    order: tuple[str, str, str] = ("tp", "dp", "pp")

    @cached_property
    def layout(self) -> Layout:
        """The shape's layout and patterns, shared with every placement of the same shape."""
        s = self.strategy
        return layout_of(s.pp, s.dp, s.tp, tuple(self.order), self.cluster.gpus_per_node)  # type: ignore[arg-type]

    @property
    def grid(self) -> np.ndarray:
        """grid[stage, replica, tp_rank] -> GPU id (read-only: shared by the placements of the shape)."""
        return self.layout.grid

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
        return self.grid[stage].ravel().tolist()

    # ------------------------------------------------------------------------------------------- communication
    def tp_groups(self, stage: int) -> Instances:
        """One instance per replica: the tp ranks of that replica of the stage."""
        return self.layout.tp_groups(stage)

    def dp_groups(self, stage: int) -> Instances:
        """One instance per tp rank: the replicas of the stage holding that shard."""
        return self.layout.dp_groups(stage)

    def ep_groups(self, stage: int) -> Instances:
        """One instance per (expert-parallel group, tp rank): ep consecutive replicas of the stage holding that
        shard (Megatron-Core carves the expert-parallel groups out of the data-parallel ones, innermost first); the
        group of replica d and tp rank t is at index (d // ep) * tp + t."""
        return self.replica_groups(stage, self.strategy.ep)

    def cp_groups(self, stage: int) -> Instances:
        """The context-parallel groups, laid out as :meth:`ep_groups` (cp consecutive replicas: Megatron's
        tp-cp-dp-pp order)."""
        return self.replica_groups(stage, self.strategy.cp)

    def replica_groups(self, stage: int, k: int) -> Instances:
        """Groups of k consecutive replicas of the stage, one per (group, tp rank), at index (d // k) * tp + t."""
        return self.layout.replica_groups(stage, k)

    def p2p_pairs(self, src_stage: int, dst_stage: int) -> Instances:
        """One instance per (replica, tp rank): sender in src_stage to the same coordinate in dst_stage.

        Sharing is counted per direction: sends leaving a node compete with each other, not with receives.
        """
        return self.layout.p2p_pairs(src_stage, dst_stage)

    @cached_property
    def symmetric(self) -> bool:
        """Whether one GPU per pipeline rank can stand for the rank: its GPUs are equally fast (no straggler among
        them, or all alike), and every pattern's instances have one scope and NIC sharing
        (:attr:`Layout.patterns_uniform`, decided once per shape)."""
        if not self.layout.patterns_uniform:
            return False
        if not self.cluster.slowdown:
            return True
        speed = np.ones(int(self.grid.max()) + 1)
        for gpu, factor in reversed(self.cluster.slowdown):  # the first entry of a GPU wins, as in speed_factor
            if gpu < len(speed):
                speed[gpu] = factor
        return all(len(np.unique(speed[self.grid[r]])) == 1 for r in range(self.strategy.pp))

    def shares_evenly(self, collective_pairs: Sequence[tuple[int, int]] = ()) -> bool:
        """:func:`shares_evenly` over every pattern a uniform flow runs: each stage's tp and dp groups (collectives),
        the transfers to the next and previous stage, and the pairs of stages in `collective_pairs` (whose copies
        of tied layers are all-reduced: collectives over pairs)."""
        return self.layout.shares_evenly(collective_pairs)


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

"""Timeline: one row per event per GPU, shared by simulated and measured runs.

Columns: ``gpu, node, stream, kind, name, layer, stage, microbatch, start_s, end_s``. ``layer`` and ``microbatch``
are -1 where they do not apply (gradient all-reduce of a whole rank, optimizer step). ``stage`` is the (virtual)
pipeline stage of compute and p2p events and the pipeline rank of rank-wide events.

A simulated timeline may hold only the GPUs that were simulated; ``represents`` maps each of them to every GPU it
stands for, and :meth:`Timeline.expand` writes the rows out for all of them.

Its metrics (per-GPU busy, communication, exposed communication and idle time, bubble fraction, iteration time)
are the functions of :mod:`distsim.sim.metrics` (a layer above: this module does not import it), the same for
simulated and measured timelines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from itertools import chain
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = ("gpu", "node", "stream", "kind", "name", "layer", "stage", "microbatch", "start_s", "end_s")
COMM_COLUMNS = ("key", "bytes", "peer", "group")
"""What a row says of its event beyond :data:`COLUMNS` (a simulated timeline has them; a measured one where its
trace recorded them): ``key``, the event key (joins ``SimResult.cost_table()``'s ``event``); ``bytes``, what a
communication moves (0 for compute); ``peer``, the other GPU of a point-to-point transfer (-1 otherwise); ``group``,
the GPUs a communication spans, as ranges ("0-3, 8-11"; "" for compute)."""
STREAM_ORDER = ("host", "compute", "tp", "p2p", "dp", "gather", "link:intra", "link:inter")
COMPUTE_KINDS = ("forward", "backward", "optimizer", "recompute")
"""Device compute: ``recompute`` is a forward run again in backward (activation recomputation)."""
COMM_KINDS = ("tp_allreduce", "p2p", "dp_allreduce", "ep_alltoall", "cp_ring")
HOST_KINDS = ("launch",)
"""Rows of the host stream (the host enqueuing kernels): not device time, so not in a GPU's busy, comm or idle."""


@dataclass
class Timeline:
    df: pd.DataFrame
    gpus_per_node: int
    represents: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Simulated GPU -> GPUs it stands for (itself first). Empty: every GPU is in df."""
    groups: GroupMap | None = None
    """How a simulated GPU's groups and peers read on a GPU it stands for (:meth:`expand`); None: the rows copied
    to those GPUs say no peer and no group."""

    def __post_init__(self) -> None:
        missing = [c for c in COLUMNS if c not in self.df.columns]
        if missing:
            raise ValueError(f"timeline is missing columns {missing}")
        if not self.represents:
            self.represents = {int(g): (int(g),) for g in sorted(self.df["gpu"].unique())}

    # -------------------------------------------------------------------------------------------------- shape
    @property
    def gpus(self) -> list[int]:
        """Every GPU the timeline describes (expanded)."""
        return sorted(g for rep in self.represents.values() for g in rep)

    @property
    def is_expanded(self) -> bool:
        return all(len(r) == 1 for r in self.represents.values())

    @property
    def iteration_time_s(self) -> float:
        """From the first start to the last end of the rows (:func:`distsim.sim.metrics.iteration_time`)."""
        if self.df.empty:
            return 0.0
        return float(self.df["end_s"].max() - self.df["start_s"].min())

    def expand(self) -> Timeline:
        """Rows for every GPU: each simulated GPU's rows copied to the GPUs it stands for."""
        if self.is_expanded:
            return self
        codes = self.df["gpu"].to_numpy()
        parts = [self.copied(rep, targets, codes == rep) for rep, targets in self.represents.items()]
        import pandas as pd  # here, when rows are asked for: an import of a tenth of a second

        out = pd.concat(parts, ignore_index=True)
        out = out.sort_values(["gpu", "start_s", "end_s"], kind="stable").reset_index(drop=True)
        return Timeline(out, self.gpus_per_node)

    def copied(self, rep: int, targets: tuple[int, ...], rows: np.ndarray | None = None) -> pd.DataFrame:
        """The rows of simulated GPU `rep` (the mask or positions `rows`, if known) as they read on each of
        `targets` in turn: their GPU and node, and the groups and peers of :data:`COMM_COLUMNS` moved to them."""
        df = self.df
        part = df[df["gpu"].to_numpy() == rep] if rows is None else df.iloc[rows]
        n = len(part)
        block = part.iloc[np.tile(np.arange(n), len(targets))].reset_index(drop=True)
        gpu = np.repeat(np.asarray(targets, dtype=np.int64), n)
        block["gpu"] = gpu
        block["node"] = gpu // self.gpus_per_node
        if "group" in block.columns:
            _regroup(block, rep, targets, n, self.groups)
        return block


@dataclass(frozen=True)
class GroupMap:
    """The placement grid of a symmetric simulation (pipeline rank, data-parallel replica, tensor-parallel rank ->
    GPU), which says what a simulated GPU's communication group is on each GPU it stands for: those GPUs share its
    pipeline rank and differ in replica and tp rank, and each of their groups is the simulated GPU's moved by that
    difference. Along a dimension the group spans in blocks of k (all of tp, all of dp, an expert-parallel block of
    the replicas) it moves by whole blocks; along one it does not span, to the GPU's own coordinate."""

    grid: np.ndarray

    @cached_property
    def _coords(self) -> np.ndarray:
        coords = np.zeros((int(self.grid.max()) + 1, 3), dtype=np.int64)
        coords[self.grid.ravel()] = np.argwhere(np.ones(self.grid.shape, dtype=bool))
        return coords

    def moved(self, members: tuple[int, ...], src: int, dst: int) -> tuple[int, ...]:
        """`members` (a group of GPU `src`) as the same group of GPU `dst`."""
        c = self._coords[list(members)]
        here, there = self._coords[src], self._coords[dst]
        out = c.copy()
        for dim in (1, 2):
            k = len(np.unique(c[:, dim]))
            out[:, dim] = c[:, dim] + (there[dim] // k - here[dim] // k) * k if k > 1 else there[dim]
        return tuple(int(g) for g in self.grid[out[:, 0], out[:, 1], out[:, 2]])


def _regroup(block: pd.DataFrame, rep: int, targets: tuple[int, ...], n: int, groups: GroupMap | None) -> None:
    """The `group` and `peer` of `block` (`rep`'s `n` rows copied to each of `targets`, in order) made those of
    each target: each distinct group and peer moved once per target (:meth:`GroupMap.moved`)."""
    import pandas as pd

    column = block["group"]
    if not isinstance(column.dtype, pd.CategoricalDtype):
        return
    labels = column.cat.categories.tolist()
    codes = column.cat.codes.to_numpy().astype(np.int64)
    peer = block["peer"].to_numpy().copy()
    index = {label: i for i, label in enumerate(labels)}
    for i, target in enumerate(targets):
        if target == rep:
            continue
        rows = slice(i * n, (i + 1) * n)
        part, p = codes[rows], peer[rows]
        moved = {}
        for c in np.unique(part[part >= 0]).tolist():
            label = format_ranges(groups.moved(parse_ranges(labels[c]), rep, target)) if groups and labels[c] else ""
            moved[c] = index.setdefault(label, len(index))
        if moved:
            lookup = np.full(max(moved) + 1, -1, dtype=np.int64)
            lookup[list(moved)] = list(moved.values())
            codes[rows] = np.where(part >= 0, lookup[np.maximum(part, 0)], -1)
        for q in np.unique(p[p >= 0]).tolist():  # a transfer's group is its pair: the moved pair's other GPU
            p[p == q] = groups.moved((rep, q), rep, target)[1] if groups else -1
    block["group"] = pd.Categorical.from_codes(codes, categories=list(index))
    block["peer"] = peer


def parse_ranges(text: str) -> tuple[int, ...]:
    """The integers of :func:`format_ranges`'s text ("0-3, 8-11")."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(out)


def format_ranges(values: tuple[int, ...]) -> str:
    """'0-3, 8-11' for a set of integers: how a timeline's ``group`` column writes GPUs (:func:`parse_ranges` reads
    it back)."""
    vs = sorted(values)
    out, start, prev = [], vs[0], vs[0]
    for v in vs[1:]:
        if v != prev + 1:
            out.append(f"{start}-{prev}" if prev > start else str(start))
            start = v
        prev = v
    out.append(f"{start}-{prev}" if prev > start else str(start))
    return ", ".join(out)


def slot_rows(flow: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(task index, gpu, stream) of every timeline row of a flow: one per (gpu, stream) slot of every task but the
    interference shadows."""
    from distsim.sim.flow.events import KINDS

    slots = flow.slots
    counts = np.fromiter(map(len, slots), dtype=np.int64, count=len(slots))
    flat = list(chain.from_iterable(slots))
    gpu = np.fromiter(map(itemgetter(0), flat), dtype=np.int64, count=len(flat))
    stream = np.fromiter(map(itemgetter(1), flat), dtype=np.int8, count=len(flat))
    idx = np.repeat(np.arange(len(slots)), counts)
    rows = (np.asarray(flow.kind, dtype=np.int8) != KINDS.index("interference"))[idx]  # shadows: no rows
    return idx[rows], gpu[rows], stream[rows]


def from_flow(flow: Any, start_s: list[float], end_s: list[float]) -> Timeline:
    """Timeline rows of an executed event flow: one row per (gpu, stream) slot of every task."""
    import pandas as pd  # here, when rows are asked for: an import of a tenth of a second

    from distsim.sim.flow.events import KINDS, STREAMS

    idx, gpu, stream = slot_rows(flow)
    kind = np.asarray(flow.kind, dtype=np.int8)[idx]
    names = pd.Categorical(flow.name)
    df = pd.DataFrame(
        {
            "gpu": gpu,
            "node": gpu // flow.cluster.gpus_per_node,
            "stream": pd.Categorical.from_codes(stream, categories=list(STREAMS)),
            "kind": pd.Categorical.from_codes(kind, categories=list(KINDS)),
            "name": pd.Categorical.from_codes(names.codes[idx], categories=names.categories),
            "layer": np.asarray(flow.layer, dtype=np.int32)[idx],
            "stage": np.asarray(flow.stage, dtype=np.int32)[idx],
            "microbatch": np.asarray(flow.microbatch, dtype=np.int32)[idx],
            "start_s": np.asarray(start_s, dtype=np.float64)[idx],
            "end_s": np.asarray(end_s, dtype=np.float64)[idx],
            **comm_columns(flow, idx, gpu, kind),
        }
    )
    df = df.sort_values(["gpu", "start_s", "end_s"], kind="stable").reset_index(drop=True)
    groups = GroupMap(flow.placement.grid) if flow.placement is not None and flow.symmetric else None
    return Timeline(df, flow.cluster.gpus_per_node, dict(flow.represents), groups)


def comm_columns(flow: Any, idx: np.ndarray, gpu: np.ndarray, kind: np.ndarray) -> dict[str, Any]:
    """:data:`COMM_COLUMNS` of the rows (task `idx` on `gpu`, of `kind`) of an event flow: the key the task was
    costed by; the bytes its communication event moves (read from the key by
    :meth:`~distsim.sim.costs.CommEvent.of_key`); the group of its instance (recorded by the flow for transfers and
    data-parallel collectives; a stage template's tensor-, expert- and context-parallel ops, the group the placement
    gives their GPU), and a transfer's other GPU."""
    import pandas as pd

    from distsim.sim.costs import CommEvent
    from distsim.sim.flow.events import K_CP, K_EP, K_P2P, K_TP, KINDS

    keys = np.asarray(flow.key, dtype=np.int64)[idx]
    keys = np.where(keys < 0, len(flow.keys), keys)  # a host launch has no key: ""
    events = [CommEvent.of_key(k) for k in flow.keys]
    key_bytes = np.asarray([e.nbytes if e is not None else 0 for e in events] + [0], dtype=np.int64)
    comm = np.isin(kind, [KINDS.index(k) for k in COMM_KINDS])
    labels: dict[str, int] = {"": 0}
    n = len(flow.kind)
    task_group = np.zeros(n, dtype=np.int64)
    src = np.full(n, -1, dtype=np.int64)
    dst = np.full(n, -1, dtype=np.int64)
    known: dict[tuple[int, ...], int] = {}
    for tid, members in flow.members.items():
        code = known.get(members)
        if code is None:
            code = known[members] = labels.setdefault(format_ranges(members), len(labels))
        task_group[tid] = code
        if flow.kind[tid] == K_P2P and len(members) == 2:
            src[tid], dst[tid] = members
    group = task_group[idx]
    model_parallel = np.isin(kind, (K_TP, K_EP, K_CP)) & (group == 0)
    if model_parallel.any() and flow.placement is not None:
        pairs = np.unique(np.stack([gpu[model_parallel], kind[model_parallel]], axis=1), axis=0)
        code = {
            (g, k): labels.setdefault(format_ranges(model_group(flow, g, k)), len(labels)) for g, k in pairs.tolist()
        }
        group[model_parallel] = [code[(g, k)] for g, k in zip(gpu[model_parallel].tolist(),
                                                              kind[model_parallel].tolist(), strict=True)]  # fmt: skip
    s, d = src[idx], dst[idx]
    peer = np.where(s < 0, -1, np.where(gpu == s, d, s)).astype(np.int32)
    return {
        "key": pd.Categorical.from_codes(keys, categories=[*flow.keys, ""]),
        "bytes": np.where(comm, key_bytes[keys], 0),
        "peer": peer,
        "group": pd.Categorical.from_codes(group, categories=list(labels)),
    }


def model_group(flow: Any, gpu: int, kind: int) -> tuple[int, ...]:
    """The tensor- (K_TP), expert- (K_EP) or context-parallel (K_CP) group of `gpu` in a uniform strategy's
    placement: its tp ranks, or its block of ep (cp) replicas. The flow does not record these ops' groups
    (:attr:`~distsim.sim.flow.events.EventFlow.members`), so every reader that names them (these columns, the
    Chakra export) asks here."""
    from distsim.sim.flow.events import K_EP, K_TP

    grid = flow.placement.grid
    r, d, t = (int(x) for x in np.argwhere(grid == gpu)[0])
    if kind == K_TP:
        return tuple(int(g) for g in grid[r, d, :])
    k = flow.strategy.ep if kind == K_EP else flow.strategy.cp
    base = d - d % k
    return tuple(int(g) for g in grid[r, base : base + k, t])

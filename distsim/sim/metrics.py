"""Metrics of a timeline, the same for simulated and measured runs: per-GPU busy time, bubble fraction, exposed
communication, iteration time.

Per GPU, ``compute_s + exposed_comm_s + idle_s = iteration_time_s``: compute is the time compute kernels run,
exposed communication the time communication runs while no compute does, and idle the rest (pipeline bubbles and
waiting). Host rows (the host enqueuing kernels) count for the iteration's length but are not device time, so not in
a GPU's busy, communication or idle time. The bubble fraction is the mean idle share of the iteration (GPipe's
(S-1)/(M+S-1) for uniform stages without communication); the exposed communication of a run is the mean over GPUs.

Every metric is a pure function: of a :class:`~distsim.sim.timeline.Timeline` (:func:`of_timeline`, what
validation computes for a measured trace and for the prediction alike), of the rows as arrays
(:func:`stats_of_rows`), or of an executed event flow's task arrays (:func:`flow_stats`, what
:class:`~distsim.plans.result.SimResult` uses: a grid search never builds the timeline's DataFrame). All give the
same numbers for the same rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from distsim.core.lazy import RowsOnDemand
from distsim.sim.timeline import COMPUTE_KINDS, HOST_KINDS, Timeline


@dataclass(frozen=True)
class GPUStats:
    gpu: int
    node: int
    compute_s: float
    comm_s: float
    """Time any communication runs (overlapped or not)."""
    exposed_comm_s: float
    """Time communication runs while no compute does."""
    idle_s: float

    def to_dict(self) -> dict[str, float | int]:
        return {
            "gpu": self.gpu,
            "node": self.node,
            "busy_compute_s": self.compute_s,
            "comm_s": self.comm_s,
            "exposed_comm_s": self.exposed_comm_s,
            "idle_s": self.idle_s,
        }


STAT_FIELDS = ("compute_s", "comm_s", "exposed_comm_s", "idle_s")
"""The figures of a :class:`GPUStats`, in its order, after its GPU and node."""


class GPUStatsTable(RowsOnDemand[GPUStats]):
    """The :class:`GPUStats` of every GPU, in GPU order, kept as arrays: each GPU's class (the simulated GPU that
    stands for it) and each class's figures. A symmetric simulation of 131,072 GPUs has 16 classes: its figures
    are summed over columns (:meth:`column`) and its rows built as they are asked for, not one object per GPU.
    Equal to a list of the same :class:`GPUStats`."""

    def __init__(self, gpu: np.ndarray, of_class: np.ndarray, classes: np.ndarray, gpus_per_node: int):
        self.gpu, self.of_class, self.classes, self.gpus_per_node = gpu, of_class, classes, gpus_per_node

    def __len__(self) -> int:
        return len(self.gpu)

    def _row(self, i: int) -> GPUStats:
        g = int(self.gpu[i])
        return GPUStats(g, g // self.gpus_per_node, *self.classes[self.of_class[i]].tolist())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return len(self) == len(other) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"GPUStatsTable({len(self)} GPUs in {len(self.classes)} classes)"

    def column(self, name: str) -> np.ndarray:
        """One figure (a name of :data:`STAT_FIELDS`) of every GPU, in GPU order."""
        return self.classes[:, STAT_FIELDS.index(name)][self.of_class]

    def of_gpu(self, gpu: int) -> GPUStats:
        """The stats of GPU `gpu` (KeyError if the table does not hold it)."""
        i = int(np.searchsorted(self.gpu, gpu))
        if i == len(self.gpu) or self.gpu[i] != gpu:
            raise KeyError(gpu)
        return self[i]

    def to_dicts(self) -> list[dict[str, float | int]]:
        """:meth:`GPUStats.to_dict` of every GPU, in GPU order."""
        gpus = self.gpu.tolist()
        nodes = (self.gpu // self.gpus_per_node).tolist()
        figures = zip(*(self.column(name).tolist() for name in STAT_FIELDS), strict=True)
        return [{"gpu": g, "node": n, "busy_compute_s": c, "comm_s": m, "exposed_comm_s": x, "idle_s": i}
                for g, n, (c, m, x, i) in zip(gpus, nodes, figures, strict=True)]  # fmt: skip


def column(per_gpu: Sequence[GPUStats], name: str) -> list[float]:
    """One figure of every GPU as a list, in their order (summed as the objects' figures were)."""
    if isinstance(per_gpu, GPUStatsTable):
        return per_gpu.column(name).tolist()
    return [getattr(s, name) for s in per_gpu]


@dataclass(frozen=True)
class Metrics:
    """A run's iteration time and per-GPU stats, and the figures derived from them."""

    iteration_time_s: float
    per_gpu: Sequence[GPUStats]

    @property
    def bubble_fraction(self) -> float:
        return bubble_fraction(self.per_gpu, self.iteration_time_s)

    @property
    def exposed_comm_s(self) -> float:
        return mean_exposed_comm(self.per_gpu)


# ------------------------------------------------------------------------------------------------- intervals
def merge_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The disjoint segments (starts, ends, in time order) that a set of intervals covers; touching intervals
    join."""
    if len(starts) == 0:
        return np.empty(0), np.empty(0)
    order = np.argsort(starts, kind="stable")
    return _merge_sorted(starts[order], ends[order])


def _merge_sorted(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`merge_intervals` of intervals already in order of their starts."""
    if len(s) == 0:
        return np.empty(0), np.empty(0)
    reach = np.maximum.accumulate(e)
    breaks = np.empty(len(s), dtype=bool)
    breaks[0] = True
    breaks[1:] = s[1:] > reach[:-1]
    idx = np.flatnonzero(breaks)
    return s[breaks], np.maximum.reduceat(e, idx)


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length covered by a set of intervals."""
    seg_start, seg_end = merge_intervals(starts, ends)
    return float(np.sum(seg_end - seg_start))


# ------------------------------------------------------------------------------------------ figures of stats
def span(start_s: np.ndarray, end_s: np.ndarray) -> float:
    """From the first start to the last end of a set of rows (every stream, host rows included); 0 for none."""
    if len(start_s) == 0:
        return 0.0
    return float(end_s.max() - start_s.min())


def bubble_fraction(per_gpu: Sequence[GPUStats], iteration_s: float) -> float:
    """The mean idle share of an iteration of `iteration_s` over the GPUs (0 for none or an empty iteration)."""
    return sum(column(per_gpu, "idle_s")) / (len(per_gpu) * iteration_s) if iteration_s > 0 and per_gpu else 0.0


def mean_exposed_comm(per_gpu: Sequence[GPUStats]) -> float:
    """Mean over GPUs of the communication time not hidden behind compute."""
    return sum(column(per_gpu, "exposed_comm_s")) / len(per_gpu) if per_gpu else 0.0


# ----------------------------------------------------------------------------------------------- of a timeline
def iteration_time(timeline: Timeline) -> float:
    """From the first start to the last end of the timeline's rows, every stream included: the timeline's own
    :attr:`~distsim.sim.timeline.Timeline.iteration_time_s` (:func:`span` is the same of row arrays)."""
    return timeline.iteration_time_s


def gpu_stats(timeline: Timeline) -> GPUStatsTable:
    """Busy compute, communication, exposed communication and idle seconds of every GPU the timeline describes
    (expanded: a simulated GPU's stats stand for every GPU it represents)."""
    df = timeline.df
    kind = df["kind"].astype(str).to_numpy()
    return stats_of_rows(df["gpu"].to_numpy(), np.isin(kind, COMPUTE_KINDS), df["start_s"].to_numpy(),
                         df["end_s"].to_numpy(), timeline.represents, timeline.gpus_per_node,
                         ~np.isin(kind, HOST_KINDS))  # fmt: skip


def of_timeline(timeline: Timeline) -> Metrics:
    """The iteration time and per-GPU stats of a timeline, simulated or measured."""
    return Metrics(iteration_time(timeline), gpu_stats(timeline))


def busy_segments(timeline: Timeline) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Per simulated GPU (a key of ``represents``), the disjoint segments in which any of its device streams runs
    something, in seconds from the iteration's start (host rows, the enqueuing of kernels, are not device time);
    empty arrays for a GPU that runs nothing. Its idle time is the iteration minus their lengths."""
    df = timeline.df
    t0 = float(df["start_s"].min()) if len(df) else 0.0
    device = ~np.isin(df["kind"].astype(str).to_numpy(), HOST_KINDS)
    gpu = df["gpu"].to_numpy()[device]
    start, end = df["start_s"].to_numpy()[device] - t0, df["end_s"].to_numpy()[device] - t0
    out = {}
    for rep in timeline.represents:
        mine = gpu == rep
        out[rep] = merge_intervals(start[mine], end[mine])
    return out


# ------------------------------------------------------------------------------------------------ of row arrays
def stats_of_rows(gpu: np.ndarray, is_compute: np.ndarray, start_s: np.ndarray, end_s: np.ndarray,
                  represents: dict[int, tuple[int, ...]], gpus_per_node: int,
                  on_device: np.ndarray | None = None) -> GPUStatsTable:  # fmt: skip
    """:func:`gpu_stats` of rows given as arrays (any order): what a timeline's metrics need, without building the
    timeline (a grid search only wants the metrics). Rows not `on_device` (the host stream) count for the
    iteration's length but not for a GPU's busy time. The figures are computed once per simulated GPU and stand
    for every GPU it represents (:class:`GPUStatsTable`)."""
    t0 = float(start_s.min()) if len(start_s) else 0.0
    iteration = float(end_s.max() - t0) if len(end_s) else 0.0
    if on_device is not None and not on_device.all():
        gpu, is_compute, start_s, end_s = gpu[on_device], is_compute[on_device], start_s[on_device], end_s[on_device]
    order = np.argsort(gpu, kind="stable")
    ids, first = np.unique(gpu[order], return_index=True)
    ends = [*first[1:].tolist(), len(order)] if len(order) else []  # no device rows: every GPU idles
    bounds = dict(zip(ids.tolist(), zip(first.tolist(), ends, strict=True), strict=True))
    classes = []
    for rep in sorted(represents):
        if rep not in bounds:
            classes.append((0.0, 0.0, 0.0, iteration))
        else:
            rows = order[slice(*bounds[rep])]
            classes.append(_figures(is_compute[rows], start_s[rows] - t0, end_s[rows] - t0, iteration))
    return _table(classes, represents, gpus_per_node)


def _figures(c: np.ndarray, s: np.ndarray, e: np.ndarray, iteration: float) -> tuple[float, float, float, float]:
    """(compute, comm, exposed comm, idle) of one GPU from its device rows (compute or not, start and end from the
    iteration's start), in any order: unions of intervals, which do not depend on it. The rows are put in order of
    their starts once; the compute and communication rows keep that order (each union as its own sort gave it)."""
    order = np.argsort(s, kind="stable")
    c, s, e = c[order], s[order], e[order]
    compute = _sorted_length(s[c], e[c])
    comm = _sorted_length(s[~c], e[~c])
    busy = _sorted_length(s, e)
    return compute, comm, busy - compute, iteration - busy


def _sorted_length(s: np.ndarray, e: np.ndarray) -> float:
    """:func:`union_length` of intervals in order of their starts."""
    seg_start, seg_end = _merge_sorted(s, e)
    return float(np.sum(seg_end - seg_start))


def _table(classes: list[tuple[float, ...]], represents: dict[int, tuple[int, ...]],
           gpus_per_node: int) -> GPUStatsTable:  # fmt: skip
    """The table of the figures of each simulated GPU (`classes`, in GPU order) standing for the GPUs it
    represents."""
    members = [represents[rep] for rep in sorted(represents)]
    sizes = [len(targets) for targets in members]
    every = np.fromiter(chain.from_iterable(members), dtype=np.int64, count=sum(sizes))
    of_class = np.repeat(np.arange(len(classes)), sizes)
    by_gpu = np.argsort(every, kind="stable")  # as sorting the stats by GPU did
    table = np.asarray(classes, dtype=np.float64).reshape(len(classes), len(STAT_FIELDS))
    return GPUStatsTable(every[by_gpu], of_class[by_gpu], table, gpus_per_node)


def flow_stats(flow: Any, start_s: Sequence[float], end_s: Sequence[float]) -> tuple[float, GPUStatsTable]:
    """The iteration time and per-GPU stats of an executed flow (task start and end times), equal to those of
    :func:`~distsim.sim.timeline.from_flow`'s timeline, from the flow's arrays.

    Task by task, not row by row: tasks are grouped by their slots tuple (the builders share one per stream or
    group), and a GPU's rows are the tasks of the groups it is in. A full flow of 16 million tasks has 26 million
    rows; their arrays would take more memory than the flow itself. A task on two streams of one GPU gives it the
    same interval twice, which no union counts twice."""
    from distsim.sim.flow.events import KINDS

    kind = np.asarray(flow.kind, dtype=np.int8)
    start, end = np.asarray(start_s, dtype=np.float64), np.asarray(end_s, dtype=np.float64)
    perm, groups = slot_groups(flow)
    rowful = kind != KINDS.index("interference")  # shadows: no rows
    of_gpu: dict[int, list[tuple[int, int]]] = {}
    for a, b, slots in groups:
        if not slots:
            rowful[perm[a:b]] = False
        for g in dict.fromkeys(g for g, _ in slots):
            of_gpu.setdefault(g, []).append((a, b))
    t0 = float(start[rowful].min()) if rowful.any() else 0.0
    iteration = float(end[rowful].max() - t0) if rowful.any() else 0.0
    compute = np.isin(np.arange(len(KINDS)), [KINDS.index(k) for k in COMPUTE_KINDS])
    device = ~np.isin(np.arange(len(KINDS)), [KINDS.index(k) for k in (*HOST_KINDS, "interference")])
    classes = []
    for rep in sorted(flow.represents):
        spans = of_gpu.get(rep, [])
        tasks = np.concatenate([perm[a:b] for a, b in spans]) if spans else perm[:0]
        tasks = tasks[device[kind[tasks]]]
        if len(tasks) == 0:
            classes.append((0.0, 0.0, 0.0, iteration))
        else:
            classes.append(_figures(compute[kind[tasks]], start[tasks] - t0, end[tasks] - t0, iteration))
    return iteration, _table(classes, dict(flow.represents), flow.cluster.gpus_per_node)


def slot_groups(flow: Any) -> tuple[np.ndarray, list[tuple[int, int, tuple]]]:
    """A flow's task ids grouped by their slots tuple (:attr:`~distsim.sim.flow.events.EventFlow.slot_code`: by
    identity; equal tuples that are not shared make groups of their own): the ids in group order, and each group's
    (first position, end position, slots)."""
    codes = np.frombuffer(flow.slot_code, dtype=np.int32) if len(flow.slot_code) else np.empty(0, dtype=np.int32)
    sets = flow.slot_sets
    if len(sets) <= 1 << 16:  # numpy sorts 16-bit numbers in linear time (a radix sort)
        codes = codes.astype(np.uint16)
    perm = np.argsort(codes, kind="stable")
    counts = np.bincount(codes, minlength=len(sets)).tolist()
    out, at = [], 0
    for code, count in enumerate(counts):
        if count:
            out.append((at, at + count, sets[code]))
            at += count
    return perm, out


def of_flow(flow: Any, start_s: Sequence[float], end_s: Sequence[float]) -> Metrics:
    """:func:`of_timeline` of :func:`~distsim.sim.timeline.from_flow`'s timeline, without building it."""
    return Metrics(*flow_stats(flow, start_s, end_s))

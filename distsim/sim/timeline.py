"""Timeline: one row per event per GPU, shared by simulated and measured runs; metrics and Chrome-trace export.

Columns: ``gpu, node, stream, kind, name, layer, stage, microbatch, start_s, end_s``. ``layer`` and ``microbatch``
are -1 where they do not apply (gradient all-reduce of a whole rank, optimizer step). ``stage`` is the (virtual)
pipeline stage of compute and p2p events and the pipeline rank of rank-wide events.

A simulated timeline may hold only the GPUs that were simulated; ``represents`` maps each of them to every GPU it
stands for, and :meth:`Timeline.expand` writes the rows out for all of them.

Per GPU, ``compute_s + exposed_comm_s + idle_s = iteration_time_s``: compute is the time compute kernels run,
exposed communication the time communication runs while no compute does, and idle the rest (pipeline bubbles and
waiting). ``bubble_fraction`` is the mean idle share of the iteration (GPipe's (S-1)/(M+S-1) for uniform stages
without communication).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np
import pandas as pd

COLUMNS = ("gpu", "node", "stream", "kind", "name", "layer", "stage", "microbatch", "start_s", "end_s")
STREAM_ORDER = ("host", "compute", "tp", "p2p", "dp", "gather", "link:intra", "link:inter")
COMPUTE_KINDS = ("forward", "backward", "optimizer", "recompute")
"""Device compute: ``recompute`` is a forward run again in backward (activation recomputation)."""
COMM_KINDS = ("tp_allreduce", "p2p", "dp_allreduce")
HOST_KINDS = ("launch",)
"""Rows of the host stream (the host enqueuing kernels): not device time, so not in a GPU's busy, comm or idle."""


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


def merge_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The disjoint segments (starts, ends, in time order) that a set of intervals covers; touching intervals
    join."""
    if len(starts) == 0:
        return np.empty(0), np.empty(0)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
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


@dataclass
class Timeline:
    df: pd.DataFrame
    gpus_per_node: int
    represents: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """Simulated GPU -> GPUs it stands for (itself first). Empty: every GPU is in df."""

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
        if self.df.empty:
            return 0.0
        return float(self.df["end_s"].max() - self.df["start_s"].min())

    def expand(self) -> Timeline:
        """Rows for every GPU: each simulated GPU's rows copied to the GPUs it stands for."""
        if self.is_expanded:
            return self
        df = self.df
        parts = []
        codes = df["gpu"].to_numpy()
        for rep, targets in self.represents.items():
            rows = df[codes == rep]
            n = len(rows)
            block = rows.iloc[np.tile(np.arange(n), len(targets))].reset_index(drop=True)
            gpu = np.repeat(np.asarray(targets, dtype=np.int64), n)
            block["gpu"] = gpu
            block["node"] = gpu // self.gpus_per_node
            parts.append(block)
        out = pd.concat(parts, ignore_index=True)
        out = out.sort_values(["gpu", "start_s", "end_s"], kind="stable").reset_index(drop=True)
        return Timeline(out, self.gpus_per_node)

    # ------------------------------------------------------------------------------------------------- metrics
    def gpu_stats(self) -> list[GPUStats]:
        """Busy compute, communication, exposed communication and idle seconds of every GPU (expanded)."""
        df = self.df
        kind = df["kind"].astype(str).to_numpy()
        return stats_of_rows(df["gpu"].to_numpy(), np.isin(kind, COMPUTE_KINDS), df["start_s"].to_numpy(),
                             df["end_s"].to_numpy(), self.represents, self.gpus_per_node,
                             ~np.isin(kind, HOST_KINDS))  # fmt: skip

    def busy_segments(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Per simulated GPU (a key of ``represents``), the disjoint segments in which any of its device streams
        runs something, in seconds from the iteration's start (host rows, the enqueuing of kernels, are not device
        time); empty arrays for a GPU that runs nothing. Its idle time is the iteration minus their lengths."""
        df = self.df
        t0 = float(df["start_s"].min()) if len(df) else 0.0
        device = ~np.isin(df["kind"].astype(str).to_numpy(), HOST_KINDS)
        gpu = df["gpu"].to_numpy()[device]
        start, end = df["start_s"].to_numpy()[device] - t0, df["end_s"].to_numpy()[device] - t0
        out = {}
        for rep in self.represents:
            mine = gpu == rep
            out[rep] = merge_intervals(start[mine], end[mine])
        return out


def _ranges(values: tuple[int, ...]) -> str:
    """'0-3, 8-11' for a set of integers."""
    vs = sorted(values)
    out, start, prev = [], vs[0], vs[0]
    for v in vs[1:]:
        if v != prev + 1:
            out.append(f"{start}-{prev}" if prev > start else str(start))
            start = v
        prev = v
    out.append(f"{start}-{prev}" if prev > start else str(start))
    return ", ".join(out)


def stats_of_rows(gpu: np.ndarray, is_compute: np.ndarray, start_s: np.ndarray, end_s: np.ndarray,
                  represents: dict[int, tuple[int, ...]], gpus_per_node: int,
                  on_device: np.ndarray | None = None) -> list[GPUStats]:  # fmt: skip
    """:meth:`Timeline.gpu_stats` of rows given as arrays (any order): what a timeline's metrics need, without
    building the timeline (a grid search only wants the metrics). Rows not `on_device` (the host stream) count for
    the iteration's length but not for a GPU's busy time."""
    t0 = float(start_s.min()) if len(start_s) else 0.0
    iteration = float(end_s.max() - t0) if len(end_s) else 0.0
    if on_device is not None and not on_device.all():
        gpu, is_compute, start_s, end_s = gpu[on_device], is_compute[on_device], start_s[on_device], end_s[on_device]
    order = np.argsort(gpu, kind="stable")
    ids, first = np.unique(gpu[order], return_index=True)
    bounds = dict(zip(ids.tolist(), zip(first.tolist(), [*first[1:].tolist(), len(order)], strict=True), strict=True))
    out: list[GPUStats] = []
    for rep, targets in sorted(represents.items()):
        if rep not in bounds:
            stats = (0.0, 0.0, 0.0, iteration)
        else:
            rows = order[slice(*bounds[rep])]
            c, s, e = is_compute[rows], start_s[rows] - t0, end_s[rows] - t0
            compute = union_length(s[c], e[c])
            comm = union_length(s[~c], e[~c])
            busy = union_length(s, e)
            stats = (compute, comm, busy - compute, iteration - busy)
        for g in targets:
            out.append(GPUStats(g, g // gpus_per_node, *stats))
    return sorted(out, key=lambda x: x.gpu)


def _slot_rows(flow: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
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


def flow_stats(flow: Any, start_s: list[float], end_s: list[float]) -> tuple[float, list[GPUStats]]:
    """The iteration time and per-GPU stats of an executed flow, equal to those of :func:`from_flow`'s timeline."""
    from distsim.sim.flow.events import KINDS

    idx, gpu, _ = _slot_rows(flow)
    compute = np.isin(np.arange(len(KINDS)), [KINDS.index(k) for k in COMPUTE_KINDS])
    device = ~np.isin(np.arange(len(KINDS)), [KINDS.index(k) for k in HOST_KINDS])
    kind = np.asarray(flow.kind, dtype=np.int8)[idx]
    start, end = np.asarray(start_s, dtype=np.float64)[idx], np.asarray(end_s, dtype=np.float64)[idx]
    iteration = float(end.max() - start.min()) if len(idx) else 0.0
    return iteration, stats_of_rows(gpu, compute[kind], start, end, dict(flow.represents), flow.cluster.gpus_per_node,
                                    device[kind])  # fmt: skip


def from_flow(flow: Any, start_s: list[float], end_s: list[float]) -> Timeline:
    """Timeline rows of an executed event flow: one row per (gpu, stream) slot of every task."""
    from distsim.sim.flow.events import KINDS, STREAMS

    idx, gpu, stream = _slot_rows(flow)
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
        }
    )
    df = df.sort_values(["gpu", "start_s", "end_s"], kind="stable").reset_index(drop=True)
    return Timeline(df, flow.cluster.gpus_per_node, dict(flow.represents))

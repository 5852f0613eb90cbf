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
from itertools import chain
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

COLUMNS = ("gpu", "node", "stream", "kind", "name", "layer", "stage", "microbatch", "start_s", "end_s")
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
        import pandas as pd  # here, when rows are asked for: an import of a tenth of a second

        out = pd.concat(parts, ignore_index=True)
        out = out.sort_values(["gpu", "start_s", "end_s"], kind="stable").reset_index(drop=True)
        return Timeline(out, self.gpus_per_node)


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
        }
    )
    df = df.sort_values(["gpu", "start_s", "end_s"], kind="stable").reset_index(drop=True)
    return Timeline(df, flow.cluster.gpus_per_node, dict(flow.represents))

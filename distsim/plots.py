"""Matplotlib views of timelines. Functions take an optional Axes and return the Axes; nothing calls pyplot.show.

``gantt`` draws one row per GPU: compute kernels in the upper half of the row, communication (tensor-parallel,
pipeline p2p, data-parallel) in the lower half. When a timeline has more GPUs than ``max_rows`` it summarises: one row
per group of GPUs doing identical work (a pipeline rank of a symmetric simulation, or GPUs with the same stages),
labelled with how many GPUs the row stands for.
"""

from __future__ import annotations

from collections import defaultdict

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from distsim.timeline import Timeline, _ranges

KIND_COLORS = {
    "forward": "#4C78A8",
    "backward": "#72B7B2",
    "optimizer": "#54A24B",
    "tp_allreduce": "#B279A2",
    "p2p": "#E45756",
    "dp_allreduce": "#F58518",
}
KIND_LABELS = {
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer step",
    "tp_allreduce": "tensor-parallel all-reduce",
    "p2p": "pipeline send",
    "dp_allreduce": "gradient all-reduce",
}
COMPUTE_ROW = {"forward", "backward", "optimizer"}


def _rows(timeline: Timeline, max_rows: int) -> list[tuple[int, str]]:
    """(gpu whose events are drawn, row label) per row."""
    reps = timeline.represents
    if len(timeline.gpus) <= max_rows:
        tl = timeline.expand()
        return [(g, f"GPU {g} (n{g // tl.gpus_per_node})") for g in tl.gpus]
    if len(reps) <= max_rows and any(len(r) > 1 for r in reps.values()):
        return [(g, f"GPU {g}: {len(t)} GPUs ({_ranges(t)})") for g, t in sorted(reps.items())]
    # a full timeline with many GPUs: one row per distinct set of stages
    stages = timeline.df.groupby("gpu", observed=True)["stage"].agg(lambda s: tuple(sorted(set(s))))
    groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for gpu, st in stages.items():
        groups[st].append(int(gpu))
    rows = [(gs[0], f"GPU {gs[0]}: {len(gs)} GPUs like it") for _, gs in sorted(groups.items())]
    if len(rows) > max_rows:
        step = len(rows) / max_rows
        rows = [rows[int(i * step)] for i in range(max_rows)]
    return rows


def gantt(timeline: Timeline, ax: Axes | None = None, max_rows: int = 32, title: str | None = None) -> Axes:
    """Per-GPU timeline chart (time in ms)."""
    rows = _rows(timeline, max_rows)
    if ax is None:
        fig = Figure(figsize=(12, 1.2 + 0.45 * len(rows)))
        ax = fig.add_subplot()
    df = timeline.expand().df if len(timeline.gpus) <= max_rows else timeline.df
    t0 = float(df["start_s"].min()) if not df.empty else 0.0
    by_gpu = dict(tuple(df.groupby("gpu", observed=True)))
    seen: set[str] = set()
    for y, (gpu, _) in enumerate(rows):
        rows_df = by_gpu.get(gpu)
        if rows_df is None:
            continue
        for kind, part in rows_df.groupby("kind", observed=True):
            kind = str(kind)
            start = (part["start_s"].to_numpy() - t0) * 1e3
            width = (part["end_s"].to_numpy() - part["start_s"].to_numpy()) * 1e3
            ybase = y - 0.4 if kind in COMPUTE_ROW else y + 0.02
            ax.broken_barh(
                list(zip(start, width, strict=True)),
                (ybase, 0.38),
                facecolors=KIND_COLORS.get(kind, "#999999"),
                edgecolor="none",
            )
            seen.add(kind)
    ax.set_yticks(range(len(rows)), [label for _, label in rows])
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlabel("time (ms)")
    ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=KIND_COLORS[k], label=KIND_LABELS[k]) for k in KIND_COLORS if k in seen]
    height_in = max(0.5, ax.get_position().height * ax.figure.get_figheight())  # below the tick labels and x-label
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.62 / height_in),
              ncol=min(6, len(handles)), frameon=False, fontsize="small")  # fmt: skip
    if title:
        ax.set_title(title)
    return ax


def compare_gantt(predicted: Timeline, measured: Timeline, title: str = "") -> Figure:
    """Predicted (top) and measured (bottom) per-GPU timelines on one time axis."""
    rows = max(len(predicted.gpus), len(measured.gpus))
    fig = Figure(figsize=(12, 2.2 + 0.9 * rows))
    top, bottom = fig.subplots(2, 1, sharex=True)
    gantt(predicted, ax=top, title=f"predicted: {predicted.iteration_time_s * 1e3:.1f} ms")
    gantt(measured, ax=bottom, title=f"measured: {measured.iteration_time_s * 1e3:.1f} ms")
    top.get_legend().remove()
    top.set_xlabel("")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig

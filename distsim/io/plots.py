"""Matplotlib views of timelines. Functions take an optional Axes and return the Axes; nothing calls pyplot.show.

``gantt`` draws one row per GPU: compute kernels in the upper half of the row, communication (tensor-parallel,
pipeline p2p, data-parallel) in the lower half. When a timeline has more GPUs than ``max_rows`` it summarises: one row
per group of GPUs doing identical work (a pipeline rank of a symmetric simulation, or GPUs with the same stages),
labelled with how many GPUs the row stands for.

The figures made here are ``NotebookFigure``: a matplotlib ``Figure`` that Jupyter shows as a PNG when it ends a
cell (``gantt(timeline).figure``) or is passed to ``IPython.display.display``, with or without ``%matplotlib inline``
and without pyplot. Elsewhere ``fig.savefig(path)`` writes it.
"""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Sequence

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from distsim.core.errors import DistsimError
from distsim.sim.timeline import Timeline, format_ranges

KIND_COLORS = {
    "forward": "#4C78A8",
    "backward": "#72B7B2",
    "optimizer": "#54A24B",
    "recompute": "#EECA3B",
    "tp_allreduce": "#B279A2",
    "ep_alltoall": "#9D755D",
    "cp_ring": "#FF9DA6",
    "p2p": "#E45756",
    "dp_allreduce": "#F58518",
    "launch": "#BAB0AC",
}
KIND_LABELS = {
    "forward": "forward",
    "backward": "backward",
    "optimizer": "optimizer step",
    "recompute": "recomputed forward",
    "tp_allreduce": "tensor-parallel collective",
    "ep_alltoall": "expert-parallel all-to-all",
    "cp_ring": "context-parallel ring (exposed)",
    "p2p": "pipeline send",
    "dp_allreduce": "data-parallel collective",
    "launch": "host enqueuing kernels",
}
COMPUTE_ROW = {"forward", "backward", "optimizer", "recompute"}


class NotebookFigure(Figure):
    """A ``Figure`` that IPython/Jupyter displays as a PNG. matplotlib only registers its figure display hook with
    pyplot (matplotlib-inline's backend), so a pyplot-free ``Figure`` would show as ``<Figure size ... >`` text."""

    def _repr_png_(self) -> bytes:
        buf = io.BytesIO()
        self.savefig(buf, format="png", bbox_inches="tight")  # tight, as Jupyter's inline backend: keeps the legend
        return buf.getvalue()


def _rows(timeline: Timeline, max_rows: int) -> list[tuple[int, str]]:
    """(gpu whose events are drawn, row label) per row."""
    reps = timeline.represents
    if len(timeline.gpus) <= max_rows:
        tl = timeline.expand()
        return [(g, f"GPU {g} (n{g // tl.gpus_per_node})") for g in tl.gpus]
    if len(reps) <= max_rows and any(len(r) > 1 for r in reps.values()):
        return [(g, f"GPU {g}: {len(t)} GPUs ({format_ranges(t)})") for g, t in sorted(reps.items())]
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
    """Per-GPU timeline chart (time in ms); gradient all-reduces are outlined in white, so that buckets issued back
    to back (WFBP's layers, MG-WFBP's merged groups) can be told apart."""
    rows = _rows(timeline, max_rows)
    if ax is None:
        fig = NotebookFigure(figsize=(12, 1.2 + 0.45 * len(rows)))
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
            ybase, height = (y - 0.4, 0.38) if kind in COMPUTE_ROW else (y + 0.02, 0.38)
            if kind == "launch":  # a thin strip along the top of the GPU's row
                ybase, height = y - 0.49, 0.08
            separate = kind == "dp_allreduce"  # back-to-back gradient buckets stay countable
            ax.broken_barh(
                list(zip(start, width, strict=True)),
                (ybase, height),
                facecolors=KIND_COLORS.get(kind, "#999999"),
                edgecolor="white" if separate else "none",
                linewidth=0.8 if separate else 0.0,
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


def compare_gantt(predicted: Timeline, measured: Timeline, title: str = "") -> NotebookFigure:
    """Predicted (top) and measured (bottom) per-GPU timelines on one time axis."""
    rows = max(len(predicted.gpus), len(measured.gpus))
    fig = NotebookFigure(figsize=(12, 2.2 + 0.9 * rows))
    top, bottom = fig.subplots(2, 1, sharex=True)
    gantt(predicted, ax=top, title=f"predicted: {predicted.iteration_time_s * 1e3:.1f} ms")
    gantt(measured, ax=bottom, title=f"measured: {measured.iteration_time_s * 1e3:.1f} ms")
    top.get_legend().remove()
    top.set_xlabel("")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def search_bars(
    table: pd.DataFrame,
    metric: str = "samples_per_s",
    ax: Axes | None = None,
    title: str | None = None,
    max_bars: int = 60,
) -> Axes:
    """Bar chart of a search's configurations (a ``GridResult.table()``), as DistSim's Fig. 12: one bar per
    configuration in enumeration order, those that do not fit in memory drawn at zero and marked OOM. With more than
    `max_bars` configurations, the best `max_bars` by rank."""
    df = table
    if len(df) > max_bars:
        df = df.nsmallest(max_bars, "rank")
    elif "index" in df:
        df = df.sort_values("index")
    labels = [
        f"{s}\nmbs{m} {sch}" if multi else str(s)
        for s, m, sch, multi in zip(df["strategy"], df["mbs"], df["schedule"], [_varies(table)] * len(df), strict=True)
    ]
    values = df[metric].fillna(0.0).to_numpy()
    if ax is None:
        fig = NotebookFigure(figsize=(max(6.0, 0.45 * len(df) + 2), 4.2))
        ax = fig.add_subplot()
    best = int(df["rank"].to_numpy().argmin()) if len(df) else -1
    colors = ["#E45756" if i == best else "#4C78A8" for i in range(len(df))]
    ax.bar(range(len(df)), values, color=colors)
    top = float(values.max()) if len(values) else 1.0
    for i, fits in enumerate(df["fits"]):
        if not fits:
            ax.text(i, top * 0.01, "OOM", rotation=90, ha="center", va="bottom", fontsize="x-small", color="#666666")
    ax.set_xticks(range(len(df)), labels, rotation=90, fontsize="x-small")
    ax.set_ylabel(
        {"samples_per_s": "throughput (samples/s)", "tokens_per_s": "throughput (tokens/s)"}.get(metric, metric)
    )
    ax.grid(axis="y", alpha=0.3)
    if title:
        ax.set_title(title)
    return ax


def _varies(table: pd.DataFrame) -> bool:
    return table["mbs"].nunique() > 1 or table["schedule"].nunique() > 1


MODE_COLORS = {"bulk": "#E45756", "wfbp": "#4C78A8", "ddp": "#72B7B2", "mgwfbp": "#F58518",
               "mgwfbp-optimal": "#54A24B"}  # fmt: skip


def speedup_curves(table: pd.DataFrame, modes: Sequence[str], ax: Axes | None = None, title: str | None = None) -> Axes:
    """Speedup S(N) against workers N per gradient synchronisation mode (a ``WorkerSweep.table()``: columns
    ``workers`` and ``speedup_<mode>``), as MG-WFBP's scaling figures: log2 workers, linear speedup, with the ideal
    S(N) = N dotted (clipped to the data, so that it does not flatten the curves). Earlier modes are drawn wider, so
    that a mode that converges to another (MG-WFBP to SyncEASGD) stays visible under it."""
    if ax is None:
        fig = NotebookFigure(figsize=(6.4, 4.2))
        ax = fig.add_subplot()
    workers = table["workers"].to_numpy()
    top = 0.0
    for k, mode in enumerate(modes):
        values = table[f"speedup_{mode}"].to_numpy()
        top = max(top, float(values.max()) if len(values) else 0.0)
        width = 1.5 + 3.0 * (len(modes) - 1 - k) / max(1, len(modes) - 1)  # earlier modes wider: equal curves show
        ax.plot(workers, values, marker="o", markersize=2 + width, linewidth=width, alpha=0.85, label=mode,
                color=MODE_COLORS.get(mode))  # fmt: skip
    ax.plot(workers, workers, linestyle=":", color="#888888", label="ideal, S(N) = N")
    ax.set_xscale("log", base=2)
    ax.set_ylim(0, top * 1.15 if top > 0 else 1.0)
    ax.set_xlabel("workers N (GPUs, data parallel)")
    ax.set_ylabel("speedup S(N) = N t_1 / t_iter(N)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    if title:
        ax.set_title(title, fontsize="medium")
    return ax


def scaling_curves(table: pd.DataFrame, columns: Sequence[str], ylabel: str, ax: Axes | None = None,
                   title: str | None = None, x: str = "gpus") -> Axes:  # fmt: skip
    """One curve per column of `table` against its `x` column (GPUs, log2 axis): a strong-scaling figure, e.g. the
    iteration time of a burst plan and of plain data parallelism as the GPUs grow at a fixed global batch, or the
    cluster's throughput with and without a collocated background job. Missing values (NaN) leave gaps."""
    if table.empty:
        raise DistsimError("scaling_curves: the table has no rows to plot")
    missing = [c for c in (x, *columns) if c not in table.columns]
    if missing:
        raise DistsimError(f"scaling_curves: the table has no column {missing[0]!r}")
    if ax is None:
        fig = NotebookFigure(figsize=(6.4, 4.2))
        ax = fig.add_subplot()
    xs = table[x].to_numpy()
    for column in columns:
        ax.plot(xs, table[column].to_numpy(), marker="o", linewidth=2, alpha=0.85, label=column)
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(v) for v in xs])
    ax.set_xlabel("GPUs" if x == "gpus" else x)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    if title:
        ax.set_title(title, fontsize="medium")
    return ax


def cluster_sim_figure(results: Sequence, title: str = "") -> NotebookFigure:
    """Cluster-trace simulation results (:class:`~distsim.elastic.cluster_sim.ClusterSimResult`), side by side:
    the JCT CDF (log time) and the GPU allocation ratio over time, one line per scheduler."""
    fig = NotebookFigure(figsize=(11, 4))
    ax_cdf, ax_alloc = fig.subplots(1, 2)
    for res in results:
        jct = res.jct_s
        ax_cdf.step(jct, [(i + 1) / len(jct) for i in range(len(jct))], where="post", label=res.scheduler)
        total, t0 = sum(res.gpus.values()), min(res.arrival_s.values())
        end = max(res.finish_s.values())
        times = [(t - t0) / 3600 for t, _ in res.allocated] + [(end - t0) / 3600]
        ratios = [n / total for _, n in res.allocated] + [res.allocated[-1][1] / total]
        ax_alloc.step(times, ratios, where="post", label=res.scheduler)
    ax_cdf.set_xscale("log")
    ax_cdf.set_xlabel("job completion time (s)")
    ax_cdf.set_ylabel("fraction of jobs")
    ax_cdf.set_title("JCT CDF")
    ax_cdf.legend(loc="lower right")
    ax_alloc.set_xlabel("time since first arrival (h)")
    ax_alloc.set_ylabel("GPUs allocated / cluster GPUs")
    ax_alloc.set_ylim(0, 1.05)
    ax_alloc.set_title("GPU allocation ratio")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig

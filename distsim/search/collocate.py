"""Collocation (DeepPool's GPU multiplexing, Park et al. section 5): a background training job on each GPU fills the
time the foreground leaves idle.

The model, step by step:

* **Who hosts a background job.** The foreground (any plan or strategy) is simulated alone. Every GPU of the
  cluster with usable idle time in that timeline (gaps of at least ``min_gap_s``, below; a GPU the foreground does
  not use is idle all iteration) runs one background job: its own model at its own batch on that one GPU (DeepPool's
  background jobs are single-GPU, its section 1), at lower priority (CUDA stream priorities). A GPU that is never
  idle gets none, and is not slowed. Hosts are decided once, on the foreground alone: a GPU that idles only once
  others are slowed gets no job (no second pass).
* **Interference.** On a hosting GPU the foreground's compute (forward, backward, optimizer step) takes ``1 + f`` as
  long, f from :meth:`~distsim.sim.costs.CostSource.collocation_slowdown` (measured by ``distsim profile
  --collocation``,
  else DeepPool's reported bound, :data:`~distsim.sim.costs.DEEPPOOL_COLLOCATION_SLOWDOWN`), and the foreground is
  simulated again on that cluster (:meth:`~distsim.core.cluster.Cluster.with_slowdown`, the stragglers' mechanism, which
  stretches compute and not communication; a straggler's own factor multiplies). Communication is not stretched:
  DeepPool's runtime pauses collocation while the foreground runs an operator seen to suffer from it (section 5:
  NCCL's all-reduce "more than doubles in execution time" otherwise), so a collective runs as alone and the
  background gets no time while one runs, which is why communication counts as busy below.
* **The background's share.** On each hosting GPU, the idle gaps of the *collocated* foreground timeline: time in
  which none of the GPU's device streams runs foreground work (the union of its busy intervals, host rows aside).
  The iteration repeats, so a GPU's idle tail and the next iteration's idle head are one gap. Gaps shorter than
  ``min_gap_s`` are left unused: the background's kernels cannot be preempted, so a gap shorter than one of its
  layers is not worth starting one in; by default ``min_gap_s`` is the background's mean compute event (a layer's
  forward or backward at its batch, :func:`background_grain`). The background runs in the rest at its full speed
  (a fluid model: its kernels fill a gap end to end; what the last one overrunning the gap costs the foreground is
  part of what f stands for). Background iterations per second on the GPU = usable idle per foreground iteration /
  background iteration time / foreground iteration time.
* **Throughput.** Each job's samples per second; the cluster's total is their sum, DeepPool's metric ("total
  cluster throughput", section 7.1, where both roles run the same model so that samples are comparable; with two
  models a sample of each counts one).

The background's iteration time is the simulator's: its model as ``Strategy(micro_batch_size=batch)`` on one GPU of
the cluster, costed by the same cost source (forward and backward of every block, and its optimizer step).

Baselines (DeepPool's Figure 10): the foreground data-parallel over k GPUs with the background alone on each of the
other G - k ("Cluster Partition", k = 1, 2, 4, ... G; k = G is plain data parallelism with no background). The
foreground's data-parallel run is a burst plan with every layer on GPUs 0..k-1 (uneven shards when k does not divide
the batch), with the foreground's gradient synchronisation (a burst plan's bulk or wfbp; a strategy's bulk, else
wfbp), and needs k <= batch.

Not modelled: the background using SMs the foreground's own kernels leave free (it runs only in the gaps, as the
issue specifies, so the background's share is a lower bound there); memory per GPU is checked only as the largest
foreground GPU plus the background's peak (reported, :attr:`CollocationReport.memory_fits`), and a background that
does not fit in one GPU even alone is refused (:func:`check_background_fits`).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from distsim.core.cluster import Cluster
from distsim.core.errors import DistsimError
from distsim.core.models.graph import Model
from distsim.core.strategy import Strategy
from distsim.plans import Plan, burst_plan
from distsim.plans.simulate import DEFAULT_MAX_TASKS, SimResult, simulate
from distsim.sim import metrics
from distsim.sim.costs import AnalyticCosts, CollocationSlowdown, CostSource
from distsim.sim.flow.events import FlowOptions

DEFAULT_BACKGROUND_BATCH = 8
"""Samples per background iteration when none is given. Assumed: DeepPool runs its background jobs "with small batch
sizes in order to decrease their execution latencies" (section 5) without stating them."""


class CollocationError(DistsimError, ValueError):
    """Collocation parameters that make no sense (a negative slowdown or gap, no samples per iteration)."""


@dataclass(frozen=True)
class GPUShare:
    """One GPU's part in a collocated iteration (seconds per foreground iteration)."""

    gpu: int
    idle_s: float
    """Time no device stream of the collocated foreground runs anything."""
    usable_s: float
    """The part of it in gaps of at least the minimum usable gap: what the background runs in (<= idle_s)."""
    gaps: int
    """Usable gaps (the idle tail and head of the iteration counted as one)."""
    hosts: bool
    """Whether the GPU runs a background job (it had usable idle time alone)."""
    background_samples_per_s: float

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass(frozen=True)
class Split:
    """A static partition: the foreground data-parallel on `foreground_gpus`, a background job alone on each of the
    other `background_gpus`. ``iteration_s`` is None where the foreground cannot run on so many GPUs."""

    foreground_gpus: int
    background_gpus: int
    iteration_s: float | None
    foreground_samples_per_s: float
    background_samples_per_s: float
    fits_in_memory: bool
    note: str = ""

    @property
    def total_samples_per_s(self) -> float:
        return self.foreground_samples_per_s + self.background_samples_per_s

    def to_dict(self) -> dict[str, Any]:
        return {**vars(self), "total_samples_per_s": self.total_samples_per_s}


@dataclass(frozen=True)
class CollocationReport:
    """A foreground collocated with a background job on every GPU with idle time, and the baselines."""

    alone: SimResult = field(repr=False)
    """The foreground alone."""
    collocated: SimResult = field(repr=False)
    """The foreground with its compute stretched on the hosting GPUs."""
    background: SimResult = field(repr=False)
    """One iteration of the background job alone on one GPU."""
    background_batch: int
    slowdown: CollocationSlowdown
    """The interference factor f applied, and where it came from."""
    min_gap_s: float
    """The shortest idle gap the background used."""
    min_gap_given: bool
    """Whether `min_gap_s` was given (else it is the background's mean compute event, :func:`background_grain`)."""
    shares: tuple[GPUShare, ...]
    """Every GPU of the cluster."""
    splits: tuple[Split, ...] = ()
    """Static partitions, k = 1, 2, 4, ... G (the last, k = G, is plain data parallelism)."""

    # ---------------------------------------------------------------------------------------------- figures
    @property
    def gpus(self) -> int:
        return len(self.shares)

    @property
    def alone_iteration_s(self) -> float:
        return self.alone.iteration_time_s

    @property
    def collocated_iteration_s(self) -> float:
        return self.collocated.iteration_time_s

    @property
    def foreground_slowdown(self) -> float:
        """Collocated over alone iteration time (>= 1)."""
        return self.collocated_iteration_s / self.alone_iteration_s if self.alone_iteration_s > 0 else 1.0

    @property
    def foreground_samples_per_s(self) -> float:
        """The collocated foreground's throughput."""
        return self.collocated.throughput_samples_per_s

    @property
    def alone_samples_per_s(self) -> float:
        return self.alone.throughput_samples_per_s

    @property
    def background_iteration_s(self) -> float:
        return self.background.iteration_time_s

    @property
    def background_samples_per_s(self) -> float:
        return sum(s.background_samples_per_s for s in self.shares)

    @property
    def total_samples_per_s(self) -> float:
        """DeepPool's total cluster throughput: foreground plus background samples per second."""
        return self.foreground_samples_per_s + self.background_samples_per_s

    @property
    def hosts(self) -> list[int]:
        return [s.gpu for s in self.shares if s.hosts]

    @property
    def memory_fits(self) -> bool:
        """The largest foreground GPU's peak plus the background's peak fit in one GPU (where a job is hosted)."""
        if not self.hosts:
            return True
        fg = self.collocated.peak_memory_bytes
        return fg + self.background.peak_memory_bytes <= self.alone.cluster.gpu.memory_bytes

    @property
    def plain_dp(self) -> Split | None:
        """The foreground data-parallel over every GPU, no background (the last split), if computed."""
        return self.splits[-1] if self.splits and self.splits[-1].background_gpus == 0 else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "foreground": self.alone.label,
            "background": self.background.model.name,
            "background_batch": self.background_batch,
            "background_iteration_s": self.background_iteration_s,
            "gpus": self.gpus,
            "slowdown_fraction": self.slowdown.fraction,
            "slowdown_source": self.slowdown.source,
            "slowdown_detail": self.slowdown.detail,
            "min_gap_s": self.min_gap_s,
            "min_gap_given": self.min_gap_given,
            "foreground_alone_iteration_s": self.alone_iteration_s,
            "foreground_collocated_iteration_s": self.collocated_iteration_s,
            "foreground_slowdown": self.foreground_slowdown,
            "foreground_alone_samples_per_s": self.alone_samples_per_s,
            "foreground_samples_per_s": self.foreground_samples_per_s,
            "background_samples_per_s": self.background_samples_per_s,
            "total_samples_per_s": self.total_samples_per_s,
            "memory_fits": self.memory_fits,
            "per_gpu": [s.to_dict() for s in self.shares],
            "static_splits": [s.to_dict() for s in self.splits],
        }


# -------------------------------------------------------------------------------------------------- idle time
def idle_gaps(busy: tuple[np.ndarray, np.ndarray], iteration_s: float) -> list[float]:
    """The lengths of the idle gaps of one GPU over a repeating iteration of `iteration_s`, given its disjoint busy
    segments in time order (seconds from the iteration's start): the gaps between segments, and the idle tail plus
    the next iteration's idle head as one gap. An idle GPU has one gap, the whole iteration."""
    starts, ends = busy
    if len(starts) == 0:
        return [iteration_s] if iteration_s > 0 else []
    inner = (starts[1:] - ends[:-1]).tolist()
    wrap = float(starts[0]) + iteration_s - float(ends[-1])
    return [g for g in (*inner, wrap) if g > 0]


def usable(gaps: list[float], min_gap_s: float) -> list[float]:
    """The gaps the background can use: those at least `min_gap_s` long."""
    return [g for g in gaps if g >= min_gap_s]


def gpu_gaps(result: SimResult) -> dict[int, list[float]]:
    """Every GPU of the result's cluster -> its idle gaps per iteration (:func:`idle_gaps`); GPUs the foreground
    does not use are idle all iteration. A simulated GPU's gaps stand for every GPU it represents."""
    timeline = result.timeline
    iteration = result.iteration_time_s
    out = {g: idle_gaps((np.empty(0), np.empty(0)), iteration) for g in range(result.cluster.num_gpus)}
    for rep, busy in metrics.busy_segments(timeline).items():
        gaps = idle_gaps(busy, iteration)
        for g in timeline.represents[rep]:
            out[g] = gaps
    return out


# ------------------------------------------------------------------------------------------------- background
def one_gpu(cluster: Cluster) -> Cluster:
    """The cluster's GPU alone (a background job's machine)."""
    return replace(cluster, nodes=1, gpus_per_node=1, slowdown=())


def background_iteration(model: Model, cluster: Cluster, batch: int, costs: CostSource | None = None,
                         options: FlowOptions | None = None) -> SimResult:  # fmt: skip
    """One iteration of a single-GPU job of `model` at `batch` samples on the cluster's GPU: every block's forward
    and backward and the optimizer step, costed by `costs` (as ``distsim simulate --strategy 1M1P1D``)."""
    if batch < 1:
        raise CollocationError(f"a background job needs at least 1 sample per iteration, got {batch}")
    options = replace(options or FlowOptions(), symmetric=None)
    return simulate(model, one_gpu(cluster), Strategy(micro_batch_size=batch), costs, options)


def check_background_fits(background: SimResult, batch: int) -> None:
    """Refuse a background job whose one iteration does not fit in one GPU's memory even alone: it runs on one GPU
    (beside the foreground on a hosting GPU, alone on a static partition's), so no figure of the report could hold.
    (One that fits alone but not beside the foreground is reported: :attr:`CollocationReport.memory_fits`.)"""
    if background.fits_in_memory:
        return
    need, gpu = background.peak_memory_bytes, background.cluster.gpu
    states = max(m.states_bytes for m in background.memory)
    fix = ("its parameters, gradients and optimizer state alone do not fit: choose a smaller background model"
           if states > gpu.memory_bytes else "choose a smaller background batch or model")  # fmt: skip
    raise CollocationError(f"background {background.model.name} at batch {batch} needs {need / 1e9:,.2f} GB on one "
                           f"GPU, above the {gpu.memory_bytes / 1e9:,.2f} GB of one {gpu.name} (a background job "
                           f"runs on one GPU); {fix}")  # fmt: skip


def background_grain(background: SimResult) -> float:
    """The mean duration of the background's compute events (a layer's forward or backward at its batch; its
    optimizer step aside): the default shortest gap it uses."""
    from distsim.sim.flow.events import KINDS

    f = background.flow
    phases = {KINDS.index("forward"), KINDS.index("backward")}
    durations = [d for d, k in zip(f.duration_s, f.kind, strict=True) if k in phases]
    return sum(durations) / len(durations) if durations else 0.0


# --------------------------------------------------------------------------------------------------- baselines
def split_sizes(gpus: int) -> list[int]:
    """Foreground GPU counts of the static partitions: powers of two below `gpus`, then `gpus` (DeepPool's 1, 2, 4, 8
    on eight GPUs)."""
    out = [1 << i for i in range(gpus.bit_length()) if 1 << i < gpus]
    return [*out, gpus]


def data_parallel_sync(target: Strategy | Plan) -> str:
    """The burst-plan gradient synchronisation of the foreground's data-parallel baselines."""
    mode = target.strategy.grad_sync if isinstance(target, Plan) else target.grad_sync
    return mode if mode == "bulk" else "wfbp"


def static_splits(model: Model, cluster: Cluster, batch: int, grad_sync: str, background: SimResult,
                  background_batch: int, costs: CostSource | None = None, options: FlowOptions | None = None,
                  max_tasks: int | None = DEFAULT_MAX_TASKS) -> tuple[Split, ...]:  # fmt: skip
    """DeepPool's "Cluster Partition": for each k of :func:`split_sizes`, the foreground's batch data-parallel over
    GPUs 0..k-1 and the background alone on each of the other G - k."""
    total = cluster.num_gpus
    per_bg = background_batch / background.iteration_time_s if background.iteration_time_s > 0 else 0.0
    out = []
    for k in split_sizes(total):
        bg = (total - k) * per_bg
        if k > batch:
            out.append(Split(k, total - k, None, 0.0, bg, True, f"a batch of {batch} cannot be split over {k} GPUs"))
            continue
        plan = burst_plan(model, cluster, [k] * model.num_layers, batch, grad_sync=grad_sync)
        r = simulate(model, cluster, plan, costs, options, max_tasks=max_tasks)
        out.append(Split(k, total - k, r.iteration_time_s, r.throughput_samples_per_s, bg, r.fits_in_memory))
    return tuple(out)


# ------------------------------------------------------------------------------------------------------- main
def _check(slowdown: CollocationSlowdown, min_gap_s: float) -> None:
    if not (math.isfinite(slowdown.fraction) and slowdown.fraction >= 0):
        raise CollocationError(f"the collocation slowdown must be a finite number >= 0 (a fraction: 0.18 is 18 %), "
                               f"got {slowdown.fraction!r} ({slowdown.source})")  # fmt: skip
    if not (math.isfinite(min_gap_s) and min_gap_s >= 0):
        raise CollocationError(f"the minimum usable gap must be a finite number of seconds >= 0, got {min_gap_s!r}")


def collocation_report(
    model: Model, cluster: Cluster, foreground: Strategy | Plan, background: Model,
    costs: CostSource | None = None, *, background_batch: int = DEFAULT_BACKGROUND_BATCH,
    slowdown: float | None = None, min_gap_s: float | None = None, options: FlowOptions | None = None,
    alone: SimResult | None = None, hosts: Collection[int] | None = None, baselines: bool = True,
    max_tasks: int | None = DEFAULT_MAX_TASKS,
) -> CollocationReport:  # fmt: skip
    """`foreground` (a strategy or plan of `model` on `cluster`) collocated with a single-GPU job of `background` at
    `background_batch` samples on every GPU with usable idle time (see the module's notes for the model).

    `slowdown`: the interference factor f (a fraction; None: the cost source's, measured or DeepPool's 18 %);
    `min_gap_s`: the shortest idle gap the background can use (None: :func:`background_grain`); `alone`: the
    foreground's simulation alone if already run (with these costs and options, deterministic); `hosts`: the GPUs
    that may run a background job (None: every GPU; either way only those with usable idle time alone do);
    `baselines`: also simulate the static partitions."""
    costs = costs if costs is not None else AnalyticCosts(cluster)
    options = options or FlowOptions()
    figure = costs.collocation_slowdown() if slowdown is None else CollocationSlowdown(slowdown, "given")
    _check(figure, 0.0 if min_gap_s is None else min_gap_s)
    if alone is None:
        alone = simulate(model, cluster, foreground, costs, options, max_tasks=max_tasks)
    elif alone.sampled_iteration_s:
        raise CollocationError("collocation is computed from a deterministic simulation (no --samples)")
    bg = background_iteration(background, cluster, background_batch, costs, options)
    check_background_fits(bg, background_batch)
    given = min_gap_s is not None
    min_gap_s = min_gap_s if min_gap_s is not None else background_grain(bg)
    allowed = set(range(cluster.num_gpus)) if hosts is None else set(hosts)
    unknown = sorted(allowed - set(range(cluster.num_gpus)))
    if unknown:
        raise CollocationError(f"background GPU {unknown[0]} is not in the cluster (GPUs 0..{cluster.num_gpus - 1})")
    chosen = [g for g, gaps in gpu_gaps(alone).items() if g in allowed and usable(gaps, min_gap_s)]
    factors = dict(cluster.slowdown)
    for g in chosen:
        factors[g] = factors.get(g, 1.0) * (1 + figure.fraction)
    collocated = simulate(model, cluster.with_slowdown(factors), foreground, costs, options, max_tasks=max_tasks)
    iteration = collocated.iteration_time_s
    rate = background_batch / bg.iteration_time_s / iteration if bg.iteration_time_s > 0 and iteration > 0 else 0.0
    shares = []
    for g, gaps in sorted(gpu_gaps(collocated).items()):
        fill = usable(gaps, min_gap_s) if g in chosen else []
        shares.append(GPUShare(g, sum(gaps), sum(fill), len(fill), g in chosen, sum(fill) * rate))
    splits: tuple[Split, ...] = ()
    if baselines:
        splits = static_splits(model, cluster, alone.global_batch_size, data_parallel_sync(foreground), bg,
                               background_batch, costs, options, max_tasks)  # fmt: skip
    return CollocationReport(alone, collocated, bg, background_batch, figure, min_gap_s, given, tuple(shares), splits)

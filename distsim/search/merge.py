"""MG-WFBP's question as a search (Shi et al., TPDS; ALGORITHMS.md section 2): how should a data-parallel strategy
synchronise its gradients, which layers should MG-WFBP merge, and how does each choice scale with the workers?

* :func:`compare_sync` simulates one strategy under every gradient synchronisation mode of :mod:`distsim.core.sync`
  (``bulk`` is MG-WFBP's SyncEASGD, ``wfbp`` wait-free backprop, ``ddp`` PyTorch's buckets, ``mgwfbp`` the paper's
  greedy merge, ``mgwfbp-optimal`` the exact one) and reports, per mode, the iteration time, the communication left
  exposed per GPU, the all-reduces issued, the speedup over WFBP and, for the planned modes, the merge plan (layer
  groups with their gradient bytes) that a plan file records.
* :func:`sweep_workers` does what the paper's simulations do (4 to 2048 workers): pure data parallelism over N GPUs
  for each N, every mode's iteration time and MG-WFBP's speedup S(N) = N (t_f + t_b) / t_iter (Eqs. 4-5).

The simulator, not MG-WFBP's closed form, scores every mode: its timeline is the paper's (Eqs. 6-8; the tests pin the
two equal on a hand case) plus what the paper leaves out (the optimizer step, host launches where modelled, NCCL's
tree where it is faster). Pure logic: no torch and no files; ``distsim search merge`` prints, plots and writes plans.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import pandas as pd

from distsim.core.cluster import Cluster
from distsim.core.errors import DistsimError
from distsim.core.models.graph import Model
from distsim.core.partition import rank_layers
from distsim.core.strategy import Strategy
from distsim.core.sync import DDP_BUCKET_CAP_MB, MODES, tensor_bytes
from distsim.plans.simulate import simulate
from distsim.sim.costs import AnalyticCosts, CostSource
from distsim.sim.flow.events import K_DP, EventFlow, FlowOptions, resolve_partition
from distsim.sim.flow.uniform import merge_groups

BASELINE = "wfbp"
"""The mode speedups are measured against (MG-WFBP's baseline; always simulated)."""
PLANNERS = MappingProxyType({"greedy": "mgwfbp", "optimal": "mgwfbp-optimal"})
"""``--choose``: which planner's merge plan is written, by the mode that plans it."""
SWEEP_MODES = ("bulk", "wfbp", "mgwfbp")
"""The modes a worker sweep compares by default: SyncEASGD, WFBP and MG-WFBP, as the paper's simulations do."""

CostsFor = Callable[[Cluster], CostSource]
"""Costs for a cluster (a sweep resizes the cluster for every worker count, and costs depend on it)."""


class MergeSearchError(DistsimError, ValueError):
    """Input the merge search cannot work with (no data parallelism, an unknown mode, a worker count that does not
    fit the cluster's nodes)."""


@dataclass(frozen=True)
class MergeGroup:
    """One all-reduce of a merge plan: layers [lo, hi) and the gradient bytes it carries (per tensor-parallel shard)."""

    layers: tuple[int, int]
    nbytes: int

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]


@dataclass(frozen=True)
class ModeResult:
    """One gradient synchronisation mode on the compared strategy."""

    mode: str
    strategy: Strategy
    """The strategy as simulated (the compared one with ``grad_sync`` = this mode)."""
    iteration_time_s: float
    exposed_comm_s: float
    """Mean per GPU of the communication not hidden behind compute."""
    allreduces: int
    """Gradient all-reduces one GPU issues per iteration (the most over pipeline ranks)."""
    speedup_vs_wfbp: float
    """t_iter(wfbp) / t_iter(this mode): above 1 is faster than WFBP."""
    groups: tuple[MergeGroup, ...] = ()
    """A planned mode's merge plan, in layer order; empty for modes that plan nothing."""

    @property
    def planned(self) -> bool:
        return MODES[self.mode].planned


@dataclass(frozen=True)
class SyncComparison:
    """:func:`compare_sync`'s answer: one :class:`ModeResult` per mode, in the order asked (WFBP added if missing)."""

    model: Model
    cluster: Cluster
    strategy: Strategy
    """The compared strategy (its own ``grad_sync`` and groups are replaced by each mode's)."""
    results: tuple[ModeResult, ...]
    cost_source: str
    wall_time_s: float

    def result(self, mode: str) -> ModeResult:
        for r in self.results:
            if r.mode == mode:
                return r
        raise MergeSearchError(f"mode {mode} was not compared; compared: {', '.join(r.mode for r in self.results)}")

    def chosen(self, choose: str = "greedy") -> ModeResult:
        """The planned mode whose merge plan `choose` (``greedy`` or ``optimal``) picks."""
        if choose not in PLANNERS:
            raise MergeSearchError(f"choose one of {', '.join(PLANNERS)}, not {choose!r}")
        return self.result(PLANNERS[choose])

    def plan_strategy(self, choose: str = "greedy") -> Strategy:
        """The compared strategy with the chosen merge plan written out: ``grad_sync`` mgwfbp and explicit layer
        groups, so that simulating it (or a plan file of it) issues exactly the all-reduces the planner chose."""
        groups = tuple(g.layers for g in self.chosen(choose).groups)
        return self.strategy.with_(grad_sync="mgwfbp", grad_groups=groups)

    def table(self) -> pd.DataFrame:
        """One row per mode: iteration and exposed communication (ms), all-reduces, speedup over WFBP."""
        return pd.DataFrame(
            [
                {
                    "mode": r.mode,
                    "iteration_ms": r.iteration_time_s * 1e3,
                    "exposed_comm_ms": r.exposed_comm_s * 1e3,
                    "allreduces": r.allreduces,
                    "speedup_vs_wfbp": r.speedup_vs_wfbp,
                }
                for r in self.results
            ]
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.name,
            "cluster": self.cluster.name,
            "strategy": self.strategy.describe(),
            "cost_source": self.cost_source,
            "wall_time_s": self.wall_time_s,
            "modes": [
                {
                    "mode": r.mode,
                    "iteration_time_s": r.iteration_time_s,
                    "exposed_comm_s": r.exposed_comm_s,
                    "allreduces": r.allreduces,
                    "speedup_vs_wfbp": r.speedup_vs_wfbp,
                    "groups": [{"layers": list(g.layers), "bytes": g.nbytes} for g in r.groups] if r.planned else None,
                }
                for r in self.results
            ],
        }


def check_modes(modes: Iterable[str]) -> tuple[str, ...]:
    """`modes` without repeats, or MergeSearchError naming an unknown one and the registry's modes."""
    out = tuple(dict.fromkeys(modes))
    bad = [m for m in out if m not in MODES]
    if bad or not out:
        what = f"unknown gradient synchronisation {bad[0]!r}" if bad else "no gradient synchronisation mode given"
        raise MergeSearchError(f"{what}; choose from {', '.join(MODES)}")
    return out


def allreduces_per_gpu(flow: EventFlow) -> int:
    """Gradient all-reduces the busiest simulated GPU issues in the flow."""
    per_gpu = Counter(g for kind, slots in zip(flow.kind, flow.slots, strict=True) if kind == K_DP for g, _ in slots)
    return max(per_gpu.values(), default=0)


def layer_grad_bytes(model: Model, strategy: Strategy, costs: CostSource) -> dict[int, int]:
    """Gradient bytes of every layer as the pipeline rank holding it all-reduces them (one tensor-parallel shard;
    a tied copy whose original sits on the same rank carries only its own tensors), rounded as the flow rounds."""
    stage_ranges = resolve_partition(model, strategy, costs)
    grad_bytes = model.precision.grad_bytes
    out: dict[int, int] = {}
    for r in range(strategy.pp):
        held = set(rank_layers(stage_ranges, strategy.pp, r))
        for i in held:
            out[i] = sum(tensor_bytes(model.stored_tensors(i, held, strategy.tp), grad_bytes))
    return out


def compare_sync(
    model: Model,
    cluster: Cluster,
    strategy: Strategy,
    costs: CostSource | None = None,
    modes: Sequence[str] | None = None,
    options: FlowOptions | None = None,
) -> SyncComparison:
    """Simulate `strategy` under each gradient synchronisation mode (default: every registered mode) and report
    iteration time, exposed communication, all-reduces, speedup over WFBP and the planned modes' merge plans.

    The strategy's own ``grad_sync`` and layer groups are set aside: every mode plans (or buckets) for itself. WFBP
    is always simulated, as the speedups' baseline. A strategy without data parallelism (dp = 1) is refused: it has
    nothing to synchronise, so every mode would be the same iteration.
    """
    t0 = time.perf_counter()
    if strategy.dp == 1:
        n = cluster.num_gpus
        hint = f"e.g. 1M1P{n}D, pure data parallelism" if n > 1 else f"--nodes gives {cluster.name} more GPUs than 1"
        raise MergeSearchError(
            f"{strategy} has dp = 1: nothing to synchronise (no replicas exchange gradients), so every mode is the "
            f"same iteration; give a strategy with dp > 1 ({hint})"
        )
    modes = check_modes(MODES if modes is None else modes)
    modes = modes if BASELINE in modes else (*modes, BASELINE)
    costs = costs if costs is not None else AnalyticCosts(cluster)
    base = strategy.with_(grad_sync="bulk", grad_groups=())
    simulated = {}
    for mode in modes:
        s = base.with_(grad_sync=mode)
        r = simulate(model, cluster, s, costs, options)
        simulated[mode] = (s, r.iteration_time_s, r.exposed_comm_s, allreduces_per_gpu(r.flow))
    wfbp_s = simulated[BASELINE][1]
    sizes: dict[int, int] | None = None
    results = []
    for mode, (s, t_iter, exposed, count) in simulated.items():
        groups: tuple[MergeGroup, ...] = ()
        if MODES[mode].planned:
            sizes = sizes if sizes is not None else layer_grad_bytes(model, s, costs)
            groups = tuple(MergeGroup((lo, hi), sum(sizes[i] for i in range(lo, hi)))
                           for lo, hi in merge_groups(model, cluster, s, costs, options))  # fmt: skip
        results.append(ModeResult(mode, s, t_iter, exposed, count, wfbp_s / t_iter if t_iter > 0 else 1.0, groups))
    return SyncComparison(model, cluster, base, tuple(results), costs.name, time.perf_counter() - t0)


# ------------------------------------------------------------------------------------------------ worker sweep
def cluster_of(cluster: Cluster, workers: int) -> Cluster:
    """The cluster N data-parallel workers (one per GPU) run on: N / gpus_per_node whole nodes of `cluster`, or, for
    N below a node's GPU count, one node holding N GPUs (N GPUs of one machine: their all-reduces stay inside it, as
    they would there). N above a node's GPU count must be a multiple of it (no partly used nodes)."""
    if workers < 1:
        raise MergeSearchError(f"a worker count must be >= 1, got {workers}")
    gpn = cluster.gpus_per_node
    if workers < gpn:
        return replace(cluster, nodes=1, gpus_per_node=workers,
                       slowdown=tuple((g, f) for g, f in cluster.slowdown if g < workers))  # fmt: skip
    if workers % gpn:
        raise MergeSearchError(
            f"{workers} workers is not a whole number of {cluster.name} nodes ({gpn} GPUs each); use multiples of {gpn}"
        )
    return cluster.with_nodes(workers // gpn)


@dataclass(frozen=True)
class SweepPoint:
    """One worker count of a sweep."""

    workers: int
    nodes: int
    gpus_per_node: int
    iteration_s: dict[str, float]
    """Iteration time per mode."""
    exposed_comm_s: dict[str, float]
    simulated_gpus: int
    """GPUs the simulation ran (1 when the replicas are symmetric, as they are on a homogeneous cluster)."""

    def speedup(self, mode: str, single_gpu_s: float) -> float:
        """S(N) = N t_1 / t_iter(N): how many single GPUs' worth of throughput the N workers deliver."""
        t = self.iteration_s[mode]
        return self.workers * single_gpu_s / t if t > 0 else float(self.workers)


@dataclass(frozen=True)
class WorkerSweep:
    """:func:`sweep_workers`' answer."""

    model: Model
    cluster: Cluster
    """The cluster whose nodes each worker count was cut from."""
    modes: tuple[str, ...]
    micro_batch_size: int
    num_micro_batches: int
    single_gpu_s: float
    """t_f + t_b of the paper's speedup: one GPU's iteration of the same micro-batches, which in the simulator also
    holds the optimizer step (the paper has none; counting it on both sides keeps S(N) = N for free communication)."""
    points: tuple[SweepPoint, ...]
    cost_source: str
    wall_time_s: float

    def table(self) -> pd.DataFrame:
        """One row per worker count: each mode's iteration (ms) and speedup S(N), and each merging mode's iteration
        over SyncEASGD's (1 where MG-WFBP has converged to one all-reduce after backward)."""
        rows = []
        for p in self.points:
            row: dict[str, Any] = {"workers": p.workers, "nodes": p.nodes}
            for m in self.modes:
                row[f"{m}_ms"] = p.iteration_s[m] * 1e3
            for m in self.modes:
                row[f"speedup_{m}"] = p.speedup(m, self.single_gpu_s)
            if "bulk" in self.modes:
                for m in self.modes:
                    if MODES[m].planned:
                        row[f"{m}/bulk"] = p.iteration_s[m] / p.iteration_s["bulk"]
            rows.append(row)
        return pd.DataFrame(rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.name,
            "cluster": self.cluster.name,
            "modes": list(self.modes),
            "micro_batch_size": self.micro_batch_size,
            "micro_batches": self.num_micro_batches,
            "single_gpu_s": self.single_gpu_s,
            "cost_source": self.cost_source,
            "wall_time_s": self.wall_time_s,
            "points": [
                {
                    "workers": p.workers,
                    "nodes": p.nodes,
                    "gpus_per_node": p.gpus_per_node,
                    "iteration_time_s": dict(p.iteration_s),
                    "exposed_comm_s": dict(p.exposed_comm_s),
                    "speedup": {m: p.speedup(m, self.single_gpu_s) for m in self.modes},
                    "simulated_gpus": p.simulated_gpus,
                }
                for p in self.points
            ],
        }


def sweep_workers(
    model: Model,
    cluster: Cluster,
    workers: Iterable[int],
    costs: CostsFor | None = None,
    modes: Sequence[str] = SWEEP_MODES,
    micro_batch_size: int = 1,
    num_micro_batches: int = 1,
    bucket_cap_mb: float = DDP_BUCKET_CAP_MB,
    options: FlowOptions | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> WorkerSweep:
    """For each worker count N (ascending, each once): pure data parallelism over N GPUs (tp = pp = 1, dp = N) on
    :func:`cluster_of` (`cluster`, N), simulated under each mode; plus one GPU's iteration for the speedup.

    `costs` maps a cluster to its cost source (default: analytic costs of that cluster); every N gets its own, as
    collective costs depend on the cluster's size. `progress(done, total)` is called after each simulation.
    """
    t0 = time.perf_counter()
    modes = check_modes(modes)
    counts = sorted(set(workers))
    if not counts:
        raise MergeSearchError("no worker counts to sweep")
    clusters = {n: cluster_of(cluster, n) for n in counts}  # every count checked before any simulation
    costs_for: CostsFor = costs if costs is not None else AnalyticCosts
    total = 1 + len(counts) * len(modes)
    one = cluster_of(cluster, 1)
    one_costs = costs_for(one)
    single = simulate(model, one, Strategy(micro_batch_size=micro_batch_size, num_micro_batches=num_micro_batches),
                      one_costs, options)  # fmt: skip
    done = 1
    if progress:
        progress(done, total)
    points = []
    for n in counts:
        c = clusters[n]
        cs = costs_for(c)
        times: dict[str, float] = {}
        exposed: dict[str, float] = {}
        simulated_gpus = 0
        for mode in modes:
            s = Strategy(dp=n, micro_batch_size=micro_batch_size, num_micro_batches=num_micro_batches,
                         grad_sync=mode, bucket_cap_mb=bucket_cap_mb)  # fmt: skip
            r = simulate(model, c, s, cs, options)
            times[mode], exposed[mode] = r.iteration_time_s, r.exposed_comm_s
            simulated_gpus = max(simulated_gpus, len(r.flow.represents))
            done += 1
            if progress:
                progress(done, total)
        points.append(SweepPoint(n, c.nodes, c.gpus_per_node, times, exposed, simulated_gpus))
    return WorkerSweep(model, cluster, modes, micro_batch_size, num_micro_batches, single.iteration_time_s,
                       tuple(points), one_costs.name, time.perf_counter() - t0)  # fmt: skip

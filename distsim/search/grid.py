"""DistSim's grid search (Sec. 6): every hybrid strategy for N GPUs, ranked by simulated iteration time.

The space is every tensor x pipeline x data degree with tp x pp x dp = N, every micro-batch size and every schedule
(:func:`~distsim.search.space.enumerate_strategies`, which says why each skipped combination is invalid). Each
valid strategy's peak memory is estimated first; one that does not fit is not simulated and scores zero throughput
(DistSim's Fig. 12 draws unreachable configurations at zero). The rest are simulated, in parallel worker processes
when asked; each evaluation is a pure function of its strategy, so a parallel search returns exactly what a serial
one does.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from distsim.core.cluster import Cluster
from distsim.core.errors import DistsimError
from distsim.core.models.context import context_problem, rank_view
from distsim.core.models.graph import Model
from distsim.core.models.moe import expert_counts
from distsim.core.schedules import build_schedule
from distsim.core.strategy import Strategy
from distsim.core.sync import DDP_BUCKET_CAP_MB
from distsim.plans.simulate import simulate
from distsim.search.pool import imap_unordered
from distsim.search.space import Skipped, cluster_for, enumerate_strategies
from distsim.sim.costs import AnalyticCosts, CostSource, framework_of
from distsim.sim.engine import paused_gc
from distsim.sim.flow.events import FlowOptions, PartitionMemo, resolve_partition, shared_partitions
from distsim.sim.memory import estimate_memory

GB = 1e9


@dataclass(frozen=True)
class GridSpec:
    """What to search."""

    gpus: int
    global_batch: int
    """Samples per iteration; every configuration trains exactly this many (dp x M x mbs)."""
    micro_batch_sizes: tuple[int, ...] = (1,)
    schedules: tuple[str, ...] = ("1f1b",)
    tp_degrees: tuple[int, ...] | None = None
    """Tensor-parallel degrees to try; None: every divisor of the GPU count."""
    pp_degrees: tuple[int, ...] | None = None
    """Pipeline degrees to try; None: every divisor."""
    virtual_stages: int = 2
    """Model chunks per rank for the interleaved schedule."""
    grad_sync: str | None = None
    """Gradient synchronisation of every configuration; None: the cost source's framework's (bulk, or Megatron's
    buckets under ``overlap_grad_reduce``: :meth:`~distsim.core.framework.Framework.synchronised`)."""
    recompute_modes: tuple[str, ...] = ("none",)
    """Activation recomputation modes to try (none, selective, full)."""
    sharding_modes: tuple[str, ...] = ("none",)
    ep_degrees: tuple[int, ...] = (1,)
    """Expert-parallel degrees to try (mixture-of-experts models): each where it divides dp and the experts."""
    cp_degrees: tuple[int, ...] = (1,)
    """Context-parallel degrees to try: each where it divides dp, the global batch still splits into whole
    micro-batches, and the model's sequence into 2 cp chunks."""
    """Optimizer sharding modes to try (none, zero1, zero2, zero3); with dp = 1 only none (the others are the same)."""
    bucket_cap_mb: float = DDP_BUCKET_CAP_MB
    """DDP's bucket size in MiB (grad_sync ddp)."""
    even_stages: bool = True
    """Only pipeline degrees that divide the model's transformer layer count (Megatron-LM's rule)."""
    memory_filter: bool = True
    """Skip the simulation of configurations that do not fit in GPU memory (they score zero)."""


@dataclass(frozen=True)
class GridPoint:
    """One valid configuration and what it scored."""

    index: int
    """Position in the enumeration (tp, then pp, then micro-batch size, then schedule)."""
    strategy: Strategy
    fits: bool
    peak_memory_bytes: float
    simulated: bool
    iteration_time_s: float
    """NaN when not simulated (out of memory)."""
    bubble_fraction: float
    exposed_comm_s: float
    simulation_s: float = field(default=0.0, compare=False)
    """Wall time the evaluation took (not part of the result's identity)."""

    def throughput(self, global_batch: int) -> float:
        """Samples per second; zero when not simulated because it does not fit (DistSim scores those 0)."""
        if not self.simulated or not self.iteration_time_s > 0:
            return 0.0
        return global_batch / self.iteration_time_s


@dataclass
class GridResult:
    model: Model
    cluster: Cluster
    spec: GridSpec
    points: list[GridPoint]
    """Every valid configuration, in enumeration order."""
    skipped: list[Skipped]
    wall_time_s: float
    workers: int
    cost_source: str

    @property
    def num_out_of_memory(self) -> int:
        return sum(not p.fits for p in self.points)

    @property
    def num_simulated(self) -> int:
        return sum(p.simulated for p in self.points)

    def ranked(self) -> list[GridPoint]:
        """Simulated configurations by iteration time (ties by enumeration order), then those that do not fit.

        With the memory filter off, configurations that do not fit are simulated and ranked like the others (the
        ``fits`` column still says so)."""
        return sorted(self.points, key=_rank_key)

    def best(self, k: int = 1) -> list[GridPoint]:
        return [p for p in self.ranked() if p.simulated][:k]

    def table(self) -> pd.DataFrame:
        """The ranked table: one row per valid configuration."""
        gbs = self.spec.global_batch
        rows = []
        for rank, p in enumerate(self.ranked(), start=1):
            s = p.strategy
            tput = p.throughput(gbs)
            row: dict[str, Any] = {
                "rank": rank,
                "strategy": str(s),
                "tp": s.tp,
                "pp": s.pp,
                "dp": s.dp,
                "mbs": s.micro_batch_size,
                "micro_batches": s.num_micro_batches,
                "schedule": s.schedule,
                **({"recompute": s.recompute} if len(self.spec.recompute_modes) > 1 else {}),
                **({"zero": s.optimizer_sharding} if len(self.spec.sharding_modes) > 1 else {}),
                **({"ep": s.ep} if self.spec.ep_degrees != (1,) else {}),
                **({"cp": s.cp} if self.spec.cp_degrees != (1,) else {}),
                "iteration_s": p.iteration_time_s,
                "samples_per_s": tput,
            }
            if self.model.seq_len:
                row["tokens_per_s"] = tput * self.model.seq_len
            row.update(
                {
                    "bubble": p.bubble_fraction,
                    "exposed_comm_s": p.exposed_comm_s,
                    "peak_memory_gb": p.peak_memory_bytes / GB,
                    "fits": p.fits,
                    "index": p.index,
                }
            )
            rows.append(row)
        return pd.DataFrame(rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.name,
            "cluster": self.cluster.name,
            "gpus": self.spec.gpus,
            "global_batch": self.spec.global_batch,
            "spec": asdict(self.spec),
            "valid": len(self.points),
            "simulated": self.num_simulated,
            "out_of_memory": self.num_out_of_memory,
            "skipped": [
                {
                    "strategy": f"{k.tp}M{k.pp}P{k.dp}D",
                    "micro_batch_size": k.micro_batch_size,
                    "schedule": k.schedule,
                    "reason": k.reason,
                }
                for k in self.skipped
            ],
            "memory_capacity_gb": self.cluster.gpu.memory_bytes / GB,
            "cost_source": self.cost_source,
            "wall_time_s": self.wall_time_s,
            "workers": self.workers,
            "ranked": [
                {**row, "strategy_detail": p.strategy.describe()}
                for row, p in zip(_records(self.table()), self.ranked(), strict=True)
            ],
        }


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    out = []
    for rec in df.to_dict(orient="records"):
        out.append({k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in rec.items()})
    return out


def _rank_key(p: GridPoint) -> tuple[bool, float, int]:
    return (not p.simulated, p.iteration_time_s if p.simulated else math.inf, p.index)


def evaluate(
    model: Model,
    cluster: Cluster,
    strategy: Strategy,
    costs: CostSource,
    options: FlowOptions,
    index: int = 0,
    memory_filter: bool = True,
) -> GridPoint:
    """Estimate one configuration's memory and, if it fits (or the filter is off), simulate it."""
    t0 = time.perf_counter()
    schedule = build_schedule(strategy)
    rank_model = rank_view(model, strategy.ep, strategy.cp)  # a rank's experts (ep) and tokens (cp)
    memory = estimate_memory(
        rank_model, strategy, schedule, resolve_partition(rank_model, strategy, costs), cluster.gpu.memory_bytes
    )
    peak = max(m.total_bytes for m in memory)
    fits = all(m.fits for m in memory)
    if memory_filter and not fits:
        nan = math.nan
        return GridPoint(index, strategy, False, peak, False, nan, nan, nan, time.perf_counter() - t0)
    r = simulate(model, cluster, strategy, costs, options)
    return GridPoint(index, strategy, fits, peak, True, r.iteration_time_s, r.bubble_fraction, r.exposed_comm_s,
                     time.perf_counter() - t0)  # fmt: skip


Shared = tuple[Model, Cluster, CostSource, FlowOptions, bool, PartitionMemo]


def _evaluate_one(shared: Shared, job: tuple[int, Strategy]) -> GridPoint:
    """One configuration, with what the search's configurations share: the partitions of each shape (one memo per
    process, reused across its configurations) and a paused garbage collector. An evaluation allocates millions of
    small objects that reference counting frees on its return; with the collector on, its passes over them while
    they live cost about a sixth of a grid's time."""
    model, cluster, costs, options, memory_filter, partitions = shared
    index, strategy = job
    with shared_partitions(partitions), paused_gc():
        return evaluate(model, cluster, strategy, costs, options, index, memory_filter)


def _work_estimate(s: Strategy) -> float:
    """Relative simulation cost, to hand the longest evaluations out first."""
    return s.num_micro_batches * s.chunks * (2 if s.tp > 1 else 1)


Progress = Callable[[int, int, GridPoint], None]


def grid_search(
    model: Model,
    cluster: Cluster,
    spec: GridSpec,
    costs: CostSource | None = None,
    options: FlowOptions | None = None,
    workers: int = 1,
    progress: Progress | None = None,
) -> GridResult:
    """Enumerate, filter by memory, simulate and rank every configuration of `spec` on the first `spec.gpus` GPUs.

    `workers` > 1 evaluates in that many processes; `progress(done, total, point)` is called after each evaluation.
    """
    t0 = time.perf_counter()
    for mbs in spec.micro_batch_sizes:
        if spec.global_batch % mbs:
            raise DistsimError(f"global batch {spec.global_batch} is not divisible by micro-batch size {mbs}")
    cluster = cluster_for(cluster, spec.gpus)
    costs = costs if costs is not None else AnalyticCosts(cluster)
    options = options or FlowOptions()
    strategies, skipped = enumerate_strategies(
        model, cluster, spec.gpus, spec.global_batch, spec.micro_batch_sizes, spec.schedules, spec.virtual_stages,
        spec.grad_sync or "bulk", spec.tp_degrees, spec.pp_degrees, spec.even_stages,
    )  # fmt: skip
    if spec.bucket_cap_mb != DDP_BUCKET_CAP_MB:
        strategies = [s.with_(bucket_cap_mb=spec.bucket_cap_mb) for s in strategies]
    if spec.grad_sync is None:
        framework = framework_of(costs)
        strategies = [framework.synchronised(s, model.precision.grad_bytes) for s in strategies]
    strategies = with_memory_modes(strategies, spec.recompute_modes, spec.sharding_modes)
    strategies = with_expert_parallelism(strategies, spec.ep_degrees, expert_counts(model))
    strategies = with_context_parallelism(strategies, spec.cp_degrees, model)
    if not strategies:
        reasons = Counter(k.reason for k in skipped).most_common(1)
        why = f"; most often: {reasons[0][0]}" if reasons else ""
        raise DistsimError(f"no valid configuration for {spec.gpus} GPUs at global batch {spec.global_batch}{why}")
    total = len(strategies)
    points: list[GridPoint | None] = [None] * total
    workers = max(1, min(workers, total))
    # in parallel, the longest evaluations first (the serial order is the enumeration's: results are the same)
    order = range(total) if workers == 1 else sorted(range(total), key=lambda i: (-_work_estimate(strategies[i]), i))
    shared = (model, cluster, costs, options, spec.memory_filter, {})
    jobs = [(i, strategies[i]) for i in order]
    for done, point in enumerate(imap_unordered(_evaluate_one, shared, jobs, workers), start=1):
        points[point.index] = point
        if progress:
            progress(done, total, point)
    assert all(p is not None for p in points)
    return GridResult(model, cluster, spec, points, skipped, time.perf_counter() - t0, workers,  # type: ignore[arg-type]
                      costs.name)  # fmt: skip


def with_expert_parallelism(strategies: list[Strategy], degrees: tuple[int, ...],
                            experts: tuple[int, ...]) -> list[Strategy]:  # fmt: skip
    """Every strategy under every expert-parallel degree that divides its dp and every MoE layer's experts (a dense
    model, or ep 1 alone: the strategies themselves)."""
    if degrees == (1,):
        return strategies
    out = []
    for s in strategies:
        for ep in degrees:
            if s.dp % ep == 0 and all(n % ep == 0 for n in experts) and (ep == 1 or experts):
                out.append(s if ep == 1 else s.with_(ep=ep))
    return out


def with_context_parallelism(strategies: list[Strategy], degrees: tuple[int, ...], model: Model) -> list[Strategy]:
    """Every strategy under every context-parallel degree that divides its dp and the model's sequence (in 2 cp
    chunks), not beside expert parallelism. A cp group shares its samples, so the micro-batches grow cp-fold for the
    same global batch."""
    if degrees == (1,):
        return strategies
    out = []
    for s in strategies:
        for cp in degrees:
            if cp == 1:
                out.append(s)
            elif s.dp % cp == 0 and s.ep == 1 and context_problem(model, cp) is None:
                out.append(s.with_(cp=cp, num_micro_batches=s.num_micro_batches * cp))
    return out


def with_memory_modes(
    strategies: list[Strategy], recompute_modes: tuple[str, ...], sharding_modes: tuple[str, ...]
) -> list[Strategy]:
    """Every strategy under every recomputation and optimizer-sharding mode, in that order (sharding only where
    there is data parallelism to shard over: with dp = 1 every mode is none's configuration)."""
    out = []
    for s in strategies:
        for recompute in recompute_modes:
            for sharding in sharding_modes if s.dp > 1 else sharding_modes[:1]:
                out.append(s if (recompute, sharding) == ("none", "none") else
                           s.with_(recompute=recompute, optimizer_sharding=sharding))  # fmt: skip
    return out

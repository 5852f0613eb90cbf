"""DAPPLE's planner (Fan et al. 2021, Sec. IV; ALGORITHMS.md Sec. 3): uneven stages, stage replication, placement.

A plan splits the model's layer chain into pipeline stages, replicates each stage on its own set of GPUs (every
micro-batch is split over a stage's replicas, split-concat) and runs DAPPLE's early-backward schedule. The planner
scores a plan with the paper's closed-form latency (Eqs. 1-3, with the corrected ending-phase term):

* the pipeline is the compute stages with a communication stage between each pair (its F and B are the activation
  and gradient transfer times between the two replica sets);
* the pivot Q is the stage whose steady phase dominates;
* ``L = sum(F_0..F_Q) + (M-1)(F_Q + B_Q) + max_s(AR_s + off_s)`` with ``off_s = B_s + ... + B_Q`` for s <= Q and
  ``-(B_{Q+1} + ... + B_{s-1})`` after the pivot.

The search is the paper's dynamic programme: a state is "the first j layers are planned on the GPUs `used`, the
rest form the last stage on every free GPU"; a transition splits that last stage at j' and places the new stage
on m' GPUs with one of the placement policies (Fresh First, Append First, Scatter First on the cluster's node
boundaries). The best plan is kept per (j', used) state. Pure data parallelism (the empty state) and the straight
pipeline (one GPU per stage, balanced split) are candidates like any other. The micro-batch count M is searched
over the divisors of the global batch (each giving micro-batch size b = global batch / M).

Cost hooks come from a :class:`~distsim.sim.costs.CostSource` (analytic or a profile): a stage's F and B sum its layers'
times at ceil(b / r) samples (the largest slice a replica gets), scaled by its slowest GPU; a transfer is the
slowest sender's serial sum of its split-concat pieces; AR is the all-reduce of the stage's gradients over its
replicas, followed by the optimizer step (the paper leaves the optimizer out; the simulator runs it, so the
estimate includes it). A plan is feasible when every replica's training state plus K_i in-flight micro-batches of
activations fits in GPU memory: K_i = min(S - i, M) under DAPPLE's policy A, min(2(S - i) - 1, M) under policy B,
M under GPipe (capped by D, the in-flight limit, when given).

Everything here is pure: no torch, no files. The simulator's prediction of the chosen plan is a separate step
(:func:`distsim.plans.simulate.simulate` accepts the :class:`~distsim.plans.plan.Plan` this returns).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from distsim.core.cluster import Cluster
from distsim.core.errors import DistsimError
from distsim.core.models.graph import Model
from distsim.core.partition import balanced_partition, ranges
from distsim.plans import Plan
from distsim.search.dapple_dp import _Search, beam_width
from distsim.search.dapple_model import (
    POLICIES,
    Candidate,
    DappleSpec,
    StageCosts,
    evaluate,
    pipeline_latency,
    pivot_stage,
    place,
)
from distsim.search.pool import imap_unordered
from distsim.search.space import cluster_for, divisors
from distsim.sim.costs import AnalyticCosts, CostSource


@dataclass
class DappleResult:
    model: Model
    cluster: Cluster
    spec: DappleSpec
    best: Candidate | None
    """The fastest feasible plan (None when nothing fits)."""
    best_per_micro_batches: dict[int, Candidate]
    best_dp: Candidate | None
    """The fastest feasible pure data-parallel plan (over M), DAPPLE's baseline."""
    best_straight: Candidate | None
    evaluated: int
    """Plans whose latency was computed."""
    wall_time_s: float
    cost_source: str
    beam: int = 0
    """States expanded per split position (0: every state)."""
    pruned_states: int = 0
    """States the beam left unexpanded, over all micro-batch counts (0: the search was the paper's full DP)."""

    def plan(self, candidate: Candidate | None = None, model: str | None = None, cluster: str | None = None,
             warmup_policy: str | None = None, **note: object) -> Plan:  # fmt: skip
        """The plan file form of a candidate (default: the best)."""
        c = candidate or self.best
        if c is None:
            raise DistsimError("no plan fits in memory (plan without the memory check to see the fastest anyway)")
        return Plan.of_stages(
            model or self.model.name, cluster or self.cluster.name, c.stages, nodes=self.cluster.nodes,
            note=dict(note), num_micro_batches=c.micro_batches, micro_batch_size=c.micro_batch_size,
            schedule=self.spec.schedule, warmup_policy=warmup_policy or self.spec.warmup_policy,
            max_in_flight=self.spec.max_in_flight,
        )  # fmt: skip

    def to_dict(self) -> dict[str, object]:
        def cand(c: Candidate | None) -> dict[str, object] | None:
            if c is None:
                return None
            return {
                "notation": c.notation,
                "kind": c.kind,
                "stages": [
                    {"layers": list(s.layers), "devices": list(s.devices), "replicas": s.replicas} for s in c.stages
                ],
                "micro_batches": c.micro_batches,
                "micro_batch_size": c.micro_batch_size,
                "estimate_s": c.latency_s,
                "samples_per_s": c.throughput(),
                "pivot": c.pivot,
                "peak_memory_gb": c.peak_memory_bytes / 1e9,
                "fits": c.fits,
            }

        return {
            "model": self.model.name,
            "cluster": self.cluster.name,
            "gpus": self.spec.gpus,
            "global_batch": self.spec.global_batch,
            "schedule": self.spec.schedule,
            "policies": list(self.spec.policies),
            "best": cand(self.best),
            "best_dp": cand(self.best_dp),
            "best_straight": cand(self.best_straight),
            "best_per_micro_batches": {str(m): cand(c) for m, c in sorted(self.best_per_micro_batches.items())},
            "evaluated": self.evaluated,
            "beam": self.beam,
            "pruned_states": self.pruned_states,
            "wall_time_s": self.wall_time_s,
            "cost_source": self.cost_source,
        }


def plan_micro_batches(
    model: Model, cluster: Cluster, spec: DappleSpec, costs: CostSource, M: int, shared: StageCosts | None = None
) -> tuple[Candidate | None, Candidate | None, Candidate | None, int, int]:
    """The DP for one micro-batch count: (best plan, pure DP plan, straight plan, plans evaluated, states the beam
    dropped); the pure DP
    and straight plans are None when they are not valid (too many replicas for the samples, or out of memory).
    `shared`: cost caches to reuse across micro-batch counts."""
    search = _Search(model, cluster, spec, costs, M, shared)
    sc, G, N, b = search.sc, spec.gpus, search.N, search.b
    dp = evaluate(sc, spec, M, [(0, N, tuple(range(G)))])
    search.run()
    found = search.best_stages()
    best = evaluate(sc, spec, M, found) if found is not None else None
    straight = None
    if N >= G > 1:
        pf, pb = sc.prefix(b)
        weights = [pf[i + 1] - pf[i] + pb[i + 1] - pb[i] for i in range(N)]
        split = ranges(balanced_partition(weights, G))
        straight = evaluate(sc, spec, M, [(a, e, (g,)) for g, (a, e) in enumerate(split)])
    valid = [c for c in (best, dp, straight) if c is not None and c.valid]
    overall = min(valid, key=lambda c: c.latency_s) if valid else None
    return (overall, dp if dp.valid else None, straight if straight and straight.valid else None,
            search.evaluated + 2, search.pruned)  # fmt: skip


def _plan_one(shared: tuple[Model, Cluster, DappleSpec, CostSource, StageCosts], M: int) -> tuple[int, Any]:
    model, cluster, spec, costs, stage_costs = shared
    return M, plan_micro_batches(model, cluster, spec, costs, M, stage_costs)


def plan_dapple(
    model: Model,
    cluster: Cluster,
    spec: DappleSpec,
    costs: CostSource | None = None,
    progress: Callable[[int, int, int], None] | None = None,
    workers: int = 1,
) -> DappleResult:
    """Run DAPPLE's planner for `spec.gpus` GPUs of `cluster` (the first whole nodes); `costs` defaults to the
    analytic estimate; `progress(done, total, M)` is called after each micro-batch count. With `workers` > 1 the
    micro-batch counts are planned in that many processes (each count's search is independent, so the result is
    the serial one)."""
    t0 = time.perf_counter()
    costs = costs if costs is not None else AnalyticCosts(cluster)
    cluster = cluster_for(cluster, spec.gpus)
    if model.num_layers < 1:
        raise DistsimError(f"{model.name} has no layers to plan")
    counts = spec.micro_batches or tuple(divisors(spec.global_batch))
    counts = tuple(sorted(set(counts)))
    found: dict[int, tuple[Candidate | None, Candidate | None, Candidate | None, int, int]] = {}
    workers = max(1, min(workers, len(counts)))
    shared = (model, cluster, spec, costs, StageCosts(model, cluster, costs, 1))  # each worker gets its own caches
    for done, (M, out) in enumerate(imap_unordered(_plan_one, shared, counts, workers), start=1):
        found[M] = out
        if progress is not None:
            progress(done, len(counts), M)
    best_per: dict[int, Candidate] = {}
    dps: list[Candidate] = []
    straights: list[Candidate] = []
    evaluated = pruned = 0
    for M in counts:
        best, dp, straight, n, dropped = found[M]
        evaluated += n
        pruned += dropped
        if best is not None:
            best_per[M] = best
        dps += [dp] if dp is not None else []
        straights += [straight] if straight is not None else []

    def fastest(cands: list[Candidate]) -> Candidate | None:
        return min(cands, key=lambda c: (c.latency_s, c.micro_batches)) if cands else None

    return DappleResult(
        model, cluster, spec, fastest(list(best_per.values())), best_per, fastest(dps), fastest(straights),
        evaluated, time.perf_counter() - t0, costs.name, beam_width(spec, cluster), pruned,
    )  # fmt: skip


@dataclass(frozen=True)
class Checked:
    """A shortlisted plan and the simulator's prediction of it under each warm-up policy."""

    label: str
    candidate: Candidate
    simulated_s: dict[str, float]
    """Warm-up policy -> simulated iteration time."""

    @property
    def policy(self) -> str:
        return min(self.simulated_s, key=lambda p: (self.simulated_s[p], p))

    @property
    def iteration_s(self) -> float:
        return self.simulated_s[self.policy]


def shortlist(result: DappleResult) -> list[tuple[str, Candidate]]:
    """The planner's best plan per micro-batch count, then the best pure data-parallel and straight plans."""
    out: list[tuple[str, Candidate]] = [(f"M={m}", c) for m, c in sorted(result.best_per_micro_batches.items())]
    for label, cand in (("pure DP", result.best_dp), ("straight", result.best_straight)):
        if cand is not None and not any(
            c.stages == cand.stages and c.micro_batches == cand.micro_batches for _, c in out
        ):
            out.append((label, cand))
    return out


def check_with_simulator(
    result: DappleResult,
    costs: CostSource | None = None,
    policies: Sequence[str] = ("A", "B"),
    progress: Callable[[int, int, int], None] | None = None,
    max_tasks: int | None = None,
) -> list[Checked]:
    """Simulate every shortlisted plan (:func:`shortlist`) under each warm-up policy.

    DAPPLE's latency model ignores the bubbles inside the pivot stage; they grow when a pipeline has about as
    many stages as micro-batches, so the planner's favourite is not always the simulator's. Choosing among the
    shortlist by simulation keeps the planner's search and the simulator's accuracy. Plans whose simulation would
    run more than `max_tasks` tasks (default: the simulator's limit) are left out (the shortlist is longer than
    the answer then).
    """
    from distsim.plans.simulate import DEFAULT_MAX_TASKS, estimate_size, simulate

    costs = costs if costs is not None else AnalyticCosts(result.cluster)
    limit = DEFAULT_MAX_TASKS if max_tasks is None else max_tasks
    if result.spec.schedule == "gpipe":
        policies = ("A",)
    items = shortlist(result)
    out = []
    for i, (label, cand) in enumerate(items, start=1):
        tasks, _ = estimate_size(result.model, result.cluster, result.plan(cand), costs)
        if tasks <= limit:
            sims = {
                p: simulate(result.model, result.cluster, result.plan(cand, warmup_policy=p), costs).iteration_time_s
                for p in policies
            }
            out.append(Checked(label, cand, sims))
        if progress is not None:
            progress(i, len(items), cand.micro_batches)
    return out


__all__ = [
    "POLICIES",
    "Candidate",
    "Checked",
    "DappleResult",
    "DappleSpec",
    "StageCosts",
    "check_with_simulator",
    "pipeline_latency",
    "pivot_stage",
    "place",
    "plan_dapple",
    "plan_micro_batches",
    "shortlist",
]

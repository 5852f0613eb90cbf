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

Cost hooks come from a :class:`~distsim.costs.CostSource` (analytic or a profile): a stage's F and B sum its layers'
times at ceil(b / r) samples (the largest slice a replica gets), scaled by its slowest GPU; a transfer is the
slowest sender's serial sum of its split-concat pieces; AR is the all-reduce of the stage's gradients over its
replicas, followed by the optimizer step (the paper leaves the optimizer out; the simulator runs it, so the
estimate includes it). A plan is feasible when every replica's training state plus K_i in-flight micro-batches of
activations fits in GPU memory: K_i = min(S - i, M) under DAPPLE's policy A, min(2(S - i) - 1, M) under policy B,
M under GPipe (capped by D, the in-flight limit, when given).

Everything here is pure: no torch, no files. The simulator's prediction of the chosen plan is a separate step
(:func:`distsim.simulate.simulate` accepts the :class:`~distsim.plan.Plan` this returns).
"""

from __future__ import annotations

import math
import multiprocessing
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

import numpy as np

from distsim.cluster import Cluster
from distsim.costs import AnalyticCosts, CommEvent, ComputeEvent, CostSource
from distsim.errors import DistsimError
from distsim.models.graph import Model
from distsim.partition import balanced_partition, ranges
from distsim.placement import group_instances, pair_instances
from distsim.plan import Plan, StagePlan, split_samples, stages_notation
from distsim.search.space import cluster_for, divisors

POLICIES = ("fresh", "append", "scatter")
POLICY_NAMES = {"fresh": "Fresh First", "append": "Append First", "scatter": "Scatter First"}


# ------------------------------------------------------------------------------------------------ latency model
def pivot_stage(F: Sequence[float], B: Sequence[float], M: int) -> int:
    """DAPPLE's pivot: the stage whose steady phase (M-1)(F+B) dominates, scanning from the last stage backwards."""
    Q = len(F) - 1
    between = 0.0  # sum of F+B over the stages strictly between s and Q
    for s in range(len(F) - 2, -1, -1):
        if (M - 1) * (F[s] + B[s]) > (M - 1) * (F[Q] + B[Q]) + between:
            Q, between = s, 0.0
        else:
            between += F[s] + B[s]
    return Q


def pipeline_latency(F: Sequence[float], B: Sequence[float], AR: Sequence[float], M: int) -> tuple[float, int]:
    """DAPPLE's iteration latency L of a pipeline of stages (compute and communication alternating) and its pivot.

    `F`, `B`: per-micro-batch forward and backward times of every stage; `AR`: each stage's gradient all-reduce
    (0 for communication stages); `M`: micro-batches. The ending term uses the corrected offsets (ALGORITHMS.md 3.1).
    """
    if not (len(F) == len(B) == len(AR)) or not F:
        raise DistsimError("F, B and AR need one value per stage")
    if M < 1:
        raise DistsimError(f"the micro-batch count must be positive, got {M}")
    Q = pivot_stage(F, B, M)
    warmup = sum(F[: Q + 1])
    steady = (M - 1) * (F[Q] + B[Q])
    ending = 0.0
    tail = 0.0  # sum of B_s..B_Q, built from Q down
    for s in range(Q, -1, -1):
        tail += B[s]
        ending = max(ending, AR[s] + tail)
    after = 0.0  # sum of B_{Q+1}..B_{s-1}
    for s in range(Q + 1, len(F)):
        ending = max(ending, AR[s] - after)
        after += B[s]
    return warmup + steady + ending, Q


# ------------------------------------------------------------------------------------------------ placement
def place(policy: str, used: frozenset[int], count: int, gpus_per_node: int, num_gpus: int) -> tuple[int, ...] | None:
    """GPUs for a new stage of `count` replicas under a placement policy, or None when the policy cannot serve it.

    Machines are the cluster's nodes (gpus_per_node consecutive ids each); a machine is fresh when none of its GPUs
    is used. Fresh First scans fresh machines, Append First the partly used ones: take the lowest free ids of the
    first machine that can cover the rest of the request, or else the whole first machine and continue. Scatter
    First takes one GPU (the lowest free id) from each machine with free GPUs in turn until the request is met.
    """
    if policy not in POLICIES:
        raise DistsimError(f"unknown placement policy {policy!r}; choose from {', '.join(POLICIES)}")
    if count < 1:
        return None
    free = [
        [g for g in range(n * gpus_per_node, (n + 1) * gpus_per_node) if g not in used]
        for n in range(num_gpus // gpus_per_node)
    ]
    if policy == "scatter":
        out: list[int] = []
        while len(out) < count:
            takers = [f for f in free if f]
            if not takers:
                return None
            for f in takers:
                if len(out) < count:
                    out.append(f.pop(0))
        return tuple(out)
    if policy == "fresh":
        machines = [f for f in free if len(f) == gpus_per_node]
    else:
        machines = [f for f in free if 0 < len(f) < gpus_per_node]
    out, need = [], count
    while need:
        if not machines:
            return None
        cover = next((f for f in machines if len(f) >= need), None)
        if cover is not None:
            return tuple(sorted(out + cover[:need]))
        whole = machines.pop(0)
        out += whole
        need -= len(whole)
    return tuple(sorted(out))


# ------------------------------------------------------------------------------------------------ results
@dataclass(frozen=True)
class DappleSpec:
    """What to plan."""

    gpus: int
    global_batch: int
    micro_batches: tuple[int, ...] | None = None
    """Micro-batch counts M to try (each must divide the global batch); None: every divisor."""
    schedule: str = "1f1b"
    """1f1b (DAPPLE's early backward) or gpipe: decides the in-flight micro-batches the memory check counts."""
    warmup_policy: str = "A"
    max_in_flight: int | None = None
    """DAPPLE's D: at most this many micro-batches in flight on a stage."""
    policies: tuple[str, ...] = POLICIES
    memory_filter: bool = True
    """Only plans whose every stage fits in GPU memory are answers."""
    beam: int | None = None
    """States (planned prefixes) expanded per split position, the best first; 0: all of them (the paper's DP);
    None: all when the cluster's machines allow at most 1,024 distinct sets of used GPUs (two 8-GPU machines allow
    81), else the best 128 (four 8-GPU machines allow 6,561, and the search would take minutes per micro-batch
    count)."""

    def __post_init__(self) -> None:
        if self.beam is not None and self.beam < 0:
            raise DistsimError(f"the beam must be 0 (every state) or positive, got {self.beam}")
        if self.global_batch < 1:
            raise DistsimError(f"the global batch must be positive, got {self.global_batch}")
        if self.schedule not in ("1f1b", "gpipe"):
            raise DistsimError(f"the DAPPLE planner schedules 1f1b or gpipe, not {self.schedule!r}")
        if self.warmup_policy not in ("A", "B"):
            raise DistsimError(f"the warm-up policy is A or B, not {self.warmup_policy!r}")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise DistsimError(f"the in-flight limit D must be positive, got {self.max_in_flight}")
        bad = [p for p in self.policies if p not in POLICIES]
        if bad or not self.policies:
            raise DistsimError(f"placement policies are a subset of {', '.join(POLICIES)}; got {list(self.policies)}")
        for m in self.micro_batches or ():
            if m < 1 or self.global_batch % m:
                raise DistsimError(f"{m} micro-batches do not divide the global batch {self.global_batch}")


@dataclass(frozen=True)
class Candidate:
    """One planned pipeline with its estimate."""

    stages: tuple[StagePlan, ...]
    micro_batches: int
    micro_batch_size: int
    latency_s: float
    """The planner's estimate of one iteration (DAPPLE's L)."""
    pivot: int
    """Index of the pivot in the alternating compute/communication stage list (compute stage i is 2i)."""
    peak_memory_bytes: float
    fits: bool
    """Every replica's training state and in-flight activations fit in GPU memory."""
    valid: bool
    """An answer: no stage has more replicas than a micro-batch has samples, and it fits (when memory is checked)."""
    forward_s: tuple[float, ...] = field(repr=False, default=())
    backward_s: tuple[float, ...] = field(repr=False, default=())
    allreduce_s: tuple[float, ...] = field(repr=False, default=())
    """Per stage of the alternating list: the terms of the latency formula."""

    @property
    def notation(self) -> str:
        return stages_notation(self.stages)

    @property
    def kind(self) -> str:
        if len(self.stages) == 1:
            return "DP"
        return "straight" if all(s.replicas == 1 for s in self.stages) else "hybrid"

    def throughput(self) -> float:
        return self.micro_batches * self.micro_batch_size / self.latency_s


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
        return Plan(
            model=model or self.model.name, cluster=cluster or self.cluster.name, nodes=self.cluster.nodes,
            stages=c.stages, micro_batches=c.micro_batches, micro_batch_size=c.micro_batch_size,
            schedule=self.spec.schedule, warmup_policy=warmup_policy or self.spec.warmup_policy,
            max_in_flight=self.spec.max_in_flight, note=dict(note),
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


# ------------------------------------------------------------------------------------------------ cost hooks
class StageCosts:
    """Cached F, B, AR, transfer and memory terms for micro-batches of `b` samples."""

    def __init__(self, model: Model, cluster: Cluster, costs: CostSource, b: int, shared: StageCosts | None = None):
        """`shared`: another micro-batch size's costs whose caches of what does not depend on it (layer times by
        samples, all-reduces, parameter counts) this one reuses."""
        self.model, self.cluster, self.costs, self.b = model, cluster, costs, b
        self.gpn = cluster.gpus_per_node
        self.speed = [cluster.speed_factor(g) for g in range(cluster.num_gpus)]
        self.uniform_speed = all(x == 1.0 for x in self.speed)
        self._prefix: dict[int, tuple[list[float], list[float]]] = shared._prefix if shared else {}
        self._ar: dict[tuple[int, int, int, bool], float] = shared._ar if shared else {}
        self._params: dict[tuple[int, int], float] = shared._params if shared else {}
        self._xfer: dict[tuple[int, tuple[int, ...], tuple[int, ...]], tuple[float, float]] = {}
        self._tied: dict[tuple[int, tuple[int, ...], tuple[int, ...]], float] = {}
        p = model.precision
        self.state_bytes = p.state_bytes_per_param
        self.act_prefix = [0.0, *accumulate(layer.saved_bytes_per_sample(1) for layer in model.layers)]

    def prefix(self, n: int) -> tuple[list[float], list[float]]:
        """Prefix sums of the layers' forward and backward times at n samples."""
        out = self._prefix.get(n)
        if out is None:
            model, dtype = self.model, self.model.precision.name
            fwd, bwd = [], []
            for layer in model.layers:
                fwd.append(sum(self.costs.compute(ComputeEvent(k, "F", n, 1, dtype)).seconds for k in layer.blocks))
                bwd.append(sum(self.costs.compute(ComputeEvent(k, "B", n, 1, dtype)).seconds for k in layer.blocks))
            out = self._prefix[n] = ([0.0, *accumulate(fwd)], [0.0, *accumulate(bwd)])
        return out

    def samples(self, replicas: int) -> int:
        """The largest slice of a micro-batch one of `replicas` replicas processes."""
        return -(-self.b // replicas)

    def compute(self, start: int, end: int, devices: tuple[int, ...]) -> tuple[float, float]:
        pf, pb = self.prefix(self.samples(len(devices)))
        f, b = pf[end] - pf[start], pb[end] - pb[start]
        if not self.uniform_speed:
            slow = max(self.speed[g] for g in devices)
            f, b = f * slow, b * slow
        return f, b

    def params(self, start: int, end: int) -> float:
        key = (start, end)
        out = self._params.get(key)
        if out is None:
            out = self._params[key] = self.model.rank_params(list(range(start, end)), 1)
        return out

    def allreduce(self, start: int, end: int, devices: tuple[int, ...]) -> float:
        """The stage's gradient all-reduce over its replicas, then its optimizer step."""
        spans = len({g // self.gpn for g in devices}) > 1
        return self.allreduce_kind(start, end, len(devices), spans)

    def allreduce_kind(self, start: int, end: int, replicas: int, spans: bool) -> float:
        """:meth:`allreduce` by what it depends on: the layers, the replica count and whether they span nodes (one
        group alone on its NICs, as the simulator's per-stage group)."""
        key = (start, end, replicas, spans)
        out = self._ar.get(key)
        if out is None:
            params = self.params(start, end)
            out = self.costs.optimizer(params, self.state_bytes).seconds if params > 0 else 0.0
            nbytes = round(params * self.model.precision.grad_bytes)
            if replicas > 1 and nbytes > 0:
                ev = CommEvent("all_reduce", nbytes, replicas, "inter" if spans else "intra", 1)
                out += self.costs.comm(ev).seconds
            self._ar[key] = out
        return out

    def transfer(self, boundary: int, src: tuple[int, ...], dst: tuple[int, ...]) -> tuple[float, float]:
        """Activations forward and gradients backward across the boundary after layer `boundary`: the slowest
        sender's serial sum of its split-concat pieces."""
        per_sample = self.model.boundary_bytes[boundary]
        key = (round(per_sample), tuple(g // self.gpn for g in src), tuple(g // self.gpn for g in dst))
        out = self._xfer.get(key)
        if out is None:
            out = self._xfer[key] = (self._pieces(per_sample, src, dst), self._pieces(per_sample, dst, src))
        return out

    def _pieces(self, per_sample: float, src: tuple[int, ...], dst: tuple[int, ...]) -> float:
        pairs, shares = [], []
        for i, (lo, hi) in enumerate(split_samples(self.b, len(src))):
            for j, (lo2, hi2) in enumerate(split_samples(self.b, len(dst))):
                shared = min(hi, hi2) - max(lo, lo2)
                if shared > 0:
                    pairs.append((src[i], dst[j]))
                    shares.append(shared)
        busy: dict[int, float] = {}
        for inst, shared in zip(pair_instances(pairs, self.gpn), shares, strict=True):
            nbytes = round(per_sample * shared)
            if nbytes <= 0:
                continue
            t = self.costs.comm(CommEvent("p2p", nbytes, 2, inst.scope, inst.sharers)).seconds
            busy[inst.gpus[0]] = busy.get(inst.gpus[0], 0.0) + t
        return max(busy.values(), default=0.0)

    @property
    def tied(self) -> list[tuple[int, int, int]]:
        """(lower layer, higher layer, gradient bytes) of every tied pair of layers (an LM head sharing the
        embedding's weights): where the two sit on different stages, their gradients are all-reduced between
        the stages after the stages' own all-reduces, as the simulator does."""
        out = []
        model = self.model
        for i, layer in enumerate(model.layers):
            if layer.tied_to is not None:
                nbytes = round(layer.shard_params(1) * model.precision.grad_bytes)
                t = model.index[layer.tied_to]
                if nbytes > 0 and t != i:
                    out.append((min(i, t), max(i, t), nbytes))
        return out

    def tied_allreduce(self, a: tuple[int, ...], b: tuple[int, ...], nbytes: int) -> float:
        """All-reduce of tied copies between two stages: replica i with replica i when the widths match (pairs
        at once, sharing NICs), else one group over both stages."""
        gpn = self.gpn
        key = (nbytes, tuple(g // gpn for g in a), tuple(g // gpn for g in b))
        out = self._tied.get(key)
        if out is None:
            if len(a) == len(b):
                instances = pair_instances(list(zip(a, b, strict=True)), gpn)
            else:
                instances = group_instances([a + b], gpn)
            out = self._tied[key] = max(
                self.costs.comm(CommEvent("all_reduce", nbytes, len(i.gpus), i.scope, i.sharers)).seconds
                for i in instances
            )
        return out

    def memory(self, start: int, end: int, replicas: int, in_flight: int) -> float:
        """Peak bytes on one replica: training state plus `in_flight` micro-batches of saved activations."""
        act = (self.act_prefix[end] - self.act_prefix[start]) * self.samples(replicas)
        return self.params(start, end) * self.state_bytes + in_flight * act


# ------------------------------------------------------------------------------------------------ planner
Stage = tuple[int, int, tuple[int, ...]]  # (start, end, devices)


def in_flight(spec: DappleSpec, M: int, i: int, S: int) -> int:
    """Micro-batches whose activations compute stage i of S holds at its peak (K_i)."""
    if spec.schedule == "gpipe":
        k = M
    elif spec.warmup_policy == "A":
        k = min(S - i, M)
    else:
        k = min(2 * (S - i) - 1, M)
    return min(k, spec.max_in_flight) if spec.max_in_flight else k


def evaluate(sc: StageCosts, spec: DappleSpec, M: int, stages: Sequence[Stage]) -> Candidate:
    """The latency terms, estimate and memory of one full plan (stages in pipeline order)."""
    F: list[float] = []
    B: list[float] = []
    AR: list[float] = []
    peak, fits, enough = 0.0, True, True
    S = len(stages)
    for i, (start, end, devs) in enumerate(stages):
        if i:
            xf, xb = sc.transfer(start - 1, stages[i - 1][2], devs)
            F.append(xf)
            B.append(xb)
            AR.append(0.0)
        f, b = sc.compute(start, end, devs)
        F.append(f)
        B.append(b)
        AR.append(sc.allreduce(start, end, devs))
        mem = sc.memory(start, end, len(devs), in_flight(spec, M, i, S))
        peak = max(peak, mem)
        fits = fits and mem <= sc.cluster.gpu.memory_bytes
        enough = enough and len(devs) <= sc.b
    stage_of = [i for i, (a, e, _) in enumerate(stages) for _ in range(a, e)]
    for lo, hi, nbytes in sc.tied:
        sa, sb = stage_of[lo], stage_of[hi]
        if sa != sb:  # both stages' ends move to after the tied all-reduce: max(x, y) + t = max(x + t, y + t)
            t = sc.tied_allreduce(stages[sa][2], stages[sb][2], nbytes)
            AR[2 * sa] += t
            AR[2 * sb] += t
    L, Q = pipeline_latency(F, B, AR, M)
    valid = enough and (fits or not spec.memory_filter)
    return Candidate(tuple(StagePlan((a, e), d) for a, e, d in stages), M, sc.b, L, Q, peak, fits, valid,
                     tuple(F), tuple(B), tuple(AR))  # fmt: skip


def beam_width(spec: DappleSpec, cluster: Cluster) -> int:
    """States expanded per split position (0: all); see :attr:`DappleSpec.beam`."""
    if spec.beam is not None:
        return spec.beam
    gpn = cluster.gpus_per_node
    used_sets = (gpn + 1) ** (spec.gpus // gpn)
    return 0 if used_sets <= 1024 else 128


@dataclass
class _Rows:
    """Every transition's new stage out of one used set (they do not depend on the split position)."""

    devs: list[tuple[int, ...]]
    rests: list[tuple[int, ...]]
    targets: np.ndarray
    """Id of the used set after each row."""
    m: np.ndarray
    n_new: np.ndarray
    """Index into the search's sample counts of the new stage's samples per replica."""
    n_rest: np.ndarray
    slow_new: np.ndarray
    slow_rest: np.ndarray
    x2f: np.ndarray
    """(rows, N - 1): transfer times new -> remainder at every boundary."""
    x2b: np.ndarray
    ar_rest: np.ndarray
    """(rows, N + 1): the remainder's AR when it starts at each layer."""
    rest_too_wide: np.ndarray
    kinds: list[tuple[int, bool]]
    """(replicas, spans nodes) of each row's new stage: what its AR depends on."""


class _Search:
    """The dynamic programme for one micro-batch count, vectorised over every transition out of a state.

    A state (j, used) stands for "layers [0, j) planned as a prefix of stages on the GPUs `used`; layers [j, N) on
    every free GPU". Out of a state the transitions are every new stage size m (at most the micro-batch's samples),
    every distinct placement the policies give it, and every split j' > j: all are scored at once with numpy (one
    row per placement, one column per j'), and each target state (j', used + new) keeps its best. Scores are the
    key (remainder invalid, L): a plan whose remainder stage does not fit (or has more replicas than samples) is
    kept for expansion but is not an answer; a plan whose planned stages do not fit is dropped, since later splits
    only add in-flight micro-batches to them.
    """

    def __init__(
        self, model: Model, cluster: Cluster, spec: DappleSpec, costs: CostSource, M: int, shared: StageCosts | None
    ):
        self.model, self.cluster, self.spec, self.M = model, cluster, spec, M
        self.N, self.G = model.num_layers, spec.gpus
        self.b = spec.global_batch // M
        self.sc = StageCosts(model, cluster, costs, self.b, shared)
        self.cap = cluster.gpu.memory_bytes if spec.memory_filter else math.inf
        self.gpn = cluster.gpus_per_node
        N, sc = self.N, self.sc
        self.ns = sorted({sc.samples(r) for r in range(1, self.G + 1)})
        self.n_index = {n: i for i, n in enumerate(self.ns)}
        self.pf = np.array([sc.prefix(n)[0] for n in self.ns])  # (samples, N + 1)
        self.pb = np.array([sc.prefix(n)[1] for n in self.ns])
        params = np.array([[sc.params(a, e) if e > a else 0.0 for e in range(N + 1)] for a in range(N + 1)])
        self.state = params * sc.state_bytes
        self.act = np.array(sc.act_prefix)
        self.evaluated = 0
        self.pruned = 0
        # boundaries carrying the same bytes per sample cost the same: compute each distinct one once
        sizes = [round(x) for x in model.boundary_bytes[: N - 1]]
        firsts = {size: i for i, size in reversed(list(enumerate(sizes)))}
        self.boundary_first = list(firsts.values())
        self.boundary_kind = np.array([list(firsts).index(size) for size in sizes], dtype=np.int64)
        self._ar: dict[tuple[int, int, bool], np.ndarray] = {}
        self._x: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[np.ndarray, np.ndarray]] = {}
        self._rows: dict[int, _Rows | None] = {}
        self.tied = sc.tied
        self._tied_rows: dict[tuple[int, tuple[int, ...], int], Any] = {}  # rows live as long as the search
        self._pre: dict[
            tuple[int, int], tuple[list[Stage], list[tuple[float, float, float]], list[tuple[float, float]]]
        ]
        self._pre = {(0, 0): ([], [], [])}
        self._x1: dict[tuple[tuple[int, ...], int], tuple[np.ndarray, np.ndarray]] = {}
        # states: per used set (an id), arrays over j of (remainder invalid, L, link id)
        self.ids: dict[frozenset[int], int] = {}
        self.sets: list[frozenset[int]] = []
        self.bad = np.ones((0, N + 1), dtype=bool)
        self.lat = np.full((0, N + 1), np.inf)
        self.link = np.full((0, N + 1), -1, dtype=np.int64)
        self.links: list[tuple[int, int, tuple[int, ...]]] = []  # (parent j, parent used id, new stage's devices)
        self.best: tuple[float, int, int] | None = None  # (L, link id, j')

    # -------------------------------------------------------------------------------- cached vectors
    def slow(self, devs: tuple[int, ...]) -> float:
        return 1.0 if self.sc.uniform_speed else max(self.sc.speed[g] for g in devs)

    def ar_vector(self, start: int, devs: tuple[int, ...], kind: tuple[int, bool] | None = None) -> np.ndarray:
        """AR (plus optimizer) of a stage on these devices starting at `start` (-1: every start, ending at N) for
        every end (every start) 0..N."""
        m, spans = kind or (len(devs), len({g // self.gpn for g in devs}) > 1)
        key = (start, m, spans)
        out = self._ar.get(key)
        if out is None:
            out = np.zeros(self.N + 1)
            ar = self.sc.allreduce_kind
            if start >= 0:
                for e in range(start + 1, self.N + 1):
                    out[e] = ar(start, e, m, spans)
            else:
                for a in range(self.N):
                    out[a] = ar(a, self.N, m, spans)
            self._ar[key] = out
        return out

    def x_row(self, src: tuple[int, ...], dst: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Forward and backward transfer times between two replica sets at every boundary (after layer i)."""
        gpn = self.gpn
        key = (tuple(g // gpn for g in src), tuple(g // gpn for g in dst))
        out = self._x.get(key)
        if out is None:
            pairs = np.array([self.sc.transfer(i, src, dst) for i in self.boundary_first])
            out = self._x[key] = (pairs[self.boundary_kind, 0], pairs[self.boundary_kind, 1])
        return out

    def set_id(self, used: frozenset[int]) -> int:
        uid = self.ids.get(used)
        if uid is None:
            uid = self.ids[used] = len(self.sets)
            self.sets.append(used)
            if uid >= len(self.lat):  # grow the state tables
                extra = max(16, len(self.lat))
                self.bad = np.vstack([self.bad, np.ones((extra, self.N + 1), dtype=bool)])
                self.lat = np.vstack([self.lat, np.full((extra, self.N + 1), np.inf)])
                self.link = np.vstack([self.link, np.full((extra, self.N + 1), -1, dtype=np.int64)])
        return uid

    def rows(self, uid: int) -> _Rows | None:
        if uid in self._rows:
            return self._rows[uid]
        used, G, b = self.sets[uid], self.G, self.b
        free = [g for g in range(G) if g not in used]
        devs_list, rests = [], []
        for m in range(1, min(len(free) - 1, b) + 1):
            seen: set[tuple[int, ...]] = set()
            for policy in self.spec.policies:
                devs = place(policy, used, m, self.gpn, G)
                if devs is not None and devs not in seen:
                    seen.add(devs)
                    devs_list.append(devs)
                    rests.append(tuple(g for g in free if g not in devs))
        out = None
        if devs_list:
            xs = [self.x_row(d, r) for d, r in zip(devs_list, rests, strict=True)]
            out = _Rows(
                devs=devs_list,
                rests=rests,
                targets=np.array([self.set_id(used | frozenset(d)) for d in devs_list]),
                m=np.array([len(d) for d in devs_list]),
                n_new=np.array([self.n_index[self.sc.samples(len(d))] for d in devs_list]),
                n_rest=np.array([self.n_index[self.sc.samples(min(len(r), b))] for r in rests]),
                slow_new=np.array([self.slow(d) for d in devs_list]),
                slow_rest=np.array([self.slow(r) for r in rests]),
                x2f=np.array([x[0] for x in xs]),
                x2b=np.array([x[1] for x in xs]),
                ar_rest=np.array([self.ar_vector(-1, r) for r in rests]),
                rest_too_wide=np.array([len(r) > b for r in rests]),
                kinds=[(len(d), len({g // self.gpn for g in d}) > 1) for d in devs_list],
            )
        self._rows[uid] = out
        return out

    def x1(self, last: tuple[int, ...], uid: int) -> tuple[np.ndarray, np.ndarray]:
        """(rows, N - 1): transfer times from the prefix's last stage on `last` to each row's new stage."""
        key = (last, uid)
        out = self._x1.get(key)
        if out is None:
            rows = self._rows[uid]
            assert rows is not None
            xs = [self.x_row(last, d) for d in rows.devs]
            out = self._x1[key] = (np.array([x[0] for x in xs]), np.array([x[1] for x in xs]))
        return out

    def prefix_terms(
        self, j: int, uid: int
    ) -> tuple[list[Stage], list[tuple[float, float, float]], list[tuple[float, float]]]:
        """The planned stages of a state, their latency terms (with the transfers between them) and each stage's
        (training state, activations per in-flight micro-batch) bytes; built from the parent state's."""
        out = self._pre.get((j, uid))
        if out is None:
            sc = self.sc
            pj, puid, devs = self.links[int(self.link[uid, j])]
            stages, terms, mem = self.prefix_terms(pj, puid)
            terms = list(terms)
            if stages:
                xf, xb = sc.transfer(pj - 1, stages[-1][2], devs)
                terms.append((xf, xb, 0.0))
            f, bw = sc.compute(pj, j, devs)
            terms.append((f, bw, sc.allreduce(pj, j, devs)))
            act = (sc.act_prefix[j] - sc.act_prefix[pj]) * sc.samples(len(devs))
            out = (
                [*stages, (pj, j, devs)],
                terms,
                [*mem, (sc.params(pj, j) * sc.state_bytes, act)],
            )
            self._pre[(j, uid)] = out
        return out

    def add_tied(
        self, lo: int, hi: int, nbytes: int, j: int, J: np.ndarray, rows: _Rows, prefix: list[Stage],
        ARn: np.ndarray, ARr: np.ndarray, extra: dict[int, np.ndarray],
    ) -> None:  # fmt: skip
        """Add a tied pair's all-reduce to the AR terms of the two stages holding it, for every transition."""
        sc = self.sc
        C, W = ARn.shape
        if hi < j:  # both planned
            sa = next(i for i, (a, e, _) in enumerate(prefix) if a <= lo < e)
            sb = next(i for i, (a, e, _) in enumerate(prefix) if a <= hi < e)
            if sa != sb:
                t = sc.tied_allreduce(prefix[sa][2], prefix[sb][2], nbytes)
                for s in (sa, sb):
                    extra[2 * s] = extra.get(2 * s, 0.0) + np.full((C, W), t)
            return
        if lo < j:  # lo planned, hi in the new stage (j' > hi) or in the remainder
            sa = next(i for i, (a, e, _) in enumerate(prefix) if a <= lo < e)
            a_devs = prefix[sa][2]
            key = (nbytes, a_devs, id(rows))
            cached = self._tied_rows.get(key)
            if cached is None:
                cached = self._tied_rows[key] = (
                    np.array([sc.tied_allreduce(a_devs, d, nbytes) for d in rows.devs])[:, None],
                    np.array([sc.tied_allreduce(a_devs, r, nbytes) for r in rows.rests])[:, None],
                )
            to_new, to_rest = cached
            in_new = (hi < J)[None]
            ARn += np.where(in_new, to_new, 0.0)
            ARr += np.where(in_new, 0.0, to_rest)
            extra[2 * sa] = extra.get(2 * sa, 0.0) + np.where(in_new, to_new, to_rest)
            return
        # both unplanned: apart only when lo lands in the new stage and hi in the remainder
        apart = ((lo < J) & (hi >= J))[None]
        key = (nbytes, (), id(rows))
        t = self._tied_rows.get(key)
        if t is None:
            pairs = zip(rows.devs, rows.rests, strict=True)
            t = self._tied_rows[key] = np.array([sc.tied_allreduce(d, r, nbytes) for d, r in pairs])[:, None]
        ARn += np.where(apart, t, 0.0)
        ARr += np.where(apart, t, 0.0)

    # -------------------------------------------------------------------------------- the search
    def prefix_stages(self, j: int, uid: int) -> list[Stage]:
        stages: list[Stage] = []
        while j:
            pj, puid, devs = self.links[int(self.link[uid, j])]
            stages.append((pj, j, devs))
            j, uid = pj, puid
        return stages[::-1]

    def run(self) -> None:
        root = self.set_id(frozenset())
        self.bad[root, 0], self.lat[root, 0] = False, 0.0
        beam = beam_width(self.spec, self.cluster)
        for j in range(self.N - 1):
            n = len(self.sets)
            live = np.flatnonzero(self.lat[:n, j] < np.inf)
            order = sorted(live, key=lambda u: (bool(self.bad[u, j]), float(self.lat[u, j]), sorted(self.sets[u])))
            if beam and len(order) > beam:
                self.pruned += len(order) - beam
                order = order[:beam]
            for uid in order:
                self.expand(j, int(uid))

    def expand(self, j: int, uid: int) -> None:
        spec, M, N = self.spec, self.M, self.N
        rows = self.rows(uid)
        if rows is None:
            return
        prefix, pre, mem = self.prefix_terms(j, uid)
        Sp = len(prefix)
        S = Sp + 2
        for i, (state, act) in enumerate(mem):
            if state + in_flight(spec, M, i, S) * act > self.cap:
                return  # more stages only add in-flight micro-batches to this one
        J = np.arange(j + 1, N)  # split positions j'
        C, W = len(rows.devs), len(J)
        self.evaluated += C * W
        sm, sr = rows.slow_new[:, None], rows.slow_rest[:, None]
        Fn = (self.pf[rows.n_new][:, J] - self.pf[rows.n_new][:, [j]]) * sm
        Bn = (self.pb[rows.n_new][:, J] - self.pb[rows.n_new][:, [j]]) * sm
        Fr = (self.pf[rows.n_rest][:, [N]] - self.pf[rows.n_rest][:, J]) * sr
        Br = (self.pb[rows.n_rest][:, [N]] - self.pb[rows.n_rest][:, J]) * sr
        ARn = np.array([self.ar_vector(j, d, k) for d, k in zip(rows.devs, rows.kinds, strict=True)])[:, J]
        ARr = rows.ar_rest[:, J]
        X2f, X2b = rows.x2f[:, J - 1], rows.x2b[:, J - 1]
        samples = np.array(self.ns)
        k_new, k_rest = in_flight(spec, M, Sp, S), in_flight(spec, M, Sp + 1, S)
        act_new = (self.act[J] - self.act[j])[None] * samples[rows.n_new][:, None]
        act_rest = (self.act[N] - self.act[J])[None] * samples[rows.n_rest][:, None]
        dead = self.state[j, J][None] + k_new * act_new > self.cap
        rest_bad = (self.state[J, N][None] + k_rest * act_rest > self.cap) | rows.rest_too_wide[:, None]
        tail: list[tuple[Any, Any, Any]] = []
        if Sp:
            x1f, x1b = self.x1(prefix[-1][2], uid)
            tail.append((x1f[:, [j - 1]], x1b[:, [j - 1]], 0.0))
        extra: dict[int, np.ndarray] = {}
        if self.tied:
            ARn, ARr = ARn.copy(), ARr.copy()
            for lo, hi, nbytes in self.tied:
                self.add_tied(lo, hi, nbytes, j, J, rows, prefix, ARn, ARr, extra)
        tail += [(Fn, Bn, ARn), (X2f, X2b, 0.0), (Fr, Br, ARr)]
        L = _latency_terms(pre, tail, M, (C, W), extra)
        L[dead] = np.inf
        ok = np.where(rest_bad, np.inf, L)
        flat = int(np.argmin(ok))
        c, k = divmod(flat, W)
        first_link = len(self.links)
        if ok[c, k] < np.inf and (self.best is None or ok[c, k] < self.best[0]):
            self.best = (float(ok[c, k]), first_link + c, int(J[k]))
        self.links += [(j, uid, d) for d in rows.devs]
        # targets (j', used + new) keep their best: remainder valid first, then the lower L
        T = rows.targets[:, None]
        tb, tl = self.bad[T, J], self.lat[T, J]
        better = (np.inf > L) & ((rest_bad < tb) | ((rest_bad == tb) & (tl > L)))
        if better.any():
            self.bad[T, J] = np.where(better, rest_bad, tb)
            self.lat[T, J] = np.where(better, L, tl)
            ids = np.arange(first_link, first_link + C)[:, None]
            self.link[T, J] = np.where(better, ids, self.link[T, J])

    def best_stages(self) -> list[Stage] | None:
        if self.best is None:
            return None
        _, link_id, j2 = self.best
        pj, puid, devs = self.links[link_id]
        used = self.sets[puid] | frozenset(devs)
        rest = tuple(g for g in range(self.G) if g not in used)
        return [*self.prefix_stages(pj, puid), (pj, j2, devs), (j2, self.N, rest)]


def _latency_terms(
    pre: Sequence[tuple[float, float, float]],
    tail: Sequence[tuple[Any, Any, Any]],
    M: int,
    shape: tuple[int, int],
    extra: dict[int, np.ndarray] | None = None,
) -> np.ndarray:
    """:func:`pipeline_latency` for many pipelines at once that share their first stages.

    `pre`: (F, B, AR) of the shared first stages (scalars); `tail`: the stages after them, each term an array
    broadcasting to `shape` (or a scalar); `extra`: arrays added to some shared stages' AR (AR does not move
    the pivot). Uses two facts to stay vectorised:

    * the pivot scan runs from the last stage backwards and, once it moves the pivot into the shared stages, its
      course from there on no longer depends on the tail, so the shared stages' outcome is precomputed;
    * both branches of the corrected ending offset are cumB[Q] - cumB[s-1] (cumB[-1] = 0), so
      T_e = cumB[Q] + max_s(AR_s - cumB[s-1]).
    """
    P, m1 = len(pre), M - 1
    # pivot scan over the tail, from the last stage backwards
    f, b, _ = tail[-1]
    Q = np.full(shape, P + len(tail) - 1)
    TQ = np.broadcast_to(m1 * (f + b), shape)
    between: Any = 0.0
    for i in range(len(tail) - 2, -1, -1):
        f, b, _ = tail[i]
        T = m1 * (f + b)
        take = TQ + between < T
        Q = np.where(take, P + i, Q)
        TQ = np.where(take, T, TQ)
        between = np.where(take, 0.0, between + f + b)
    if P:
        Tp = [m1 * (f + b) for f, b, _ in pre]
        # where the scan ends if it moves the pivot to shared stage s
        final = list(range(P))
        for s in range(P):
            q, gap = s, 0.0
            for a in range(s - 1, -1, -1):
                if Tp[a] > Tp[q] + gap:
                    q, gap = a, 0.0
                else:
                    gap += pre[a][0] + pre[a][1]
            final[s] = q
        # the first (highest) shared stage s the scan takes: T_s > TQ + between + (F+B of shared stages above s)
        above = np.zeros(P)
        for s in range(P - 2, -1, -1):
            above[s] = above[s + 1] + pre[s + 1][0] + pre[s + 1][1]
        D = np.array(Tp) - above
        hits = D[:, None, None] > (TQ + between)[None]
        found = hits.any(axis=0)
        if found.any():
            first = P - 1 - np.argmax(hits[::-1], axis=0)
            Q = np.where(found, np.array(final)[first], Q)
            TQ = np.where(found, np.array(Tp)[np.array(final)[first]], TQ)
    # warm-up sum F_0..F_Q, cumB[Q] and the ending maximum
    cumF_pre = np.cumsum([0.0] + [t[0] for t in pre])  # cumF_pre[k]: F of the first k shared stages
    cumB_pre = np.cumsum([0.0] + [t[1] for t in pre])
    extra = extra or {}
    best: Any = max((t[2] - cumB_pre[k] for k, t in enumerate(pre) if k not in extra), default=-np.inf)
    for k, add in extra.items():
        best = np.maximum(best, pre[k][2] + add - cumB_pre[k])
    in_pre = Q < P
    qi = np.minimum(Q, P)
    warmup: Any = cumF_pre[qi + np.where(in_pre, 1, 0)] if P else 0.0
    cum_q: Any = cumB_pre[qi + np.where(in_pre, 1, 0)] if P else 0.0
    cum: Any = cumB_pre[-1]
    for i, (f, b, ar) in enumerate(tail):
        best = np.maximum(best, ar - cum)
        cum = cum + b
        before = P + i <= Q
        warmup = warmup + np.where(before, f, 0.0)
        cum_q = cum_q + np.where(before, b, 0.0)
    return warmup + TQ + cum_q + best


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


_WORKER: dict[str, Any] = {}


def _init_worker(model: Model, cluster: Cluster, spec: DappleSpec, costs: CostSource) -> None:
    _WORKER.update(model=model, cluster=cluster, spec=spec, costs=costs)


def _plan_in_worker(M: int) -> tuple[int, Candidate | None, Candidate | None, Candidate | None, int, int]:
    w = _WORKER
    return (M, *plan_micro_batches(w["model"], w["cluster"], w["spec"], w["costs"], M))


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
    if workers == 1:
        shared = StageCosts(model, cluster, costs, 1)
        for done, M in enumerate(counts, start=1):
            found[M] = plan_micro_batches(model, cluster, spec, costs, M, shared)
            if progress is not None:
                progress(done, len(counts), M)
    else:
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("fork" if "fork" in methods else None)
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker,
                                 initargs=(model, cluster, spec, costs)) as pool:  # fmt: skip
            # the fewest micro-batches (the most samples per micro-batch, the most replica counts) first
            futures = [pool.submit(_plan_in_worker, M) for M in counts]
            for done, fut in enumerate(as_completed(futures), start=1):
                M, *out = fut.result()
                found[M] = tuple(out)  # type: ignore[assignment]
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
) -> list[Checked]:
    """Simulate every shortlisted plan (:func:`shortlist`) under each warm-up policy.

    DAPPLE's latency model ignores the bubbles inside the pivot stage; they grow when a pipeline has about as
    many stages as micro-batches, so the planner's favourite is not always the simulator's. Choosing among the
    shortlist by simulation keeps the planner's search and the simulator's accuracy.
    """
    from distsim.simulate import simulate

    costs = costs if costs is not None else AnalyticCosts(result.cluster)
    if result.spec.schedule == "gpipe":
        policies = ("A",)
    items = shortlist(result)
    out = []
    for i, (label, cand) in enumerate(items, start=1):
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

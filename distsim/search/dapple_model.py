"""DAPPLE's latency model, placement policies and per-stage cost terms (Fan et al. 2021, Sec. IV; ALGORITHMS.md 3).

A plan's estimate is the paper's closed form over the compute stages with a communication stage between each pair
(:func:`pipeline_latency`, with the corrected ending-phase term); :func:`place` gives a new stage its GPUs under
Fresh First, Append First or Scatter First; :class:`StageCosts` caches the F, B, AR, transfer and memory terms of
stages from a cost source, and :func:`evaluate` scores one whole plan. The search over plans is in
:mod:`distsim.search.dapple_dp`; the driver in :mod:`distsim.search.dapple`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate

from distsim.core.cluster import Cluster
from distsim.core.errors import DistsimError
from distsim.core.models.graph import Model
from distsim.core.placement import group_instances, pair_instances
from distsim.plans import StagePlan
from distsim.plans.plan import split_samples
from distsim.plans.stages import stages_notation
from distsim.sim.costs import CommEvent, ComputeEvent, CostSource

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
                nbytes = round(layer.tied_shard_params(1) * model.precision.grad_bytes)
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

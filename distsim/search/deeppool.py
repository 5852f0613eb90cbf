"""DeepPool's burst-parallel planner (Park et al. 2022, Sec. 4; ALGORITHMS.md Sec. 1): a GPU count per layer.

Training is strong-scaled: the global batch B is fixed, and every layer i runs data-parallel over its own g_i GPUs
(GPUs 0..g_i-1), each holding about B/g_i samples. Narrow layers shrink to a few GPUs, wide ones burst to many;
between two layers on different counts the activations (and, backward, their gradients) change layout. The planner
minimises the iteration time under a per-layer bound on GPU-seconds, the *amplification limit*.

* :func:`plan_linear` is the paper's Algorithm 1 as ALGORITHMS.md 1.4 prints it (the paper's variant: ``<=`` in the
  time test, so ties go to the larger predecessor count, and ``bestAmp = min(bestAmp, Amp)``). The authors' code
  (``searchLinear``) differs: strict ``<``, ``amp < AmpLimit or amp < bestAmp`` with ``bestAmp = amp``, and layers
  of at most 300 us counted as Amp 1; the tests avoid ties so that both variants pass them.
* :func:`plan` adds the branch/join reduction (1.5) for a DAG of chains and blocks. A block, from a branching layer
  A1 to its joining layer A2 (A1's immediate post-dominator), is collapsed into a transition tr((A1,g0)->(A2,g)):
  every branch is planned by the same DP with A1@g0 as its first layer's only predecessor, the branches run
  concurrently (the join waits for the slowest, the code's choice), and A2's predecessor config g0 is chosen by
  Algorithm 1's own rule over Amp(A1,g0) ("the linear search algorithm considers the whole block as a single edge
  cost", Sec. 4.2; ALGORITHMS.md's step 5 keeps the minimising g0, which is the same whenever the limit does not
  bind). Blocks nest (recursing), and a branch may itself fork into branches that all end at the enclosing join
  (:mod:`distsim.search.deeppool_graph` finds this structure); the forking layer's config is chosen by the same
  rule. The state of a layer inside k nested blocks is an array over the k enclosing entry configs and its own, so
  each step is a few numpy operations (no Python loop over configs except the rule's ordered scan over predecessor
  counts).

The result gives per-layer GPU counts, the predicted iteration time S, per-layer T (incoming layout changes +
compute + gradient all-reduce), Amp = T g / comp(i,1) and GPU-seconds sum T g; :func:`evaluate` scores any per-layer
assignment with the same costs (the DAG's longest path), e.g. plain data parallelism (every layer on all G GPUs).
:func:`problem_from_model` fills the cost tables from a cost source and :func:`plan_deeppool` plans a model with
them. Pure: no torch, no I/O.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from distsim.core.cluster import Cluster
from distsim.core.models.graph import Model
from distsim.plans import Plan, burst_plan
from distsim.plans.redistribution import redistribution, scope_of, transfer_cost
from distsim.search.deeppool_graph import Block, Branch, BurstError, decompose, side_by_side
from distsim.sim.costs import CommEvent, ComputeEvent, CostSource

Edge = tuple[int, int]


# --------------------------------------------------------------------------------------------------- the problem
@dataclass(frozen=True)
class BurstProblem:
    """Everything the DP reads (ALGORITHMS.md 1.2). Times in seconds (any unit works: the DP only adds them)."""

    names: tuple[str, ...]
    """Layer names, in topological order."""
    inputs: tuple[tuple[int, ...], ...]
    """For each layer, the layers whose outputs it consumes (the DAG's in-edges); () for the first layer."""
    counts: tuple[int, ...]
    """Candidate GPU counts, ascending (the paper: powers of two up to G)."""
    comp: np.ndarray
    """(layers, counts): forward + backward time of layer i at count g (per-GPU batch B/g)."""
    sync: np.ndarray
    """(layers, counts): the non-overlapped gradient all-reduce of layer i over g GPUs (0 at g = 1)."""
    comm: Mapping[Edge, np.ndarray]
    """(i, j) -> (counts, counts): moving layer i's output from h GPUs to j's g GPUs, forward and backward."""
    single: np.ndarray
    """(layers,): comp(i, 1), the denominator of Amp (given apart: 1 need not be a candidate count)."""
    amp_limit: float = 2.0

    def __post_init__(self) -> None:
        n, k = len(self.names), len(self.counts)
        if not n:
            raise BurstError("there are no layers to plan")
        if not k or list(self.counts) != sorted(set(self.counts)) or self.counts[0] < 1:
            raise BurstError(f"candidate GPU counts must be distinct positive integers, ascending; got {self.counts}")
        if not self.amp_limit >= 1:  # also NaN
            raise BurstError(f"the amplification limit must be at least 1 (1: no layer may cost more GPU-seconds "
                             f"than on one GPU), got {self.amp_limit}")  # fmt: skip
        for name in ("comp", "sync"):
            if getattr(self, name).shape != (n, k):
                raise BurstError(f"{name} must be a ({n}, {k}) table, got {getattr(self, name).shape}")
        if self.single.shape != (n,):
            raise BurstError(f"single must hold one time per layer ({n}), got {self.single.shape}")
        for j, ins in enumerate(self.inputs):
            for i in ins:
                if not 0 <= i < j:
                    raise BurstError(f"layer {self.names[j]!r} takes input {i}: layers must be in topological order")
                if (i, j) not in self.comm or self.comm[(i, j)].shape != (k, k):
                    raise BurstError(f"comm needs a ({k}, {k}) table for the edge {self.names[i]} -> {self.names[j]}")

    @property
    def num_layers(self) -> int:
        return len(self.names)

    @classmethod
    def chain(cls, comp: Sequence[Sequence[float]], counts: Sequence[int],
              comm: Callable[[int, int, int], float] | Sequence[Sequence[Sequence[float]]],
              sync: Sequence[Sequence[float]] | None = None, single: Sequence[float] | None = None,
              amp_limit: float = 2.0) -> BurstProblem:  # fmt: skip
        """A chain of layers from plain tables (tests and what-ifs): comp[i][k] at counts[k]; comm either
        comm(i, h, g) (the cost of the edge into layer i+1) or one (counts x counts) table per edge; sync zero by
        default; single defaults to comp at count 1 (which must then be a candidate)."""
        n = len(comp)
        inputs = tuple(((i - 1,) if i else ()) for i in range(n))
        tables = {}
        for i in range(n - 1):
            if callable(comm):
                tables[(i, i + 1)] = np.array([[comm(i, h, g) for g in counts] for h in counts], dtype=float)
            else:
                tables[(i, i + 1)] = np.asarray(comm[i], dtype=float)
        return cls.from_tables([f"L{i}" for i in range(n)], inputs, counts, comp, tables, sync, single, amp_limit)

    @classmethod
    def from_tables(cls, names: Sequence[str], inputs: Sequence[Sequence[int]], counts: Sequence[int],
                    comp: Sequence[Sequence[float]], comm: Mapping[Edge, Sequence[Sequence[float]] | np.ndarray],
                    sync: Sequence[Sequence[float]] | None = None, single: Sequence[float] | None = None,
                    amp_limit: float = 2.0) -> BurstProblem:  # fmt: skip
        comp_a = np.asarray(comp, dtype=float)
        if single is None:
            if counts[0] != 1:
                raise BurstError("without single-GPU times (single=) the counts must include 1")
            single = comp_a[:, 0]
        return cls(
            tuple(names), tuple(tuple(x) for x in inputs), tuple(counts), comp_a,
            np.zeros_like(comp_a) if sync is None else np.asarray(sync, dtype=float),
            {e: np.asarray(t, dtype=float) for e, t in comm.items()}, np.asarray(single, dtype=float), amp_limit,
        )  # fmt: skip


# ------------------------------------------------------------------------------------------------- the result
@dataclass(frozen=True)
class BurstResult:
    names: tuple[str, ...]
    counts: tuple[int, ...]
    """The candidate counts the plan was chosen from."""
    gpus: tuple[int, ...]
    """Per layer: its GPU count g_i (the layer runs on GPUs 0..g_i-1)."""
    time_s: float
    """S: the predicted iteration time (the DAG's longest path)."""
    layer_s: tuple[float, ...]
    """Per layer: T, its incoming layout changes + compute + gradient all-reduce."""
    amp: tuple[float, ...]
    """Per layer: T g / comp(i,1), the GPU-sec amplification."""
    amp_limit: float
    planning_s: float = 0.0
    """Wall time of the DP (0 for :func:`evaluate`)."""
    tables_s: float = 0.0
    """Wall time of building the cost tables (set by callers that build them)."""

    @property
    def gpu_seconds(self) -> float:
        """sum_i T_i g_i: the GPU time one iteration occupies (idle GPUs go to other jobs)."""
        return float(sum(t * g for t, g in zip(self.layer_s, self.gpus, strict=True)))

    @property
    def over_limit(self) -> tuple[int, ...]:
        """Layers whose amplification exceeds the limit: the DP's fallback (every option broke the limit), or the
        last layer, whose amplification the DP never checks (ALGORITHMS.md 1.4)."""
        return tuple(i for i, a in enumerate(self.amp) if a > self.amp_limit * (1 + 1e-12))

    def devices(self, i: int) -> tuple[int, ...]:
        return tuple(range(self.gpus[i]))

    def runs(self) -> list[tuple[int, int, int]]:
        """(first layer, last layer, count) for each run of consecutive layers on the same count."""
        out: list[tuple[int, int, int]] = []
        for i, g in enumerate(self.gpus):
            if out and out[-1][2] == g:
                out[-1] = (out[-1][0], i, g)
            else:
                out.append((i, i, g))
        return out

    def to_dict(self) -> dict[str, object]:
        return {
            "gpus": list(self.gpus),
            "runs": [{"first": a, "last": b, "gpus": g} for a, b, g in self.runs()],
            "time_s": self.time_s,
            "gpu_seconds": self.gpu_seconds,
            "layers": [
                {"name": n, "gpus": g, "T_s": t, "amp": a}
                for n, g, t, a in zip(self.names, self.gpus, self.layer_s, self.amp, strict=True)
            ],
            "amp_limit": self.amp_limit,
            "over_limit": [self.names[i] for i in self.over_limit],
            "counts": list(self.counts),
            "planning_s": self.planning_s,
            "tables_s": self.tables_s,
        }


# ------------------------------------------------------------------------------------------------------ the DP
def _scan(cand: np.ndarray, amp: np.ndarray, t_in: np.ndarray, limit: float
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Algorithm 1's inner loop, vectorised over everything but the predecessor count h (scanned ascending):
    cand[..., h, g] is the time to reach the layer at g from the predecessor at h, amp[..., h] the predecessor's
    Amp, t_in[..., h, g] the layout-change time that goes into T. Returns (bestS, bestT, arg) over [..., g]."""
    t_in = np.broadcast_to(t_in, cand.shape)
    shape = cand.shape[:-2] + cand.shape[-1:]
    best_s = np.full(shape, np.inf)
    best_amp = np.full(shape, np.inf)
    best_t = np.zeros(shape)
    arg = np.full(shape, -1, dtype=np.int64)
    for h in range(cand.shape[-2]):
        c, a = cand[..., h, :], amp[..., h, None]
        ok = (a <= np.maximum(best_amp, limit)) & (c <= best_s)
        best_s = np.where(ok, c, best_s)
        best_t = np.where(ok, t_in[..., h, :], best_t)
        arg = np.where(ok, h, arg)
        best_amp = np.where(ok, np.minimum(best_amp, a), best_amp)
    return best_s, best_t, arg


class _DP:
    """One run of the planner: per layer, S, T and Amp over (enclosing block entry configs..., own config)."""

    def __init__(self, p: BurstProblem):
        self.p = p
        self.k = len(p.counts)
        self.g = np.asarray(p.counts, dtype=float)
        self.extra = p.comp + p.sync
        self.S: dict[int, np.ndarray] = {}
        self.T: dict[int, np.ndarray] = {}
        self.A: dict[int, np.ndarray] = {}
        self.arg: dict[int, np.ndarray] = {}
        """Chain layer -> its predecessor's config; join -> the entry config g0; a branch's first layer -> its end
        (or forking) layer's config at each join config."""
        self.end: dict[int, np.ndarray] = {}

    def _finish(self, i: int, best_s: np.ndarray, best_t: np.ndarray) -> None:
        self.S[i] = best_s + self.extra[i]
        self.T[i] = t = best_t + self.extra[i]
        one = self.p.single[i]
        self.A[i] = t * self.g / one if one > 0 else np.where(t > 0, np.inf, 1.0)

    def _step(self, pred: int, i: int) -> None:
        c = self.p.comm[(pred, i)]
        best_s, best_t, self.arg[i] = _scan(self.S[pred][..., :, None] + c, self.A[pred], c, self.p.amp_limit)
        self._finish(i, best_s, best_t)

    def items(self, items: Sequence[int | Block], pred: int | None, seeded: bool) -> int:
        """Plan a chain after layer `pred` (None: the first layer); `seeded`: pred's config is fixed by a new last
        batch axis (a branch's first layer). Returns the chain's last layer."""
        for item in items:
            if isinstance(item, Block):
                assert pred is not None
                self.block(item, pred)
                pred = item.join
            elif pred is None:
                self._finish(item, np.zeros(self.k), np.zeros(self.k))
                pred = item
            elif seeded:
                c = self.p.comm[(pred, item)]
                self._finish(item, self.S[pred][..., :, None] + c, np.broadcast_to(c, self.S[pred].shape + c.shape[1:]))
                pred, seeded = item, False
            else:
                self._step(pred, item)
                pred = item
        assert pred is not None
        return pred

    def arrival(self, b: Branch, entry: int, join: int) -> tuple[np.ndarray, np.ndarray]:
        """best_b over [..., g0, g]: the earliest the branch's output (entry at g0) reaches the join at g, and the
        layout-change time it adds to the join's T."""
        if not b.items:
            c = self.p.comm[(entry, join)]
            return self.S[entry][..., :, None] + c, np.broadcast_to(c, self.S[entry].shape + c.shape[1:])
        last = self.items(b.items, entry, seeded=True)
        first = b.items[0]
        assert isinstance(first, int)
        if not b.forks:
            c = self.p.comm[(last, join)]
            best_s, best_t, self.end[first] = _scan(self.S[last][..., :, None] + c, self.A[last], c, self.p.amp_limit)
            return best_s, best_t
        cand, t_in = self.concurrent(b.forks, last, join)
        best_s, best_t, self.end[first] = _scan(cand, self.A[last], t_in, self.p.amp_limit)
        return best_s, best_t

    def concurrent(self, branches: Sequence[Branch], entry: int, join: int) -> tuple[np.ndarray, np.ndarray]:
        """Branches from `entry` to `join` run concurrently: the join waits for the slowest; T adds every one."""
        found = [self.arrival(b, entry, join) for b in branches]
        return np.maximum.reduce([s for s, _ in found]), np.add.reduce([t for _, t in found])

    def block(self, blk: Block, entry: int) -> None:
        cand, t_in = self.concurrent(blk.branches, entry, blk.join)
        best_s, best_t, self.arg[blk.join] = _scan(cand, self.A[entry], t_in, self.p.amp_limit)
        self._finish(blk.join, best_s, best_t)

    # ------------------------------------------------------------------------------------------ backtracking
    def back_items(self, items: Sequence[int | Block], cfg: int, at: tuple[int, ...], out: list[int]) -> None:
        """Fill out[i] (a config index) for a chain whose last layer has config `cfg`, at batch index `at` (the
        configs of the enclosing blocks' entries); its first layer's predecessor is the caller's."""
        for pos in range(len(items) - 1, -1, -1):
            item = items[pos]
            if isinstance(item, Block):
                out[item.join] = cfg
                g0 = int(self.arg[item.join][(*at, cfg)])
                for b in item.branches:
                    self.back_branch(b, item.join, cfg, (*at, g0), out)
                cfg = g0
            else:
                out[item] = cfg
                if pos:
                    cfg = int(self.arg[item][(*at, cfg)])

    def back_branch(self, b: Branch, join: int, cfg: int, at: tuple[int, ...], out: list[int]) -> None:
        if not b.items:
            return
        first = b.items[0]
        assert isinstance(first, int)
        last_cfg = int(self.end[first][(*at, cfg)])
        for f in b.forks:
            self.back_branch(f, join, cfg, (*at, last_cfg), out)
        self.back_items(b.items, last_cfg, at, out)


def plan(problem: BurstProblem, structure: Branch | None = None) -> BurstResult:
    """DeepPool's planner: Algorithm 1 along the chain, blocks reduced to transitions (module docstring)."""
    t0 = time.perf_counter()
    p = problem
    top = structure if structure is not None else decompose(p.names, p.inputs)
    dp = _DP(p)
    last = dp.items(top.items, None, seeded=False)
    end = int(np.argmin(dp.S[last]))
    cfg: list[int] = [-1] * p.num_layers
    dp.back_items(top.items, end, (), cfg)
    chosen = tuple(p.counts[c] for c in cfg)
    # T and Amp of the chosen layers (the DP's own T along its path; S equals the assignment's longest path)
    scored = evaluate(p, chosen)
    return BurstResult(p.names, p.counts, chosen, float(dp.S[last][end]), scored.layer_s, scored.amp, p.amp_limit,
                       planning_s=time.perf_counter() - t0)  # fmt: skip


def plan_linear(problem: BurstProblem) -> BurstResult:
    """Algorithm 1 on a chain (every layer's only input the layer before it); BurstError otherwise."""
    if any(ins != ((i - 1,) if i else ()) for i, ins in enumerate(problem.inputs)):
        raise BurstError("plan_linear takes a chain of layers; plan() reduces branches and joins")
    return plan(problem, Branch(tuple(range(problem.num_layers))))


def evaluate(problem: BurstProblem, gpus: Sequence[int]) -> BurstResult:
    """Score a per-layer assignment with the planner's costs: each layer starts when its slowest input has arrived
    (branches concurrent), T = its incoming layout changes + comp + sync, Amp = T g / comp(i,1)."""
    p = problem
    index = {g: k for k, g in enumerate(p.counts)}
    if len(gpus) != p.num_layers or any(g not in index for g in gpus):
        raise BurstError(f"an assignment needs one of the counts {p.counts} for each of the {p.num_layers} layers")
    ks = [index[g] for g in gpus]
    finish: list[float] = []
    layer_s: list[float] = []
    amp: list[float] = []
    for i, ins in enumerate(p.inputs):
        k = ks[i]
        moves = [float(p.comm[(j, i)][ks[j], k]) for j in ins]
        start = max((finish[j] + m for j, m in zip(ins, moves, strict=True)), default=0.0)
        own = float(p.comp[i, k] + p.sync[i, k])
        finish.append(start + own)
        t = sum(moves) + own
        layer_s.append(t)
        one = float(p.single[i])
        amp.append(t * gpus[i] / one if one > 0 else (math.inf if t > 0 else 1.0))
    return BurstResult(p.names, p.counts, tuple(gpus), finish[-1], tuple(layer_s), tuple(amp), p.amp_limit)


# ----------------------------------------------------------------------------------------- from a model's costs
def power_counts(gpus: int) -> tuple[int, ...]:
    """The paper's candidates: 1, 2, 4, ... up to `gpus` (and `gpus` itself when it is not a power of two, so that
    plain data parallelism over every GPU is a candidate)."""
    out = [1 << e for e in range(gpus.bit_length()) if 1 << e <= gpus]
    return tuple(out if out[-1] == gpus else [*out, gpus])


def feasible_counts(counts: Sequence[int], batch: int, gpus: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(kept, dropped): a count needs g <= B (a sample per GPU at least) and g <= G; BurstError when none is left."""
    wanted = sorted(set(counts))
    kept = tuple(g for g in wanted if 1 <= g <= min(batch, gpus))
    if not kept:
        raise BurstError(f"no candidate GPU count fits: every count in {','.join(map(str, wanted))} exceeds the "
                         f"global batch {batch} (each GPU needs a sample) or the {gpus} GPUs")  # fmt: skip
    return kept, tuple(g for g in wanted if g not in kept)


def check_graph(model: Model) -> Branch:
    """The model's layer graph as chains and blocks, with the activation sizes the planner prices; BurstError
    naming what is missing (a graph of another form, a consumed layer without ``out_bytes``)."""
    try:
        top = decompose([x.name for x in model.layers], model.input_layers)
    except BurstError as e:
        raise BurstError(f"{model.name}: {e}") from None
    used = {i for ins in model.input_layers for i in ins}
    for i in sorted(used):
        if model.layers[i].out_bytes <= 0:
            raise BurstError(f"{model.name}: layer {model.layers[i].name!r} has no output size (out_bytes), which "
                             f"the planner needs to price moving its activations between GPU counts")  # fmt: skip
    return top


def problem_from_model(model: Model, cluster: Cluster, costs: CostSource, gpus: int, batch: int,
                       counts: Sequence[int], amp_limit: float = 2.0) -> BurstProblem:  # fmt: skip
    """The DP's tables for `model` on the first `gpus` GPUs of `cluster` at global batch `batch`:

    * comp(i,g): the layer's forward + backward time at ceil(B/g) samples per GPU, the largest shard (B not
      divisible by g leaves some GPUs a sample more, and the layer waits for them);
    * comm((i,h)->(j,g)): 2 x :func:`distsim.plans.redistribution.redistribution_cost` of layer i's output (forward
      activations
      and backward gradients), i on GPUs 0..h-1 and j on 0..g-1, the cost the simulator charges too;
    * sync(i,g): the all-reduce of the layer's parameter gradients over its g GPUs (intra-node when g fits in a
      node), 0 for g = 1 or a layer without parameters; not overlapped with backward, as DeepPool assumes. The
      optimizer step is left out, as in the paper (it does not depend on g).
    """
    check_graph(model)
    kept, _ = feasible_counts(counts, batch, gpus)
    gpn, dtype, grad_bytes = cluster.gpus_per_node, model.precision.name, model.precision.grad_bytes

    def layer_times(n: int) -> list[float]:
        return [
            sum(costs.compute(ComputeEvent(b, phase, n, 1, dtype)).seconds for b in layer.blocks for phase in "FB")
            for layer in model.layers
        ]

    comp = np.array([layer_times(-(-batch // g)) for g in kept]).T
    single = comp[:, 0].copy() if kept[0] == 1 else np.array(layer_times(batch))
    sync = np.zeros_like(comp)
    for k, g in enumerate(kept):
        if g == 1:
            continue
        scope = scope_of(range(g), gpn)
        for i, layer in enumerate(model.layers):
            nbytes = round(layer.params * grad_bytes)
            if nbytes > 0:
                sync[i, k] = costs.comm(CommEvent("all_reduce", nbytes, g, scope)).seconds
    moves = {(a, b): redistribution(batch, tuple(range(h)), tuple(range(g)))
             for a, h in enumerate(kept) for b, g in enumerate(kept) if h != g}  # fmt: skip
    tables: dict[float, np.ndarray] = {}
    comm: dict[Edge, np.ndarray] = {}
    for j, ins in enumerate(model.input_layers):
        for i in ins:
            bps = model.layers[i].out_bytes
            table = tables.get(bps)
            if table is None:
                table = tables[bps] = np.zeros((len(kept), len(kept)))
                for (a, b), moved in moves.items():
                    cost, _ = transfer_cost(costs, gpn, moved, bps)
                    table[a, b] = 2 * cost.seconds if cost is not None else 0.0
            comm[(i, j)] = table
    return BurstProblem(tuple(x.name for x in model.layers), model.input_layers, kept, comp, sync, comm, single,
                        amp_limit)  # fmt: skip


PLACEMENTS = ("prefix", "side-by-side")
"""Where a plan puts a layer: on GPUs 0..g-1, as the planner prices every layout change (the default), or with a
block's concurrent branches on disjoint GPUs where they fit (:func:`side_by_side`), which lets them run at once
but moves the activations of a narrow layer to other GPUs, a cost the planner did not count."""


def to_plan(
    result: BurstResult, model_name: str, cluster_name: str, batch: int, nodes: int,
    devices: Mapping[int, Sequence[int]] | None = None, grad_sync: str = "bulk", **note: object,
) -> Plan:  # fmt: skip
    """A burst plan (:func:`distsim.plans.burst.burst_plan`) of the planner's counts: layer i on GPUs 0..g_i-1, or on
    ``devices[i]`` (:func:`side_by_side`); `grad_sync` bulk is the planner's no-overlap assumption. The planner's own
    figures go into the plan's note."""
    note = {"driver": "distsim search deeppool", "planner_estimate_s": round(result.time_s, 9),
            "amp_limit": result.amp_limit, **note}  # fmt: skip
    return burst_plan(model_name, cluster_name, result.gpus, batch, nodes, devices=devices, grad_sync=grad_sync,
                      **note)  # fmt: skip


@dataclass(frozen=True)
class DeepPoolResult:
    """The planner's answer for a model, and plain data parallelism over every GPU scored with the same costs."""

    model: Model
    cluster: Cluster
    gpus: int
    batch: int
    best: BurstResult
    dp: BurstResult | None
    """Every layer on all G GPUs (None when G > B: some GPU would get no sample)."""
    dropped: tuple[int, ...]
    """Candidate counts left out (g > B or g > G)."""
    cost_source: str

    def plan(self, which: str = "best", placement: str = "prefix", model: str | None = None,
             cluster: str | None = None, grad_sync: str = "bulk", **note: object) -> Plan:  # fmt: skip
        """The plan file form of the burst plan (``best``) or of plain data parallelism (``dp``), placed as
        `placement` says (:data:`PLACEMENTS`)."""
        chosen = self.best if which == "best" else self.dp
        if chosen is None:
            raise BurstError("data parallelism over every GPU needs at least one sample per GPU")
        if placement not in PLACEMENTS:
            raise BurstError(f"placement is one of {', '.join(PLACEMENTS)}, not {placement!r}")
        devices = side_by_side(check_graph(self.model), chosen.gpus, self.gpus) if placement == "side-by-side" else None
        return to_plan(chosen, model or self.model.name, cluster or self.cluster.name, self.batch, self.cluster.nodes,
                       devices=devices, grad_sync=grad_sync, placement=placement, **note)  # fmt: skip

    def to_dict(self) -> dict[str, object]:
        return {
            "model": self.model.name, "cluster": self.cluster.name, "gpus": self.gpus, "global_batch": self.batch,
            "cost_source": self.cost_source, "dropped_counts": list(self.dropped), "plan": self.best.to_dict(),
            "data_parallel": None if self.dp is None else self.dp.to_dict(),
        }  # fmt: skip


def plan_deeppool(model: Model, cluster: Cluster, costs: CostSource, gpus: int, batch: int,
               counts: Sequence[int] | None = None, amp_limit: float = 2.0) -> DeepPoolResult:  # fmt: skip
    """Build the tables (:func:`problem_from_model`; counts default to :func:`power_counts`) and plan; the
    result's ``tables_s`` and ``planning_s`` time the two parts."""
    if not amp_limit >= 1:
        raise BurstError(f"the amplification limit must be at least 1, got {amp_limit}")
    t0 = time.perf_counter()
    counts = power_counts(gpus) if counts is None else tuple(counts)
    problem = problem_from_model(model, cluster, costs, gpus, batch, counts, amp_limit)
    _, dropped = feasible_counts(counts, batch, gpus)
    tables_s = time.perf_counter() - t0
    best = replace(plan(problem), tables_s=tables_s)
    dp = None
    if gpus <= batch:
        base = problem if gpus in problem.counts else problem_from_model(model, cluster, costs, gpus, batch, (gpus,),
                                                                         amp_limit)  # fmt: skip
        dp = evaluate(base, [gpus] * model.num_layers)
    return DeepPoolResult(model, cluster, gpus, batch, best, dp, dropped, getattr(costs, "name", "?"))


__all__ = [
    "PLACEMENTS",
    "Block",
    "Branch",
    "BurstError",
    "BurstProblem",
    "BurstResult",
    "DeepPoolResult",
    "check_graph",
    "decompose",
    "evaluate",
    "feasible_counts",
    "plan",
    "plan_deeppool",
    "plan_linear",
    "power_counts",
    "problem_from_model",
    "side_by_side",
    "to_plan",
]

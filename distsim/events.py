"""Event flow: the task DAG of one training iteration, built hierarchically as in DistSim Sec. 4.3.

1. **Tensor (model) parallelism** maps every block of a layer to a compute event followed, when tp > 1, by an
   all-reduce over the tp group (forward and backward): :func:`_stage_templates`.
2. **Pipeline parallelism** walks the schedule (DistSim Algorithm 1): each (stage, F/B, micro-batch) action expands
   to its stage's events; a forward waits for the previous stage's activation transfer, a backward for the next
   stage's gradient transfer; after an action the result is sent to the neighbour. A send is *non-blocking* by
   default (a pure delay on the sender's p2p stream) or, with ``p2p_blocking``, occupies the sender's compute stream
   as Algorithm 1 puts it in the device's event list.
3. **Data parallelism** replicates the pipeline and adds gradient synchronisation: one bulk all-reduce of the
   stage's gradients after the last backward (DistSim), or one all-reduce per layer issued as soon as that layer's
   last backward finishes and overlapped with the rest of backward (WFBP). The optimizer step follows.

Every task occupies one or more *slots*, an in-order stream of one GPU, like a CUDA stream; a collective is one task
on all its members, so it starts when every member is ready. Tasks are emitted in a global topological order (the
unit-time order of the schedule), and each stream serves its tasks in that order, so every wait points to an earlier
task: the flow cannot deadlock, and with fixed orders the iteration time is a max-plus function of the durations
(more bandwidth or faster compute never makes it longer).

**Link sharing.** ``structural`` (default): communication runs on the ``tp``, ``p2p`` and ``dp`` streams and shares
links only as the cost model says (k symmetric flows leaving a node at once split its NICs); traffic of different
kinds overlaps freely, an optimistic bound. ``serialize``: all communication of one scope on a GPU (a p2p transfer on
both its ends) goes through one in-order queue per link class, ``link:intra`` and ``link:inter``, in emission order:
p2p and collective traffic take turns on the link, a pessimistic bound. First-come arbitration is deliberately not
offered: it admits Graham-type anomalies where faster compute slows the iteration.

**Overlap interference.** Communication that overlaps compute on the same GPU is not free: on CPUs the rank's
cores run the TCP stack and the reductions, on GPUs NCCL kernels take SMs. A profile measures, per scope, how much
compute slows while an all-reduce runs (c) and how much the all-reduce slows while compute runs (k). Overlappable
transfers (a WFBP layer all-reduce other than a rank's last, a non-blocking send) then take (1 + k) times as long
and put a *shadow* task of c / (1 + c) of that time on their GPUs' compute streams, in emission order: where compute
is running it is delayed by that share, where the stream idles it costs nothing. Without measurements c = k = 0.

**Symmetry.** Replicas and tensor-parallel peers of a pipeline rank do identical work when their GPUs are equally
fast and every instance of each communication has the same scope and NIC sharing. Then one GPU per pipeline rank is
simulated and stands for the tp x dp GPUs of that rank; otherwise every GPU is simulated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from distsim.cluster import Cluster
from distsim.costs import CommEvent, ComputeEvent, Cost, CostSource, optimizer_key
from distsim.models.graph import Model
from distsim.partition import balanced_partition, ranges, rank_layers
from distsim.placement import CommInstance, Placement, parse_order
from distsim.schedules import Action, Schedule, build_schedule
from distsim.strategy import Strategy, check_strategy

STREAMS = ("compute", "tp", "p2p", "dp", "link:intra", "link:inter")
KINDS = ("forward", "backward", "tp_allreduce", "p2p", "dp_allreduce", "optimizer", "interference")
COMPUTE_KINDS = frozenset({"forward", "backward", "optimizer"})
S_COMPUTE, S_TP, S_P2P, S_DP, S_LINK_INTRA, S_LINK_INTER = range(6)
LINK_SHARING = ("structural", "serialize")
K_FWD, K_BWD, K_TP, K_P2P, K_DP, K_OPT, K_SHADOW = range(7)
"""K_SHADOW: compute-stream time taken by overlapped communication (measured interference); not a timeline row."""


@dataclass(frozen=True)
class FlowOptions:
    p2p_blocking: bool = False
    """True: a send occupies the sender's compute stream (DistSim Algorithm 1); False: a pure delay on a p2p stream."""
    symmetric: bool | None = None
    """None: exploit symmetry when it holds; False: simulate every GPU; True: require symmetry."""
    rank_order: str = "tp,dp,pp"
    """Rank placement, innermost dimension first (Megatron-LM: tensor, then data, then pipeline)."""
    link_sharing: str = "structural"
    """``structural``: traffic kinds overlap, NIC shares from the structure; ``serialize``: one queue per link."""

    def __post_init__(self) -> None:
        if self.link_sharing not in LINK_SHARING:
            from distsim.errors import DistsimError

            raise DistsimError(f"link sharing must be one of {', '.join(LINK_SHARING)}, got {self.link_sharing!r}")


@dataclass
class EventFlow:
    """Tasks as parallel lists (index = task id) plus what the engine and the timeline need."""

    model: Model
    cluster: Cluster
    strategy: Strategy
    schedule: Schedule
    placement: Placement | None
    """Rank placement of a uniform strategy; None for a stages plan (its stages list their devices)."""
    stage_ranges: tuple[tuple[int, int], ...]
    symmetric: bool
    represents: dict[int, tuple[int, ...]]
    """Simulated GPU -> the GPUs it stands for (itself first)."""
    duration_s: list[float] = field(default_factory=list)
    deps: list[list[int]] = field(default_factory=list)
    slots: list[tuple[tuple[int, int], ...]] = field(default_factory=list)
    """(gpu, stream) pairs each task occupies; a timeline row per slot."""
    kind: list[int] = field(default_factory=list)
    name: list[str] = field(default_factory=list)
    layer: list[int] = field(default_factory=list)
    stage: list[int] = field(default_factory=list)
    microbatch: list[int] = field(default_factory=list)
    key: list[int] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    key_costs: list[Cost] = field(default_factory=list)
    key_kinds: list[str] = field(default_factory=list)
    _last: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)
    _key_index: dict[str, int] = field(default_factory=dict, repr=False)

    def __len__(self) -> int:
        return len(self.duration_s)

    @property
    def simulated_gpus(self) -> list[int]:
        return sorted(self.represents)

    def intern(self, key: str, cost: Cost, kind: str) -> int:
        idx = self._key_index.get(key)
        if idx is None:
            idx = self._key_index[key] = len(self.keys)
            self.keys.append(key)
            self.key_costs.append(cost)
            self.key_kinds.append(kind)
        return idx

    def add(
        self,
        dur: float,
        slots: tuple[tuple[int, int], ...],
        kind: int,
        name: str,
        layer: int,
        stage: int,
        mb: int,
        key: int,
        deps: list[int],
    ) -> int:
        """Append a task; it also waits for the previous task of each (gpu, stream) slot it occupies."""
        tid = len(self.duration_s)
        last = self._last
        for slot in slots:
            prev = last.get(slot)
            if prev is not None:
                deps.append(prev)
            last[slot] = tid
        self.duration_s.append(dur)
        self.deps.append(deps)
        self.slots.append(slots)
        self.kind.append(kind)
        self.name.append(name)
        self.layer.append(layer)
        self.stage.append(stage)
        self.microbatch.append(mb)
        self.key.append(key)
        return tid

    def add_chain(self, chain: Chain, first_deps: list[int], stage: int, mb: int) -> int:
        """Append a stage template's ops on one GPU at once, each after the one before: exactly the tasks and
        dependency lists that :meth:`add` would give op by op (a compute op first waits for `first_deps`, a
        tensor-parallel op only for the op before it), in a fraction of the time. Returns the last task id."""
        tid0 = len(self.duration_s)
        last = self._last
        deps = self.deps
        for i, (first_compute, prev) in enumerate(chain.links):
            d = (list(first_deps) if first_compute else []) if i == 0 else [tid0 + i - 1]
            if prev >= 0:
                d.append(tid0 + prev)
            else:
                q = last.get(chain.slots[i][0])
                if q is not None:
                    d.append(q)
            deps.append(d)
        for slot, i in chain.last_on_slot:
            last[slot] = tid0 + i
        n = len(chain.links)
        self.duration_s.extend(chain.durations)
        self.slots.extend(chain.slots)
        self.kind.extend(chain.kinds)
        self.name.extend(chain.names)
        self.layer.extend(chain.layers)
        self.stage.extend([stage] * n)
        self.microbatch.extend([mb] * n)
        self.key.extend(chain.keys)
        return tid0 + n - 1

    @property
    def events_total(self) -> int:
        """Per-GPU events of the whole cluster (what a full trace would contain)."""
        weight = {g: len(r) for g, r in self.represents.items()}
        return sum(weight[g] for slots, k in zip(self.slots, self.kind, strict=True) if k != K_SHADOW
                   for g, _ in slots)  # fmt: skip

    @property
    def events_unique(self) -> int:
        return len(self.keys)


@dataclass(frozen=True)
class StageOp:
    """One step of a stage's forward or backward template."""

    kind: int
    dur: float
    key: int
    name: str
    layer: int
    comm: CommEvent | None = None


@dataclass(frozen=True)
class Chain:
    """A run of a stage template's ops on one GPU, laid out for :meth:`EventFlow.add_chain`."""

    durations: tuple[float, ...]
    slots: tuple[tuple[tuple[int, int]], ...]
    """The one (gpu, stream) slot of each op."""
    kinds: tuple[int, ...]
    names: tuple[str, ...]
    layers: tuple[int, ...]
    keys: tuple[int, ...]
    links: tuple[tuple[bool, int], ...]
    """Per op: (it waits for the chain's first dependencies: the first op, unless a tensor-parallel op starts the
    template; the index in the chain of the previous op on its slot, or -1: the slot's last task before it)."""
    last_on_slot: tuple[tuple[tuple[int, int], int], ...]
    """(slot, index of the chain's last op on it)."""

    @classmethod
    def of(cls, ops: Sequence[StageOp], slots: Sequence[tuple[int, int]], speed: float, starts: bool = True) -> Chain:
        """Ops with their slots; compute durations scaled by the GPU's `speed` factor (as :meth:`action` does).
        `starts`: the chain starts its template (a tensor-parallel op there waits for nothing before it)."""
        seen: dict[tuple[int, int], int] = {}
        links = []
        for i, (op, slot) in enumerate(zip(ops, slots, strict=True)):
            links.append((i == 0 and not (starts and op.kind == K_TP), seen.get(slot, -1)))
            seen[slot] = i
        return cls(
            durations=tuple(op.dur if op.kind == K_TP else op.dur * speed for op in ops),
            slots=tuple((slot,) for slot in slots),
            kinds=tuple(op.kind for op in ops),
            names=tuple(op.name for op in ops),
            layers=tuple(op.layer for op in ops),
            keys=tuple(op.key for op in ops),
            links=tuple(links),
            last_on_slot=tuple(seen.items()),
        )


def layer_weights(model: Model, strategy: Strategy, costs: CostSource) -> list[float]:
    """Estimated forward + backward seconds per layer at the strategy's micro-batch size and tp degree."""
    dtype = model.precision.name
    out = []
    for layer in model.layers:
        total = 0.0
        for block in layer.blocks:
            for phase in "FB":
                ev = ComputeEvent(block, phase, strategy.micro_batch_size, strategy.tp, dtype)
                total += costs.compute(ev).seconds
        out.append(total)
    return out


def resolve_partition(model: Model, strategy: Strategy, costs: CostSource) -> tuple[tuple[int, int], ...]:
    """[start, end) layer ranges per virtual stage: the strategy's partition or a compute-balanced one."""
    counts = strategy.partition
    if counts is None:
        counts = balanced_partition(layer_weights(model, strategy, costs), strategy.num_stages)
    return ranges(counts)


def stage_templates(
    flow: EventFlow, costs: CostSource, vs: int, tp_instance: CommInstance | None, mbs: int | None = None
) -> dict[str, list[StageOp]]:
    """Forward and backward op sequences of virtual stage vs (tensor-parallel level) at `mbs` samples (default: the
    strategy's micro-batch size)."""
    model, strategy = flow.model, flow.strategy
    start, end = flow.stage_ranges[vs]
    dtype, tp = model.precision.name, strategy.tp
    mbs = strategy.micro_batch_size if mbs is None else mbs
    out: dict[str, list[StageOp]] = {"F": [], "B": []}
    for phase, kind, order in (("F", K_FWD, range(start, end)), ("B", K_BWD, range(end - 1, start - 1, -1))):
        ops = out[phase]
        for li in order:
            layer = model.layers[li]
            blocks = layer.blocks if phase == "F" else tuple(reversed(layer.blocks))
            for block in blocks:
                ev = ComputeEvent(block, phase, mbs, tp, dtype)
                cost = costs.compute(ev)
                key = flow.intern(ev.key, cost, "compute")
                label = layer.name if len(layer.blocks) == 1 else f"{layer.name}.{block.op}"
                ops.append(StageOp(kind, cost.seconds, key, label, li))
                ar_bytes = block.tp_fwd_allreduce_bytes if phase == "F" else block.tp_bwd_allreduce_bytes
                if tp > 1 and ar_bytes > 0 and block.tp == "shard" and tp_instance is not None:
                    cev = CommEvent("all_reduce", round(ar_bytes * mbs), tp, tp_instance.scope, tp_instance.sharers)
                    ccost = costs.comm(cev)
                    ckey = flow.intern(cev.key, ccost, "tp_allreduce")
                    ops.append(StageOp(K_TP, ccost.seconds, ckey, label, li, cev))
    return out


def _symmetry_holds(placement: Placement, strategy: Strategy, cluster: Cluster) -> bool:
    pp = strategy.pp
    for r in range(pp):
        gpus = placement.stage_gpus(r)
        if len({cluster.speed_factor(g) for g in gpus}) > 1:
            return False
        patterns = [placement.tp_groups(r), placement.dp_groups(r)]
        if pp > 1:
            patterns += [placement.p2p_pairs(r, (r + 1) % pp), placement.p2p_pairs(r, (r - 1) % pp)]
            patterns.append(placement.p2p_pairs(0, pp - 1))  # tied embedding copies (first and last rank)
        for instances in patterns:
            if len({(i.scope, i.sharers) for i in instances}) > 1:
                return False
    return True


def build_flow(
    model: Model, cluster: Cluster, strategy: Strategy, costs: CostSource, options: FlowOptions | None = None
) -> EventFlow:
    """The full event DAG of one iteration of `strategy` on `cluster`."""
    options = options or FlowOptions()
    placement, symmetric = _placement(model, cluster, strategy, options)
    schedule = build_schedule(strategy)
    stage_ranges = resolve_partition(model, strategy, costs)
    grid = placement.grid
    pp, dp, tp = strategy.pp, strategy.dp, strategy.tp
    lanes_d = [0] if symmetric else list(range(dp))
    lanes_t = [0] if symmetric else list(range(tp))
    represents: dict[int, tuple[int, ...]] = {}
    for r in range(pp):
        for d in lanes_d:
            for t in lanes_t:
                g = int(grid[r, d, t])
                represents[g] = (g, *(x for x in placement.stage_gpus(r) if x != g)) if symmetric else (g,)
    flow = EventFlow(model, cluster, strategy, schedule, placement, stage_ranges, symmetric, represents)
    _Builder(flow, costs, options, lanes_d, lanes_t).run()
    return flow


def _placement(model: Model, cluster: Cluster, strategy: Strategy, options: FlowOptions) -> tuple[Placement, bool]:
    """The strategy checked against model and cluster, its placement, and whether one GPU per rank is simulated."""
    check_strategy(strategy, model, cluster)
    placement = Placement(strategy, cluster, parse_order(options.rank_order))
    symmetric = _symmetry_holds(placement, strategy, cluster)
    if options.symmetric is True and not symmetric:
        from distsim.errors import StrategyError

        raise StrategyError("symmetric simulation was required but replicas or tp peers differ on this cluster")
    return placement, symmetric and options.symmetric is not False


def overlap_shadows(costs: CostSource) -> int:
    """1 if overlapped transfers put shadow tasks on compute streams (measured interference), else 0."""
    return int(any(costs.interference(scope)[0] > 0 for scope in ("intra", "inter")))


def estimate_tasks(
    model: Model, cluster: Cluster, strategy: Strategy, costs: CostSource, options: FlowOptions | None = None
) -> int:
    """How many tasks :func:`build_flow` would emit, counted from the strategy and the model in O(layers) without
    building anything: exact, or slightly above when some all-reduce moves no bytes (it is then left out)."""
    options = options or FlowOptions()
    _, symmetric = _placement(model, cluster, strategy, options)
    dl, tl = (1, 1) if symmetric else (strategy.dp, strategy.tp)
    shadows = overlap_shadows(costs)
    blocks = [b for layer in model.layers for b in layer.blocks]
    tp_collectives = 0
    if strategy.tp > 1:
        sharded = [b for b in blocks if b.tp == "shard"]
        tp_collectives = sum(b.tp_fwd_allreduce_bytes > 0 for b in sharded) + sum(
            b.tp_bwd_allreduce_bytes > 0 for b in sharded
        )
    sends = 2 * (strategy.num_stages - 1) * tl * (1 + (0 if options.p2p_blocking else shadows))
    per_micro_batch = dl * (2 * len(blocks) * tl + tp_collectives + sends)
    grads = 0
    if strategy.dp > 1:
        wfbp = strategy.grad_sync == "wfbp"
        grads = tl * (model.num_layers if wfbp else strategy.pp) * (1 + (dl * shadows if wfbp else 0))
    tied = sum(layer.tied_to is not None for layer in model.layers) * dl * tl
    return strategy.num_micro_batches * per_micro_batch + grads + tied + strategy.pp * dl * tl


class CommWriter:
    """What every flow builder needs to place communication: streams, link queues and measured interference."""

    def __init__(self, flow: EventFlow, costs: CostSource, options: FlowOptions):
        self.flow, self.costs, self.options = flow, costs, options
        self.serialize = options.link_sharing == "serialize"
        self.speed = {g: flow.cluster.speed_factor(g) for g in flow.represents}
        self.last_dp: dict[int, int] = {}  # gpu -> its last gradient all-reduce task
        self._p2p: dict[tuple[int, str, int], tuple[int, float, float]] = {}  # (bytes, scope, sharers) -> key, times

    def comm_slots(self, stream: int, scope: str, gpus: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
        """Where a communication task runs: its kind's stream, or with serialize the link queue of its scope."""
        if self.serialize:
            stream = S_LINK_INTRA if scope == "intra" else S_LINK_INTER
        return tuple((g, stream) for g in gpus)

    def overlapped(self, dur: float, scope: str) -> tuple[float, float]:
        """(duration, shadow) of a transfer that overlaps compute, from the measured interference of its scope."""
        c, k = self.costs.interference(scope)
        longer = dur * (1 + k)
        return longer, longer * c / (1 + c)

    def shadow(self, seconds: float, gpus: tuple[int, ...], deps: list[int], stage: int, mb: int, key: int) -> None:
        if seconds <= 0:
            return
        for g in gpus:
            if g in self.speed:
                self.flow.add(seconds, ((g, S_COMPUTE),), K_SHADOW, "overlapped communication", -1, stage, mb, key,
                              list(deps))  # fmt: skip

    def p2p(self, inst: CommInstance, nbytes: int, what: str, src_vs: int, dst_vs: int, mb: int, dep: int) -> int:
        """One activation or gradient transfer between two GPUs after the sender's task `dep`; returns its task."""
        flow = self.flow
        known = (nbytes, inst.scope, inst.sharers)
        priced = self._p2p.get(known)
        if priced is None:
            ev = CommEvent("p2p", nbytes, 2, inst.scope, inst.sharers)
            cost = self.costs.comm(ev)
            dur, shadow = cost.seconds, 0.0
            if not self.options.p2p_blocking:
                dur, shadow = self.overlapped(cost.seconds, inst.scope)
            priced = self._p2p[known] = (flow.intern(ev.key, cost, "p2p"), dur, shadow)
        key, dur, shadow = priced
        src = inst.gpus[0]
        # with serialize the transfer holds the link at both ends
        slots = self.comm_slots(S_P2P, inst.scope, inst.gpus) if self.serialize else ((src, S_P2P),)
        if self.options.p2p_blocking:  # the sender's compute stream is busy too (DistSim Algorithm 1)
            slots = ((src, S_COMPUTE), *(x for x in slots if x[1] != S_P2P))
        tid = flow.add(dur, slots, K_P2P, f"{what} {src_vs}->{dst_vs}", -1, src_vs, mb, key, [dep])
        self.shadow(shadow, (src,), [dep], src_vs, mb, key)
        return tid

    def allreduce(
        self, inst: CommInstance, nbytes: int, name: str, layer: int, stage: int, deps: list[int], overlap: bool
    ) -> int:
        """A gradient all-reduce over `inst.gpus` after `deps`; `overlap`: backward still runs while it is in flight."""
        flow = self.flow
        ev = CommEvent("all_reduce", nbytes, len(inst.gpus), inst.scope, inst.sharers)
        cost = self.costs.comm(ev)
        key = flow.intern(ev.key, cost, "dp_allreduce")
        members = tuple(g for g in inst.gpus if g in self.speed)
        dur, shadow = cost.seconds, 0.0
        if overlap:
            dur, shadow = self.overlapped(cost.seconds, inst.scope)
        tid = flow.add(dur, self.comm_slots(S_DP, inst.scope, members), K_DP, name, layer, stage, -1, key, list(deps))
        self.shadow(shadow, members, list(deps), stage, -1, key)
        self.last_dp.update(dict.fromkeys(members, tid))
        return tid

    def optimizer_step(self, stage: int, shard_params: float, gpus: list[int]) -> None:
        """The optimizer step of `shard_params` parameters on each GPU, after its last gradient all-reduce."""
        if shard_params <= 0:
            return
        flow = self.flow
        state = flow.model.precision.state_bytes_per_param
        cost = self.costs.optimizer(shard_params, state)
        key = flow.intern(optimizer_key(shard_params, state), cost, "optimizer")
        for g in gpus:
            deps = [self.last_dp[g]] if g in self.last_dp else []
            flow.add(cost.seconds * self.speed[g], ((g, S_COMPUTE),), K_OPT, "optimizer step", -1, stage, -1, key, deps)


class _Builder(CommWriter):
    """Walks the schedule in unit-time order and emits tasks (pipeline and data-parallel levels)."""

    def __init__(
        self, flow: EventFlow, costs: CostSource, options: FlowOptions, lanes_d: list[int], lanes_t: list[int]
    ):
        super().__init__(flow, costs, options)
        assert flow.placement is not None
        self.placement = flow.placement
        self.lanes_d, self.lanes_t = lanes_d, lanes_t
        s = flow.strategy
        self.grid = flow.placement.grid
        self.num_stages = s.num_stages
        self.pp, self.dp, self.tp = s.pp, s.dp, s.tp
        # templates[vs][d] -> {"F": ops, "B": ops}: scopes may differ per replica when symmetry does not hold
        self.templates: dict[tuple[int, int], dict[str, list[StageOp]]] = {}
        self.chains: dict[tuple[int, int, str, int, bool], list[tuple[Chain, int | None]]] = {}
        self.incoming: dict[tuple[int, str, int, int, int], int] = {}  # (vs, op, mb, d, t) -> p2p task
        self.pairs: dict[tuple[int, int], list[CommInstance]] = {}
        self.last_b = self._last_backward_mb()
        self.rank_layers = [set(rank_layers(flow.stage_ranges, self.pp, r)) for r in range(self.pp)]

    def _last_backward_mb(self) -> dict[int, int]:
        last: dict[int, int] = {}
        for acts in self.flow.schedule.ranks:
            for a in acts:
                if a.op == "B":
                    last[a.stage] = a.microbatch
        return last

    def template(self, vs: int, d: int) -> dict[str, list[StageOp]]:
        key = (vs, d if not self.flow.symmetric else 0)
        tpl = self.templates.get(key)
        if tpl is None:
            r = vs % self.pp
            inst = self.placement.tp_groups(r)[d] if self.tp > 1 else None
            tpl = self.templates[key] = stage_templates(self.flow, self.costs, vs, inst)
        return tpl

    def run(self) -> None:
        sched = self.flow.schedule
        steps = sched.steps
        order = sorted(
            ((steps[r][i], r, i) for r, acts in enumerate(sched.ranks) for i in range(len(acts))),
        )
        for _, r, i in order:
            self.action(r, sched.ranks[r][i])
        self.finish()

    # ------------------------------------------------------------------------------------------------ pipeline
    def action(self, r: int, a: Action) -> None:
        """Emit one schedule action on every simulated replica of pipeline rank r."""
        s = self.flow.strategy
        wfbp = s.grad_sync == "wfbp" and self.dp > 1 and a.op == "B" and self.last_b[a.stage] == a.microbatch
        if len(self.lanes_d) == 1 and len(self.lanes_t) == 1:
            self._action_on_one_gpu(r, a, wfbp)
        else:
            self._action_on_lanes(r, a, wfbp)

    def _action_on_lanes(self, r: int, a: Action, wfbp: bool) -> None:
        """:meth:`action` op by op over the replicas (lanes) of rank r.

        Ops are the outer loop and replicas the inner one, so that a layer's WFBP all-reduce (which spans the
        replicas) is emitted as soon as every replica finished that layer's backward, before the next layer's
        compute: its place in each stream's order is then where it is issued in a real run.
        """
        flow, grid = self.flow, self.grid
        lanes = []
        for d in self.lanes_d:
            if a.op == "F":
                frontier = [[self.incoming.pop((a.stage, "F", a.microbatch, d, t))] if a.stage > 0 else []
                            for t in self.lanes_t]  # fmt: skip
            elif a.stage < self.num_stages - 1:
                frontier = [[self.incoming.pop((a.stage, "B", a.microbatch, d, t))] for t in self.lanes_t]
            else:
                frontier = [[] for _ in self.lanes_t]
            gpus = [int(grid[r, d, t]) for t in self.lanes_t]
            lanes.append((d, gpus, self.template(a.stage, d)[a.op], frontier, [-1] * len(gpus)))
        n_ops = len(lanes[0][2])
        for idx in range(n_ops):
            for _d, gpus, ops, frontier, last in lanes:
                op = ops[idx]
                if op.kind == K_TP:
                    assert op.comm is not None
                    tid = flow.add(op.dur, self.comm_slots(S_TP, op.comm.scope, tuple(gpus)), K_TP, op.name, op.layer,
                                   a.stage, a.microbatch, op.key, [x for x in last if x >= 0])  # fmt: skip
                    last[:] = [tid] * len(gpus)
                else:
                    for j, g in enumerate(gpus):
                        deps = frontier[j] if idx == 0 else ([last[j]] if last[j] >= 0 else [])
                        last[j] = flow.add(op.dur * self.speed[g], ((g, S_COMPUTE),), op.kind, op.name, op.layer,
                                           a.stage, a.microbatch, op.key, list(deps))  # fmt: skip
            op = lanes[0][2][idx]
            if wfbp and (idx + 1 == n_ops or lanes[0][2][idx + 1].layer != op.layer):  # the layer is done
                per_t = {t: [last[j] for _d, _g, _o, _f, last in lanes] for j, t in enumerate(self.lanes_t)}
                self.grad_allreduce(r, a.stage, per_t, layer=op.layer)
        for d, gpus, _ops, _frontier, last in lanes:
            self.send(r, a, d, gpus, last)

    def _action_on_one_gpu(self, r: int, a: Action, wfbp: bool) -> None:
        """:meth:`action` when one GPU stands for the whole pipeline rank (a symmetric simulation, or tp = dp = 1):
        the template's ops are one chain (split at layer ends for WFBP's per-layer all-reduce), emitted at once."""
        d, t = self.lanes_d[0], self.lanes_t[0]
        if a.op == "F":
            frontier = [self.incoming.pop((a.stage, "F", a.microbatch, d, t))] if a.stage > 0 else []
        elif a.stage < self.num_stages - 1:
            frontier = [self.incoming.pop((a.stage, "B", a.microbatch, d, t))]
        else:
            frontier = []
        g = int(self.grid[r, d, t])
        last = -1
        for chain, layer in self._chains(a.stage, d, a.op, g, wfbp):
            last = self.flow.add_chain(chain, frontier if last < 0 else [last], a.stage, a.microbatch)
            if layer is not None:
                self.grad_allreduce(r, a.stage, {t: [last]}, layer=layer)
        self.send(r, a, d, [g], [last])

    def _chains(self, vs: int, d: int, op: str, g: int, per_layer: bool) -> list[tuple[Chain, int | None]]:
        """The template of (vs, op) on GPU g as chains: one, or one per layer (with the layer) for WFBP."""
        key = (vs, d, op, g, per_layer)
        out = self.chains.get(key)
        if out is None:
            ops = self.template(vs, d)[op]
            parts: list[list[StageOp]] = []
            for o in ops:
                if not parts or (per_layer and parts[-1][-1].layer != o.layer):
                    parts.append([])
                parts[-1].append(o)
            out = []
            for i, part in enumerate(parts):
                slots = [self.comm_slots(S_TP, o.comm.scope, (g,))[0] if o.kind == K_TP and o.comm is not None
                         else (g, S_COMPUTE) for o in part]  # fmt: skip
                out.append((Chain.of(part, slots, self.speed[g], i == 0), part[-1].layer if per_layer else None))
            self.chains[key] = out
        return out

    def send(self, r: int, a: Action, d: int, gpus: list[int], last: list[int]) -> None:
        """After an action: send its activation forward or its input gradient backward."""
        if a.op == "F" and a.stage < self.num_stages - 1:
            dst_vs, what = a.stage + 1, "act"
        elif a.op == "B" and a.stage > 0:
            dst_vs, what = a.stage - 1, "grad"
        else:
            return
        flow = self.flow
        boundary = min(a.stage, dst_vs)
        cut = flow.stage_ranges[boundary][1] - 1
        nbytes = round(flow.model.boundary_bytes[cut] * flow.strategy.micro_batch_size)
        dst_r = dst_vs % self.pp
        pairs = self.pairs.get((r, dst_r))
        if pairs is None:
            pairs = self.pairs[(r, dst_r)] = self.placement.p2p_pairs(r, dst_r)
        for j, t in enumerate(self.lanes_t):
            tid = self.p2p(pairs[d * self.tp + t], nbytes, what, a.stage, dst_vs, a.microbatch, last[j])
            self.incoming[(dst_vs, a.op, a.microbatch, d, t)] = tid

    # ------------------------------------------------------------------------------------------ data parallel
    def grad_allreduce(self, r: int, vs_or_rank: int, per_t: dict[int, list[int]], layer: int = -1) -> list[int]:
        """One all-reduce per tp rank over the replicas; returns the task ids."""
        model = self.flow.model
        if layer >= 0:
            held = self.rank_layers[r]
            shard = model.layers[layer].shard_params(self.tp) if model.owns_params(layer, held) else 0.0
            name, stage = f"grads {model.layers[layer].name}", vs_or_rank
        else:
            shard = self.rank_shard_params(r)
            name, stage = f"grads rank {r}", vs_or_rank
        nbytes = round(shard * model.precision.grad_bytes)
        if nbytes <= 0:
            return []
        instances = self.placement.dp_groups(r)
        overlap = layer >= 0 and layer != min(self.rank_layers[r])  # backward still runs while it is in flight
        return [self.allreduce(instances[t], nbytes, name, layer, stage, per_t[t], overlap) for t in self.lanes_t]

    def rank_shard_params(self, r: int) -> float:
        return self.flow.model.rank_params(sorted(self.rank_layers[r]), self.tp)

    def finish(self) -> None:
        """Gradient synchronisation that ends the iteration, then the optimizer step on every simulated GPU.

        Order as in Megatron-LM's ``finalize_model_grads``: the data-parallel all-reduce (bulk mode; WFBP issued its
        all-reduces during backward), then the all-reduce of tied embedding copies between the first and last
        pipeline ranks, then the optimizer step.
        """
        flow, s = self.flow, self.flow.strategy
        last = flow._last
        if self.dp > 1 and s.grad_sync == "bulk":
            for r in range(self.pp):
                per_t = {t: [last[(int(self.grid[r, d, t]), S_COMPUTE)] for d in self.lanes_d] for t in self.lanes_t}
                self.grad_allreduce(r, r, per_t)
        self.tied_allreduce()
        for r in range(self.pp):
            gpus = [int(self.grid[r, d, t]) for d in self.lanes_d for t in self.lanes_t]
            self.optimizer_step(r, self.rank_shard_params(r), gpus)

    def tied_allreduce(self) -> None:
        """Sum the gradients of a tied layer's copy with its original's when they sit on different pipeline ranks.

        Megatron-LM keeps a copy of a tied word embedding on the last stage and all-reduces the two copies'
        gradients over the "embedding group" of the first and last stage (``_allreduce_embedding_grads``).
        """
        flow, model = self.flow, self.flow.model
        rank_of = {i: r for r in range(self.pp) for i in self.rank_layers[r]}
        for i, layer in enumerate(model.layers):
            if layer.tied_to is None:
                continue
            ra, rb = rank_of[model.index[layer.tied_to]], rank_of[i]
            if ra == rb:
                continue
            nbytes = round(layer.shard_params(self.tp) * model.precision.grad_bytes)
            if nbytes <= 0:
                continue
            pairs = self.pairs.get((ra, rb))
            if pairs is None:
                pairs = self.pairs[(ra, rb)] = self.placement.p2p_pairs(ra, rb)
            for d in self.lanes_d:
                for t in self.lanes_t:
                    inst = pairs[d * self.tp + t]
                    deps = [self.last_dp[g] if g in self.last_dp else flow._last[(g, S_COMPUTE)] for g in inst.gpus]
                    self.allreduce(inst, nbytes, f"tied grads {layer.name}~{layer.tied_to}", i, rb, deps, False)

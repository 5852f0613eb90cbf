"""Placing communication in an event flow: streams and link queues, p2p transfers, data-parallel collectives
(gradient all-reduces or reduce-scatters, ZeRO's parameter all-gathers) with their overlap shadows, and the optimizer
step after them. Both flow builders (:mod:`distsim.sim.flow.uniform` and :mod:`distsim.plans.stages_flow`) emit
through it. With fair link sharing every transfer and collective that crosses nodes is costed alone and recorded as a
network task (:meth:`CommWriter.network_task`), whose NIC shares the engine decides (:mod:`distsim.sim.network`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from distsim.core.cluster import Cluster
from distsim.core.collectives import collective_s, ring_steps, tree_steps
from distsim.core.models.graph import Model
from distsim.core.placement import CommInstance
from distsim.core.strategy import Strategy
from distsim.core.sync import SHARDINGS, Bucket, GradUnit, Lowered, SyncContext, SyncSettings, tensor_bytes
from distsim.sim.costs import AnalyticCosts, CommEvent, ComputeEvent, CostSource, optimizer_key
from distsim.sim.flow.chain import StageOp
from distsim.sim.flow.events import (
    K_DP,
    K_LAUNCH,
    K_OPT,
    K_P2P,
    K_SHADOW,
    S_COMPUTE,
    S_DP,
    S_GATHER,
    S_HOST,
    S_LINK_INTER,
    S_LINK_INTRA,
    S_P2P,
    EventFlow,
    FlowOptions,
)
from distsim.sim.network import NetUse


class P2PPlan(NamedTuple):
    """A transfer as :meth:`CommWriter.emit_p2p` emits it for any micro-batch: its instance (sender first), duration,
    slots, event key and name; the shadow it casts on the sender's compute stream (measured interference) and that
    stream's slots (None: no shadow); its event and its cost alone (fair sharing's network task)."""

    inst: CommInstance
    dur: float
    slots: tuple[tuple[int, int], ...]
    key: int
    name: str
    shadow: float
    shadow_slots: tuple[tuple[int, int]] | None
    ev: CommEvent
    alone_s: float


class CommWriter:
    """What every flow builder needs to place communication: streams, link queues and measured interference."""

    def __init__(self, flow: EventFlow, costs: CostSource, options: FlowOptions):
        self.flow, self.costs, self.options = flow, costs, options
        self.serialize = options.link_sharing == "serialize"
        self.fair = options.link_sharing == "fair"
        """Inter-node communication costed alone and recorded as network tasks (:meth:`network_task`)."""
        self._net: dict[tuple, NetUse] = {}
        self.host = models_host(options, flow.model, flow.cluster, flow.strategy, costs)
        """Model each simulated GPU's host enqueuing its kernels (see :meth:`launch`)."""
        self.speed = {g: flow.cluster.speed_factor(g) for g in flow.represents}
        self._bucket_names: dict[int, dict[Bucket, str]] = {}  # id(Lowered) -> names
        self.last_dp: dict[int, int] = {}  # gpu -> its last gradient all-reduce (or reduce-scatter) task
        self.sharding = SHARDINGS[flow.strategy.optimizer_sharding]
        self._p2p: dict[tuple[int, str, int], tuple[int, float, float]] = {}  # (bytes, scope, sharers) -> key, times
        self._slots: dict[tuple[int, int], tuple[tuple[int, int]]] = {}  # (gpu, stream) -> the one-slot tuple
        self._groups: dict[tuple[int, tuple[int, ...]], tuple[tuple[int, int], ...]] = {}  # (stream, gpus) -> slots

    def slot(self, g: int, stream: int) -> tuple[tuple[int, int]]:
        """The slots of a task on one stream of GPU g: one tuple per (gpu, stream), shared by every such task (a
        large flow holds hundreds of thousands of them)."""
        key = (g, stream)
        out = self._slots.get(key)
        if out is None:
            out = self._slots[key] = (key,)
        return out

    def comm_slots(self, stream: int, scope: str, gpus: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
        """Where a communication task runs: its kind's stream, or with serialize the link queue of its scope."""
        if self.serialize:
            stream = S_LINK_INTRA if scope == "intra" else S_LINK_INTER
        if len(gpus) == 1:
            return self.slot(gpus[0], stream)
        key = (stream, gpus)
        out = self._groups.get(key)
        if out is None:  # one tuple per group and stream, shared by all its tasks (as :meth:`slot`)
            out = self._groups[key] = tuple(self.slot(g, stream)[0] for g in gpus)
        return out

    def sharers(self, inst: CommInstance) -> int:
        """The NIC sharers its cost assumes: the structural count, or 1 with fair sharing (the engine shares)."""
        return 1 if self.fair else inst.sharers

    def network_task(self, tid: int, inst: CommInstance, ev: CommEvent, alone_s: float) -> None:
        """Fair link sharing: record task `tid` (instance `inst` of event `ev`, costing `alone_s` alone; its
        duration may be longer by measured interference) as a network task if it crosses nodes: the NICs it sends
        and receives through (in a symmetric flow those of every instance of its pattern, which it stands for), its
        latency part (stretched with its duration), its bytes on the wire and the rates one copy can get."""
        if not self.fair or inst.scope != "inter":
            return
        flow = self.flow
        cluster = flow.cluster
        transfer = ev.collective == "p2p"
        dur = flow.duration_s[tid]
        gpn = cluster.gpus_per_node
        pattern = inst.pattern if flow.symmetric else None
        if pattern is not None:
            usage = pattern.usage(transfer)
        elif transfer:
            usage = tuple(sorted(((2 * (inst.gpus[0] // gpn), 1), (2 * (inst.gpus[-1] // gpn) + 1, 1))))
        else:
            usage = tuple(sorted((2 * n + d, 1) for n in inst.nodes(gpn) for d in (0, 1)))
        known = (usage, ev, alone_s, dur)
        use = self._net.get(known)
        if use is None:
            nic = cluster.inter.bandwidth_bytes_per_s
            rate = cluster.inter_flow_bandwidth(1) if transfer else cluster.inter_collective_bandwidth(1)
            cap = nic if transfer else max(nic, cluster.intra.bandwidth_bytes_per_s)
            latency = latency_part(self.costs, cluster, ev, alone_s)
            if alone_s > 0:
                latency = min(dur, latency * dur / alone_s)
            use = self._net[known] = NetUse(usage, latency, (dur - latency) * rate, rate, cap)
        flow.network[tid] = use

    def overlapped(self, dur: float, scope: str, compute_s: float = math.inf) -> tuple[float, float]:
        """(duration, shadow) of a transfer that overlaps compute, from the interference of its scope (compute
        slowed by c, the transfer by k): compute loses c / (1 + c) of the transfer's time, but no more than the
        compute that runs beside it (`compute_s`, where known) takes longer: c x compute_s."""
        c, k = self.costs.interference(scope)
        longer = dur * (1 + k)
        return longer, min(longer * c / (1 + c), compute_s * c)

    def shadow(self, seconds: float, gpus: tuple[int, ...], deps: list[int], stage: int, mb: int, key: int) -> None:
        if seconds <= 0:
            return
        for g in gpus:
            if g in self.speed:
                self.flow.add(seconds, self.slot(g, S_COMPUTE), K_SHADOW, "overlapped communication", -1, stage, mb,
                              key, list(deps))  # fmt: skip

    def p2p(self, inst: CommInstance, nbytes: int, what: str, src_vs: int, dst_vs: int, mb: int, dep: int,
            name: str | None = None) -> int:  # fmt: skip
        """One activation or gradient transfer between two GPUs after the sender's task `dep` (named `name`, by
        default "`what` `src_vs`->`dst_vs`"); returns its task."""
        return self.emit_p2p(self.p2p_plan(inst, nbytes, name or f"{what} {src_vs}->{dst_vs}"), src_vs, mb, dep)

    def p2p_plan(self, inst: CommInstance, nbytes: int, name: str) -> P2PPlan:
        """How a transfer of `nbytes` over `inst` is emitted, the same for every micro-batch (:meth:`emit_p2p`)."""
        sharers = self.sharers(inst)
        known = (nbytes, inst.scope, sharers)
        priced = self._p2p.get(known)
        if priced is None:
            ev = CommEvent("p2p", nbytes, 2, inst.scope, sharers)
            cost = self.costs.comm(ev)
            dur, shadow = cost.seconds, 0.0
            if not self.options.p2p_blocking:
                dur, shadow = self.overlapped(cost.seconds, inst.scope)
            priced = self._p2p[known] = (self.flow.intern(ev.key, cost, "p2p"), dur, shadow, ev, cost.seconds)
        key, dur, shadow, ev, alone_s = priced
        src = inst.gpus[0]
        # with serialize the transfer holds the link at both ends
        slots = self.comm_slots(S_P2P, inst.scope, inst.gpus) if self.serialize else self.slot(src, S_P2P)
        if self.options.p2p_blocking:  # the sender's compute stream is busy too (DistSim Algorithm 1)
            slots = ((src, S_COMPUTE), *(x for x in slots if x[1] != S_P2P))
        shadow_slots = self.slot(src, S_COMPUTE) if shadow > 0 and src in self.speed else None
        return P2PPlan(inst, dur, slots, key, name, shadow, shadow_slots, ev, alone_s)

    def emit_p2p(self, plan: P2PPlan, src_vs: int, mb: int, dep: int) -> int:
        """The transfer `plan` describes, of micro-batch `mb` after the sender's task `dep`, and its shadow on the
        sender's compute stream; returns its task."""
        flow = self.flow
        tid = flow.add(plan.dur, plan.slots, K_P2P, plan.name, -1, src_vs, mb, plan.key, [dep])
        flow.members[tid] = plan.inst.gpus
        if self.fair:
            self.network_task(tid, plan.inst, plan.ev, plan.alone_s)
        if plan.shadow_slots is not None:
            flow.add(plan.shadow, plan.shadow_slots, K_SHADOW, "overlapped communication", -1, src_vs, mb, plan.key,
                     [dep])  # fmt: skip
        return tid

    def allreduce(
        self, inst: CommInstance, nbytes: int, name: str, layer: int, stage: int, deps: list[int], overlap: bool
    ) -> int:
        """A gradient all-reduce over `inst.gpus` after `deps`; `overlap`: backward still runs while it is in flight."""
        return self.dp_collective("all_reduce", inst, nbytes, name, layer, stage, deps, overlap)

    def dp_collective(self, collective: str, inst: CommInstance, nbytes: int, name: str, layer: int, stage: int,
                      deps: list[int], overlap: bool, mb: int = -1, gradients: bool = True,
                      compute_s: float = math.inf) -> int:  # fmt: skip
        """A collective over a data-parallel group `inst.gpus` after `deps`; `overlap`: compute still runs while it
        is in flight (`compute_s` of it, where known: what interference can slow). Gradients go on the ``dp``
        stream (the optimizer step waits for the last of them), parameter all-gathers on the ``gather`` stream (FSDP
        runs them beside the reduce-scatters)."""
        flow = self.flow
        ev = CommEvent(collective, nbytes, len(inst.gpus), inst.scope, self.sharers(inst))
        cost = self.costs.comm(ev)
        key = flow.intern(ev.key, cost, "dp_" + collective.replace("_", ""))
        members = tuple(g for g in inst.gpus if g in self.speed)
        dur, shadow = cost.seconds, 0.0
        if overlap:
            dur, shadow = self.overlapped(cost.seconds, inst.scope, compute_s)
        slots = self.comm_slots(S_DP if gradients else S_GATHER, inst.scope, members)
        tid = flow.add(dur, slots, K_DP, name, layer, stage, mb, key, list(deps))
        flow.members[tid] = inst.gpus
        if self.fair:
            self.network_task(tid, inst, ev, cost.seconds)
        self.shadow(shadow, members, list(deps), stage, mb, key)
        if gradients:
            self.last_dp.update(dict.fromkeys(members, tid))
        return tid

    def param_bytes(self, grad_bytes: int) -> int:
        """Bytes of the parameters whose gradients take `grad_bytes` (what a ZeRO all-gather moves)."""
        precision = self.flow.model.precision
        return round(grad_bytes * precision.param_bytes / precision.grad_bytes)

    def gather_after_step(self, lowered: Lowered, rank: int, instances: Sequence[CommInstance],
                          steps: dict[int, int], stage: int) -> None:  # fmt: skip
        """ZeRO-1/2: each bucket's parameters all-gathered over the data-parallel group once every member's optimizer
        step (`steps`: gpu -> task) updated its 1/d, one all-gather per bucket and instance (tp rank)."""
        for bucket in lowered.gathers:
            name = gather_name(self.bucket_name(lowered, bucket, rank))
            layer = -1 if bucket.ready is None else bucket.ready
            for inst in instances:
                deps = [steps[g] for g in inst.gpus if g in steps]
                self.dp_collective("all_gather", inst, self.param_bytes(bucket.nbytes), name, layer, stage, deps,
                                   False, gradients=False)  # fmt: skip

    def layer_param_bytes(self, held: set[int], tp: int) -> dict[int, int]:
        """Bytes of each held layer's parameters (one tp shard) that ZeRO-3 all-gathers before using them."""
        model = self.flow.model
        return {i: round(model.stored_params(i, held, tp) * model.precision.param_bytes) for i in held}

    def sync_context(
        self, held: set[int], tp: int, inst: CommInstance, backward_s: dict[int, float], chunk: dict[int, int]
    ) -> SyncContext:
        """A data-parallel rank holding layers `held` (tp shard `tp`, layer -> model chunk in `chunk`), whose
        gradients are all-reduced over `inst`, as :mod:`distsim.core.sync` sees it."""
        model, strategy = self.flow.model, self.flow.strategy
        grad_bytes = model.precision.grad_bytes
        units = tuple(
            GradUnit(
                i, tensor_bytes(model.stored_tensors(i, held, tp), grad_bytes), backward_s.get(i, 0.0), chunk.get(i, 0)
            )
            for i in sorted(held, reverse=True)
        )
        n, scope, sharers = len(inst.gpus), inst.scope, inst.sharers
        collective = self.sharding.gradients  # what the buckets will go through: planners weigh its cost

        def allreduce_s(nbytes: int) -> float:
            return self.costs.comm(CommEvent(collective, nbytes, n, scope, sharers)).seconds

        db = getattr(self.costs, "db", None)  # a profile's alpha-beta fit of this collective, where it has one
        found = db.fit(collective, scope, n) if db is not None else None
        fit = (found.alpha_s, found.beta_s_per_byte) if found is not None else None
        settings = SyncSettings.of(strategy.bucket_cap_mb, strategy.grad_groups)
        return SyncContext(units, allreduce_s, fit, settings)

    def bucket_name(self, lowered: Lowered, bucket: Bucket, rank: int) -> str:
        """The all-reduce's event name (:func:`bucket_names`)."""
        names = self._bucket_names.get(id(lowered))
        if names is None:
            names = self._bucket_names[id(lowered)] = bucket_names(self.flow.model, lowered.buckets, rank)
        return names[bucket]

    def optimizer_step(self, stage: int, shard_params: float, gpus: list[int]) -> dict[int, int]:
        """The optimizer step of `shard_params` parameters on each GPU, after its last gradient all-reduce; returns
        gpu -> its step's task. With the host modelled, the host waits for the gradients first (a synchronisation
        point: the step reads them, e.g. for the gradient norm or an overflow check) and then enqueues the step's
        kernels."""
        out: dict[int, int] = {}
        if shard_params <= 0:
            return out
        flow = self.flow
        state = flow.model.precision.state_bytes_per_param
        cost = self.costs.optimizer(shard_params, state)
        key = flow.intern(optimizer_key(shard_params, state), cost, "optimizer")
        for g in gpus:
            deps = [self.last_dp[g]] if g in self.last_dp else []
            host = None
            if self.host:
                waits = list(deps)
                if not waits and (g, S_COMPUTE) in flow._last:  # no gradient all-reduce: the last backward
                    waits = [flow._last[(g, S_COMPUTE)]]
                launch = cost.launch_s or flow.cluster.gpu.kernel_launch_s
                host = self.launch(g, launch, waits, stage, -1, "launch optimizer step")
            tid = flow.add(cost.seconds * self.speed[g], self.slot(g, S_COMPUTE), K_OPT, "optimizer step", -1, stage,
                           -1, key, deps)  # fmt: skip
            if host is not None:
                flow.release(host, tid, flow.duration_s[host])
            out[g] = tid
        return out

    def launch(self, g: int, seconds: float, waits: list[int], stage: int, mb: int, name: str) -> int:
        """The host of GPU g enqueuing `seconds` worth of kernel launches, in program order after its previous
        launches and after the tasks it `waits` for (a receive whose data it needs, the gradients before the
        optimizer step). Kernels released by it start no earlier than their launch ends (:meth:`EventFlow.release`).
        """
        return self.flow.add(seconds, self.slot(g, S_HOST), K_LAUNCH, name, -1, stage, mb, -1, waits)


def compute_after(ctx: SyncContext) -> dict[int, float]:
    """Backward compute a data-parallel rank still runs, in its last micro-batch, after each layer's backward: what
    an all-reduce issued there can overlap (and interference slow). From the units' backward times, in backward
    order."""
    out: dict[int, float] = {}
    left = sum(u.backward_s for u in ctx.units)
    for u in ctx.units:
        left -= u.backward_s
        out[u.layer] = max(0.0, left)
    return out


def prefetch_gates(ops: Sequence[StageOp]) -> dict[int, int]:
    """ZeRO-3's parameter all-gathers in one action's template, with FSDP's prefetch: the index of the op that
    starts each layer -> the index of the op whose end that layer's all-gather waits for (-1: the action's inputs).

    FSDP issues the next layer's all-gather when the current layer starts computing (forward prefetch, and
    ``BackwardPrefetch.BACKWARD_PRE``; its rate limiter keeps at most two all-gathers ahead), so it overlaps the
    current layer's compute. The current layer starts once the layer before it is done; so the all-gather of an
    action's k-th layer waits for the end of the (k-2)-th, the first two for what the action waits for. The
    all-gathers run in order on their stream, and each layer's first op waits for its own."""
    starts = [i for i in range(len(ops)) if i == 0 or ops[i].layer != ops[i - 1].layer]
    return {s: (starts[k - 1] - 1 if k >= 2 else -1) for k, s in enumerate(starts)}


def bucket_names(model: Model, buckets: Sequence[Bucket], rank: int) -> dict[Bucket, str]:
    """A rank's gradient buckets' all-reduces as the simulator and the executor name them: ``grads rank R`` (after
    backward, R the pipeline rank), ``grads LAYER`` (one layer's gradients) or ``grads FIRST..LAST`` (the layers it
    carries, in backward order); when DDP splits a layer over buckets, the second and later buckets of the same name
    get ``#2``, ``#3`` (names stay unique, in issue order)."""
    out: dict[Bucket, str] = {}
    seen: dict[str, int] = {}
    layers = model.layers
    for bucket in buckets:
        if bucket.ready is None:
            name = f"grads rank {rank}"
        else:
            first, last = bucket.layers[0], bucket.layers[-1]
            name = (
                f"grads {layers[first].name}" if first == last else f"grads {layers[first].name}..{layers[last].name}"
            )
        seen[name] = seen.get(name, 0) + 1
        out[bucket] = name if seen[name] == 1 else f"{name} #{seen[name]}"
    return out


def gather_name(bucket_name: str) -> str:
    """The name of a ZeRO-1/2 bucket's parameter all-gather, from its gradient bucket's (``grads X`` ->
    ``params X``), as the simulator and the executor name it."""
    return "params" + bucket_name.removeprefix("grads")


def latency_part(costs: CostSource, cluster: Cluster, ev: CommEvent, seconds: float) -> float:
    """The fixed part of a communication event's cost `seconds` (its per-step latencies), which sharing a NIC does
    not stretch: the alpha of a profile's alpha-beta fit of the collective where the cost source has one (as
    :class:`~distsim.sim.costs.ProfileCosts` scales a shared measurement), none for another measured cost; for an
    analytic cost, the steps of the algorithm it runs (ring or tree: :mod:`distsim.core.collectives`) times the
    link's latency. At most `seconds`."""
    analytic = costs if isinstance(costs, AnalyticCosts) else getattr(costs, "fallback", None)
    db = getattr(costs, "db", None)
    if db is not None:
        fit = db.fit(ev.collective, ev.scope, ev.group_size)
        if fit is not None:
            return min(seconds, max(0.0, fit.alpha_s))
        if costs.comm(ev).source != "analytic":
            return 0.0
    if not isinstance(analytic, AnalyticCosts):
        return 0.0
    link = cluster.intra if ev.scope == "intra" else cluster.inter
    if ev.collective == "p2p":
        steps = 1
    else:
        inter = cluster.inter_collective_bandwidth(ev.sharers)
        bandwidth = cluster.intra.bandwidth_bytes_per_s if ev.scope == "intra" else inter
        algorithm = analytic.allreduce if ev.scope == "inter" else "ring"
        _, run = collective_s(ev.collective, ev.group_size, ev.nbytes, link.latency_s, bandwidth, algorithm)
        steps = ring_steps(ev.collective, ev.group_size) if run == "ring" else tree_steps(ev.group_size)
    return min(seconds, steps * link.latency_s)


def models_host(options: FlowOptions, model: Model, cluster: Cluster, strategy: Strategy, costs: CostSource) -> bool:
    """Whether the flow models the hosts (``options.host``; by default when kernels cost host time to launch: the
    cluster's GPU has a launch cost, or the cost source gives one, as a profile that measured it, for the model's
    first block)."""
    if options.host is not None:
        return options.host
    if cluster.gpu.kernel_launch_s > 0:
        return True
    layer = next((layer for layer in model.layers if layer.blocks), None)
    if layer is None:
        return False
    event = ComputeEvent(layer.blocks[0], "F", strategy.micro_batch_size, strategy.tp, model.precision.name)
    return costs.compute(event).launch_s > 0

"""Event flow of a burst plan (DeepPool, Park et al.): every layer data-parallel over its own GPUs.

A burst plan (:mod:`distsim.plans.burst`) trains one batch of B samples per iteration; layer i runs on its own
GPUs,
each holding a contiguous slice of the batch (:func:`distsim.plans.redistribution.shards`). One iteration:

* **forward** over the layers in the model's (topological) order: on each of a layer's GPUs its forward at that
  GPU's shard size (uneven shards cost differently). Where a layer's input comes from a layer on another layout, the
  activations are re-distributed: one task on the moving GPUs' ``p2p`` streams, priced by
  :func:`distsim.plans.redistribution.redistribution_cost` (the busiest GPU's max of sent and received bytes,
  DeepPool's model),
  after the producer's forward on every GPU that sends; a consumer GPU that receives samples waits for it, one whose
  samples all stay local waits only for its own producer. One transfer per producer and consumer layout (a tensor
  two consumers on one layout need is sent once).
* **backward** in reverse order: a layer's backward on each GPU waits for the gradient of its output from each
  consumer, re-distributed back from the consumer's layout (the same bytes, one transfer per edge: the
  contributions are summed on arrival); the last layer's backward follows its forward (the loss).
* **gradient synchronisation**: each layer's gradients all-reduced over its own GPUs on the ``dp`` stream, ``bulk``
  after the whole backward of its GPUs (in backward order; DeepPool's planner assumes no overlap), or ``wfbp`` right
  after that layer's backward, overlapped with the rest of it. A layer tied to another (an LM head sharing the
  embedding) stores the shared weights once when both run on the same GPUs; otherwise each keeps its copy and the
  copies are all-reduced over both layers' GPUs after the layers' own all-reduces.
* the **optimizer step** on each GPU for the parameters of every layer it runs.

Branches of a DAG whose layers sit on disjoint GPUs run concurrently by construction; on shared GPUs they take turns
on the compute stream, in model order. A GPU idles while the layers running are not on it: the timeline's per-GPU rows
show it. GPUs that do the same work at the same times (the same layers on as many samples, the same part in every
transfer) form a symmetric class, simulated once (:mod:`distsim.plans.burst_classes`: exact, not an approximation);
the builder emits only the classes' simulated GPUs, puts a transfer or all-reduce on their streams alone, and lets a
task that waits for another GPU's task wait for that task of the GPU's class instead. With the host modelled, each
GPU's host enqueues a layer's kernels once the inputs it receives from other GPUs arrived (as the stages flow does per
action); it does not wait for its own GPU's kernels, so it runs ahead of them.

Not modelled: interference of a re-distribution with compute (DeepPool's planner counts it in full, no overlap);
recomputation and optimizer sharding (the plan refuses them).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from collections.abc import Sequence

from distsim.core.cluster import Cluster
from distsim.core.models.graph import Model
from distsim.core.placement import CommInstance, group_instances
from distsim.core.schedules import build_schedule
from distsim.core.sync import GradUnit, Lowered, SyncContext, lower
from distsim.plans.burst_classes import burst_classes, every_gpu
from distsim.plans.plan import Plan, PlanError
from distsim.plans.redistribution import redistribution, redistribution_cost, scope_of, shards
from distsim.sim.costs import CommEvent, CostSource
from distsim.sim.flow.chain import Chain, StageOp
from distsim.sim.flow.comm import CommWriter, models_host
from distsim.sim.flow.estimate import overlap_shadows
from distsim.sim.flow.events import K_P2P, S_COMPUTE, S_P2P, EventFlow, FlowOptions
from distsim.sim.flow.templates import stage_templates

Layout = tuple[int, ...]


def build_burst_flow(
    model: Model, cluster: Cluster, plan: Plan, costs: CostSource, options: FlowOptions | None = None
) -> EventFlow:
    """The event DAG of one iteration of a burst plan on `cluster`: one simulated GPU per symmetric class
    (:mod:`distsim.plans.burst_classes`) unless `options` asks for every GPU or shares links fairly."""
    if not plan.burst:
        raise PlanError(f"a {plan.kind} plan is not a burst plan (distsim.plans.simulate handles every kind)")
    options = options or FlowOptions()
    plan.check(model.num_layers, cluster.num_gpus)
    represents = simulated_classes(model, cluster, plan, options)
    symmetric = len(represents) < plan.num_gpus
    if options.symmetric is True and not symmetric:
        raise PlanError("symmetric simulation was required, but no two GPUs of this burst plan do the same work (or "
                        "links are shared fairly), so it is always simulated GPU by GPU")  # fmt: skip
    strategy = plan.strategy
    stage_ranges = tuple((i, i + 1) for i in range(model.num_layers))  # a layer's template is its own stage's
    flow = EventFlow(model, cluster, strategy, build_schedule(strategy), None, stage_ranges, symmetric, represents)
    _BurstBuilder(flow, plan, costs, options).run()
    return flow


def simulated_classes(model: Model, cluster: Cluster, plan: Plan, options: FlowOptions) -> dict[int, tuple[int, ...]]:
    """Simulated GPU -> the GPUs it stands for: the plan's symmetric classes, or every GPU alone when `options`
    says every GPU (``symmetric=False``) or links are shared fairly (a network task's NIC load would have to count
    the instances it stands for; see :mod:`distsim.plans.burst_classes`)."""
    if options.symmetric is False or options.link_sharing == "fair":
        return every_gpu(plan)
    return burst_classes(model, cluster, plan)


def estimate_burst_tasks(
    model: Model, cluster: Cluster, plan: Plan, costs: CostSource, options: FlowOptions | None = None
) -> int:
    """How many tasks :func:`build_burst_flow` would emit at most, counted from the plan and the model without
    building anything (a transfer that moves nothing, or an all-reduce of no bytes, is left out of the flow): per
    simulated GPU (one per symmetric class) its compute, launches and optimizer step, per layout change its
    transfer, per layer its all-reduce and the shadows on the simulated GPUs."""
    options = options or FlowOptions()
    plan.check(model.num_layers, cluster.num_gpus)
    host = models_host(options, model, cluster, plan.strategy, costs)
    overlapped = bool(lower_sync(plan.strategy.grad_sync, [1] * model.num_layers).by_layer)
    shadows = overlap_shadows(costs) if overlapped else 0
    layouts = plan.burst
    represents = simulated_classes(model, cluster, plan, options)
    simulated = {d: sum(g in represents for g in d) for d in dict.fromkeys(layouts)}
    total = 0
    for i, devices in enumerate(layouts):
        n = simulated[devices]
        total += 2 * n * len(model.layers[i].blocks) + (2 * n if host else 0)
        if len(devices) > 1:
            total += 1 + n * shadows
    moved = [(u, v) for v, inputs in enumerate(model.input_layers) for u in inputs if layouts[u] != layouts[v]]
    total += len({(u, layouts[v]) for u, v in moved}) + len(moved)  # forward: per consumer layout; backward: per edge
    total += sum(layer.tied_to is not None for layer in model.layers)
    return total + len(represents) * (2 if host else 1)


def lower_sync(grad_sync: str, grad_bytes: Sequence[int]) -> Lowered:
    """A burst plan's gradient synchronisation through the sync registry (:mod:`distsim.core.sync`): one unit per
    layer, in backward order. Each bucket's layers are all-reduced one by one over each layer's own GPUs (their GPU
    sets differ), when the bucket is ready: after that layer's backward (``by_layer``) or after the whole backward
    (``at_end``)."""
    units = tuple(GradUnit(v, (n,)) for v, n in reversed(list(enumerate(grad_bytes))))
    return lower(grad_sync, SyncContext(units, allreduce_s=lambda nbytes: 0.0))


def _holders(slices: list[tuple[int, tuple[int, int]]], starts: list[int], lo: int, hi: int) -> list[int]:
    """The GPUs of a layout (`slices`: (gpu, [lo, hi)) in batch order, `starts` their lo) holding samples of
    [lo, hi)."""
    k = max(bisect_right(starts, lo) - 1, 0)
    out = []
    while k < len(slices) and slices[k][1][0] < hi:
        if slices[k][1][1] > lo:
            out.append(slices[k][0])
        k += 1
    return out


class _BurstBuilder(CommWriter):
    def __init__(self, flow: EventFlow, plan: Plan, costs: CostSource, options: FlowOptions):
        super().__init__(flow, costs, options)
        model = flow.model
        self.plan, self.batch, self.layouts = plan, plan.strategy.micro_batch_size, plan.burst
        self.rep = {g: r for r, members in flow.represents.items() for g in members}
        """GPU -> the simulated GPU of its class, whose tasks stand for its own."""
        per_layout = {d: self._slices(d) for d in dict.fromkeys(self.layouts)}
        self._order, self._starts, self.mine, self.simulated = zip(*(per_layout[d] for d in self.layouts), strict=True)
        self.consumers: list[list[int]] = [[] for _ in model.layers]
        for v, inputs in enumerate(model.input_layers):
            for u in inputs:
                self.consumers[u].append(v)
        self.templates: dict[tuple[int, int], dict[str, list[StageOp]]] = {}
        self.fwd: dict[tuple[int, int], int] = {}  # (layer, gpu) -> its forward's last task
        self.bwd: dict[tuple[int, int], int] = {}
        self.sent: dict[tuple[str, int, Layout], int | None] = {}  # (phase, producer or edge, layout) -> transfer
        self.groups: dict[Layout, CommInstance] = {}
        self.grad_bytes, self.tied = self._gradients()
        self.lowered = lower_sync(plan.strategy.grad_sync, self.grad_bytes)

    # ------------------------------------------------------------------------------------------------- helpers
    def template(self, layer: int, samples: int) -> dict[str, list[StageOp]]:
        tpl = self.templates.get((layer, samples))
        if tpl is None:
            tpl = self.templates[(layer, samples)] = stage_templates(self.flow, self.costs, layer, None, samples)
        return tpl

    def group(self, layout: Layout) -> CommInstance:
        inst = self.groups.get(layout)
        if inst is None:
            inst = self.groups[layout] = group_instances([layout], self.flow.cluster.gpus_per_node)[0]
        return inst

    def _slices(self, layout: Layout) -> tuple[list, list[int], list[tuple[int, tuple[int, int]]], Layout]:
        """A layout's slices in batch order with their starts (what :meth:`holders` looks up), the slices of its
        simulated GPUs (what the builder emits), and those GPUs."""
        full = shards(self.batch, layout)
        order = sorted(full.items(), key=lambda x: x[1][0])
        mine = [(g, lohi) for g, lohi in full.items() if g in self.speed]
        return order, [lo for _, (lo, _hi) in order], mine, tuple(g for g, _ in mine)

    def holders(self, layer: int, lo: int, hi: int) -> list[int]:
        """GPUs of `layer`'s layout that hold samples [lo, hi) of the batch."""
        return _holders(self._order[layer], self._starts[layer], lo, hi)

    def _gradients(self) -> tuple[list[int], list[tuple[int, int]]]:
        """Each layer's gradient bytes (all-reduced over its GPUs), and the tied pairs whose shared weights are kept
        twice (their layouts differ) as (layer, the layer it is tied to)."""
        model = self.flow.model
        grad, tied = [], []
        for i, layer in enumerate(model.layers):
            held = {i}
            if layer.tied_to is not None:
                t = model.index[layer.tied_to]
                if self.layouts[t] == self.layouts[i]:
                    held.add(t)  # both on the same GPUs: the shared weights stored (and synchronised) once
                elif layer.tied_shard_params(1) > 0:
                    tied.append((i, t))
            grad.append(round(model.stored_params(i, held, 1) * model.precision.grad_bytes))
        return grad, tied

    def compute(self, layer: int, phase: str, g: int, samples: int, deps: list[int]) -> int:
        """A layer's forward or backward on GPU g at `samples` samples after `deps`; returns its last task."""
        flow = self.flow
        ops = self.template(layer, samples)[phase]
        chain = Chain.of(ops, [self.slot(g, S_COMPUTE)] * len(ops), self.speed[g])
        host = None
        if self.host:  # the host waits for inputs from other GPUs (not for its own kernels), then enqueues
            name = f"launch {flow.model.layers[layer].name} {phase}"
            remote = [d for d in deps if (g, S_COMPUTE) not in flow.slots[d]]
            host = (self.launch(g, chain.launch_s, remote, layer, -1, name), 0.0)
        return flow.add_chain(chain, list(deps), layer, -1, host, self.options.exact_host)

    def transfer(self, producer: int, src: Layout, dst: Layout, done: dict[tuple[int, int], int], layer: int,
                 name: str) -> int | None:  # fmt: skip
        """Producer's activations (or their gradients) moved from layout `src` to `dst` once every sender's task of
        `layer` (in `done`: the forward or backward tasks) ended; None when nothing moves. It runs on the moving
        GPUs' streams, those of the simulated GPUs among them (a class moves as a whole)."""
        flow = self.flow
        gpn = flow.cluster.gpus_per_node
        per_sample = flow.model.layers[producer].out_bytes
        cost, nbytes = redistribution_cost(self.costs, gpn, self.batch, per_sample, src, dst)
        if cost is None:
            return None
        moved = redistribution(self.batch, src, dst)
        senders = [g for g, n in moved.sent.items() if n]
        movers = sorted(set(senders) | {g for g, n in moved.received.items() if n})
        scope = scope_of(movers, gpn)
        key = flow.intern(CommEvent("p2p", nbytes, 2, scope).key, cost, "p2p")
        simulated = tuple(g for g in movers if g in self.speed)
        slots = self.comm_slots(S_P2P, scope, simulated)
        if self.options.p2p_blocking:  # the moving GPUs' compute streams are busy too
            slots = tuple((g, S_COMPUTE) for g in simulated) + (slots if self.serialize else ())
        rep = self.rep
        deps = list(dict.fromkeys(done[(layer, rep[g])] for g in senders))
        tid = flow.add(cost.seconds, slots, K_P2P, name, producer, producer, -1, key, deps)
        receivers = [g for g, n in moved.received.items() if n]
        # a transfer between two GPUs is (sender, receiver), as EventFlow.members says; a wider move its GPUs in order
        flow.members[tid] = (senders[0], receivers[0]) if len(senders) == len(receivers) == 1 else tuple(movers)
        return tid

    def waits(self, src_layer: int, dst_layer: int, g: int, done: dict[tuple[int, int], int], moved: int | None,
              lo: int, hi: int) -> list[int]:  # fmt: skip
        """What GPU g of `dst_layer` waits for to have samples [lo, hi) from `src_layer` (done: src's tasks)."""
        holders = self.holders(src_layer, lo, hi)
        if moved is not None and any(h != g for h in holders):
            return [moved, *([done[(src_layer, g)]] if g in holders else [])]
        # all local, or nothing moved (no bytes): the data dependency; another GPU's task is that of its class's
        # simulated GPU (it ends at the same time)
        rep = self.rep
        return [done[(src_layer, rep[h])] for h in holders]

    # ---------------------------------------------------------------------------------------------- iteration
    def run(self) -> None:
        model = self.flow.model
        for v in range(model.num_layers):
            self.forward(v)
        for v in reversed(range(model.num_layers)):
            self.backward(v)
        self.finish()

    def forward(self, v: int) -> None:
        layouts, names = self.layouts, self.flow.model.layers
        incoming: list[tuple[int, int | None]] = []
        for u in self.flow.model.input_layers[v]:
            key = ("F", u, layouts[v])
            if key not in self.sent:
                name = f"act {names[u].name} {len(layouts[u])}->{len(layouts[v])} GPUs"
                moves = layouts[u] != layouts[v]
                self.sent[key] = self.transfer(u, layouts[u], layouts[v], self.fwd, u, name) if moves else None
            incoming.append((u, self.sent[key]))
        for g, (lo, hi) in self.mine[v]:
            deps = [t for u, moved in incoming for t in self.waits(u, v, g, self.fwd, moved, lo, hi)]
            self.fwd[(v, g)] = self.compute(v, "F", g, hi - lo, list(dict.fromkeys(deps)))

    def backward(self, v: int) -> None:
        layouts, names = self.layouts, self.flow.model.layers
        incoming: list[tuple[int, int | None]] = []
        for w in self.consumers[v]:  # the gradient of v's output from each consumer, back to v's layout
            name = f"grad {names[v].name} {len(layouts[w])}->{len(layouts[v])} GPUs"
            moved = self.transfer(v, layouts[w], layouts[v], self.bwd, w, name) if layouts[w] != layouts[v] else None
            incoming.append((w, moved))
        for g, (lo, hi) in self.mine[v]:
            deps = [t for w, moved in incoming for t in self.waits(w, v, g, self.bwd, moved, lo, hi)]
            if not incoming:  # the loss: backward follows the forward
                deps = [self.fwd[(v, g)]]
            self.bwd[(v, g)] = self.compute(v, "B", g, hi - lo, list(dict.fromkeys(deps)))
        for bucket in self.lowered.by_layer.get(v, ()):
            for u in bucket.layers:
                self.sync(u, [self.bwd[(u, g)] for g in self.simulated[u]], overlap=v > 0)

    def sync(self, v: int, deps: list[int], overlap: bool) -> None:
        """Layer v's gradients all-reduced over its own GPUs."""
        layout = self.layouts[v]
        if len(layout) > 1 and self.grad_bytes[v] > 0:
            name = f"grads {self.flow.model.layers[v].name}"
            self.allreduce(self.group(layout), self.grad_bytes[v], name, v, v, deps, overlap)

    def finish(self) -> None:
        """Bulk: every layer's all-reduce after its GPUs' backward; tied copies' all-reduce; each GPU's step."""
        flow, model = self.flow, self.flow.model
        last = flow._last
        for bucket in self.lowered.at_end:
            for v in bucket.layers:
                self.sync(v, [last[(g, S_COMPUTE)] for g in self.simulated[v]], overlap=False)
        gpn = flow.cluster.gpus_per_node
        for i, t in self.tied:
            union = tuple(dict.fromkeys(self.layouts[t] + self.layouts[i]))
            simulated = [g for g in union if g in self.speed]
            nbytes = round(model.layers[i].tied_shard_params(1) * model.precision.grad_bytes)
            deps = [self.last_dp[g] if g in self.last_dp else last[(g, S_COMPUTE)] for g in simulated]
            name = f"tied grads {model.layers[i].name}~{model.layers[i].tied_to}"
            self.allreduce(group_instances([union], gpn)[0], nbytes, name, i, i, deps, False)
        held: dict[int, list[int]] = defaultdict(list)
        for i, layout in enumerate(self.simulated):
            for g in layout:
                held[g].append(i)
        by_params: dict[float, list[int]] = defaultdict(list)
        for g in sorted(held):
            by_params[model.rank_params(held[g], 1)].append(g)
        for params, gpus in by_params.items():
            self.optimizer_step(-1, params, gpus)

"""Event flow of a stages plan: pipeline stages with their own layer ranges and their own replica sets.

DAPPLE (Fan et al. 2021) replicates a pipeline stage on r devices and splits every micro-batch among them
(split-concat, Sec. V-B): replica i of a stage processes a contiguous slice of the micro-batch's samples. Between a
stage of width r and the next of width r', each sender ships to each receiver the samples their slices share, so
r = r' is a one-to-one transfer, 1 -> r a split, r -> 1 a concat and r -> r' both. Each stage all-reduces its
gradients over its own replicas (Sec. V-B, Fig. 10), a tied layer's copies are all-reduced between the stages that
hold them, and every replica then takes its optimizer step.

The schedule is the uniform one (GPipe or DAPPLE's early backward over S stages); every replica of a stage runs it
in lock step on its own slice. The flow is emitted with the uniform builder's conventions (unit-time order, ops
outer and replicas inner, the same communication helpers), so a plan with equal widths placed as Megatron-LM would
place the uniform strategy produces the same iteration as :func:`distsim.sim.flow.uniform.build_flow`. Every GPU is
simulated (replicas of different widths are not symmetric).

Activation recomputation rewrites the stages' templates as in the uniform flow; a sharded optimizer (ZeRO) shards
each stage's state over the stage's own replicas: its buckets are reduce-scattered over them, its step updates 1/r of
the stage's parameters, and its parameters are all-gathered over them (after the step, or before each layer's
forward and backward with ZeRO-3).
"""

from __future__ import annotations

from distsim.core.cluster import Cluster
from distsim.core.models.graph import Model
from distsim.core.placement import CommInstance, group_instances, pair_instances
from distsim.core.schedules import Action, build_schedule
from distsim.core.sync import SHARDINGS, Bucket, Lowered, lower
from distsim.plans.plan import Plan, PlanError
from distsim.sim.costs import CostSource
from distsim.sim.flow.chain import StageOp
from distsim.sim.flow.comm import CommWriter, compute_after, models_host, prefetch_gates
from distsim.sim.flow.estimate import bucket_bound, overlap_shadows
from distsim.sim.flow.events import K_TP, S_COMPUTE, EventFlow, FlowOptions
from distsim.sim.flow.recompute import MODES as RECOMPUTE
from distsim.sim.flow.recompute import recomputed_layers
from distsim.sim.flow.templates import cut_before, launch_offsets, stage_templates


def build_plan_flow(
    model: Model, cluster: Cluster, plan: Plan, costs: CostSource, options: FlowOptions | None = None
) -> EventFlow:
    """The full event DAG of one iteration of a stages plan on `cluster`."""
    if not plan.stages:
        raise PlanError(f"a {plan.kind} plan is not a stages plan (distsim.plans.simulate handles every kind)")
    options = options or FlowOptions()
    if options.symmetric is True:
        raise PlanError("a stages plan is always simulated GPU by GPU; symmetric simulation cannot be required")
    plan.check(model.num_layers, cluster.num_gpus)
    strategy = plan.strategy
    schedule = build_schedule(strategy)
    stage_ranges = tuple(s.layers for s in plan.stages)
    represents = {g: (g,) for s in plan.stages for g in s.devices}
    flow = EventFlow(model, cluster, strategy, schedule, None, stage_ranges, False, represents)
    _PlanBuilder(flow, plan, costs, options).run()
    return flow


def estimate_plan_tasks(
    model: Model, cluster: Cluster, plan: Plan, costs: CostSource, options: FlowOptions | None = None
) -> int:
    """How many tasks :func:`build_plan_flow` would emit, counted from the plan and the model without building
    anything: exact, or slightly above when some all-reduce moves no bytes."""
    options = options or FlowOptions()
    plan.check(model.num_layers, cluster.num_gpus)
    shadows = overlap_shadows(costs)
    send_tasks = 1 + (0 if options.p2p_blocking else shadows)
    strategy = plan.strategy
    sharding = SHARDINGS[strategy.optimizer_sharding]
    mode = RECOMPUTE[strategy.recompute]
    total, m = 0, strategy.num_micro_batches
    for s, stage in enumerate(plan.stages):
        start, end = stage.layers
        r = stage.replicas
        blocks = sum(len(model.layers[i].blocks) for i in range(start, end))
        recomputed = sum(mode.extra_tasks(model.layers[i], lambda b, ph: 0)[0]  # no tensor parallelism in plans
                         for i in recomputed_layers(model, strategy, stage.layers))  # fmt: skip
        total += m * 2 * r * blocks + r  # forward and backward on every replica, optimizer step
        total += m * r * recomputed  # recomputed forwards in every backward
        if r > 1:
            held = set(range(start, end))
            during, after, overlapped = bucket_bound(model, strategy, held)
            total += during + overlapped * r * shadows + after
            if sharding.gather_after_step:
                total += during + after
            if sharding.gather_per_layer:  # overlapped: shadows where the group's scope measured interference
                gathered = sum(round(model.stored_params(i, held, 1) * model.precision.param_bytes) > 0 for i in held)
                scope = group_instances([stage.devices], cluster.gpus_per_node)[0].scope
                total += m * 2 * gathered * (1 + r * int(costs.interference(scope)[0] > 0))
        if s + 1 < len(plan.stages):
            total += m * 2 * _transfers(plan, s, s + 1) * send_tasks
    widest = max(stage.replicas for stage in plan.stages)
    if models_host(options, model, cluster, plan.strategy, costs):
        total += sum(m * 2 * stage.replicas + stage.replicas for stage in plan.stages)
    return total + sum(layer.tied_to is not None for layer in model.layers) * widest


def _transfers(plan: Plan, a: int, b: int) -> int:
    """Sender-receiver pairs whose sample slices of a micro-batch overlap (split-concat between stages a and b)."""
    cuts = {hi for _, hi in plan.replica_samples(a)[:-1]} | {hi for _, hi in plan.replica_samples(b)[:-1]}
    return len(cuts) + 1


class _PlanBuilder(CommWriter):
    def __init__(self, flow: EventFlow, plan: Plan, costs: CostSource, options: FlowOptions):
        super().__init__(flow, costs, options)
        self.plan = plan
        self.num_stages = len(plan.stages)
        self.devices = [list(s.devices) for s in plan.stages]
        self.slices = [plan.replica_samples(s) for s in range(self.num_stages)]
        self.held = [set(range(*s.layers)) for s in plan.stages]
        self.templates: dict[tuple[int, int], dict[str, list[StageOp]]] = {}
        self.incoming: dict[tuple[int, str, int, int], list[int]] = {}  # (stage, op, mb, replica) -> transfers
        self.loss: dict[tuple[int, int], int] = {}  # (mb, replica) -> the last stage's forward end
        self.links: dict[tuple[int, int], list[tuple[int, int, int, CommInstance]]] = {}
        self.last_b: dict[int, int] = {}
        for acts in flow.schedule.ranks:
            for a in acts:
                if a.op == "B":
                    self.last_b[a.stage] = a.microbatch
        gpn = flow.cluster.gpus_per_node
        self.dp_group = [group_instances([tuple(d)], gpn)[0] for d in self.devices]
        self.after: dict[int, dict[int, float]] = {}  # per stage: backward compute after each layer's (last mb)
        self.sync = [self._lower_sync(s) if len(self.devices[s]) > 1 else None for s in range(self.num_stages)]
        # ZeRO-3: each replicated stage's layers' parameter bytes, all-gathered before every forward and backward
        self.gathered = [self.layer_param_bytes(self.held[s], 1) if len(self.devices[s]) > 1
                         and self.sharding.gather_per_layer else {} for s in range(self.num_stages)]  # fmt: skip

    def _lower_sync(self, s: int) -> Lowered:
        """Stage s's gradient buckets over its replicas."""
        lo, hi = self.slices[s][0]
        backward: dict[int, float] = {}
        for op in self.template(s, hi - lo)["B"]:
            backward[op.layer] = backward.get(op.layer, 0.0) + op.dur
        ctx = self.sync_context(self.held[s], 1, self.dp_group[s], backward, {})
        self.after[s] = compute_after(ctx)
        strategy = self.flow.strategy
        return lower(strategy.grad_sync, ctx, strategy.optimizer_sharding)

    def template(self, stage: int, samples: int) -> dict[str, list[StageOp]]:
        tpl = self.templates.get((stage, samples))
        if tpl is None:
            tpl = self.templates[(stage, samples)] = stage_templates(self.flow, self.costs, stage, None, samples)
        return tpl

    def link(self, src: int, dst: int) -> list[tuple[int, int, int, CommInstance]]:
        """(sender replica, receiver replica, shared samples, instance) of every transfer from stage src to dst."""
        out = self.links.get((src, dst))
        if out is None:
            pairs = []
            for i, (lo, hi) in enumerate(self.slices[src]):
                for j, (lo2, hi2) in enumerate(self.slices[dst]):
                    shared = min(hi, hi2) - max(lo, lo2)
                    if shared > 0:
                        pairs.append((i, j, shared))
            gpus = [(self.devices[src][i], self.devices[dst][j]) for i, j, _ in pairs]
            instances = pair_instances(gpus, self.flow.cluster.gpus_per_node)
            out = self.links[(src, dst)] = [(i, j, n, inst) for (i, j, n), inst in zip(pairs, instances, strict=True)]
        return out

    def run(self) -> None:
        for _, a in self.flow.schedule.in_unit_time:
            self.action(a)
        self.finish()

    def action(self, a: Action) -> None:
        """One schedule action on every replica of its stage, ops outer and replicas inner (as the uniform one)."""
        flow, s, mb = self.flow, a.stage, a.microbatch
        gpus = self.devices[s]
        lowered = self.sync[s]
        cuts = lowered.cuts if lowered is not None and a.op == "B" and self.last_b[s] == mb else frozenset()
        lanes = []
        for i in range(len(gpus)):
            lo, hi = self.slices[s][i]
            has_input = (a.op == "F" and s > 0) or (a.op == "B" and s < self.num_stages - 1)
            frontier = self.incoming.pop((s, a.op, mb, i)) if has_input else []
            lanes.append((self.template(s, hi - lo)[a.op], frontier))
        last = [-1] * len(gpus)
        final = a.op == "B" and s == self.num_stages - 1  # the last stage's backward follows its forward's end
        loss = [[self.loss.pop((mb, j))] if final else [] for j in range(len(gpus))]
        ops0 = lanes[0][0]
        gates = prefetch_gates(ops0) if self.gathered[s] else {}
        marks = set(gates.values())
        # what a parameter all-gather waits for: op index (-1: the action's start) -> per replica, tasks
        ends: dict[int, list[list[int]]] = {}
        if gates:  # the action starts once its inputs arrived and its GPU's previous compute is done
            ends[-1] = [[*frontier, *self._last_compute(g)] for (_o, frontier), g in zip(lanes, gpus, strict=True)]
        hosts: list[int] = []
        offsets = [launch_offsets(ops, cuts) for ops, _ in lanes] if self.host else []
        for j, g in enumerate(gpus if self.host else []):  # the host waits for its data, then enqueues the kernels
            hosts.append(self.launch(g, offsets[j][1], list(lanes[j][1]), s, mb, f"launch {a}"))
        for idx in range(len(ops0)):
            params = -1
            layer = ops0[idx].layer
            if idx in gates and self.gathered[s][layer] > 0:  # ZeRO-3: the layer's parameters, over the replicas
                waits = [x for e in ends[gates[idx]] for x in e]
                name = f"params {flow.model.layers[layer].name}"
                params = self.dp_collective("all_gather", self.dp_group[s], self.gathered[s][layer], name, layer, s,
                                            waits, True, mb, gradients=False)  # fmt: skip
            for j, g in enumerate(gpus):
                ops = lanes[j][0]
                op = ops[idx]
                assert op.kind != K_TP  # stages plans have no tensor parallelism
                deps = list(lanes[j][1]) + loss[j] if idx == 0 else [last[j]]
                if params >= 0:
                    deps.append(params)
                if hosts and (self.options.exact_host or idx == 0 or cut_before(ops, idx, cuts)
                              or ops[idx - 1].scaled(self.speed[g]) < op.launch):  # fmt: skip
                    flow.release(hosts[j], len(flow), offsets[j][0][idx])
                last[j] = flow.add(op.dur * self.speed[g], self.slot(g, S_COMPUTE), op.kind, op.name, op.layer, s, mb,
                                   op.key, deps)  # fmt: skip
            if idx in marks:
                ends[idx] = [[x] for x in last]
            if layer in cuts and (idx + 1 == len(ops0) or ops0[idx + 1].layer != layer):  # a bucket is complete
                assert lowered is not None
                for bucket in lowered.by_layer[layer]:
                    self.grad_allreduce(s, list(last), bucket)
        self.send(a, last)

    def send(self, a: Action, last: list[int]) -> None:
        """Split-concat: every sender replica ships each receiver replica the samples their slices share."""
        s = a.stage
        if a.op == "F" and s == self.num_stages - 1:  # the loss: its backward waits for the forward's end
            for i, tid in enumerate(last):
                self.loss[(a.microbatch, i)] = tid
            return
        if a.op == "F" and s < self.num_stages - 1:
            dst, what = s + 1, "act"
        elif a.op == "B" and s > 0:
            dst, what = s - 1, "grad"
        else:
            return
        flow = self.flow
        per_sample = flow.model.boundary_bytes[flow.stage_ranges[min(s, dst)][1] - 1]
        for i, j, shared, inst in self.link(s, dst):
            tid = self.p2p(inst, round(per_sample * shared), what, s, dst, a.microbatch, last[i])
            self.incoming.setdefault((dst, a.op, a.microbatch, j), []).append(tid)

    def _last_compute(self, g: int) -> list[int]:
        last = self.flow._last.get((g, S_COMPUTE))
        return [] if last is None else [last]

    def grad_allreduce(self, s: int, deps: list[int], bucket: Bucket) -> None:
        """A gradient bucket of stage s all-reduced (reduce-scattered with a sharded optimizer) over the stage's own
        replicas."""
        lowered = self.sync[s]
        assert lowered is not None
        layer = -1 if bucket.ready is None else bucket.ready
        overlap = layer >= 0 and layer != min(self.held[s])
        name = self.bucket_name(lowered, bucket, s)
        beside = self.after[s].get(layer, 0.0) if overlap else 0.0
        self.dp_collective(lowered.collective, self.dp_group[s], bucket.nbytes, name, layer, s, deps, overlap,
                           compute_s=beside)  # fmt: skip

    def finish(self) -> None:
        """Per-stage gradient all-reduce (buckets that wait for the whole backward), tied copies' all-reduce, then
        every replica's optimizer step (of 1/r of the stage's parameters with a sharded optimizer over its r
        replicas) and ZeRO-1/2's parameter all-gathers."""
        flow, model = self.flow, self.flow.model
        for s, lowered in enumerate(self.sync):
            for bucket in lowered.at_end if lowered is not None else ():
                self.grad_allreduce(s, [flow._last[(g, S_COMPUTE)] for g in self.devices[s]], bucket)
        stage_of = {i: s for s in range(self.num_stages) for i in self.held[s]}
        for i, layer in enumerate(model.layers):
            if layer.tied_to is None:
                continue
            sa, sb = stage_of[model.index[layer.tied_to]], stage_of[i]
            nbytes = round(layer.tied_shard_params(1) * model.precision.grad_bytes)
            if sa == sb or nbytes <= 0:
                continue
            da, db = self.devices[sa], self.devices[sb]
            gpn = flow.cluster.gpus_per_node
            if len(da) == len(db):  # replica i of one stage with replica i of the other (Megatron's embedding group)
                instances = pair_instances(list(zip(da, db, strict=True)), gpn)
            else:  # widths differ: one group over both stages' replicas
                instances = group_instances([tuple(da + db)], gpn)
            for inst in instances:
                deps = [self.last_dp[g] if g in self.last_dp else flow._last[(g, S_COMPUTE)] for g in inst.gpus]
                self.allreduce(inst, nbytes, f"tied grads {layer.name}~{layer.tied_to}", i, sb, deps, False)
        for s, gpus in enumerate(self.devices):
            share = len(gpus) if self.sharding.divides_step else 1
            steps = self.optimizer_step(s, model.rank_params(sorted(self.held[s]), 1) / share, gpus)
            lowered = self.sync[s]
            if lowered is not None:
                self.gather_after_step(lowered, s, [self.dp_group[s]], steps, s)

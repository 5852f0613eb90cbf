"""The event flow of a strategy (tp x pp x dp on a cluster): the pipeline and data-parallel levels of DistSim's
hierarchical construction (:mod:`distsim.sim.flow.events` has the flow's types, :mod:`distsim.sim.flow.templates` its
tensor-parallel level).

:func:`build_flow` walks the schedule in unit-time order and emits every action on every simulated replica (one GPU
per pipeline rank when the replicas are symmetric), then the gradient synchronisation and optimizer step;
:func:`estimate_tasks` counts the tasks it would emit without building anything. With ZeRO-3 every action also
all-gathers each layer's parameters before using them (:func:`distsim.sim.flow.comm.prefetch_gates`), emitted op by op.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from distsim.core.cluster import Cluster
from distsim.core.errors import DistsimError
from distsim.core.models.graph import Model
from distsim.core.partition import rank_layers
from distsim.core.placement import CommInstance
from distsim.core.schedules import Action, build_schedule
from distsim.core.strategy import Strategy
from distsim.core.sync import (
    MODES,
    Bucket,
    Lowered,
    SyncContext,
    lower,
)
from distsim.sim.costs import CostSource, framework_of
from distsim.sim.flow.chain import ActionBlock, Chain, StageOp
from distsim.sim.flow.comm import CommWriter, P2PPlan, compute_after, gather_name, prefetch_gates
from distsim.sim.flow.events import (
    K_CP,
    K_EP,
    K_LAUNCH,
    K_P2P,
    K_SHADOW,
    K_TP,
    S_COMPUTE,
    S_HOST,
    S_TP,
    EventFlow,
    FlowOptions,
    resolve_partition,
)
from distsim.sim.flow.symmetry import resolve_placement
from distsim.sim.flow.templates import cut_before, launch_offsets, stage_templates


def build_flow(
    model: Model, cluster: Cluster, strategy: Strategy, costs: CostSource, options: FlowOptions | None = None
) -> EventFlow:
    """The full event DAG of one iteration of `strategy` on `cluster`."""
    options = options or FlowOptions()
    placement, symmetric = resolve_placement(model, cluster, strategy, options, costs)
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


OneGpuPlan = tuple[int, list[tuple[Chain, int | None]], float, tuple[int, P2PPlan] | None, ActionBlock | None]
"""(GPU, chains, host seconds to launch them, transfer after them, all of it as one block) of an action on one GPU
(:meth:`_Builder._one_gpu_plan`)."""

MODEL_PARALLEL = (K_TP, K_EP, K_CP)
"""Kinds of the communication a layer's template holds (on the ``tp`` stream): tensor-, expert- and
context-parallel."""


def merge_groups(
    model: Model, cluster: Cluster, strategy: Strategy, costs: CostSource, options: FlowOptions | None = None
) -> tuple[tuple[int, int], ...]:
    """The merge plan a planned gradient synchronisation (mgwfbp) makes for `strategy`, as the layer ranges a plan
    file records: every pipeline rank's groups, in layer order."""
    from distsim.core.sync import MgWfbp

    mode = MODES[strategy.grad_sync]
    if not isinstance(mode, MgWfbp):
        raise ValueError(f"grad_sync {strategy.grad_sync} makes no merge plan")
    options = options or FlowOptions()
    placement, symmetric = resolve_placement(model, cluster, strategy, options, costs)
    flow = EventFlow(model, cluster, strategy, build_schedule(strategy), placement,
                     resolve_partition(model, strategy, costs), symmetric, {})  # fmt: skip
    builder = _Builder(flow, costs, options, [0], [0])
    if strategy.dp == 1:
        return ((0, model.num_layers),)
    return tuple(sorted(g for r in range(strategy.pp) for g in mode.groups(builder.sync_context_of(r))))


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
        self.chains: dict[tuple, tuple[list[tuple[Chain, int | None]], float]] = {}  # see _chains
        self.incoming: dict[tuple[int, str, int, int, int], int] = {}  # (vs, op, mb, d, t) -> p2p task
        self.loss: dict[tuple[int, int, int, int], int] = {}  # (vs, mb, d, t) -> the last stage's forward end
        self.pairs: dict[tuple[int, int], list[CommInstance]] = {}
        self.sends: dict[tuple[int, str], tuple] = {}  # (stage, op) -> what send() sends after it (_send_plan)
        self.one_gpu: dict[tuple[int, str, frozenset[int]], OneGpuPlan] = {}  # (stage, op, cuts) -> its plan
        self.last_b = self._last_backward_mb()
        self.rank_layers = [set(rank_layers(flow.stage_ranges, self.pp, r)) for r in range(self.pp)]
        self.after: list[dict[int, float]] = []  # per pipeline rank: backward compute after each layer's (last mb)
        self.check_expert_groups()
        self.sync = [self._lower_sync(r) for r in range(self.pp)] if self.dp > 1 else []
        self.prefetch = bool(self.sync) and self.sharding.gather_after_step and framework_of(costs).overlap_param_gather
        """--overlap-param-gather: the ZeRO-1/2 all-gathers issued at the start, beside the first forward."""
        self.prefetched: dict[tuple[int, int], dict[int, int]] = {}  # (rank, layer) -> tp rank -> its all-gather
        self.prefetched_ranks: set[int] = set()
        # ZeRO-3: each rank's layers' parameter bytes, all-gathered before every forward and backward
        per_layer = self.dp > 1 and self.sharding.gather_per_layer
        self.gathered = [self.layer_param_bytes(held, self.tp) for held in self.rank_layers] if per_layer else []

    def _lower_sync(self, r: int) -> Lowered:
        """Pipeline rank r's gradient buckets (the same for every data-parallel replica and tp rank)."""
        s = self.flow.strategy
        ctx = self.sync_context_of(r)
        self.after.append(compute_after(ctx))
        return lower(s.grad_sync, ctx, s.optimizer_sharding)

    def sync_context_of(self, r: int) -> SyncContext:
        """What gradient synchronisation sees of pipeline rank r: its layers, their backward times, its dp group."""
        backward: dict[int, float] = {}
        chunk: dict[int, int] = {}
        for vs in range(r, self.num_stages, self.pp):
            for op in self.template(vs, self.lanes_d[0])["B"]:
                backward[op.layer] = backward.get(op.layer, 0.0) + op.dur
                chunk[op.layer] = vs // self.pp
        inst = self.placement.dp_groups(r)[self.lanes_t[0]]
        return self.sync_context(self.rank_layers[r], self.tp, inst, backward, chunk)

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
            inst = self.tp_instance(vs % self.pp, d)
            if inst is not None and self.fair:  # costed alone: the engine shares the NICs
                inst = replace(inst, sharers=1)
            ep = self.ep_instance(vs % self.pp, d)
            cp = self.cp_instance(vs % self.pp, d)
            tpl = self.templates[key] = stage_templates(self.flow, self.costs, vs, inst, ep_instance=ep, cp_instance=cp)
        return tpl

    def ep_instance(self, r: int, d: int) -> CommInstance | None:
        """The expert-parallel group of replica d (tp rank 0) of pipeline rank r (None without expert parallelism).
        Its scope and NIC sharing stand for every group's: the builder checked they are the same."""
        ep = self.flow.strategy.ep
        return self.placement.ep_groups(r)[(d // ep) * self.tp] if ep > 1 else None

    def cp_instance(self, r: int, d: int) -> CommInstance | None:
        """The context-parallel group of replica d (tp rank 0) of pipeline rank r (None without context
        parallelism); like :meth:`ep_instance` it stands for every group's scope."""
        cp = self.flow.strategy.cp
        return self.placement.cp_groups(r)[(d // cp) * self.tp] if cp > 1 else None

    def check_expert_groups(self) -> None:
        """Expert- and context-parallel groups must all have one scope and NIC sharing (one template stands for
        them)."""
        strategy = self.flow.strategy
        for what, k in (("expert", strategy.ep), ("context", strategy.cp)):
            for r in range(self.pp) if k > 1 else ():
                if not self.placement.replica_groups(r, k).uniform:
                    letter = what[0] + "p"
                    raise DistsimError(f"{what}-parallel groups of {letter}={k} straddle nodes unevenly on pipeline "
                                       f"rank {r}; choose {letter} so that tp x {letter} divides the GPUs per node or "
                                       "is a multiple of them")  # fmt: skip

    def tp_instance(self, r: int, d: int) -> CommInstance | None:
        """The tp group of replica d of pipeline rank r (None without tensor parallelism)."""
        return self.placement.tp_groups(r)[d] if self.tp > 1 else None

    def tp_network(self, tid: int, op: StageOp, r: int, d: int) -> None:
        """Fair link sharing: record a tensor-parallel collective that crosses nodes as a network task."""
        if op.kind == K_TP and op.comm is not None and op.comm.scope == "inter":
            inst = self.tp_instance(r, d)
            assert inst is not None
            self.network_task(tid, inst, op.comm, op.dur)

    def run(self) -> None:
        for r, a in self.flow.schedule.in_unit_time:
            self.action(r, a)
        self.finish()

    # ------------------------------------------------------------------------------------------------ pipeline
    def action(self, r: int, a: Action) -> None:
        """Emit one schedule action on every simulated replica of pipeline rank r."""
        final = self.dp > 1 and a.op == "B" and self.last_b[a.stage] == a.microbatch
        cuts = self.sync[r].cuts if final else frozenset()
        if self.prefetch and a.op == "F" and a.microbatch == 0 and r not in self.prefetched_ranks:
            self._prefetch_params(r)
        if len(self.lanes_d) == 1 and len(self.lanes_t) == 1 and not self.gathered and not self.prefetch:
            self._action_on_one_gpu(r, a, cuts)
        else:
            self._action_on_lanes(r, a, cuts)

    def _action_on_lanes(self, r: int, a: Action, cuts: frozenset[int]) -> None:
        """:meth:`action` op by op over the replicas (lanes) of rank r.

        Ops are the outer loop and replicas the inner one, so that a gradient bucket's all-reduce (which spans the
        replicas) is emitted as soon as every replica finished the backward of the layer that completes it, before
        the next layer's compute: its place in each stream's order is then where it is issued in a real run. With
        ZeRO-3 a layer's parameter all-gather (one per tp rank, over the replicas) is emitted before its first op.
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
        loss = [[self._loss(a, d, t) for t in self.lanes_t] for d in self.lanes_d]
        ops0 = lanes[0][2]
        n_ops = len(ops0)
        gates = prefetch_gates(ops0) if self.gathered else {}
        marks = set(gates.values())
        # what a parameter all-gather waits for: op index (-1: the action's start) -> per lane and tp rank, tasks
        ends: dict[int, list[list[list[int]]]] = {}
        if gates:  # the action starts once its inputs arrived and its GPU's previous compute is done
            ends[-1] = [[[*frontier[j], *self._last_compute(g)] for j, g in enumerate(gpus)]
                        for _d, gpus, _ops, frontier, _last in lanes]  # fmt: skip
        hosts: list[list[int]] = []
        if self.host:  # each GPU's host waits for its received data, then enqueues the action's kernels
            total = launch_offsets(ops0, cuts)[1]
            name = f"launch {a}"  # one string for every GPU's launch
            for _d, gpus, _ops, frontier, _last in lanes:
                hosts.append([self.launch(g, total, list(frontier[j]), a.stage, a.microbatch, name)
                              for j, g in enumerate(gpus)])  # fmt: skip
            launch_ends = launch_offsets(ops0, cuts)[0]
        waits = self.prefetch and a.op == "F" and a.microbatch == 0
        for idx in range(n_ops):
            params = self._gather_params(r, a, ops0[idx].layer, gates[idx], lanes, ends) if idx in gates else {}
            if waits and (idx == 0 or ops0[idx - 1].layer != ops0[idx].layer):  # a layer's first op: its bucket
                params = self.prefetched.get((r, ops0[idx].layer), params)
            for lane, (_d, gpus, ops, frontier, last) in enumerate(lanes):
                op = ops[idx]
                if op.kind in (K_EP, K_CP):  # one task per expert- or context-parallel group, at its first lane
                    self._all_to_all(a, idx, lane, lanes, hosts, launch_ends if hosts else [], cuts)
                elif op.kind == K_TP:
                    assert op.comm is not None
                    deps = ([x for f, ls in zip(frontier, loss[lane], strict=True) for x in (*f, *ls)] if idx == 0
                            else [x for x in last if x >= 0])  # fmt: skip
                    deps += [params[t] for t in self.lanes_t if t in params]
                    tid = flow.add(op.dur, self.comm_slots(S_TP, op.comm.scope, tuple(gpus)), K_TP, op.name, op.layer,
                                   a.stage, a.microbatch, op.key, deps)  # fmt: skip
                    if self.fair:
                        self.tp_network(tid, op, r, lanes[lane][0])
                    for j, g in enumerate(gpus):
                        if hosts and self._constrained(ops, idx, g, cuts):
                            flow.release(hosts[lane][j], tid, launch_ends[idx])
                    last[:] = [tid] * len(gpus)
                else:
                    for j, g in enumerate(gpus):
                        deps = [*frontier[j], *loss[lane][j]] if idx == 0 else ([last[j]] if last[j] >= 0 else [])
                        if self.lanes_t[j] in params:
                            deps.append(params[self.lanes_t[j]])
                        if hosts and self._constrained(ops, idx, g, cuts):
                            flow.release(hosts[lane][j], len(flow), launch_ends[idx])
                        last[j] = flow.add(op.dur * self.speed[g], self.slot(g, S_COMPUTE), op.kind, op.name, op.layer,
                                           a.stage, a.microbatch, op.key, deps)  # fmt: skip
            if idx in marks:
                ends[idx] = [[[x] for x in last] for *_, last in lanes]
            op = lanes[0][2][idx]
            if op.layer in cuts and (idx + 1 == n_ops or lanes[0][2][idx + 1].layer != op.layer):  # bucket complete
                per_t = {t: [last[j] for _d, _g, _o, _f, last in lanes] for j, t in enumerate(self.lanes_t)}
                for bucket in self.sync[r].by_layer[op.layer]:
                    self.grad_allreduce(r, a.stage, per_t, bucket)
        for d, gpus, _ops, _frontier, last in lanes:
            self.send(r, a, d, gpus, last)

    def _prefetch_params(self, r: int) -> None:
        """--overlap-param-gather on pipeline rank r: the all-gathers of its buckets' parameters (one per tp rank,
        over the replicas) at the iteration's start, in forward order (the bucket of its first layers first), beside
        the forward; each layer's first forward waits for its bucket's (:attr:`prefetched`)."""
        self.prefetched_ranks.add(r)
        lowered = self.sync[r]
        instances = self.placement.dp_groups(r)
        for bucket in reversed(lowered.gathers):
            name = gather_name(self.bucket_name(lowered, bucket, r))
            layer = -1 if bucket.ready is None else bucket.ready
            tasks = {t: self.dp_collective("all_gather", instances[t], self.param_bytes(bucket.nbytes), name, layer,
                                           r, [], True, 0, gradients=False) for t in self.lanes_t}  # fmt: skip
            for held in bucket.layers:
                self.prefetched[(r, held)] = tasks

    def _all_to_all(self, a: Action, idx: int, lane: int, lanes: list, hosts: list, launch_ends: list[float],
                    cuts: frozenset[int]) -> None:  # fmt: skip
        """Op `idx` of action `a`, an all-to-all, over each expert-parallel group: one task per tp rank spanning the
        group's replicas among the simulated lanes, after each member's previous op; emitted at the group's first
        lane (the others' `last` are then set)."""
        assert lanes[lane][2][idx].comm is not None
        ep = lanes[lane][2][idx].comm.group_size  # the group's size: ep, or cp
        d0 = lanes[lane][0]
        if any(other[0] // ep == d0 // ep for other in lanes[:lane]):
            return  # emitted with the group's first lane
        members = [i for i, other in enumerate(lanes) if other[0] // ep == d0 // ep]
        op = lanes[lane][2][idx]
        assert op.comm is not None
        for j in range(len(self.lanes_t)):
            gpus = tuple(lanes[i][1][j] for i in members)
            deps = [lanes[i][4][j] for i in members if lanes[i][4][j] >= 0]
            tid = self.flow.add(op.dur, self.comm_slots(S_TP, op.comm.scope, gpus), op.kind, op.name, op.layer,
                                a.stage, a.microbatch, op.key, deps)  # fmt: skip
            for i in members:
                if hosts and self._constrained(lanes[i][2], idx, lanes[i][1][j], cuts):
                    self.flow.release(hosts[i][j], tid, launch_ends[idx])
                lanes[i][4][j] = tid

    def _last_compute(self, g: int) -> list[int]:
        last = self.flow._last.get((g, S_COMPUTE))
        return [] if last is None else [last]

    def _gather_params(self, r: int, a: Action, layer: int, gate: int, lanes: list,
                       ends: dict[int, list[list[list[int]]]]) -> dict[int, int]:  # fmt: skip
        """ZeRO-3: the all-gather of `layer`'s parameters before its ops in action `a`, one per tp rank over the
        replicas, once the action started (`gate` -1) or the op at index `gate` ended
        (:func:`~distsim.sim.flow.comm.prefetch_gates`); returns tp rank -> its task (none for a layer without
        parameters)."""
        nbytes = self.gathered[r][layer]
        if nbytes <= 0:
            return {}
        instances = self.placement.dp_groups(r)
        name = f"params {self.flow.model.layers[layer].name}"
        out = {}
        for j, t in enumerate(self.lanes_t):
            deps = [x for lane in range(len(lanes)) for x in ends[gate][lane][j]]
            out[t] = self.dp_collective("all_gather", instances[t], nbytes, name, layer, a.stage, deps, True,
                                        a.microbatch, gradients=False)  # fmt: skip
        return out

    def _loss(self, a: Action, d: int, t: int) -> list[int]:
        """For the last stage's backward: the end of its forward of that micro-batch (the loss needs the forward's
        output, all-reduced over the tp group), which the host does not wait for; else nothing."""
        if a.op == "B" and a.stage == self.num_stages - 1:
            return [self.loss.pop((a.stage, a.microbatch, d, t))]
        return []

    def _constrained(self, ops: Sequence[StageOp], idx: int, g: int, cuts: frozenset[int]) -> bool:
        """Whether op `idx` on GPU g needs its launch constraint (:attr:`Chain.launch_constrained`, op by op): the
        first op of its chain, or one whose launch outlasts the previous op."""
        if self.options.exact_host or idx == 0 or cut_before(ops, idx, cuts):
            return True
        return ops[idx - 1].scaled(self.speed[g]) < ops[idx].launch

    def _action_on_one_gpu(self, r: int, a: Action, cuts: frozenset[int]) -> None:
        """:meth:`action` when one GPU stands for the whole pipeline rank (a symmetric simulation, or tp = dp = 1):
        the template's ops are one chain (split after the layers that complete a gradient bucket), emitted at once,
        as the action's plan (:meth:`_one_gpu_plan`, the same for every micro-batch) lays them out."""
        stage, op, mb = a.stage, a.op, a.microbatch
        plan = self.one_gpu.get((stage, op, cuts))
        if plan is None:
            plan = self.one_gpu[(stage, op, cuts)] = self._one_gpu_plan(r, a, cuts)
        g, chains, launch_s, send, block = plan
        d, t = self.lanes_d[0], self.lanes_t[0]
        if op == "F":
            frontier = [self.incoming.pop((stage, "F", mb, d, t))] if stage > 0 else []
        elif stage < self.num_stages - 1:
            frontier = [self.incoming.pop((stage, "B", mb, d, t))]
        else:
            frontier = []
        if block is not None:  # the whole action at once (the same tasks as below)
            end, transfer = self.flow.add_action(block, frontier + self._loss(a, d, t), frontier, stage, mb,
                                                 f"launch {stage}{op}{mb}", self.options.exact_host)  # fmt: skip
            if send is not None:
                self.incoming[(send[0], op, mb, d, t)] = transfer
            elif op == "F":  # the last stage's forward: its end, for the backward of the same micro-batch
                self.loss[(stage, mb, d, t)] = end
            return
        host, offset = None, 0.0
        if self.host:  # the host waits for the received data, then enqueues the action's kernels
            host = self.launch(g, launch_s, list(frontier), stage, mb, f"launch {stage}{op}{mb}")
        last = -1
        first = frontier + self._loss(a, d, t)
        ops = self.template(stage, d)[op] if self.fair else []
        done = 0  # ops emitted so far
        for chain, layer in chains:
            anchor = (host, offset) if host is not None else None
            last = self.flow.add_chain(chain, first if last < 0 else [last], stage, mb, anchor,
                                       self.options.exact_host)  # fmt: skip
            offset += chain.launch_s
            n = len(chain.durations)
            for k in range(n) if self.fair else ():
                self.tp_network(last - n + 1 + k, ops[done + k], r, d)
            done += n
            if layer is not None:
                for bucket in self.sync[r].by_layer[layer]:
                    self.grad_allreduce(r, stage, {t: [last]}, bucket)
        if send is None:
            if op == "F":  # the last stage's forward: its end, for the backward of the same micro-batch
                self.loss[(stage, mb, d, t)] = last
            return
        dst_vs, p2p = send
        self.incoming[(dst_vs, op, mb, d, t)] = self.emit_p2p(p2p, stage, mb, last)

    def _one_gpu_plan(self, r: int, a: Action, cuts: frozenset[int]) -> OneGpuPlan:
        """What :meth:`_action_on_one_gpu` emits for any micro-batch of `a`'s stage and op: the GPU, the template's
        chains and the host seconds to launch them, the transfer after them (destination stage and
        :class:`~distsim.sim.flow.comm.P2PPlan`; None: no transfer), and in a symmetric flow whose action is one
        chain (no gradient bucket issued inside it) and whose transfers are not network tasks (fair sharing), the
        :class:`~distsim.sim.flow.chain.ActionBlock` that emits it all at once (else None)."""
        d, t = self.lanes_d[0], self.lanes_t[0]
        g = int(self.grid[r, d, t])
        chains, launch_s = self._chains(a.stage, d, a.op, g, cuts)
        send = self._p2p_after(r, a, d, t)
        block = None
        if self.flow.symmetric and not self.fair and len(chains) == 1 and chains[0][1] is None:
            after: list[tuple[float, tuple[tuple[int, int], ...], int, int, str]] = []
            if send is not None:
                p2p = send[1]
                after.append((p2p.dur, p2p.slots, K_P2P, p2p.key, p2p.name))
                if p2p.shadow_slots is not None:
                    after.append((p2p.shadow, p2p.shadow_slots, K_SHADOW, p2p.key, "overlapped communication"))
            host = (launch_s, self.slot(g, S_HOST)) if self.host else None
            block = ActionBlock.of(chains[0][0], host, after, send[1].inst.gpus if send else None, K_LAUNCH)
        return g, chains, launch_s, send, block

    def _chains(self, vs: int, d: int, op: str, g: int,
                cuts: frozenset[int]) -> tuple[list[tuple[Chain, int | None]], float]:  # fmt: skip
        """The template of (vs, op) on GPU g as chains: one, or split after each layer in `cuts`, whose buckets are
        then issued (with that layer); and the host seconds to launch them all (summed once per template)."""
        key = (vs, d, op, g, cuts)
        got = self.chains.get(key)
        if got is None:
            ops = self.template(vs, d)[op]
            parts: list[list[StageOp]] = []
            for o in ops:
                if not parts or (parts[-1][-1].layer in cuts and parts[-1][-1].layer != o.layer):
                    parts.append([])
                parts[-1].append(o)
            out = []
            for part in parts:
                slots = [self.comm_slots(S_TP, o.comm.scope, (g,)) if o.kind in MODEL_PARALLEL and o.comm is not None
                         else self.slot(g, S_COMPUTE) for o in part]  # fmt: skip
                done = part[-1].layer if part[-1].layer in cuts else None
                out.append((Chain.of(part, slots, self.speed[g]), done))
            got = self.chains[key] = (out, sum(c.launch_s for c, _ in out))
        return got

    def send(self, r: int, a: Action, d: int, gpus: list[int], last: list[int]) -> None:
        """After an action: send its activation forward or its input gradient backward (the last stage's forward:
        keep its end for the backward of the same micro-batch)."""
        if a.op == "F" and a.stage == self.num_stages - 1:
            for j, t in enumerate(self.lanes_t):
                self.loss[(a.stage, a.microbatch, d, t)] = last[j]
            return
        for j, t in enumerate(self.lanes_t):
            send = self._p2p_after(r, a, d, t)
            if send is None:
                return
            dst_vs, p2p = send
            self.incoming[(dst_vs, a.op, a.microbatch, d, t)] = self.emit_p2p(p2p, a.stage, a.microbatch, last[j])

    def _p2p_after(self, r: int, a: Action, d: int, t: int) -> tuple[int, P2PPlan] | None:
        """The transfer after an action of `a`'s stage and op on replica d, tp rank t (the same for every
        micro-batch): its destination stage and plan, planned once per lane; None for none."""
        plan = self.sends.get((a.stage, a.op))
        if plan is None:
            plan = self.sends[(a.stage, a.op)] = self._send_plan(r, a)
        if not plan:
            return None
        dst_vs, nbytes, name, pairs, planned = plan
        i = d * self.tp + t
        got = planned.get(i)
        if got is None:  # planned when asked for: once per lane, not once per micro-batch
            got = planned[i] = (dst_vs, self.p2p_plan(pairs[i], nbytes, name))
        return got

    def _send_plan(self, r: int, a: Action) -> tuple[int, int, str, Sequence[CommInstance],
                                                      dict[int, tuple[int, P2PPlan]]] | tuple[()]:  # fmt: skip
        """What :meth:`send` sends after an action of `a`'s stage and op (the same for every micro-batch): the
        destination stage, its bytes, the transfer's name, the rank pair's instances and the lanes' transfers
        planned so far; () for none."""
        if a.op == "F" and a.stage < self.num_stages - 1:
            dst_vs, what = a.stage + 1, "act"
        elif a.op == "B" and a.stage > 0:
            dst_vs, what = a.stage - 1, "grad"
        else:
            return ()
        flow = self.flow
        cut = flow.stage_ranges[min(a.stage, dst_vs)][1] - 1
        nbytes = round(flow.model.boundary_bytes[cut] * flow.strategy.micro_batch_size)
        dst_r = dst_vs % self.pp
        pairs = self.pairs.get((r, dst_r))
        if pairs is None:
            pairs = self.pairs[(r, dst_r)] = self.placement.p2p_pairs(r, dst_r)
        return dst_vs, nbytes, f"{what} {a.stage}->{dst_vs}", pairs, {}

    # ------------------------------------------------------------------------------------------ data parallel
    def grad_allreduce(self, r: int, stage: int, per_t: dict[int, list[int]], bucket: Bucket) -> list[int]:
        """A gradient bucket's all-reduce (a reduce-scatter with a sharded optimizer), one per tp rank over the
        replicas; returns the task ids."""
        lowered = self.sync[r]
        name = self.bucket_name(lowered, bucket, r)
        layer = -1 if bucket.ready is None else bucket.ready
        instances = self.placement.dp_groups(r)
        overlap = layer >= 0 and layer != min(self.rank_layers[r])  # backward still runs while it is in flight
        beside = self.after[r].get(layer, 0.0) if overlap else 0.0
        return [self.dp_collective(lowered.collective, instances[t], bucket.nbytes, name, layer, stage, per_t[t],
                                   overlap, compute_s=beside) for t in self.lanes_t]  # fmt: skip

    def rank_shard_params(self, r: int) -> float:
        return self.flow.model.rank_params(sorted(self.rank_layers[r]), self.tp)

    def finish(self) -> None:
        """Gradient synchronisation that ends the iteration, then the optimizer step on every simulated GPU.

        Order as in Megatron-LM's ``finalize_model_grads``: the data-parallel all-reduce (buckets that wait for the
        whole backward; the others were issued during it), then the all-reduce of tied embedding copies between the
        first and last pipeline ranks, then the optimizer step: of 1/dp of the rank's parameters with a sharded
        optimizer, followed by ZeRO-1/2's parameter all-gathers.
        """
        last = self.flow._last
        for r, lowered in enumerate(self.sync):
            for bucket in lowered.at_end:
                per_t = {t: [last[(int(self.grid[r, d, t]), S_COMPUTE)] for d in self.lanes_d] for t in self.lanes_t}
                self.grad_allreduce(r, r, per_t, bucket)
        self.tied_allreduce()
        share = self.dp if self.sharding.divides_step else 1
        for r in range(self.pp):
            gpus = [int(self.grid[r, d, t]) for d in self.lanes_d for t in self.lanes_t]
            steps = self.optimizer_step(r, self.rank_shard_params(r) / share, gpus)
            if self.sync and not self.prefetch:  # with --overlap-param-gather they ran beside the first forward
                instances = self.placement.dp_groups(r)
                self.gather_after_step(self.sync[r], r, [instances[t] for t in self.lanes_t], steps, r)

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
            nbytes = round(layer.tied_shard_params(self.tp) * model.precision.grad_bytes)
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

"""The tensor-parallel level of the event flow (DistSim Sec. 4.3, first level): a stage's forward and backward as op
sequences, every block its compute event and, with tp > 1, its collectives over the tp group; then the passes that
rewrite a layer's backward (activation recomputation, :mod:`distsim.sim.flow.recompute`).

* **Tensor parallelism** (Megatron-LM, Shoeybi et al. 2019, Fig. 3): a block's compute, then an all-reduce of its
  output in forward (g) and of its input gradient in backward (f's backward), of ``tp_fwd_allreduce_bytes`` and
  ``tp_bwd_allreduce_bytes`` per sample.
* **Sequence parallelism** (Korthikanti et al. 2022, Sec. 4.2.2, Fig. 5): the layer norms and dropouts between the
  tensor-parallel regions run on 1/tp of the sequence, and each all-reduce splits into its two halves around the
  block: f becomes g (an all-gather before the block's forward, a reduce-scatter after its backward) and Megatron's
  forward all-reduce becomes g-bar (a reduce-scatter after the forward, an all-gather before the backward). Each
  phase is then all-gather, compute, reduce-scatter, with the same message sizes as the all-reduces they replace, so
  the ring volume is the same (a ring all-reduce is a reduce-scatter and an all-gather). A block's kernels
  (``Block.ops``) run their layer norms and dropouts sharded
  (:func:`distsim.core.models.ops.sequence_parallel_ops`), as an event of its own (``OP+sp``); a block without kernels
  (a roofline or given time) keeps its cost, and a measured block gets the analytic share
  (:func:`distsim.sim.costs.share_cost`). The LM head's vocab-parallel cross-entropy all-reduce (three fp32 values per
  token) is not a sequence-parallel transition in Megatron; here it splits like the others (equal volume).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from itertools import accumulate

from distsim.core.models.graph import Block
from distsim.core.models.ops import AttentionOp, GemmOp, sequence_parallel_ops
from distsim.core.placement import CommInstance
from distsim.sim.costs import CommEvent, ComputeEvent, Cost, CostSource, framework_of, share_cost
from distsim.sim.flow.chain import StageOp
from distsim.sim.flow.events import K_BWD, K_CP, K_EP, K_FWD, K_RECOMPUTE, K_TP, EventFlow
from distsim.sim.flow.recompute import MODES, LayerOps, attention_core, recomputed_layers
from distsim.sim.kernels import block_s, op_s

Collectives = tuple[tuple[str, float], ...]


def tp_collectives(block: Block, phase: str, sequence_parallel: bool) -> tuple[Collectives, Collectives]:
    """(before the block's compute, after it): the tensor-parallel collectives of one phase (``F`` or ``B``) as
    (collective, bytes per sample), for a block split over tp > 1 ranks."""
    fwd, bwd = block.tp_fwd_allreduce_bytes, block.tp_bwd_allreduce_bytes
    own, other = (fwd, bwd) if phase == "F" else (bwd, fwd)
    if not sequence_parallel:
        return (), ((("all_reduce", own),) if own > 0 else ())
    before = (("all_gather", other),) if other > 0 else ()
    return before, ((("reduce_scatter", own),) if own > 0 else ())


def collective_count(block: Block, phase: str, tp: int, sequence_parallel: bool) -> int:
    """Tensor-parallel collectives of a block in one phase at degree tp (what :func:`stage_templates` emits)."""
    if tp == 1 or block.tp != "shard":
        return 0
    before, after = tp_collectives(block, phase, sequence_parallel)
    return len(before) + len(after)


def sequence_parallel_block(block: Block) -> Block | None:
    """The block as sequence parallelism runs it (its layer norms and dropouts sharded), an event of its own; None
    when that changes none of its kernels."""
    ops = sequence_parallel_ops(block.ops)
    if ops == block.ops or block.tp != "shard":
        return None
    return replace(block, op=f"{block.op}+sp", ops=ops)


def derived_blocks(block: Block) -> tuple[Block, ...]:
    """The blocks the flow derives from `block` and costs as the analytic share of its cost
    (:func:`distsim.sim.costs.share_cost`): its sequence-parallel form and its attention core, where it has them."""
    return tuple(b for b in (sequence_parallel_block(block), attention_core(block)) if b is not None)


class _Blocks:
    """Ops of one stage's blocks at a micro-batch size, each block's event costed once per phase."""

    def __init__(self, flow: EventFlow, costs: CostSource, mbs: int, tp_instance: CommInstance | None,
                 ep_instance: CommInstance | None = None, cp_instance: CommInstance | None = None):  # fmt: skip
        self.flow, self.costs, self.mbs, self.inst, self.ep_inst = flow, costs, mbs, tp_instance, ep_instance
        self.cp_inst = cp_instance
        strategy = flow.strategy
        self.tp, self.dtype = strategy.tp, flow.model.precision.name
        self.sp = strategy.sequence_parallel and strategy.tp > 1
        self._events = flow.costed  # shared by the flow's stages: equal blocks of different layers cost the same
        self.framework = framework_of(costs)
        self.overlap = (self.framework.tp_comm_overlap and self.sp and tp_instance is not None
                        and tp_instance.scope == "intra")  # fmt: skip
        """Megatron's --tp-comm-overlap: each collective pipelined with the GEMM beside it (:meth:`overlapped`)."""

    def event(self, block: Block, phase: str) -> tuple[ComputeEvent, Cost]:
        """The compute event a block runs (its sequence-parallel form where that differs) and its cost, once per
        flow for equal blocks (:meth:`~distsim.sim.flow.events.EventFlow.same_block`), phase and micro-batch size."""
        known_key = ("compute", id(self.flow.same_block(block)), phase, self.mbs)
        known = self._events.get(known_key)
        if known is not None:
            return known  # type: ignore[no-any-return]
        ev = ComputeEvent(block, phase, self.mbs, self.tp, self.dtype)
        sp_block = sequence_parallel_block(block) if self.sp else None
        if sp_block is None:
            out = ev, self.costs.compute(ev)
        else:
            derived = ComputeEvent(sp_block, phase, self.mbs, self.tp, self.dtype)
            out = derived, share_cost(self.costs, self.flow.cluster.gpu, ev, derived)
        self._events[known_key] = out
        return out

    def ops(self, li: int, block: Block, phase: str) -> tuple[StageOp, ...]:
        """The block's compute and, with tp > 1, its collectives in `phase`."""
        layer = self.flow.model.layers[li]
        label = layer.name if len(layer.blocks) == 1 else f"{layer.name}.{block.op}"
        ev, cost = self.event(block, phase)
        if self.ep_inst is not None and dict(block.shape).get("ep", 1) > 1:
            middle = self.expert_parallel(li, ev, cost, label)
        else:
            key = self.flow.intern(ev.key, cost, "compute")
            middle = (StageOp(K_FWD if phase == "F" else K_BWD, cost.seconds, key, label, li, launch=cost.launch_s),)
            if self.cp_inst is not None and any(isinstance(op, AttentionOp) for op in ev.block.ops):
                middle = (self.ring(li, ev, cost, label), *middle)
        if self.tp == 1 or block.tp != "shard" or self.inst is None:
            return middle
        if len(middle) > 1:
            before, after = tp_collectives(block, phase, self.sp)
            return (*(self.collective(c, b, label, li) for c, b in before), *middle,
                    *(self.collective(c, b, label, li) for c, b in after))  # fmt: skip
        compute = middle[0]
        before, after = tp_collectives(block, phase, self.sp)
        ops_before = tuple(self.collective(c, b, label, li) for c, b in before)
        ops_after = tuple(self.collective(c, b, label, li) for c, b in after)
        if self.overlap:
            return self.overlapped(ev, cost, compute, ops_before, ops_after)
        return (*ops_before, compute, *ops_after)

    def overlapped(self, ev: ComputeEvent, cost: Cost, compute: StageOp, before: tuple[StageOp, ...],
                   after: tuple[StageOp, ...]) -> tuple[StageOp, ...]:  # fmt: skip
        """A block's ops under --tp-comm-overlap (Transformer Engine's userbuffers): the all-gather before it
        pipelined with the first tensor-parallel GEMM it runs (in backward the last of its forward), the collective
        after it with the last one it runs; each pair takes
        :meth:`~distsim.core.framework.Framework.overlapped_pair_s`. The GEMMs stretch by the interference of
        the collective beside them (its SMs); each collective keeps only its exposed part, in its place (the
        all-gather's before the block: the first GEMM chunk waits for its data; the reduce-scatter's after it)."""
        gpu = self.flow.cluster.gpu
        mbs, tp, phase = ev.micro_batch_size, ev.effective_tp, ev.phase
        order = ev.block.ops if phase == "F" else tuple(reversed(ev.block.ops))
        gemms = [op for op in order if isinstance(op, GemmOp) and op.split != "none"]
        if not gemms:
            return (*before, compute, *after)
        analytic_s, _ = block_s(gpu, ev.block.ops, phase, mbs, tp)
        scale = cost.seconds / analytic_s if analytic_s > 0 else 1.0  # a measured block: its GEMMs' analytic share
        slowdown, _ = self.costs.interference("intra")
        stretched = compute.dur
        ops: list[StageOp] = []
        for side, gemm in ((before, gemms[0]), (after, gemms[-1])):
            gemm_s = op_s(gpu, gemm, phase, mbs, tp)[0] * scale
            for op in side:
                longer, exposed = self.framework.overlapped_pair_s(gemm_s, op.dur, slowdown)
                stretched += longer - gemm_s
                flow = self.flow
                key = flow.intern(f"{flow.keys[op.key]}/overlapping={ev.key}",
                                  Cost(exposed, flow.key_costs[op.key].source), flow.key_kinds[op.key])  # fmt: skip
                ops.append(replace(op, dur=exposed, key=key, name=f"{op.name} (exposed)"))
        if stretched != compute.dur:
            key = self.flow.intern(f"{ev.key}/overlapped", replace(cost, seconds=stretched), "compute")
            compute = replace(compute, dur=stretched, key=key)
        n = len(before)
        return (*ops[:n], compute, *ops[n:])

    def expert_parallel(self, li: int, ev: ComputeEvent, cost: Cost, label: str) -> tuple[StageOp, ...]:
        """A mixture-of-experts block under expert parallelism: its kernels split around the experts' (router and
        permutation; the experts' grouped GEMMs; unpermutation, shared experts, residual), each part an event costed
        as its share of the block's, with an all-to-all over the expert-parallel group between them: the dispatch
        of the routed token copies (top_k per token, h each) and the combine of the experts' outputs, in forward;
        in backward the same two all-to-alls carry the gradients, in the reverse order."""
        ops = ev.block.ops
        names = [op.name for op in ops]
        start = names.index("experts_fc1")
        start -= int(start > 0 and names[start - 1] == "fp8_cast")  # FP8: the experts' input cast is theirs
        end = names.index("experts_fc2") + 1
        parts = (("dispatch", ops[:start]), ("experts", ops[start:end]), ("combine", ops[end:]))
        if ev.phase == "B":
            parts = parts[::-1]
        shape = dict(ev.block.shape)
        load = shape.get("load_pct", 100) / 100  # the most loaded rank paces the experts and the exchanges
        per_sample = shape["seq"] * shape["top_k"] * shape["h"] * self.flow.model.precision.act_bytes
        exchange = self.all_to_all(per_sample, li, label, load)
        out: list[StageOp] = []
        kind = K_FWD if ev.phase == "F" else K_BWD
        gpu = self.flow.cluster.gpu
        for i, (part, part_ops) in enumerate(parts):
            if i:  # forward: dispatch then combine; backward: the combine's gradients first
                which = "dispatch" if (i == 1) == (ev.phase == "F") else "combine"
                out.append(replace(exchange, name=f"{label} {which}"))
            derived = ComputeEvent(replace(ev.block, op=f"{ev.block.op}.{part}", ops=part_ops, fwd_flops=0.0,
                                           io_bytes=0.0), ev.phase, ev.micro_batch_size, ev.tp, ev.dtype)  # fmt: skip
            part_cost = share_cost(self.costs, gpu, ev, derived) if part_ops else Cost(0.0, cost.source)
            if part == "experts" and load != 1:
                part_cost = replace(part_cost, seconds=part_cost.seconds * load)
            key = self.flow.intern(derived.key, part_cost, "compute")
            out.append(StageOp(kind, part_cost.seconds, key, f"{label}.{part}", li, launch=part_cost.launch_s))
        return tuple(out)

    def ring(self, li: int, ev: ComputeEvent, cost: Cost, label: str) -> StageOp:
        """Ring attention's key/value passes over the context-parallel group, as the exposed part placed before the
        block (Transformer Engine's context parallelism): the attention runs in cp steps, on the local chunk and
        then on each chunk received, while the next one travels (one transfer of this rank's K and V per step; in
        backward also their gradients, twice the bytes). With the core taking A and a transfer T, the steps take
        A/cp + (cp - 1) max(A/cp, T), of which what passes A is exposed."""
        assert self.cp_inst is not None
        inst, cp = self.cp_inst, len(self.cp_inst.gpus)
        shape = dict(ev.block.shape)
        heads, h = shape["heads"], shape["h"]
        kv = shape.get("kv_heads", heads)
        per_sample = 2 * shape["seq"] * kv * (h // heads) * self.flow.model.precision.act_bytes
        step_bytes = round(per_sample * self.mbs * (1 if ev.phase == "F" else 2) / ev.effective_tp)
        transfer = self.costs.comm(CommEvent("p2p", step_bytes, 2, inst.scope, inst.sharers)).seconds
        gpu = self.flow.cluster.gpu
        analytic_s, _ = block_s(gpu, ev.block.ops, ev.phase, ev.micro_batch_size, ev.effective_tp)
        scale = cost.seconds / analytic_s if analytic_s > 0 else 1.0
        core_s = sum(op_s(gpu, op, ev.phase, ev.micro_batch_size, ev.effective_tp)[0] * scale for op in ev.block.ops
                     if isinstance(op, AttentionOp))  # fmt: skip
        exposed = core_s / cp + (cp - 1) * max(core_s / cp, transfer) - core_s
        cev = CommEvent("cp_ring", step_bytes, cp, inst.scope, inst.sharers)
        key = self.flow.intern(f"{cev.key}/overlapping={ev.key}", Cost(exposed, "analytic"), "cp_ring")
        return StageOp(K_CP, exposed, key, f"{label} ring", li, cev, self.flow.cluster.gpu.kernel_launch_s)

    def all_to_all(self, per_sample: float, li: int, label: str, load: float = 1.0) -> StageOp:
        """One all-to-all over the expert-parallel group: the routed token copies of this micro-batch (the most
        loaded rank's, `load` times the mean, set its end)."""
        assert self.ep_inst is not None
        inst = self.ep_inst
        cev = CommEvent("all_to_all", round(per_sample * self.mbs * load), len(inst.gpus), inst.scope, inst.sharers)
        cost = self.costs.comm(cev)
        key = self.flow.intern(cev.key, cost, "ep_alltoall")
        launch = cost.launch_s or self.flow.cluster.gpu.kernel_launch_s
        return StageOp(K_EP, cost.seconds, key, label, li, cev, launch)

    def collective(self, collective: str, per_sample: float, label: str, li: int) -> StageOp:
        assert self.inst is not None
        fields = (collective, round(per_sample * self.mbs), self.tp, self.inst.scope, self.inst.sharers)
        known = self._events.get(fields)  # costed once per flow
        if known is None:
            cev = CommEvent(*fields)
            cost = self.costs.comm(cev)
            key = self.flow.intern(cev.key, cost, "tp_" + collective.replace("_", ""))
            launch = cost.launch_s or self.flow.cluster.gpu.kernel_launch_s  # one collective kernel
            known = self._events[fields] = (cev, cost.seconds, key, launch)
        cev, seconds, key, launch = known
        return StageOp(K_TP, seconds, key, label, li, cev, launch)

    def core(self, li: int, block: Block) -> StageOp | None:
        """Selective recomputation's op for the block: its attention core's forward, or None."""
        known_key = ("core", id(self.flow.same_block(block)), self.mbs)
        known = self._events.get(known_key)  # costed once per flow, as event()
        if known is None:
            core = attention_core(block)
            if core is None:
                known = self._events[known_key] = (None, 0)
            else:
                base, _ = self.event(block, "F")
                derived = ComputeEvent(core, "F", self.mbs, self.tp, self.dtype)
                cost = share_cost(self.costs, self.flow.cluster.gpu, base, derived)
                known = self._events[known_key] = (cost, self.flow.intern(derived.key, cost, "compute"))
        cost, key = known
        if cost is None:
            return None
        layer = self.flow.model.layers[li]
        label = layer.name if len(layer.blocks) == 1 else f"{layer.name}.{block.op}"
        return StageOp(K_RECOMPUTE, cost.seconds, key, f"{label} core", li, launch=cost.launch_s)


def stage_templates(
    flow: EventFlow, costs: CostSource, vs: int, tp_instance: CommInstance | None, mbs: int | None = None,
    ep_instance: CommInstance | None = None, cp_instance: CommInstance | None = None,
) -> dict[str, list[StageOp]]:  # fmt: skip
    """Forward and backward op sequences of virtual stage vs at `mbs` samples (default: the strategy's micro-batch
    size); `tp_instance`: the tp group of the GPU they run on (None: no tensor-parallel collectives);
    `ep_instance`: its expert-parallel group (None: no expert parallelism)."""
    model, strategy = flow.model, flow.strategy
    start, end = flow.stage_ranges[vs]
    blocks = _Blocks(flow, costs, strategy.micro_batch_size if mbs is None else mbs, tp_instance, ep_instance,
                     cp_instance)  # fmt: skip
    mode = MODES[strategy.recompute]
    recomputed = recomputed_layers(model, strategy, (start, end))
    forward: dict[int, tuple[tuple[StageOp, ...], ...]] = {
        li: tuple(blocks.ops(li, b, "F") for b in model.layers[li].blocks) for li in range(start, end)
    }
    backward: list[StageOp] = []
    for li in range(end - 1, start - 1, -1):
        order = tuple(reversed(model.layers[li].blocks))
        ops = tuple(blocks.ops(li, b, "B") for b in order)
        if li in recomputed:
            cores = tuple(blocks.core(li, b) for b in order) if mode.uses_cores else ()
            backward += mode.backward(LayerOps(li, forward[li], ops, cores))
        else:
            backward += [op for part in ops for op in part]
    return {"F": [op for li in range(start, end) for part in forward[li] for op in part], "B": backward}


def cut_before(ops: Sequence[StageOp], idx: int, cuts: frozenset[int]) -> bool:
    """Whether a chain ends before op `idx`: the previous op ends a layer that completes a gradient bucket."""
    return ops[idx - 1].layer in cuts and ops[idx - 1].layer != ops[idx].layer


def launch_offsets(ops: Sequence[StageOp], cuts: frozenset[int]) -> tuple[list[float], float]:
    """When each op's launch ends from the start of the host task that enqueues a template, and that task's
    length: launches back to back, summed as a one-GPU action's chains sum them (split after the layers in `cuts`:
    :func:`cut_before`)."""
    ends: list[float] = []
    base = 0.0
    part: list[StageOp] = []
    for i, op in enumerate(ops):
        part.append(op)
        if i + 1 == len(ops) or cut_before(ops, i + 1, cuts):
            within = list(accumulate(o.launch for o in part))
            ends += [base + x for x in within]
            base += within[-1]
            part = []
    return ends, base

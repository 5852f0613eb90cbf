"""How many tasks a strategy's event flow will hold, counted from the strategy and the model without building it
(:func:`estimate_tasks`, which :func:`distsim.plans.simulate.estimate_size` checks against the task limit), and
the per-rank counts it shares with the stages plans' estimate (:func:`bucket_bound`, :func:`overlap_shadows`)."""

from __future__ import annotations

from distsim.core.cluster import Cluster
from distsim.core.models.graph import Block, Model
from distsim.core.partition import rank_layers
from distsim.core.strategy import Strategy
from distsim.core.sync import MODES, SHARDINGS, GradUnit, SyncContext, SyncSettings, lower, tensor_bytes
from distsim.sim.costs import CostSource, framework_of
from distsim.sim.flow.comm import models_host
from distsim.sim.flow.events import FlowOptions, memoised, resolve_partition
from distsim.sim.flow.recompute import MODES as RECOMPUTE
from distsim.sim.flow.recompute import eligible_layers, has_attention, recomputed_layers
from distsim.sim.flow.symmetry import resolve_placement
from distsim.sim.flow.templates import collective_count


def overlap_shadows(costs: CostSource) -> int:
    """1 if overlapped transfers put shadow tasks on compute streams (measured interference), else 0."""
    return int(any(costs.interference(scope)[0] > 0 for scope in ("intra", "inter")))


def estimate_tasks(
    model: Model, cluster: Cluster, strategy: Strategy, costs: CostSource, options: FlowOptions | None = None
) -> int:
    """How many tasks :func:`build_flow` would emit, counted from the strategy and the model in O(layers) without
    building anything: exact, or slightly above when some all-reduce moves no bytes (it is then left out)."""
    options = options or FlowOptions()
    placement, symmetric = resolve_placement(model, cluster, strategy, options, costs)
    dl, tl = (1, 1) if symmetric else (strategy.dp, strategy.tp)
    shadows = overlap_shadows(costs)
    blocks = [b for layer in model.layers for b in layer.blocks]
    sp = strategy.sequence_parallel
    tp_collectives = sum(collective_count(b, ph, strategy.tp, sp) for b in blocks for ph in "FB")
    sends = 2 * (strategy.num_stages - 1) * tl * (1 + (0 if options.p2p_blocking else shadows))
    per_micro_batch = dl * (2 * len(blocks) * tl + tp_collectives + sends)
    stage_ranges = resolve_partition(model, strategy, costs) if strategy.dp > 1 or strategy.recompute != "none" else ()
    mode = RECOMPUTE[strategy.recompute]

    def count(block: Block, phase: str) -> int:
        return collective_count(block, phase, strategy.tp, sp)

    eligible = eligible_layers(model, strategy.recompute) if strategy.recompute != "none" else ()
    recomputed: set[int] = set()
    for stage_range in stage_ranges if eligible else ():
        for i in recomputed_layers(model, strategy, stage_range, eligible):
            recomputed.add(i)
            compute, collectives = mode.extra_tasks(model.layers[i], count)
            per_micro_batch += dl * (compute * tl + collectives)  # each micro-batch passes every (virtual) stage once
    grads = 0
    sharding = SHARDINGS[strategy.optimizer_sharding]
    if strategy.dp > 1:
        for r in range(strategy.pp):
            held = set(rank_layers(stage_ranges, strategy.pp, r))
            during, after, overlapped = bucket_bound(model, strategy, held)
            grads += tl * (during + overlapped * dl * shadows + after)
            if sharding.gather_after_step:  # one parameter all-gather per bucket
                grads += tl * (during + after)
                if framework_of(costs).overlap_param_gather:  # beside the first forward: interference shadows
                    grads += tl * (during + after) * dl * shadows
            if sharding.gather_per_layer:  # every layer with parameters, before each forward and each backward
                gathered = sum(round(model.stored_params(i, held, strategy.tp) * model.precision.param_bytes) > 0
                               for i in held)  # fmt: skip
                for inst in placement.dp_groups(r)[:tl]:  # overlapped: shadows where its scope measured interference
                    shadow = int(costs.interference(inst.scope)[0] > 0)
                    grads += strategy.num_micro_batches * 2 * gathered * (1 + dl * shadow)
    per_micro_batch += _expert_parallel_tasks(model, strategy, dl, tl, recomputed)
    tied = sum(layer.tied_to is not None for layer in model.layers) * dl * tl
    optimizer = strategy.pp * dl * tl
    if models_host(options, model, cluster, strategy, costs):  # a launch per action and per optimizer step
        per_micro_batch += 2 * strategy.num_stages * dl * tl
        optimizer *= 2
    return strategy.num_micro_batches * per_micro_batch + grads + tied + optimizer


def _expert_parallel_tasks(model: Model, strategy: Strategy, dl: int, tl: int, recomputed: set[int]) -> int:
    """What expert and context parallelism add to a micro-batch's tasks. Each expert-parallel MoE block runs, per
    phase, three compute events instead of one on every simulated GPU and two all-to-alls per (group, tp rank); each
    context-parallel attention block one ring per (group, tp rank) and phase. The forward a full recomputation runs
    again (the layers `recomputed`) runs them once more."""
    total = 0
    for k, count, per_group, per_gpu in ((strategy.ep, lambda b: b.op == "moe", 2, 2),
                                         (strategy.cp, has_attention, 1, 0)):  # fmt: skip
        if k == 1:
            continue
        per_phase = per_gpu * dl * tl + per_group * max(1, dl // k) * tl
        blocks = [sum(bool(count(b)) for b in layer.blocks) for layer in model.layers]
        again = sum(blocks[i] for i in recomputed) if strategy.recompute == "full" else 0
        total += per_phase * (2 * sum(blocks) + again)
    return total


def bucket_bound(model: Model, strategy: Strategy, held: set[int]) -> tuple[int, int, int]:
    """(buckets issued during backward, buckets issued after it, buckets overlapped with backward: those issued
    during it but not after the rank's last backward, its first layer's) for a rank holding `held`, without costs:
    exact for modes that need none (bulk, wfbp, ddp, a given merge plan), the per-layer count as a bound otherwise.
    Answered once per question inside :func:`~distsim.sim.flow.events.shared_partitions` (a search asks it of every
    configuration's ranks)."""
    question = (tuple(sorted(held)), strategy.tp, strategy.grad_sync, strategy.bucket_cap_mb, strategy.grad_groups)
    return memoised("buckets", model, None, question, lambda: _bucket_bound(model, strategy, held))  # type: ignore[no-any-return]


def _bucket_bound(model: Model, strategy: Strategy, held: set[int]) -> tuple[int, int, int]:
    tensors = {i: tensor_bytes(model.stored_tensors(i, held, strategy.tp), model.precision.grad_bytes) for i in held}
    units = tuple(GradUnit(i, tensors[i]) for i in sorted(held, reverse=True))
    if MODES[strategy.grad_sync].planned and not strategy.grad_groups:
        count = sum(u.nbytes > 0 for u in units)
        return count, 0, count
    settings = SyncSettings.of(strategy.bucket_cap_mb, strategy.grad_groups)
    lowered = lower(strategy.grad_sync, SyncContext(units, lambda n: 0.0, None, settings))
    during = len(lowered.buckets) - len(lowered.at_end)
    overlapped = sum(b.ready is not None and b.ready != min(held) for b in lowered.buckets)
    return during, len(lowered.at_end), overlapped

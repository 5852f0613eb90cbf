"""What ``distsim execute`` runs of a strategy, decided before anything is launched (no torch here).

The executor runs activation recomputation ``none`` and ``full`` (:mod:`distsim.executor.recompute`) and optimizer
sharding ``none`` and ``zero1`` (:mod:`distsim.executor.zero`). Everything else the simulator models is refused with
one line rather than run as something else:

* ``recompute selective``: the blocks' attention runs as one module, so its core cannot be recomputed (and timed)
  on its own;
* ``sequence_parallel``: the blocks all-reduce over the tensor-parallel group (Megatron's f and g), they have no
  all-gather / reduce-scatter form;
* ``zero2`` and ``zero3``: the gradient buffer accumulates every micro-batch whole (ZeRO-2's saving), and the
  parameters stay resident (ZeRO-3 gathers them per layer);
* expert parallelism (``ep`` > 1): every rank holds every expert (:mod:`distsim.profiler.moe_block`), there is no
  token all-to-all;
* ``zero1`` with a tied embedding whose copies sit on different pipeline ranks: the copies' all-reduce follows the
  reduce-scatter (as the simulator orders it, after Megatron-LM's ``finalize_model_grads``), and then sums partial
  gradients of different data-parallel shards (Megatron-LM issue #844).

Burst plans run on ranks 0..N-1 (rank = GPU id) and need a model whose last layer computes the loss
(:func:`refuse_unsupported_burst`).
"""

from __future__ import annotations

from distsim.core.errors import DistsimError
from distsim.core.models.graph import Model
from distsim.core.partition import rank_layers
from distsim.core.strategy import Strategy
from distsim.plans import Plan
from distsim.plans.plan import format_devices

RECOMPUTE = ("none", "full")
SHARDING = ("none", "zero1")


def refuse_unsupported(model: Model, strategy: Strategy, stage_ranges: tuple[tuple[int, int], ...]) -> None:
    """Raise a one-line :class:`DistsimError` for a strategy field the executor does not run."""
    if strategy.ep > 1:
        raise DistsimError(f"distsim execute runs expert parallelism 1 only, not ep={strategy.ep} (every rank holds "
                           "every expert; distsim simulate models the all-to-alls)")  # fmt: skip
    if strategy.cp > 1:
        raise DistsimError(f"distsim execute runs whole sequences, not context parallelism cp={strategy.cp} "
                           "(distsim simulate models its ring attention)")  # fmt: skip
    if strategy.recompute not in RECOMPUTE:
        raise DistsimError(f"distsim execute runs --recompute {' or '.join(RECOMPUTE)}, not {strategy.recompute} "
                           "(its blocks run attention as one module; distsim simulate models selective)")  # fmt: skip
    if strategy.sequence_parallel:
        raise DistsimError("distsim execute does not run --sequence-parallel (its blocks all-reduce over the "
                           "tensor-parallel group; distsim simulate models it)")  # fmt: skip
    if strategy.optimizer_sharding not in SHARDING:
        raise DistsimError(f"distsim execute runs --optimizer-sharding {' or '.join(SHARDING)}, not "
                           f"{strategy.optimizer_sharding} (distsim simulate models it)")  # fmt: skip
    if strategy.optimizer_sharding != "none" and strategy.dp > 1 and split_tied(model, strategy, stage_ranges):
        raise DistsimError(f"distsim execute does not run {strategy.optimizer_sharding} with {model.name}'s tied "
                           "embedding on two pipeline ranks: the copies' all-reduce after the reduce-scatter would "
                           "sum partial gradients (Megatron-LM issue #844)")  # fmt: skip


def split_tied(model: Model, strategy: Strategy, stage_ranges: tuple[tuple[int, int], ...]) -> bool:
    """Whether a tied layer and the layer it is tied to sit on different pipeline ranks."""
    rank_of = {li: r for r in range(strategy.pp) for li in rank_layers(stage_ranges, strategy.pp, r)}
    return any(layer.tied_to is not None and rank_of[li] != rank_of[model.index[layer.tied_to]]
               for li, layer in enumerate(model.layers))  # fmt: skip


def refuse_unsupported_burst(model: Model, plan: Plan) -> None:
    """Raise a one-line :class:`DistsimError` for a burst plan the executor does not run: its ranks are its GPU ids
    (so they must be 0..N-1), and the batch's loss must be the last layer's (an LM head), which weights each rank's
    shard of it."""
    if plan.gpus != tuple(range(plan.num_gpus)):
        raise DistsimError(f"distsim execute runs a burst plan on ranks 0..N-1 as its GPUs; this one uses GPUs "
                           f"{format_devices(plan.gpus)} (renumber them from 0)")  # fmt: skip
    last = model.layers[-1]
    if last.blocks[-1].op != "lm_head":
        raise DistsimError(f"distsim execute runs burst plans of models whose last layer computes the loss (an LM "
                           f"head); {model.name} ends in {last.name} ({last.blocks[-1].op})")  # fmt: skip

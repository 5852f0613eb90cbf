"""Full activation recomputation on one executor rank (Megatron-LM's ``--recompute-granularity full``).

The layers it covers are the simulator's (:func:`distsim.sim.flow.recompute.recomputed_layers`, from
:func:`~distsim.sim.flow.recompute.eligible_layers`: the one rule). A covered layer runs under
``torch.utils.checkpoint`` with ``use_reentrant=True``, as Megatron-LM's own ``CheckpointFunction`` does: its forward
runs under ``torch.no_grad()`` keeping only the layer's inputs; when the micro-batch's backward call reaches the
layer, the checkpoint's backward runs the layer's blocks again with autograd (each recorded as an event of kind
``recompute`` on the compute stream; with tp > 1 the tensor-parallel all-reduces inside them run again, as ``tp``
rows) and then their backward, whose hooks (:mod:`distsim.executor.backward`) time each block: the recomputation
comes right before the layer's backward, exactly where the simulator puts it.

A reentrant checkpoint needs an input that requires a gradient to be part of the graph at all; a layer reading only
training data (a CNN's first layer) gets an empty one, so its parameters still get their gradients. The random state
is restored for the recomputation (``preserve_rng_state``), as ``torch.utils.checkpoint`` does by default.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from distsim.core.models.graph import Model
from distsim.core.strategy import Strategy
from distsim.sim.flow.recompute import recomputed_layers


def checkpointed(layer: Callable[[list[Tensor]], Tensor | None], inputs: list[Tensor], device: torch.device) -> Tensor:
    """`layer` on `inputs` (the activations it reads) under a reentrant checkpoint: its forward now without autograd,
    again (with autograd) when the backward call reaches it."""
    anchor = torch.empty(0, device=device, requires_grad=True)
    return checkpoint(lambda _anchor, *xs: layer(list(xs)), anchor, *inputs, use_reentrant=True)


def rank_recomputed(
    model: Model, strategy: Strategy, stage_ranges: tuple[tuple[int, int], ...], pipe_rank: int
) -> frozenset[int]:
    """The layers of a pipeline rank's (virtual) stages whose forward runs again before their backward."""
    return frozenset(li for vs in range(pipe_rank, len(stage_ranges), strategy.pp)
                     for li in recomputed_layers(model, strategy, stage_ranges[vs]))  # fmt: skip

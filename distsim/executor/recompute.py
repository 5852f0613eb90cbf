"""Full activation recomputation on one executor rank (Megatron-LM's ``--recompute-granularity full``).

The layers it covers are the simulator's (:func:`distsim.sim.flow.recompute.recomputed_layers`, from
:func:`~distsim.sim.flow.recompute.eligible_layers`: the one rule). A covered layer's forward runs under
``torch.no_grad()``: it keeps only the layer's inputs (the activations it reads and its training data) in a
:class:`Checkpoint`, and the leaf its consumers hold. Right before the layer's backward, the backward action runs the
layer's blocks again with autograd, each recorded as an event of kind ``recompute`` with the block's name on the
compute stream (with tp > 1 the tensor-parallel all-reduces inside them run again, as ``tp`` rows), exactly where the
simulator puts them; then the blocks' backward runs on the recomputed graph, the last block's output gradient taken
from the kept leaf. This is what ``torch.utils.checkpoint`` (``use_reentrant=False``) does, with the recomputation
run eagerly before the backward instead of lazily inside it, so that it is timed on its own.

The blocks have no dropout, so the recomputed forward is the forward without restoring random state; a BatchNorm
updates its running statistics once more (as under ``torch.utils.checkpoint``), which changes no training-mode
output.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from distsim.core.models.graph import Model
from distsim.core.strategy import Strategy
from distsim.sim.flow.recompute import recomputed_layers


@dataclass
class Checkpoint:
    """What a recomputed layer keeps between its forward and its backward on one micro-batch."""

    li: int
    inputs: list[Tensor]
    """The activations the layer reads (leaves its backward accumulates gradients into)."""
    feeds: dict[int, list[Tensor]]
    """Per block that reads training data: its token ids, targets or input."""
    output: Tensor | None
    """The leaf consumers of the layer's output hold (its .grad collects their gradients); None: the layer ends in
    the loss."""


def rank_recomputed(
    model: Model, strategy: Strategy, stage_ranges: tuple[tuple[int, int], ...], pipe_rank: int
) -> frozenset[int]:
    """The layers of a pipeline rank's (virtual) stages whose forward runs again before their backward."""
    return frozenset(li for vs in range(pipe_rank, len(stage_ranges), strategy.pp)
                     for li in recomputed_layers(model, strategy, stage_ranges[vs]))  # fmt: skip

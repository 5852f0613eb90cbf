"""Activation recomputation as a pass over a stage's backward template (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", Sec. 5).

A mode (:data:`MODES`; a new one is a class with :meth:`RecomputeMode.backward` and :meth:`RecomputeMode.extra_tasks`
and :func:`register`) rewrites the backward ops of each recomputed layer:

* ``full`` (Megatron-LM's ``--recompute-granularity full``): only a checkpointed layer's input is kept; right before
  the layer's backward its whole forward runs again, the same compute events and, with tp > 1, the same
  tensor-parallel collectives (Megatron checkpoints a TransformerLayer with its collectives inside), so the layer's
  backward takes recompute-forward + backward. The unit is the layer, as Megatron's checkpoint of a TransformerLayer
  (for a one-block layer the same as per block).
* ``selective`` (``--recompute-granularity selective``): only the attention core (Q K^T, softmax, its dropout, the
  product with V; with flash attention, the flash-attention kernel) runs again, right before the backward of the
  block that holds it. Its event is derived from the block's :class:`~distsim.core.models.ops.AttentionOp` kernels
  (:func:`attention_core`); a block that lists no kernels has no core to derive, and nothing is recomputed for it.
* ``none``.

Which layers (:func:`eligible_layers`, the one rule for time and memory): Megatron checkpoints the layers of its
TransformerBlock, never the embedding or the output layer, which the zoo marks not ``recomputable``; every layer of
a CNN or a hand-made chain is checkpointed, as ``torch.utils.checkpoint`` around each layer does; selective only
covers layers with attention. ``recompute_layers`` N recomputes only the first N checkpointed layers of each
(virtual) stage (Megatron's
``--recompute-method block --recompute-num-layers N``).

Recomputed forwards are tasks of their own kind (``recompute``) so that traces show them; a full recomputation's are
the same events (keys) as the forwards, so a profile measures them once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from distsim.core.models.graph import Block, Layer, Model
from distsim.core.models.ops import AttentionOp
from distsim.core.strategy import Strategy
from distsim.sim.flow.chain import StageOp
from distsim.sim.flow.events import K_FWD, K_RECOMPUTE

ATTENTION_BLOCKS = frozenset({"attention", "cross_attention"})
"""Block operators that are attention (Megatron's self- and cross-attention), with or without listed kernels."""


def has_attention(block: Block) -> bool:
    return block.op in ATTENTION_BLOCKS or any(isinstance(op, AttentionOp) for op in block.ops)


def attention_core(block: Block) -> Block | None:
    """The block's attention core as a block of its own: its attention kernels, split over tp as the block is; None
    when it lists none (a block without ops, or without attention)."""
    core = tuple(op for op in block.ops if isinstance(op, AttentionOp))
    if not core:
        return None
    return Block(op=f"{block.op}.core", shape=block.shape, tp=block.tp, ops=core)


def eligible_layers(model: Model, mode: str) -> tuple[bool, ...]:
    """Per layer, whether recomputation in `mode` may cover it: the layers marked ``recomputable`` (the zoo marks
    the embedding and the output layer not, as Megatron checkpoints only its TransformerBlock's layers; every layer
    of a CNN or a model file is, unless the file says otherwise), and for selective only those with attention.
    The one rule for time (this module) and memory (:mod:`distsim.sim.memory`)."""
    if mode == "selective":
        return tuple(layer.recomputable and any(has_attention(b) for b in layer.blocks) for layer in model.layers)
    return tuple(layer.recomputable for layer in model.layers)


def recomputed_layers(
    model: Model, strategy: Strategy, stage_range: tuple[int, int], eligible: Sequence[bool] | None = None
) -> frozenset[int]:
    """The layers of a (virtual) stage's range [start, end) whose backward the strategy's recomputation rewrites;
    `eligible`: :func:`eligible_layers` of the model, when the caller has it."""
    if strategy.recompute == "none":
        return frozenset()
    eligible = eligible_layers(model, strategy.recompute) if eligible is None else eligible
    layers = [i for i in range(*stage_range) if eligible[i]]
    return frozenset(layers if strategy.recompute_layers is None else layers[: strategy.recompute_layers])


@dataclass(frozen=True)
class LayerOps:
    """One layer's ops in a stage template, as a recomputation mode sees them."""

    index: int
    forward: tuple[tuple[StageOp, ...], ...]
    """Per block in forward order: its forward ops (compute and tensor-parallel collectives)."""
    backward: tuple[tuple[StageOp, ...], ...]
    """Per block in backward order (the last block first): its backward ops."""
    cores: tuple[StageOp | None, ...] = ()
    """Per block in backward order: the recompute of its attention core (None: it has none); filled only for modes
    that ask for them (:attr:`RecomputeMode.uses_cores`)."""


class RecomputeMode(Protocol):
    name: str
    summary: str
    uses_cores: bool

    def backward(self, layer: LayerOps) -> list[StageOp]:
        """The layer's backward ops with its recomputation."""
        ...

    def extra_tasks(self, layer: Layer, collectives: Callable[[Block, str], int]) -> tuple[int, int]:
        """(compute tasks, tensor-parallel collectives) the recomputation adds to one backward of `layer`, for the
        flow's size estimate; `collectives(block, phase)` counts a block's collectives in a phase."""
        ...


MODES: dict[str, RecomputeMode] = {}


def register(mode: RecomputeMode) -> RecomputeMode:
    MODES[mode.name] = mode
    return mode


def _flat(ops: Sequence[Sequence[StageOp]]) -> list[StageOp]:
    return [op for part in ops for op in part]


@dataclass(frozen=True)
class NoRecompute:
    name: str = "none"
    summary: str = "every activation is kept for backward"
    uses_cores: bool = False

    def backward(self, layer: LayerOps) -> list[StageOp]:
        return _flat(layer.backward)

    def extra_tasks(self, layer: Layer, collectives: Callable[[Block, str], int]) -> tuple[int, int]:
        return 0, 0


@dataclass(frozen=True)
class Full:
    name: str = "full"
    summary: str = "each layer's forward (with its tensor-parallel collectives) runs again before its backward"
    uses_cores: bool = False

    def backward(self, layer: LayerOps) -> list[StageOp]:
        again = [replace(op, kind=K_RECOMPUTE) if op.kind == K_FWD else op for op in _flat(layer.forward)]
        return again + _flat(layer.backward)

    def extra_tasks(self, layer: Layer, collectives: Callable[[Block, str], int]) -> tuple[int, int]:
        return len(layer.blocks), sum(collectives(b, "F") for b in layer.blocks)


@dataclass(frozen=True)
class Selective:
    name: str = "selective"
    summary: str = "the attention core's forward runs again before its block's backward"
    uses_cores: bool = True

    def backward(self, layer: LayerOps) -> list[StageOp]:
        out: list[StageOp] = []
        for core, ops in zip(layer.cores, layer.backward, strict=True):
            if core is not None:
                out.append(core)
            out += ops
        return out

    def extra_tasks(self, layer: Layer, collectives: Callable[[Block, str], int]) -> tuple[int, int]:
        return sum(attention_core(b) is not None for b in layer.blocks), 0


for _mode in (NoRecompute(), Selective(), Full()):
    register(_mode)

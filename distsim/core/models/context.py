"""Context parallelism: each sequence split over cp GPUs (Megatron-Core with Transformer Engine's ring attention).

Every rank of a context-parallel group holds s/cp of each sequence's tokens, in two chunks (chunk i and chunk
2cp-1-i of 2cp, so that every rank gets as much of the causal triangle: Megatron's ``get_batch_on_this_cp_rank``).
Everything that works token by token (the GEMMs, norms, the LM head, the experts) runs on s/cp tokens; attention
runs its s/cp queries against all s keys, whose chunks pass around the ring (the flow's ``cp_ring`` op, overlapped
with the attention of the chunk at hand), and the causal mask leaves each rank half of that rectangle: a core of s/cp
queries against s/2 keys, unmasked. Kept activations divide by cp as well (the attention statistics are per query).

:func:`split_context` gives the model as one rank of a context-parallel group sees it: the simulator runs that.
"""

from __future__ import annotations

from dataclasses import replace

from distsim.core.errors import StrategyError
from distsim.core.models.graph import Block, Layer, Model
from distsim.core.models.moe import shard_experts
from distsim.core.models.ops import AttentionOp, GemmOp, MemoryOp, Op


def context_problem(model: Model, cp: int) -> str | None:
    """Why `model` cannot be split over a context-parallel group of `cp`, or None."""
    if cp == 1:
        return None
    s = model.seq_len
    blocks = [b for layer in model.layers for b in layer.blocks]
    if not s or not any(any(isinstance(op, AttentionOp) for op in b.ops) for b in blocks):
        return f"cp={cp} splits the sequences of a transformer; {model.name} has no attention to split"
    if any(b.op == "cross_attention" for b in blocks):
        return f"cp={cp}: context parallelism of an encoder-decoder ({model.name}) is not modelled"
    if any(op.impl != "flash" for b in blocks for op in b.ops if isinstance(op, AttentionOp)):
        return f"cp={cp} runs ring attention, a flash kernel; {model.name} states stored-score attention"
    if s % (2 * cp):
        return f"cp={cp}: the sequence ({s}) must split into 2 x cp = {2 * cp} equal chunks"
    return None


def split_context(model: Model, cp: int) -> Model:
    """The model as one rank of a context-parallel group of `cp` holds each sequence (see the module docstring);
    cp = 1, or a model already split: the model itself."""
    if cp == 1 or any(("cp", cp) in b.shape for layer in model.layers for b in layer.blocks):
        return model
    problem = context_problem(model, cp)
    if problem:
        raise StrategyError(problem)
    s = model.seq_len
    assert s is not None
    return model.with_layers(tuple(_layer(layer, s, cp) for layer in model.layers))


def _layer(layer: Layer, s: int, cp: int) -> Layer:
    return replace(layer, blocks=tuple(_block(b, s, cp) for b in layer.blocks), out_bytes=layer.out_bytes / cp,
                   saved_bytes=layer.saved_bytes / cp, saved_sharded_bytes=layer.saved_sharded_bytes / cp,
                   saved_core_bytes=layer.saved_core_bytes / cp, saved_sp_bytes=layer.saved_sp_bytes / cp)  # fmt: skip


def _block(block: Block, s: int, cp: int) -> Block:
    shape = (*((k, v // cp if k == "seq" else v) for k, v in block.shape), ("cp", cp))
    return replace(block, shape=shape, ops=tuple(_op(op, s, cp) for op in block.ops), fwd_flops=0.0, io_bytes=0.0,
                   tp_fwd_allreduce_bytes=block.tp_fwd_allreduce_bytes / cp,
                   tp_bwd_allreduce_bytes=block.tp_bwd_allreduce_bytes / cp)  # fmt: skip


def _op(op: Op, s: int, cp: int) -> Op:
    if isinstance(op, GemmOp):
        return replace(op, m=op.m // cp)
    if isinstance(op, AttentionOp):  # s/cp queries; the causal mask leaves half of the s keys, balanced
        return replace(op, q_len=op.q_len // cp, kv_len=op.kv_len // 2 if op.causal else op.kv_len, causal=False)
    assert isinstance(op, MemoryOp)
    return replace(op, bytes=op.bytes / cp, flops=op.flops / cp)


def rank_view(model: Model, ep: int = 1, cp: int = 1) -> Model:
    """The model as one GPU runs it: its share of the experts (expert parallelism) and of each sequence (context
    parallelism)."""
    return split_context(shard_experts(model, ep), cp)

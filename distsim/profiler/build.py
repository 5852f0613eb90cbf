"""Building a block's torch module: the class of its op (:mod:`distsim.profiler.blocks`), or of its architecture
where its shape carries one (:mod:`distsim.profiler.llama_blocks`: grouped-query attention, SwiGLU, RMSNorm, rope, no
biases), or the mixture-of-experts block's (:mod:`distsim.profiler.moe_block`), at a tensor-parallel shard,
initialised."""

from __future__ import annotations

import torch

from distsim.core.models.graph import Block
from distsim.profiler.blocks import _MODULES, SUPPORTED_OPS, AttentionModule, BlockModule
from distsim.profiler.llama_blocks import arch_module
from distsim.profiler.moe_block import MoEModule
from distsim.profiler.tp_comm import TPComm


def build_problem(block: Block) -> str | None:
    """Why :func:`build_block` cannot build this block (by its op and given time alone), or None."""
    if block.has_given_time:
        return f"block {block.op!r} has a given time (fwd_s/bwd_s), so there is nothing to build or profile"
    if block.op not in SUPPORTED_OPS:
        return f"no torch module for block op {block.op!r} (supported: {', '.join(SUPPORTED_OPS)})"
    return None


def build_block(
    block: Block,
    tp: int = 1,
    tp_rank: int = 0,
    comm: TPComm | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    *,
    generator: torch.Generator | None = None,
) -> BlockModule:
    """The module of shard `tp_rank` of `tp` of `block` (tp=1: the whole block), parameters initialised by
    :meth:`BlockModule.reset_parameters` with `generator` (on `device`; None: the global RNG).

    A ``replicate`` block is built whole whatever tp is; a ``none`` block only with tp=1. Raises ValueError for ops
    without a module (``custom``, ``layer`` ...), given-time blocks, shapes that do not match the op, params that
    differ from the module's, and tp degrees that do not divide the split dimension.
    """
    problem = build_problem(block)
    if problem is not None:
        raise ValueError(problem)
    if tp < 1 or not 0 <= tp_rank < tp:
        raise ValueError(f"bad tensor-parallel rank {tp_rank} of {tp}")
    if block.tp == "none" and tp > 1:
        raise ValueError(f"block {block.op!r} has no tensor-parallel split (tp='none'), so it needs tp=1, not {tp}")
    if block.tp != "shard":
        tp, tp_rank = 1, 0
    dev = torch.device(device)
    comm = comm if comm is not None else TPComm.local()
    arch = arch_module(block)
    module: BlockModule
    if block.op == "moe":
        module = MoEModule(block, tp, tp_rank, comm, dtype, dev)
    elif arch is not None:
        module = arch(block, tp, tp_rank, comm, dtype, dev)
    elif block.op in ("attention", "cross_attention"):
        module = AttentionModule(block, tp, tp_rank, comm, dtype, dev, cross=block.op == "cross_attention")
    else:
        module = _MODULES[block.op](block, tp, tp_rank, comm, dtype, dev)
    module.reset_parameters(generator)
    return module


def can_build(block: Block) -> bool:
    return build_problem(block) is None

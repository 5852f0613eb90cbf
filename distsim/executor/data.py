"""Synthetic, reproducible training data: each sample is generated from (seed, iteration, layer, block, sample).

So a sample's tokens and targets are the same whichever rank, replica or micro-batch processes it, and the
single-process reference sees exactly the data the distributed run saw.
"""

from __future__ import annotations

import torch
from torch import Tensor

from distsim.core.models.graph import Block
from distsim.executor.model import seeded


def sample(block: Block, seed: int, iteration: int, li: int, bi: int, index: int, dtype: torch.dtype) -> list[Tensor]:
    """The data inputs of one sample for a block that reads data (token ids, targets, or the input image)."""
    g = seeded(seed, iteration, li, bi, index)
    shape = dict(block.shape)
    if block.op == "embedding":
        return [torch.randint(0, shape["vocab"], (shape["seq"],), generator=g)]
    if block.op == "lm_head":
        return [torch.randint(0, shape["vocab"], (shape["seq"],), generator=g)]
    if block.op == "conv2d":
        return [torch.randn(shape["cin"], shape["hw"], shape["hw"], generator=g).to(dtype)]
    if block.op == "linear":
        return [torch.randn(shape["in"], generator=g).to(dtype)]
    raise ValueError(f"block op {block.op!r} does not read training data")


def batch(
    block: Block,
    seed: int,
    iteration: int,
    li: int,
    bi: int,
    samples: range,
    dtype: torch.dtype,
    device: torch.device,
) -> list[Tensor]:
    """The data inputs of a micro-batch (samples stacked on dimension 0)."""
    per_sample = [sample(block, seed, iteration, li, bi, s, dtype) for s in samples]
    return [torch.stack(parts).to(device) for parts in zip(*per_sample, strict=True)]

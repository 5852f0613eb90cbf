"""Example batches and modules for `distsim profile --torch-model tests.torch_helper:FUNCTION` (the tests' user code).

`make`: a tiny Hugging Face GPT-2 LM (needs transformers); `make_mlp`: a torch nn.Sequential of identical
Linear + ReLU blocks (`make_deep_mlp`: six of them); `make_plain`: no repeated blocks; the rest break the contract on
purpose.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

SEQ, VOCAB, BATCH = 32, 256, 2


def make() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    """GPT2LMHeadModel with 2 layers of width 64 and a batch of 2 x 32 tokens, labels included (so .loss is set)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()  # its warnings about the tiny vocabulary's special tokens
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=SEQ)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    return GPT2LMHeadModel(config), {"input_ids": ids, "labels": ids}


def make_mlp(width: int = 64, blocks: int = 3) -> tuple[nn.Module, torch.Tensor]:
    """Sequential(Linear, Sequential(Linear, ReLU) x blocks, Linear): the blocks repeat, the ends do not."""
    torch.manual_seed(0)
    body = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(blocks)]
    return nn.Sequential(nn.Linear(16, width), *body, nn.Linear(width, 4)), torch.randn(8, 16)


def make_deep_mlp() -> tuple[nn.Module, torch.Tensor]:
    """make_mlp with 6 blocks: more than a self-check chain holds."""
    return make_mlp(blocks=6)


def make_plain() -> tuple[nn.Module, torch.Tensor]:
    """No repeated blocks: Linear(16, 32), ReLU, Linear(32, 4)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)), torch.randn(8, 16)


def not_a_pair() -> Any:
    return nn.Linear(2, 2)


def raises() -> Any:
    raise ValueError("no data here\nsecond line")


NOT_CALLABLE = 3

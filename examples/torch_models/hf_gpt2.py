"""Hugging Face GPT-2 (``GPT2LMHeadModel``, SDPA attention) for ``distsim profile --torch-model``.

Builders (each returns the model on this machine's device in training mode and a fixed micro-batch of token ids with
labels, so that the output's ``.loss`` is the training loss):
  gpt2_medium             24 layers of 1024, 16 heads, seq 1024, vocabulary 50257, micro-batch 8 (GPU)
  gpt2_medium_recompute   the same with every layer checkpointed (full recomputation)
  toy, toy_recompute      2 layers of 64, 4 heads, seq 32, vocabulary 256, micro-batch 2 (CPU tests)
The repeated blocks distsim finds are ``transformer.h.0 .. h.N-1`` (``GPT2Block``); the embeddings are layer ``pre``,
the final norm and the tied LM head layer ``post``. Precision: see ``example_setup.py``.
"""

from __future__ import annotations

import torch
from example_setup import SEED, checkpoint_every_layer, device, dtype, quiet_transformers, token_ids
from torch import nn


def build(layers: int, hidden: int, heads: int, seq: int, vocab: int, batch: int, recompute: bool = False) -> tuple[
    nn.Module, dict[str, torch.Tensor]
]:  # fmt: skip
    """A seeded GPT2LMHeadModel of this shape, made on the device (no fp32 copy of a large model on the host)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    quiet_transformers()
    dev = device()
    torch.manual_seed(SEED)
    config = GPT2Config(n_layer=layers, n_embd=hidden, n_head=heads, n_positions=seq, vocab_size=vocab,
                        attn_implementation="sdpa")  # fmt: skip
    with dev:
        model = GPT2LMHeadModel(config)
    model = model.to(dtype(dev)).train()
    if recompute:
        checkpoint_every_layer(model)
    ids = token_ids(batch, seq, vocab, dev)
    return model, {"input_ids": ids, "labels": ids}


def gpt2_medium() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return build(24, 1024, 16, 1024, 50257, 8)


def gpt2_medium_recompute() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return build(24, 1024, 16, 1024, 50257, 8, recompute=True)


def toy() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return build(2, 64, 4, 32, 256, 2)


def toy_recompute() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return build(2, 64, 4, 32, 256, 2, recompute=True)

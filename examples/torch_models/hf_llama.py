"""A Llama-style Hugging Face model (``LlamaForCausalLM``: GQA, SwiGLU, RMSNorm, rope, SDPA) for ``--torch-model``.

Builders (each returns the model on this machine's device in training mode and a fixed micro-batch of token ids with
labels, so that the output's ``.loss`` is the training loss):
  llama_1b             Llama 3.2 1B's shape: 16 layers of 2048, 32 query heads sharing 8 key-value heads, SwiGLU of
                       8192, vocabulary 128256 (tied), seq 2048, micro-batch 4: about 1.24 B parameters, which with
                       AdamW states and activations fits one 80 GB H100 in bf16
  llama_1b_recompute   the same with every layer checkpointed (full recomputation)
  toy, toy_recompute   2 layers of 64, 4 query and 2 key-value heads, SwiGLU of 176, vocabulary 256, seq 32,
                       micro-batch 2 (CPU tests)
The repeated blocks distsim finds are ``model.layers.0 .. N-1`` (``LlamaDecoderLayer``); the embedding and the rotary
embedding are layer ``pre``, the final norm and the tied LM head layer ``post``. Precision: see ``example_setup.py``.
"""

from __future__ import annotations

import torch
from example_setup import SEED, checkpoint_every_layer, device, dtype, quiet_transformers, token_ids
from torch import nn


def build(layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, seq: int, vocab: int, batch: int,
          recompute: bool = False) -> tuple[nn.Module, dict[str, torch.Tensor]]:  # fmt: skip
    """A seeded LlamaForCausalLM of this shape, made on the device (no fp32 copy of a large model on the host)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    quiet_transformers()
    dev = device()
    torch.manual_seed(SEED)
    config = LlamaConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, intermediate_size=ffn, max_position_embeddings=seq,
                         vocab_size=vocab, tie_word_embeddings=True, rope_theta=500000.0,
                         attn_implementation="sdpa")  # fmt: skip
    with dev:
        model = LlamaForCausalLM(config)
    model = model.to(dtype(dev)).train()
    if recompute:
        checkpoint_every_layer(model)
    ids = token_ids(batch, seq, vocab, dev)
    return model, {"input_ids": ids, "labels": ids}


def llama_1b() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return build(16, 2048, 32, 8, 8192, 2048, 128256, 4)


def llama_1b_recompute() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return build(16, 2048, 32, 8, 8192, 2048, 128256, 4, recompute=True)


def toy() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return build(2, 64, 4, 2, 176, 32, 256, 2)


def toy_recompute() -> tuple[nn.Module, dict[str, torch.Tensor]]:
    return build(2, 64, 4, 2, 176, 32, 256, 2, recompute=True)

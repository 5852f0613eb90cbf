"""Torch modules of Llama-style blocks (grouped-query attention, RoPE, RMSNorm, SwiGLU, no biases) against their
Block descriptions: parameters and their registration order, tensor-parallel shards against the full module (two
ranks emulated by threads), the attention against a hand-written reference, and RoPE itself. Real torch, CPU, tiny."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from distsim import get_model
from distsim.core.models.arch import LLAMA
from distsim.core.models.graph import FP32, Block
from distsim.core.models.transformer import attention_block, mlp_block
from distsim.profiler.blocks import (
    AttentionModule,
    replicated_param_count,
    shard_param_count,
)
from distsim.profiler.build import build_block
from distsim.profiler.llama_blocks import apply_rope, rope_tables
from tests.tp_shards import backward, check_tp_shards, randomize

H, HEADS, KV, SEQ, FFN = 64, 8, 2, 16, 96
MBS = 2
GQA = replace(LLAMA, kv_heads=KV)
SPEC = f"llama3-8b:layers=1,hidden={H},heads={HEADS},kv_heads={KV},seq={SEQ},vocab=256,ffn={FFN},precision=fp32"


def _blocks() -> dict[str, Block]:
    model = get_model(SPEC)
    assert [b.op for layer in model.layers for b in layer.blocks] == ["embedding", "attention", "mlp", "lm_head"]
    return {b.op: b for layer in model.layers for b in layer.blocks}


BLOCKS = _blocks()


@pytest.mark.parametrize("op", list(BLOCKS))
def test_module_matches_block(op: str) -> None:
    block = BLOCKS[op]
    module = build_block(block)
    assert module.param_count() == block.params
    assert [p.numel() for _, p in module.named_parameters()] == [n for n, _ in block.tensors]
    assert [name in module.tp_split for name, _ in module.named_parameters()] == [s for _, s in block.tensors]
    assert replicated_param_count(block) == module.replicated_param_count() == block.replicated_params
    shard = build_block(block, 2, 1)
    assert shard.param_count() == shard_param_count(block, 2) == block.shard_params(2)
    inputs = module.example_inputs(MBS, torch.Generator().manual_seed(0))
    out = module(*inputs)
    assert torch.isfinite(out).all()
    backward(out)
    assert all(p.grad is not None for p in module.parameters())


# ------------------------------------------------------------------------------ tensor-parallel equivalence
@pytest.mark.parametrize("op", ["attention", "mlp", "lm_head"])
def test_tp2_shards_match_full_module(op: str) -> None:
    check_tp_shards(BLOCKS[op], 2, MBS)


def test_gqa_refuses_tp_that_splits_a_group() -> None:
    with pytest.raises(ValueError, match="tp=4 does not divide kv_heads=2"):
        build_block(BLOCKS["attention"], 4, 0)


# -------------------------------------------------------------------------------- the architecture itself
def test_attention_matches_hand_written_gqa_with_rope() -> None:
    """Per group [q of its heads, k, v] rows; RMSNorm; RoPE on q and k; query head i reads key/value head i // r."""
    module = build_block(BLOCKS["attention"], dtype=torch.float64)
    randomize(module)
    (x,) = module.example_inputs(MBS, torch.Generator().manual_seed(5))
    d, r = H // HEADS, HEADS // KV
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * module.ln.weight
    w = module.qkv.weight.view(KV, (r + 2) * d, H)
    wq, wk, wv = w[:, : r * d].reshape(HEADS * d, H), w[:, r * d : (r + 1) * d], w[:, (r + 1) * d :]
    q = (y @ wq.T).view(MBS, SEQ, HEADS, d)
    k, v = (y @ wk.reshape(KV * d, H).T).view(MBS, SEQ, KV, d), (y @ wv.reshape(KV * d, H).T).view(MBS, SEQ, KV, d)
    pos = torch.arange(SEQ, dtype=torch.float64)[:, None] / 10000 ** (torch.arange(0, d, 2) / d)
    cos, sin = torch.cat((pos, pos), -1).cos()[:, None], torch.cat((pos, pos), -1).sin()[:, None]
    rot = lambda t: t * cos + torch.cat((-t[..., d // 2 :], t[..., : d // 2]), -1) * sin  # noqa: E731
    q, k = rot(q), rot(k)
    k, v = k.repeat_interleave(r, dim=2), v.repeat_interleave(r, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(SEQ, SEQ, dtype=torch.bool).triu(1), float("-inf"))
    context = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), v).reshape(MBS, SEQ, H)
    torch.testing.assert_close(module(x), x + context @ module.proj.weight.T)


def test_swiglu_is_silu_gate_times_up() -> None:
    module = build_block(BLOCKS["mlp"], dtype=torch.float64)
    randomize(module)
    (x,) = module.example_inputs(MBS)
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * module.ln.weight
    gate, up = module.fc1.weight[0::2], module.fc1.weight[1::2]  # interleaved rows, tp-independent
    torch.testing.assert_close(module(x), x + (F.silu(y @ gate.T) * (y @ up.T)) @ module.fc2.weight.T)


def test_rope_rotates_pairs_by_position() -> None:
    cos, sin = rope_tables(4, 2, torch.device("cpu"))  # head_dim 2: one pair, angle = position
    x = torch.tensor([1.0, 0.0]).expand(1, 4, 1, 2)
    got = apply_rope(x, cos, sin)[0, :, 0]
    want = torch.stack([torch.cos(torch.arange(4.0)), torch.sin(torch.arange(4.0))], -1)
    torch.testing.assert_close(got, want)
    # in a block: token 0 (no rotation, attends to itself) is unchanged, later tokens are not
    with_rope = attention_block(H, HEADS, SEQ, FP32, arch=GQA)
    without = attention_block(H, HEADS, SEQ, FP32, arch=replace(GQA, position="learned"))
    a, b = build_block(with_rope), build_block(without)
    b.load_state_dict(a.state_dict())
    (x,) = a.example_inputs(MBS)
    out_a, out_b = a(x), b(x)
    torch.testing.assert_close(out_a[:, 0], out_b[:, 0])
    assert not torch.allclose(out_a[:, 1:], out_b[:, 1:])


def test_gpt_blocks_keep_their_modules() -> None:
    attn, mlp = build_block(attention_block(H, HEADS, SEQ, FP32)), build_block(mlp_block(H, FFN, SEQ, FP32))
    assert (type(attn), [n for n, _ in attn.named_parameters()], [n for n, _ in mlp.named_parameters()]) == (
        AttentionModule,
        ["ln.weight", "ln.bias", "qkv.weight", "qkv.bias", "proj.weight", "proj.bias"],
        ["ln.weight", "ln.bias", "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
    )

"""Torch modules for transformer blocks of other architectures than GPT's (:class:`~distsim.core.models.arch.Arch`:
Llama 2/3, Mistral, Qwen2 ...), read from the tags a block's shape carries where it differs from GPT:

* attention: ``kv_heads`` (grouped-query attention), ``rope`` (rotary position embeddings), ``rmsnorm``, ``bias=0``,
  ``dropout=0``;
* mlp: ``swiglu``, ``rmsnorm``, ``bias=0``, ``dropout=0``;
* lm_head: ``rmsnorm`` (the final norm).

A block without tags (GPT, BERT, T5) is built by :mod:`distsim.profiler.blocks` as before; :func:`arch_module` says
which class builds a tagged one (:func:`distsim.profiler.build.build_block` asks it first). The embedding of a
Llama-style model (``positions=0``, ``dropout=0``: the word table alone) is :class:`~distsim.profiler.blocks.
EmbeddingModule`'s T5 case. No module applies dropout (see :mod:`distsim.profiler.blocks`), so ``dropout=0`` changes
nothing here.

Layouts (tensor parallelism as Megatron's: column-parallel QKV and fc1 split on their output rows, row-parallel
output projections on their input columns, norms whole; every split tensor is cut into contiguous slices by
:func:`~distsim.profiler.blocks.shard_state_from_full`, so a layout must make each slice a shard's whole share):

* QKV (h -> (heads + 2 kv_heads) head_dim): per key/value group, the group's query heads then its key and its value
  head, ``[q_0 .. q_{r-1}, k, v]`` for r = heads / kv_heads, as Megatron's ``--group-query-attention``; a contiguous
  slice of tp is kv_heads / tp whole groups (tp must divide kv_heads). K and V reach their group's query heads
  through SDPA's ``enable_gqa`` (no copies). With kv_heads = heads the layout is GPT's ``[q, k, v]`` per head.
* RoPE: rotate-half form (GPT-NeoX, Hugging Face Llama; Su et al. 2021, "RoFormer"): the angle of position p and
  pair i is ``p / 10000^(2i / head_dim)``, pairs (x_i, x_{i + head_dim/2}); applied to Q and K before attention.
  cos and sin are buffers computed once (not parameters, not in the state dict).
* SwiGLU: ``silu(gate) * up`` then down (fc2, row-parallel). gate and up are one fused Linear ``fc1`` of 2 ffn
  outputs, as the analytic model's one ``fc1`` GEMM and one tensor in ``Block.tensors``; its rows interleave the two,
  ``[gate_0, up_0, gate_1, up_1, ...]``, so any contiguous slice holds whole (gate_j, up_j) pairs and a tp shard's
  ffn features line up with its slice of fc2's columns whatever tp is. (Megatron instead stores each rank's
  ``[gate_r; up_r]`` halves, a layout that depends on tp; the numbers are the same.)
* RMSNorm: ``torch.nn.RMSNorm`` (a scale, no bias; eps 1e-5, LayerNorm's default and Llama 2/3's).
* bias=0: no Linear has a bias, so the row-parallel output bias added after ``g`` disappears too.

Parameters are registered in ``Block.tensors``' order (norm scale [and bias], qkv/fc1 weight [and bias], proj/fc2
weight [and bias]); DDP bucketing of the executor compares the two.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import skip_init

from distsim.core.models.graph import Block
from distsim.profiler.blocks import BlockModule, LMHeadModule, _check_params, _dims, _divisible
from distsim.profiler.tp_comm import TPComm

ARCH_TAGS = ("kv_heads", "rope", "rmsnorm", "bias", "swiglu", "dropout")
"""Shape keys by which a block's architecture differs from GPT's (distsim.core.models.transformer._tags)."""
ROPE_BASE = 10000.0
RMSNORM_EPS = 1e-5


def arch_module(block: Block) -> type[BlockModule] | None:
    """The class that builds `block` if its shape carries architecture tags, else None (GPT's modules build it); an
    MLP always (GPT's is its GeLU, layer norm and biases case)."""
    shape = dict(block.shape)
    if block.op == "mlp":
        return ArchMLPModule
    if not any(k in shape for k in ARCH_TAGS):
        return None
    return {"attention": ArchAttentionModule, "mlp": ArchMLPModule, "lm_head": ArchLMHeadModule}.get(block.op)


def _flag(block: Block, key: str, default: int) -> bool:
    return bool(dict(block.shape).get(key, default))


def make_norm(block: Block, h: int, kw: dict[str, Any]) -> nn.Module:
    """RMSNorm (scale only) for a block tagged ``rmsnorm``, else LayerNorm (scale and bias); uninitialised."""
    if _flag(block, "rmsnorm", 0):
        return skip_init(nn.RMSNorm, h, eps=RMSNORM_EPS, **kw)
    return skip_init(nn.LayerNorm, h, **kw)


def norm_params(block: Block) -> int:
    return 1 if _flag(block, "rmsnorm", 0) else 2


def rope_tables(
    seq: int, head_dim: int, device: torch.device | str, dtype: torch.dtype = torch.float32, base: float = ROPE_BASE
) -> tuple[Tensor, Tensor]:
    """cos and sin, [seq, head_dim], of the rotate-half rotary embedding (computed in float64 on the CPU, once)."""
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float64), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(device=device, dtype=dtype), angles.sin().to(device=device, dtype=dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x [b, s, heads, head_dim] by position: x cos + rotate_half(x) sin, rotate_half(x) = [-x2, x1]."""
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos[: x.shape[1], None, :], sin[: x.shape[1], None, :]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class ArchAttentionModule(BlockModule):
    """Pre-norm causal self-attention with the residual, ``x + g(Wo · attn(rope(f(norm(x))))) [+ bo]``, of any
    architecture: grouped-query attention, RoPE, RMSNorm, no biases (the layouts: module docstring). Parameters
    (heads + 2 kv_heads) head_dim (h + bias) + h^2 + bias h + norm h, as ``attention_block`` counts them."""

    def __init__(
        self, block: Block, tp: int, tp_rank: int, comm: TPComm, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__(block, tp, tp_rank, comm, dtype, device)
        d = _dims(block, ("h", "heads", "seq"))
        h, heads = d["h"], d["heads"]
        kv = int(dict(block.shape).get("kv_heads", heads))
        _divisible(block, "h", h, heads, "heads")
        _divisible(block, "heads", heads, kv, "kv_heads")
        _divisible(block, "kv_heads", kv, tp)
        head_dim = h // heads
        self.rope = _flag(block, "rope", 0)
        if self.rope:
            _divisible(block, "head_dim", head_dim, 2, "rope's pairs")
        bias = _flag(block, "bias", 1)
        qkv = (heads + 2 * kv) * head_dim
        _check_params(block, qkv * h + h * h + bias * (qkv + h) + norm_params(block) * h)
        self.h, self.seq, self.head_dim = h, d["seq"], head_dim
        self.local_groups, self.group_heads = kv // tp, heads // kv
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.ln = make_norm(block, h, kw)
        self.qkv = skip_init(nn.Linear, h, qkv // tp, bias=bias, **kw)
        self.proj = skip_init(nn.Linear, h // tp, h, bias=bias, **kw)
        self.tp_split.update({"qkv.weight": 0, "proj.weight": 1} | ({"qkv.bias": 0} if bias else {}))
        if self.rope:
            cos, sin = rope_tables(self.seq, head_dim, device, dtype)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        b, s, _ = x.shape
        g, r, d = self.local_groups, self.group_heads, self.head_dim
        qkv = self.qkv(self.comm.f(self.ln(x))).view(b, s, g, (r + 2) * d)
        q, k, v = qkv.split((r * d, d, d), dim=-1)
        q = q.reshape(b, s, g * r, d)  # head j of group i is query head i r + j
        if self.rope:
            q, k = apply_rope(q, self.rope_cos, self.rope_sin), apply_rope(k, self.rope_cos, self.rope_sin)
        context = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=r > 1
        )
        out = self.comm.g(F.linear(context.transpose(1, 2).reshape(b, s, g * r * d), self.proj.weight))
        return x + out if self.proj.bias is None else x + out + self.proj.bias

    def example_inputs(self, micro_batch_size: int, generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        return (self._randn((micro_batch_size, self.seq, self.h), self._gen(generator)),)


class ArchMLPModule(BlockModule):
    """Pre-norm MLP with the residual, ``x + g(W2 · act(W1 · f(norm(x)) [+ b1])) [+ b2]``: act GeLU, or SwiGLU
    (``silu(gate) * up`` of fc1's interleaved rows: module docstring); W1 column-, W2 row-parallel. Parameters
    (up + ffn) h + bias (up + h) + norm h with up = 2 ffn for SwiGLU, ffn for GeLU, as ``mlp_block`` counts them."""

    def __init__(
        self, block: Block, tp: int, tp_rank: int, comm: TPComm, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__(block, tp, tp_rank, comm, dtype, device)
        d = _dims(block, ("h", "ffn", "seq"))
        h, ffn = d["h"], d["ffn"]
        _divisible(block, "ffn", ffn, tp)
        self.swiglu = _flag(block, "swiglu", 0)
        bias = _flag(block, "bias", 1)
        up = 2 * ffn if self.swiglu else ffn
        _check_params(block, (up + ffn) * h + bias * (up + h) + norm_params(block) * h)
        self.h, self.seq = h, d["seq"]
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.ln = make_norm(block, h, kw)
        self.fc1 = skip_init(nn.Linear, h, up // tp, bias=bias, **kw)
        self.fc2 = skip_init(nn.Linear, ffn // tp, h, bias=bias, **kw)
        self.tp_split.update({"fc1.weight": 0, "fc2.weight": 1} | ({"fc1.bias": 0} if bias else {}))

    def forward(self, x: Tensor) -> Tensor:
        y = self.fc1(self.comm.f(self.ln(x)))
        if self.swiglu:
            gate, up = y.unflatten(-1, (-1, 2)).unbind(-1)
            y = F.silu(gate) * up
        else:
            y = F.gelu(y)
        out = self.comm.g(F.linear(y, self.fc2.weight))
        return x + out if self.fc2.bias is None else x + out + self.fc2.bias

    def example_inputs(self, micro_batch_size: int, generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        return (self._randn((micro_batch_size, self.seq, self.h), self._gen(generator)),)


class ArchLMHeadModule(LMHeadModule):
    """:class:`~distsim.profiler.blocks.LMHeadModule` whose final norm is RMSNorm (``rmsnorm``): parameters
    vocab h + h."""

    def __init__(
        self, block: Block, tp: int, tp_rank: int, comm: TPComm, dtype: torch.dtype, device: torch.device
    ) -> None:
        BlockModule.__init__(self, block, tp, tp_rank, comm, dtype, device)
        d = _dims(block, ("vocab", "h", "seq"))
        vocab, h = d["vocab"], d["h"]
        _divisible(block, "vocab", vocab, tp)
        _check_params(block, vocab * h + norm_params(block) * h)
        self.vocab, self.h, self.seq = vocab, h, d["seq"]
        self.vocab_start = tp_rank * (vocab // tp)
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.ln = make_norm(block, h, kw)
        self.proj = skip_init(nn.Linear, h, vocab // tp, bias=False, **kw)
        self.tp_split["proj.weight"] = 0

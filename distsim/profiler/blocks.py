"""Torch modules for the simulator's :class:`~distsim.core.models.graph.Block` descriptions.

One module per block, usable for profiling one tensor-parallel shard (the collectives are separate events, so the
hooks do nothing: :meth:`~distsim.profiler.tp_comm.TPComm.local`) and by a real executor (its process-group hooks run
the collectives with ``torch.distributed``; :mod:`distsim.profiler.tp_comm`).

Tensor parallelism follows Megatron-LM (Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion Parameter Language
Models Using Model Parallelism", Sec. 3 and Fig. 3): a column-parallel linear layer (output features split over the
tp ranks) is preceded by the operator ``f`` (identity forward, all-reduce of the gradient backward); a row-parallel
linear layer (input features split) is followed by ``g`` (all-reduce forward, identity backward) and its bias is
added once, after ``g``. Attention heads are split over the ranks; LayerNorms are replicated; the vocabulary rows of
the token embedding and of the LM head are split (Megatron's ``VocabParallelEmbedding`` and
``_VocabParallelCrossEntropy``).

Parameter counts
----------------
A module built with ``tp=1`` has exactly ``block.params`` parameters. One of ``tp > 1`` shards of a ``shard`` block
holds ``shard_param_count(block, tp) = (block.params - R) / tp + R`` parameters, where
``R = replicated_param_count(block)`` are the parameters Megatron keeps in full on every tp rank:

* attention, cross_attention, mlp: the LayerNorm weight and bias and the row-parallel output bias, ``R = 3h``
  (RMSNorm: a scale alone; ``bias=0``: no output bias);
* embedding: the learned position embedding, ``R = seq * h`` (0 without positions, as T5's and Llama's embeddings);
* lm_head: the final LayerNorm, ``R = 2h`` (RMSNorm: ``h``);
* moe: its norm, the router (h x experts) and each expert's row-parallel output bias
  (:mod:`distsim.profiler.moe_block`).

Blocks of other architectures (Llama's grouped-query attention, RoPE, RMSNorm, SwiGLU, no biases) are built by
:mod:`distsim.profiler.llama_blocks`.

Deliberate simplifications (cost matters here, not the exact training recipe): no dropout, pre-LayerNorm transformer
blocks (GPT-2 / Megatron), causal self-attention, the fused kernels Megatron may use (bias-GeLU, bias-dropout-add,
fused LayerNorm) run as separate torch ops.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import skip_init

from distsim.core.errors import ModelFileError
from distsim.core.models.graph import Block
from distsim.profiler.tp_comm import TPComm, VocabParallelCrossEntropy

TRANSFORMER_OPS = ("attention", "cross_attention", "mlp", "embedding", "lm_head")
MOE_OPS = ("moe",)
"""Built by :mod:`distsim.profiler.moe_block` (expert parallelism 1)."""
CNN_OPS = ("conv2d", "maxpool", "avgpool", "linear", "concat", "bottleneck")
SUPPORTED_OPS = TRANSFORMER_OPS + MOE_OPS + CNN_OPS
"""Block ops :func:`distsim.profiler.build.build_block` can build."""


def torch_dtype(precision_name: str, device: torch.device | str) -> torch.dtype:
    """The torch dtype a precision computes in: fp32 -> float32; fp16-mixed -> float16 on accelerators, bfloat16 on
    CPU (CPU fp16 matmuls are slow and would not represent half-precision training); bf16-mixed -> bfloat16."""
    if precision_name == "fp32":
        return torch.float32
    if precision_name == "fp16-mixed":
        return torch.bfloat16 if torch.device(device).type == "cpu" else torch.float16
    if precision_name == "bf16-mixed":
        return torch.bfloat16
    raise ModelFileError(f"the profiler and executor run fp32, fp16-mixed or bf16-mixed, not {precision_name}: "
                         "fp8 (Transformer Engine) is simulated only")  # fmt: skip


# ---------------------------------------------------------------------------------------------------- modules
def _dims(block: Block, keys: tuple[str, ...]) -> dict[str, int]:
    shape = dict(block.shape)
    missing = [k for k in keys if k not in shape]
    if missing:
        raise ValueError(
            f"cannot build a {block.op!r} block: its shape needs {', '.join(keys)} (missing {', '.join(missing)})"
        )
    return {k: int(shape[k]) for k in keys}


def _check_params(block: Block, expected: int) -> None:
    if block.params != expected:
        raise ValueError(
            f"cannot build a {block.op!r} block [{block.shape_str()}]: its params ({block.params}) differ from the "
            f"{expected} of the torch module"
        )


def _divisible(block: Block, what: str, value: int, by: int, by_what: str = "tp") -> None:
    if value % by:
        raise ValueError(f"cannot build a {block.op!r} block: {by_what}={by} does not divide {what}={value}")


def _padding(block: Block, hw: int, out_hw: int, k: int, stride: int) -> int:
    """The smallest padding for which a window of k with this stride maps hw to out_hw (PyTorch's floor mode)."""
    for pad in range(k):
        if (hw + 2 * pad - k) // stride + 1 == out_hw:
            return pad
    raise ValueError(f"cannot build a {block.op!r} block: no padding maps {hw} to {out_hw} with k={k}, stride={stride}")


class BlockModule(nn.Module):
    """A torch module for one block (or one tp shard of it).

    ``forward(*inputs)`` takes what :meth:`example_inputs` makes; it returns the block's output activation, or the
    scalar mean loss for ``lm_head``. ``tp_split`` maps each tensor-parallel parameter name to the dimension that is
    split over the tp ranks; parameters not listed are replicated. Names are the same in a full module and a shard.
    """

    def __init__(
        self, block: Block, tp: int, tp_rank: int, comm: TPComm, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__()
        self.block = block
        self.tp = tp
        self.tp_rank = tp_rank
        self.comm = comm
        self.dtype = dtype
        self.device = device
        self.tp_split: dict[str, int] = {}

    # --------------------------------------------------------------------------------------------- parameters
    def param_count(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def replicated_param_count(self) -> int:
        """Parameters this module holds in full whatever tp is (LayerNorms, row-parallel bias, positions)."""
        return sum(p.numel() for name, p in self.named_parameters() if name not in self.tp_split)

    @torch.no_grad()
    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Linear and conv weights ~ N(0, 1/fan_in) (activations stay O(1), so half-precision timings meet no
        overflow or denormals), embeddings ~ N(0, 0.02^2) (Megatron), biases 0, norms weight 1 / bias 0."""
        for m in self.modules():
            if isinstance(m, nn.Linear | nn.Conv2d):
                fan_in = m.weight[0].numel()
                nn.init.normal_(m.weight, 0.0, 1.0 / math.sqrt(fan_in), generator=generator)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, 0.0, 0.02, generator=generator)
            elif isinstance(m, nn.LayerNorm | nn.RMSNorm | nn.BatchNorm2d):
                m.reset_parameters()

    # ------------------------------------------------------------------------------------------------- inputs
    def example_inputs(self, micro_batch_size: int, generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        """Inputs of the right shapes for `micro_batch_size` samples: activations (which require grad, as they would
        inside a network), token ids and targets (which do not). `generator` (on the module's device or the CPU)
        makes them reproducible; None uses a fresh one seeded with 0."""
        raise NotImplementedError

    def _gen(self, generator: torch.Generator | None) -> torch.Generator:
        return generator if generator is not None else torch.Generator(device=self.device).manual_seed(0)

    def _randn(self, shape: tuple[int, ...], generator: torch.Generator, requires_grad: bool = True) -> Tensor:
        t = torch.randn(shape, generator=generator, device=generator.device, dtype=torch.float32)
        return t.to(device=self.device, dtype=self.dtype).requires_grad_(requires_grad)

    def _randint(self, high: int, shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
        t = torch.randint(0, high, shape, generator=generator, device=generator.device, dtype=torch.int64)
        return t.to(self.device)


class AttentionModule(BlockModule):
    """Pre-LN self-attention (causal) or cross-attention with the residual: ``x + g(Wo · attn(f(LN(x)))) + bo``.

    Self-attention: one column-parallel QKV projection (h -> 3h, bias), laid out per head as [q, k, v] like Megatron
    so a contiguous row slice is a set of whole heads. Cross-attention: Q (h -> h) from the decoder state, K and V
    (h -> 2h, per head [k, v]) from the encoder output, which passes its own ``f`` (its gradient is all-reduced in
    backward too). The output projection is row-parallel. Parameters 4h^2 + 4h + 2h.
    """

    def __init__(
        self,
        block: Block,
        tp: int,
        tp_rank: int,
        comm: TPComm,
        dtype: torch.dtype,
        device: torch.device,
        cross: bool,
    ) -> None:
        super().__init__(block, tp, tp_rank, comm, dtype, device)
        d = _dims(block, ("h", "heads", "seq", "kv_seq") if cross else ("h", "heads", "seq"))
        h, heads = d["h"], d["heads"]
        _divisible(block, "h", h, heads, "heads")
        _divisible(block, "heads", heads, tp)
        _check_params(block, 4 * h * h + 4 * h + 2 * h)
        self.cross = cross
        self.h, self.seq, self.kv_seq = h, d["seq"], d.get("kv_seq", d["seq"])
        self.local_heads, self.head_dim = heads // tp, h // heads
        local = h // tp
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.ln = skip_init(nn.LayerNorm, h, **kw)
        if cross:
            self.q = skip_init(nn.Linear, h, local, **kw)
            self.kv = skip_init(nn.Linear, h, 2 * local, **kw)
            self.tp_split.update({"q.weight": 0, "q.bias": 0, "kv.weight": 0, "kv.bias": 0})
        else:
            self.qkv = skip_init(nn.Linear, h, 3 * local, **kw)
            self.tp_split.update({"qkv.weight": 0, "qkv.bias": 0})
        self.proj = skip_init(nn.Linear, local, h, **kw)
        self.tp_split["proj.weight"] = 1

    def forward(self, x: Tensor, encoder_out: Tensor | None = None) -> Tensor:
        b, s, _ = x.shape
        n, d = self.local_heads, self.head_dim
        y = self.comm.f(self.ln(x))
        if self.cross:
            if encoder_out is None:
                raise ValueError("cross_attention needs the encoder output as its second input")
            q = self.q(y).view(b, s, n, d)
            k, v = self.kv(self.comm.f(encoder_out)).view(b, encoder_out.shape[1], n, 2 * d).split(d, dim=-1)
        else:
            q, k, v = self.qkv(y).view(b, s, n, 3 * d).split(d, dim=-1)
        context = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=not self.cross
        )
        context = context.transpose(1, 2).reshape(b, s, n * d)
        return x + self.comm.g(F.linear(context, self.proj.weight)) + self.proj.bias

    def example_inputs(self, micro_batch_size: int, generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        gen = self._gen(generator)
        x = self._randn((micro_batch_size, self.seq, self.h), gen)
        if not self.cross:
            return (x,)
        return x, self._randn((micro_batch_size, self.kv_seq, self.h), gen)


class EmbeddingModule(BlockModule):
    """Vocab-parallel token embedding (Megatron's ``VocabParallelEmbedding``: ids outside this rank's rows look up
    row 0 and are zeroed, then ``g`` sums the ranks) plus a replicated learned position embedding when the block's
    params include it (vocab h + seq h; T5's embeddings have none: vocab h)."""

    def __init__(
        self, block: Block, tp: int, tp_rank: int, comm: TPComm, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__(block, tp, tp_rank, comm, dtype, device)
        d = _dims(block, ("vocab", "h", "seq"))
        vocab, h, seq = d["vocab"], d["h"], d["seq"]
        if block.params not in (vocab * h, vocab * h + seq * h):
            raise ValueError(
                f"cannot build an 'embedding' block [{block.shape_str()}]: params ({block.params}) are neither "
                f"vocab*h ({vocab * h}) nor vocab*h + seq*h ({vocab * h + seq * h})"
            )
        _divisible(block, "vocab", vocab, tp)
        self.vocab, self.h, self.seq = vocab, h, seq
        self.vocab_start = tp_rank * (vocab // tp)
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.word = skip_init(nn.Embedding, vocab // tp, h, **kw)
        self.pos = skip_init(nn.Embedding, seq, h, **kw) if block.params > vocab * h else None
        self.tp_split["word.weight"] = 0

    def forward(self, ids: Tensor) -> Tensor:
        if self.tp > 1:
            outside = (ids < self.vocab_start) | (ids >= self.vocab_start + self.word.num_embeddings)
            local = (ids - self.vocab_start).masked_fill(outside, 0)
            out = F.embedding(local, self.word.weight).masked_fill(outside.unsqueeze(-1), 0.0)
        else:
            out = F.embedding(ids, self.word.weight)
        out = self.comm.g(out)
        if self.pos is not None:
            out = out + self.pos(torch.arange(ids.shape[1], device=ids.device))
        return out

    def example_inputs(self, micro_batch_size: int, generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        return (self._randint(self.vocab, (micro_batch_size, self.seq), self._gen(generator)),)


class LMHeadModule(BlockModule):
    """Final LayerNorm, column-parallel projection to the (split) vocabulary without bias, vocab-parallel
    cross-entropy in fp32 (Megatron casts the logits to float), mean over tokens. ``forward(hidden, targets)``
    returns the scalar loss. Parameters vocab h + 2h."""

    def __init__(
        self, block: Block, tp: int, tp_rank: int, comm: TPComm, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__(block, tp, tp_rank, comm, dtype, device)
        d = _dims(block, ("vocab", "h", "seq"))
        vocab, h = d["vocab"], d["h"]
        _divisible(block, "vocab", vocab, tp)
        _check_params(block, vocab * h + 2 * h)
        self.vocab, self.h, self.seq = vocab, h, d["seq"]
        self.vocab_start = tp_rank * (vocab // tp)
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.ln = skip_init(nn.LayerNorm, h, **kw)
        self.proj = skip_init(nn.Linear, h, vocab // tp, bias=False, **kw)
        self.tp_split["proj.weight"] = 0

    def forward(self, x: Tensor, targets: Tensor) -> Tensor:
        logits = self.proj(self.comm.f(self.ln(x)))
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # half -> fp32, float64 stays
        loss = VocabParallelCrossEntropy.apply(logits, targets, self.vocab_start, self.comm)
        return loss.mean()

    def example_inputs(self, micro_batch_size: int, generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        gen = self._gen(generator)
        x = self._randn((micro_batch_size, self.seq, self.h), gen)
        return x, self._randint(self.vocab, (micro_batch_size, self.seq), gen)


class Conv2dModule(BlockModule):
    """Conv2d (bias when the block's params include it; cnn.py gives one only without BN) + BatchNorm2d if bn +
    ReLU. Padding per axis is the smallest that maps hw to out_hw."""

    def __init__(
        self, block: Block, tp: int, tp_rank: int, comm: TPComm, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__(block, tp, tp_rank, comm, dtype, device)
        d = _dims(block, ("cin", "cout", "kh", "kw", "stride", "hw", "out_hw", "bn"))
        cin, cout, kh, kw_, stride, hw, out_hw = (d[k] for k in ("cin", "cout", "kh", "kw", "stride", "hw", "out_hw"))
        bn = bool(d["bn"])
        weights, norm = cin * cout * kh * kw_, 2 * cout if bn else 0
        if block.params == weights + norm:
            bias = False
        elif block.params == weights + cout + norm:
            bias = True
        else:
            raise ValueError(
                f"cannot build a 'conv2d' block [{block.shape_str()}]: params ({block.params}) match neither "
                f"{weights + norm} (no bias) nor {weights + cout + norm} (with bias)"
            )
        pad = (_padding(block, hw, out_hw, kh, stride), _padding(block, hw, out_hw, kw_, stride))
        self.cin, self.hw = cin, hw
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.conv = skip_init(nn.Conv2d, cin, cout, (kh, kw_), stride=stride, padding=pad, bias=bias, **kw)
        self.bn = skip_init(nn.BatchNorm2d, cout, **kw) if bn else None

    def forward(self, x: Tensor) -> Tensor:
        y = self.conv(x)
        if self.bn is not None:
            y = self.bn(y)
        return F.relu(y, inplace=True)

    def example_inputs(self, micro_batch_size: int, generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        return (self._randn((micro_batch_size, self.cin, self.hw, self.hw), self._gen(generator)),)


class PoolModule(BlockModule):
    """Max or average pooling with a square window (shape c, k, stride, hw, out_hw; padding as for a conv; average
    pooling counts the padding, as torchvision's Inception does), or adaptive average pooling (no k)."""

    def __init__(
        self, block: Block, tp: int, tp_rank: int, comm: TPComm, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__(block, tp, tp_rank, comm, dtype, device)
        _check_params(block, 0)
        adaptive = block.op == "avgpool" and "k" not in dict(block.shape)
        d = _dims(block, ("c", "hw", "out_hw") if adaptive else ("c", "k", "stride", "hw", "out_hw"))
        self.c, self.hw = d["c"], d["hw"]
        self.pool: nn.Module
        if adaptive:
            self.pool = nn.AdaptiveAvgPool2d(d["out_hw"])
        else:
            k, stride = d["k"], d["stride"]
            pad = _padding(block, d["hw"], d["out_hw"], k, stride)
            self.pool = nn.MaxPool2d(k, stride, pad) if block.op == "maxpool" else nn.AvgPool2d(k, stride, pad)

    def forward(self, x: Tensor) -> Tensor:
        return self.pool(x)

    def example_inputs(self, micro_batch_size: int, generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        return (self._randn((micro_batch_size, self.c, self.hw, self.hw), self._gen(generator)),)


class LinearModule(BlockModule):
    """Fully-connected layer with bias + ReLU on the flattened input [b, in]."""

    def __init__(
        self, block: Block, tp: int, tp_rank: int, comm: TPComm, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__(block, tp, tp_rank, comm, dtype, device)
        d = _dims(block, ("in", "out"))
        _check_params(block, d["in"] * d["out"] + d["out"])
        self.fan_in = d["in"]
        self.fc = skip_init(nn.Linear, d["in"], d["out"], device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return F.relu(self.fc(x), inplace=True)

    def example_inputs(self, micro_batch_size: int, generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        return (self._randn((micro_batch_size, self.fan_in), self._gen(generator)),)


class ConcatModule(BlockModule):
    """torch.cat of `branches` NCHW tensors along channels; the c channels are split as evenly as possible (the
    first c % branches inputs get one more)."""

    def __init__(
        self, block: Block, tp: int, tp_rank: int, comm: TPComm, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__(block, tp, tp_rank, comm, dtype, device)
        _check_params(block, 0)
        d = _dims(block, ("c", "hw", "branches"))
        c, n = d["c"], d["branches"]
        if not 1 <= n <= c:
            raise ValueError(f"cannot build a 'concat' block: {n} branches for {c} channels")
        self.channels = tuple(c // n + (1 if i < c % n else 0) for i in range(n))
        self.hw = d["hw"]

    def forward(self, *branches: Tensor) -> Tensor:
        return torch.cat(branches, dim=1)

    def example_inputs(self, micro_batch_size: int, generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        gen = self._gen(generator)
        return tuple(self._randn((micro_batch_size, c, self.hw, self.hw), gen) for c in self.channels)


class BottleneckModule(BlockModule):
    """ResNet v1.5 bottleneck as torchvision's: 1x1 (cin -> width), 3x3 with the stride (width -> width), 1x1
    (width -> cout), BatchNorm after each, ReLU, residual; the projection (1x1 with the stride + BN) if downsample."""

    def __init__(
        self, block: Block, tp: int, tp_rank: int, comm: TPComm, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__(block, tp, tp_rank, comm, dtype, device)
        d = _dims(block, ("cin", "width", "cout", "stride", "hw", "downsample"))
        cin, width, cout, stride = d["cin"], d["width"], d["cout"], d["stride"]
        down = bool(d["downsample"])
        if not down and (stride != 1 or cin != cout):
            raise ValueError(
                f"cannot build a 'bottleneck' block [{block.shape_str()}]: without downsample it needs stride 1 "
                "and cin == cout"
            )
        params = cin * width + 9 * width * width + width * cout + 2 * (2 * width + cout)
        _check_params(block, params + ((cin * cout + 2 * cout) if down else 0))
        self.cin, self.hw = cin, d["hw"]
        kw: dict[str, Any] = {"device": device, "dtype": dtype, "bias": False}
        self.conv1 = skip_init(nn.Conv2d, cin, width, 1, **kw)
        self.bn1 = skip_init(nn.BatchNorm2d, width, device=device, dtype=dtype)
        self.conv2 = skip_init(nn.Conv2d, width, width, 3, stride=stride, padding=1, **kw)
        self.bn2 = skip_init(nn.BatchNorm2d, width, device=device, dtype=dtype)
        self.conv3 = skip_init(nn.Conv2d, width, cout, 1, **kw)
        self.bn3 = skip_init(nn.BatchNorm2d, cout, device=device, dtype=dtype)
        self.downsample = (
            nn.Sequential(
                skip_init(nn.Conv2d, cin, cout, 1, stride=stride, **kw),
                skip_init(nn.BatchNorm2d, cout, device=device, dtype=dtype),
            )
            if down
            else None
        )

    def forward(self, x: Tensor) -> Tensor:
        y = F.relu(self.bn1(self.conv1(x)), inplace=True)
        y = F.relu(self.bn2(self.conv2(y)), inplace=True)
        y = self.bn3(self.conv3(y))
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(y + identity, inplace=True)

    def example_inputs(self, micro_batch_size: int, generator: torch.Generator | None = None) -> tuple[Tensor, ...]:
        return (self._randn((micro_batch_size, self.cin, self.hw, self.hw), self._gen(generator)),)


_MODULES: dict[str, type[BlockModule]] = {
    "embedding": EmbeddingModule,
    "lm_head": LMHeadModule,
    "conv2d": Conv2dModule,
    "maxpool": PoolModule,
    "avgpool": PoolModule,
    "linear": LinearModule,
    "concat": ConcatModule,
    "bottleneck": BottleneckModule,
}


# ------------------------------------------------------------------------------------------------ tp sharding
def replicated_param_count(block: Block) -> int:
    """Parameters of `block` that every tp rank keeps in full (see the module docstring); all of them for blocks
    that are not ``shard``."""
    if block.tp != "shard":
        return block.params
    shape = dict(block.shape)
    norm = 1 if shape.get("rmsnorm") else 2  # RMSNorm's scale, LayerNorm's scale and bias
    if block.op in ("attention", "cross_attention", "mlp"):
        return (norm + (1 if shape.get("bias", 1) else 0)) * shape["h"]  # and the row-parallel output bias
    if block.op == "embedding":
        return block.params - shape["vocab"] * shape["h"]
    if block.op == "lm_head":
        return norm * shape["h"]
    if block.op == "moe":  # the norm, the router, and each expert's row-parallel output bias
        experts = shape["experts"]
        return (norm + experts * (1 if shape.get("bias", 1) else 0)) * shape["h"] + shape["h"] * experts
    raise ValueError(f"no tensor-parallel layout known for block op {block.op!r}")


def shard_param_count(block: Block, tp: int) -> int:
    """Exact parameters of one tp shard: (params - R) / tp + R with R = :func:`replicated_param_count`.
    :meth:`Block.shard_params` (params / tp) is smaller by R (1 - 1/tp)."""
    replicated = replicated_param_count(block)
    if block.tp != "shard" or tp == 1:
        return block.params
    return (block.params - replicated) // tp + replicated


def shard_state_from_full(
    full: BlockModule, tp: int, tp_rank: int, state: Mapping[str, Tensor] | None = None
) -> dict[str, Tensor]:
    """Slice a tp=1 module's state (or `state`, tensors named like it: its gradients, say) into shard `tp_rank` of
    `tp`: split parameters (``full.tp_split``) get their contiguous slice, everything else is copied. Load the result
    into ``distsim.profiler.build.build_block(full.block, tp, tp_rank, ...)`` with ``load_state_dict``."""
    if full.tp != 1:
        raise ValueError(f"shard_state_from_full needs a tp=1 module, not one of tp={full.tp}")
    if tp < 1 or not 0 <= tp_rank < tp:
        raise ValueError(f"bad tensor-parallel rank {tp_rank} of {tp}")
    source = full.state_dict() if state is None else state
    whole = tp == 1 or full.block.tp != "shard"  # a replicate block is built whole on every rank
    out: dict[str, Tensor] = {}
    for name, tensor in source.items():
        dim = full.tp_split.get(name)
        t = tensor.detach()
        if dim is None or whole:
            out[name] = t.clone()
            continue
        size = t.shape[dim]
        if size % tp:
            raise ValueError(f"{name}: dimension {dim} of size {size} does not split over tp={tp}")
        part = size // tp
        out[name] = t.narrow(dim, tp_rank * part, part).clone()
    return out

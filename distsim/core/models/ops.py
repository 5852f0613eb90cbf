"""Per-op description of a block: the kernels its forward pass runs, for the analytic cost model.

A block's ``ops`` are, like its ``fwd_flops`` and ``io_bytes`` (which are their sums), per sample of the whole
(unsharded) block; the cost model scales them to an event's micro-batch size and tensor-parallel shard. Three kinds:

* :class:`GemmOp`: ``out[m x n] = in[m x k] @ W[k x n]`` with ``m`` per sample (tokens, or output pixels of a
  convolution run as an implicit GEMM); tensor parallelism divides ``n`` (column-parallel) or ``k`` (row-parallel).
  Backward runs two GEMMs per forward GEMM: ``dX = dY W^T`` (m x k, inner n) and ``dW = X^T dY`` (k x n, inner m),
  the latter accumulated into the weight gradient.
* :class:`AttentionOp`: the attention core ``softmax(Q K^T / sqrt(d)) V``; tp divides the heads. Its ``impl`` (one of
  :data:`ATTENTION_IMPLS`) is the kernel that runs it and so also what it keeps for backward: ``flash`` one fused
  kernel that never writes the s x s scores, ``unfused`` and ``fused_softmax`` (Megatron-LM before flash attention)
  batched GEMMs around memory-bound kernels over the stored scores (:class:`ScoreKernel`).
* :class:`MemoryOp`: an element-wise or row-reduction kernel (layer norm, GeLU, dropout, bias + residual, embedding
  gather, softmax cross-entropy, batch norm, ReLU, pooling, concat) whose time is its bytes over memory bandwidth.

The transformer builders follow Megatron-LM's layer (Narayanan et al. 2021; Korthikanti et al. 2022, Sec. 4.1 for
which tensors each op reads and writes); the CNN builders run convolutions as implicit GEMMs (Chetlur et al. 2014,
"cuDNN: Efficient Primitives for Deep Learning", Sec. 3) followed by their batch-norm and ReLU kernels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar, Literal

from distsim.core.errors import ModelFileError

OpTP = Literal["shard", "replicate"]


def _check(op: object, name: str, values: dict[str, float]) -> None:
    for key, value in values.items():
        if not (math.isfinite(value) and value >= 0):
            raise ModelFileError(f"op {name!r}: {key} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True)
class GemmOp:
    """A matrix multiply (a linear layer, or a convolution as an implicit GEMM), per sample."""

    name: str
    m: int
    """Output rows per sample (tokens of the sequence, or output pixels H_out W_out of a convolution)."""
    n: int
    """Output columns (features out) of the unsharded op."""
    k: int
    """Inner dimension (features in; C_in k_h k_w for a convolution) of the unsharded op."""
    split: Literal["n", "k", "none"] = "none"
    """The dimension tensor parallelism divides: ``n`` column-parallel, ``k`` row-parallel, ``none`` replicated."""
    elem_bytes: int = 2
    """Bytes per element of the operands (2 for fp16/bf16)."""
    in_elems: float | None = None
    """Input elements per sample when the GEMM's input is implicit (a convolution's feature map rather than its
    im2col matrix); None: ``m k``."""

    kind: ClassVar[str] = "gemm"
    fwd_kernels: ClassVar[int] = 1
    bwd_kernels: ClassVar[int] = 2

    def __post_init__(self) -> None:
        _check(self, self.name, {"m": self.m, "n": self.n, "k": self.k, "elem_bytes": self.elem_bytes})
        if self.split not in ("n", "k", "none"):
            raise ModelFileError(f"op {self.name!r}: split must be n, k or none, not {self.split!r}")

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @property
    def bytes(self) -> float:
        """Activation bytes per sample: the input read and the output written (weights are per event)."""
        inputs = self.m * self.k if self.in_elems is None else self.in_elems
        return float(self.elem_bytes * (inputs + self.m * self.n))

    @property
    def tp(self) -> OpTP:
        return "replicate" if self.split == "none" else "shard"


ATTENTION_IMPLS = ("flash", "unfused", "fused_softmax")
"""The kernels an attention core may run (a zoo spec's ``attention=``, a model file's ``transformer: {attention:}``,
a framework's ``attention``); each fixes both the core's time and what it keeps for backward:

* ``flash``: FlashAttention-2/3 or cuDNN's fused attention (Dao 2023): one kernel forward, three backward; keeps Q,
  K, V, O and the fp32 log-sum-exp of each query row (``softmax_lse``, 4 bytes per query and head), never the
  s x s scores (dropout regenerates its mask from the Philox seed).
* ``unfused``: Megatron-LM's attention core before flash attention (``CoreAttention`` / ``ParallelAttention`` in
  megatron/model/transformer.py) with the torch path of ``FusedScaleMaskSoftmax`` (megatron/model/fused_softmax.py,
  ``forward_torch_softmax``): the Q K^T batched GEMM (``torch.baddbmm``, alpha 1/sqrt(d)), then scale (query-key
  layer scaling's ``input * self.scale``), mask (``attention_mask_func``'s ``masked_fill_``) and softmax as separate
  memory-bound kernels over the a s^2 scores, the attention dropout, and the P V batched GEMM (``torch.bmm``).
* ``fused_softmax``: the same with ``--masked-softmax-fusion``: scale + mask + softmax in one CUDA kernel
  (``ScaledUpperTriangMaskedSoftmax`` for a causal mask, which builds the mask from indices;
  ``ScaledMaskedSoftmax`` for a padding mask, which reads it; megatron/fused_kernels/).

The two stored-score kernels keep the softmax output (e bytes per score), the dropout mask (1 byte) and the dropout
output (e): (2e + 1) a s^2 bytes per sample, Korthikanti et al. 2022 Sec. 4.1's 5as^2 at 2-byte activations. (The
softmax is modelled in the activation dtype, as Korthikanti counts it; Megatron's ``attention_softmax_in_fp32``
torch path would add two casts and keep a 4-byte softmax.)"""

FLASH_LSE_BYTES = 4
"""Bytes per query row and head flash attention keeps for backward: the fp32 log-sum-exp of the row's scores
(FlashAttention-2's ``softmax_lse``, Dao 2023 Algorithm 1 line 13: L_i = m_i + log l_i)."""
MASK_BYTES = 1
"""Bytes per element of a boolean mask (torch.bool): the attention mask and the dropout mask."""


def check_attention_impl(impl: object, where: str) -> str:
    """`impl` when it names an attention kernel of :data:`ATTENTION_IMPLS`; else one line naming `where`."""
    if not isinstance(impl, str) or impl not in ATTENTION_IMPLS:
        raise ModelFileError(f"{where}: attention must be one of {', '.join(ATTENTION_IMPLS)}, got {impl!r}")
    return impl


def attention_op_name(impl: str) -> str:
    """The name of an attention core op running `impl`: ``flash_attention``, ``unfused_attention``,
    ``fused_softmax_attention``."""
    return f"{impl}_attention"


@dataclass(frozen=True)
class ScoreKernel:
    """One kernel of a stored-score attention core, per sequence and head: ``q`` queries, ``kv`` keys, head dimension
    ``d``, elements of ``e`` bytes.

    A batched GEMM (``gemm``: its m, n, k, each one of ``q``, ``kv``, ``d``) reads A (m x k) and B (k x n) and writes
    C (m x n), 2 m n k FLOPs. A memory-bound kernel moves ``score_elems`` e-byte elements and ``mask_bytes`` bytes
    (a boolean mask read or written) per score."""

    name: str
    gemm: tuple[str, str, str] | None = None
    score_elems: int = 0
    mask_bytes: int = 0
    reduction: bool = False
    """A row reduction (softmax and its backward)."""

    def dims(self, q: int, kv: int, d: int) -> tuple[int, int, int]:
        assert self.gemm is not None
        size = {"q": q, "kv": kv, "d": d}
        m, n, k = (size[x] for x in self.gemm)
        return m, n, k

    def bytes(self, q: int, kv: int, d: int, e: int) -> float:
        if self.gemm is None:
            return float(q * kv * (self.score_elems * e + self.mask_bytes))
        m, n, k = self.dims(q, kv, d)
        return float(e * (m * k + k * n + m * n))

    def flops(self, q: int, kv: int, d: int) -> float:
        if self.gemm is None:
            return 0.0
        m, n, k = self.dims(q, kv, d)
        return 2.0 * m * n * k


_QK = ScoreKernel("baddbmm S = Q K^T", ("q", "kv", "d"))
_PV = ScoreKernel("bmm O = P V", ("q", "d", "kv"))
_DROPOUT = ScoreKernel("attention_dropout", score_elems=2, mask_bytes=MASK_BYTES)
"""torch's fused dropout: reads the probabilities, writes them dropped and scaled and the boolean mask."""
_BWD_PV = (ScoreKernel("bmm dP = dO V^T", ("q", "kv", "d")), ScoreKernel("bmm dV = P^T dO", ("kv", "d", "q")))
_BWD_QK = (ScoreKernel("bmm dQ = dS K", ("q", "d", "kv")), ScoreKernel("bmm dK = dS^T Q", ("kv", "d", "q")))
_BWD_DROPOUT = ScoreKernel("attention_dropout backward", score_elems=2, mask_bytes=MASK_BYTES)
"""dX = dY * mask / (1 - p): reads dY and the mask, writes dX."""
_SOFTMAX_BWD = ScoreKernel("softmax backward", score_elems=3, reduction=True)
"""dX = Y (dY - sum(dY Y)): reads dY and the kept output Y, writes dX (Megatron's fused
``scaled_*_masked_softmax_backward`` the same, writing in place, with the scale applied)."""

SCORE_KERNELS: dict[tuple[str, str], tuple[ScoreKernel, ...]] = {
    ("unfused", "F"): (
        _QK,
        ScoreKernel("scale", score_elems=2),
        ScoreKernel("mask (masked_fill_)", score_elems=2, mask_bytes=MASK_BYTES),
        ScoreKernel("softmax", score_elems=2, reduction=True),
        _DROPOUT,
        _PV,
    ),
    ("unfused", "B"): (
        *_BWD_PV,
        _BWD_DROPOUT,
        _SOFTMAX_BWD,
        ScoreKernel("mask backward (masked_fill)", score_elems=2, mask_bytes=MASK_BYTES),
        ScoreKernel("scale backward", score_elems=2),
        *_BWD_QK,
    ),
    ("fused_softmax", "F"): (_QK, ScoreKernel("scaled_masked_softmax", score_elems=2, reduction=True), _DROPOUT, _PV),
    ("fused_softmax", "B"): (*_BWD_PV, _BWD_DROPOUT, _SOFTMAX_BWD, *_BWD_QK),
}
"""The kernels of each stored-score implementation, forward (``F``) and backward (``B``, autograd's reverse order):
Megatron-LM's kernels named in :data:`ATTENTION_IMPLS`. A padding mask (not causal) adds one mask byte per score to
the fused softmax forward (``ScaledMaskedSoftmax`` reads it; the causal kernel does not), see
:meth:`AttentionOp.score_kernels`."""


@dataclass(frozen=True)
class AttentionOp:
    """The attention core over ``heads`` heads of ``head_dim``: ``q_len`` queries against ``kv_len`` keys, run by the
    kernel ``impl`` (:data:`ATTENTION_IMPLS`).

    FLOPs are the two matrix multiplies Q K^T and P V, ``4 q_len kv_len heads head_dim`` forward (Narayanan et al.
    2021's 4 s^2 h), counted whole even when causal; the flash cost model runs only the blocks a causal mask keeps
    (the stored-score kernels compute the whole square). Bytes: flash attention reads Q, K, V and writes O, never the
    score matrix (Dao et al. 2022, Sec. 3); the stored-score kernels also write and re-read the scores (the sum over
    :meth:`score_kernels`).
    """

    name: str
    heads: int
    head_dim: int
    q_len: int
    kv_len: int
    causal: bool = False
    elem_bytes: int = 2
    impl: str = "flash"

    kind: ClassVar[str] = "attention"
    FLASH_BWD_KERNELS: ClassVar[int] = 3
    """FlashAttention-2's backward: the dO.O row sums, the main dQ/dK/dV kernel and the fp32 dQ conversion (Dao 2023,
    Algorithm 2; flash-attention's ``flash_bwd_launch_template.h``)."""
    tp: ClassVar[OpTP] = "shard"

    def __post_init__(self) -> None:
        dims = {"heads": self.heads, "head_dim": self.head_dim, "q_len": self.q_len, "kv_len": self.kv_len}
        _check(self, self.name, dims)
        check_attention_impl(self.impl, f"op {self.name!r}")

    def score_kernels(self, phase: str) -> tuple[ScoreKernel, ...]:
        """The kernels of a stored-score implementation in `phase` (``F`` or ``B``); empty for flash."""
        if self.impl == "flash":
            return ()
        kernels = SCORE_KERNELS[self.impl, phase]
        if self.impl == "fused_softmax" and phase == "F" and not self.causal:  # ScaledMaskedSoftmax reads the mask
            kernels = tuple(replace(k, mask_bytes=MASK_BYTES) if k.reduction else k for k in kernels)
        return kernels

    @property
    def fwd_kernels(self) -> int:
        return 1 if self.impl == "flash" else len(self.score_kernels("F"))

    @property
    def bwd_kernels(self) -> int:
        return self.FLASH_BWD_KERNELS if self.impl == "flash" else len(self.score_kernels("B"))

    @property
    def flops(self) -> float:
        return 4.0 * self.q_len * self.kv_len * self.heads * self.head_dim

    @property
    def io_bytes(self) -> float:
        """Q, K, V read and O written, per sample: all flash attention moves."""
        return float(self.elem_bytes * self.heads * self.head_dim * (2 * self.q_len + 2 * self.kv_len))

    @property
    def bytes(self) -> float:
        if self.impl == "flash":
            return self.io_bytes
        q, kv, d, e = self.q_len, self.kv_len, self.head_dim, self.elem_bytes
        return float(self.heads * sum(k.bytes(q, kv, d, e) for k in self.score_kernels("F")))

    @property
    def saved_scores_bytes(self) -> float:
        """The s x s part of what it keeps for backward, per sample: softmax output, dropout mask and dropout output,
        (2e + 1) bytes per score (Korthikanti et al. 2022 Sec. 4.1: 2as^2 + as^2 + 2as^2); 0 for flash."""
        if self.impl == "flash":
            return 0.0
        return float(self.heads * self.q_len * self.kv_len * (2 * self.elem_bytes + MASK_BYTES))

    @property
    def saved_bytes(self) -> float:
        """What the core keeps for backward besides its inputs Q, K, V and its output O (which the layer's other
        activations count), per sample of the whole op: the stored scores, or flash's fp32 log-sum-exp per query row
        and head (4 a s)."""
        if self.impl == "flash":
            return float(FLASH_LSE_BYTES * self.heads * self.q_len)
        return self.saved_scores_bytes

    def with_impl(self, impl: str) -> AttentionOp:
        """The same core run by another kernel (renamed after it)."""
        return replace(self, impl=check_attention_impl(impl, f"op {self.name!r}"), name=attention_op_name(impl))


@dataclass(frozen=True)
class MemoryOp:
    """A memory-bound kernel: ``bytes`` read + written per sample (forward)."""

    name: str
    bytes: float
    flops: float = 0.0
    """Forward FLOPs per sample it contributes to the block's count (element-wise work is usually left out)."""
    tp: OpTP = "replicate"
    """``shard``: tensor parallelism divides it (it acts on split heads/features); ``replicate``: every tp rank
    does it whole (Megatron's layer norms, dropouts and residual adds on the full hidden state)."""
    reduction: bool = False
    """A row reduction (layer norm, softmax, batch norm): it reaches less of the memory bandwidth than a streaming
    element-wise kernel (see ``distsim.sim.kernels.REDUCTION_EFFICIENCY``)."""
    bwd_factor: float = 2.0
    """Backward bytes over forward bytes: a backward kernel reads the output gradient and what the forward read and
    writes the input gradient, about twice the forward's traffic."""
    kernels: int = 1
    bwd_kernels: int = 1
    bwd_fixed_bytes: float = 0.0
    """Backward bytes per event that do not scale with the micro-batch (unsharded; tp divides them when the op is
    sharded): an embedding's dense weight gradient, zero-filled and accumulated every micro-batch."""

    kind: ClassVar[str] = "memory"

    def __post_init__(self) -> None:
        values = {"bytes": self.bytes, "flops": self.flops, "bwd_factor": self.bwd_factor, "kernels": self.kernels,
                  "bwd_kernels": self.bwd_kernels, "bwd_fixed_bytes": self.bwd_fixed_bytes}  # fmt: skip
        _check(self, self.name, values)
        if self.tp not in ("shard", "replicate"):
            raise ModelFileError(f"op {self.name!r}: tp must be shard or replicate, not {self.tp!r}")

    @property
    def fwd_kernels(self) -> int:
        return self.kernels


Op = GemmOp | AttentionOp | MemoryOp

SEQUENCE_PARALLEL_OPS = frozenset({"layernorm", "rmsnorm", "bias_dropout_add", "residual_add"})
"""Kernels that Megatron's sequence parallelism runs on 1/tp of the sequence: the layer norms (or RMSNorms) and the
dropouts (with their bias and residual adds; the residual adds alone without dropout) between the tensor-parallel
regions (Korthikanti et al. 2022, Sec. 4.2.2, Fig. 5). The
embedding's position add and dropout stay whole: they are fused here, and the add runs before the embedding's
reduce-scatter."""


def sequence_parallel_ops(ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """A block's ops under sequence parallelism: the replicated kernels of :data:`SEQUENCE_PARALLEL_OPS` sharded
    over the tensor-parallel group (``tp="shard"``); the others as they are."""
    return tuple(
        replace(op, tp="shard") if isinstance(op, MemoryOp) and op.name in SEQUENCE_PARALLEL_OPS else op for op in ops
    )


def fp8_ops(ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """A block's ops under Transformer Engine's FP8 recipe: each tensor-parallel GEMM takes FP8 operands
    (``elem_bytes`` 1: the FP8 tensor cores, a bf16 output), after a cast kernel that reads its bf16 input, writes
    the FP8 copy and its amax (3 bytes per input element; in backward the output gradient's, m x n). The cast of a
    row-parallel GEMM's input is sharded like the input; a column-parallel one's input is whole on every rank. GEMMs
    that tensor parallelism does not split (a CNN's, the LM head's logits in TE's default recipe) stay as they are."""
    out: list[Op] = []
    for op in ops:
        if isinstance(op, GemmOp) and op.split != "none" and op.elem_bytes != 1:
            tp: OpTP = "shard" if op.split == "k" else "replicate"
            out.append(MemoryOp("fp8_cast", float(3 * op.m * op.k), tp=tp, bwd_factor=op.n / op.k))
            out.append(replace(op, elem_bytes=1))
        else:
            out.append(op)
    return tuple(out)


def op_totals(ops: tuple[Op, ...]) -> tuple[float, float]:
    """(forward FLOPs, forward bytes) per sample of a block's ops: what its ``fwd_flops`` and ``io_bytes`` are."""
    return float(sum(op.flops for op in ops)), float(sum(op.bytes for op in ops))

"""Per-op description of a block: the kernels its forward pass runs, for the analytic cost model.

A block's ``ops`` are, like its ``fwd_flops`` and ``io_bytes`` (which are their sums), per sample of the whole
(unsharded) block; the cost model scales them to an event's micro-batch size and tensor-parallel shard. Three kinds:

* :class:`GemmOp`: ``out[m x n] = in[m x k] @ W[k x n]`` with ``m`` per sample (tokens, or output pixels of a
  convolution run as an implicit GEMM); tensor parallelism divides ``n`` (column-parallel) or ``k`` (row-parallel).
  Backward runs two GEMMs per forward GEMM: ``dX = dY W^T`` (m x k, inner n) and ``dW = X^T dY`` (k x n, inner m),
  the latter accumulated into the weight gradient.
* :class:`AttentionOp`: the fused (flash) attention core ``softmax(Q K^T / sqrt(d)) V``; tp divides the heads.
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


@dataclass(frozen=True)
class AttentionOp:
    """Fused (flash) attention over ``heads`` heads of ``head_dim``: ``q_len`` queries against ``kv_len`` keys.

    FLOPs are the two matrix multiplies Q K^T and P V, ``4 q_len kv_len heads head_dim`` forward (Narayanan et al.
    2021's 4 s^2 h), counted whole even when causal; the cost model runs only the blocks a causal mask keeps.
    Bytes are Q, K, V read and O written: flash attention never writes the score matrix (Dao et al. 2022, Sec. 3).
    """

    name: str
    heads: int
    head_dim: int
    q_len: int
    kv_len: int
    causal: bool = False
    elem_bytes: int = 2

    kind: ClassVar[str] = "attention"
    fwd_kernels: ClassVar[int] = 1
    bwd_kernels: ClassVar[int] = 3
    """FlashAttention-2's backward: the dO.O row sums, the main dQ/dK/dV kernel and the fp32 dQ conversion (Dao 2023,
    Algorithm 2; flash-attention's ``flash_bwd_launch_template.h``)."""
    tp: ClassVar[OpTP] = "shard"

    def __post_init__(self) -> None:
        dims = {"heads": self.heads, "head_dim": self.head_dim, "q_len": self.q_len, "kv_len": self.kv_len}
        _check(self, self.name, dims)

    @property
    def flops(self) -> float:
        return 4.0 * self.q_len * self.kv_len * self.heads * self.head_dim

    @property
    def bytes(self) -> float:
        return float(self.elem_bytes * self.heads * self.head_dim * (2 * self.q_len + 2 * self.kv_len))


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

SEQUENCE_PARALLEL_OPS = frozenset({"layernorm", "bias_dropout_add"})
"""Kernels that Megatron's sequence parallelism runs on 1/tp of the sequence: the layer norms and the dropouts (with
their bias and residual adds) between the tensor-parallel regions (Korthikanti et al. 2022, Sec. 4.2.2, Fig. 5). The
embedding's position add and dropout stay whole: they are fused here, and the add runs before the embedding's
reduce-scatter."""


def sequence_parallel_ops(ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """A block's ops under sequence parallelism: the replicated kernels of :data:`SEQUENCE_PARALLEL_OPS` sharded
    over the tensor-parallel group (``tp="shard"``); the others as they are."""
    return tuple(
        replace(op, tp="shard") if isinstance(op, MemoryOp) and op.name in SEQUENCE_PARALLEL_OPS else op for op in ops
    )


def op_totals(ops: tuple[Op, ...]) -> tuple[float, float]:
    """(forward FLOPs, forward bytes) per sample of a block's ops: what its ``fwd_flops`` and ``io_bytes`` are."""
    return float(sum(op.flops for op in ops)), float(sum(op.bytes for op in ops))

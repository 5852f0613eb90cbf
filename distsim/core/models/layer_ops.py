"""The kernels every transformer block shares (its norm, its residual add) and what an architecture adds to a
block's shape (its event key), for :mod:`distsim.core.models.transformer` and :mod:`distsim.core.models.moe`."""

from __future__ import annotations

from distsim.core.models.arch import Arch
from distsim.core.models.ops import MemoryOp


def norm_op(s: int, h: int, e: int, norm: str = "layernorm") -> MemoryOp:
    """A replicated layer norm (or RMSNorm) over s tokens (every tp rank normalises the full hidden state): reads and
    writes s h elements; backward runs two kernels (input gradient; the scale's (and bias') gradients)."""
    return MemoryOp(norm, float(2 * s * h * e), reduction=True, bwd_kernels=2)


def residual_op(s: int, h: int, e: int, dropout: bool = True) -> MemoryOp:
    """Megatron's fused bias + dropout + residual add after a row-parallel projection, replicated on every tp rank:
    reads the projection output and the residual, writes the sum and the 1-byte dropout mask (Korthikanti Sec. 4.1).
    Without dropout (Llama) the residual add alone: two reads, one write."""
    if not dropout:
        return MemoryOp("residual_add", float(3 * s * h * e))
    return MemoryOp("bias_dropout_add", float(s * h * (3 * e + 1)))


def arch_tags(arch: Arch, kv: int, heads: int, *, attention: bool) -> tuple[tuple[str, int], ...]:
    """What an architecture adds to a block's shape (its event key), only where it differs from GPT's, so that the
    keys profiles already hold stay as they are: ``kv_heads`` and ``rope`` (attention), ``swiglu`` (MLP),
    ``rmsnorm``, ``bias=0`` and ``dropout=0`` (both)."""
    tags: list[tuple[str, int]] = []
    if attention and kv != heads:
        tags.append(("kv_heads", kv))
    if attention and arch.position == "rope":
        tags.append(("rope", 1))
    if not attention and arch.mlp == "swiglu":
        tags.append(("swiglu", 1))
    if arch.norm == "rmsnorm":
        tags.append(("rmsnorm", 1))
    if not arch.bias:
        tags.append(("bias", 0))
    if not arch.dropout:
        tags.append(("dropout", 0))
    return tuple(tags)

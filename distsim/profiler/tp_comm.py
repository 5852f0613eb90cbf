"""Tensor-parallel communication inside the block modules of :mod:`distsim.profiler.blocks` (Megatron-LM, Shoeybi et
al. 2019, Sec. 3 and Fig. 3): the ``f`` and ``g`` operators around column- and row-parallel linear layers, and the
vocabulary-parallel cross entropy. :class:`TPComm` does nothing (profiling one shard: the collectives are events of
their own); :class:`ProcessGroupComm` runs them with ``torch.distributed`` (the executor).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

ReduceOp = Literal["sum", "max"]


class TPComm:
    """Tensor-parallel communication hooks used inside the block modules (Megatron-LM, Shoeybi et al. 2019, Fig. 3).

    This base class is the local implementation: every all-reduce is the identity, so :meth:`f` and :meth:`g` return
    their input unchanged (profiling one shard, where the collective is a separate event). Subclasses implement
    :meth:`all_reduce`; :meth:`f` and :meth:`g` then wrap it in autograd functions.
    """

    def all_reduce(self, tensor: Tensor, op: ReduceOp = "sum") -> Tensor:
        """Reduce `tensor` over the tp group and return the result. `tensor` is a fresh contiguous tensor owned by
        the caller: implementations may reduce in place and return it."""
        return tensor

    @property
    def is_local(self) -> bool:
        """True when the all-reduce is the identity (no autograd wrappers are inserted then)."""
        return type(self).all_reduce is TPComm.all_reduce

    def f(self, x: Tensor) -> Tensor:
        """Megatron's ``f``, before a column-parallel layer: identity in forward, all-reduce of the gradient in
        backward."""
        return x if self.is_local else _CopyToTensorParallel.apply(x, self)

    def g(self, x: Tensor) -> Tensor:
        """Megatron's ``g``, after a row-parallel layer: all-reduce (sum) in forward, identity in backward."""
        return x if self.is_local else _ReduceFromTensorParallel.apply(x, self)

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        """Sum over the tp group, outside autograd (the vocab-parallel cross-entropy's statistics)."""
        return self.all_reduce(tensor, "sum")

    def all_reduce_max(self, tensor: Tensor) -> Tensor:
        """Maximum over the tp group, outside autograd (the vocab-parallel cross-entropy's logit maximum)."""
        return self.all_reduce(tensor, "max")

    @staticmethod
    def local() -> TPComm:
        """Hooks that do nothing: one shard's compute alone."""
        return TPComm()

    @staticmethod
    def process_group(group: Any = None) -> TPComm:
        """Hooks that all-reduce with ``torch.distributed`` over `group` (None: the default group)."""
        return ProcessGroupComm(group)


class ProcessGroupComm(TPComm):
    """All-reduces over a ``torch.distributed`` process group (imported on first use)."""

    def __init__(self, group: Any = None) -> None:
        self.group = group

    def all_reduce(self, tensor: Tensor, op: ReduceOp = "sum") -> Tensor:
        import torch.distributed as dist

        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
        if op not in ops:
            raise ValueError(f"unknown reduce op {op!r} (expected sum or max)")
        dist.all_reduce(tensor, op=ops[op], group=self.group)
        return tensor


class _CopyToTensorParallel(torch.autograd.Function):
    """Megatron's ``f`` (``copy_to_tensor_model_parallel_region``)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: TPComm) -> Tensor:
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return ctx.comm.all_reduce(grad.clone(memory_format=torch.contiguous_format), "sum"), None


class _ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's ``g`` (``reduce_from_tensor_model_parallel_region``)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, comm: TPComm) -> Tensor:
        return comm.all_reduce(x.clone(memory_format=torch.contiguous_format), "sum")

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


class VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross-entropy over logits whose vocabulary is split over the tp ranks (Megatron's
    ``_VocabParallelCrossEntropy``): all-reduces the logit maximum, the target logit and the sum of exponentials
    (three fp32 values per token), keeps the local softmax for backward, and needs no collective in backward.
    Backward reuses the saved softmax in place, so it may run once per forward (as in Megatron)."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, target: Tensor, vocab_start: int, comm: TPComm) -> Tensor:
        logits_max = comm.all_reduce_max(logits.max(dim=-1)[0])
        shifted = logits - logits_max.unsqueeze(-1)
        outside = (target < vocab_start) | (target >= vocab_start + logits.size(-1))
        local_target = (target - vocab_start).masked_fill(outside, 0)
        predicted = shifted.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        predicted = comm.all_reduce_sum(predicted)
        exp = shifted.exp_()
        sum_exp = comm.all_reduce_sum(exp.sum(dim=-1))
        loss = sum_exp.log() - predicted
        softmax = exp.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(softmax, outside, local_target)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Tensor, None, None, None]:
        softmax, outside, local_target = ctx.saved_tensors
        grad = softmax  # in place, as Megatron
        hit = (~outside).to(grad.dtype).unsqueeze(-1)
        grad.scatter_add_(-1, local_target.unsqueeze(-1), -hit)
        grad.mul_(grad_loss.unsqueeze(-1))
        return grad, None, None, None

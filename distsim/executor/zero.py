"""ZeRO-1 on one executor rank: Megatron-LM's distributed optimizer over the rank's data-parallel group.

The gradient buckets stay the ones :mod:`distsim.core.sync` lowers (each one slice of the rank's contiguous gradient
buffer); the sharding pass changes what each becomes:

* **Layout.** Each bucket's slice is padded to a multiple of the group's size d (:func:`padded_layout`), in the
  gradient buffer and in a parameter buffer of the same layout: every parameter's data and gradient are views into
  them, so every collective runs in place, as in Megatron-LM's ``_ParamAndGradBuffer``. Group rank i owns the i-th of
  the d equal shards of every bucket.
* **Gradients.** Each bucket is reduce-scattered over the group instead of all-reduced, when the simulator issues it
  (:meth:`Zero1.reduce_scatter`): afterwards the rank's shard of the bucket holds the sum over the replicas (the rest
  of the bucket keeps the rank's own gradients). With NCCL it is a reduce-scatter in place. gloo has no native
  reduce-scatter (:data:`distsim.profiler.comm.GLOO_NOTES`): torch 2.13's ``ProcessGroupGloo`` copies the input,
  all-reduces the copy and, when waited for, copies the rank's chunk out, in a work without a future, which the host
  clock could not time when it overlaps backward. On gloo the executor runs those same three steps itself, with the
  copy-out chained to the all-reduce's future: the collective the profiler measured as gloo's reduce-scatter.
* **Step.** Adam steps one contiguous fp32 buffer of the rank's shards of every bucket (master weights), with its
  own state: 1/d of the rank's parameters.
* **Parameters.** Each bucket's parameters are then all-gathered from the shards into the parameter buffer, one
  all-gather per bucket in the order :attr:`distsim.core.sync.Lowered.gathers` gives (:meth:`Zero1.gather`).

Padding elements hold zero parameters and zero gradients, which Adam leaves at zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from distsim.profiler.comm import all_gather_single, reduce_scatter_single

Span = tuple[int, int]
"""[start, stop) elements of a buffer."""


def padded_layout(
    spans: dict[tuple[int, int], Span], buckets: Sequence[tuple[slice, Sequence[tuple[int, int]]]], d: int
) -> tuple[dict[tuple[int, int], Span], list[slice], int]:
    """The tensors' spans and the buckets' slices once each bucket is padded to a multiple of `d` elements.

    `spans`: (layer, tensor index) -> its span in the unpadded buffer; `buckets`: each bucket's slice of that buffer
    and the tensors it carries (together every tensor once). Buckets keep their order in the buffer; a bucket's
    padding follows its last tensor. Returns the new spans, the new slices (in the given order) and the new size."""
    shift: dict[int, int] = {}
    out_slices: list[slice] = [slice(0)] * len(buckets)
    offset = 0
    for i in sorted(range(len(buckets)), key=lambda k: buckets[k][0].start):
        part = buckets[i][0]
        shift[i] = offset - part.start
        size = part.stop - part.start
        out_slices[i] = slice(offset, offset + -(-size // d) * d)
        offset = out_slices[i].stop
    out: dict[tuple[int, int], Span] = {}
    for i, (_part, tensors) in enumerate(buckets):
        for t in tensors:
            a, b = spans[t]
            out[t] = (a + shift[i], b + shift[i])
    missing = set(spans) - set(out)
    if missing:
        raise AssertionError(f"gradient tensors {sorted(missing)} are in no bucket")
    return out, out_slices, offset


@dataclass(frozen=True)
class _Shard:
    part: slice
    """The bucket's padded slice of the buffers."""
    own: slice
    """This rank's shard of it."""
    master: slice
    """Where the shard sits in the fp32 master buffer."""


class Zero1:
    """The rank's buffers, sharded Adam and bucket collectives under ZeRO-1 (see the module)."""

    def __init__(
        self, layer_params: dict[int, list[nn.Parameter]], spans: dict[tuple[int, int], Span], buckets: Sequence[Any],
        group: Any, lr: float, dtype: torch.dtype, device: torch.device,
    ) -> None:  # fmt: skip
        """`buckets`: the runtime's gradient buckets (``part``: a slice of the unpadded buffer, ``bucket.tensors``,
        ``name``), which :attr:`buckets` returns re-laid out."""
        self.group, self.dtype = group, dtype
        self.size, self.index = dist.get_world_size(group), dist.get_rank(group)
        self.gloo = dist.get_backend(group) == "gloo"
        new_spans, parts, total = padded_layout(spans, [(b.part, b.bucket.tensors) for b in buckets], self.size)
        self.param_buffer = torch.zeros(total, dtype=dtype, device=device)
        self.grad_buffer = torch.zeros(total, dtype=dtype, device=device)
        self._spans: list[tuple[nn.Parameter, Span]] = []
        with torch.no_grad():
            for li, params in layer_params.items():
                for k, p in enumerate(params):
                    a, b = new_spans[(li, k)]
                    self.param_buffer[a:b].copy_(p.detach().reshape(-1))
                    p.data = self.param_buffer[a:b].view_as(p)
                    p.grad = self.grad_buffer[a:b].view_as(p)
                    self._spans.append((p, (a, b)))
        self.buckets = [replace(b, part=part) for b, part in zip(buckets, parts, strict=True)]
        self._shards: dict[str, _Shard] = {}
        at = 0
        for b in self.buckets:
            n = (b.part.stop - b.part.start) // self.size
            own = slice(b.part.start + self.index * n, b.part.start + (self.index + 1) * n)
            self._shards[b.name] = _Shard(b.part, own, slice(at, at + n))
            at += n
        self.master = torch.cat([self.param_buffer[s.own] for s in self._shards.values()]).float().requires_grad_()
        self.master.grad = torch.zeros_like(self.master)
        self.opt = torch.optim.Adam([self.master], lr=lr, foreach=True)

    @property
    def shard_elements(self) -> int:
        """Elements of the rank's optimizer step (its shards, padding included)."""
        return self.master.numel()

    def reduce_scatter(self, name: str, async_op: bool) -> Any:
        """The gradient collective of bucket `name`: afterwards its shard of the gradient buffer holds the sum. Returns
        the work when `async_op`."""
        s = self._shards[name]
        if not self.gloo:
            return reduce_scatter_single()(self.grad_buffer[s.own], self.grad_buffer[s.part], group=self.group,
                                           async_op=async_op)  # fmt: skip
        # torch's gloo reduce-scatter, step by step (see the module): copy, all-reduce the copy, copy the chunk out
        copy = self.grad_buffer[s.part].clone()
        chunk = copy[s.own.start - s.part.start : s.own.stop - s.part.start]
        done = dist.all_reduce(copy, group=self.group, async_op=True).get_future()
        work = _FutureWork(done.then(lambda _f: self.grad_buffer[s.own].copy_(chunk)))
        if async_op:
            return work
        work.wait()
        return None

    @torch.no_grad()
    def step(self) -> None:
        """Adam on the rank's shards (fp32 master weights, sharded state)."""
        assert self.master.grad is not None
        for s in self._shards.values():
            self.master.grad[s.master].copy_(self.grad_buffer[s.own])
        self.opt.step()

    @torch.no_grad()
    def reduced_grads(self) -> dict[int, Tensor]:
        """id(parameter) -> its gradient summed over the group, assembled from every rank's reduced shards (a copy;
        for correctness checks). Every rank of the group must call it."""
        full = torch.empty_like(self.grad_buffer)
        for s in self._shards.values():
            all_gather_single()(full[s.part], self.grad_buffer[s.own].clone(), group=self.group)
        return {id(p): full[a:b].view_as(p) for p, (a, b) in self._spans}

    @torch.no_grad()
    def gather(self, name: str) -> None:
        """All-gather bucket `name`'s parameters from every rank's updated shard."""
        s = self._shards[name]
        shard: Tensor = self.master.detach()[s.master].to(self.dtype)  # a view of the master buffer when fp32
        all_gather_single()(self.param_buffer[s.part], shard, group=self.group)


class _FutureWork:
    """A work whose completion is a future (what :meth:`Zero1.reduce_scatter` returns on gloo): ``wait`` and
    ``get_future`` as a ``torch.distributed`` work has them, for the rank's clock."""

    def __init__(self, future: Any) -> None:
        self.future = future

    def wait(self) -> bool:
        self.future.wait()
        return True

    def get_future(self) -> Any:
        return self.future

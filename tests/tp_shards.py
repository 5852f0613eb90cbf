"""Tensor-parallel equivalence of the profiler's block modules, for the tests: tp shards run as threads of one
process (:class:`ThreadComm`, :func:`run_ranks`) must give the full module's output and gradients
(:func:`check_tp_shards`)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import torch
from torch import Tensor

from distsim.core.models.graph import Block
from distsim.profiler.blocks import BlockModule, shard_param_count, shard_state_from_full
from distsim.profiler.build import build_block
from distsim.profiler.tp_comm import ReduceOp, TPComm


def randomize(module: torch.nn.Module, seed: int = 0) -> None:
    """Non-trivial values everywhere (biases and norms too, so a bias added twice would show)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.5)


def backward(out: Tensor, seed: int = 1) -> None:
    if out.ndim == 0:
        out.backward()
    else:
        out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype))


class _Rendezvous:
    def __init__(self, ranks: int) -> None:
        self.slots: list[Tensor | None] = [None] * ranks
        self.barrier = threading.Barrier(ranks, timeout=300)


class ThreadComm(TPComm):
    """One rank of an in-process tp group whose ranks are threads: all-reduce through shared slots and barriers
    (every rank reduces the slots in rank order, so all get bit-identical results)."""

    def __init__(self, rendezvous: _Rendezvous, rank: int) -> None:
        self.rv, self.rank = rendezvous, rank

    def all_reduce(self, tensor: Tensor, op: ReduceOp = "sum") -> Tensor:
        self.rv.slots[self.rank] = tensor
        self.rv.barrier.wait()
        parts = [t for t in self.rv.slots if t is not None]
        out = parts[0].clone()
        for t in parts[1:]:
            out = out + t if op == "sum" else torch.maximum(out, t)
        self.rv.barrier.wait()
        return out


def run_ranks(tp: int, fn: Callable[[int, TPComm], object]) -> list[object]:
    """Run fn(rank, comm) for every rank in its own thread; re-raise the first failure."""
    rv = _Rendezvous(tp)
    results: list[object] = [None] * tp
    errors: list[BaseException] = []

    def target(rank: int) -> None:
        try:
            results[rank] = fn(rank, ThreadComm(rv, rank))
        except BaseException as exc:
            errors.append(exc)
            rv.barrier.abort()

    threads = [threading.Thread(target=target, args=(r,)) for r in range(tp)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def check_tp_shards(block: Block, tp: int, mbs: int) -> dict[str, Tensor]:
    """tp shards of `block` sliced from its full (tp=1) float64 module, collectives emulated by threads, give the
    full module's output (or loss), input gradients and parameter gradients (split ones equal its slices), and
    have :func:`shard_param_count` parameters each. Returns the full module's parameter gradients."""
    full = build_block(block, dtype=torch.float64)
    randomize(full)
    inputs = full.example_inputs(mbs, torch.Generator().manual_seed(3))
    ref_out = full(*inputs)
    backward(ref_out)
    ref_in_grads = [x.grad for x in inputs if x.requires_grad]
    ref_param_grads = {n: p.grad for n, p in full.named_parameters()}

    def rank_fn(rank: int, comm: TPComm) -> tuple[Tensor, list[Tensor], dict[str, Tensor], BlockModule]:
        shard = build_block(block, tp, rank, comm, torch.float64)
        shard.load_state_dict(shard_state_from_full(full, tp, rank))
        own = tuple(x.detach().clone().requires_grad_(x.requires_grad) for x in inputs)
        out = shard(*own)
        backward(out)
        grads = {n: p.grad for n, p in shard.named_parameters()}
        return out.detach(), [x.grad for x in own if x.requires_grad], grads, shard

    for rank, (out, in_grads, param_grads, shard) in enumerate(run_ranks(tp, rank_fn)):  # type: ignore[misc]
        assert shard.param_count() == shard_param_count(block, tp)
        torch.testing.assert_close(out, ref_out.detach())
        assert len(in_grads) == len(ref_in_grads)
        for got, want in zip(in_grads, ref_in_grads, strict=True):
            torch.testing.assert_close(got, want)
        want_grads = shard_state_from_full(full, tp, rank, ref_param_grads)
        assert set(param_grads) == set(want_grads)
        for n, g in param_grads.items():
            torch.testing.assert_close(g, want_grads[n], msg=f"gradient of {n} on rank {rank}")
    return ref_param_grads

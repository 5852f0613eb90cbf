"""The profiler's self-check: a short chain of each distinct stage's blocks, timed in situ (see
``distsim.infra.self_check``).

A chain is a few layers of one pipeline stage of a profiled strategy (every distinct block of the stage, and at
least ``CHAIN_LAYERS`` layers), built as the profiler builds them (tp rank 0's shard, local communication hooks),
and run as the stage runs them: every block forward, then every backward in reverse order, with no host
synchronisation between blocks. On CUDA, events are recorded between blocks (before each round L2 is swept and the
GPU sleeps while the host enqueues the first block, as a training step's host runs ahead of its GPU); on CPU,
``perf_counter`` is read between blocks. The blocks do not pass data to each other: each gets inputs of its own
shapes, made before the round, so that any model's stage chains (skip connections, encoder outputs, branches) and
the device runs the same kernels in the same order. A user's torch module (``--torch-model``) is checked the same way
on a chain of its own consecutive blocks (:func:`time_in_situ`, the loop both share).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from distsim.core.cluster import Cluster
from distsim.core.models.graph import Block, Model
from distsim.core.strategy import Strategy
from distsim.profiler.blocks import torch_dtype
from distsim.profiler.build import build_block, can_build
from distsim.profiler.compute import (
    FIRST_SLEEP_S,
    SLEEP_MARGIN,
    SLEEP_PAD_S,
    Backward,
    FedTimer,
    Forward,
    Step,
    evict_bytes,
)
from distsim.profiler.tp_comm import TPComm
from distsim.sim.costs import AnalyticCosts, ComputeEvent
from distsim.sim.flow.events import resolve_partition

CHAIN_LAYERS = 4
"""Least layers of a stage in its chain (fewer when the stage has fewer)."""
MAX_CHAIN_BLOCKS = 16
"""Most blocks in one chain (a stage with more distinct blocks, as a CNN's, is checked on its first ones)."""
CHAIN_WARMUP = 2
CHAIN_ROUNDS = 5
BUDGET_S = 30.0
"""A rank starts no further chain after this many seconds of self-check."""


@dataclass(frozen=True)
class Chain:
    """Blocks of some layers of one stage, in forward order, at one micro-batch size, tp degree and dtype."""

    label: str
    layers: tuple[int, ...]
    blocks: tuple[Block, ...]
    micro_batch_size: int
    tp: int
    dtype: str

    def event(self, i: int, phase: str) -> ComputeEvent:
        return ComputeEvent(self.blocks[i], phase, self.micro_batch_size, self.tp, self.dtype)

    @property
    def keys(self) -> tuple[str, ...]:
        """Event keys in run order: every forward, then every backward in reverse."""
        n = len(self.blocks)
        order = [(i, "F") for i in range(n)] + [(i, "B") for i in reversed(range(n))]
        return tuple(self.event(i, phase).key for i, phase in order)


def _checkable(block: Block) -> bool:
    return not block.has_given_time and can_build(block)


def plan_chains(model: Model, cluster: Cluster, strategies: list[Strategy], wanted: Collection[str] | None = None,
                layers: int = CHAIN_LAYERS, max_blocks: int = MAX_CHAIN_BLOCKS) -> list[Chain]:  # fmt: skip
    """One chain per distinct stage of `strategies` (stages with the same blocks share one), skipping chains with
    none of the `wanted` event keys (None: all)."""
    dtype = model.precision.name
    chains: dict[tuple[str, ...], Chain] = {}
    for strategy in strategies:
        mbs, tp = strategy.micro_batch_size, strategy.tp
        for vs, (start, end) in enumerate(resolve_partition(model, strategy, AnalyticCosts(cluster))):
            keys = [{ComputeEvent(b, "F", mbs, tp, dtype).key for b in model.layers[li].blocks if _checkable(b)}
                    for li in range(start, end)]  # fmt: skip
            chosen: list[int] = []
            seen: set[str] = set()
            for li, layer_keys in enumerate(keys, start):  # every distinct block of the stage
                if layer_keys - seen:
                    chosen.append(li)
                    seen |= layer_keys
            for li, layer_keys in enumerate(keys, start):  # and at least `layers` layers
                if len(chosen) >= layers:
                    break
                if li not in chosen and layer_keys:
                    chosen.append(li)
            chosen.sort()
            blocks = tuple(b for li in chosen for b in model.layers[li].blocks if _checkable(b))[:max_blocks]
            if not blocks:
                continue
            label = f"{strategy} mbs={mbs} stage {vs}"
            chain = Chain(label, tuple(chosen), blocks, mbs, tp, dtype)
            if wanted is not None and not set(chain.keys) & set(wanted):
                continue
            chains.setdefault(chain.keys, chain)
    return list(chains.values())


def time_chain(chain: Chain, device: torch.device, warmup: int = CHAIN_WARMUP, rounds: int = CHAIN_ROUNDS,
               seed: int = 0) -> dict[str, Any]:  # fmt: skip
    """Time `chain` in situ: ``{"label", "layers", "keys": [event key per position in run order], "samples_s":
    [[seconds per round] per position]}`` (see the module docstring for the method)."""
    dtype = torch_dtype(chain.dtype, device)
    modules = [
        build_block(chain.event(i, "F").block, chain.event(i, "F").effective_tp, 0, TPComm.local(), dtype, device,
                    generator=torch.Generator(device=device).manual_seed(seed + i))
        for i in range(len(chain.blocks))
    ]  # fmt: skip
    counter = [seed + 1000]

    def inputs(module: Any) -> tuple[Tensor, ...]:
        counter[0] += 1
        return module.example_inputs(chain.micro_batch_size, torch.Generator(device=device).manual_seed(counter[0]))

    grads: list[Tensor | None] = []
    gen = torch.Generator(device=device).manual_seed(seed + 2)
    for m in modules:
        out = m(*inputs(m))
        grad = torch.randn(out.shape, generator=gen, device=device, dtype=torch.float32).to(out.dtype)
        grads.append(None if out.ndim == 0 else grad)
        del out

    def work(m: Any, grad: Tensor | None) -> tuple[Forward, Backward]:
        def forward() -> Step:
            x = inputs(m)
            return "F", lambda: m(*x)

        return forward, lambda out: [("B", lambda: torch.autograd.backward(out, grad))]

    samples = time_in_situ([work(m, g) for m, g in zip(modules, grads, strict=True)], device, warmup, rounds)
    return {"label": chain.label, "layers": list(chain.layers), "keys": list(chain.keys), "samples_s": samples}


def time_in_situ(works: Sequence[tuple[Forward, Backward]], device: torch.device, warmup: int = CHAIN_WARMUP,
                 rounds: int = CHAIN_ROUNDS) -> list[list[float]]:  # fmt: skip
    """Seconds per round of each position of a chain of layers run in situ, in run order (every forward, then
    every backward in reverse), after `warmup` rounds. Each layer is a (forward, backward) pair as
    :func:`~distsim.profiler.compute.time_steps` takes them; every forward's inputs are prepared before the round,
    and a layer's backward is all the calls its `backward` names. The one chain timing of the zoo's stages
    (:func:`time_chain`) and a user's torch module's blocks (:mod:`distsim.profiler.torch_timing`)."""
    evict = torch.empty(evict_bytes(device) // 4, dtype=torch.float32, device=device)
    timer = FedTimer(device) if device.type == "cuda" else None
    head_start_s = FIRST_SLEEP_S
    samples: list[list[float]] = [[] for _ in range(2 * len(works))]
    for r in range(warmup + rounds):
        calls = [forward()[1] for forward, _ in works]
        evict.add_(1.0)
        if timer is not None:
            durations, head_start_s = _round_cuda(calls, [b for _, b in works], device, timer, head_start_s)
        else:
            durations = _round_cpu(calls, [b for _, b in works])
        del calls  # this round's inputs
        if r >= warmup:
            for k, d in enumerate(durations):
                samples[k].append(d)
    return samples


def _run_backward(backward: Backward, out: Any) -> None:
    for _, fn in backward(out):
        fn()


def _round_cuda(calls: list[Callable[[], Any]], backwards: list[Backward], device: torch.device, timer: FedTimer,
                head_start_s: float) -> tuple[list[float], float]:  # fmt: skip
    """One round on CUDA: the GPU asleep for `head_start_s` while the host enqueues the first layer, CUDA events
    between layers, no host synchronisation; (durations in run order, the next round's head start)."""
    n = len(calls)
    torch.cuda.synchronize(device)
    torch.cuda._sleep(int(head_start_s * timer.cycles_per_s))
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(2 * n + 1)]
    marks[0].record()
    t0 = time.perf_counter()
    outs = []
    for i, call in enumerate(calls):
        outs.append(call())
        marks[i + 1].record()
        if i == 0:  # the next round's head start covers the host's launch of the first layer
            head_start_s = SLEEP_MARGIN * (time.perf_counter() - t0) + SLEEP_PAD_S
    for j, i in enumerate(reversed(range(n))):
        _run_backward(backwards[i], outs[i])
        marks[n + j + 1].record()
    marks[-1].synchronize()
    return [marks[k].elapsed_time(marks[k + 1]) / 1e3 for k in range(2 * n)], head_start_s


def _round_cpu(calls: list[Callable[[], Any]], backwards: list[Backward]) -> list[float]:
    """One round on CPU: ``perf_counter`` read between layers."""
    stamps = [time.perf_counter()]
    outs = []
    for call in calls:
        outs.append(call())
        stamps.append(time.perf_counter())
    for i in reversed(range(len(calls))):
        _run_backward(backwards[i], outs[i])
        stamps.append(time.perf_counter())
    return [b - a for a, b in itertools.pairwise(stamps)]


def run_chains(chains: list[Chain], device: torch.device, budget_s: float = BUDGET_S,
               progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:  # fmt: skip
    """Time `chains` in turn (see :func:`time_chain`), starting none after `budget_s` seconds."""
    started = time.perf_counter()
    out = []
    for i, chain in enumerate(chains):
        if time.perf_counter() - started > budget_s:
            if progress is not None:
                progress(f"self-check: {len(chains) - i} chain(s) left out after {budget_s:.0f} s")
            break
        if progress is not None:
            progress(f"self-check {i + 1}/{len(chains)}: {chain.label}, {len(chain.blocks)} blocks in situ")
        try:
            out.append(time_chain(chain, device))
        except (RuntimeError, ValueError) as exc:  # out of memory, say: the check is left out, not the profile
            if progress is not None:
                progress(f"self-check of {chain.label} failed, left out: {exc.__class__.__name__}: {exc}"[:300])
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return out

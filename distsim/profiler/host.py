"""The host's speed: seconds of host time per eager PyTorch operator, forward and backward.

A model's kernels reach an accelerator no faster than the host issues them: per operator, Python, PyTorch's
dispatcher and autograd's recording in forward, the autograd engine's node in backward (plus the launch on CUDA).
:func:`measure_host_op_costs` measures that cost on this machine with a chain of tiny modules (LayerNorm, Linear,
GELU, Linear, Dropout, in turn, on a 4x8 fp32 tensor, one thread), whose work is negligible: the slope of the chain's
time between two chain lengths is the host time per module, its constant costs (the first call, the loss, the
engine's start) cancelled; the minimum over repetitions is taken at each length (the host's speed when nothing
interrupts it). The backward's constant (the chain's backward time less its modules' share: starting the autograd
engine, handing the graph to its device thread and waking the caller when it is done) is ``backward_call_s``: a
training loop pays it once per backward call, where a block's backward timed alone pays it in full. On CUDA the chain
runs on the device and the clock stops after a synchronisation: the figures then include the kernel launch. ``distsim
profile`` records them in the profile (``ProfileDB.host``), so that a profile states its host's speed (``distsim profile
show``).
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

CHAIN_LENGTHS = (10, 50)
"""The two chain lengths (modules) whose time difference is the host time of their difference."""
SHAPE = (4, 8)
"""The tensor every module of the chain works on: tiny, so the chain's time is the host's."""
METHOD = "eager nn.Module chain"


@dataclass(frozen=True)
class HostOpCosts:
    """Host seconds per eager operator: ``forward_s`` (an ``nn.Module`` call recording autograd), ``backward_s``
    (the autograd engine's node for it), and how they were measured."""

    forward_s: float
    backward_s: float
    method: str
    backward_call_s: float = 0.0
    """The host seconds of one ``backward()`` call beyond its operators' (the engine's start and end)."""


def _chain(length: int, device: torch.device) -> nn.Sequential:
    """`length` tiny modules: LayerNorm, Linear, GELU, Linear, Dropout, repeated (the last repetition cut short)."""
    width = SHAPE[1]
    kinds = (lambda: nn.LayerNorm(width), lambda: nn.Linear(width, width), nn.GELU, lambda: nn.Linear(width, width),
             lambda: nn.Dropout(0.1))  # fmt: skip
    chain = nn.Sequential(*(kinds[i % len(kinds)]() for i in range(length))).to(device)
    return chain.train()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _run_once(chain: nn.Module, x: torch.Tensor, device: torch.device) -> tuple[float, float]:
    """(forward seconds, backward seconds) of one run of `chain` on `x`: the forward recording autograd, then the
    backward of its sum (the sum itself not timed)."""
    _sync(device)
    t0 = time.perf_counter()
    out = chain(x)
    _sync(device)
    t1 = time.perf_counter()
    loss = out.sum()
    _sync(device)
    t2 = time.perf_counter()
    loss.backward()
    _sync(device)
    t3 = time.perf_counter()
    chain.zero_grad(set_to_none=True)
    return t1 - t0, t3 - t2


def _least_times(chains: dict[int, nn.Module], x: torch.Tensor, device: torch.device, repeats: int,
                 warmup: int) -> dict[int, tuple[float, float]]:  # fmt: skip
    """Chain length -> (least forward seconds, least backward seconds) over `repeats` timed runs after `warmup`; the
    lengths take turns, so that a slower spell of the machine reaches both alike."""
    best = {n: (float("inf"), float("inf")) for n in chains}
    for r in range(warmup + repeats):
        for n, chain in chains.items():
            forward, backward = _run_once(chain, x, device)
            if r >= warmup:
                best[n] = (min(best[n][0], forward), min(best[n][1], backward))
    return best


def measure_host_op_costs(device: Any = "cpu", repeats: int = 20, warmup: int = 5,
                          lengths: tuple[int, int] = CHAIN_LENGTHS) -> HostOpCosts:  # fmt: skip
    """Host seconds per eager operator on `device`, forward and backward: the slope of the least time of a chain of
    tiny modules between two chain lengths, each the least of `repeats` runs (see the module's docstring). On CPU one
    thread (restored after); on CUDA the launch is included (the clock stops after a synchronisation). About 0.1 s.

    Raises ValueError for repeats < 1, warmup < 0 or lengths not increasing."""
    short, long = lengths
    if repeats < 1 or warmup < 0 or not 0 < short < long:
        raise ValueError(f"need repeats >= 1, warmup >= 0 and 0 < lengths[0] < lengths[1], got {repeats}, {warmup}, "
                         f"{lengths}")  # fmt: skip
    dev = torch.device(device)
    threads = torch.get_num_threads()
    gc_was_enabled = gc.isenabled()
    try:
        if dev.type == "cpu":
            torch.set_num_threads(1)
        with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []), torch.enable_grad():
            torch.manual_seed(0)  # the caller's random state is left as it was
            x = torch.randn(SHAPE).to(dev)
            chains = {n: _chain(n, dev) for n in lengths}
            gc.disable()  # a collection inside a timed run is not the host's per-operator cost
            timed = _least_times(chains, x, dev, repeats, warmup)
    finally:
        if gc_was_enabled:
            gc.enable()
        torch.set_num_threads(threads)
    forward = max(0.0, (timed[long][0] - timed[short][0]) / (long - short))
    backward = max(0.0, (timed[long][1] - timed[short][1]) / (long - short))
    call = max(0.0, timed[short][1] - short * backward)  # the intercept: what a backward call costs beyond its ops
    where = "cpu, 1 thread" if dev.type == "cpu" else f"{dev.type} (launch included)"
    return HostOpCosts(forward, backward, f"{METHOD}, {where}", call)

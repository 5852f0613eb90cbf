"""The executor's own host time: one rank's training step against a plain training loop of the same modules.

A tiny GPT (blocks whose work is negligible, so the host's time is what is measured) runs 1M1P1D with M micro-batches
in one process on the CPU, two ways, alternating so that a slower spell of the machine reaches both alike:

* the executor: :meth:`distsim.executor.runtime.Runtime.run_iteration` (marks around every block, its backward
  hooks, the recorder);
* a plain loop: the same modules, the same data, one forward through the blocks and one backward call per
  micro-batch, then the same optimizer step, nothing recorded.

Printed: the median step of each (over `--steps` after `--warmup`), their difference per block call (forward and
backward calls of every block and micro-batch), and the executor's own count of its hooks' and marks' time
(``hooks.overhead``; the recorder's marks are outside it). On a GPU the marks are CUDA events, dearer than the CPU's
clock reads; run it there with ``--device cuda``.

Run: python benchmarks/bench_executor_overhead.py [--micro-batches 4 --steps 30 --warmup 5 --device cpu]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch
from machine import describe

from distsim import Strategy, get_cluster
from distsim.core.models import get_model
from distsim.core.partition import ranges
from distsim.core.placement import Placement
from distsim.core.schedules import build_schedule
from distsim.executor.runtime import Runtime

MODEL = "gpt2-345m:seq=8,layers=12,hidden=16,heads=2,vocab=32,precision=fp32"


def runtime(micro_batches: int, device: torch.device) -> Runtime:
    model, cluster = get_model(MODEL), get_cluster("cpu-1x2")
    strategy = Strategy(micro_batch_size=1, num_micro_batches=micro_batches, partition=(model.num_layers,))
    one = cluster.with_nodes(1).__class__(**{**cluster.__dict__, "nodes": 1, "gpus_per_node": 1, "slowdown": ()})
    return Runtime(model, strategy, Placement(strategy, one), build_schedule(strategy), ranges(strategy.partition),
                   0, {}, torch.float32, device)  # fmt: skip


def plain_step(rt: Runtime, iteration: int) -> None:
    """One training step of `rt`'s modules as a plain loop runs it (its data prefetched the same way)."""
    rt._prefetch(iteration)
    scale = 1.0 / rt.strategy.num_micro_batches
    for mb in range(rt.strategy.num_micro_batches):
        x: Any = None
        for li, layer in enumerate(rt.model.layers):
            for bi in range(len(layer.blocks)):
                feed = iter(rt.data.pop((li, bi, mb), []))
                args = [x if is_float and x is not None else next(feed) for is_float in rt.signature[(li, bi)]]
                x = rt.modules[(li, bi)](*args)
        (x * scale).backward()
    rt.optimizer.step()
    rt.zero_grad()


def median_s(fn: Any, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(1)
    rt = runtime(args.micro_batches, device)
    executor, plain = [], []
    for step in range(args.warmup + args.steps):
        e = median_s(lambda step=step: (rt.run_iteration(step, lambda: None), rt.zero_grad()), device)
        p = median_s(lambda step=step: plain_step(rt, step), device)
        if step >= args.warmup:
            executor.append(e)
            plain.append(p)
    calls = 2 * args.micro_batches * sum(len(layer.blocks) for layer in rt.model.layers)
    e_s, p_s = statistics.median(executor), statistics.median(plain)
    own = rt.hooks.overhead.per_block_us()
    print(f"machine: {describe()}; device {device}, torch {torch.__version__}, 1 thread")
    print(f"{MODEL}, 1M1P1D, M={args.micro_batches}: {calls} block calls per step (forward and backward)")
    print(f"  executor step {e_s * 1e3:.2f} ms, plain loop {p_s * 1e3:.2f} ms (medians of {args.steps})")
    print(f"  the executor's extra host time: {(e_s - p_s) / calls * 1e6:.1f} us per block call")
    print("  its hooks' own count: " + ", ".join(f"{k} {v:.1f} us" for k, v in own.items()))


if __name__ == "__main__":
    main()

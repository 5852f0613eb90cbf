"""A plain training loop of a ``--torch-model`` builder: what distsim's prediction of 1M1P1D is compared with.

  python examples/torch_models/train_loop.py SPEC --micro-batches M --steps N --warmup W

SPEC is what ``distsim profile --torch-model`` takes (``examples/torch_models/hf_gpt2.py:toy``). Each step runs M
micro-batches of the builder's example batch (forward, loss / M, backward), then one AdamW step and zeroes the
gradients, as a single-GPU training loop does; the step's time is read after ``torch.cuda.synchronize()`` on CUDA.
The module, batch and loss go through distsim's own ``--torch-model`` contract (``distsim.profiler.torch_user``), so
the loop trains exactly what the profile measured. After W untimed warm-up steps, N steps are timed and one JSON line
is printed: the median step seconds and the spread ``(max - min) / median`` of the timed steps, with each step's time.
On the CPU torch uses all of this process's cores, as the profiler does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

try:
    from distsim.profiler.torch_user import TorchModelError, build, call_module, loss_of
except ImportError:  # run from a checkout without distsim installed: the repository is two folders up
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from distsim.profiler.torch_user import TorchModelError, build, call_module, loss_of


def step_times(module: torch.nn.Module, batch: Any, micro_batches: int, steps: int, warmup: int) -> list[float]:
    """Seconds of each of `warmup + steps` training steps (the caller drops the warm-up ones)."""
    cuda = next(module.parameters()).is_cuda
    opt = torch.optim.AdamW(module.parameters(), lr=1e-4)
    times = []
    for _ in range(warmup + steps):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(micro_batches):
            (loss_of(call_module(module, batch)) / micro_batches).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return times


def summary(spec: str, module: torch.nn.Module, micro_batches: int, times: list[float]) -> dict[str, Any]:
    median = statistics.median(times)
    param = next(module.parameters())
    return {"spec": spec, "device": str(param.device), "dtype": str(param.dtype).removeprefix("torch."),
            "micro_batches": micro_batches, "steps": len(times), "median_step_s": median,
            "spread": (max(times) - min(times)) / median, "step_s": times}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", help="module:function or path/to/file.py:function, as --torch-model takes it")
    parser.add_argument("--micro-batches", type=int, default=4, help="micro-batches per step (M)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    args = parser.parse_args(argv)
    if args.micro_batches < 1 or args.steps < 1 or args.warmup < 0:
        parser.error("--micro-batches and --steps must be at least 1, --warmup at least 0")
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cpu":
        torch.set_num_threads(len(os.sched_getaffinity(0)))
    try:
        module, batch = build(args.spec, dev)
    except TorchModelError as exc:  # a bad SPEC or a builder that raised: one line, as distsim profile says it
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    times = step_times(module, batch, args.micro_batches, args.steps, args.warmup)[args.warmup :]
    print(json.dumps(summary(args.spec, module, args.micro_batches, times)), flush=True)


if __name__ == "__main__":
    main()

"""Timing the optimizer step: Adam over a flat parameter shard of N elements (the simulator's optimizer event)."""

from __future__ import annotations

import time

import torch

from distsim.sim.costs import optimizer_key


def time_optimizer_step(params: int, state_bytes: int, device: torch.device, warmup: int = 2,
                        repeats: int = 5) -> tuple[str, list[float]]:  # fmt: skip
    """Seconds of `repeats` Adam steps on `params` parameters (fp32 master weights and moments).

    With 16 bytes of state per parameter and a mixed-precision model (state_bytes includes a 2-byte model copy and
    2-byte gradients), the step also writes the low-precision copy, as mixed-precision training does.
    """
    master = torch.zeros(params, dtype=torch.float32, device=device, requires_grad=True)
    master.grad = torch.full_like(master, 1e-3)
    opt = torch.optim.Adam([master], lr=1e-4, foreach=True)
    mixed = state_bytes == 16 and device.type == "cuda"
    copy = torch.empty(params, dtype=torch.float16, device=device) if mixed else None
    times = []
    for rep in range(warmup + repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        opt.step()
        if copy is not None:
            copy.copy_(master.detach())
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if rep >= warmup:
            times.append(time.perf_counter() - t0)
    return optimizer_key(params, state_bytes), times

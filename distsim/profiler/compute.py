"""Timing compute events (DistSim Sec. 4.1): one tensor-parallel shard of one block, forward or backward.

A :class:`~distsim.costs.ComputeEvent` is measured by building the shard's module (:mod:`distsim.profiler.blocks`,
tp rank 0, local communication hooks: the all-reduces are separate communication events) and timing

* ``F``: the forward pass, with autograd recording as in training;
* ``B``: ``torch.autograd.backward`` of the loss (``lm_head``) or of the output with a random gradient, after an
  untimed forward for each repetition.

CPU times come from ``time.perf_counter``; CUDA times from a pair of CUDA events around the op. The FLOPs of one
untimed run of the phase are counted by ``torch.utils.flop_counter.FlopCounterMode`` (matmuls, convolutions and
fused attention). Nothing here uses ``torch.distributed``.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from distsim.costs import ComputeEvent
from distsim.profiler.blocks import TPComm, build_block, torch_dtype


@dataclass
class ComputeTiming:
    """Measured duration of one compute event (seconds over `repeats` timed repetitions)."""

    key: str
    median_s: float
    mean_s: float
    samples_s: tuple[float, ...]
    p10_s: float
    p90_s: float
    repeats: int
    flops: float | None
    """FLOPs of one run of the phase as counted by torch, or None if counting failed."""
    device: str
    dtype: str
    """The torch dtype the event ran in (``float32``, ``bfloat16``, ``float16``)."""


def device_name(device: torch.device | str) -> str:
    """A human-readable device model: the CUDA device name, or the CPU model from /proc/cpuinfo."""
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.get_device_name(dev)
    if dev.type == "cpu":
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name") and ":" in line:
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return platform.processor() or platform.machine() or "cpu"
    return str(dev)


def local_device_name() -> str:
    """The device this machine's ranks run on, named as profiles and traces record it: the first GPU, else the CPU."""
    return device_name(torch.device("cuda:0" if torch.cuda.is_available() else "cpu"))


def _extra_flop_formulas() -> dict[Any, Callable[..., int]]:
    """FLOP formulas torch lacks: its CPU fused attention kernel (``_scaled_dot_product_flash_attention_for_cpu``)
    is not in FlopCounterMode's registry, so SDPA on CPU would count 0. The CUDA kernels' formulas are reused (full
    attention matrix, causal masking not discounted: the convention of Narayanan et al. 2021, 4 s^2 h per layer)."""
    try:
        from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

        fwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        bwd = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    except (ImportError, AttributeError):
        return {}

    def fwd_flops(query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kwargs: Any) -> int:
        return sdpa_flop_count(query_shape, key_shape, value_shape)

    def bwd_flops(grad_shape: Any, query_shape: Any, key_shape: Any, value_shape: Any, *a: Any, **k: Any) -> int:
        return sdpa_backward_flop_count(grad_shape, query_shape, key_shape, value_shape)

    formulas: dict[Any, Callable[..., int]] = {}
    if fwd not in flop_registry:
        formulas[fwd] = fwd_flops
    if bwd not in flop_registry:
        formulas[bwd] = bwd_flops
    return formulas


def count_flops(fn: Callable[[], object]) -> int | None:
    """Total FLOPs torch counts while running `fn` (matmuls, convolutions, attention), or None if counting fails."""
    try:
        with FlopCounterMode(display=False, custom_mapping=_extra_flop_formulas()) as counter:
            fn()
        return int(counter.get_total_flops())
    except Exception:
        return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: torch.device) -> tuple[float, Any]:
    """Seconds `fn` takes (CUDA: between two events on the current stream) and its result."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        result = fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3, result
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


IN_FLIGHT = 4
"""Micro-batches whose activations are alive at once while timing (a pipeline stage keeps several)."""
EVICT_BYTES = 32 * 2**20
"""Bytes swept before each timed call so that the block's weights are not hot in cache."""


def time_compute_event(
    event: ComputeEvent,
    device: torch.device | str,
    warmup: int = 2,
    repeats: int = 10,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> ComputeTiming:
    """Measure `event` on `device`: median, 10th and 90th percentile over `repeats` runs after `warmup` runs.

    Raises ValueError for events without a module (see :func:`~distsim.profiler.blocks.build_block`).
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    if event.phase not in ("F", "B"):
        raise ValueError(f"unknown phase {event.phase!r} (expected F or B)")
    dev = torch.device(device)
    dtype = torch_dtype(event.dtype, dev)
    if progress is not None:
        progress(f"{event.key}: building")
    module = build_block(
        event.block,
        event.effective_tp,
        0,
        TPComm.local(),
        dtype,
        dev,
        generator=torch.Generator(device=dev).manual_seed(seed),
    )
    evict = torch.empty(EVICT_BYTES // 4, dtype=torch.float32, device=dev)  # stands in for the stage's other layers
    counter = [seed + 1]

    def fresh_inputs() -> tuple[Tensor, ...]:
        counter[0] += 1
        return module.example_inputs(event.micro_batch_size, torch.Generator(device=dev).manual_seed(counter[0]))

    inputs = fresh_inputs()

    def forward() -> Tensor:
        return module(*inputs)

    out = forward()
    if out.ndim == 0:
        grad: Tensor | None = None
    else:
        gen = torch.Generator(device=dev).manual_seed(seed + 2)
        grad = torch.randn(out.shape, generator=gen, device=dev, dtype=torch.float32).to(out.dtype)
    del out

    # As a pipeline stage runs it: IN_FLIGHT micro-batches forward with their activations kept for backward, then
    # their backwards in reverse; before each timed call the cache is swept, as the stage's other layers would.
    # (Timing one block in a hot loop reuses the same memory and cached weights: 15-20 % fast on CPU.)
    times: list[float] = []
    rounds = warmup + -(-repeats // IN_FLIGHT)
    for r in range(rounds):
        kept = []
        for _ in range(IN_FLIGHT):
            x = fresh_inputs()
            evict.add_(1.0)
            _sync(dev)
            dt, out = _timed(lambda x=x: module(*x), dev)
            kept.append(out)
            if event.phase == "F" and r >= warmup:
                times.append(dt)
        for out in reversed(kept):
            evict.add_(1.0)
            _sync(dev)
            dt, _ = _timed(lambda out=out: torch.autograd.backward(out, grad), dev)
            if event.phase == "B" and r >= warmup:
                times.append(dt)
        del kept, out
    times = times[:repeats]

    def backward_of(out: Tensor) -> Callable[[], None]:
        return lambda: torch.autograd.backward(out, grad)

    if event.phase == "F":
        flops = count_flops(forward)
    else:
        run = backward_of(forward())
        flops = count_flops(run)
        del run
    p10, median, p90 = (float(v) for v in np.percentile(times, [10, 50, 90]))
    mean = float(np.mean(times))
    timing = ComputeTiming(
        key=event.key,
        median_s=median,
        mean_s=mean,
        samples_s=tuple(times),
        p10_s=p10,
        p90_s=p90,
        repeats=repeats,
        flops=None if flops is None else float(flops),
        device=device_name(dev),
        dtype=str(dtype).removeprefix("torch."),
    )
    if progress is not None:
        progress(f"{event.key}: median {median * 1e3:.3f} ms (p10 {p10 * 1e3:.3f}, p90 {p90 * 1e3:.3f})")
    return timing


# ------------------------------------------------------------------------------------------ any forward and backward
def mark(device: torch.device) -> Any:
    """A point in the device's time: a recorded CUDA event on the current stream, else the host clock."""
    if device.type == "cuda":
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def seconds_between(start: Any, end: Any) -> float:
    """Seconds between two :func:`mark` s (waits for a CUDA event to complete)."""
    if isinstance(start, float):
        return end - start
    end.synchronize()
    return start.elapsed_time(end) / 1e3


Step = tuple[str, Callable[[], object]]
"""A named piece of work to time on its own (a backward pass)."""


def time_in_flight(
    forward: Callable[[], tuple[Any, dict[str, float]]],
    backward: Callable[[Any], list[Step]],
    device: torch.device | str,
    warmup: int = 2,
    repeats: int = 10,
) -> dict[str, list[float]]:
    """Seconds per name of work that times its own forward and hands back its backward, measured as
    :func:`time_compute_event` measures a block: IN_FLIGHT forwards with their activations kept, then their
    backwards in reverse, the cache swept before each call, `warmup` rounds discarded.

    `forward()` runs once and returns (what its backward needs, seconds per name it timed, e.g. with
    :func:`_timed` or between :func:`mark` s); `backward(value)` returns the steps to time in order. Returns
    `repeats` samples per name (the first `repeats` after warm-up).
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    dev = torch.device(device)
    evict = torch.empty(EVICT_BYTES // 4, dtype=torch.float32, device=dev)
    samples: dict[str, list[float]] = {}
    for r in range(warmup + -(-repeats // IN_FLIGHT)):
        kept = []
        for _ in range(IN_FLIGHT):
            evict.add_(1.0)
            _sync(dev)
            value, times = forward()
            kept.append(value)
            for name, dt in times.items():
                if r >= warmup:
                    samples.setdefault(name, []).append(dt)
        while kept:  # the latest first, each freed once its backward ran
            for name, step in backward(kept.pop()):
                evict.add_(1.0)
                _sync(dev)
                dt, _ = _timed(step, dev)
                if r >= warmup:
                    samples.setdefault(name, []).append(dt)
    return {name: times[:repeats] for name, times in samples.items()}

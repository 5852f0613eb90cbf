"""Timing compute events (DistSim Sec. 4.1): one tensor-parallel shard of one block, forward or backward.

A :class:`~distsim.sim.costs.ComputeEvent` is measured by building the shard's module (:mod:`distsim.profiler.blocks`,
tp rank 0, local communication hooks: the all-reduces are separate communication events) and timing

* ``F``: the forward pass, with autograd recording as in training;
* ``B``: ``torch.autograd.backward`` of the loss (``lm_head``) or of the output with a random gradient, after an
  untimed forward for each repetition.

CPU times come from ``time.perf_counter``. CUDA times come from a pair of CUDA events around the op with the GPU kept
fed (a sleep kernel queued before the start event, so the host enqueues the whole block before the GPU reaches it;
L2 swept with twice its size before each call; see :class:`FedTimer`), and the host's time to enqueue the op is
measured too (the event's launch time). The FLOPs of one
untimed run of the phase are counted by ``torch.utils.flop_counter.FlopCounterMode`` (matmuls, convolutions and
fused attention). Nothing here uses ``torch.distributed``.

The timing loop itself (:func:`time_steps`: micro-batches in flight, sweep, warm-up, the fed timer on CUDA) takes any
named forward and backward calls, so a user's torch module's layers (``distsim profile --torch-model``,
:mod:`distsim.profiler.torch_timing`) are timed by the same code as the zoo's blocks.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from distsim.profiler.blocks import torch_dtype
from distsim.profiler.build import build_block
from distsim.profiler.tp_comm import TPComm
from distsim.sim.costs import ComputeEvent


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
    launch_s: float | None = None
    """Mean host seconds to enqueue one call (CUDA; None on CPU, where the host runs the work)."""
    starved: int = 0
    """Timed CUDA calls whose host launch outlasted the sleep queued before them."""


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
"""Bytes swept before each timed call on CPU so that the block's weights are not hot in cache (on CUDA: at least
this, see :func:`evict_bytes`)."""
L2_FLUSH_FACTOR = 2
"""On CUDA the sweep before each timed call covers this many times the device's L2 cache."""
CUDA_WARMUP_S = 0.5
"""Least seconds of untimed rounds per event on CUDA (besides ``warmup`` rounds): clocks ramp up, and cuBLAS, cuDNN
and lazily loaded kernels pick and load their kernels on the first calls of a shape."""
MAX_WARMUP_ROUNDS = 200
"""Most warm-up rounds a time-based warm-up runs (tiny blocks would otherwise run thousands)."""
SLEEP_MARGIN = 2.0
"""On CUDA the GPU sleeps this many times the host's recent launch time of the phase before each timed call..."""
SLEEP_PAD_S = 1e-4
"""... plus this, so the host has enqueued the whole block before the GPU reaches it."""
FIRST_SLEEP_S = 5e-3
"""The sleep before the first call of a phase, whose launch time is not known yet (a warm-up call)."""
MAX_SLEEP_S = 0.5


def evict_bytes(device: torch.device | str) -> int:
    """Bytes swept before each timed call: on CUDA ``L2_FLUSH_FACTOR`` times the device's L2 cache as torch reports
    it (at least ``EVICT_BYTES``), elsewhere ``EVICT_BYTES``."""
    dev = torch.device(device)
    if dev.type == "cuda":
        l2 = int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0) or 0)
        return max(EVICT_BYTES, L2_FLUSH_FACTOR * l2)
    return EVICT_BYTES


class FedTimer:
    """Times calls on a CUDA device with the GPU kept fed, and the host's time to enqueue them.

    Per call: synchronise; sweep L2 (``evict.add_(1)``, a buffer of :func:`evict_bytes`); queue
    ``torch.cuda._sleep`` for ``SLEEP_MARGIN`` x the host's longest launch time of the phase's last ``IN_FLIGHT``
    calls + ``SLEEP_PAD_S``; record the start event; call (the host enqueues the block while the GPU sleeps; the
    host's ``perf_counter`` around the call, with no synchronisation, is the launch time); record the end event;
    wait for it. The GPU time is start to end: the sleep and the sweep are before the start event. Timing with a
    synchronisation before each call instead lets the GPU wait for each kernel's launch (on an H100 transformer
    blocks measured 1.14-1.35x their time in a 24-layer chain, and up to 1.7x, 3x for an embedding, their time
    timed alone with the GPU kept fed).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cycles_per_s = 0.0
        self.recent: dict[str, list[float]] = {}
        self.starved = 0
        """Timed calls whose host launch outlasted the sleep before them (the GPU may have waited for the host)."""
        self.calibrate()

    def calibrate(self) -> None:
        """Clock cycles per second of ``torch.cuda._sleep``: the fastest of three sleeps (so a sleep computed from it
        lasts at least as long as intended); run again after warm-up, when the clocks are up."""
        cycles, rates = 1_000_000, []
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            rates.append(cycles / max(start.elapsed_time(end) / 1e3, 1e-9))
        self.cycles_per_s = max(rates)

    def sleep_s(self, phase: str) -> float:
        recent = self.recent.get(phase)
        if not recent:
            return FIRST_SLEEP_S
        return min(MAX_SLEEP_S, SLEEP_MARGIN * max(recent) + SLEEP_PAD_S)

    def __call__(self, fn: Callable[[], Any], evict: Tensor, phase: str, timed: bool) -> tuple[float, float, Any]:
        """(GPU seconds, host launch seconds, fn's result); `phase` names the calls whose launch times size the
        sleep; `timed` False for warm-up calls (not counted as starved)."""
        torch.cuda.synchronize(self.device)
        evict.add_(1.0)
        sleep = self.sleep_s(phase)
        torch.cuda._sleep(int(sleep * self.cycles_per_s))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        result = fn()
        launch = time.perf_counter() - t0
        end.record()
        end.synchronize()
        self.recent[phase] = [*self.recent.get(phase, [])[-(IN_FLIGHT - 1) :], launch]
        if timed and launch > sleep:
            self.starved += 1
        return start.elapsed_time(end) / 1e3, launch, result


@dataclass
class PhaseTimes:
    """What :func:`time_steps` measured of one named call: device seconds per timed call, and on CUDA the host's
    launch seconds (None on CPU, where the host runs the work: its launch is the work itself)."""

    times_s: list[float]
    launch_s: list[float] | None
    starved: int = 0
    warmup_rounds: int = 0


Step = tuple[str, Callable[[], object]]
"""A named call to time on its own: one phase of one layer (``F``, ``B``, ``pre/B`` ...)."""
Forward = Callable[[], Step]
"""Prepares one micro-batch (its fresh inputs, untimed) and returns the named call that runs its forward."""
Backward = Callable[[Any], list[Step]]
"""The named calls, in order, that run the backward of what a forward call returned."""


@dataclass(frozen=True)
class Point:
    """A moment inside a timed call (:func:`point`): the device's (a CUDA event recorded on the current stream; on
    CPU the host clock) and the host's clock."""

    device: Any
    host: float


def point(device: torch.device) -> Point:
    """The device's and the host's time now (a CUDA event is recorded, nothing waits for it)."""
    if device.type == "cuda":
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return Point(event, time.perf_counter())
    now = time.perf_counter()
    return Point(now, now)


@dataclass
class Split:
    """What a timed call returns when it runs several layers' work in one piece (a forward pass of a whole module
    with its blocks stubbed runs ``pre`` and ``post``, which cannot be called apart): `value` is kept for the
    backward, and each part is recorded under its own name, timed between its two :class:`Point` s, instead of the
    call. The call is fed and swept as any other; its parts are timed when the call is."""

    value: Any
    parts: dict[str, tuple[Point, Point]]


def _between(start: Point, end: Point) -> tuple[float, float]:
    """(device seconds, host seconds) from `start` to `end`; CUDA events must have completed (the timer waited for
    the end of the call that recorded them)."""
    if isinstance(start.device, float):
        return end.device - start.device, end.host - start.host
    return start.device.elapsed_time(end.device) / 1e3, end.host - start.host


class _Steps:
    """One :func:`time_steps` run's timer (CUDA: :class:`FedTimer`), sweep buffer and recordings."""

    def __init__(self, device: torch.device, timed: Collection[str] | None) -> None:
        self.device, self.timed = device, timed
        self.evict = torch.empty(evict_bytes(device) // 4, dtype=torch.float32, device=device)
        self.timer = FedTimer(device) if device.type == "cuda" else None
        self.samples: dict[str, list[float]] = {}
        self.launches: dict[str, list[float]] = {}
        self.starved: dict[str, int] = {}

    def wanted(self, name: str) -> bool:
        return self.timed is None or name in self.timed

    def call(self, name: str, fn: Callable[[], Any], warming: bool) -> Any:
        """Run `fn` (CPU: swept and timed with ``perf_counter``; CUDA: fed and swept by the timer if `name` is
        timed, else only enqueued), record its time (or its :class:`Split`'s parts') unless `warming`, and return
        its result (a Split's value)."""
        timer = self.timer
        if timer is not None and not self.wanted(name):  # CUDA, not timed: only run it (activations, a backward)
            result = fn()
            return result.value if isinstance(result, Split) else result
        if timer is None:  # CPU: the host runs the work
            self.evict.add_(1.0)
            _sync(self.device)
            dt, result = _timed(fn, self.device)
            launch, starved = None, 0
        else:
            before = timer.starved
            dt, launch, result = timer(fn, self.evict, name, timed=not warming)
            starved = timer.starved - before
        parts: dict[str, tuple[float, float | None]] = {name: (dt, launch)}
        if isinstance(result, Split):
            parts = {part: _between(a, b) for part, (a, b) in result.parts.items()}
            result = result.value
        if not warming and self.wanted(name):
            for part, (seconds, host) in parts.items():
                self.samples.setdefault(part, []).append(seconds)
                if timer is not None and host is not None:
                    self.launches.setdefault(part, []).append(host)
                self.starved[part] = self.starved.get(part, 0) + starved
        return result

    def round(self, forward: Forward, backward: Backward, warming: bool) -> None:
        """``IN_FLIGHT`` forwards with their results kept, then their backwards, the latest first."""
        kept = [self.call(*forward(), warming) for _ in range(IN_FLIGHT)]
        for value in reversed(kept):  # all freed when the round ends
            for name, fn in backward(value):
                self.call(name, fn, warming)

    def result(self, repeats: int, warmup_rounds: int) -> dict[str, PhaseTimes]:
        cuda = self.timer is not None
        return {
            name: PhaseTimes(times[:repeats], self.launches.get(name, [])[:repeats] if cuda else None,
                             self.starved.get(name, 0), warmup_rounds)
            for name, times in self.samples.items()
        }  # fmt: skip


def time_steps(
    forward: Forward,
    backward: Backward,
    timed: Collection[str] | None,
    device: torch.device,
    warmup: int,
    repeats: int,
    warmup_s: float | None = None,
) -> dict[str, PhaseTimes]:
    """Time named calls as a pipeline stage runs them: ``IN_FLIGHT`` micro-batches forward (`forward()` prepares
    one and names its call) with their results kept, then their backwards in reverse (`backward(result)` names the
    calls), the cache swept before each timed call (as the stage's other layers would; a block repeated in a hot
    loop reuses the same memory and cached weights: 15-20 % fast on CPU). Calls named in `timed` (None: every call)
    are recorded, a :class:`Split`'s parts under their own names.

    At least `warmup` untimed rounds run first, and on CUDA until `warmup_s` seconds have passed (default
    ``CUDA_WARMUP_S``; CPU: 0). CPU calls are timed with ``perf_counter``; on CUDA the timed calls with
    :class:`FedTimer` (GPU kept fed, L2 swept, the host's launch time recorded), the others only enqueued. The one
    timing path of the zoo's blocks (:func:`time_phase`) and a user's torch module's layers
    (:mod:`distsim.profiler.torch_timing`). Returns `repeats` samples per recorded name.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    steps = _Steps(device, timed)
    cuda = device.type == "cuda"
    warm_s = (CUDA_WARMUP_S if cuda else 0.0) if warmup_s is None else warmup_s
    rounds_needed, timed_rounds, r, warming = -(-repeats // IN_FLIGHT), 0, 0, True
    started = time.perf_counter()
    while timed_rounds < rounds_needed:
        if warming and r >= warmup and (time.perf_counter() - started >= warm_s or r >= MAX_WARMUP_ROUNDS):
            warming = False
            if steps.timer is not None:
                steps.timer.calibrate()  # the clocks are up now
        steps.round(forward, backward, warming)
        timed_rounds += not warming
        r += 1
    return steps.result(repeats, r - rounds_needed)


def time_phase(
    call: Callable[..., Tensor],
    fresh_inputs: Callable[[], tuple[Tensor, ...]],
    grad: Tensor | None,
    phase: str,
    device: torch.device,
    warmup: int,
    repeats: int,
    warmup_s: float | None = None,
) -> PhaseTimes:
    """Time `phase` of a block (``F``: ``call(*inputs)``; ``B``: ``torch.autograd.backward`` of its output with
    `grad`) with :func:`time_steps`, the other phase run (on CUDA only enqueued) to keep the activations and free
    them."""

    def forward() -> Step:
        x = fresh_inputs()
        return "F", lambda: call(*x)

    def backward(out: Any) -> list[Step]:
        return [("B", lambda: torch.autograd.backward(out, grad))]

    return time_steps(forward, backward, {phase}, device, warmup, repeats, warmup_s)[phase]


def time_compute_event(
    event: ComputeEvent,
    device: torch.device | str,
    warmup: int = 2,
    repeats: int = 10,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    warmup_s: float | None = None,
) -> ComputeTiming:
    """Measure `event` on `device`: median, 10th and 90th percentile over `repeats` runs after `warmup` runs (on
    CUDA also at least `warmup_s` seconds of them, default ``CUDA_WARMUP_S``), and on CUDA the host's mean launch
    time (see :func:`time_phase`).

    Raises ValueError for events without a module (see :func:`~distsim.profiler.build.build_block`).
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats} and {warmup}")
    if event.phase not in ("F", "B"):
        raise ValueError(f"unknown phase {event.phase!r} (expected F or B)")
    dev = torch.device(device)
    dtype = torch_dtype(event.dtype, dev)
    if progress is not None:
        progress(f"{event.key}: building")
    module, fresh_inputs, forward, grad = _event_module(event, dev, dtype, seed)
    measured = time_phase(module, fresh_inputs, grad, event.phase, dev, warmup, repeats, warmup_s)
    flops = _phase_flops(event.phase, forward, grad)
    timing = _compute_timing(event.key, measured, repeats, flops, dev, dtype)
    if progress is not None:
        progress(_describe(timing))
    return timing


def _event_module(
    event: ComputeEvent, dev: torch.device, dtype: torch.dtype, seed: int
) -> tuple[Callable[..., Tensor], Callable[[], tuple[Tensor, ...]], Callable[[], Tensor], Tensor | None]:
    """(the event's shard module, its weights from `seed`; a source of fresh inputs, seeded ``seed + 2``,
    ``seed + 3``, ... in turn; a forward of the first inputs; the gradient its backward is fed: None for a scalar
    loss, else random from ``seed + 2``)."""
    module = build_block(
        event.block,
        event.effective_tp,
        0,
        TPComm.local(),
        dtype,
        dev,
        generator=torch.Generator(device=dev).manual_seed(seed),
    )
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
    return module, fresh_inputs, forward, grad


def _phase_flops(phase: str, forward: Callable[[], Tensor], grad: Tensor | None) -> int | None:
    """FLOPs of one untimed run of the phase (:func:`count_flops`): the forward, or the backward of a forward's
    output (the forward not counted)."""
    if phase == "F":
        return count_flops(forward)
    out = forward()
    return count_flops(lambda: torch.autograd.backward(out, grad))


def _compute_timing(
    key: str, measured: PhaseTimes, repeats: int, flops: int | None, dev: torch.device, dtype: torch.dtype
) -> ComputeTiming:
    """The statistics of the timed calls (and on CUDA their mean launch time) as a :class:`ComputeTiming`."""
    times = measured.times_s
    p10, median, p90 = (float(v) for v in np.percentile(times, [10, 50, 90]))
    mean = float(np.mean(times))
    launch = None if measured.launch_s is None else float(np.mean(measured.launch_s))
    return ComputeTiming(
        key=key,
        median_s=median,
        mean_s=mean,
        samples_s=tuple(times),
        p10_s=p10,
        p90_s=p90,
        repeats=repeats,
        flops=None if flops is None else float(flops),
        device=device_name(dev),
        dtype=str(dtype).removeprefix("torch."),
        launch_s=launch,
        starved=measured.starved,
    )


def _describe(timing: ComputeTiming) -> str:
    """The progress line of a measured event: its median, percentiles, launch time and starved calls."""
    median, p10, p90, launch = timing.median_s, timing.p10_s, timing.p90_s, timing.launch_s
    host = "" if launch is None else f", host launch {launch * 1e3:.3f} ms"
    starved = f", {timing.starved} call(s) launched slower than the sleep before them" if timing.starved else ""
    return f"{timing.key}: median {median * 1e3:.3f} ms (p10 {p10 * 1e3:.3f}, p90 {p90 * 1e3:.3f}){host}{starved}"

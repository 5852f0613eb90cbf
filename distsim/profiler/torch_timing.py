"""Timing the layers of a traced torch module (:mod:`distsim.profiler.torch_model`), forward and backward.

One layer of each kind is timed, with the discipline of :func:`~distsim.profiler.compute.time_compute_event`
(:func:`~distsim.profiler.compute.time_in_flight`: several micro-batches in flight, caches swept, warm-up):

* a block is called on its own with the arguments it got in the traced pass (floating-point tensors that needed a
  gradient cloned afresh for every call, other objects such as a key-value cache copied as they were); its backward
  is that of its outputs with a fixed random gradient, as the profiler does for a zoo block;
* ``pre`` and ``post`` are timed inside one forward pass of the whole module whose blocks are stubs
  (:func:`~distsim.profiler.torch_model.stubbed`): ``pre`` from the call to the first block's stub, ``post`` from
  the last stub to the loss. The last stub returns a fresh leaf, so the loss's backward is ``post``'s alone; ``pre``'s
  backward is that of the first stub's inputs with a random gradient. Each backward computes the gradients of the
  parameters outside the blocks only (``inputs=``), so neither runs into the other.

FLOPs are counted by ``torch.utils.flop_counter`` in one untimed run (``pre``/``post``: read between the stubs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from distsim.core.models.graph import Block
from distsim.profiler.compute import (
    Step,
    _extra_flop_formulas,
    _timed,
    count_flops,
    mark,
    seconds_between,
    time_in_flight,
)
from distsim.profiler.torch_model import LayerInfo, TracedModel, stubbed
from distsim.profiler.torch_user import call_module, loss_of, map_tensors, snapshot, tensors_in
from distsim.sim.costs import ComputeEvent
from distsim.sim.profile_db import Measurement


def event(traced: TracedModel, layer: LayerInfo, phase: str) -> ComputeEvent:
    """The compute event a layer's phase is stored under (the simulator asks for the same key)."""
    block = Block(op=layer.op, shape=layer.shape, params=layer.params, tp="none")
    return ComputeEvent(block, phase, traced.micro_batch_size, 1, traced.precision)


def _fresh(t: Tensor) -> Tensor:
    """A block input as a previous layer would hand it over: new memory, a leaf needing a gradient if it did."""
    return t.detach().clone().requires_grad_() if t.requires_grad and t.is_floating_point() else t


def _random_grads(outs: list[Tensor], seed: int) -> list[Tensor]:
    gen = torch.Generator(device=outs[0].device).manual_seed(seed) if outs else None
    return [torch.randn(t.shape, generator=gen, device=t.device, dtype=torch.float32).to(t.dtype) for t in outs]


def _needing_grad(obj: Any) -> list[Tensor]:
    return [t for t in tensors_in(obj) if t.requires_grad and t.is_floating_point()]


def _block_work(traced: TracedModel, layer: LayerInfo) -> tuple[Callable[[], Any], Callable[[Any], list[Step]],
                                                                  Callable[[], object]]:  # fmt: skip
    """(forward, backward, one untimed forward) of a block called on its own."""
    path = layer.modules[0]
    module, call, dev = traced.module.get_submodule(path), traced.calls[path], traced.device
    grads: list[Tensor] = []

    def run() -> Any:
        args, kwargs = map_tensors(_fresh, snapshot(call.args)), map_tensors(_fresh, snapshot(call.kwargs))
        return lambda: module(*args, **kwargs)

    def forward() -> tuple[Any, dict[str, float]]:
        dt, out = _timed(run(), dev)
        return out, {"F": dt}

    def backward(out: Any) -> list[Step]:
        outs = _needing_grad(out)
        if not grads:
            grads.extend(_random_grads(outs, seed=2))
        return [("B", lambda: torch.autograd.backward(outs, grads) if outs else None)]

    return forward, backward, lambda: run()()


def _outside_params(traced: TracedModel) -> list[Tensor]:
    inside = {id(p) for path in traced.units for p in traced.module.get_submodule(path).parameters()}
    return [p for p in traced.module.parameters() if p.requires_grad and id(p) not in inside]


def _segment_work(traced: TracedModel) -> tuple[Callable[[], Any], Callable[[Any], list[Step]]]:
    """(forward, backward) of one forward pass with stubbed blocks, timing ``pre`` and ``post``."""
    dev, last = traced.device, len(traced.units) - 1
    params = _outside_params(traced)
    state: dict[str, Any] = {}
    grads: list[Tensor] = []

    def on_call(k: int, args: Any, kwargs: Any, output: Any) -> Any:
        if k == 0:
            state["first"], state["pre_out"] = mark(dev), _needing_grad((args, kwargs))
        if k == last:
            output = map_tensors(lambda t: t.clone().requires_grad_(t.is_floating_point()), output)
            state["leaf"], state["last"] = _needing_grad(output), mark(dev)
        return output

    def forward() -> tuple[Any, dict[str, float]]:
        state.clear()
        with stubbed(traced, on_call):
            start = mark(dev)
            loss = loss_of(call_module(traced.module, traced.batch))
            end = mark(dev)
        if traced.whole:
            return (loss, [], []), {"pre/F": seconds_between(start, end)}
        times = {}
        if traced.has_pre:
            times["pre/F"] = seconds_between(start, state["first"])
        if traced.has_post:
            times["post/F"] = seconds_between(state["last"], end)
        return (loss, state["pre_out"], state["leaf"]), times

    def backward(value: Any) -> list[Step]:
        loss, pre_out, leaf = value
        if traced.whole:
            return [("pre/B", loss.backward)]
        steps: list[Step] = []
        if traced.has_post:
            steps.append(("post/B", lambda: torch.autograd.backward(loss, inputs=leaf + params)))
        if traced.has_pre:
            if not grads:
                grads.extend(_random_grads(pre_out, seed=3))
            steps.append(("pre/B", lambda: torch.autograd.backward(pre_out, grads, inputs=params)
                          if pre_out and params else None))  # fmt: skip
        return steps

    return forward, backward


def _segment_flops(traced: TracedModel) -> dict[str, float]:
    """Forward FLOPs of ``pre`` and ``post`` (read off one counted forward pass with stubbed blocks)."""
    last = len(traced.units) - 1
    seen: dict[str, float] = {}
    try:
        with FlopCounterMode(display=False, custom_mapping=_extra_flop_formulas()) as counter:

            def on_call(k: int, args: Any, kwargs: Any, output: Any) -> Any:
                if k == 0:
                    seen["first"] = counter.get_total_flops()
                if k == last:
                    seen["last"] = counter.get_total_flops()
                return output

            with stubbed(traced, on_call):
                loss_of(call_module(traced.module, traced.batch))
            total = float(counter.get_total_flops())
    except Exception:
        return {}
    if traced.whole:
        return {"pre": total}
    return {"pre": seen.get("first", 0.0), "post": total - seen.get("last", total)}


def _measurement(samples: list[float], flops: float | None) -> Measurement:
    samples = [max(s, 1e-9) for s in samples]  # a step with nothing to do still reads as a positive time
    p10, median, p90 = (float(v) for v in np.percentile(samples, [10, 50, 90]))
    return Measurement(median, p10, p90, len(samples), flops, float(np.mean(samples)), tuple(samples))


def time_layers(
    traced: TracedModel,
    warmup: int = 2,
    repeats: int = 10,
    known: set[str] | frozenset[str] = frozenset(),
    progress: Callable[[str], None] | None = None,
) -> tuple[dict[str, Measurement], dict[str, float]]:
    """Measurements of every layer kind's forward and backward (keys as the simulator asks for them), skipping
    kinds whose events are all `known`, and each kind's forward FLOPs per micro-batch."""
    say = progress or (lambda _m: None)
    results: dict[str, Measurement] = {}
    flops: dict[str, float] = {}
    kinds = traced.kinds()
    todo = {k: x for k, x in kinds.items() if not {event(traced, x, p).key for p in "FB"} <= set(known)}
    blocks = {k: x for k, x in todo.items() if k not in ("pre", "post")}
    for i, (kind, layer) in enumerate(sorted(blocks.items())):
        say(f"torch layer {i + 1}/{len(blocks)}: {kind} ({layer.name}) forward and backward")
        forward, backward, once = _block_work(traced, layer)
        counted = count_flops(once)
        if counted is not None:
            flops[kind] = float(counted)
        samples = time_in_flight(forward, backward, traced.device, warmup, repeats)
        _store(results, traced, layer, samples, flops.get(kind))
        say(_line(traced, layer, results))
    ends = [k for k in ("pre", "post") if k in todo]
    if ends:
        say(f"torch layers {' and '.join(ends)}: one forward pass with the blocks stubbed")
        flops.update(_segment_flops(traced))
        forward, backward = _segment_work(traced)
        samples = time_in_flight(forward, backward, traced.device, warmup, repeats)
        for kind in ends:
            part = {phase: samples[f"{kind}/{phase}"] for phase in "FB"}
            _store(results, traced, todo[kind], part, flops.get(kind))
            say(_line(traced, todo[kind], results))
    return results, flops


def _store(results: dict[str, Measurement], traced: TracedModel, layer: LayerInfo, samples: dict[str, list[float]],
           fwd_flops: float | None) -> None:  # fmt: skip
    for phase in "FB":
        results[event(traced, layer, phase).key] = _measurement(samples[phase], fwd_flops if phase == "F" else None)


def _line(traced: TracedModel, layer: LayerInfo, results: dict[str, Measurement]) -> str:
    f, b = (results[event(traced, layer, p).key] for p in "FB")
    return f"  {layer.kind}: forward {f.seconds * 1e3:.3f} ms, backward {b.seconds * 1e3:.3f} ms (means)"

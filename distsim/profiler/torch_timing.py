"""Timing the layers of a traced torch module (:mod:`distsim.profiler.torch_model`), forward and backward.

One layer of each kind is timed by the zoo's own timing loop (:func:`~distsim.profiler.compute.time_steps`, as
:func:`~distsim.profiler.compute.time_compute_event` times a block: several micro-batches in flight, the cache swept
before each call, warm-up; on CUDA the GPU kept fed by :class:`~distsim.profiler.compute.FedTimer`, L2 swept, and
the host's launch time of each layer's forward and backward recorded as the zoo's events record it):

* a block is called on its own with the arguments it got in the traced pass (floating-point tensors that needed a
  gradient cloned afresh for every call, other objects such as a key-value cache copied as they were); its backward
  is that of its outputs with a fixed random gradient, as the profiler does for a zoo block;
* ``pre`` and ``post`` are timed inside one forward pass of the whole module whose blocks are stubs
  (:func:`~distsim.profiler.torch_model.stubbed`): ``pre`` from the call to the first block's stub, ``post`` from
  the last stub to the loss (:class:`~distsim.profiler.compute.Split`: points inside the one fed call). The last stub
  returns a fresh leaf, so the loss's backward is ``post``'s alone; ``pre``'s backward is that of the first stub's
  inputs with a random gradient. Each backward computes the gradients of the parameters outside the blocks only
  (``inputs=``), so neither runs into the other.

FLOPs of each layer's forward and backward are counted by ``torch.utils.flop_counter`` in one untimed run
(``pre``/``post`` forward: read between the stubs). The self-check (:func:`self_check`) then runs a chain of the
module's own consecutive blocks in situ, as the zoo's stage chains run (:func:`~distsim.profiler.insitu.time_in_situ`),
and records it as they are recorded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from distsim.core.models.graph import Block
from distsim.infra.self_check import record
from distsim.profiler.compute import (
    Backward,
    Forward,
    PhaseTimes,
    Split,
    Step,
    _extra_flop_formulas,
    count_flops,
    point,
    time_steps,
)
from distsim.profiler.insitu import CHAIN_LAYERS, CHAIN_ROUNDS, CHAIN_WARMUP, time_in_situ
from distsim.profiler.torch_model import LayerInfo, TracedModel, span, stubbed
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


def _block_work(traced: TracedModel, layer: LayerInfo) -> tuple[Forward, Backward]:
    """(forward, backward) of a block called on its own, as :func:`~distsim.profiler.compute.time_steps` and
    :func:`~distsim.profiler.insitu.time_in_situ` take them: the forward's arguments are made afresh before the
    call (untimed), its backward is that of its outputs needing a gradient with a fixed random gradient."""
    path = layer.modules[0]
    module, call = traced.module.get_submodule(path), traced.calls[path]
    grads: list[Tensor] = []

    def forward() -> Step:
        args, kwargs = map_tensors(_fresh, snapshot(call.args)), map_tensors(_fresh, snapshot(call.kwargs))
        return "F", lambda: module(*args, **kwargs)

    def backward(out: Any) -> list[Step]:
        outs = _needing_grad(out)
        if not grads:
            grads.extend(_random_grads(outs, seed=2))
        return [("B", lambda: torch.autograd.backward(outs, grads) if outs else None)]

    return forward, backward


def _outside_params(traced: TracedModel) -> list[Tensor]:
    inside = {id(p) for path in traced.units for p in traced.module.get_submodule(path).parameters()}
    return [p for p in traced.module.parameters() if p.requires_grad and id(p) not in inside]


def _segment_work(traced: TracedModel) -> tuple[Forward, Backward]:
    """(forward, backward) of one forward pass with stubbed blocks: the forward call's :class:`Split` times
    ``pre/F`` from its start to the first block's stub and ``post/F`` from the last stub to the loss; the backward
    names ``post/B`` and ``pre/B``."""
    dev, last = traced.device, len(traced.units) - 1
    params = _outside_params(traced)
    state: dict[str, Any] = {}
    grads: list[Tensor] = []

    def on_call(k: int, args: Any, kwargs: Any, output: Any) -> Any:
        if k == 0:
            state["first"], state["pre_out"] = point(dev), _needing_grad((args, kwargs))
        if k == last:
            output = map_tensors(lambda t: t.clone().requires_grad_(t.is_floating_point()), output)
            state["leaf"], state["last"] = _needing_grad(output), point(dev)
        return output

    def run() -> Split:
        state.clear()
        with stubbed(traced, on_call):
            start = point(dev)
            loss = loss_of(call_module(traced.module, traced.batch))
            end = point(dev)
        if traced.whole:
            return Split((loss, [], []), {"pre/F": (start, end)})
        parts = {}
        if traced.has_pre:
            parts["pre/F"] = (start, state["first"])
        if traced.has_post:
            parts["post/F"] = (state["last"], end)
        return Split((loss, state["pre_out"], state["leaf"]), parts)

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

    return lambda: ("F", run), backward


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
    return {"pre": float(seen.get("first", 0.0)), "post": total - seen.get("last", total)}


def _backward_flops(forward: Forward, backward: Backward) -> dict[str, float]:
    """FLOPs of each named backward call of one untimed forward (:func:`count_flops`; the forward not counted)."""
    value = forward()[1]()
    if isinstance(value, Split):
        value = value.value
    return {name: float(n) for name, fn in backward(value) if (n := count_flops(fn)) is not None}


def _measurement(times: PhaseTimes, flops: float | None) -> Measurement:
    """A layer's phase as the profile stores it, as the zoo's events are stored.

    ``launch_s`` is the host's mean launch time where :func:`~distsim.profiler.compute.time_steps` measured one
    (CUDA) and None on CPU, as for the zoo's events. On CPU the host runs the work, so its "launch" is the work
    itself, and the simulator reads any launch time as a host stream that paces the device
    (``distsim.sim.flow.comm.models_host`` turns it on when the model's first event has one, and each op is then
    released at its launch's end): a CPU profile with launch times would be charged its work twice, and a separate
    field would only repeat the measured time. A CPU profile records its self-check all the same."""
    samples = [max(s, 1e-9) for s in times.times_s]  # a step with nothing to do still reads as a positive time
    p10, median, p90 = (float(v) for v in np.percentile(samples, [10, 50, 90]))
    launch = float(np.mean(times.launch_s)) if times.launch_s else None
    return Measurement(median, p10, p90, len(samples), flops, float(np.mean(samples)), tuple(samples), launch_s=launch)


def time_layers(
    traced: TracedModel,
    warmup: int = 2,
    repeats: int = 10,
    known: set[str] | frozenset[str] = frozenset(),
    progress: Callable[[str], None] | None = None,
) -> tuple[dict[str, Measurement], dict[str, float]]:
    """Measurements of every layer kind's forward and backward (keys as the simulator asks for them, with their
    FLOPs and on CUDA their launch time), skipping kinds whose events are all `known`, and each kind's forward
    FLOPs per micro-batch (for the layer graph)."""
    say = progress or (lambda _m: None)
    results: dict[str, Measurement] = {}
    flops: dict[str, float] = {}
    kinds = traced.kinds()
    todo = {k: x for k, x in kinds.items() if not {event(traced, x, p).key for p in "FB"} <= set(known)}
    blocks = {k: x for k, x in todo.items() if k not in ("pre", "post")}
    for i, (kind, layer) in enumerate(sorted(blocks.items())):
        say(f"torch layer {i + 1}/{len(blocks)}: {kind} ({layer.name}) forward and backward")
        forward, backward = _block_work(traced, layer)
        counted = count_flops(forward()[1])
        if counted is not None:
            flops[kind] = float(counted)
        phase_flops = {"F": flops.get(kind), **_backward_flops(forward, backward)}
        times = time_steps(forward, backward, None, traced.device, warmup, repeats)
        _store(results, traced, layer, times, phase_flops)
        say(_line(traced, layer, results, times))
    ends = [k for k in ("pre", "post") if k in todo]
    if ends:
        say(f"torch layers {' and '.join(ends)}: one forward pass with the blocks stubbed")
        flops.update(_segment_flops(traced))
        forward, backward = _segment_work(traced)
        back = _backward_flops(forward, backward)
        times = time_steps(forward, backward, None, traced.device, warmup, repeats)
        for kind in ends:
            part = {phase: times[f"{kind}/{phase}"] for phase in "FB"}
            _store(results, traced, todo[kind], part, {"F": flops.get(kind), "B": back.get(f"{kind}/B")})
            say(_line(traced, todo[kind], results, part))
    return results, flops


def _store(results: dict[str, Measurement], traced: TracedModel, layer: LayerInfo, times: dict[str, PhaseTimes],
           flops: dict[str, float | None]) -> None:  # fmt: skip
    for phase in "FB":
        results[event(traced, layer, phase).key] = _measurement(times[phase], flops.get(phase))


def _line(traced: TracedModel, layer: LayerInfo, results: dict[str, Measurement], times: dict[str, PhaseTimes]) -> str:
    f, b = (results[event(traced, layer, p).key] for p in "FB")
    line = f"  {layer.kind}: forward {f.seconds * 1e3:.3f} ms, backward {b.seconds * 1e3:.3f} ms (means)"
    if f.launch_s is not None and b.launch_s is not None:
        line += f", host launch {f.launch_s * 1e3:.3f} and {b.launch_s * 1e3:.3f} ms"
    starved = sum(t.starved for t in times.values())
    return line + (f", {starved} call(s) launched slower than the sleep before them" if starved else "")


# ------------------------------------------------------------------------------------------------------ self-check
METHOD = (
    f"a chain of up to {CHAIN_LAYERS} consecutive blocks of the module (from the second when it has more), each "
    "called with fresh copies of the arguments it got in the traced pass, run forward then backward in reverse with "
    "no host synchronisation between blocks; CUDA events between blocks on GPUs (the GPU asleep while the host "
    "enqueues the first block, L2 swept before each round), perf_counter on CPUs; ratio = isolated mean / in-situ "
    "mean"
)


def chain_layers(traced: TracedModel) -> list[tuple[int, LayerInfo]]:
    """(index in the layer graph, layer) of the blocks the self-check chains: up to ``CHAIN_LAYERS`` consecutive
    ones, from the second when there are more (the first block's input is often the batch itself, as
    :meth:`~distsim.profiler.torch_model.TracedModel.kinds` notes); none for a module that is one layer."""
    blocks = [(i, x) for i, x in enumerate(traced.layers) if x.kind not in ("pre", "post")]
    start = 1 if len(blocks) > CHAIN_LAYERS else 0
    return blocks[start : start + CHAIN_LAYERS]


def time_chain(traced: TracedModel, warmup: int = CHAIN_WARMUP, rounds: int = CHAIN_ROUNDS) -> dict[str, Any]:
    """The module's chain of blocks (:func:`chain_layers`) timed in situ
    (:func:`~distsim.profiler.insitu.time_in_situ`), as the zoo's stage chains are: ``{"label", "layers", "keys",
    "samples_s"}``."""
    chain = chain_layers(traced)
    samples = time_in_situ([_block_work(traced, x) for _, x in chain], traced.device, warmup, rounds)
    keys = [event(traced, x, "F").key for _, x in chain] + [event(traced, x, "B").key for _, x in reversed(chain)]
    label = f"{traced.name} blocks {span([x.name for _, x in chain])}"
    return {"label": label, "layers": [i for i, _ in chain], "keys": keys, "samples_s": samples}


def self_check(traced: TracedModel, results: dict[str, Measurement], existing: Any,
               log: Callable[[str], None]) -> dict[str, Any] | None:  # fmt: skip
    """Rank 0 of a ``--torch-model`` profile: time the module's chain of blocks in situ (:func:`time_chain`) against
    the sum of their isolated times (`results`, else the `existing` profile's), set each event measured now's
    ``insitu_ratio`` in `results` and return the provenance summary, as the zoo's self-check does
    (:func:`distsim.infra.self_check.record`). None when the module has no blocks, none of the chain's events was
    measured now, or the chain failed (out of memory, say: the check is left out, not the profile)."""
    started = time.perf_counter()
    measured = {k for k in results if not k.startswith("optimizer/")}
    chain = chain_layers(traced)
    if not chain or not {event(traced, x, p).key for _, x in chain for p in "FB"} & measured:
        log("self-check: left out (no blocks measured in this run to chain)")
        return None
    log(f"self-check: {len(chain)} blocks of {traced.name} in situ")
    try:
        timing = time_chain(traced)
    except (RuntimeError, ValueError) as exc:
        log(f"self-check failed, left out: {exc.__class__.__name__}: {exc}"[:300])
        if traced.device.type == "cuda":
            torch.cuda.empty_cache()
        return None
    isolated = {k: m.seconds for k, m in {**(existing.compute if existing else {}), **results}.items()}
    return record([timing], results, isolated, measured, time.perf_counter() - started, log, METHOD, "block chain")

"""Timing each block inside one backward call, as a training loop runs backward (one call per micro-batch).

A plain training loop and Megatron-LM call backward once per micro-batch and let autograd's engine (C++) walk the
graph; calling it block by block from Python instead makes the executor's own Python pace a fast GPU (the H200
evidence: micro-batch 4 ran as long as micro-batch 8). So the runtime builds one graph per micro-batch and stage,
and the blocks' backward spans come from two hooks placed in the forward pass, both firing inside the engine:

* **start**: a tensor hook on the block's output fires when the gradient of that output is complete (every consumer
  has run its backward), right before the block's own backward nodes run;
* **end**: the block's inputs that need a gradient pass through :class:`_Tap`, an identity autograd function whose
  backward runs once the gradients of all of them are computed. Autograd's engine runs the ready node with the
  highest sequence number first and gradient accumulation before anything else, and every node of the block was
  created after its tap, so by then the block's parameter gradients are accumulated too (its gradient buckets can be
  issued there, as the simulator issues them after the layer's backward).

A block with no input that needs a gradient (an embedding reading token ids, a CNN's first layer reading images)
has no tap: it ends at the next hook that fires in the call, or at the call's end (it is the last on its stream).
Neither has a block whose only such input is the output of the block just before it and of no other (a chain's
blocks): that block's start hook fires when the gradient of its output, the chained block's input, is complete,
which is the chained block's end.
Each hook takes a mark of the rank's clock (:mod:`distsim.executor.clock`) on the stream autograd runs the node on
(the one the forward ran on) and the host's time: the host's span between a block's hooks is its ``launch`` row.
With full recomputation (:mod:`distsim.executor.recompute`) the hooks of the recomputed forward fire inside the
checkpoint's own backward call, nested in this one, exactly where the simulator puts them.

The executor's own host time (the hooks, the taps' autograd nodes, the marks) is counted per block
(:class:`Overhead`) and written in the trace's provenance.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from distsim.executor.clock import Mark
from distsim.executor.recorder import Meta, Recorder

BlockKey = tuple[Meta, int]
"""A block's backward event (its meta) and its block index in its layer."""


class _Tap(torch.autograd.Function):
    """Identity on tensors that need a gradient; its backward calls `on_backward` when all their gradients exist."""

    @staticmethod
    def forward(ctx: Any, on_backward: Callable[[], None], *tensors: Tensor) -> tuple[Tensor, ...]:
        ctx.on_backward = on_backward
        return tensors

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Any, ...]:
        ctx.on_backward()
        return (None, *grads)


@dataclass
class Overhead:
    """The executor's own host seconds in the hooks and marks it adds to a training loop, and the blocks they
    served (forward and backward counted apart)."""

    seconds: dict[str, float] = field(default_factory=lambda: {"forward": 0.0, "backward": 0.0})
    blocks: dict[str, int] = field(default_factory=lambda: {"forward": 0, "backward": 0})

    def per_block_us(self) -> dict[str, float]:
        return {k: 1e6 * s / self.blocks[k] for k, s in self.seconds.items() if self.blocks[k]}


@dataclass
class _Open:
    key: BlockKey
    start: Mark
    host: float
    comms: list[tuple[Mark, Mark, int]]
    tapped: bool


class BackwardTimer:
    """The hooks of one rank's blocks and the spans they give, one backward call at a time.

    `on_end(layer, block)` runs when a block's backward is done (the runtime issues gradient buckets there)."""

    def __init__(self, recorder: Recorder, on_end: Callable[[int, int], None]) -> None:
        self.recorder, self.clock, self.on_end = recorder, recorder.clock, on_end
        self.overhead = Overhead()
        self._open: dict[BlockKey, _Open] = {}
        self._untapped: _Open | None = None
        self._last: Mark | None = None

    # ------------------------------------------------------------------------------------------- forward side
    def watch(
        self, key: BlockKey, inputs: Sequence[Any], run: Callable[[list[Any]], Any], chained: bool = False
    ) -> Any:
        """Run a block (`run` on its inputs) with its hooks: inputs that need a gradient through a tap, a hook on
        its output. Without autograd (a checkpointed layer's first forward) it is a plain call.

        `chained`: the block's only input needing a gradient is the output of the block watched just before it, which
        nothing else consumes: that block's start hook then fires exactly when this one's backward ends, so the tap
        (an autograd function call, the dearest part of the hooks) is left out and the block ends at the next hook."""
        if not torch.is_grad_enabled():
            return run(list(inputs))
        t0 = time.perf_counter()
        grads = [] if chained else [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x.requires_grad]
        args = list(inputs)
        if grads:
            tapped = _Tap.apply(lambda: self._end(key), *(args[i] for i in grads))
            for i, x in zip(grads, tapped, strict=True):
                args[i] = x
        spent = time.perf_counter() - t0
        out = run(args)
        t0 = time.perf_counter()
        if isinstance(out, Tensor) and out.requires_grad:
            out.register_hook(lambda _g: self._start(key, bool(grads)))
        self.overhead.seconds["forward"] += spent + time.perf_counter() - t0
        self.overhead.blocks["forward"] += 1
        return out

    # ------------------------------------------------------------------------------------------ backward side
    @contextmanager
    def call(self) -> Iterator[None]:
        """One backward call: a mark before it, and every block still open closed at its end."""
        self._last = self.clock.mark()
        self._open, self._untapped = {}, None
        try:
            yield
        finally:
            end = self.clock.mark()
            now = self.clock.now()
            done = [self._close(self._untapped, end, now)] if self._untapped is not None else []
            # a tap that never fired (an input whose gradient is unused)
            done += [self._close(block, end, now) for block in list(self._open.values())]
            self._open, self._last = {}, None
            for meta, bi in done:
                self.on_end(meta[3], bi)

    def _start(self, key: BlockKey, tapped: bool) -> None:
        t0 = time.perf_counter()
        mark = self.clock.mark()
        done = [self._close(self._untapped, mark, t0)] if self._untapped is not None else []
        block = _Open(key, mark, t0, [], tapped)
        if tapped:
            self._open[key] = block
        else:
            self._untapped = block
        self.recorder.comm_into(block.comms)
        self._last = mark
        self._ended(done, t0)

    def _end(self, key: BlockKey) -> None:
        t0 = time.perf_counter()
        mark = self.clock.mark()
        done = [self._close(self._untapped, mark, t0)] if self._untapped is not None else []
        block = self._open.pop(key, None)
        if block is None:  # its output's gradient never reached a hook (e.g. the call's root): from the last mark
            assert self._last is not None
            block = _Open(key, self._last, t0, [], True)
        done.append(self._close(block, mark, t0))
        self._last = mark
        self._ended(done, t0)

    def _close(self, block: _Open, end: Mark, host_end: float) -> BlockKey:
        """Record a block's backward event; returns its key (the caller runs `on_end` for it)."""
        if block is self._untapped:
            self._untapped = None
        meta, _bi = block.key
        self.recorder.add_block(meta, block.start, end, block.comms, (block.host, host_end))
        self.recorder.comm_into(None)
        self.overhead.blocks["backward"] += 1
        return block.key

    def _ended(self, done: list[BlockKey], t0: float) -> None:
        """Count the hook's own time, then run `on_end` for the blocks it closed (issuing buckets is the training
        loop's work, not the executor's overhead)."""
        self.overhead.seconds["backward"] += time.perf_counter() - t0
        for meta, bi in done:
            self.on_end(meta[3], bi)

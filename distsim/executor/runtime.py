"""Executing a plan on one rank: the simulator's schedule actions, block by block, with every event recorded.

Each block runs as its own autograd segment: its inputs are leaves detached from whatever produced them, so a block's
backward can be run (and timed) on its own, the tensor-parallel all-reduce inside it is attributed to it, and a
tensor consumed by several blocks or stages (T5's encoder output) accumulates its gradient before the block that
produced it runs backward. This mirrors the simulator's event flow:

* forward action: receive the activations crossing the cut from the previous stage (``recv``), run the stage's blocks
  in order, send the activations crossing the next cut (``isend``, or ``send`` with ``p2p_blocking``);
* backward action: receive the gradients of what was sent, run the blocks in reverse, send the gradients of what was
  received; with WFBP, each layer's gradients are all-reduced (asynchronously) as soon as its last backward is done;
* after the last action: the bulk gradient all-reduce, the all-reduce of tied embedding copies between the first and
  last stage, and the optimizer step.

Times come from ``time.perf_counter`` (CLOCK_MONOTONIC, shared by the processes of one machine).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from distsim.executor import data
from distsim.executor.model import build_modules, unique_parameters
from distsim.models.graph import Model
from distsim.partition import rank_layers
from distsim.placement import Placement
from distsim.profiler.blocks import ProcessGroupComm, ReduceOp, TPComm
from distsim.schedules import Schedule
from distsim.strategy import Strategy

Row = tuple[str, str, str, int, int, int, float, float]
"""(stream, kind, name, layer, stage, microbatch, start, end) of one event on this rank."""


@dataclass
class Recorder:
    """Collects this rank's events; tp collectives inside a block are split out of the block's compute."""

    iteration: int = 0
    rows: list[tuple[int, Row]] = field(default_factory=list)
    p2p_sends: list[tuple[int, tuple[Any, ...], Row]] = field(default_factory=list)
    p2p_recvs: list[tuple[int, tuple[Any, ...], float]] = field(default_factory=list)
    iteration_starts: dict[int, float] = field(default_factory=dict)
    _comm: list[tuple[float, float]] | None = None

    def add(self, row: Row) -> None:
        self.rows.append((self.iteration, row))

    @contextmanager
    def block(self, kind: str, name: str, layer: int, stage: int, mb: int) -> Iterator[None]:
        self._comm = []
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            comm, self._comm = self._comm, None
            cursor = start
            for c_start, c_end in comm:  # compute before, between and after the collectives
                if c_start > cursor:
                    self.add(("compute", kind, name, layer, stage, mb, cursor, c_start))
                self.add(("tp", "tp_allreduce", name, layer, stage, mb, c_start, c_end))
                cursor = max(cursor, c_end)
            if end > cursor or not comm:
                self.add(("compute", kind, name, layer, stage, mb, cursor, end))

    def collective(self, start: float, end: float) -> None:
        if self._comm is not None:
            self._comm.append((start, end))


class RecordingComm(ProcessGroupComm):
    """Tensor-parallel all-reduces over a process group, timed into the recorder."""

    def __init__(self, group: Any, recorder: Recorder) -> None:
        super().__init__(group)
        self.recorder = recorder

    def all_reduce(self, tensor: Tensor, op: ReduceOp = "sum") -> Tensor:
        start = time.perf_counter()
        out = super().all_reduce(tensor, op)
        self.recorder.collective(start, time.perf_counter())
        return out


@dataclass
class _Segment:
    """One block's forward on one micro-batch, kept for its backward."""

    li: int
    bi: int
    name: str
    out: Tensor
    """The block's output (with its autograd graph); for lm_head the loss."""
    leaf: Tensor | None
    """What consumers of the output hold (a leaf whose .grad collects their gradients); None for lm_head."""


@dataclass
class _MicroBatch:
    env: dict[int, Tensor] = field(default_factory=dict)
    received: list[Tensor] = field(default_factory=list)
    segments: list[_Segment] = field(default_factory=list)


class Runtime:
    """One rank of a plan: its modules, groups and schedule; `run_iteration` trains one step."""

    def __init__(
        self, model: Model, strategy: Strategy, placement: Placement, schedule: Schedule,
        stage_ranges: tuple[tuple[int, int], ...], rank: int, groups: dict[str, Any], dtype: torch.dtype,
        device: torch.device, seed: int = 0, p2p_blocking: bool = False, lr: float = 1e-4,
    ) -> None:  # fmt: skip
        self.model, self.strategy, self.schedule = model, strategy, schedule
        self.stage_ranges, self.rank, self.device, self.dtype = stage_ranges, rank, device, dtype
        self.seed, self.p2p_blocking = seed, p2p_blocking
        self.pp, self.dp, self.tp = strategy.pp, strategy.dp, strategy.tp
        self.grid = placement.grid
        self.pipe_rank, self.replica, self.tp_rank = placement.coords[rank]
        self.groups = groups
        self.recorder = Recorder()
        comm = RecordingComm(groups.get("tp"), self.recorder) if self.tp > 1 else TPComm.local()
        self.layers = rank_layers(stage_ranges, self.pp, self.pipe_rank)
        self.modules = build_modules(model, self.layers, self.tp, self.tp_rank, comm, dtype, device, seed)
        self.params = unique_parameters(list(self.modules.values()))
        self.optimizer = _Adam(self.params, lr)
        self.actions = schedule.ranks[self.pipe_rank]
        self.last_b = {a.stage: a.microbatch for a in self.actions if a.op == "B"}
        self.signature = {k: [t.is_floating_point() for t in m.example_inputs(1)] for k, m in self.modules.items()}
        self.live = _live_layers(model)
        self.shapes: dict[tuple[Any, ...], list[tuple[tuple[int, ...], torch.dtype]]] = {}
        self.sent_shapes: set[tuple[Any, ...]] = set()
        self.pending: list[Any] = []
        self.layer_params = self._layer_params()
        self.grad_buffer, self.layer_slices = self._grad_buffer()
        self.losses: list[float] = []

    # -------------------------------------------------------------------------------------------- structure
    def _layer_params(self) -> dict[int, list[torch.nn.Parameter]]:
        """Parameters whose gradients a layer's WFBP all-reduce carries (a shared tied matrix goes with the layer
        that finishes backward last, the embedding, as in the simulator)."""
        owner: dict[int, int] = {}
        for (li, _bi), m in sorted(self.modules.items()):
            for p in m.parameters():
                owner[id(p)] = min(owner.get(id(p), li), li)
        out: dict[int, list[torch.nn.Parameter]] = {}
        for p in self.params:
            out.setdefault(owner[id(p)], []).append(p)
        return out

    def _grad_buffer(self) -> tuple[Tensor, dict[int, slice]]:
        """One contiguous gradient buffer, ordered by layer; every parameter's .grad is a view into it.

        Autograd accumulates into the views, so the bulk all-reduce, a layer's WFBP all-reduce (a slice) and the
        tied-embedding all-reduce run in place without copies, as with Megatron-LM's contiguous grad buffer.
        """
        total = sum(p.numel() for ps in self.layer_params.values() for p in ps)
        buffer = torch.zeros(total, dtype=self.dtype, device=self.device)
        slices, offset = {}, 0
        for li in sorted(self.layer_params):
            start = offset
            for p in self.layer_params[li]:
                p.grad = buffer[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
            slices[li] = slice(start, offset)
        return buffer, slices

    def _peer(self, vs: int) -> int:
        return int(self.grid[vs % self.pp, self.replica, self.tp_rank])

    def _samples(self, mb: int) -> range:
        mbs, m = self.strategy.micro_batch_size, self.strategy.num_micro_batches
        first = (self.replica * m + mb) * mbs
        return range(first, first + mbs)

    # ------------------------------------------------------------------------------------------------- p2p
    def _send(self, tensors: list[Tensor], vs: int, phase: str, src_vs: int, mb: int, iteration: int) -> None:
        dst = self._peer(vs)
        key = (src_vs, vs, phase, mb, self.replica, self.tp_rank)
        first = (src_vs, vs, phase) not in self.sent_shapes  # the first transfer tells the receiver the shapes
        self.sent_shapes.add((src_vs, vs, phase))
        start = time.perf_counter()
        for t in tensors:
            t = t.detach().contiguous()
            if first:
                header = torch.tensor([t.dim(), *t.shape, _DTYPES.index(t.dtype)], dtype=torch.int64)
                dist.send(torch.tensor([header.numel()], dtype=torch.int64), dst)
                dist.send(header, dst)
            if self.p2p_blocking:
                dist.send(t, dst)
            else:
                self.pending.append((dist.isend(t, dst), t))
        stream = "compute" if self.p2p_blocking else "p2p"
        what = "act" if phase == "F" else "grad"
        row: Row = (stream, "p2p", f"{what} {src_vs}->{vs}", -1, src_vs, mb, start, time.perf_counter())
        self.recorder.p2p_sends.append((self.recorder.iteration, key, row))

    def _recv(self, n: int, vs: int, phase: str, dst_vs: int, mb: int, iteration: int) -> list[Tensor]:
        src = self._peer(vs)
        key = (vs, dst_vs, phase, mb, self.replica, self.tp_rank)
        shape_key = (vs, dst_vs, phase)
        out = []
        first = shape_key not in self.shapes
        for i in range(n):
            if first:
                head_len = torch.zeros(1, dtype=torch.int64)
                dist.recv(head_len, src)
                header = torch.zeros(int(head_len.item()), dtype=torch.int64)
                dist.recv(header, src)
                ndim = int(header[0])
                self.shapes.setdefault(shape_key, []).append(
                    (tuple(int(x) for x in header[1 : 1 + ndim]), _DTYPES[int(header[1 + ndim])])
                )
            shape, dtype = self.shapes[shape_key][i]
            t = torch.empty(shape, dtype=dtype, device=self.device)
            dist.recv(t, src)
            out.append(t)
        self.recorder.p2p_recvs.append((self.recorder.iteration, key, time.perf_counter()))
        return out

    # ----------------------------------------------------------------------------------------------- actions
    def forward(self, vs: int, mb: int, iteration: int, state: dict[tuple[int, int], _MicroBatch]) -> None:
        start, end = self.stage_ranges[vs]
        st = state.setdefault((vs, mb), _MicroBatch())
        if vs > 0:
            incoming = self.live[start - 1]
            received = self._recv(len(incoming), vs - 1, "F", vs, mb, iteration)
            for li, t in zip(incoming, received, strict=True):
                leaf = t.requires_grad_(t.is_floating_point())
                st.env[li] = leaf
                st.received.append(leaf)
        samples = self._samples(mb)
        for li in range(start, end):
            layer = self.model.layers[li]
            sources = layer.inputs if layer.inputs is not None else ((self.model.layers[li - 1].name,) if li else ())
            acts = [st.env[self.model.index[s]] for s in sources]
            x: Tensor | None = None
            for bi, block in enumerate(layer.blocks):
                module = self.modules[(li, bi)]
                floats = self.signature[(li, bi)]
                reads_data = not sources and bi == 0  # a source layer's first block reads the batch itself
                feed: list[Tensor] = []
                if reads_data or not all(floats):  # token ids, targets, or the input
                    feed = data.batch(block, self.seed, iteration, li, bi, samples, self.dtype, self.device)
                if reads_data:
                    args = feed
                else:  # activations from the layer's inputs (or the previous block), ids/targets from the data
                    acts_iter = iter(acts if bi == 0 else [x, *acts[1:]])
                    data_iter = iter(feed)
                    args = [next(acts_iter) if is_float else next(data_iter) for is_float in floats]
                name = layer.name if len(layer.blocks) == 1 else f"{layer.name}.{block.op}"
                with self.recorder.block("forward", name, li, vs, mb):
                    out = module(*args)
                if block.op == "lm_head":
                    st.segments.append(_Segment(li, bi, name, out, None))
                    self.losses.append(float(out.detach()))
                    x = None
                else:
                    leaf = out.detach().requires_grad_()
                    st.segments.append(_Segment(li, bi, name, out, leaf))
                    x = leaf
            if x is not None:
                st.env[li] = x
        if vs < self.strategy.num_stages - 1:
            outgoing = self.live[end - 1]
            self._send([st.env[li] for li in outgoing], vs + 1, "F", vs, mb, iteration)

    def backward(self, vs: int, mb: int, iteration: int, state: dict[tuple[int, int], _MicroBatch]) -> None:
        end = self.stage_ranges[vs][1]
        st = state.pop((vs, mb))
        if vs < self.strategy.num_stages - 1:
            outgoing = self.live[end - 1]
            grads = self._recv(len(outgoing), vs + 1, "B", vs, mb, iteration)
            for li, g in zip(outgoing, grads, strict=True):
                leaf = st.env[li]
                leaf.grad = g if leaf.grad is None else leaf.grad + g
        scale = 1.0 / (self.strategy.num_micro_batches * self.dp)  # a sum over replicas then gives the mean
        final = self.last_b.get(vs) == mb
        for k in range(len(st.segments) - 1, -1, -1):
            seg = st.segments[k]
            with self.recorder.block("backward", seg.name, seg.li, vs, mb):
                if seg.leaf is None:
                    torch.autograd.backward(seg.out * scale)
                elif seg.leaf.grad is not None:
                    torch.autograd.backward(seg.out, seg.leaf.grad)
            if final and seg.bi == 0 and self.dp > 1 and self.strategy.grad_sync == "wfbp":
                self._wfbp(seg.li, vs)
        if vs > 0:
            grads = [leaf.grad if leaf.grad is not None else torch.zeros_like(leaf) for leaf in st.received]
            self._send(grads, vs - 1, "B", vs, mb, iteration)

    # ------------------------------------------------------------------------------------------ gradient sync
    def _wfbp(self, li: int, vs: int) -> None:
        part = self.layer_slices.get(li)
        if part is None or part.stop == part.start:
            return
        start = time.perf_counter()
        work = dist.all_reduce(self.grad_buffer[part], group=self.groups["dp"], async_op=True)
        row_base = ("dp", "dp_allreduce", f"grads {self.model.layers[li].name}", li, vs, -1, start)
        slot: dict[str, float] = {}
        work.get_future().then(lambda _f: slot.setdefault("end", time.perf_counter()))
        self._syncs.append((work, row_base, slot))

    def _finish_grads(self) -> None:
        for work, row_base, slot in self._syncs:
            work.wait()
            self.recorder.add((*row_base, slot.get("end", time.perf_counter())))  # type: ignore[arg-type]
        self._syncs = []
        if self.dp > 1 and self.strategy.grad_sync == "bulk":
            start = time.perf_counter()
            dist.all_reduce(self.grad_buffer, group=self.groups["dp"])
            self.recorder.add(("dp", "dp_allreduce", f"grads rank {self.pipe_rank}", -1, self.pipe_rank, -1, start,
                               time.perf_counter()))  # fmt: skip
        if "tied" in self.groups:
            li, param, name = self.groups["tied_param"]
            start = time.perf_counter()
            dist.all_reduce(param.grad, group=self.groups["tied"])
            self.recorder.add(("dp", "dp_allreduce", name, li, self.pipe_rank, -1, start, time.perf_counter()))

    # ------------------------------------------------------------------------------------------------ iteration
    def run_iteration(
        self, iteration: int, barrier: Callable[[], None], before_step: Callable[[], None] | None = None
    ) -> None:
        self.recorder.iteration = iteration
        self._syncs: list[Any] = []
        barrier()
        self.recorder.iteration_starts[iteration] = time.perf_counter()
        state: dict[tuple[int, int], _MicroBatch] = {}
        for a in self.actions:
            (self.forward if a.op == "F" else self.backward)(a.stage, a.microbatch, iteration, state)
        self._finish_grads()
        if before_step is not None:
            before_step()
        start = time.perf_counter()
        self.optimizer.step()
        self.recorder.add(("compute", "optimizer", "optimizer step", -1, self.pipe_rank, -1, start,
                           time.perf_counter()))  # fmt: skip
        for work, _t in self.pending:
            work.wait()
        self.pending = []

    def zero_grad(self) -> None:
        self.grad_buffer.zero_()


_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32]


def _live_layers(model: Model) -> dict[int, list[int]]:
    """Cut after layer p -> the layers whose outputs cross it (used by a later layer), in index order."""
    last_use = list(range(model.num_layers))
    for li, layer in enumerate(model.layers):
        sources = layer.inputs if layer.inputs is not None else ((model.layers[li - 1].name,) if li else ())
        for s in sources:
            u = model.index[s]
            last_use[u] = max(last_use[u], li)
    return {p: [u for u in range(p + 1) if last_use[u] > p] for p in range(model.num_layers)}


class _Adam:
    """Adam on the rank's parameters; low-precision models keep fp32 master weights (mixed precision)."""

    def __init__(self, params: list[torch.nn.Parameter], lr: float) -> None:
        self.params = params
        self.mixed = any(p.dtype != torch.float32 for p in params)
        self.master = [p.detach().float().clone().requires_grad_() for p in params] if self.mixed else params
        self.opt = torch.optim.Adam(self.master, lr=lr, foreach=True)

    @torch.no_grad()
    def step(self) -> None:
        if self.mixed:
            for p, m in zip(self.params, self.master, strict=True):
                m.grad = None if p.grad is None else p.grad.float()
        self.opt.step()
        if self.mixed:
            for p, m in zip(self.params, self.master, strict=True):
                p.copy_(m)

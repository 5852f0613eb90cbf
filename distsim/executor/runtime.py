"""Executing a plan on one rank: the simulator's schedule actions, block by block, with every event recorded.

A micro-batch runs as a training loop runs it: the stage's blocks called one after another in one autograd graph,
then one backward call (autograd's engine walks the graph, no Python between blocks), with each block's backward
timed by hooks inside that call (:mod:`distsim.executor.backward`); a tensor consumed by several blocks or stages
(T5's encoder output) accumulates its gradient in the graph before the block that produced it runs backward. This
mirrors the simulator's event flow:

* forward action: receive the activations crossing the cut from the previous stage (``recv``), run the stage's blocks
  in order, send the activations crossing the next cut (``isend``, or ``send`` with ``p2p_blocking``);
* backward action: receive the gradients of what was sent, one backward call from them and the stage's losses (a
  recomputed layer's forward runs again inside it, right before the layer's backward:
  :mod:`distsim.executor.recompute`), send the gradients of what was received; in the last micro-batch, a gradient
  bucket that the layer just done completes is all-reduced (asynchronously, overlapped with the rest of backward);
* after the last action: the buckets that wait for the whole backward (bulk's one), the all-reduce of tied embedding
  copies between the first and last stage, and the optimizer step (with ZeRO-1 the parameter all-gathers after it).

The buckets are the simulator's: the rank describes its gradients to :mod:`distsim.core.sync` (bytes of each parameter
tensor per layer, from its own parameters) and lowers the strategy's ``grad_sync`` and ``optimizer_sharding`` with
it, so a trace's data-parallel rows have the simulator's names and count (:func:`distsim.sim.flow.comm.bucket_names`).
Each bucket is one slice of the rank's contiguous gradient buffer; under ZeRO-1 it is reduce-scattered instead
(:mod:`distsim.executor.zero`). What the executor refuses to run is decided by :mod:`distsim.executor.support`.

Times come from the rank's clock (:mod:`distsim.executor.clock`): ``time.perf_counter`` (CLOCK_MONOTONIC, shared by
the processes of one machine) around each call on a CPU; on a GPU, CUDA events on the stream each block and each
collective runs on, resolved after the iteration's final synchronisation and mapped onto ``perf_counter`` by one
anchor per iteration, with the host's launch spans kept as a ``host`` stream. The host never waits for the device
within an iteration: the training data is on the device before it starts and the losses are read after it ends.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from distsim.core.errors import DistsimError
from distsim.core.models.graph import Model
from distsim.core.partition import rank_layers
from distsim.core.placement import Placement
from distsim.core.schedules import Schedule
from distsim.core.strategy import Strategy
from distsim.core.sync import MODES, SHARDINGS, Bucket, GradUnit, SyncContext, SyncSettings, lower, tensor_bytes
from distsim.executor import data
from distsim.executor.backward import BackwardTimer
from distsim.executor.clock import clock_for
from distsim.executor.keys import EventKeys, group_text, nbytes
from distsim.executor.model import build_modules, unique_parameters
from distsim.executor.recompute import checkpointed, rank_recomputed
from distsim.executor.recorder import Meta, Recorder, RecordingComm
from distsim.executor.support import refuse_unsupported
from distsim.executor.zero import Zero1
from distsim.profiler.tp_comm import TPComm
from distsim.sim.flow.comm import bucket_names, gather_name


@dataclass(frozen=True)
class GradBucket:
    """One gradient all-reduce of this rank: a :class:`~distsim.core.sync.Bucket`, the slice of the gradient buffer
    it covers, and its event name."""

    bucket: Bucket
    part: slice
    name: str


@dataclass
class _MicroBatch:
    """One micro-batch's forward on one stage, kept for its backward."""

    env: dict[int, Tensor] = field(default_factory=dict)
    """Each layer's output (with its autograd graph), by layer."""
    received: list[Tensor] = field(default_factory=list)
    """The activations received from the previous stage: leaves whose .grad the backward call fills."""
    losses: list[Tensor] = field(default_factory=list)


class Runtime:
    """One rank of a plan: its modules, groups and schedule; `run_iteration` trains one step."""

    def __init__(
        self, model: Model, strategy: Strategy, placement: Placement, schedule: Schedule,
        stage_ranges: tuple[tuple[int, int], ...], rank: int, groups: dict[str, Any], dtype: torch.dtype,
        device: torch.device, seed: int = 0, p2p_blocking: bool = False, lr: float = 1e-4,
    ) -> None:  # fmt: skip
        refuse_unsupported(model, strategy, stage_ranges)
        self.model, self.strategy, self.schedule = model, strategy, schedule
        self.stage_ranges, self.rank, self.device, self.dtype = stage_ranges, rank, device, dtype
        self.seed, self.p2p_blocking = seed, p2p_blocking
        self.pp, self.dp, self.tp = strategy.pp, strategy.dp, strategy.tp
        self.grid = placement.grid
        self.pipe_rank, self.replica, self.tp_rank = placement.coords[rank]
        self.groups = groups
        self.clock = clock_for(device)
        self.recorder = Recorder(self.clock)
        self.hooks = BackwardTimer(self.recorder, self._block_done)
        """Times each block inside a micro-batch's one backward call (:mod:`distsim.executor.backward`)."""
        self._final: tuple[int, bool] = (0, False)
        """The stage whose backward call runs, and whether it is that stage's last micro-batch (buckets issue)."""
        comm = RecordingComm(groups.get("tp"), self.recorder) if self.tp > 1 else TPComm.local()
        self.layers = rank_layers(stage_ranges, self.pp, self.pipe_rank)
        self.modules = build_modules(model, self.layers, self.tp, self.tp_rank, comm, dtype, device, seed)
        self.params = unique_parameters(list(self.modules.values()))
        self.actions = schedule.ranks[self.pipe_rank]
        self.last_b = {a.stage: a.microbatch for a in self.actions if a.op == "B"}
        self.signature = {k: [t.is_floating_point() for t in m.example_inputs(1)] for k, m in self.modules.items()}
        self.data_blocks = self._data_blocks()
        self.data: dict[tuple[int, int, int], list[Tensor]] = {}
        self.loss_values: list[Tensor] = []
        self.live = _live_layers(model)
        self.shapes: dict[tuple[Any, ...], list[tuple[tuple[int, ...], torch.dtype]]] = {}
        self.sent_shapes: set[tuple[Any, ...]] = set()
        self.pending: list[Any] = []
        self.layer_params = self._layer_params()
        self.grad_buffer, self.spans = self._grad_buffer()
        self.buckets, self.gathers = self._buckets() if self.dp > 1 else ([], [])
        self.zero: Zero1 | None = None
        """ZeRO-1's buffers, sharded Adam and collectives (:mod:`distsim.executor.zero`); None: all-reduce, Adam."""
        if self.buckets and SHARDINGS[strategy.optimizer_sharding].divides_step:
            self.zero = Zero1(self.layer_params, self.spans, self.buckets, groups["dp"], lr, dtype, device)
            self.grad_buffer, self.buckets = self.zero.grad_buffer, self.zero.buckets
            by_name = {b.name: b for b in self.buckets}
            self.gathers = [by_name[g.name] for g in self.gathers]
        self.optimizer: _Adam | Zero1 = self.zero or _Adam(self.params, lr)
        self.keys = EventKeys(model, strategy, placement, stage_ranges, placement.coords[rank],
                              self.dp == 1 or self.grad_units() == self.simulated_units())  # fmt: skip
        """The simulator's keys of this rank's events (:mod:`distsim.executor.keys`)."""
        self.recorder.keys, self.recorder.tp_group = self.keys, group_text(self.grid[self.pipe_rank, self.replica])
        self._infos: dict[tuple[str, bool], tuple[str, int, int, str]] = {}
        self.recomputed = rank_recomputed(model, strategy, stage_ranges, self.pipe_rank)
        """This rank's layers whose forward runs again before their backward (:mod:`distsim.executor.recompute`)."""
        self.chained = self._chained_layers()
        """Layers whose first block reads only the previous layer's output, which nothing else reads: timed without
        a tap (:meth:`distsim.executor.backward.BackwardTimer.watch`)."""
        self.ready: dict[int, list[GradBucket]] = {}
        """Buckets issued right after a layer's backward in its last micro-batch, by that layer."""
        for b in self.buckets:
            if b.bucket.ready is not None:
                self.ready.setdefault(b.bucket.ready, []).append(b)
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

    def _grad_buffer(self) -> tuple[Tensor, dict[tuple[int, int], tuple[int, int]]]:
        """One contiguous gradient buffer, ordered by layer and within a layer by parameter registration order; every
        parameter's .grad is a view into it. Returns the buffer and (layer, tensor index) -> [start, stop) elements.

        Autograd accumulates into the views, so every bucket's all-reduce and the tied-embedding all-reduce run in
        place without copies, as with Megatron-LM's contiguous grad buffer. A bucket of :mod:`distsim.core.sync` is a
        run of consecutive tensors in reverse of this order (layers last first, a layer's tensors last first), so it
        is one slice of the buffer (:meth:`_buckets` checks).
        """
        total = sum(p.numel() for ps in self.layer_params.values() for p in ps)
        buffer = torch.zeros(total, dtype=self.dtype, device=self.device)
        spans, offset = {}, 0
        for li in sorted(self.layer_params):
            for k, p in enumerate(self.layer_params[li]):
                p.grad = buffer[offset : offset + p.numel()].view_as(p)
                spans[(li, k)] = (offset, offset + p.numel())
                offset += p.numel()
        return buffer, spans

    def grad_units(self) -> tuple[GradUnit, ...]:
        """This rank's gradients as :mod:`distsim.core.sync` takes them: one unit per layer it holds, the last layer
        first, with the bytes of each of its parameters' gradients in registration order and its model chunk."""
        chunk = {li: vs // self.pp for vs in range(self.pipe_rank, self.strategy.num_stages, self.pp)
                 for li in range(*self.stage_ranges[vs])}  # fmt: skip
        return tuple(
            GradUnit(li, tuple(p.numel() * p.element_size() for p in self.layer_params.get(li, ())), 0.0, chunk[li])
            for li in sorted(self.layers, reverse=True)
        )

    def simulated_units(self) -> tuple[GradUnit, ...]:
        """The units the simulator describes this rank with (:meth:`distsim.core.models.graph.Model.stored_tensors`)."""
        held, grad_bytes = set(self.layers), self.model.precision.grad_bytes
        return tuple(GradUnit(u.layer, tensor_bytes(self.model.stored_tensors(u.layer, held, self.tp), grad_bytes),
                              0.0, u.chunk) for u in self.grad_units())  # fmt: skip

    def _buckets(self) -> tuple[list[GradBucket], list[GradBucket]]:
        """The strategy's gradient buckets on this rank, lowered from its own parameters (through its optimizer
        sharding), each a buffer slice; and those whose parameters are all-gathered after the step, in that order.

        A planned mode (mgwfbp) needs its merge plan in the strategy (``grad_groups``): the ranks cannot plan from
        costs here, and the plan must be the one the trace records for validation (``distsim execute`` resolves it).
        """
        s = self.strategy
        if MODES[s.grad_sync].planned and not s.grad_groups:
            raise DistsimError(f"grad_sync {s.grad_sync} needs its merge plan (grad_groups) to execute; distsim "
                               "execute plans it with distsim.sim.flow.uniform.merge_groups")  # fmt: skip
        settings = SyncSettings.of(s.bucket_cap_mb, s.grad_groups)
        lowered = lower(s.grad_sync, SyncContext(self.grad_units(), lambda _n: 0.0, None, settings),
                        s.optimizer_sharding)  # fmt: skip
        out = {}
        size = self.grad_buffer.element_size()
        names = bucket_names(self.model, lowered.buckets, self.pipe_rank)
        for bucket in lowered.buckets:
            spans = sorted(self.spans[t] for t in bucket.tensors)
            if any(a[1] != b[0] for a, b in pairwise(spans)) or (spans[-1][1] - spans[0][0]) * size != bucket.nbytes:
                raise AssertionError(f"gradient bucket {bucket} is not one slice of the gradient buffer")
            out[bucket] = GradBucket(bucket, slice(spans[0][0], spans[-1][1]), names[bucket])
        return list(out.values()), [out[b] for b in lowered.gathers]

    def _chained_layers(self) -> frozenset[int]:
        """Layers li whose only input is layer li - 1's output, read by no other layer, on the same (virtual) stage,
        where li - 1 runs with hooks (not recomputed: its checkpoint's output carries none) and ends in an output."""
        readers = [0] * self.model.num_layers
        for li in range(self.model.num_layers):
            for s in self._sources(li):
                readers[self.model.index[s]] += 1
        starts = {start for start, _end in self.stage_ranges}
        return frozenset(
            li for li in self.layers
            if li > 0 and li not in starts and self._sources(li) == (self.model.layers[li - 1].name,)
            and readers[li - 1] == 1 and li - 1 not in self.recomputed
            and self.model.layers[li - 1].blocks[-1].op != "lm_head"
        )  # fmt: skip

    def _sources(self, li: int) -> tuple[str, ...]:
        layer = self.model.layers[li]
        return layer.inputs if layer.inputs is not None else ((self.model.layers[li - 1].name,) if li else ())

    def _data_blocks(self) -> set[tuple[int, int]]:
        """(layer, block) of this rank's blocks that read training data: token ids, targets, or the input (a source
        layer's first block)."""
        return {(li, bi) for (li, bi) in self.modules if (not self._sources(li) and bi == 0)
                or not all(self.signature[(li, bi)])}  # fmt: skip

    def _prefetch(self, iteration: int) -> None:
        """The iteration's training data, on the device before the iteration starts (as a data loader's prefetch):
        the simulator models no data loading, and on a GPU a pageable host-to-device copy would make the host wait
        for the device inside the iteration."""
        self.data = {}
        for a in self.actions:
            if a.op != "F":
                continue
            start, end = self.stage_ranges[a.stage]
            samples = self._samples(a.microbatch)
            for li in range(start, end):
                for bi, block in enumerate(self.model.layers[li].blocks):
                    if (li, bi) in self.data_blocks:
                        self.data[(li, bi, a.microbatch)] = data.batch(block, self.seed, iteration, li, bi, samples,
                                                                       self.dtype, self.device)  # fmt: skip

    def _peer(self, vs: int) -> int:
        return int(self.grid[vs % self.pp, self.replica, self.tp_rank])

    def _p2p_group(self, src: int, dst: int, phase: str) -> Any:
        """The group of this direction's transfers (activations forward, gradients backward), or None: the default
        group (one process, or a runtime built without the executor's groups)."""
        return self.groups.get("p2p", {}).get((src, dst, phase))

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
        stream = "compute" if self.p2p_blocking else "p2p"
        what = "act" if phase == "F" else "grad"
        host = self.clock.now()
        # a blocking send runs on the current stream; a non-blocking one from a side stream per peer (see clock.py)
        with nullcontext() if self.p2p_blocking else self.clock.side(f"p2p:{dst}"):
            start = self.clock.mark()
            works = []
            group = self._p2p_group(self.rank, dst, phase)
            for t in tensors:
                t = t.detach().contiguous()
                if first:  # on the rank's device: NCCL sends device tensors only
                    header = torch.tensor([t.dim(), *t.shape, _DTYPES.index(t.dtype)], dtype=torch.int64,
                                          device=self.device)  # fmt: skip
                    dist.send(torch.tensor([header.numel()], dtype=torch.int64, device=self.device), dst, group)
                    dist.send(header, dst, group)
                if self.p2p_blocking:
                    dist.send(t, dst, group)
                else:
                    works.append(dist.isend(t, dst, group))
                    self.pending.append((works[-1], t))
            end = self.clock.mark() if self.p2p_blocking else self.clock.enqueued(works)
        meta: Meta = (stream, "p2p", f"{what} {src_vs}->{vs}", -1, src_vs, mb)
        info = (self.keys.p2p(src_vs, vs), nbytes(*tensors), dst, group_text((self.rank, dst)))
        self.recorder.send(key, meta, start, end, (host, self.clock.now()), info)

    def _recv(self, n: int, vs: int, phase: str, dst_vs: int, mb: int, iteration: int) -> list[Tensor]:
        src = self._peer(vs)
        key = (vs, dst_vs, phase, mb, self.replica, self.tp_rank)
        shape_key = (vs, dst_vs, phase)
        out = []
        first = shape_key not in self.shapes
        group = self._p2p_group(src, self.rank, phase)
        for i in range(n):
            if first:  # the first iteration's transfer (a warm-up one): waiting for the header is fine
                head_len = torch.zeros(1, dtype=torch.int64, device=self.device)
                dist.recv(head_len, src, group)
                header = torch.zeros(int(head_len.item()), dtype=torch.int64, device=self.device)
                dist.recv(header, src, group)
                values = header.tolist()
                ndim = values[0]
                self.shapes.setdefault(shape_key, []).append((tuple(values[1 : 1 + ndim]), _DTYPES[values[1 + ndim]]))
            shape, dtype = self.shapes[shape_key][i]
            t = torch.empty(shape, dtype=dtype, device=self.device)
            dist.recv(t, src, group)
            out.append(t)
        self.recorder.received(key, self.clock.mark())  # the current stream has the data (it waited for the recv)
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
        for li in range(start, end):
            acts = [st.env[self.model.index[s]] for s in self._sources(li)]
            feeds = {bi: self.data.pop((li, bi, mb)) for bi in range(len(self.model.layers[li].blocks))
                     if (li, bi) in self.data_blocks}  # fmt: skip

            def layer(xs: list[Tensor], li: int = li, feeds: dict[int, list[Tensor]] = feeds) -> Tensor:
                return self._layer(li, vs, mb, xs, feeds)

            out = checkpointed(layer, acts, self.device) if li in self.recomputed else layer(acts)
            if self.model.layers[li].blocks[-1].op == "lm_head":
                st.losses.append(out)
            else:
                st.env[li] = out
        if vs < self.strategy.num_stages - 1:
            outgoing = self.live[end - 1]
            self._send([st.env[li] for li in outgoing], vs + 1, "F", vs, mb, iteration)

    def _layer(self, li: int, vs: int, mb: int, acts: list[Tensor], feeds: dict[int, list[Tensor]]) -> Tensor:
        """Run layer li's blocks on its input activations and data, each with its backward hooks; returns the layer's
        output (for a layer ending in the LM head, its loss). A recomputed layer runs it twice: without autograd in
        the forward (events of kind ``forward``), with autograd inside its checkpoint's backward (``recompute``)."""
        kind = "recompute" if li in self.recomputed and torch.is_grad_enabled() else "forward"
        layer = self.model.layers[li]
        x: Tensor | None = None
        for bi, block in enumerate(layer.blocks):
            feed = feeds.get(bi, [])
            if not self._sources(li) and bi == 0:  # a source layer's first block reads the batch itself
                args = feed
            else:  # activations from the layer's inputs (or the previous block), ids/targets from the data
                acts_iter = iter(acts if bi == 0 else [x, *acts[1:]])
                data_iter = iter(feed)
                args = [next(acts_iter) if is_float else next(data_iter) for is_float in self.signature[(li, bi)]]
            name = layer.name if len(layer.blocks) == 1 else f"{layer.name}.{block.op}"

            def run(inputs: list[Any], module: Any = self.modules[(li, bi)], name: str = name) -> Tensor:
                with self.recorder.block(kind, name, li, vs, mb):
                    return module(*inputs)

            # a chained block's only input needing a gradient is the previous block's output (see BackwardTimer.watch)
            chained = (li in self.chained and kind == "forward") if bi == 0 else not any(
                isinstance(a, Tensor) and a.requires_grad and a is not x for a in args)  # fmt: skip
            x = self.hooks.watch((("compute", "backward", name, li, vs, mb), bi), args, run, chained)
            if block.op == "lm_head" and kind == "forward":
                self.loss_values.append(x.detach())  # read after the iteration: no host wait here
        assert x is not None
        return x

    def backward(self, vs: int, mb: int, iteration: int, state: dict[tuple[int, int], _MicroBatch]) -> None:
        """One backward call for the micro-batch's stage, from its losses (scaled) and the gradients received for
        what it sent; the blocks are timed by hooks inside it, and in the last micro-batch the gradient buckets a
        layer completes are issued right after its backward (:meth:`_block_done`)."""
        end = self.stage_ranges[vs][1]
        st = state.pop((vs, mb))
        roots: list[Tensor] = []
        grads: list[Tensor | None] = []
        if vs < self.strategy.num_stages - 1:
            outgoing = self.live[end - 1]
            received = self._recv(len(outgoing), vs + 1, "B", vs, mb, iteration)
            for li, g in zip(outgoing, received, strict=True):
                if st.env[li].requires_grad:
                    roots.append(st.env[li])
                    grads.append(g)
        scale = 1.0 / (self.strategy.num_micro_batches * self.dp)  # a sum over replicas then gives the mean
        roots += [loss * scale for loss in st.losses]
        grads += [None] * len(st.losses)
        self._final = (vs, self.last_b.get(vs) == mb)
        with self.hooks.call():
            if roots:
                torch.autograd.backward(roots, grads)
        if vs > 0:
            grads_back = [leaf.grad if leaf.grad is not None else torch.zeros_like(leaf) for leaf in st.received]
            self._send(grads_back, vs - 1, "B", vs, mb, iteration)

    def _block_done(self, li: int, bi: int) -> None:
        """A block's backward is done: after a layer's first block in the stage's last micro-batch, issue the
        gradient buckets that layer completes."""
        vs, final = self._final
        if final and bi == 0:
            for bucket in self.ready.get(li, ()):
                self._issue(bucket, vs)

    # ------------------------------------------------------------------------------------------ gradient sync
    def _sync(self, bucket: GradBucket, async_op: bool) -> Any:
        """A bucket's gradient collective: an all-reduce, or ZeRO-1's reduce-scatter (:mod:`distsim.executor.zero`)."""
        if self.zero is not None:
            return self.zero.reduce_scatter(bucket.name, async_op)
        return dist.all_reduce(self.grad_buffer[bucket.part], group=self.groups["dp"], async_op=async_op)

    def _bucket_info(self, bucket: GradBucket, gather: bool = False) -> tuple[str, int, int, str]:
        """A bucket's collective's key, bytes (its slice of the gradient or, gathered, parameter buffer: padded
        under ZeRO-1), no peer, and the data-parallel group; worked out once (asked inside every iteration)."""
        known = self._infos.get((bucket.name, gather))
        if known is None:
            key = self.keys.gather(bucket.bucket) if gather else self.keys.bucket(bucket.bucket)
            size = self.zero.param_buffer.element_size() if gather and self.zero else self.grad_buffer.element_size()
            group = group_text(self.grid[self.pipe_rank, :, self.tp_rank])
            known = self._infos[(bucket.name, gather)] = (key, (bucket.part.stop - bucket.part.start) * size, -1, group)
        return known

    def _issue(self, bucket: GradBucket, vs: int) -> None:
        """Synchronise a bucket asynchronously during backward (stage vs), as DDP and WFBP do."""
        assert bucket.bucket.ready is not None
        meta: Meta = ("dp", "dp_allreduce", bucket.name, bucket.bucket.ready, vs, -1)
        host = self.clock.now()
        with self.clock.side("dp"):  # overlapped with the rest of backward (see clock.py)
            start = self.clock.mark()
            work = self._sync(bucket, async_op=True)
            end = self.clock.completion(work)
        self.recorder.launched(meta, host, self.clock.now())
        self._syncs.append((work, meta, start, end, self._bucket_info(bucket)))

    def _finish_grads(self) -> None:
        """Wait for the buckets issued during backward, then synchronise those that wait for the whole backward and
        all-reduce the tied embedding copies (Megatron-LM's ``finalize_model_grads`` order)."""
        for work, meta, start, end, info in self._syncs:
            self.clock.wait(work, end)
            self.recorder.add(meta, start, end, info=info)
        self._syncs = []
        for bucket in self.buckets:
            if bucket.bucket.ready is None:
                with self.recorder.span("dp", "dp_allreduce", bucket.name, -1, self.pipe_rank, -1,
                                        self._bucket_info(bucket)):  # fmt: skip
                    self._sync(bucket, async_op=False)
        if "tied" in self.groups:
            li, param, name = self.groups["tied_param"]
            target = self.model.index[self.model.layers[li].tied_to]
            info = (self.keys.tied(li, target), nbytes(param.grad), -1, group_text(dist.get_process_group_ranks(
                self.groups["tied"])))  # fmt: skip
            with self.recorder.span("dp", "dp_allreduce", name, li, self.pipe_rank, -1, info):
                dist.all_reduce(param.grad, group=self.groups["tied"])

    # ------------------------------------------------------------------------------------------------ iteration
    def run_iteration(
        self, iteration: int, barrier: Callable[[], None], before_step: Callable[[], None] | None = None,
        after_step: Callable[[], None] | None = None,
    ) -> None:  # fmt: skip
        """One training step; no host synchronisation with the device between its start and its end. `before_step`
        and `after_step`: correctness checks (iteration 0 of a test run) that read losses and gradients, and the
        parameters the step made."""
        self._syncs: list[Any] = []
        self._prefetch(iteration)
        barrier()
        self.recorder.begin(iteration)
        state: dict[tuple[int, int], _MicroBatch] = {}
        for a in self.actions:
            (self.forward if a.op == "F" else self.backward)(a.stage, a.microbatch, iteration, state)
        self._finish_grads()
        if before_step is not None:
            self._read_losses()
            before_step()
        with self.recorder.span("compute", "optimizer", "optimizer step", -1, self.pipe_rank, -1,
                                (self.keys.optimizer, 0, -1, "")):  # fmt: skip
            self.optimizer.step()
        for bucket in self.gathers:  # ZeRO-1: every rank stepped its shards; all-gather the parameters
            layer = -1 if bucket.bucket.ready is None else bucket.bucket.ready
            with self.recorder.span("gather", "dp_allreduce", gather_name(bucket.name), layer, self.pipe_rank, -1,
                                    self._bucket_info(bucket, gather=True)):  # fmt: skip
                assert self.zero is not None
                self.zero.gather(bucket.name)
        if after_step is not None:
            after_step()
        for work, _t in self.pending:
            work.wait()
        self.recorder.finish(self.pipe_rank)
        self.pending = []
        self._read_losses()

    def _read_losses(self) -> None:
        if self.loss_values:
            self.losses += torch.stack(self.loss_values).float().tolist()
            self.loss_values = []

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

"""Executing a burst plan (DeepPool) on one rank: every layer data-parallel over its own ranks, the batch
re-distributed between their layouts, events named as :mod:`distsim.plans.burst_flow` names them.

Rank r is GPU r of the plan (its GPUs are 0..N-1: :func:`distsim.executor.support.refuse_unsupported_burst`). It
builds only the blocks of the layers it runs and trains one batch of B samples per iteration:

* **forward**, layers in model order: a rank that runs layer v holds its shard of the batch
  (:func:`distsim.plans.redistribution.shards`) and reads the outputs of v's producers on that shard. Where a producer
  ran on another
  layout its output is re-distributed first (:func:`distsim.plans.redistribution.pieces`): each piece of the batch
  that changes rank
  goes by a point-to-point ``isend``/``irecv`` pair (gloo runs these reliably; all-to-all would need every rank of a
  group), once per producer and consumer layout, recorded on the ``p2p`` stream as the simulator's transfer
  ``act NAME G->G' GPUs`` on every rank that moves samples (see :meth:`BurstRuntime._move` for the row's span).
  Ranks that do not run a layer and move none of its samples skip it. The LM head's shard loss (the mean over the
  shard's tokens) is weighted by n/B, so the shard losses add up to the batch mean.
* **backward**, layers in reverse: the gradient of a layer's output is the sum over its consumers of their input
  gradients, moved back to its layout (``grad NAME G'->G GPUs``, one transfer per edge); the layer's blocks run
  backward from it. With the n/B weights a rank's parameter gradients are its shard's part of the batch gradient, so
  a layer's gradient is the SUM over its ranks: each layer's gradients (one slice of the rank's gradient buffer) are
  all-reduced over the layer's own ranks, ``bulk`` after the whole backward in reverse layer order, or ``wfbp`` right
  after that layer's backward, asynchronously (:mod:`distsim.plans.burst_flow`'s ``grads NAME``).
* a tied pair (an LM head sharing the embedding's matrix) on the same ranks shares one parameter, synchronised with
  the embedding; on different ranks each keeps a copy, and after the layers' all-reduces (every rank of a layer then
  holds its copy's full gradient g) the copies are all-reduced over both layers' ranks, each rank contributing
  g / (its layer's rank count) per copy it holds, so each copy ends with g_embedding + g_head
  (``tied grads HEAD~EMBEDDING``);
* **Adam** on every rank for the parameters of the layers it runs (a layer's replicas stay identical).

The block-level machinery (the blocks' recording and backward hooks, the model's deterministic weights and data,
the contiguous gradient buffer, Adam) is :class:`distsim.executor.runtime.Runtime`'s, which this class extends with
a burst plan's iteration instead of a pipeline schedule's. Only the host clock is exercised (CPU ranks, gloo).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from distsim.core.models.graph import Model
from distsim.executor import data
from distsim.executor.backward import BackwardTimer
from distsim.executor.clock import clock_for
from distsim.executor.keys import group_text, nbytes
from distsim.executor.model import build_modules, unique_parameters, vocab_weight
from distsim.executor.recorder import Meta, Recorder
from distsim.executor.runtime import Runtime, _Adam
from distsim.plans import Plan
from distsim.plans.burst_flow import lower_sync
from distsim.plans.redistribution import pieces, shards
from distsim.profiler.tp_comm import TPComm

Layout = tuple[int, ...]


def tied_copies(model: Model, plan: Plan) -> list[tuple[int, int]]:
    """(layer, the layer it is tied to) of each tied pair on different layouts: each keeps its own copy of the shared
    matrix (the simulator's tied pairs, :mod:`distsim.plans.burst_flow`)."""
    layouts = plan.burst
    out = []
    for i, layer in enumerate(model.layers):
        if layer.tied_to is not None:
            t = model.index[layer.tied_to]
            if layouts[t] != layouts[i] and layer.tied_shard_params(1) > 0:
                out.append((i, t))
    return out


def group_members(model: Model, plan: Plan) -> list[tuple[int, ...]]:
    """The rank sets that all-reduce: every layout of more than one rank and each tied pair's union, sorted, each
    once, in a fixed order (every rank creates every group in this order)."""
    sets = [tuple(sorted(d)) for d in plan.burst if len(d) > 1]
    sets += [tuple(sorted(set(plan.burst[i]) | set(plan.burst[t]))) for i, t in tied_copies(model, plan)]
    return list(dict.fromkeys(sets))


def burst_groups(model: Model, plan: Plan, rank: int) -> dict[tuple[int, ...], Any]:
    """Sorted ranks -> process group, for the groups this rank is in (collective: every rank calls it)."""
    out = {}
    for members in group_members(model, plan):
        group = dist.new_group(list(members))
        if rank in members:
            out[members] = group
    return out


class BurstRuntime(Runtime):
    """One rank of a burst plan; :meth:`run_iteration` trains one batch (the worker's interface of a Runtime)."""

    def __init__(
        self, model: Model, plan: Plan, rank: int, groups: dict[tuple[int, ...], Any], dtype: torch.dtype,
        device: torch.device, seed: int = 0, lr: float = 1e-4,
    ) -> None:  # fmt: skip
        # no Runtime.__init__: a burst rank has no pipeline placement, schedule or data-parallel buckets
        self.model, self.plan, self.rank, self.groups = model, plan, rank, groups
        self.dtype, self.device, self.seed = dtype, device, seed
        self.batch, self.layouts = plan.strategy.micro_batch_size, plan.burst
        self.sync_plan = lower_sync(plan.strategy.grad_sync, [1] * model.num_layers)
        self.shards = [shards(self.batch, d) for d in self.layouts]
        self.replica, self.tp, self.tp_rank, self.pipe_rank, self.zero = 0, 1, 0, 0, None
        self.clock = clock_for(device)
        self.recorder = Recorder(self.clock)
        self.hooks = BackwardTimer(self.recorder, lambda _li, _bi: None)  # a layer's sync follows its backward call
        self.recomputed: frozenset[int] = frozenset()
        self.chained: frozenset[int] = frozenset()  # each edge's input is a leaf of its own: every block tapped
        self.layers = [v for v, d in enumerate(self.layouts) if rank in d]
        self.tied = tied_copies(model, plan)
        copied = {li for pair in self.tied for li in pair}
        together = [li for li in self.layers if li not in copied]  # same-layout tied pairs share their matrix
        self.modules = build_modules(model, together, 1, 0, TPComm.local(), dtype, device, seed)
        for li in self.layers:
            if li in copied:
                self.modules.update(build_modules(model, [li], 1, 0, TPComm.local(), dtype, device, seed))
        self.params = unique_parameters(list(self.modules.values()))
        self.signature = {k: [t.is_floating_point() for t in m.example_inputs(1)] for k, m in self.modules.items()}
        self.data_blocks = self._data_blocks()
        self.layer_params = self._layer_params()
        self.grad_buffer, self.spans = self._grad_buffer()
        self.optimizer = _Adam(self.params, lr)
        self.consumers: list[list[int]] = [[] for _ in model.layers]
        for v, inputs in enumerate(model.input_layers):
            for u in inputs:
                self.consumers[u].append(v)
        self.sample_shapes = self._sample_shapes()
        self.loss_values: list[Tensor] = []
        self.losses: list[float] = []
        """Per iteration, this rank's weighted shard loss (n/B x its mean): the losses of the last layer's ranks add
        up to the batch's mean loss."""
        self.data: dict[tuple[int, int], list[Tensor]] = {}

    # -------------------------------------------------------------------------------------------- structure
    def _sample_shapes(self) -> dict[int, tuple[tuple[int, ...], torch.dtype]]:
        """Producer layer -> (shape of one sample of its output, dtype), for the producers of this rank's layers: the
        matching activation input of the consumer's first block (what this rank receives into)."""
        out = {}
        for v in self.layers:
            floats = [t for t in self.modules[(v, 0)].example_inputs(1) if t.is_floating_point()]
            for u, t in zip((self.model.index[s] for s in self._sources(v)), floats, strict=False):
                out[u] = (tuple(t.shape[1:]), t.dtype)
        return out

    def _slice(self, li: int) -> slice:
        """Layer li's gradients in the buffer (its parameters are consecutive there)."""
        spans = [s for (layer, _k), s in self.spans.items() if layer == li]
        return slice(min(a for a, _ in spans), max(b for _, b in spans)) if spans else slice(0, 0)

    def _group(self, ranks: Layout) -> Any:
        return self.groups[tuple(sorted(ranks))]

    # -------------------------------------------------------------------------------------------- transfers
    def _move(self, local: Tensor | None, src: Layout, dst: Layout, sample: tuple[tuple[int, ...], torch.dtype] | None,
              key: tuple[Any, ...], meta: Meta) -> Tensor | None:  # fmt: skip
        """Re-distribute a tensor whose shard under `src` this rank holds as `local` (None if not in `src`) to `dst`;
        returns this rank's shard under `dst` (None if not in `dst`). `sample`: one received sample's shape and dtype.

        Every rank that moves samples records one ``p2p`` row for the transfer `key`: a sender from its first send,
        a rank that only receives from when it has the data; :func:`distsim.executor.worker._assemble` then starts
        every mover's row at the transfer's first send and ends a sender's when the last receiver has its data, so
        the rows span the transfer as the simulator's single task does (a receiver that posted its receive early is
        not charged for waiting on the senders' compute)."""
        me, moves = self.rank, pieces(self.batch, src, dst)
        first = shards(self.batch, src)[me][0] if me in src else 0  # the batch index of local[0]
        out_pieces = [(lo, hi, b) for lo, hi, a, b in moves if a == me and b != me]
        in_pieces = [(lo, hi, a) for lo, hi, a, b in moves if b == me and a != me]
        received: dict[int, Tensor] = {}
        if out_pieces or in_pieces:
            host = self.clock.now()
            start = self.clock.mark()
            works, handed = [], []
            for lo, hi, b in out_pieces:
                assert local is not None
                handed.append(local[lo - first : hi - first].detach().contiguous())
                works.append(dist.isend(handed[-1], b))
            for lo, hi, a in in_pieces:
                assert sample is not None
                shape, dtype = sample
                received[lo] = torch.empty((hi - lo, *shape), dtype=dtype, device=self.device)
                works.append(dist.irecv(received[lo], a))
            for work in works:
                work.wait()
            end = self.clock.mark()
            info = _move_info(moves, me, nbytes(*handed, *received.values()))
            self.recorder.send(key, meta, start if out_pieces else end, end, (host, self.clock.now()), info)
            if in_pieces:
                self.recorder.received(key, end)
        if me not in dst:
            return None
        parts = []
        for lo, hi, a, b in moves:
            if b == me:
                if a == me:
                    assert local is not None
                    parts.append(local[lo - first : hi - first].detach())
                else:
                    parts.append(received[lo])
        return parts[0] if len(parts) == 1 else torch.cat(parts)

    # ----------------------------------------------------------------------------------------------- phases
    def _forward(self, v: int, outputs: dict[int, Tensor], inputs: dict[tuple[int, int], Tensor],
                 moved: dict[tuple[int, Layout], Tensor | None]) -> None:  # fmt: skip
        layouts, name = self.layouts, self.model.layers
        for u in self.model.input_layers[v]:
            if (u, layouts[v]) in moved:
                continue
            if layouts[u] == layouts[v]:
                moved[(u, layouts[v])] = outputs.get(u)
            else:
                meta: Meta = ("p2p", "p2p", f"act {name[u].name} {len(layouts[u])}->{len(layouts[v])} GPUs", u, u, -1)
                moved[(u, layouts[v])] = self._move(outputs.get(u), layouts[u], layouts[v], self.sample_shapes.get(u),
                                                    ("burst", "F", u, layouts[v]), meta)  # fmt: skip
        if self.rank not in layouts[v]:
            return
        acts = []
        for u in (self.model.index[s] for s in self._sources(v)):
            held = moved[(u, layouts[v])]
            assert held is not None
            inputs[(u, v)] = held.detach().requires_grad_()  # each edge its own leaf: its gradient goes back alone
            acts.append(inputs[(u, v)])
        feeds = {bi: self.data.pop((v, bi)) for bi in range(len(name[v].blocks)) if (v, bi) in self.data_blocks}
        outputs[v] = self._layer(v, v, -1, acts, feeds)  # for the LM head its shard's loss

    def _backward(self, v: int, outputs: dict[int, Tensor], inputs: dict[tuple[int, int], Tensor]) -> None:
        layouts, name = self.layouts, self.model.layers
        mine = self.rank in layouts[v]
        grad: Tensor | None = None
        for w in self.consumers[v]:
            leaf = inputs.get((v, w))
            edge = None if leaf is None else (leaf.grad if leaf.grad is not None else torch.zeros_like(leaf))
            if layouts[w] != layouts[v]:
                meta: Meta = ("p2p", "p2p", f"grad {name[v].name} {len(layouts[w])}->{len(layouts[v])} GPUs", v, v, -1)
                sample = (tuple(outputs[v].shape[1:]), outputs[v].dtype) if mine else None
                edge = self._move(edge, layouts[w], layouts[v], sample, ("burst", "B", v, w), meta)
            if mine and edge is not None:
                grad = edge if grad is None else grad + edge
        if not mine:
            return
        lo, hi = self.shards[v][self.rank]
        weight = (hi - lo) / self.batch  # the shard's share of the batch mean
        with self.hooks.call():  # the layer's blocks in one backward call, timed by hooks (executor/backward.py)
            if self.model.layers[v].blocks[-1].op == "lm_head":  # its shard loss
                torch.autograd.backward(outputs[v] * weight)
            elif grad is not None:
                torch.autograd.backward(outputs[v], grad)

    # ------------------------------------------------------------------------------------------ gradient sync
    def _all_reduce(self, v: int, async_op: bool) -> Any:
        """Layer v's gradients summed over its ranks (None where it runs on one rank or holds no gradient)."""
        part = self._slice(v)
        if len(self.layouts[v]) < 2 or part.stop == part.start:
            return None
        meta: Meta = ("dp", "dp_allreduce", f"grads {self.model.layers[v].name}", v, v, -1)
        group = self._group(self.layouts[v])
        info = ("", nbytes(self.grad_buffer[part]), -1, group_text(self.layouts[v]))
        if not async_op:
            with self.recorder.span(*meta, info):
                dist.all_reduce(self.grad_buffer[part], group=group)
            return None
        host = self.clock.now()
        with self.clock.side("dp"):  # overlapped with the rest of backward (see clock.py)
            start = self.clock.mark()
            work = dist.all_reduce(self.grad_buffer[part], group=group, async_op=True)
            end = self.clock.completion(work)
        self.recorder.launched(meta, host, self.clock.now())
        return work, meta, start, end, info

    def _tied_all_reduce(self, i: int, t: int) -> None:
        """The copies of a tied pair on different layouts: every copy ends with the sum of both layers' gradients."""
        union = tuple(sorted(set(self.layouts[i]) | set(self.layouts[t])))
        if self.rank not in union:
            return
        name = f"tied grads {self.model.layers[i].name}~{self.model.layers[i].tied_to}"
        grads = [(len(self.layouts[li]), vocab_weight(self.modules[(li, 0)]).grad) for li in (t, i)
                 if self.rank in self.layouts[li]]  # fmt: skip
        (n, first), *others = grads
        assert first is not None
        info = ("", nbytes(first), -1, group_text(union))
        with self.recorder.span("dp", "dp_allreduce", name, i, i, -1, info):  # in place in the gradient buffer
            first.div_(n)
            for n, g in others:
                first.add_(g, alpha=1 / n)
            dist.all_reduce(first, group=self._group(union))
            for _n, g in others:
                assert g is not None
                g.copy_(first)

    # ------------------------------------------------------------------------------------------------ iteration
    def _prefetch(self, iteration: int) -> None:
        """This rank's shards of the iteration's data, on the device before the iteration starts."""
        self.data = {}
        for v in self.layers:
            lo, hi = self.shards[v][self.rank]
            for bi, block in enumerate(self.model.layers[v].blocks):
                if (v, bi) in self.data_blocks:
                    self.data[(v, bi)] = data.batch(block, self.seed, iteration, v, bi, range(lo, hi), self.dtype,
                                                    self.device)  # fmt: skip

    def run_iteration(
        self, iteration: int, barrier: Callable[[], None], before_step: Callable[[], None] | None = None,
        after_step: Callable[[], None] | None = None,
    ) -> None:  # fmt: skip
        """One training step of the batch (see the module); the hooks as :meth:`Runtime.run_iteration`'s."""
        self._prefetch(iteration)
        barrier()
        self.recorder.begin(iteration)
        outputs: dict[int, Tensor] = {}
        inputs: dict[tuple[int, int], Tensor] = {}
        moved: dict[tuple[int, Layout], Tensor | None] = {}
        for v in range(self.model.num_layers):
            self._forward(v, outputs, inputs, moved)
        pending = []
        for v in reversed(range(self.model.num_layers)):
            self._backward(v, outputs, inputs)
            for bucket in self.sync_plan.by_layer.get(v, ()):
                pending += [self._all_reduce(u, async_op=True) for u in bucket.layers if self.rank in self.layouts[u]]
        for issued in pending:
            if issued is not None:
                work, meta, start, end, info = issued
                self.clock.wait(work, end)
                self.recorder.add(meta, start, end, info=info)
        held = set(self.layers)
        for bucket in self.sync_plan.at_end:
            for v in bucket.layers:
                if v in held:
                    self._all_reduce(v, async_op=False)
        for i, t in self.tied:
            self._tied_all_reduce(i, t)
        if before_step is not None:
            self._read_losses()
            before_step()
        with self.recorder.span("compute", "optimizer", "optimizer step", -1, -1, -1):
            self.optimizer.step()
        if after_step is not None:
            after_step()
        self.recorder.finish(-1)
        self._read_losses()

    def _read_losses(self) -> None:
        if self.loss_values:
            lo, hi = self.shards[-1][self.rank]
            self.losses += [x * (hi - lo) / self.batch for x in torch.stack(self.loss_values).float().tolist()]
            self.loss_values = []


def _move_info(moves: list[tuple[int, int, int, int]], me: int, size: int) -> tuple[str, int, int, str]:
    """A re-distribution's row on rank `me`: no key (the simulator prices the busiest GPU's bytes on a scope this
    rank does not know), the bytes this rank sent and received, the other rank where only two move, and the ranks
    that move samples (the simulator's transfer spans them)."""
    movers = sorted({g for _lo, _hi, a, b in moves if a != b for g in (a, b)})
    peer = next((g for g in movers if g != me), -1) if len(movers) == 2 else -1
    return "", size, peer, group_text(movers)

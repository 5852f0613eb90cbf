"""A user's own torch module as a layer graph (``distsim profile --torch-model module:function``).

The user's function returns the module and an example micro-batch (:mod:`distsim.profiler.torch_user` states the
contract); one traced forward pass (:mod:`distsim.profiler.torch_trace`) gives the call order and the blocks.

Discovery walks the module tree for *repeated blocks*: siblings of the same class with the same parameter shapes
(GPT-2's ``transformer.h.0 .. h.23``), choosing the group that holds the most parameters (the shallower on a tie)
among those one forward pass calls once each, one after another. Each block is a layer of the graph; everything the
forward does before the first block (embeddings, mask construction) is one layer ``pre``, everything after the last
(final norm, LM head, loss) one layer ``post``; either is left out when it holds no parameters. A module without
repeated blocks gets one layer per child of its body (the outermost module with more than one child) and says so;
failing that, the whole module is one layer. Work done between two blocks outside any module is not timed.

One forward pass with hooks gives the call order, the tensors crossing each cut (produced before it and used after
it: a pipeline stage boundary's activation bytes), each layer's saved-for-backward bytes (``saved_tensors_hooks``,
each storage counted once, parameters excluded) and its parameters: those of the modules it calls and those its
module calls receive as arguments, each once, a parameter an earlier layer already used being *tied* to that layer (a
Hugging Face LM head owning the word embedding's weight, megatron-core's output layer given it as ``weight=``).

A module that recomputes its blocks in backward (Hugging Face activation checkpointing, megatron-core's
``recompute_granularity``, torch.utils.checkpoint) is refused in one line: profile it without checkpointing and let
``simulate --recompute full`` add the recomputed forward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from distsim.profiler.torch_trace import (
    Call,
    Recording,
    body_children,
    checkpointing,
    choose_units,
    param_count,
    record,
    repeated_groups,
    signature,
)
from distsim.profiler.torch_user import (
    TorchModelError,
    batch_size,
    build,
    map_tensors,
    precision_of,
    seq_len,
    tensors_in,
)

MAX_KEY_TENSORS = 4
"""Input tensors whose shapes enter a block's event key (the rest rarely change its cost)."""


@dataclass
class LayerInfo:
    """One layer of the discovered graph."""

    name: str
    kind: str
    """Timing key: layers of one kind share their measured events (``pre``, ``post``, or a block signature)."""
    op: str
    shape: tuple[tuple[str, int], ...]
    params: int
    modules: list[str]
    tied_to: str | None = None
    tied_params: int = 0
    out_bytes: float = 0.0
    saved_bytes: float = 0.0


@dataclass
class TracedModel:
    """A user's module, its example batch and its layer graph, with what timing needs to run its parts."""

    spec: str
    module: nn.Module
    batch: Any
    device: torch.device
    units: list[str]
    """Paths of the modules that are layers (blocks), in call order."""
    repeated: bool
    layers: list[LayerInfo]
    calls: dict[str, Call]
    micro_batch_size: int
    seq_len: int | None
    precision: str
    unused_params: int = 0
    """Parameters of modules the forward pass never called (counted in ``pre``)."""

    @property
    def name(self) -> str:
        return type(self.module).__name__

    @property
    def has_pre(self) -> bool:
        return bool(self.layers) and self.layers[0].kind == "pre"

    @property
    def has_post(self) -> bool:
        return bool(self.layers) and self.layers[-1].kind == "post"

    @property
    def whole(self) -> bool:
        """No blocks: the whole module is one layer (timed as ``pre``)."""
        return not self.units

    def kinds(self) -> dict[str, LayerInfo]:
        """The layer to time for each kind: of several blocks the second, whose input needs a gradient as most
        blocks' inputs do (the first block's input is often the batch itself)."""
        same: dict[str, list[LayerInfo]] = {}
        for layer in self.layers:
            same.setdefault(layer.kind, []).append(layer)
        return {kind: xs[1] if len(xs) > 1 else xs[0] for kind, xs in same.items()}

    def model_dict(self, flops: Mapping[str, float] | None = None) -> dict[str, Any]:
        """The layer graph in the model-file format (:mod:`distsim.core.models.loader`); `flops`: forward FLOPs per
        micro-batch by kind."""
        layers = []
        for x in self.layers:
            block: dict[str, Any] = {"op": x.op, "shape": dict(x.shape), "params": x.params, "tp": "none"}
            if flops and flops.get(x.kind):
                block["flops"] = flops[x.kind] / self.micro_batch_size
            entry: dict[str, Any] = {"name": x.name, "blocks": [block], "out_bytes": x.out_bytes,
                                     "saved_bytes": x.saved_bytes}  # fmt: skip
            if x.tied_to is not None:
                entry["tied_to"], entry["tied_params"] = x.tied_to, x.tied_params
            if x.kind in ("pre", "post") and self.units:
                entry["recomputable"] = False  # checkpointing wraps the blocks (HF, Megatron), not what is around them
            layers.append(entry)
        data: dict[str, Any] = {
            "name": self.name,
            "precision": self.precision,
            "micro_batch_size": self.micro_batch_size,
            "source": f"torch module {self.spec} ({self.name}), layer graph found by distsim profile --torch-model",
            "description": self.describe(),
            "layers": layers,
        }
        if self.seq_len is not None:
            data["seq_len"] = self.seq_len
        if self.repeated:
            data["pipeline_layers"] = len(self.units)
        return data

    def describe(self) -> str:
        parts = []
        for x in self.layers:
            if x.kind in ("pre", "post") or not self.repeated:
                parts.append(f"{x.name} ({', '.join(x.modules) or 'no module'})" if x.kind in ("pre", "post")
                             else x.name)  # fmt: skip
        if self.repeated:
            block = self.layers[1 if self.has_pre else 0]
            parts.insert(1 if self.has_pre else 0,
                         f"{len(self.units)} x {block.op.removeprefix('torch:')} ({span(self.units)})")  # fmt: skip
        return " + ".join(parts)

    def report(self) -> str:
        total = sum(p.numel() for p in {id(p): p for p in self.module.parameters()}.values())
        lines = [
            f"{self.spec}: {self.name}, {total:,} parameters ({self.precision}), example batch of "
            f"{self.micro_batch_size}" + (f" x {self.seq_len} tokens" if self.seq_len else ""),
            f"  layer graph: {self.describe()}",
        ]
        if not self.repeated:
            lines.append("  note: no repeated blocks (children of one class and parameter shapes called in turn): "
                         + ("one layer per child of the module's body" if self.units else "the whole module is one "
                            "layer"))  # fmt: skip
        for x in self.layers:
            tied = f", {x.tied_params:,} tied to {x.tied_to}" if x.tied_to else ""
            lines.append(f"    {x.name:<24} {x.params:>14,} params{tied}, {x.out_bytes:,.0f} B/sample out, "
                         f"{x.saved_bytes:,.0f} B/sample saved")  # fmt: skip
        if self.unused_params:
            lines.append(f"  note: {self.unused_params:,} parameters belong to modules the forward never called; "
                         "they are counted in the first layer")  # fmt: skip
        lines.append(f"  {len(self.kinds())} distinct layers to time forward and backward")
        return "\n".join(lines)


def span(paths: list[str]) -> str:
    """Module paths as one short name: ``transformer.h.0..23`` for siblings, else the first and the last."""
    if len(paths) < 2:
        return ", ".join(paths)
    head, _, first = paths[0].rpartition(".")
    tail = paths[-1].rpartition(".")[2]
    shared = all(p.rpartition(".")[0] == head for p in paths)
    return f"{head + '.' if head else ''}{first}..{tail}" if shared else f"{paths[0]} .. {paths[-1]}"


def trace(spec: str, device: torch.device | str) -> TracedModel:
    """Build the user's module and discover its layer graph from one forward pass (nothing is timed here). A
    module that recomputes its blocks in backward is refused (:func:`_refuse_checkpointing`)."""
    dev = torch.device(device)
    module, batch = build(spec, dev)
    _refuse_checkpointing(spec, checkpointing(module))
    groups, fallback = repeated_groups(module), body_children(module)
    watch = {p for g in groups for p in g} | set(fallback)
    try:
        rec = record(module, batch, watch)
    except TorchModelError as exc:  # the user's forward failed (or exited): say whose
        raise TorchModelError(f"--torch-model {spec}: {exc}") from None
    _refuse_checkpointing(spec, rec.checkpointed)
    units, repeated = choose_units(module, rec, groups, fallback)
    mbs = batch_size(batch)
    layers, unused = _layers(module, batch, rec, units, mbs)
    return TracedModel(spec, module, batch, dev, units, repeated, layers, {p: rec.calls[p] for p in units}, mbs,
                       seq_len(batch), precision_of(module), unused)  # fmt: skip


def _refuse_checkpointing(spec: str, how: str | None) -> None:
    """One line refusing a module that checkpoints (`how` says how; None: it does not). A profile times each
    block's forward and backward as they run without recomputation, and ``simulate --recompute`` adds the
    recomputed forward where the strategy says. A checkpointed block's backward would hold its recomputation
    (counted twice with --recompute full, and wrongly there with --recompute none), its saved bytes would be only
    its input, and megatron-core's checkpoint refuses the profiler's per-block ``backward(inputs=...)``. Turning the
    user's checkpointing off here would need each framework's switch (megatron fixes selective recomputation when it
    makes the layers; a plain torch.utils.checkpoint call has none), so the user builds the module without it: one
    changed line in their function, as the example builders' twins without ``_recompute`` are."""
    if how is not None:
        raise TorchModelError(
            f"--torch-model {spec}: the module recomputes its blocks in backward ({how}); distsim times blocks "
            "without recomputation and adds it when simulating: build the module without checkpointing to profile "
            "it, then simulate with --recompute full"
        )


def _layers(module: nn.Module, batch: Any, rec: Recording, units: list[str], mbs: int) -> tuple[list[LayerInfo], int]:
    """The layers (pre, units, post) with their parameters, tied weights, crossing and saved bytes, and the
    parameters of modules never called."""
    n = len(units)
    where = _Positions([(rec.calls[p].enter, rec.calls[p].exit) for p in units])
    used, first_use, paths, unused = _parameter_use(module, rec, units, where)
    saved = _saved_bytes(module, rec, where)
    crossing = _crossing(rec, units, batch)
    names = {-1: "pre", n: "post"} | {k: units[k] for k in range(n)} if units else {0: type(module).__name__}
    kinds = _kinds(module, rec, units)
    out: list[LayerInfo] = []
    for k in where.all:
        params = sum(p.numel() for p in used[k].values())
        if k in (-1, n) and units and not params:
            continue  # a pre or post with no parameters is not a layer (its little work is not timed)
        if k == -1 or not units:
            op = f"torch:{type(module).__name__}.{'pre' if units else 'all'}"
            kind, shape = "pre", _shape_of(params, tensors_in(batch))
        elif k == n:
            last = rec.calls[units[-1]].output
            kind, op, shape = "post", f"torch:{type(module).__name__}.post", _shape_of(params, tensors_in(last))
        else:
            kind, op, shape = kinds[k]
        layer = LayerInfo(names[k], kind, op, shape, params, paths[k] if k in (-1, n) or not units else [units[k]])
        tied: dict[int, int] = {}
        for pid, p in used[k].items():
            if first_use[pid] != k:  # an earlier layer used this parameter first: tied to it
                tied[first_use[pid]] = tied.get(first_use[pid], 0) + p.numel()
        if tied:
            target = max(tied, key=lambda t: tied[t])
            layer.tied_to, layer.tied_params = names[target], tied[target]
        layer.out_bytes, layer.saved_bytes = crossing.get(k, 0.0) / mbs, saved[k] / mbs
        out.append(layer)
    _drop_missing_ties(out)
    out[-1].out_bytes = 0.0  # no cut after the last layer (the loss is what it hands on)
    return out, unused


@dataclass(frozen=True)
class _Positions:
    """Where a moment of the traced pass (a sequence number) belongs: -1 before the first block (pre), k inside
    block k or after it up to the next (work between two blocks counts for the earlier), n after the last (post);
    without blocks, 0 (the whole module)."""

    spans: list[tuple[int, int]]

    @property
    def all(self) -> range:
        return range(-1, len(self.spans) + 1) if self.spans else range(0, 1)

    def __call__(self, seq: int) -> int:
        if not self.spans:
            return 0
        if seq < self.spans[0][0]:
            return -1
        if seq > self.spans[-1][1]:
            return len(self.spans)
        return max(k for k, (enter, _) in enumerate(self.spans) if enter <= seq)


def _parameter_use(module: nn.Module, rec: Recording, units: list[str], where: _Positions) -> tuple[
        dict[int, dict[int, nn.Parameter]], dict[int, int], dict[int, list[str]], int]:  # fmt: skip
    """Per position the parameters it uses (by id: each once) and the paths of its modules using parameters outside
    the blocks; per parameter the first position using it; and the parameters no call used (counted at the first
    position, as the rank holding it would store them). A call uses its module's own parameters and those it
    receives as arguments (megatron-core's output layer given the word embedding's weight)."""
    used: dict[int, dict[int, nn.Parameter]] = {k: {} for k in where.all}
    paths: dict[int, list[str]] = {k: [] for k in where.all}
    first_use: dict[int, int] = {}
    uses = [(call.enter, path, p) for path, call in rec.calls.items()
            for p in module.get_submodule(path).parameters(recurse=False)]  # fmt: skip
    for seq, path, p in sorted(uses + rec.param_args, key=lambda x: x[0]):
        k = where(seq)
        used[k][id(p)] = p
        first_use.setdefault(id(p), k)
        if not _inside(path, units) and path not in paths[k]:
            paths[k].append(path)
    unused = 0
    for p in module.parameters():
        if id(p) not in first_use:
            unused += p.numel()
            used[where.all[0]][id(p)] = p
            first_use[id(p)] = where.all[0]
    return used, first_use, paths, unused


def _saved_bytes(module: nn.Module, rec: Recording, where: _Positions) -> dict[int, float]:
    """Bytes saved for backward per position: each storage once, where it was first saved; parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    saved = dict.fromkeys(where.all, 0.0)
    counted: set[int] = set()
    for seq, ptr, nbytes in rec.saved:
        if ptr not in params and ptr not in counted:
            counted.add(ptr)
            saved[where(seq)] += nbytes
    return saved


def _crossing(rec: Recording, units: list[str], batch: Any) -> dict[int, float]:
    """Bytes crossing the cut after each position: tensors made at or before it and used after it. A block's
    output is made by that block; a tensor no block returned (a mask or position ids built before the blocks, or an
    output changed between two blocks) is taken as made just before its first user. The batch's own tensors are
    excluded: every pipeline stage reads those from its data loader."""
    made: dict[int, int] = {}
    for k, path in enumerate(units):
        for t in tensors_in(rec.calls[path].output):
            made.setdefault(id(t), k)
    users: dict[int, tuple[Tensor, list[int]]] = {}
    for k, path in enumerate(units):
        for t in tensors_in((rec.calls[path].args, rec.calls[path].kwargs)):
            users.setdefault(id(t), (t, []))[1].append(k)
    if units:
        for t in tensors_in(rec.calls[units[-1]].output):
            users.setdefault(id(t), (t, []))[1].append(len(units))  # post uses the last block's output
    from_batch = {id(t) for t in tensors_in(batch)}
    out: dict[int, float] = {}
    for key, (t, ks) in users.items():
        if key in from_batch:
            continue
        start = made.get(key, min(ks) - 1)
        for cut in range(start, max(ks)):
            out[cut] = out.get(cut, 0.0) + t.numel() * t.element_size()
    return out


def _drop_missing_ties(layers: list[LayerInfo]) -> None:
    """A tie to a position that is not a layer (a pre without parameters cannot be: it would have them) is
    dropped: the parameters then count as this layer's own."""
    names = {x.name for x in layers}
    for x in layers:
        if x.tied_to is not None and x.tied_to not in names:
            x.tied_to, x.tied_params = None, 0


def _inside(path: str, units: list[str]) -> bool:
    return any(path == u or path.startswith(u + ".") for u in units)


def _shape_of(params: int, inputs: list[Tensor]) -> tuple[tuple[str, int], ...]:
    """Event-key dimensions: the parameters and the shapes (after the batch dimension) of the first input tensors."""
    shape = [("params", params)]
    for i, t in enumerate(inputs[:MAX_KEY_TENSORS]):
        shape += [(f"x{i}_{d}", int(size)) for d, size in enumerate(t.shape) if d > 0]
    return tuple(shape)


def _kinds(module: nn.Module, rec: Recording, units: list[str]) -> list[tuple[str, str, tuple[tuple[str, int], ...]]]:
    """(kind, op, shape) of each block: blocks of one class, parameter shapes and input shapes share a kind."""
    out = []
    signatures: dict[tuple[str, tuple[tuple[str, int], ...]], list[Any]] = {}
    for path in units:
        sub, call = module.get_submodule(path), rec.calls[path]
        inputs = tensors_in((call.args, call.kwargs))
        full = (signature(sub), tuple((tuple(t.shape), t.dtype) for t in inputs))
        op, shape = f"torch:{type(sub).__name__}", _shape_of(param_count(sub), inputs)
        seen = signatures.setdefault((op, shape), [])
        if full not in seen:
            seen.append(full)
        variant = seen.index(full)
        if variant:  # same key, different block: keep their events apart
            shape = (*shape, ("variant", variant))
        out.append((f"{op}[{','.join(f'{k}={v}' for k, v in shape)}]", op, shape))
    return out


@contextlib.contextmanager
def stubbed(traced: TracedModel, on_call: Callable[[int, tuple[Any, ...], dict[str, Any], Any], Any]) -> Iterator[None]:
    """Every block replaced by a stub, so that one forward pass runs only what lies outside the blocks (``pre`` and
    ``post``). The stub of block k returns ``on_call(k, args, kwargs, output)``, where `output` is what the block
    returned when traced, detached (a stub may return a fresh leaf instead, to stop a backward pass there)."""
    outputs = [map_tensors(lambda t: t.detach(), traced.calls[p].output) for p in traced.units]
    modules = [traced.module.get_submodule(p) for p in traced.units]

    def stub(k: int) -> Callable[..., Any]:
        def forward(*args: Any, **kwargs: Any) -> Any:
            return on_call(k, args, kwargs, outputs[k])

        return forward

    try:
        for k, m in enumerate(modules):
            m.forward = stub(k)  # type: ignore[method-assign]
        yield
    finally:
        for m in modules:
            with contextlib.suppress(AttributeError):
                del m.forward

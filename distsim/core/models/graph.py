"""Workload description: a model is a DAG of layers, a layer is a sequence of tensor-parallel blocks.

A :class:`Block` is the unit of Megatron-style tensor parallelism (Shoeybi et al., 2019): its compute is sharded
over the tp ranks and, when ``tp > 1``, followed by one all-reduce of its output in forward and one of its input
gradient in backward. A transformer layer has two blocks (attention, MLP); a convolution has one block that cannot be
split. All per-sample quantities scale linearly with the micro-batch size.

Layers are stored in a topological order. A pipeline stage is a contiguous range of that order; the activations that
cross a stage boundary are the outputs of every earlier layer that a later layer still consumes (so skip connections,
T5's encoder output and Inception's branches are carried correctly).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Literal

from distsim.core.errors import ModelFileError
from distsim.core.models.ops import Op, op_totals

if TYPE_CHECKING:
    import networkx as nx

TPSplit = Literal["shard", "replicate", "none"]

MAX_LAYERS = 10_000
"""Most layers one model may have: a file's layers (repeats expanded) plus its transformer stack, or a zoo spec's
``layers=``; checked before any layer is built. The largest real models have 100-300 graph layers (GPT-3 175B: 96
transformer layers, 98 here with embedding and head; Megatron-Turing NLG 530B: 105; Inception-v3 here: 120), so
this is far above any of them and keeps a model's own size and its partitioning small. The event flow's size is
bounded separately (``distsim.plans.simulate`` refuses more than ``max_tasks`` tasks)."""


@dataclass(frozen=True)
class Precision:
    """Bytes per element of the training state (mixed precision with Adam by default: 16 B per parameter)."""

    name: str = "fp16-mixed"
    act_bytes: int = 2
    """Bytes per activation element (fp16/bf16: 2, fp32: 4)."""
    param_bytes: int = 2
    """Bytes per parameter for the weights the GPU computes with."""
    grad_bytes: int = 2
    """Bytes per gradient element (also the bytes the data-parallel all-reduce moves per parameter)."""
    optimizer_bytes: int = 12
    """Bytes of optimizer state per parameter (Adam with fp32 master weights: 4 + 4 + 4)."""
    gemm_bytes: int = 0
    """Bytes per operand element of the transformer layers' GEMMs when they differ from the activations' (1: FP8, on
    the FP8 tensor cores); 0: the activations' bytes."""

    @property
    def state_bytes_per_param(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes


FP16_MIXED = Precision()
BF16_MIXED = Precision(name="bf16-mixed")
"""bf16 weights and activations with fp32 master weights and Adam states: fp16-mixed's bytes (Megatron's --bf16)."""
FP32 = Precision(name="fp32", act_bytes=4, param_bytes=4, grad_bytes=4, optimizer_bytes=8)
FP8 = Precision(name="fp8", gemm_bytes=1)
"""Transformer Engine's FP8 recipe (Megatron's --fp8-format hybrid): the transformer layers' GEMMs take FP8 operands on
the FP8 tensor cores, each input cast (with its amax) from bf16 first; weights, activations, master weights and
optimizer states as bf16-mixed (TE's FP8 copies of weights and saved inputs are not counted apart)."""
PRECISIONS = {p.name: p for p in (FP16_MIXED, BF16_MIXED, FP32, FP8)}


@dataclass(frozen=True)
class Block:
    """One tensor-parallel unit: compute, then (when tp > 1) an all-reduce in forward and one in backward."""

    op: str
    """Operator family, part of the event key (``attention``, ``mlp``, ``conv2d``, ``custom`` ...)."""
    shape: tuple[tuple[str, int], ...] = ()
    """Dimensions that determine the block's cost besides micro-batch size, tp degree and dtype."""
    fwd_flops: float = 0.0
    """Forward FLOPs per sample of the whole (unsharded) block. Backward is taken as 2x forward."""
    params: int = 0
    """Parameters of the whole (unsharded) block."""
    io_bytes: float = 0.0
    """Activation bytes per sample read and written by the forward pass (for the roofline estimate)."""
    tp: TPSplit = "none"
    """``shard``: compute and params divide by tp; ``replicate``: every tp rank does it all; ``none``: tp must be 1."""
    tp_fwd_allreduce_bytes: float = 0.0
    """Bytes per sample all-reduced over the tp group after the forward (0: no collective)."""
    tp_bwd_allreduce_bytes: float = 0.0
    """Bytes per sample all-reduced over the tp group in backward (0: no collective)."""
    replicated_params: int = 0
    """Of ``params``, those every tp rank keeps whole when sharded (LayerNorms, a row-parallel bias, positions)."""
    fwd_s: float | None = None
    """Forward time per micro-batch given directly (what-if and hand-checkable cases); overrides any estimate."""
    bwd_s: float | None = None
    """Backward time per micro-batch given directly."""
    ops: tuple[Op, ...] = ()
    """The kernels of the forward pass (:mod:`distsim.core.models.ops`), for the analytic cost model; empty: the block
    is
    costed as one roofline of ``fwd_flops`` and ``io_bytes``. With ops, ``fwd_flops`` and ``io_bytes`` are their sums
    (filled in when given as 0)."""
    tensors: tuple[tuple[int, bool], ...] = ()
    """The parameter tensors in the module's registration order: (elements, whether tensor parallelism splits it);
    they sum to ``params``, the split ones to ``params - replicated_params``. Empty: one split tensor and one
    replicated one (what the sums say). Gradient buckets (DDP's) are cut at tensor boundaries."""

    def __post_init__(self) -> None:
        if self.tp not in ("shard", "replicate", "none"):
            raise ModelFileError(f"block {self.op!r}: tp must be shard, replicate or none, not {self.tp!r}")
        if not 0 <= self.replicated_params <= self.params:
            raise ModelFileError(f"block {self.op!r}: replicated_params must be between 0 and params")
        for name in ("fwd_flops", "params", "io_bytes", "tp_fwd_allreduce_bytes", "tp_bwd_allreduce_bytes", "fwd_s",
                     "bwd_s"):  # fmt: skip
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ModelFileError(f"block {self.op!r}: {name} must be a finite number >= 0, got {value!r}")
        if self.ops:
            self._fill_totals()
        if self.tensors:
            split = sum(n for n, is_split in self.tensors if is_split)
            if sum(n for n, _ in self.tensors) != self.params or split != self.params - self.replicated_params:
                raise ModelFileError(f"block {self.op!r}: its tensors do not add up to params and replicated_params")

    def shard_tensors(self, tp: int) -> tuple[float, ...]:
        """Elements of each parameter tensor one tp rank holds, in registration order."""
        split = self.tp == "shard" and tp > 1
        if self.tensors:
            return tuple(n / tp if split and is_split else float(n) for n, is_split in self.tensors)
        parts = (self.params - self.replicated_params) / (tp if split else 1), float(self.replicated_params)
        return tuple(x for x in parts if x > 0)

    def _fill_totals(self) -> None:
        """fwd_flops and io_bytes are the sums over the ops: filled in when 0, checked otherwise."""
        for name, total in zip(("fwd_flops", "io_bytes"), op_totals(self.ops), strict=True):
            given = getattr(self, name)
            if given == 0:
                object.__setattr__(self, name, total)
            elif not math.isclose(given, total, rel_tol=1e-9):
                raise ModelFileError(f"block {self.op!r}: {name} ({given:g}) is not the sum over its ops ({total:g})")

    @property
    def has_given_time(self) -> bool:
        return self.fwd_s is not None or self.bwd_s is not None

    def shard_params(self, tp: int) -> float:
        """Parameters one tp rank holds: the split part divided by tp plus the replicated part."""
        if self.tp != "shard":
            return float(self.params)
        return (self.params - self.replicated_params) / tp + self.replicated_params

    def shape_str(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.shape)


@dataclass(frozen=True)
class Layer:
    """A node of the model graph: blocks executed in order, with the activations it produces and keeps."""

    name: str
    blocks: tuple[Block, ...]
    out_bytes: float = 0.0
    """Bytes per sample of the layer's output (what a pipeline boundary after it carries)."""
    saved_bytes: float = 0.0
    """Bytes per sample kept for backward that every tp rank stores in full."""
    saved_sharded_bytes: float = 0.0
    """Bytes per sample kept for backward that are divided among the tp ranks."""
    saved_core_bytes: float = 0.0
    """Of ``saved_sharded_bytes``, the attention core's (QK^T, softmax, its dropout mask, attention over V: 5as^2 per
    sequence at 2-byte activations, Korthikanti et al. 2022 Sec. 4.1), which selective recomputation drops and
    rebuilds in backward (Sec. 5). 0: selective recomputation leaves the layer as it is."""
    saved_sp_bytes: float = 0.0
    """Of ``saved_bytes``, those sequence parallelism divides by tp (layer-norm inputs, dropout masks and the blocks'
    inputs, 10sbh of a transformer layer; Korthikanti et al. 2022 Sec. 4.2.2). A layer with such bytes has its input
    in the sequence-parallel region too, so the input full recomputation keeps divides by tp as well."""
    recomputable: bool = True
    """Whether full recomputation re-runs this layer and keeps only its input: Megatron-LM checkpoints its
    transformer layers, not the embedding or the LM head (False for those); any other layer (CNN, model files):
    True."""
    inputs: tuple[str, ...] | None = None
    """Names of the layers whose outputs this layer consumes; None means the previous layer (a chain)."""
    tied_to: str | None = None
    """Layer whose weights this one shares (an LM head tied to the embedding): stored once when both are on the
    same pipeline rank; a rank holding only this layer keeps its own copy (as Megatron-LM's last stage does)."""
    tied_params: int | None = None
    """Of ``params``, those shared with ``tied_to``; None: all of them (an LM head whose only weights are the
    embedding's). A torch module's final LayerNorm and tied LM head form one layer with some of its own."""

    def __post_init__(self) -> None:
        for name in ("out_bytes", "saved_bytes", "saved_sharded_bytes", "saved_core_bytes", "saved_sp_bytes"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ModelFileError(f"layer {self.name!r}: {name} must be a finite number >= 0, got {value!r}")
        if self.saved_core_bytes > self.saved_sharded_bytes:
            raise ModelFileError(f"layer {self.name!r}: saved_core_bytes must not exceed saved_sharded_bytes")
        if self.saved_sp_bytes > self.saved_bytes:
            raise ModelFileError(f"layer {self.name!r}: saved_sp_bytes must not exceed saved_bytes")
        if self.tied_params is not None and not 0 <= self.tied_params <= self.params:
            raise ModelFileError(f"layer {self.name!r}: tied_params must be between 0 and the layer's params")

    @property
    def params(self) -> int:
        return sum(b.params for b in self.blocks)

    @property
    def shared_params(self) -> int:
        """Parameters this layer shares with the layer it is tied to (0 when it is not tied)."""
        if self.tied_to is None:
            return 0
        return self.params if self.tied_params is None else self.tied_params

    def tied_shard_params(self, tp: int) -> float:
        """Of :meth:`shard_params`, those shared with ``tied_to`` (the gradients the tied copies all-reduce): split
        over tp like the layer's tensor-parallel part when they are exactly that part (an LM head's vocabulary
        matrix, without its final LayerNorm), else the same fraction of every shard."""
        if self.tied_to is None or not self.params:
            return 0.0
        shard = self.shard_params(tp)
        if self.tied_params is None:
            return shard
        split = sum(b.params - b.replicated_params for b in self.blocks if b.tp == "shard")
        if tp > 1 and split > 0 and self.tied_params == split:
            return self.tied_params / tp
        return shard * self.tied_params / self.params

    @property
    def fwd_flops(self) -> float:
        return sum(b.fwd_flops for b in self.blocks)

    def shard_params(self, tp: int) -> float:
        return sum(b.shard_params(tp) for b in self.blocks)

    def saved_bytes_per_sample(self, tp: int) -> float:
        return self.saved_bytes + self.saved_sharded_bytes / tp


@dataclass(frozen=True)
class Model:
    """A training workload: layers in topological order plus the facts strategy validation needs."""

    name: str
    layers: tuple[Layer, ...]
    seq_len: int | None = None
    """Tokens per sample (for tokens/s); None for non-sequence models."""
    tp_constraints: tuple[tuple[str, int], ...] = ()
    """Dimensions the tp degree must divide, e.g. (("attention heads", 16), ("ffn hidden", 4096))."""
    precision: Precision = FP16_MIXED
    pipeline_layers: int | None = None
    """Repeated (transformer) layers a pipeline degree should divide, as Megatron-LM requires of num_layers; None
    when the model has no such rule. The grid search skips pipeline degrees that do not divide it."""
    source: str = ""
    """Where the dimensions come from (paper, table)."""
    micro_batch_size: int | None = None
    """The only micro-batch size the model's costs hold for (a torch module profiled at its example batch); None:
    any. A strategy with another micro-batch size is refused."""
    description: str = ""
    _edges: tuple[tuple[int, int], ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.layers:
            raise ModelFileError(f"model {self.name!r} has no layers")
        index: dict[str, int] = {}
        edges: list[tuple[int, int]] = []
        for i, layer in enumerate(self.layers):
            if not layer.blocks:
                raise ModelFileError(f"model {self.name!r}: layer {layer.name!r} has no blocks")
            if layer.name in index:
                raise ModelFileError(f"model {self.name!r}: layer name {layer.name!r} is used twice")
            inputs = layer.inputs if layer.inputs is not None else ((self.layers[i - 1].name,) if i else ())
            for src in inputs:
                if src not in index:
                    later = any(x.name == src for x in self.layers)
                    why = "comes later (list layers in topological order)" if later else "is not a layer"
                    raise ModelFileError(f"model {self.name!r}: layer {layer.name!r} takes input {src!r}, which {why}")
                edges.append((index[src], i))
            index[layer.name] = i
        for layer in self.layers:
            if layer.tied_to is not None and layer.tied_to not in index:
                raise ModelFileError(
                    f"model {self.name!r}: layer {layer.name!r} is tied to unknown layer {layer.tied_to!r}"
                )
        object.__setattr__(self, "_edges", tuple(edges))

    # ----------------------------------------------------------------------------------------------- structure
    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def params(self) -> int:
        """Distinct parameters (a tied layer's weights are counted once)."""
        return sum(layer.params - layer.shared_params for layer in self.layers)

    @cached_property
    def input_layers(self) -> tuple[tuple[int, ...], ...]:
        """For each layer, the indices of the layers whose outputs it consumes (its in-edges of the DAG)."""
        out: list[list[int]] = [[] for _ in self.layers]
        for src, dst in self._edges:
            out[dst].append(src)
        return tuple(map(tuple, out))

    @cached_property
    def index(self) -> dict[str, int]:
        return {layer.name: i for i, layer in enumerate(self.layers)}

    def owns_params(self, i: int, on_rank: set[int] | range) -> bool:
        """Whether layer i's parameters are stored separately on a rank holding the layers `on_rank`."""
        tied = self.layers[i].tied_to
        return tied is None or self.index[tied] not in on_rank

    def stored_params(self, i: int, on_rank: set[int] | range, tp: int) -> float:
        """Parameters one tp shard of layer i stores on a rank holding the layers `on_rank` (a tied layer's shared
        weights only where its target is not held)."""
        layer = self.layers[i]
        shard = layer.shard_params(tp)
        return shard if self.owns_params(i, on_rank) else shard - layer.tied_shard_params(tp)

    def stored_tensors(self, i: int, on_rank: set[int] | range, tp: int) -> tuple[float, ...]:
        """:meth:`stored_params` per parameter tensor, in registration order: a tied layer whose target is held
        leaves out the shared tensor (or, when no tensor has exactly that size, scales them all down)."""
        tensors = tuple(x for b in self.layers[i].blocks for x in b.shard_tensors(tp))
        if self.owns_params(i, on_rank):
            return tensors
        shared = self.layers[i].tied_shard_params(tp)
        for k, n in enumerate(tensors):
            if math.isclose(n, shared, rel_tol=1e-12):
                return tensors[:k] + tensors[k + 1 :]
        total = sum(tensors)
        keep = (total - shared) / total if total else 0.0
        return tuple(n * keep for n in tensors if n * keep > 0)

    def rank_params(self, layer_indices: list[int], tp: int) -> float:
        """Parameters one tp shard of a pipeline rank holding these layers stores."""
        held = set(layer_indices)
        return sum(self.stored_params(i, held, tp) for i in held)

    @property
    def fwd_flops_per_sample(self) -> float:
        return sum(layer.fwd_flops for layer in self.layers)

    @cached_property
    def graph(self) -> nx.DiGraph:
        """The layer DAG (nodes are layer indices with a ``name`` attribute), as a networkx graph (imported here,
        when a graph is asked for: it takes a tenth of a second)."""
        import networkx as nx

        g = nx.DiGraph()
        for i, layer in enumerate(self.layers):
            g.add_node(i, name=layer.name)
        g.add_edges_from(self._edges)
        return g

    @cached_property
    def is_chain(self) -> bool:
        return all(src == dst - 1 for src, dst in self._edges) and len(self._edges) == len(self.layers) - 1

    @cached_property
    def boundary_bytes(self) -> tuple[float, ...]:
        """Bytes per sample crossing a cut after layer p, for p in 0..L-2 (all live tensors, skip connections too)."""
        n = len(self.layers)
        last_use = list(range(n))
        for src, dst in self._edges:
            last_use[src] = max(last_use[src], dst)
        # layer u is live across cut p (between p and p+1) iff u <= p < last_use[u]
        diff = [0.0] * (n + 1)
        for u, layer in enumerate(self.layers):
            if last_use[u] > u:
                diff[u] += layer.out_bytes
                diff[last_use[u]] -= layer.out_bytes
        out, running = [], 0.0
        for p in range(n - 1):
            running += diff[p]
            out.append(running)
        return tuple(out)

    def tp_problem(self, tp: int) -> str | None:
        """Why this model cannot use tensor-parallel degree tp, or None if it can."""
        if tp == 1:
            return None
        for name, value in self.tp_constraints:
            if value % tp:
                return f"tp={tp} does not divide the {name} ({value}) of {self.name}"
        for layer in self.layers:
            for block in layer.blocks:
                if block.tp == "none":
                    return (
                        f"layer {layer.name!r} of {self.name} has no tensor-parallel split "
                        f"(its {block.op} block cannot be sharded), so tp must be 1"
                    )
        return None

    def with_layers(self, layers: tuple[Layer, ...], **changes: object) -> Model:
        return replace(self, layers=layers, _edges=(), **changes)

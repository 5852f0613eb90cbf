"""Gradient synchronisation as a lowering pass: a registry of modes that turn a rank's gradients into the all-reduces
an iteration issues and the moment each becomes ready.

Both flow builders (:mod:`distsim.sim.flow.uniform`, :mod:`distsim.plans.stages_flow`) describe a data-parallel rank's
gradients as :class:`GradUnit` s, one per layer it holds, in the order their backward finishes (the last layer
first), call :func:`lower` with the strategy's mode, and emit what comes back: each :class:`Bucket` is one all-reduce,
issued right after the backward of its ``ready`` layer (in the last micro-batch) or, with ``ready`` None, after the
whole backward. This is how ``torch.distributed.pipelining`` adds gradient reduction to a schedule as a pass instead
of writing it into every builder.

Modes (:data:`MODES`; a new one is a class with :meth:`SyncMode.buckets` and :func:`register`):

* ``bulk``: one all-reduce of every gradient after backward (DistSim; SyncEASGD in MG-WFBP's terms).
* ``wfbp``: one all-reduce per layer as soon as its backward is done (wait-free backpropagation).
* ``ddp``: PyTorch DistributedDataParallel's buckets: parameter tensors in reverse registration order, a bucket
  closed once it holds ``bucket_cap_mb`` (the first one ``first_bucket_mb``: DDP's 1 MB), each all-reduced when its
  last gradient is ready.
* ``mgwfbp``: MG-WFBP's greedy merge of layers (Shi et al. 2019, Algorithm 1), from the all-reduce's latency and
  per-byte cost on the data-parallel group and the layers' backward times; ``mgwfbp-optimal`` the exact merge
  (:mod:`distsim.core.mgwfbp`); ``groups``: a merge plan given as layer groups (a plan file's).

A sharded optimizer (ZeRO, Rajbhandari et al. 2020; :data:`SHARDINGS`, the strategy's ``optimizer_sharding``)
composes with every mode as a second pass over the lowered buckets, :meth:`Sharding.apply`: the buckets stay what the
mode made them, and only what each becomes changes.

* ``zero1`` / ``zero2`` (Megatron-LM's distributed optimizer; DeepSpeed ZeRO stages 1 and 2): each bucket is
  reduce-scattered over the data-parallel group instead of all-reduced, each rank's optimizer step updates its 1/d of
  the parameters, and then each bucket's parameters are all-gathered, one all-gather per bucket in bucket order after
  the step (Megatron's per-bucket parameter all-gather without ``--overlap-param-gather``). The two stages differ in
  memory only (ZeRO-2 also frees the gradients outside the rank's shard), not in time.
* ``zero3`` (FSDP, ZeRO stage 3): reduce-scattered buckets and a 1/d step as well; the parameters are not gathered
  after the step but before each layer's forward and before its backward (the flow builders emit those, with FSDP's
  prefetch: :func:`distsim.sim.flow.comm.prefetch_gates`), and freed after use.

Without data parallelism (d = 1) nothing is synchronised and nothing is sharded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Protocol

MB = 1024 * 1024
"""DDP's bucket_cap_mb is in MiB (``bucket_cap_mb * 1024 * 1024`` bytes in torch/nn/parallel/distributed.py)."""
DDP_BUCKET_CAP_MB = 25.0
"""DistributedDataParallel's default ``bucket_cap_mb``."""
DDP_FIRST_BUCKET_MB = 1.0
"""DistributedDataParallel's first bucket (``dist._DEFAULT_FIRST_BUCKET_BYTES``, 1 MiB): small, so that the first
all-reduce starts early in backward."""


@dataclass(frozen=True)
class GradUnit:
    """One layer's gradients on a data-parallel rank."""

    layer: int
    tensors: tuple[int, ...]
    """Bytes of each parameter tensor's gradient, in the layer's parameter (registration) order."""
    backward_s: float = 0.0
    """The layer's backward time in its last micro-batch (planners weigh communication against it)."""
    chunk: int = 0
    """The model chunk (virtual stage) of the layer on its rank; merge planners never merge across chunks."""

    @property
    def nbytes(self) -> int:
        return sum(self.tensors)


@dataclass(frozen=True)
class Bucket:
    """One all-reduce: the gradient tensors it carries, as (layer, tensor index) in the order they become ready."""

    tensors: tuple[tuple[int, int], ...]
    nbytes: int
    ready: int | None
    """The layer whose backward completes the bucket; None: the bucket waits for the whole backward."""

    @property
    def layers(self) -> tuple[int, ...]:
        """Layers it carries gradients of, in backward order, each once."""
        return tuple(dict.fromkeys(layer for layer, _ in self.tensors))


@dataclass(frozen=True)
class SyncSettings:
    """What a mode may be told besides the gradients (the CLI's and plan files' options)."""

    bucket_cap_mb: float = DDP_BUCKET_CAP_MB
    first_bucket_mb: float = DDP_FIRST_BUCKET_MB
    groups: tuple[tuple[int, int], ...] = ()
    """For the mgwfbp modes: a merge plan's layer ranges [lo, hi), one all-reduce each; empty: planned."""

    @classmethod
    def of(cls, bucket_cap_mb: float, groups: tuple[tuple[int, int], ...] = ()) -> SyncSettings:
        """The settings of a strategy. As torch 2.13's DistributedDataParallel does, the first bucket is 1 MiB only
        at the default cap; a cap given explicitly applies to the first bucket too (``_BucketCapacityConfig``; a
        real DDP on gloo rebuilds four equal 0.5 MiB buckets at ``bucket_cap_mb=0.5``,
        tests/integration/test_grad_buckets.py)."""
        first = DDP_FIRST_BUCKET_MB if bucket_cap_mb == DDP_BUCKET_CAP_MB else bucket_cap_mb
        return cls(bucket_cap_mb=bucket_cap_mb, first_bucket_mb=first, groups=groups)


@dataclass(frozen=True)
class SyncContext:
    """A data-parallel rank's gradients and what communication costs on its group."""

    units: tuple[GradUnit, ...]
    """One per layer with gradients on the rank, in the order their backward finishes (the last layer first)."""
    allreduce_s: Callable[[int], float]
    """Seconds of one gradient collective of that many bytes over the rank's data-parallel group: an all-reduce, or
    a reduce-scatter under a sharded optimizer (planners weigh what the buckets will cost)."""
    fit: tuple[float, float] | None = None
    """(latency a, seconds per byte b) of that collective when the cost source has a fit (a profile's)."""
    settings: SyncSettings = field(default_factory=SyncSettings)


class SyncMode(Protocol):
    name: str
    summary: str
    planned: bool
    """Whether the buckets depend on costs (a planner's), not only on the gradients' sizes and order."""

    def buckets(self, ctx: SyncContext) -> tuple[Bucket, ...]:
        """The all-reduces of one iteration, in the order they are issued."""
        ...


MODES: dict[str, SyncMode] = {}


def register(mode: SyncMode) -> SyncMode:
    MODES[mode.name] = mode
    return mode


def mode_names() -> tuple[str, ...]:
    return tuple(MODES)


@dataclass(frozen=True)
class Lowered:
    """A rank's buckets, indexed the way a flow builder walks backward, and what a sharded optimizer makes of them."""

    buckets: tuple[Bucket, ...]
    collective: str = "all_reduce"
    """What each bucket's gradients go through: ``all_reduce``, or ``reduce_scatter`` (a sharded optimizer)."""
    gathers: tuple[Bucket, ...] = ()
    """Buckets whose parameters are all-gathered after the optimizer step (ZeRO-1/2), in this order."""

    @cached_property
    def by_layer(self) -> dict[int, tuple[Bucket, ...]]:
        """Buckets issued right after a layer's backward (in the last micro-batch), by that layer."""
        out: dict[int, list[Bucket]] = {}
        for b in self.buckets:
            if b.ready is not None:
                out.setdefault(b.ready, []).append(b)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def at_end(self) -> tuple[Bucket, ...]:
        """Buckets issued after the whole backward."""
        return tuple(b for b in self.buckets if b.ready is None)

    @cached_property
    def cuts(self) -> frozenset[int]:
        """Layers after whose backward the builder must stop to issue a bucket."""
        return frozenset(self.by_layer)


@dataclass(frozen=True)
class Sharding:
    """How the optimizer's state is split over the data-parallel group, as gradient synchronisation sees it."""

    name: str
    summary: str
    gradients: str = "all_reduce"
    """The collective of each gradient bucket: ``all_reduce``, or ``reduce_scatter`` (each rank keeps its 1/d)."""
    gather_after_step: bool = False
    """Each bucket's parameters are all-gathered after the optimizer step (every rank updated only its 1/d)."""
    gather_per_layer: bool = False
    """Each layer's parameters are all-gathered before its forward and before its backward (FSDP)."""

    @property
    def divides_step(self) -> bool:
        """Whether each rank's optimizer step updates only its 1/d of the parameters."""
        return self.gradients == "reduce_scatter"

    def apply(self, lowered: Lowered) -> Lowered:
        """The pass over a mode's buckets: the same buckets, through this sharding's collectives."""
        gathers = lowered.buckets if self.gather_after_step else ()
        return Lowered(lowered.buckets, self.gradients, gathers)


SHARDINGS: dict[str, Sharding] = {}


def register_sharding(sharding: Sharding) -> Sharding:
    SHARDINGS[sharding.name] = sharding
    return sharding


for _sharding in (
    Sharding("none", "every rank all-reduces the gradients and updates all parameters"),
    Sharding("zero1", "optimizer states sharded: gradients reduce-scattered, a 1/d step, parameters all-gathered "
             "after it (Megatron's distributed optimizer)", "reduce_scatter", gather_after_step=True),
    Sharding("zero2", "zero1 with the gradients sharded too (the same communication; less memory)", "reduce_scatter",
             gather_after_step=True),
    Sharding("zero3", "parameters sharded too: all-gathered before each layer's forward and backward (FSDP, with "
             "prefetch), gradients reduce-scattered, a 1/d step", "reduce_scatter", gather_per_layer=True),
):  # fmt: skip
    register_sharding(_sharding)


def lower(name: str, ctx: SyncContext, sharding: str = "none") -> Lowered:
    """The buckets of mode `name` for the rank's gradients (empty buckets left out), through `sharding`."""
    mode = MODES.get(name)
    if mode is None:
        raise ValueError(f"unknown gradient synchronisation {name!r}; choose from {', '.join(MODES)}")
    if sharding not in SHARDINGS:
        raise ValueError(f"unknown optimizer sharding {sharding!r}; choose from {', '.join(SHARDINGS)}")
    return SHARDINGS[sharding].apply(Lowered(tuple(b for b in mode.buckets(ctx) if b.nbytes > 0)))


def tensor_bytes(elements: Sequence[float], bytes_per_element: float) -> tuple[int, ...]:
    """Whole bytes per tensor that add up to the rounded total (cumulative rounding)."""
    out, done, total = [], 0, 0.0
    for n in elements:
        total += n * bytes_per_element
        out.append(round(total) - done)
        done = round(total)
    return tuple(out)


def _whole(units: Sequence[GradUnit], ready: int | None) -> Bucket:
    tensors = tuple((u.layer, i) for u in units for i in reversed(range(len(u.tensors))))
    return Bucket(tensors, sum(u.nbytes for u in units), ready)


@dataclass(frozen=True)
class Bulk:
    name: str = "bulk"
    summary: str = "one all-reduce of all gradients after backward (DistSim, SyncEASGD)"
    planned: bool = False

    def buckets(self, ctx: SyncContext) -> tuple[Bucket, ...]:
        return (_whole(ctx.units, None),) if ctx.units else ()


@dataclass(frozen=True)
class Wfbp:
    name: str = "wfbp"
    summary: str = "one all-reduce per layer as soon as its backward is done (wait-free backpropagation)"
    planned: bool = False

    def buckets(self, ctx: SyncContext) -> tuple[Bucket, ...]:
        return tuple(_whole([u], u.layer) for u in ctx.units)


def ddp_buckets(sizes: Sequence[int], cap_bytes: float, first_cap_bytes: float) -> list[list[int]]:
    """DDP's assignment (``dist._compute_bucket_assignment_by_size`` for one dtype and device): tensors in the given
    order (DDP passes parameters reversed) are added to the open bucket, which closes once its size reaches the
    limit: the first bucket's limit is `first_cap_bytes`, every later one's `cap_bytes`. Returns tensor indices."""
    out: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, n in enumerate(sizes):
        current.append(i)
        size += n
        if size >= (first_cap_bytes if not out else cap_bytes):
            out.append(current)
            current, size = [], 0
    if current:
        out.append(current)
    return out


@dataclass(frozen=True)
class Ddp:
    name: str = "ddp"
    summary: str = (
        "PyTorch DDP buckets of --bucket-cap-mb (the first 1 MiB at the default cap) in reverse parameter order"
    )
    planned: bool = False

    def buckets(self, ctx: SyncContext) -> tuple[Bucket, ...]:
        flat = [(u.layer, i, u.tensors[i]) for u in ctx.units for i in reversed(range(len(u.tensors)))]
        s = ctx.settings
        out = []
        for idx in ddp_buckets([n for _, _, n in flat], s.bucket_cap_mb * MB, s.first_bucket_mb * MB):
            tensors = tuple((flat[i][0], flat[i][1]) for i in idx)
            out.append(Bucket(tensors, sum(flat[i][2] for i in idx), tensors[-1][0]))
        return tuple(out)


def merged(units: Sequence[GradUnit], groups: Sequence[Sequence[GradUnit]]) -> tuple[Bucket, ...]:
    """One bucket per group of consecutive units (in backward order), ready when its last unit's backward is done."""
    return tuple(_whole(g, g[-1].layer) for g in groups if g)


def layer_groups(units: Sequence[GradUnit], ranges: Sequence[tuple[int, int]]) -> list[list[GradUnit]]:
    """The units grouped by layer ranges [lo, hi); every unit must fall in exactly one range, and a range's units
    must be consecutive in backward order."""
    where: dict[int, int] = {}
    for g, (lo, hi) in enumerate(ranges):
        for layer in range(lo, hi):
            if layer in where:
                raise ValueError(f"layer {layer} is in two gradient groups")
            where[layer] = g
    out: list[list[GradUnit]] = []
    last = -1
    for u in units:
        g = where.get(u.layer)
        if g is None:
            raise ValueError(f"layer {u.layer} has gradients but is in no gradient group")
        if g != last:
            if any(g == where[x[0].layer] for x in out):
                raise ValueError(f"gradient group {ranges[g][0]}-{ranges[g][1]} is not contiguous in backward order")
            out.append([])
            last = g
        out[-1].append(u)
    return out


def linear_cost(ctx: SyncContext) -> tuple[float, float]:
    """(a, b) of T(bytes) = a + b * bytes for the group's all-reduce: the cost source's fit where it has one (a
    profile's alpha-beta fit for this collective, scope and group size), else a least-squares line through the
    all-reduce's cost at the sizes merging can produce here (each layer's gradients and all of them)."""
    if ctx.fit is not None:
        return ctx.fit
    sizes = sorted({u.nbytes for u in ctx.units if u.nbytes > 0} | {sum(u.nbytes for u in ctx.units)})
    if not sizes or sizes == [0]:
        return (0.0, 0.0)
    times = [ctx.allreduce_s(n) for n in sizes]
    if len(sizes) == 1:
        return (0.0, times[0] / sizes[0])
    mx, mt = sum(sizes) / len(sizes), sum(times) / len(times)
    b = sum((x - mx) * (t - mt) for x, t in zip(sizes, times, strict=True)) / sum((x - mx) ** 2 for x in sizes)
    b = max(b, 0.0)
    return (max(mt - b * mx, 0.0), b)


@dataclass(frozen=True)
class MgWfbp:
    """MG-WFBP's merge: the layers grouped so that each all-reduce starts as soon as merging no longer pays. Layers
    are numbered from the input side, as in the paper; given ``settings.groups`` (a plan's) are used as they are."""

    name: str = "mgwfbp"
    summary: str = "MG-WFBP: layers merged by the paper's greedy (Algorithm 1) from the all-reduce's a + b*bytes"
    planned: bool = True
    exact: bool = False

    def buckets(self, ctx: SyncContext) -> tuple[Bucket, ...]:
        return merged(ctx.units, self.unit_groups(ctx))

    def unit_groups(self, ctx: SyncContext) -> list[list[GradUnit]]:
        """The rank's units in merge groups, in backward order: the given layer groups, else planned per chunk."""
        if ctx.settings.groups:
            held = {u.layer for u in ctx.units}
            ranges = [(lo, hi) for lo, hi in ctx.settings.groups if any(lo <= x < hi for x in held)]
            return layer_groups(ctx.units, ranges)
        out: list[list[GradUnit]] = []
        start = 0
        for end in range(1, len(ctx.units) + 1):
            if end == len(ctx.units) or ctx.units[end].chunk != ctx.units[start].chunk:
                out += self.plan(ctx, ctx.units[start:end])
                start = end
        return out

    def groups(self, ctx: SyncContext) -> list[tuple[int, int]]:
        """The merge plan as layer ranges [lo, hi), what a plan file records."""
        return [(min(u.layer for u in g), max(u.layer for u in g) + 1) for g in self.unit_groups(ctx)]

    def plan(self, ctx: SyncContext, units: Sequence[GradUnit]) -> list[list[GradUnit]]:
        """Merge groups of consecutive units (one chunk's, in backward order)."""
        from distsim.core import mgwfbp

        if not units:
            return []
        a, b = linear_cost(ctx)
        forward = tuple(reversed(units))  # index 0 = the input-side layer, as MG-WFBP numbers them
        problem = mgwfbp.MergeProblem(0.0, tuple(u.backward_s for u in forward),
                                      tuple(float(u.nbytes) for u in forward), a, b)  # fmt: skip
        found = mgwfbp.optimal(problem) if self.exact else mgwfbp.greedy(problem)
        n = len(units)
        return [[units[n - 1 - k] for k in range(hi - 1, lo - 1, -1)] for lo, hi in found.groups]


_EXACT = "MG-WFBP's merge, exact (dynamic programme over contiguous groups)"
for _mode in (Bulk(), Wfbp(), Ddp(), MgWfbp(), MgWfbp("mgwfbp-optimal", _EXACT, exact=True)):
    register(_mode)

"""The burst plan kind (DeepPool's burst parallelism): its checks, notation, file form, gradient sync and memory.

A burst plan (:class:`distsim.plans.plan.Plan` with ``burst``) gives every model layer, in model order, the GPUs it runs
on; it trains one batch of ``strategy.micro_batch_size`` samples per iteration (M = 1; DeepPool's strong scaling: the
batch is split over each layer's GPUs), re-distributes activations (and their gradients) between layers of different
layouts (:mod:`distsim.plans.redistribution`) and all-reduces each layer's gradients over its own GPUs, when the
gradient-sync mode's buckets say (:func:`distsim.plans.burst_flow.lower_sync`). Its flow is
:mod:`distsim.plans.burst_flow`, its executor :mod:`distsim.executor.burst`. In a plan file (read and written
through :mod:`distsim.plans.files`)::

    kind: burst
    model: vgg16
    cluster: dgx-a100
    nodes: 1
    batch: 32                # samples per iteration, split over each layer's GPUs
    grad_sync: bulk          # or wfbp
    counts: 1x3,8x10,1x8     # GxN: N consecutive layers on G GPUs each (GPUs 0..G-1); or a list [1, 1, 1, 8, ...]

or, to place layers on other GPUs (concurrent branches side by side), one entry per layer::

    layers:
      - 8                    # GPUs 0..7
      - {gpus: "0-3"}        # a device list: '0-3,6', [4, 5] or one id
      - {gpus: [4, 5, 6, 7]}

Pure: no torch, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from distsim.core.cluster import MAX_GPUS
from distsim.core.errors import DistsimError
from distsim.core.models.graph import MAX_LAYERS, Model
from distsim.core.strategy import Strategy
from distsim.plans.burst_flow import build_burst_flow, estimate_burst_tasks
from distsim.plans.kinds import register_plan_kind
from distsim.plans.plan import Plan, PlanError, check_batch, format_devices, parse_devices
from distsim.plans.redistribution import slice_bounds
from distsim.sim.memory import MemoryEstimate, layer_activations

if TYPE_CHECKING:
    from distsim.core.cluster import Cluster
    from distsim.sim.costs import CostSource
    from distsim.sim.flow.events import EventFlow, FlowOptions

GRAD_SYNCS = ("bulk", "wfbp")
"""How a burst plan synchronises each layer's gradients over its own GPUs: ``bulk``, every layer's all-reduce after
the whole backward (DeepPool's planner assumes no overlap); ``wfbp``, each right after that layer's backward,
overlapped with the rest of it."""

_UNUSED = (
    ("num_micro_batches", "micro_batches (a burst plan trains one batch per iteration)"),
    ("schedule", "a pipeline schedule"),
    ("warmup_policy", "a warm-up policy"),
    ("max_in_flight", "max_in_flight"),
    ("bucket_cap_mb", "bucket_cap_mb"),
    ("grad_groups", "gradient_groups"),
    ("recompute", "activation recomputation"),
    ("recompute_layers", "recompute_layers"),
    ("optimizer_sharding", "optimizer sharding"),
    ("tp", "tensor parallelism"),
    ("pp", "pipeline parallelism"),
    ("dp", "data parallelism (each layer's GPUs are its data parallelism)"),
    ("partition", "a partition"),
    ("virtual_stages", "virtual stages"),
    ("sequence_parallel", "sequence parallelism"),
)
"""Strategy fields a burst plan leaves at their defaults: (field, what it is)."""
_DEFAULTS = Strategy()


def check_burst_fields(plan: Plan) -> None:
    """A burst plan's own consistency (what needs neither model nor cluster); PlanError names the first problem."""
    for name, what in _UNUSED:
        if getattr(plan.strategy, name) != getattr(_DEFAULTS, name):
            raise PlanError(f"{what} does not apply to a burst plan")
    check_batch(plan.strategy.micro_batch_size)
    if plan.strategy.grad_sync not in GRAD_SYNCS:
        raise PlanError(f"a burst plan synchronises gradients {' or '.join(GRAD_SYNCS)}, not "
                        f"{plan.strategy.grad_sync!r}")  # fmt: skip
    if not plan.burst:
        raise PlanError("a burst plan gives the GPUs of every layer; its layout is empty")
    for i, devices in enumerate(plan.burst):
        if not isinstance(devices, tuple) or not devices:
            raise PlanError(f"layer {i} has no GPUs")
        if len(set(devices)) != len(devices):
            twice = next(g for g in devices if devices.count(g) > 1)
            raise PlanError(f"layer {i} lists GPU {twice} twice")
        if any(not isinstance(g, int) or isinstance(g, bool) or g < 0 for g in devices):
            raise PlanError(f"layer {i}: GPU ids must be integers >= 0, got {list(devices)}")


def check_burst(plan: Plan, num_layers: int, num_gpus: int) -> None:
    """A burst plan against the model's layers and the cluster's GPUs: one entry per layer, GPUs that exist, and
    at least one sample per GPU."""
    if len(plan.burst) != num_layers:
        raise PlanError(f"the burst plan gives GPUs for {len(plan.burst)} layers but the model has {num_layers}")
    batch = plan.strategy.micro_batch_size
    for i, devices in enumerate(plan.burst):
        outside = [g for g in devices if g >= num_gpus]
        if outside:
            raise PlanError(f"layer {i} uses GPU {outside[0]}, but the cluster has GPUs 0..{num_gpus - 1}")
        if len(devices) > batch:
            raise PlanError(f"layer {i} runs on {len(devices)} GPUs but the batch has only {batch} samples (each GPU "
                            "gets at least one sample); raise batch or use fewer GPUs")  # fmt: skip


def runs(counts: Sequence[int]) -> list[tuple[int, int]]:
    """(GPU count, layers) of each run of consecutive layers with the same count."""
    out: list[tuple[int, int]] = []
    for g in counts:
        if out and out[-1][0] == g:
            out[-1] = (g, out[-1][1] + 1)
        else:
            out.append((g, 1))
    return out


def format_counts(counts: Sequence[int]) -> str:
    """GPU counts per layer as runs: [1, 1, 1, 8, 8] -> '1x3,8x2'."""
    return ",".join(f"{g}x{n}" for g, n in runs(counts))


def burst_notation(layouts: Sequence[Sequence[int]]) -> str:
    """``burst 1x3,8x10,1x8``: 3 layers on 1 GPU, then 10 on 8, then 8 on 1."""
    return "burst " + format_counts([len(d) for d in layouts])


def describe_layouts(layouts: Sequence[Sequence[int]]) -> str:
    """Runs of consecutive layers on the same GPUs: ``layers 0-2 on GPU 0; layers 3-20 on GPUs 0-7``."""
    parts: list[tuple[int, int, tuple[int, ...]]] = []
    for i, devices in enumerate(layouts):
        if parts and parts[-1][2] == tuple(devices):
            parts[-1] = (parts[-1][0], i, parts[-1][2])
        else:
            parts.append((i, i, tuple(devices)))
    return "; ".join(f"layer{'s' if a < b else ''} {a}{f'-{b}' if a < b else ''} on GPU{'s' if len(d) > 1 else ''} "
                     f"{format_devices(d)}" for a, b, d in parts)  # fmt: skip


def parse_counts(value: object, where: str) -> list[int]:
    """GPU counts per layer: '1x3,8x10' (GxN: N layers on G GPUs; a bare G is one layer) or a list of counts."""
    if isinstance(value, list):
        if not all(isinstance(g, int) and not isinstance(g, bool) and g >= 1 for g in value) or not value:
            raise PlanError(f"{where}: counts must be positive GPU counts per layer, got {value!r}")
        out = list(value)
    elif isinstance(value, str):
        out = []
        for part in (p.strip() for p in value.split(",")):
            g, sep, n = part.partition("x")
            try:
                count, times = int(g), int(n) if sep else 1
            except ValueError:
                count = times = 0
            if count < 1 or times < 1:
                raise PlanError(f"{where}: cannot read counts part {part!r}; write GxN (N layers on G GPUs), e.g. "
                                "'1x3,8x10'")  # fmt: skip
            if count > MAX_GPUS or len(out) + times > MAX_LAYERS:
                raise PlanError(f"{where}: counts {part!r} is above the limits ({MAX_GPUS:,} GPUs, "
                                f"{MAX_LAYERS:,} layers)")  # fmt: skip
            out += [count] * times
    else:
        raise PlanError(f"{where}: counts must be a string like '1x3,8x10' or a list of GPU counts, got {value!r}")
    big = [g for g in out if g > MAX_GPUS]
    if big or len(out) > MAX_LAYERS:
        raise PlanError(f"{where}: counts above the limits ({MAX_GPUS:,} GPUs per layer, {MAX_LAYERS:,} layers)")
    return out


def _layer_devices(entry: object, where: str) -> tuple[int, ...]:
    """One entry of ``layers``: a GPU count (GPUs 0..g-1) or {gpus: devices}."""
    if isinstance(entry, int) and not isinstance(entry, bool):
        if not 1 <= entry <= MAX_GPUS:
            raise PlanError(f"{where}: a GPU count must be between 1 and {MAX_GPUS:,}, got {entry}")
        return tuple(range(entry))
    if isinstance(entry, dict) and set(entry) == {"gpus"}:
        return parse_devices(entry["gpus"], where)
    raise PlanError(f"{where}: expected a GPU count or {{gpus: '0-3'}}, got {entry!r}")


def burst_from_dict(data: dict[str, Any], where: str, common: dict[str, Any]) -> Plan:
    """The burst form of a plan file (see the module docstring); `common` holds model, cluster, nodes and note."""
    batch = data.get("batch")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise PlanError(f"{where}: a burst plan needs batch: the samples per iteration (a positive integer), got "
                        f"{batch!r}")  # fmt: skip
    check_batch(batch, f"{where}: batch")
    if ("counts" in data) == ("layers" in data):
        raise PlanError(f"{where}: a burst plan gives either counts ('1x3,8x10') or layers (one entry per layer)")
    if "counts" in data:
        layouts = [tuple(range(g)) for g in parse_counts(data["counts"], where)]
    else:
        raw = data["layers"]
        if not isinstance(raw, list) or not raw:
            raise PlanError(f"{where}: layers must be a non-empty list, one GPU count or {{gpus: ...}} per layer")
        if len(raw) > MAX_LAYERS:
            raise PlanError(f"{where}: {len(raw):,} layers is above the limit of {MAX_LAYERS:,}")
        layouts = [_layer_devices(entry, f"{where} layer {i}") for i, entry in enumerate(raw)]
    grad_sync = data.get("grad_sync", "bulk")
    if not isinstance(grad_sync, str):
        raise PlanError(f"{where}: grad_sync must be a string, got {grad_sync!r}")
    try:
        return Plan(strategy=_pipeline(batch, grad_sync), kind="burst", layout=tuple(layouts), **common)
    except DistsimError as exc:
        raise PlanError(f"{where}: {exc}") from None


def burst_to_dict(plan: Plan) -> dict[str, object]:
    """A burst plan's keys: ``counts`` when every layer runs on GPUs 0..g-1, else ``layers``."""
    out: dict[str, object] = {"batch": plan.strategy.micro_batch_size}
    if plan.strategy.grad_sync != "bulk":
        out["grad_sync"] = plan.strategy.grad_sync
    if all(d == tuple(range(len(d))) for d in plan.burst):
        out["counts"] = format_counts([len(d) for d in plan.burst])
    else:
        out["layers"] = [len(d) if d == tuple(range(len(d))) else {"gpus": format_devices(d)} for d in plan.burst]
    return out


def _pipeline(batch: int, grad_sync: str) -> Strategy:
    """A burst plan's schedule-level view: one stage, one batch of `batch` samples."""
    check_batch(batch)
    return Strategy(micro_batch_size=batch, grad_sync=grad_sync)


def burst_memory(model: Model, layouts: tuple[tuple[int, ...], ...], batch: int,
                 capacity_bytes: float) -> list[MemoryEstimate]:  # fmt: skip
    """One estimate per GPU of a burst plan (``rank`` = the GPU id): the training state of every layer the GPU runs
    (a tied pair on one GPU stored once) and the activations each of those layers keeps for the GPU's shard of the
    batch from its forward to its backward (one batch in flight, no recomputation or sharding). GPUs holding the same
    shard of every layer get the same figures, worked out once (data parallelism over 1,024 GPUs: once)."""
    index: dict[tuple[int, ...], int] = {}  # each distinct layout once (hashing a long tuple is slow)
    layout = [index.setdefault(devices, len(index)) for devices in layouts]
    gpus = np.asarray(sorted(set().union(*index)), dtype=np.int64)
    rows = np.zeros((len(index), len(gpus)), dtype=np.int64)  # samples each GPU holds under a layout (0: not there)
    for k, devices in enumerate(index):
        lo, hi = slice_bounds(batch, len(devices))
        rows[k, np.searchsorted(gpus, np.asarray(devices, dtype=np.int64))] = hi - lo
    samples = rows[layout]  # layer x GPU
    _, first, inverse = np.unique(samples, axis=1, return_index=True, return_inverse=True)
    p = model.precision
    stored: dict[int, float] = {}
    alike = []
    for column in first.tolist():
        held = {i: n for i, n in enumerate(samples[:, column].tolist()) if n}
        for i in held:
            if i not in stored:
                stored[i] = layer_activations(model, i, 1, False, "none").stored
        params = model.rank_params(sorted(held), 1)
        kept = sum(n * stored[i] for i, n in held.items())
        alike.append(dict(params_bytes=params * p.param_bytes, grads_bytes=params * p.grad_bytes,
                          optimizer_bytes=params * p.optimizer_bytes, activations_bytes=kept,
                          in_flight_microbatches=1, capacity_bytes=capacity_bytes,
                          unrecomputed_activations_bytes=kept,
                          unsharded_states_bytes=params * p.state_bytes_per_param))  # fmt: skip
    return [MemoryEstimate(rank=g, **alike[k]) for g, k in zip(gpus.tolist(), inverse.ravel().tolist(), strict=True)]


class BurstKind:
    name = "burst"
    marker_keys = frozenset({"batch", "counts", "layers"})
    file_keys = marker_keys | {"grad_sync"}

    memory_per_gpu = True
    symmetric_classes = True  # GPUs doing the same work are simulated once (distsim.plans.burst_classes)
    framework = "deeppool"  # burst parallelism is DeepPool's runtime (whole iterations replayed as CUDA graphs)

    def check_fields(self, plan: Plan) -> None:
        check_burst_fields(plan)

    def check(self, plan: Plan, num_layers: int, num_gpus: int) -> None:
        check_burst(plan, num_layers, num_gpus)

    def gpus(self, plan: Plan) -> tuple[int, ...]:
        return tuple(sorted(set().union(*dict.fromkeys(plan.burst))))  # layouts repeat: each distinct one once

    def notation(self, plan: Plan) -> str:
        return burst_notation(plan.burst)

    def detail(self, plan: Plan) -> str:
        s = plan.strategy
        return f"batch={s.micro_batch_size} grad_sync={s.grad_sync}: {describe_layouts(plan.burst)}"

    def summary(self, plan: Plan) -> str:
        s = plan.strategy
        return (f"{len(plan.burst)} layers on {plan.num_gpus} GPUs; one batch of {s.micro_batch_size} samples split "
                f"over each layer's GPUs; grad_sync {s.grad_sync}")  # fmt: skip

    def layout_line(self, plan: Plan) -> tuple[str, str] | None:
        return "GPUs per layer", describe_layouts(plan.burst)

    def to_dict(self, plan: Plan) -> dict[str, object]:
        return burst_to_dict(plan)

    def from_dict(self, data: dict[str, Any], where: str, common: dict[str, Any]) -> Plan:
        return burst_from_dict(data, where, common)

    def build_flow(
        self, model: Model, cluster: Cluster, plan: Plan, costs: CostSource, options: FlowOptions
    ) -> EventFlow:
        return build_burst_flow(model, cluster, plan, costs, options)

    def estimate_tasks(
        self, model: Model, cluster: Cluster, plan: Plan, costs: CostSource, options: FlowOptions
    ) -> int:
        return estimate_burst_tasks(model, cluster, plan, costs, options)

    def memory(self, model: Model, cluster: Cluster, plan: Plan, flow: EventFlow) -> list[MemoryEstimate]:
        return burst_memory(model, plan.burst, plan.strategy.micro_batch_size, cluster.gpu.memory_bytes)


BURST = register_plan_kind(BurstKind())


def burst_plan(
    model: Model | str, cluster: Cluster | str, counts: Sequence[int], batch: int, nodes: int | None = None, *,
    devices: Mapping[int, Sequence[int]] | None = None, grad_sync: str = "bulk", **note: object,
) -> Plan:  # fmt: skip
    """A burst plan (DeepPool) training one batch of `batch` samples: layer i (in model order) on GPUs
    0..counts[i]-1, or on ``devices[i]`` where given (concurrent branches placed side by side; its length must be
    counts[i]). Checked against the model and the cluster when they are given as objects (else when simulated);
    `nodes` defaults to a given cluster's node count."""
    devices = devices or {}
    layouts = []
    for i, g in enumerate(counts):
        own = tuple(int(x) for x in devices[i]) if i in devices else tuple(range(g))
        if len(own) != g:
            raise PlanError(f"layer {i}: {g} GPUs counted but devices {format_devices(own) or 'none'} given")
        layouts.append(own)
    if set(devices) - set(range(len(counts))):
        raise PlanError(f"devices given for layer {max(devices)}, but there are {len(counts)} counts")
    plan = Plan(
        model=model if isinstance(model, str) else model.name,
        cluster=cluster if isinstance(cluster, str) else cluster.name,
        nodes=nodes if nodes is not None or isinstance(cluster, str) else cluster.nodes,
        strategy=_pipeline(batch, grad_sync), kind="burst", layout=tuple(layouts), note=dict(note),
    )  # fmt: skip
    if not isinstance(model, str):
        plan.check(model.num_layers, MAX_GPUS if isinstance(cluster, str) else cluster.num_gpus)
    return plan

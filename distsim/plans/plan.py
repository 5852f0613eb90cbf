"""Plan: what a search driver hands the simulator (and a user hands ``distsim simulate --plan``).

A plan takes one of three forms (:data:`PLAN_KINDS`):

* **uniform**: a :class:`~distsim.core.strategy.Strategy` (tensor x pipeline x data degrees, schedule, micro-batches),
  placed on the cluster in Megatron-LM's rank order; what the grid search writes;
* **stages**: a list of pipeline stages, each with its own contiguous layer range and its own device list, so that
  stages may differ in layer count and in replication (DAPPLE's ``15:1`` plan: stage 0 on 15 GPUs, stage 1 on one).
  Each micro-batch of ``micro_batch_size`` samples is split over a stage's replicas (split-concat, DAPPLE Sec. V-B:
  replica i of r takes a contiguous slice of floor or ceil b/r samples); each stage all-reduces its gradients over
  its own replicas. No tensor parallelism in this form.
* **burst** (DeepPool's burst parallelism, :mod:`distsim.plans.burst_form`): every model layer (graph node, in model
  order) runs data-parallel on its own set of GPUs out of the pool. A burst plan trains one batch of
  ``micro_batch_size`` samples per iteration (M = 1; DeepPool's strong scaling: the global batch is fixed and split
  over each layer's GPUs), re-distributes activations (and their gradients) between layers of different layouts and
  all-reduces each layer's gradients over its own GPUs (``grad_sync`` bulk or wfbp).

The file form (YAML or JSON) is read and written by :mod:`distsim.io.files`; this module only validates values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from distsim.core.cluster import MAX_GPUS
from distsim.core.errors import DistsimError
from distsim.core.strategy import MAX_MICRO_BATCH_SIZE, Strategy
from distsim.core.sync import DDP_BUCKET_CAP_MB

if TYPE_CHECKING:
    from distsim.core.cluster import Cluster
    from distsim.core.models.graph import Model

PLAN_KINDS = ("uniform", "stages", "burst")


class PlanError(DistsimError, ValueError):
    """A plan that is malformed or does not fit its model and cluster."""


MAX_BATCH = MAX_MICRO_BATCH_SIZE
"""The most samples a burst plan's batch may hold (as a strategy's micro-batch: about a billion, far above any
training batch, and far below where the slice arithmetic's 64-bit integers and doubles stop being exact)."""


def check_batch(batch: int, what: str = "the batch") -> None:
    """Raise PlanError unless `batch` is an integer between 1 and :data:`MAX_BATCH`."""
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise PlanError(f"{what} must be a positive integer (samples per iteration), got {batch!r}")
    if batch > MAX_BATCH:
        raise PlanError(f"{what} is {batch:,} samples, above the limit of {MAX_BATCH:,}")


@dataclass(frozen=True)
class StagePlan:
    """One pipeline stage of a plan."""

    layers: tuple[int, int]
    """[start, end) indices of the model layers the stage holds."""
    devices: tuple[int, ...]
    """GPU ids of the stage's replicas (one replica per GPU)."""

    @property
    def replicas(self) -> int:
        return len(self.devices)

    @property
    def num_layers(self) -> int:
        return self.layers[1] - self.layers[0]


@dataclass(frozen=True)
class Plan:
    """A training plan for `model` on `cluster` (names or file paths as the CLI accepts them)."""

    model: str
    cluster: str
    nodes: int | None = None
    """The cluster's node count if it differs from the preset's; None keeps it."""
    strategy: Strategy | None = None
    """The uniform form; None for the stages form."""
    stages: tuple[StagePlan, ...] = ()
    """The stages form, in pipeline order; empty for the other forms."""
    burst: tuple[tuple[int, ...], ...] = ()
    """The burst form: per model layer (graph node, in model order) the GPU ids it runs on; empty for the others."""
    micro_batches: int = 1
    """Stages form: micro-batches per iteration (M)."""
    micro_batch_size: int = 1
    """Stages form: samples per micro-batch, split over each stage's replicas; global batch = M x this. Burst form:
    the batch (M = 1), split over each layer's GPUs."""
    schedule: str = "1f1b"
    """Stages form: gpipe or 1f1b (DAPPLE early backward)."""
    warmup_policy: str = "A"
    max_in_flight: int | None = None
    grad_sync: str = "bulk"
    bucket_cap_mb: float = DDP_BUCKET_CAP_MB
    """Stages form: DDP's bucket size in MiB (grad_sync ddp)."""
    grad_groups: tuple[tuple[int, int], ...] = ()
    """Stages form: a merge plan's layer ranges (grad_sync mgwfbp); empty: planned when simulated."""
    recompute: str = "none"
    """Stages form: activation recomputation, none, selective or full (:mod:`distsim.sim.flow.recompute`)."""
    recompute_layers: int | None = None
    """Stages form: recompute only the first N layers of each stage; None: all."""
    optimizer_sharding: str = "none"
    """Stages form: none, zero1, zero2 or zero3, over each stage's replicas (:mod:`distsim.core.sync`)."""
    note: dict[str, object] = field(default_factory=dict, compare=False)
    """Free-form provenance written by the driver that made the plan (its name, its own estimate)."""

    def __post_init__(self) -> None:
        if (self.strategy is not None) + bool(self.stages) + bool(self.burst) != 1:
            raise PlanError("a plan has a strategy, a list of stages or per-layer burst GPUs (exactly one of them)")
        if self.burst:
            from distsim.plans.burst_form import check_burst_fields

            check_burst_fields(self)
        if self.stages or self.burst:
            # validates M, b, schedule, policy and grad_sync with the strategy's own checks
            self.pipeline_strategy()

    # ------------------------------------------------------------------------------------------------ derived
    @property
    def kind(self) -> str:
        """One of :data:`PLAN_KINDS`."""
        return "uniform" if self.strategy is not None else "stages" if self.stages else "burst"

    @property
    def global_batch_size(self) -> int:
        if self.strategy is not None:
            return self.strategy.global_batch_size
        return self.micro_batches * self.micro_batch_size

    @property
    def num_gpus(self) -> int:
        if self.strategy is not None:
            return self.strategy.num_gpus
        if self.burst:
            return len(self.gpus)
        return sum(s.replicas for s in self.stages)

    @property
    def gpus(self) -> tuple[int, ...]:
        """The GPU ids a stages or burst plan uses, sorted (a uniform plan: 0..n-1)."""
        if self.strategy is not None:
            return tuple(range(self.strategy.num_gpus))
        layouts = self.burst or tuple(s.devices for s in self.stages)
        return tuple(sorted({g for devices in layouts for g in devices}))

    def pipeline_strategy(self) -> Strategy:
        """The schedule-level view of a stages plan: pp = stages, M micro-batches (replication aside); of a burst
        plan: one stage, one batch."""
        if self.strategy is not None:
            return self.strategy
        if self.burst:
            return Strategy(micro_batch_size=self.micro_batch_size, grad_sync=self.grad_sync)
        if self.schedule not in ("gpipe", "1f1b", "dapple"):
            raise PlanError(f"a stages plan runs gpipe or 1f1b, not {self.schedule!r}")
        return Strategy(
            pp=len(self.stages),
            micro_batch_size=self.micro_batch_size,
            num_micro_batches=self.micro_batches,
            schedule=self.schedule,
            warmup_policy=self.warmup_policy,
            max_in_flight=self.max_in_flight,
            grad_sync=self.grad_sync,
            bucket_cap_mb=self.bucket_cap_mb,
            grad_groups=self.grad_groups,
            recompute=self.recompute,
            recompute_layers=self.recompute_layers,
            optimizer_sharding=self.optimizer_sharding,
        )

    def notation(self) -> str:
        """DAPPLE's notation: ``DP``, ``straight`` or replicas per stage (``15:1``), and the split (``13:11``); a
        burst plan's GPUs per layer as runs, ``burst 1x3,8x10`` (3 layers on 1 GPU, then 10 on 8)."""
        if self.strategy is not None:
            return str(self.strategy)
        if self.burst:
            from distsim.plans.burst_form import burst_notation

            return burst_notation(self.burst)
        return stages_notation(self.stages)

    def detail(self) -> str:
        """One line: the strategy's readable form, or the plan's batch and layers per device set."""
        from distsim.plans.simulate import PLAN_SIMULATORS

        return self.strategy.describe() if self.strategy is not None else PLAN_SIMULATORS[self.kind].detail(self)

    def replica_samples(self, stage: int) -> list[tuple[int, int]]:
        """[lo, hi) sample slices of a micro-batch that each replica of a stage processes."""
        return split_samples(self.micro_batch_size, self.stages[stage].replicas)


def stages_notation(stages: tuple[StagePlan, ...]) -> str:
    """DAPPLE's notation of a list of stages: ``DP``, ``straight`` or replicas per stage, and the layer split."""
    if len(stages) == 1:
        return "DP"
    reps = "straight" if all(s.replicas == 1 for s in stages) else ":".join(str(s.replicas) for s in stages)
    return f"{reps} split {':'.join(str(s.num_layers) for s in stages)}"


def split_samples(b: int, r: int) -> list[tuple[int, int]]:
    """[lo, hi) slices of b samples over r replicas: contiguous, as even as possible, the larger slices first."""
    base, extra = divmod(b, r)
    out, lo = [], 0
    for i in range(r):
        n = base + (1 if i < extra else 0)
        out.append((lo, lo + n))
        lo += n
    return out


def check_plan(plan: Plan, num_layers: int, num_gpus: int) -> None:
    """Raise PlanError naming the first problem of a stages or burst plan against the model's layers and the
    cluster's GPUs."""
    if plan.strategy is not None:
        return
    if plan.burst:
        from distsim.plans.burst_form import check_burst

        check_burst(plan, num_layers, num_gpus)
        return
    expected = 0
    seen: dict[int, int] = {}
    for i, stage in enumerate(plan.stages):
        start, end = stage.layers
        if start != expected:
            where = "the model starts at layer 0" if i == 0 else f"stage {i - 1} ends at layer {expected}"
            raise PlanError(f"the stages' layers do not cover the model: stage {i} starts at layer {start} but {where}")
        if end <= start:
            raise PlanError(f"stage {i} has no layers: [{start}, {end})")
        expected = end
        if not stage.devices:
            raise PlanError(f"stage {i} has no devices")
        for g in stage.devices:
            if not 0 <= g < num_gpus:
                raise PlanError(f"stage {i} uses GPU {g}, but the cluster has GPUs 0..{num_gpus - 1}")
            if g in seen:
                other = seen[g]
                where = "twice" if other == i else f"in stage {other} and in stage {i}"
                raise PlanError(f"the stages' devices overlap: GPU {g} appears {where}")
            seen[g] = i
        if stage.replicas > plan.micro_batch_size:
            raise PlanError(
                f"stage {i} has {stage.replicas} replicas but a micro-batch has only {plan.micro_batch_size} "
                "samples to split among them; raise micro_batch_size"
            )
    if expected != num_layers:
        raise PlanError(
            f"the stages' layers do not cover the model: they end at layer {expected} but the model has {num_layers}"
        )


def plan_from_strategy(strategy: Strategy, model: str, cluster: str, nodes: int | None = None, **note: object) -> Plan:
    return Plan(model=model, cluster=cluster, nodes=nodes, strategy=strategy, note=dict(note))


# ------------------------------------------------------------------------------------------------- file form
_TOP_KEYS = {
    "model", "cluster", "nodes", "strategy", "stages", "micro_batches", "micro_batch_size", "schedule", "policy",
    "max_in_flight", "grad_sync", "bucket_cap_mb", "gradient_groups", "recompute", "recompute_layers",
    "optimizer_sharding", "note", "kind",
}  # fmt: skip
_BURST_KEYS = {"batch", "counts", "layers"}
"""Keys of the burst form only (:mod:`distsim.plans.burst_form`)."""


def plan_to_dict(plan: Plan) -> dict[str, object]:
    """The plan as the YAML/JSON mapping that :func:`plan_from_dict` reads back to an equal plan."""
    if plan.burst:
        from distsim.plans.burst_form import burst_to_dict

        return burst_to_dict(plan)
    out: dict[str, object] = {"model": plan.model, "cluster": plan.cluster}
    if plan.nodes is not None:
        out["nodes"] = plan.nodes
    if plan.strategy is not None:
        out["strategy"] = plan.strategy.describe()
    else:
        out["schedule"] = plan.schedule
        out["micro_batches"] = plan.micro_batches
        out["micro_batch_size"] = plan.micro_batch_size
        if plan.schedule == "1f1b" and plan.warmup_policy != "A":
            out["policy"] = plan.warmup_policy
        if plan.max_in_flight is not None:
            out["max_in_flight"] = plan.max_in_flight
        if plan.grad_sync != "bulk":
            out["grad_sync"] = plan.grad_sync
        if plan.bucket_cap_mb != DDP_BUCKET_CAP_MB:
            out["bucket_cap_mb"] = plan.bucket_cap_mb
        if plan.grad_groups:
            out["gradient_groups"] = [list(g) for g in plan.grad_groups]
        if plan.recompute != "none":
            out["recompute"] = plan.recompute
        if plan.recompute_layers is not None:
            out["recompute_layers"] = plan.recompute_layers
        if plan.optimizer_sharding != "none":
            out["optimizer_sharding"] = plan.optimizer_sharding
        out["stages"] = [{"layers": list(s.layers), "devices": format_devices(s.devices)} for s in plan.stages]
    if plan.note:
        out["note"] = dict(plan.note)
    return out


def format_devices(devices: tuple[int, ...]) -> str:
    """GPU ids as ranges: (0, 1, 2, 3, 7) -> '0-3,7'."""
    parts, i = [], 0
    while i < len(devices):
        j = i
        while j + 1 < len(devices) and devices[j + 1] == devices[j] + 1:
            j += 1
        parts.append(str(devices[i]) if i == j else f"{devices[i]}-{devices[j]}")
        i = j + 1
    return ",".join(parts)


def parse_devices(value: object, where: str) -> tuple[int, ...]:
    """A device list: [0, 1, 2], '0-3,7' or a single id."""
    if isinstance(value, bool):
        raise PlanError(f"{where}: devices must be GPU ids like [0, 1] or '0-7', got {value!r}")
    if isinstance(value, int):
        return (value,)
    if isinstance(value, list):
        if not all(isinstance(g, int) and not isinstance(g, bool) for g in value):
            raise PlanError(f"{where}: devices must be integer GPU ids, got {value!r}")
        return tuple(value)
    if isinstance(value, str):
        out: list[int] = []
        try:
            for part in filter(None, (p.strip() for p in value.split(","))):
                lo, sep, hi = part.partition("-")
                if sep:
                    a, b = int(lo), int(hi)
                    if b < a:
                        raise ValueError
                    if len(out) + b - a + 1 > MAX_GPUS:
                        raise PlanError(f"{where}: devices {value!r} name more than {MAX_GPUS:,} GPUs")
                    out += range(a, b + 1)
                else:
                    out.append(int(part))
        except PlanError:
            raise
        except ValueError:
            raise PlanError(f"{where}: cannot read devices {value!r}; write '0-7' or '0-3,8' or a list") from None
        return tuple(out)
    raise PlanError(f"{where}: devices must be GPU ids like [0, 1] or '0-7', got {value!r}")


def _int(data: dict[str, object], key: str, where: str, default: int | None) -> int | None:
    value = data.get(key, default)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PlanError(f"{where}: {key} must be a positive integer, got {value!r}")
    return value


def _number(data: dict[str, object], key: str, where: str, default: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < float("inf"):
        raise PlanError(f"{where}: {key} must be a positive number, got {value!r}")
    return float(value)


def _groups(value: object, where: str) -> tuple[tuple[int, int], ...]:
    """gradient_groups: a list of [start, end) layer ranges."""
    ok = isinstance(value, list) and all(
        isinstance(g, list) and len(g) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in g)
        for g in value
    )
    if not ok:
        raise PlanError(f"{where}: gradient_groups must be a list of [start, end] layer ranges, got {value!r}")
    return tuple((g[0], g[1]) for g in value)  # type: ignore[index, union-attr]


def plan_from_dict(data: object, where: str) -> Plan:
    """Read a plan mapping (see the module docstring); errors name the file and the key."""
    if not isinstance(data, dict):
        raise PlanError(f"{where}: a plan file is a mapping with model, cluster and strategy, stages or counts")
    unknown = sorted(set(data) - _TOP_KEYS - _BURST_KEYS)
    if unknown:
        allowed = ", ".join(sorted(_TOP_KEYS | _BURST_KEYS))
        raise PlanError(f"{where}: unknown key {unknown[0]!r}; allowed: {allowed}")
    for key in ("model", "cluster"):
        if not isinstance(data.get(key), str) or not data[key]:
            raise PlanError(f"{where}: needs {key}: a name or file path")
    note = data.get("note") or {}
    if not isinstance(note, dict):
        raise PlanError(f"{where}: note must be a mapping")
    common = {"model": data["model"], "cluster": data["cluster"], "nodes": _int(data, "nodes", where, None),
              "note": note}  # fmt: skip
    kind = data.get("kind")
    if kind is not None and kind not in PLAN_KINDS:
        raise PlanError(f"{where}: kind must be one of {', '.join(PLAN_KINDS)}, got {kind!r}")
    if kind == "burst" or (kind is None and set(data) & _BURST_KEYS):
        from distsim.plans.burst_form import burst_from_dict

        return burst_from_dict(data, where, common)
    burst_only = sorted(set(data) & _BURST_KEYS)
    if burst_only:
        raise PlanError(f"{where}: {burst_only[0]} belongs to a burst plan (kind: burst), not a {kind} plan")
    if ("strategy" in data) == ("stages" in data):
        raise PlanError(f"{where}: give either strategy (uniform degrees), stages (layer ranges and devices) or, with "
                        "kind: burst, counts or layers (GPUs per layer)")  # fmt: skip
    if kind is not None and kind != ("uniform" if "strategy" in data else "stages"):
        given = "strategy" if "strategy" in data else "stages"
        raise PlanError(f"{where}: kind {kind} does not match the plan's {given}")
    if "strategy" in data:
        extra = sorted(set(data) & {"micro_batches", "micro_batch_size", "schedule", "policy", "max_in_flight",
                                    "grad_sync", "bucket_cap_mb", "gradient_groups", "recompute", "recompute_layers",
                                    "optimizer_sharding"})  # fmt: skip
        if extra:
            raise PlanError(f"{where}: {extra[0]} belongs in the strategy string of a uniform plan")
        text = data["strategy"]
        if not isinstance(text, str):
            raise PlanError(f"{where}: strategy must be a string like 'tp=2 pp=4 dp=2 mbs=1 mb=8 schedule=1f1b'")
        try:
            strategy = Strategy.from_str(text)
        except DistsimError as exc:
            raise PlanError(f"{where}: {exc}") from None
        return Plan(strategy=strategy, **common)  # type: ignore[arg-type]
    raw = data["stages"]
    if not isinstance(raw, list) or not raw:
        raise PlanError(f"{where}: stages must be a non-empty list of {{layers: [start, end], devices: ...}}")
    stages = []
    for i, entry in enumerate(raw):
        here = f"{where} stage {i}"
        if not isinstance(entry, dict) or set(entry) != {"layers", "devices"}:
            raise PlanError(f"{here}: expected {{layers: [start, end], devices: [...]}}, got {entry!r}")
        layers = entry["layers"]
        if (not isinstance(layers, list) or len(layers) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in layers)):  # fmt: skip
            raise PlanError(f"{here}: layers must be [start, end) as two layer indices, got {layers!r}")
        stages.append(StagePlan((layers[0], layers[1]), parse_devices(entry["devices"], here)))
    schedule = data.get("schedule", "1f1b")
    policy = data.get("policy", "A")
    grad_sync = data.get("grad_sync", "bulk")
    recompute, sharding = data.get("recompute", "none"), data.get("optimizer_sharding", "none")
    for key, value in (("schedule", schedule), ("policy", policy), ("grad_sync", grad_sync), ("recompute", recompute),
                       ("optimizer_sharding", sharding)):  # fmt: skip
        if not isinstance(value, str):
            raise PlanError(f"{where}: {key} must be a string, got {value!r}")
    try:
        return Plan(
            stages=tuple(stages),
            micro_batches=_int(data, "micro_batches", where, 1),  # type: ignore[arg-type]
            micro_batch_size=_int(data, "micro_batch_size", where, 1),  # type: ignore[arg-type]
            schedule=str(schedule).lower(),
            warmup_policy=str(policy),
            max_in_flight=_int(data, "max_in_flight", where, None),
            grad_sync=str(grad_sync),
            bucket_cap_mb=_number(data, "bucket_cap_mb", where, DDP_BUCKET_CAP_MB),
            grad_groups=_groups(data.get("gradient_groups", []), where),
            recompute=str(recompute),
            recompute_layers=_int(data, "recompute_layers", where, None),
            optimizer_sharding=str(sharding),
            **common,  # type: ignore[arg-type]
        )
    except PlanError as exc:
        raise PlanError(f"{where}: {exc}") from None
    except DistsimError as exc:
        raise PlanError(f"{where}: {exc}") from None


def stages_plan(
    strategy: Strategy, cluster: Cluster, stage_ranges: tuple[tuple[int, int], ...], model: str, **note: object
) -> Plan:
    """A tp = 1, non-interleaved strategy as a stages plan: its partition, and its replicas placed on the GPUs
    Megatron-LM's rank order gives them."""
    from distsim.core.placement import Placement

    if strategy.tp != 1 or strategy.chunks != 1:
        raise PlanError(f"{strategy.describe()} has tensor parallelism or virtual stages; keep it a uniform plan")
    grid = Placement(strategy, cluster).grid
    stages = tuple(StagePlan(stage_ranges[r], tuple(int(g) for g in grid[r, :, 0])) for r in range(strategy.pp))
    return Plan(
        model=model, cluster=cluster.name, nodes=cluster.nodes, stages=stages,
        micro_batches=strategy.num_micro_batches, micro_batch_size=strategy.micro_batch_size * strategy.dp,
        schedule=strategy.schedule, warmup_policy=strategy.warmup_policy, max_in_flight=strategy.max_in_flight,
        grad_sync=strategy.grad_sync, bucket_cap_mb=strategy.bucket_cap_mb, grad_groups=strategy.grad_groups,
        recompute=strategy.recompute, recompute_layers=strategy.recompute_layers,
        optimizer_sharding=strategy.optimizer_sharding, note=dict(note),
    )  # fmt: skip


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
        burst=tuple(layouts), micro_batch_size=batch, grad_sync=grad_sync, note=dict(note),
    )  # fmt: skip
    if not isinstance(model, str):
        check_plan(plan, model.num_layers, MAX_GPUS if isinstance(cluster, str) else cluster.num_gpus)
    return plan

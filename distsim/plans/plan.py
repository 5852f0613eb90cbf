"""Plan: what a search driver hands the simulator (and a user hands ``distsim simulate --plan``).

A plan takes one of three forms (:data:`~distsim.plans.kinds.PLAN_KINDS`):

* **uniform**: a :class:`~distsim.core.strategy.Strategy` (tensor x pipeline x data degrees, schedule, micro-batches),
  placed on the cluster in Megatron-LM's rank order; what the grid search writes;
* **stages**: a list of pipeline stages, each with its own contiguous layer range and its own device list, so that
  stages may differ in layer count and in replication (DAPPLE's ``15:1`` plan: stage 0 on 15 GPUs, stage 1 on one).
  Each micro-batch of ``micro_batch_size`` samples is split over a stage's replicas (split-concat, DAPPLE Sec. V-B:
  replica i of r takes a contiguous slice of floor or ceil b/r samples); each stage all-reduces its gradients over
  its own replicas. No tensor parallelism in this form.
* **burst** (DeepPool's burst parallelism, :mod:`distsim.plans.burst`): every model layer (graph node, in model
  order) runs data-parallel on its own set of GPUs out of the pool. A burst plan trains one batch of
  ``micro_batch_size`` samples per iteration (M = 1; DeepPool's strong scaling: the global batch is fixed and split
  over each layer's GPUs), re-distributes activations (and their gradients) between layers of different layouts and
  all-reduces each layer's gradients over its own GPUs (``grad_sync`` bulk or wfbp).

Each kind is a :class:`~distsim.plans.kinds.PlanKind` in a registry (:mod:`distsim.plans.uniform`,
:mod:`distsim.plans.stages`, :mod:`distsim.plans.burst`): its checks, notation, file form, flow and memory. This module
holds the value and what every kind shares; the file form is :mod:`distsim.plans.files`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from distsim.core.cluster import MAX_GPUS
from distsim.core.errors import DistsimError
from distsim.core.strategy import MAX_MICRO_BATCH_SIZE, Strategy
from distsim.plans.kinds import PLAN_KINDS, PlanKind, plan_kind

STAGES_SCHEDULES = ("gpipe", "1f1b", "dapple")
"""The schedules a stages plan runs (dapple is 1f1b)."""


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
    """A training plan for `model` on `cluster` (names or file paths as the CLI accepts them).

    `strategy` is the plan's pipeline: a uniform plan's whole strategy; a stages plan's schedule-level view (pp =
    stages, tp = dp = 1: micro-batches, samples per micro-batch split over each stage's replicas, schedule, gradient
    sync, recomputation, sharding); a burst plan's one stage and one batch (``micro_batch_size`` samples, its
    ``grad_sync``). `kind` names a registered :class:`~distsim.plans.kinds.PlanKind`, which checks and reads
    `layout`, the kind's own placement of the model (empty for a uniform plan).
    """

    model: str
    cluster: str
    nodes: int | None = None
    """The cluster's node count if it differs from the preset's; None keeps it."""
    strategy: Strategy = field(default_factory=Strategy)
    kind: str = "uniform"
    """A name in :data:`~distsim.plans.kinds.PLAN_KINDS`."""
    layout: tuple[Any, ...] = ()
    """The kind's placement: stages, the :class:`StagePlan` of each stage in pipeline order; burst, per model layer
    (graph node, in model order) the GPU ids it runs on; uniform, empty (Megatron-LM's rank order)."""
    note: dict[str, object] = field(default_factory=dict, compare=False)
    """Free-form provenance written by the driver that made the plan (its name, its own estimate)."""

    def __post_init__(self) -> None:
        if self.kind not in PLAN_KINDS:
            raise PlanError(f"unknown plan kind {self.kind!r}; choose one of {', '.join(PLAN_KINDS)}")
        if not isinstance(self.strategy, Strategy):
            raise PlanError(f"a plan's strategy must be a Strategy, got {self.strategy!r}")
        object.__setattr__(self, "layout", tuple(self.layout))
        self._kind.check_fields(self)

    @classmethod
    def of_stages(
        cls, model: str, cluster: str, stages: Sequence[StagePlan], *, nodes: int | None = None,
        note: dict[str, object] | None = None, **pipeline: object,
    ) -> Plan:  # fmt: skip
        """A stages plan whose pipeline has the given Strategy fields (``num_micro_batches``, ``micro_batch_size``,
        ``schedule``, ``grad_sync``, ``recompute``...) and pp = the number of stages."""
        schedule = str(pipeline.get("schedule", "1f1b")).lower()
        if schedule not in STAGES_SCHEDULES:
            raise PlanError(f"a stages plan runs gpipe or 1f1b, not {pipeline['schedule']!r}")
        strategy = Strategy(pp=len(stages) or 1, **pipeline)  # type: ignore[arg-type]
        return cls(model, cluster, nodes, strategy, "stages", tuple(stages), note=dict(note or {}))

    # ------------------------------------------------------------------------------------------------ derived
    @property
    def stages(self) -> tuple[StagePlan, ...]:
        """A stages plan's stages, in pipeline order; empty for the other kinds."""
        return self.layout if self.kind == "stages" else ()

    @property
    def burst(self) -> tuple[tuple[int, ...], ...]:
        """A burst plan's GPU ids per model layer; empty for the other kinds."""
        return self.layout if self.kind == "burst" else ()

    @property
    def _kind(self) -> PlanKind:
        return plan_kind(self.kind)

    @property
    def global_batch_size(self) -> int:
        return self.strategy.global_batch_size

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)

    @property
    def gpus(self) -> tuple[int, ...]:
        """The GPU ids the plan uses, sorted (a uniform plan: 0..n-1)."""
        return self._kind.gpus(self)

    def notation(self) -> str:
        """The strategy (``2M4P2D``); DAPPLE's notation of stages, ``DP``, ``straight`` or replicas per stage
        (``15:1``) and the split (``13:11``); a burst plan's GPUs per layer as runs, ``burst 1x3,8x10``."""
        return self._kind.notation(self)

    def detail(self) -> str:
        """One line: the strategy's readable form, or the plan's batch and layers per device set."""
        return self._kind.detail(self)

    def check(self, num_layers: int, num_gpus: int) -> None:
        """Raise PlanError naming the first problem of the plan against the model's layers and the cluster's GPUs."""
        self._kind.check(self, num_layers, num_gpus)

    def replica_samples(self, stage: int) -> list[tuple[int, int]]:
        """[lo, hi) sample slices of a micro-batch that each replica of a stage processes."""
        return split_samples(self.strategy.micro_batch_size, self.stages[stage].replicas)


def split_samples(b: int, r: int) -> list[tuple[int, int]]:
    """[lo, hi) slices of b samples over r replicas: contiguous, as even as possible, the larger slices first."""
    base, extra = divmod(b, r)
    out, lo = [], 0
    for i in range(r):
        n = base + (1 if i < extra else 0)
        out.append((lo, lo + n))
        lo += n
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


def check_plan(plan: Plan, num_layers: int, num_gpus: int) -> None:
    """Raise PlanError naming the first problem of a plan against the model's layers and the cluster's GPUs."""
    plan.check(num_layers, num_gpus)

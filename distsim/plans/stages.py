"""The stages plan kind (DAPPLE): pipeline stages, each with its own contiguous layer range and its own devices, so
that stages may differ in layer count and in replication (DAPPLE's ``15:1`` plan: stage 0 on 15 GPUs, stage 1 on
one). Each micro-batch is split over a stage's replicas (split-concat, DAPPLE Sec. V-B); each stage all-reduces its
gradients over its own replicas. The plan's strategy is its pipeline (pp = stages, tp = dp = 1). Its flow is
:mod:`distsim.plans.stages_flow`; execution is the uniform executor's (a stages plan equal to a strategy). In a plan
file::

    model: gpt2-345m
    cluster: distsim-testbed
    micro_batches: 8
    micro_batch_size: 4          # split over each stage's replicas
    schedule: 1f1b               # or gpipe; policy, max_in_flight, grad_sync, recompute, ... as a strategy's
    stages:
      - {layers: [0, 13], devices: 0-2}
      - {layers: [13, 26], devices: [3]}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from distsim.core.errors import DistsimError
from distsim.core.placement import Placement
from distsim.core.strategy import Strategy
from distsim.core.sync import DDP_BUCKET_CAP_MB
from distsim.plans.files import layer_ranges, positive_int, positive_number
from distsim.plans.kinds import register_plan_kind
from distsim.plans.plan import STAGES_SCHEDULES, Plan, PlanError, StagePlan, format_devices, parse_devices
from distsim.plans.stages_flow import build_plan_flow, estimate_plan_tasks
from distsim.plans.uniform import PIPELINE_KEYS
from distsim.sim.memory import MemoryEstimate, estimate_memory

if TYPE_CHECKING:
    from distsim.core.cluster import Cluster
    from distsim.core.models.graph import Model
    from distsim.sim.costs import CostSource
    from distsim.sim.flow.events import EventFlow, FlowOptions


def stages_notation(stages: tuple[StagePlan, ...]) -> str:
    """DAPPLE's notation of a list of stages: ``DP``, ``straight`` or replicas per stage, and the layer split."""
    if len(stages) == 1:
        return "DP"
    reps = "straight" if all(s.replicas == 1 for s in stages) else ":".join(str(s.replicas) for s in stages)
    return f"{reps} split {':'.join(str(s.num_layers) for s in stages)}"


class StagesKind:
    name = "stages"
    marker_keys = frozenset({"stages"})
    file_keys = marker_keys | PIPELINE_KEYS

    memory_per_gpu = False
    framework = None

    def check_fields(self, plan: Plan) -> None:
        if not plan.layout or not all(isinstance(st, StagePlan) for st in plan.layout):
            raise PlanError(f"a stages plan's layout is a non-empty list of StagePlan, got {plan.layout!r}")
        s = plan.strategy
        if s.schedule not in STAGES_SCHEDULES:
            raise PlanError(f"a stages plan runs gpipe or 1f1b, not {s.schedule!r}")
        if (s.tp, s.dp, s.pp) != (1, 1, len(plan.stages)) or s.chunks != 1 or s.partition is not None:
            raise PlanError(f"a stages plan's strategy is its pipeline: pp = {len(plan.stages)} stages, no tensor or "
                            f"data parallelism, virtual stages or partition; got {s.describe()}")  # fmt: skip

    def check(self, plan: Plan, num_layers: int, num_gpus: int) -> None:
        expected = 0
        seen: dict[int, int] = {}
        for i, stage in enumerate(plan.stages):
            start, end = stage.layers
            if start != expected:
                where = "the model starts at layer 0" if i == 0 else f"stage {i - 1} ends at layer {expected}"
                raise PlanError(f"the stages' layers do not cover the model: stage {i} starts at layer {start} but "
                                f"{where}")  # fmt: skip
            if end <= start:
                raise PlanError(f"stage {i} has no layers: [{start}, {end})")
            expected = end
            self._check_devices(i, stage, seen, num_gpus)
            if stage.replicas > plan.strategy.micro_batch_size:
                raise PlanError(
                    f"stage {i} has {stage.replicas} replicas but a micro-batch has only "
                    f"{plan.strategy.micro_batch_size} samples to split among them; raise micro_batch_size"
                )
        if expected != num_layers:
            raise PlanError(f"the stages' layers do not cover the model: they end at layer {expected} but the model "
                            f"has {num_layers}")  # fmt: skip

    @staticmethod
    def _check_devices(i: int, stage: StagePlan, seen: dict[int, int], num_gpus: int) -> None:
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

    def gpus(self, plan: Plan) -> tuple[int, ...]:
        return tuple(sorted({g for s in plan.stages for g in s.devices}))

    def notation(self, plan: Plan) -> str:
        return stages_notation(plan.stages)

    def detail(self, plan: Plan) -> str:
        s = plan.strategy
        stages = "; ".join(f"layers {a}-{b - 1} on {len(st.devices)} GPU(s)" for st in plan.stages
                           for a, b in [st.layers])  # fmt: skip
        return f"mbs={s.micro_batch_size} mb={s.num_micro_batches} schedule={s.schedule}: {stages}"

    def summary(self, plan: Plan) -> str:
        s = plan.strategy
        return (f"{len(plan.stages)} stages on {plan.num_gpus} GPUs; {s.num_micro_batches} micro-batches of "
                f"{s.micro_batch_size} samples split over each stage's replicas; {s.schedule}")  # fmt: skip

    def layout_line(self, plan: Plan) -> tuple[str, str] | None:
        return None

    def to_dict(self, plan: Plan) -> dict[str, object]:
        s = plan.strategy
        out: dict[str, object] = {"schedule": s.schedule, "micro_batches": s.num_micro_batches,
                                  "micro_batch_size": s.micro_batch_size}  # fmt: skip
        if s.schedule == "1f1b" and s.warmup_policy != "A":
            out["policy"] = s.warmup_policy
        optional = (("max_in_flight", s.max_in_flight, None), ("grad_sync", s.grad_sync, "bulk"),
                    ("bucket_cap_mb", s.bucket_cap_mb, DDP_BUCKET_CAP_MB),
                    ("gradient_groups", [list(g) for g in s.grad_groups], []), ("recompute", s.recompute, "none"),
                    ("recompute_layers", s.recompute_layers, None),
                    ("optimizer_sharding", s.optimizer_sharding, "none"))  # fmt: skip
        out |= {key: value for key, value, default in optional if value != default}
        out["stages"] = [{"layers": list(st.layers), "devices": format_devices(st.devices)} for st in plan.stages]
        return out

    def from_dict(self, data: dict[str, Any], where: str, common: dict[str, Any]) -> Plan:
        stages = _read_stages(data["stages"], where)
        text = {key: data.get(key, default) for key, default in (("schedule", "1f1b"), ("policy", "A"),
                ("grad_sync", "bulk"), ("recompute", "none"), ("optimizer_sharding", "none"))}  # fmt: skip
        for key, value in text.items():
            if not isinstance(value, str):
                raise PlanError(f"{where}: {key} must be a string, got {value!r}")
        try:
            return Plan.of_stages(
                stages=stages,
                num_micro_batches=positive_int(data, "micro_batches", where, 1),
                micro_batch_size=positive_int(data, "micro_batch_size", where, 1),
                schedule=text["schedule"].lower(),
                warmup_policy=text["policy"],
                max_in_flight=positive_int(data, "max_in_flight", where, None),
                grad_sync=text["grad_sync"],
                bucket_cap_mb=positive_number(data, "bucket_cap_mb", where, DDP_BUCKET_CAP_MB),
                grad_groups=layer_ranges(data.get("gradient_groups", []), where),
                recompute=text["recompute"],
                recompute_layers=positive_int(data, "recompute_layers", where, None),
                optimizer_sharding=text["optimizer_sharding"],
                **common,
            )
        except DistsimError as exc:
            raise PlanError(f"{where}: {exc}") from None

    def build_flow(
        self, model: Model, cluster: Cluster, plan: Plan, costs: CostSource, options: FlowOptions
    ) -> EventFlow:
        return build_plan_flow(model, cluster, plan, costs, options)

    def estimate_tasks(
        self, model: Model, cluster: Cluster, plan: Plan, costs: CostSource, options: FlowOptions
    ) -> int:
        return estimate_plan_tasks(model, cluster, plan, costs, options)

    def memory(self, model: Model, cluster: Cluster, plan: Plan, flow: EventFlow) -> list[MemoryEstimate]:
        samples = [max(hi - lo for lo, hi in plan.replica_samples(s)) for s in range(len(plan.stages))]
        return estimate_memory(model, flow.strategy, flow.schedule, flow.stage_ranges, cluster.gpu.memory_bytes,
                               samples)  # fmt: skip


STAGES = register_plan_kind(StagesKind())


def _read_stages(raw: object, where: str) -> list[StagePlan]:
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
    return stages


def stages_plan(
    strategy: Strategy, cluster: Cluster, stage_ranges: tuple[tuple[int, int], ...], model: str, **note: object
) -> Plan:
    """A tp = 1, non-interleaved strategy as a stages plan: its partition, and its replicas placed on the GPUs
    Megatron-LM's rank order gives them."""
    if strategy.tp != 1 or strategy.chunks != 1:
        raise PlanError(f"{strategy.describe()} has tensor parallelism or virtual stages; keep it a uniform plan")
    grid = Placement(strategy, cluster).grid
    stages = tuple(StagePlan(stage_ranges[r], tuple(int(g) for g in grid[r, :, 0])) for r in range(strategy.pp))
    s = strategy
    return Plan.of_stages(
        model, cluster.name, stages, nodes=cluster.nodes, note=dict(note), num_micro_batches=s.num_micro_batches,
        micro_batch_size=s.micro_batch_size * s.dp, schedule=s.schedule, warmup_policy=s.warmup_policy,
        max_in_flight=s.max_in_flight, grad_sync=s.grad_sync, bucket_cap_mb=s.bucket_cap_mb,
        grad_groups=s.grad_groups, recompute=s.recompute, recompute_layers=s.recompute_layers,
        optimizer_sharding=s.optimizer_sharding,
    )  # fmt: skip

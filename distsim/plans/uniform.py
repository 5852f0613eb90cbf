"""The uniform plan kind: a :class:`~distsim.core.strategy.Strategy` placed in Megatron-LM's rank order, what the
grid search writes. Its flow is :mod:`distsim.sim.flow.uniform`'s (symmetric when it can be), its executor
:mod:`distsim.executor.runtime`. In a plan file::

    model: gpt2-345m
    cluster: distsim-testbed
    strategy: tp=2 pp=4 dp=2 mbs=1 mb=8 schedule=1f1b
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from distsim.core.errors import DistsimError
from distsim.core.strategy import Strategy
from distsim.plans.kinds import register_plan_kind
from distsim.plans.plan import Plan, PlanError
from distsim.sim.flow.estimate import estimate_tasks
from distsim.sim.flow.uniform import build_flow
from distsim.sim.memory import MemoryEstimate, estimate_memory

if TYPE_CHECKING:
    from distsim.core.cluster import Cluster
    from distsim.core.models.graph import Model
    from distsim.sim.costs import CostSource
    from distsim.sim.flow.events import EventFlow, FlowOptions

PIPELINE_KEYS = frozenset(
    {
        "micro_batches",
        "micro_batch_size",
        "schedule",
        "policy",
        "max_in_flight",
        "grad_sync",
        "bucket_cap_mb",
        "gradient_groups",
        "recompute",
        "recompute_layers",
        "optimizer_sharding",
    }
)
"""A stages plan's pipeline keys: a uniform plan states them in its strategy string."""  # fmt: skip


class UniformKind:
    name = "uniform"
    marker_keys = frozenset({"strategy"})
    file_keys = marker_keys | PIPELINE_KEYS  # the pipeline keys are refused with a hint, below

    memory_per_gpu = False
    framework = None

    def check_fields(self, plan: Plan) -> None:
        if plan.layout:
            raise PlanError("a uniform plan is placed in Megatron-LM's rank order: it has no layout")

    def check(self, plan: Plan, num_layers: int, num_gpus: int) -> None:
        return None  # the strategy is checked against the model and cluster when its flow is built

    def gpus(self, plan: Plan) -> tuple[int, ...]:
        return tuple(range(plan.strategy.num_gpus))

    def notation(self, plan: Plan) -> str:
        return str(plan.strategy)

    def detail(self, plan: Plan) -> str:
        return plan.strategy.describe()

    def summary(self, plan: Plan) -> str:
        return plan.strategy.describe()

    def layout_line(self, plan: Plan) -> tuple[str, str] | None:
        return None

    def to_dict(self, plan: Plan) -> dict[str, object]:
        return {"strategy": plan.strategy.describe()}

    def from_dict(self, data: dict[str, Any], where: str, common: dict[str, Any]) -> Plan:
        extra = sorted(set(data) & PIPELINE_KEYS)
        if extra:
            raise PlanError(f"{where}: {extra[0]} belongs in the strategy string of a uniform plan")
        text = data["strategy"]
        if not isinstance(text, str):
            raise PlanError(f"{where}: strategy must be a string like 'tp=2 pp=4 dp=2 mbs=1 mb=8 schedule=1f1b'")
        try:
            strategy = Strategy.from_str(text)
        except DistsimError as exc:
            raise PlanError(f"{where}: {exc}") from None
        return Plan(strategy=strategy, **common)

    def build_flow(
        self, model: Model, cluster: Cluster, plan: Plan, costs: CostSource, options: FlowOptions
    ) -> EventFlow:
        return build_flow(model, cluster, plan.strategy, costs, options)

    def estimate_tasks(
        self, model: Model, cluster: Cluster, plan: Plan, costs: CostSource, options: FlowOptions
    ) -> int:
        return estimate_tasks(model, cluster, plan.strategy, costs, options)

    def memory(self, model: Model, cluster: Cluster, plan: Plan, flow: EventFlow) -> list[MemoryEstimate]:
        return estimate_memory(model, flow.strategy, flow.schedule, flow.stage_ranges, cluster.gpu.memory_bytes)


UNIFORM = register_plan_kind(UniformKind())


def plan_from_strategy(strategy: Strategy, model: str, cluster: str, nodes: int | None = None, **note: object) -> Plan:
    return Plan(model=model, cluster=cluster, nodes=nodes, strategy=strategy, note=dict(note))

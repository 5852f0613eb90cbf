"""Event discovery: the distinct events a set of strategies needs, against how many events they contain.

DistSim's saving (Sec. 3.1, Table 3): identical layers, micro-batches, replicas and tensor-parallel ranks share an
event, so a handful of measurements covers a thousand-GPU run. ``discover`` builds each strategy's event flow with a
cost source that records every event it is asked about, and counts how many per-GPU events each distinct event stands
for.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from distsim.core.cluster import Cluster
from distsim.core.errors import DistsimError
from distsim.core.framework import Framework
from distsim.core.models.graph import Model
from distsim.core.strategy import Strategy
from distsim.plans import PLAN_KINDS, Plan
from distsim.sim.costs import (
    CollocationSlowdown,
    CommEvent,
    ComputeEvent,
    Cost,
    CostSource,
    framework_of,
    optimizer_key,
)
from distsim.sim.flow.events import EventFlow, FlowOptions
from distsim.sim.flow.templates import derived_blocks
from distsim.sim.flow.uniform import build_flow


@dataclass
class RecordingCosts:
    """A cost source that remembers every event it costs (and delegates the costing)."""

    inner: CostSource
    compute_events: dict[str, ComputeEvent] = field(default_factory=dict)
    comm_events: dict[str, CommEvent] = field(default_factory=dict)
    optimizer_events: dict[str, tuple[float, int]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.inner.name

    def compute(self, event: ComputeEvent) -> Cost:
        self.compute_events[event.key] = event
        return self.inner.compute(event)

    def comm(self, event: CommEvent) -> Cost:
        self.comm_events[event.key] = event
        return self.inner.comm(event)

    def interference(self, scope: str) -> tuple[float, float]:
        return self.inner.interference(scope)

    @property
    def framework(self) -> Framework:
        return framework_of(self.inner)

    def collocation_slowdown(self) -> CollocationSlowdown:
        return self.inner.collocation_slowdown()

    def optimizer(self, shard_params: float, state_bytes_per_param: int) -> Cost:
        self.optimizer_events[optimizer_key(shard_params, state_bytes_per_param)] = (
            shard_params,
            state_bytes_per_param,
        )
        return self.inner.optimizer(shard_params, state_bytes_per_param)


@dataclass(frozen=True)
class StrategyEvents:
    strategy: Strategy | Plan
    events_total: int
    events_unique: int


@dataclass
class Discovery:
    model: Model
    cluster: Cluster
    strategies: list[StrategyEvents]
    compute: dict[str, ComputeEvent]
    comm: dict[str, CommEvent]
    optimizer: dict[str, tuple[float, int]]
    occurrences: dict[str, int]
    """Per-GPU events each distinct event stands for, summed over the strategies."""

    @property
    def events_total(self) -> int:
        return sum(s.events_total for s in self.strategies)

    @property
    def events_unique(self) -> int:
        return len(self.occurrences)

    @property
    def derived_compute(self) -> dict[str, ComputeEvent]:
        """Compute events derived from a block the strategies also run (its sequence-parallel form, its attention
        core for selective recomputation): costed as the analytic share of that block's measured time
        (:func:`distsim.sim.costs.share_cost`), not measured apart."""
        forms = {
            ComputeEvent(form, e.phase, e.micro_batch_size, e.tp, e.dtype).key
            for e in self.compute.values()
            for form in derived_blocks(e.block)
        }
        return {k: e for k, e in self.compute.items() if k in forms}

    @property
    def measurable_compute(self) -> dict[str, ComputeEvent]:
        """Compute events to measure: neither given by the model file nor derived from another event."""
        derived = self.derived_compute
        return {k: e for k, e in self.compute.items() if not e.block.has_given_time and k not in derived}

    @property
    def comm_groups(self) -> dict[tuple[str, str, int], set[int]]:
        """(collective, scope, group size) -> the message sizes the strategies send."""
        out: dict[tuple[str, str, int], set[int]] = {}
        for e in self.comm.values():
            out.setdefault((e.collective, e.scope, e.group_size), set()).add(e.nbytes)
        return out

    def report(self) -> str:
        plans = sum(isinstance(s.strategy, Plan) and s.strategy.kind != "uniform" for s in self.strategies)
        n = len(self.strategies) - plans
        counted = [f"{n} strateg{'y' if n == 1 else 'ies'}"] if n or not plans else []
        counted += [f"{plans} plan{'' if plans == 1 else 's'}"] if plans else []
        groups = self.comm_groups
        given = sum(e.block.has_given_time for e in self.compute.values())
        derived = len(self.derived_compute)
        lines = [
            f"{' and '.join(counted)} of {self.model.name} on {self.cluster.name}: "
            f"{self.events_total:,} per-GPU events, {self.events_unique} distinct",
            f"  compute        {len(self.compute)} distinct ({len(self.measurable_compute)} to measure, "
            f"{given} given by the model" + (f", {derived} derived from a measured block)" if derived else ")"),
            f"  optimizer      {len(self.optimizer)} distinct shard sizes",
            f"  communication  {len(self.comm)} distinct, in {len(groups)} (collective, scope, group size) families: "
            + ", ".join(f"{c} {s} x{g}" for c, s, g in sorted(groups)),
        ]
        return "\n".join(lines)


def discover(
    model: Model, cluster: Cluster, strategies: list[Strategy | Plan], costs: CostSource,
    options: FlowOptions | None = None,
) -> Discovery:  # fmt: skip
    """Distinct events of every strategy or plan (each must fit `cluster`), with how often each occurs; a stages or
    burst plan's events are those of the flow the simulator builds for it (a burst plan's compute at every shard
    size, its re-distributions' point-to-point sizes, its per-layer all-reduces)."""
    if not strategies:
        raise DistsimError("no strategies to discover events for")
    recorder = RecordingCosts(costs)
    occurrences: dict[str, int] = {}
    per_strategy = []
    for strategy in strategies:
        flow = _flow(model, cluster, strategy, recorder, options)
        weight = {g: len(r) for g, r in flow.represents.items()}
        for k, slots in zip(flow.key, flow.slots, strict=True):
            if k < 0:  # the host enqueuing kernels: not an event to measure
                continue
            key = flow.keys[k]
            occurrences[key] = occurrences.get(key, 0) + sum(weight[g] for g, _ in slots)
        per_strategy.append(StrategyEvents(strategy, flow.events_total, flow.events_unique))
    return Discovery(
        model, cluster, per_strategy, recorder.compute_events, recorder.comm_events, recorder.optimizer_events,
        occurrences,
    )  # fmt: skip


def _flow(model: Model, cluster: Cluster, target: Strategy | Plan, costs: CostSource,
          options: FlowOptions | None) -> EventFlow:  # fmt: skip
    """The event flow the simulator builds for a strategy or a plan."""
    if isinstance(target, Strategy):
        return build_flow(model, cluster, target, costs, options)
    options = options or FlowOptions()
    if target.kind != "uniform":
        options = replace(options, symmetric=False)
    return PLAN_KINDS[target.kind].build_flow(model, cluster, target, costs, options)


def shard_strategies(plans: list[Plan]) -> list[Strategy]:
    """One single-stage strategy per micro-batch (burst: shard) size the plans' layers run at: the stages that the
    profiler's in-situ self-check chains (:func:`distsim.profiler.insitu.plan_chains`) time for them."""
    from distsim.plans.redistribution import shards

    sizes: set[int] = set()
    for plan in plans:
        if plan.burst:
            batch = plan.strategy.micro_batch_size
            sizes |= {hi - lo for devices in plan.burst for lo, hi in shards(batch, devices).values()}
        elif plan.stages:
            sizes |= {hi - lo for s in range(len(plan.stages)) for lo, hi in plan.replica_samples(s)}
    return [Strategy(micro_batch_size=n) for n in sorted(sizes)]

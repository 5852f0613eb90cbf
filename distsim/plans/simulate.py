"""Public entry point: simulate one training iteration and collect everything users look at.

:func:`simulate` resolves the plan (a strategy is a uniform plan), has its kind (:mod:`distsim.plans.kinds`) build
the event flow, runs the engine and returns a :class:`~distsim.plans.result.SimResult`, whose metrics come from
the flow and its timeline."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from distsim.core.cluster import Cluster
from distsim.core.errors import DistsimError
from distsim.core.models.context import rank_view
from distsim.core.models.graph import Model
from distsim.core.strategy import Strategy
from distsim.plans.kinds import PLAN_KINDS
from distsim.plans.plan import Plan
from distsim.plans.result import SimResult
from distsim.plans.uniform import plan_from_strategy
from distsim.sim import engine, network
from distsim.sim.costs import AnalyticCosts, CostSource
from distsim.sim.flow.events import EventFlow, FlowOptions, shared_partitions

DEFAULT_MAX_TASKS = 5_000_000
"""Most tasks one simulate() call may run (tasks of the event flow times the runs: 1, or ``samples``); above it the
call is refused before anything is built. Measured on this project's machine (AMD EPYC, 2 cores; peak RSS from
``/usr/bin/time``, the slope between two sizes): a deterministic run costs 530-700 bytes and 8-11 us per task
(gpt2-345m on distsim-testbed, 2M4P2D: M=10,000 is 2.05 M tasks, 1.17 GB, 23 s; M=40,000 is 8.2 M tasks, 4.3 GB,
84 s; 8M2P1D with every GPU simulated, whose collectives span 8 GPUs: 690 bytes, 8 us), each further stochastic run
about 2.5 us per task and no memory. So an allowed run stays under about 3.5 GB and a minute; ``max_tasks`` raises
the limit (the CLI's ``--max-tasks``)."""


class SimulationTooLarge(DistsimError):
    """A simulation that would run more tasks than the limit it was given."""


def estimate_size(
    model: Model,
    cluster: Cluster,
    strategy: Strategy | Plan,
    costs: CostSource | None = None,
    options: FlowOptions | None = None,
    samples: int = 0,
) -> tuple[int, int]:
    """(tasks of the event flow, runs) that :func:`simulate` with these arguments would execute, computed from the
    strategy or plan and the model without building anything (the strategy is validated on the way)."""
    costs = costs if costs is not None else AnalyticCosts(cluster)
    options, plan = _resolve(model, cluster, strategy, options or FlowOptions(), samples)
    model = rank_view(model, plan.strategy.ep, plan.strategy.cp)
    return PLAN_KINDS[plan.kind].estimate_tasks(model, cluster, plan, costs, options), max(1, samples)


def _resolve(
    model: Model, cluster: Cluster, target: Strategy | Plan, options: FlowOptions, samples: int
) -> tuple[FlowOptions, Plan]:
    """The plan to simulate (a strategy is a uniform plan) and its options: stochastic runs, and plans of a kind
    that neither is uniform nor simulates symmetric classes of its own (``symmetric_classes``), simulate every GPU."""
    if samples > 0:
        options = replace(options, symmetric=False, exact_host=True)  # sampled durations: every launch constraint
    if isinstance(target, Strategy):
        target = plan_from_strategy(target, model.name, cluster.name)
    if target.kind != "uniform" and not getattr(PLAN_KINDS[target.kind], "symmetric_classes", False):
        options = replace(options, symmetric=False)
    return options, target


def check_size(tasks: int, runs: int, max_tasks: int | None) -> None:
    """Refuse (one line: the estimate, the limit, how to lift it) a simulation of more than `max_tasks` tasks."""
    if max_tasks is None or tasks * runs <= max_tasks:
        return
    if runs > 1:
        what = f"about {tasks * runs:,} tasks ({tasks:,} per run x {runs:,} samples)"
        fix = "use fewer --samples"
    else:
        what = f"about {tasks:,} tasks"
        fix = "use fewer micro-batches"
    raise SimulationTooLarge(
        f"this simulation would run {what}, above the limit of {max_tasks:,}; {fix}, or raise the limit with "
        "--max-tasks (max_tasks= in Python)"
    )


def simulate(
    model: Model,
    cluster: Cluster,
    strategy: Strategy | Plan,
    costs: CostSource | None = None,
    options: FlowOptions | None = None,
    samples: int = 0,
    seed: int = 0,
    max_tasks: int | None = DEFAULT_MAX_TASKS,
    progress: Callable[[int, int], None] | None = None,
    estimate: tuple[int, int] | None = None,
) -> SimResult:
    """Predict one training iteration of `model` on `cluster` under `strategy` (or a :class:`~distsim.plans.plan.Plan`,
    whose stages may differ in layers and replicas).

    `costs` defaults to the analytic estimate from the cluster's figures; pass ``ProfileCosts`` to use a profile.

    With ``samples > 0`` the simulation is stochastic: every GPU is simulated (independent noise breaks symmetry),
    each run draws every measured event's duration from its measured repetitions, and the result is the median
    iteration time over the runs with the expected timeline (the mean start and end of every event). Ranks that
    synchronise wait for the slowest, so the expected iteration is longer than the iteration of expected durations
    (Jensen's inequality on max); the deterministic mode computes the latter.

    Before building anything, the tasks the simulation would run (see :func:`estimate_size`) are checked against
    `max_tasks` (None: no limit); beyond it :class:`SimulationTooLarge` says by how much. A caller that already
    estimated (the CLI announces a long simulation first) hands :func:`estimate_size`'s answer for these same
    arguments as `estimate`, which is trusted rather than computed again. `progress`, if given, is called as
    ``progress(done, samples)`` after each stochastic run.
    """
    t0 = time.perf_counter()
    costs = costs if costs is not None else AnalyticCosts(cluster)
    options = options or FlowOptions()
    # the estimate, the flow and its memory resolve one partition: balanced once; and the garbage collector waits
    # until the result is handed over (see engine.paused_gc): a flow is hundreds of thousands of small containers
    # and no cycles, and the first allocation after a pause that ended inside the call would scan them all
    with shared_partitions(), engine.paused_gc():
        return _simulate(model, cluster, strategy, costs, options, samples, seed, max_tasks, progress, estimate, t0)


def _simulate(
    model: Model,
    cluster: Cluster,
    strategy: Strategy | Plan,
    costs: CostSource,
    options: FlowOptions,
    samples: int,
    seed: int,
    max_tasks: int | None,
    progress: Callable[[int, int], None] | None,
    estimate: tuple[int, int] | None,
    t0: float,
) -> SimResult:
    if estimate is None:
        estimate = estimate_size(model, cluster, strategy, costs, options, samples)
    check_size(*estimate, max_tasks)
    options, plan = _resolve(model, cluster, strategy, options, samples)
    model = rank_view(model, plan.strategy.ep, plan.strategy.cp)  # a rank's experts and tokens (ep, cp)
    kind = PLAN_KINDS[plan.kind]
    flow = kind.build_flow(model, cluster, plan, costs, options)
    sampled: list[float] | None = None
    if samples > 0:
        result, sampled = _stochastic(flow, samples, seed, progress)
    else:
        result = network.run_flow(flow)  # fair link sharing: NICs shared in time (SimPy); else the longest path
    memory = kind.memory(model, cluster, plan, flow)
    elapsed = time.perf_counter() - t0
    strategy = plan.strategy if plan.kind == "uniform" else flow.strategy
    return SimResult(model, cluster, strategy, options, flow, result, memory, costs.name, elapsed,
                     sorted(sampled) if sampled else None, plan if plan.kind != "uniform" else None)  # fmt: skip


def _stochastic(
    flow: EventFlow, samples: int, seed: int, progress: Callable[[int, int], None] | None = None
) -> tuple[engine.EngineResult, list[float]]:
    """Run the flow `samples` times with durations drawn from the measured repetitions of each event."""
    rng = np.random.default_rng(seed)
    base = np.asarray(flow.duration_s, dtype=float)
    keys = np.asarray(flow.key, dtype=np.int64)
    draws: list[tuple[np.ndarray, np.ndarray]] = []  # (tasks of a key, relative durations of its repetitions)
    for k, cost in enumerate(flow.key_costs):
        if cost.samples and cost.seconds > 0:
            tasks = np.flatnonzero(keys == k)
            if len(tasks):
                draws.append((tasks, np.asarray(cost.samples, dtype=float) / np.mean(cost.samples)))
    start_sum = np.zeros(len(base))
    end_sum = np.zeros(len(base))
    makespans = []
    for _ in range(samples):
        durations = base.copy()
        for tasks, relative in draws:
            durations[tasks] *= relative[rng.integers(len(relative), size=len(tasks))]
        run = network.run_flow(flow, durations.tolist())
        start_sum += run.start_s
        end_sum += run.end_s
        makespans.append(run.makespan_s)
        if progress is not None:
            progress(len(makespans), samples)
    return engine.EngineResult((start_sum / samples).tolist(), (end_sum / samples).tolist()), makespans

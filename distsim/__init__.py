"""distsim: predict hybrid-parallel DNN training from a few profiled events.

The public API::

    from distsim import get_model, get_cluster, Strategy, simulate
    result = simulate(get_model("gpt2-345m"), get_cluster("distsim-testbed"),
                      Strategy.from_str("2M4P2D", num_micro_batches=8))
    result.iteration_time_s, result.timeline.df, result.per_gpu

Search drivers live in :mod:`distsim.search` (``grid_search``, ``plan_dapple``); plots in :mod:`distsim.io.plots`.

The simulator core (models, cluster, strategy, schedules, events, engine, timeline) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distsim.core.lazy import lazy_exports

if TYPE_CHECKING:
    from distsim.core.cluster import Cluster, get_cluster
    from distsim.core.errors import DistsimError
    from distsim.core.framework import Framework, get_framework
    from distsim.core.models import Model, get_model
    from distsim.core.schedules import Schedule, build_schedule, format_grid
    from distsim.core.strategy import Strategy
    from distsim.plans import Plan, StagePlan, burst_plan
    from distsim.plans.simulate import SimResult, simulate
    from distsim.search.collocate import CollocationReport, collocation_report
    from distsim.sim.costs import AnalyticCosts, ProfileCosts
    from distsim.sim.flow.events import FlowOptions
    from distsim.sim.timeline import Timeline

_PUBLIC = {
    "Cluster": "distsim.core.cluster", "get_cluster": "distsim.core.cluster", "DistsimError": "distsim.core.errors",
    "Framework": "distsim.core.framework", "get_framework": "distsim.core.framework", "Model": "distsim.core.models",
    "get_model": "distsim.core.models", "Schedule": "distsim.core.schedules",
    "build_schedule": "distsim.core.schedules", "format_grid": "distsim.core.schedules",
    "Strategy": "distsim.core.strategy", "Plan": "distsim.plans", "StagePlan": "distsim.plans",
    "burst_plan": "distsim.plans", "SimResult": "distsim.plans.simulate", "simulate": "distsim.plans.simulate",
    "CollocationReport": "distsim.search.collocate", "collocation_report": "distsim.search.collocate",
    "AnalyticCosts": "distsim.sim.costs", "ProfileCosts": "distsim.sim.costs", "FlowOptions": "distsim.sim.flow.events",
    "Timeline": "distsim.sim.timeline",
}  # fmt: skip
"""The public API, each name imported from its module when first used (PEP 562), so that ``import distsim`` and
the command line start without loading the simulator, pandas or networkx before a command needs them."""


__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC, globals())

__version__ = "0.1.0"

__all__ = [
    "AnalyticCosts",
    "Cluster",
    "CollocationReport",
    "DistsimError",
    "FlowOptions",
    "Framework",
    "Model",
    "Plan",
    "ProfileCosts",
    "Schedule",
    "SimResult",
    "StagePlan",
    "Strategy",
    "Timeline",
    "build_schedule",
    "burst_plan",
    "collocation_report",
    "format_grid",
    "get_cluster",
    "get_framework",
    "get_model",
    "simulate",
]

"""Layer 2, plans: what a search driver hands the simulator, one registry of kinds (uniform, stages, burst), and
:func:`simulate`. Importing the package registers the built-in kinds."""

from __future__ import annotations

# isort: off
from distsim.plans import uniform  # registered in this order: the kinds' order in messages and help
from distsim.plans import stages
from distsim.plans import burst

# isort: on
from distsim.plans.burst import burst_plan
from distsim.plans.files import plan_from_dict, plan_to_dict
from distsim.plans.kinds import PLAN_KINDS, PlanKind, register_plan_kind
from distsim.plans.plan import Plan, PlanError, StagePlan, check_plan
from distsim.plans.stages import stages_plan
from distsim.plans.uniform import plan_from_strategy

__all__ = [
    "PLAN_KINDS",
    "Plan",
    "PlanError",
    "PlanKind",
    "StagePlan",
    "burst",
    "burst_plan",
    "check_plan",
    "plan_from_dict",
    "plan_from_strategy",
    "plan_to_dict",
    "register_plan_kind",
    "stages",
    "stages_plan",
    "uniform",
]

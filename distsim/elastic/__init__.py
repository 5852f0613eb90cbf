"""EasyScale (ALGORITHMS.md 5): elastic training on ESTs; the intra-job planner of Eqs. 1a-1d."""

from distsim.elastic.planner import WASTE_CUT, ElasticPlan, ElasticPlanError, plan_elastic

__all__ = ["WASTE_CUT", "ElasticPlan", "ElasticPlanError", "plan_elastic"]

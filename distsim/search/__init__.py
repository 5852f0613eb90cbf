"""Search drivers over strategies and plans; they produce strategies the simulator evaluates.

* :func:`grid_search` (DistSim Sec. 6): every tensor x pipeline x data degree, micro-batch size and schedule,
  memory-filtered, simulated and ranked;
* :func:`plan_dapple` (DAPPLE Sec. IV): uneven stages, stage replication and placement by dynamic programming
  over DAPPLE's latency model, with :func:`check_with_simulator` to simulate its shortlist.
"""

from __future__ import annotations

from distsim.search.dapple import Candidate, Checked, DappleResult, DappleSpec, check_with_simulator, plan_dapple
from distsim.search.grid import GridPoint, GridResult, GridSpec, grid_search
from distsim.search.space import enumerate_strategies

__all__ = [
    "Candidate",
    "Checked",
    "DappleResult",
    "DappleSpec",
    "GridPoint",
    "GridResult",
    "GridSpec",
    "check_with_simulator",
    "enumerate_strategies",
    "grid_search",
    "plan_dapple",
]

"""Search drivers over strategies and plans; they produce strategies the simulator evaluates.

* :func:`grid_search` (DistSim Sec. 6): every tensor x pipeline x data degree, micro-batch size and schedule,
  memory-filtered, simulated and ranked;
* :func:`plan_dapple` (DAPPLE Sec. IV): uneven stages, stage replication and placement by dynamic programming
  over DAPPLE's latency model, with :func:`check_with_simulator` to simulate its shortlist;
* :func:`plan_deeppool` (DeepPool Sec. 4): a GPU count per layer by dynamic programming under an amplification
  limit, branch/join blocks reduced to transitions;
* :func:`compare_sync` and :func:`sweep_workers` (MG-WFBP): every gradient synchronisation mode of a data-parallel
  strategy with MG-WFBP's merge plan, and their scaling with the number of workers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from distsim.core.lazy import lazy_exports

if TYPE_CHECKING:
    from distsim.search.dapple import Candidate, Checked, DappleResult, DappleSpec, check_with_simulator, plan_dapple
    from distsim.search.deeppool import DeepPoolResult, plan_deeppool
    from distsim.search.grid import GridPoint, GridResult, GridSpec, grid_search
    from distsim.search.merge import SyncComparison, WorkerSweep, compare_sync, sweep_workers
    from distsim.search.space import enumerate_strategies

_PUBLIC = {
    **dict.fromkeys(("Candidate", "Checked", "DappleResult", "DappleSpec", "check_with_simulator", "plan_dapple"),
                    "distsim.search.dapple"),
    **dict.fromkeys(("DeepPoolResult", "plan_deeppool"), "distsim.search.deeppool"),
    **dict.fromkeys(("GridPoint", "GridResult", "GridSpec", "grid_search"), "distsim.search.grid"),
    **dict.fromkeys(("SyncComparison", "WorkerSweep", "compare_sync", "sweep_workers"), "distsim.search.merge"),
    "enumerate_strategies": "distsim.search.space",
}  # fmt: skip
"""Each driver loads when first used (:mod:`distsim.core.lazy`): the grid's pandas only for a grid search."""
__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC, globals())

__all__ = [
    "Candidate",
    "Checked",
    "DappleResult",
    "DappleSpec",
    "DeepPoolResult",
    "GridPoint",
    "GridResult",
    "GridSpec",
    "SyncComparison",
    "WorkerSweep",
    "check_with_simulator",
    "compare_sync",
    "enumerate_strategies",
    "grid_search",
    "plan_dapple",
    "plan_deeppool",
    "sweep_workers",
]

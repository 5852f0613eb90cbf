"""Where a strategy's ranks run and whether one GPU per pipeline rank stands for the rest (a symmetric simulation):
what every builder and the task estimate of a uniform strategy decide first."""

from __future__ import annotations

from distsim.core.cluster import Cluster
from distsim.core.models.graph import Model
from distsim.core.partition import rank_layers
from distsim.core.placement import Placement, parse_order
from distsim.core.strategy import Strategy, check_strategy
from distsim.sim.costs import CostSource
from distsim.sim.flow.events import FlowOptions, resolve_partition


def resolve_placement(
    model: Model, cluster: Cluster, strategy: Strategy, options: FlowOptions, costs: CostSource
) -> tuple[Placement, bool]:
    """The strategy checked against model and cluster, its placement, and whether one GPU per rank is simulated."""
    check_strategy(strategy, model, cluster)
    placement = Placement(strategy, cluster, parse_order(options.rank_order))
    symmetric = placement.symmetric  # decided once per shape (and stragglers): see Placement.symmetric
    if symmetric and options.link_sharing == "fair":  # one instance per pattern stands for the NIC load of all
        symmetric = placement.shares_evenly(_tied_pairs(model, strategy, costs))
    if options.symmetric is True and not symmetric:
        from distsim.core.errors import StrategyError

        raise StrategyError("symmetric simulation was required but replicas or tp peers differ on this cluster")
    return placement, symmetric and options.symmetric is not False


def _tied_pairs(model: Model, strategy: Strategy, costs: CostSource) -> list[tuple[int, int]]:
    """(pipeline rank of a tied layer's original, rank of its copy) for the tied layers on different ranks (whose
    gradients :meth:`distsim.sim.flow.uniform._Builder.tied_allreduce` all-reduces)."""
    if strategy.pp == 1 or not any(layer.tied_to is not None for layer in model.layers):
        return []
    stage_ranges = resolve_partition(model, strategy, costs)
    rank_of = {i: r for r in range(strategy.pp) for i in rank_layers(stage_ranges, strategy.pp, r)}
    return sorted({(rank_of[model.index[layer.tied_to]], rank_of[i]) for i, layer in enumerate(model.layers)
                   if layer.tied_to is not None} - {(r, r) for r in range(strategy.pp)})  # fmt: skip

"""A search's memo of partitions (issue 24): inside ``shared_partitions`` resolve_partition answers what it answers
outside, once per (model, costs, shape), and never hands one model's or one cost source's answer to another."""

from __future__ import annotations

from distsim import AnalyticCosts, Strategy, get_cluster, get_model, simulate
from distsim.search.grid import GridSpec, grid_search
from distsim.search.space import cluster_for
from distsim.sim.flow.events import PartitionMemo, resolve_partition, shared_partitions


def _strategies() -> list[Strategy]:
    out = []
    for text in ("1M4P2D", "2M4P1D", "1M2P4D", "2M2P2D"):
        for mbs in (1, 2):
            out.append(Strategy.from_str(text, micro_batch_size=mbs, num_micro_batches=8))
    out.append(Strategy.from_str("1M2P4D", num_micro_batches=8, schedule="interleaved", virtual_stages=2))
    out.append(Strategy.from_str("1M2P4D", num_micro_batches=8, partition=(1, 3)))
    return out


def test_memoised_partitions_equal_the_computed_ones() -> None:
    """Every strategy's ranges, asked twice inside the block, are those computed without it; one entry per shape
    (an explicit partition is its own shape)."""
    model, cluster = get_model("gpt2-cpu"), get_cluster("distsim-testbed")
    costs = AnalyticCosts(cluster)
    strategies = _strategies()
    plain = [resolve_partition(model, s, costs) for s in strategies]
    memo: PartitionMemo = {}
    with shared_partitions(memo):
        first = [resolve_partition(model, s, costs) for s in strategies]
        again = [resolve_partition(model, s, costs) for s in strategies]
    assert first == plain and again == plain
    shapes = {(s.partition, s.micro_batch_size, s.tp, s.num_stages) for s in strategies}
    assert len(memo["partition"]) == len(shapes)
    assert resolve_partition(model, strategies[0], costs) == plain[0]  # outside the block: no memo


def test_memo_keeps_models_and_costs_apart() -> None:
    """The same shape for another model or another cost source is answered for that one: a layer that costs much
    more moves the balance, and the memo does not hide it."""
    model, cluster = get_model("gpt2-cpu"), get_cluster("distsim-testbed")
    other = get_model("gpt2-345m")
    fast, slow = AnalyticCosts(cluster), AnalyticCosts(get_cluster("dgx-a100"))
    s = Strategy.from_str("1M4P1D", num_micro_batches=8)
    with shared_partitions():
        got = [resolve_partition(m, s, c) for m in (model, other) for c in (fast, slow)]
    assert got == [resolve_partition(m, s, c) for m in (model, other) for c in (fast, slow)]


def test_grid_results_do_not_depend_on_the_memo_or_the_workers() -> None:
    """A small grid with recomputation and sharding, serial and with two workers (each with its own memo): the same
    points, equal to simulating each configuration on its own."""
    model, cluster = get_model("gpt2-cpu"), get_cluster("distsim-testbed")
    spec = GridSpec(gpus=4, global_batch=8, micro_batch_sizes=(1, 2), schedules=("gpipe", "1f1b"),
                    recompute_modes=("none", "full"), sharding_modes=("none", "zero1"))  # fmt: skip
    serial = grid_search(model, cluster, spec, workers=1)
    parallel = grid_search(model, cluster, spec, workers=2)
    assert serial.points == parallel.points and serial.num_simulated > 4
    c = cluster_for(cluster, 4)
    for p in serial.points[:6]:
        if p.simulated:
            assert simulate(model, c, p.strategy, AnalyticCosts(c)).iteration_time_s == p.iteration_time_s

"""The speed-ups of issue 24 (simulating 131,072 GPUs in under 2 s) change no result: a placement's patterns counted
with numpy equal the instances placed one by one, the symmetry decided once per shape equals the check instance by
instance, fair sharing's test over arrays equals the one over load vectors, the per-GPU stats kept per simulated GPU
equal one object per GPU (their sums too, bit for bit), and a simulation handed its estimate trusts it.

The references below are the code these replaced, kept here to compare with. No timings: the speed is measured by
``benchmarks/bench_scale.py``."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from distsim import FlowOptions, Strategy, get_cluster, get_model, simulate
from distsim.core.placement import (
    Pattern,
    Placement,
    _shares_evenly_one_by_one,
    group_instances,
    pair_instances,
    parse_order,
    shares_evenly,
)
from distsim.plans.simulate import SimulationTooLarge, estimate_size
from distsim.sim import metrics
from distsim.sim.metrics import GPUStats
from tests.util import hand_cluster

ORDERS = ["tp,dp,pp", "tp,pp,dp", "pp,dp,tp", "dp,tp,pp", "dp,pp,tp", "pp,tp,dp"]
SHAPES = [
    (tp, pp, dp)
    for tp, pp, dp in itertools.product((1, 2, 3, 4, 8), (1, 2, 3, 4), (1, 2, 3, 4, 6))
    if tp * pp * dp <= 96
]


def one_by_one(placement: Placement) -> dict[tuple, list[tuple]]:
    """Every pattern of `placement` placed group by group with the list functions, as (gpus, scope, sharers)."""
    grid, gpn = placement.grid, placement.cluster.gpus_per_node
    pp, dp, tp = grid.shape
    out = {}
    for r in range(pp):
        out[("tp", r)] = group_instances([tuple(int(g) for g in row) for row in grid[r]], gpn)
        out[("dp", r)] = group_instances([tuple(int(g) for g in grid[r, :, t]) for t in range(tp)], gpn)
        for k in (k for k in (2, 3) if dp % k == 0):
            groups = [tuple(int(g) for g in grid[r, lo : lo + k, t]) for lo in range(0, dp, k) for t in range(tp)]
            out[("replicas", r, k)] = group_instances(groups, gpn)
        for dst in range(pp):
            pairs = [(int(a), int(b)) for a, b in zip(grid[r].ravel(), grid[dst].ravel(), strict=True)]
            out[("p2p", r, dst)] = pair_instances(pairs, gpn)
    return {k: [(i.gpus, i.scope, i.sharers) for i in v] for k, v in out.items()}


def arrays(placement: Placement) -> dict[tuple, list[tuple]]:
    pp, dp, _ = placement.grid.shape
    out = {}
    for r in range(pp):
        out[("tp", r)] = placement.tp_groups(r)
        out[("dp", r)] = placement.dp_groups(r)
        for k in (k for k in (2, 3) if dp % k == 0):
            out[("replicas", r, k)] = placement.replica_groups(r, k)
        for dst in range(pp):
            out[("p2p", r, dst)] = placement.p2p_pairs(r, dst)
    return {k: [(i.gpus, i.scope, i.sharers) for i in v] for k, v in out.items()}


def symmetry_one_by_one(placement: Placement) -> bool:
    """The symmetry check this issue replaced: instance by instance, GPU by GPU."""
    pp, cluster = placement.strategy.pp, placement.cluster
    for r in range(pp):
        if len({cluster.speed_factor(g) for g in placement.stage_gpus(r)}) > 1:
            return False
        patterns = [placement.tp_groups(r), placement.dp_groups(r)]
        if pp > 1:
            patterns += [placement.p2p_pairs(r, (r + 1) % pp), placement.p2p_pairs(r, (r - 1) % pp)]
            patterns.append(placement.p2p_pairs(0, pp - 1))
        for instances in patterns:
            if len({(i.scope, i.sharers) for i in instances}) > 1:
                return False
    return True


@pytest.mark.parametrize("gpn", [1, 2, 4, 8])
def test_patterns_counted_with_numpy_are_the_instances_placed_one_by_one(gpn: int) -> None:
    for (tp, pp, dp), order in itertools.product(SHAPES, ORDERS[:3]):
        nodes = -(-tp * pp * dp // gpn)
        placement = Placement(Strategy(tp=tp, pp=pp, dp=dp), hand_cluster(nodes, gpn), parse_order(order))
        assert arrays(placement) == one_by_one(placement), (tp, pp, dp, order, gpn)


def test_symmetry_decided_once_per_shape_is_the_check_instance_by_instance() -> None:
    rng = random.Random(0)
    seen = Counter()
    for (tp, pp, dp), order, gpn in itertools.product(SHAPES, ORDERS, (2, 4, 8)):
        cluster = hand_cluster(-(-tp * pp * dp // gpn), gpn)
        if rng.random() < 0.3:  # a straggler (or two alike) breaks or keeps the symmetry
            slow = {rng.randrange(tp * pp * dp): 1.5 for _ in range(rng.choice((1, 2)))}
            cluster = cluster.with_slowdown(slow)
        placement = Placement(Strategy(tp=tp, pp=pp, dp=dp), cluster, parse_order(order))
        expected = symmetry_one_by_one(placement)
        assert placement.symmetric == expected, (tp, pp, dp, order, gpn, cluster.slowdown)
        seen[expected] += 1
    assert seen[True] > 50 and seen[False] > 50  # both answers were exercised


def test_a_shape_is_laid_out_once_and_a_symmetric_rank_builds_one_instance() -> None:
    cluster = get_cluster("dgx-a100").with_nodes(16384)
    a = Placement(Strategy(tp=8, pp=16, dp=1024, num_micro_batches=64), cluster)
    b = Placement(Strategy(tp=8, pp=16, dp=1024, num_micro_batches=8, schedule="gpipe"), cluster)
    assert a.layout is b.layout and a.symmetric and b.symmetric
    pairs = a.p2p_pairs(3, 4)
    assert len(pairs) == 8192 and pairs.uniform and not pairs._built  # decided without an object per instance
    assert pairs[5] is pairs[5] and pairs[5].gpus == (3 * 8192 + 5, 4 * 8192 + 5) and len(pairs._built) == 1
    with pytest.raises(ValueError, match="read-only"):
        a.grid[0, 0, 0] = 1


def loads_one_by_one(groups: list[tuple[int, ...]], gpn: int) -> tuple:
    """Pattern's collective and transfer loads as its loops counted them."""
    load: Counter[int] = Counter()
    sends: Counter[int] = Counter()
    receives: Counter[int] = Counter()
    for group in groups:
        nodes = {g // gpn for g in group}
        if len(nodes) > 1:
            load.update(nodes)
        a, b = group[0] // gpn, group[-1] // gpn
        if a != b:
            sends[a] += 1
            receives[b] += 1
    collective = tuple(sorted(load.items()))
    return (collective, collective), (tuple(sorted(sends.items())), tuple(sorted(receives.items())))


def random_pattern(rng: random.Random, gpn: int, size: int | None = None) -> Pattern:
    gpus = rng.randrange(2, 24)
    k = size or rng.choice((2, 2, 3, 4))
    groups = tuple(tuple(rng.randrange(gpus) for _ in range(k)) for _ in range(rng.randrange(1, 7)))
    return Pattern(groups, gpn)


def test_pattern_loads_and_fair_sharing_over_arrays_equal_the_loops() -> None:
    rng = random.Random(1)
    answers = Counter()
    for _ in range(1500):
        gpn = rng.choice((1, 2, 4))
        patterns = [random_pattern(rng, gpn) for _ in range(rng.randrange(1, 4))]
        for p in patterns:
            assert (p.collective_load, p.transfer_load) == loads_one_by_one(list(p.groups), gpn)
            as_array = Pattern(np.asarray(p.groups), gpn)
            assert (as_array.collective_load, as_array.transfer_load) == (p.collective_load, p.transfer_load)
        usages = [(p, rng.random() < 0.5) for p in patterns]
        expected = _shares_evenly_one_by_one(usages)
        assert shares_evenly(usages) == expected, [(p.groups, t) for p, t in usages]
        answers[expected] += 1
    assert answers[True] > 200 and answers[False] > 200
    ragged = Pattern(((0, 1), (2, 3, 5)), 2)  # groups of different sizes: counted one by one
    assert ragged.nodes is None and shares_evenly([(ragged, False)]) == _shares_evenly_one_by_one([(ragged, False)])


FAIR_SHAPES = [(4, 2, 4, 4, "tp,dp,pp"), (2, 4, 4, 8, "tp,pp,dp"), (2, 3, 6, 4, "pp,dp,tp"), (4, 4, 2, 2, "dp,tp,pp")]


@pytest.mark.parametrize(("tp", "pp", "dp", "gpn", "order"), FAIR_SHAPES)
def test_a_placement_shares_evenly_as_its_patterns_did_one_by_one(
    tp: int, pp: int, dp: int, gpn: int, order: str
) -> None:
    placement = Placement(Strategy(tp=tp, pp=pp, dp=dp), hand_cluster(tp * pp * dp // gpn, gpn), parse_order(order))
    for tied in ((), ((0, pp - 1),)):
        usages = []
        for r in range(pp):
            usages += [(placement.tp_groups(r).pattern, False), (placement.dp_groups(r).pattern, False)]
            usages += [(placement.p2p_pairs(r, d).pattern, True) for d in sorted({(r + 1) % pp, (r - 1) % pp})]
        usages += [(placement.p2p_pairs(a, b).pattern, False) for a, b in tied]
        listed = [(Pattern(tuple(map(tuple, p.groups.tolist())), gpn), t) for p, t in usages]
        assert placement.shares_evenly(tied) == _shares_evenly_one_by_one(listed)


def stats_one_by_one(gpu, is_compute, start_s, end_s, represents, gpn) -> list[GPUStats]:
    """stats_of_rows as it was: one GPUStats per GPU, sorted by GPU."""
    t0 = float(start_s.min())
    iteration = float(end_s.max() - t0)
    out = []
    for rep, targets in sorted(represents.items()):
        mine = gpu == rep
        if not mine.any():
            stats = (0.0, 0.0, 0.0, iteration)
        else:
            c, s, e = is_compute[mine], start_s[mine] - t0, end_s[mine] - t0
            compute = metrics.union_length(s[c], e[c])
            busy = metrics.union_length(s, e)
            stats = (compute, metrics.union_length(s[~c], e[~c]), busy - compute, iteration - busy)
        out += [GPUStats(g, g // gpn, *stats) for g in targets]
    return sorted(out, key=lambda x: x.gpu)


def test_per_gpu_stats_kept_per_simulated_gpu_equal_one_object_per_gpu() -> None:
    rng = np.random.default_rng(2)
    for _ in range(30):
        reps = sorted(rng.choice(40, size=int(rng.integers(1, 6)), replace=False).tolist())
        others = rng.permutation(np.arange(40, 40 + 20 * len(reps)))
        represents = {r: (r, *sorted(others[i::len(reps)][: int(rng.integers(0, 20))].tolist()))
                      for i, r in enumerate(reps)}  # fmt: skip
        n = int(rng.integers(1, 60))
        gpu = rng.choice([*reps, reps[0]], size=n)  # a simulated GPU may run nothing: it idles
        start = rng.random(n) * 10
        end = start + rng.random(n) * 3
        compute = rng.random(n) < 0.6
        table = metrics.stats_of_rows(gpu, compute, start, end, represents, 4)
        listed = stats_one_by_one(gpu, compute, start, end, represents, 4)
        assert table == listed and list(table) == listed and len(table) == len(listed)
        assert table.to_dicts() == [s.to_dict() for s in listed]
        assert table[-1] == listed[-1] and table[1:3] == listed[1:3]
        assert all(table.of_gpu(s.gpu) == s for s in listed)
        iteration = float(end.max() - start.min())
        assert metrics.bubble_fraction(table, iteration) == metrics.bubble_fraction(listed, iteration)  # exactly
        assert metrics.mean_exposed_comm(table) == metrics.mean_exposed_comm(listed)
    with pytest.raises(KeyError):
        table.of_gpu(10_000)


def test_131072_gpus_are_16_classes_and_their_figures_the_per_gpu_ones() -> None:
    cluster = get_cluster("dgx-a100").with_nodes(16384)
    result = simulate(get_model("gpt3-175b"), cluster, Strategy(tp=8, pp=16, dp=1024, num_micro_batches=4))
    per_gpu = result.per_gpu
    assert len(per_gpu) == 131072 and len(per_gpu.classes) == 16 and result.flow.symmetric
    listed = list(per_gpu[::4099])
    assert [s.gpu for s in listed] == list(range(0, 131072, 4099))
    assert result.bubble_fraction == sum(s.idle_s for s in per_gpu) / (131072 * result.iteration_time_s)
    assert result.exposed_comm_s == sum(s.exposed_comm_s for s in per_gpu) / 131072


def test_a_simulation_trusts_the_estimate_it_was_handed() -> None:
    model, cluster = get_model("gpt2-345m"), get_cluster("distsim-testbed")
    strategy = Strategy.from_str("2M4P2D", num_micro_batches=4)
    size = estimate_size(model, cluster, strategy)
    assert simulate(model, cluster, strategy, estimate=size).iteration_time_s == simulate(
        model, cluster, strategy).iteration_time_s  # fmt: skip
    with pytest.raises(SimulationTooLarge, match="about 10,000,000 tasks"):  # the handed figure, not recomputed
        simulate(model, cluster, strategy, estimate=(10_000_000, 1))
    with pytest.raises(SimulationTooLarge):
        simulate(model, cluster, strategy, options=FlowOptions(), max_tasks=size[0] - 1)


def test_the_result_module_loads_pandas_only_for_a_table() -> None:
    probe = "import sys, distsim.plans.result, distsim.plans.simulate; print('pandas' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"

"""The SimPy engine on tiny DAGs, and when the flow builder falls back to simulating every GPU."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distsim import FlowOptions, Strategy, get_cluster, get_model, simulate
from distsim.core.errors import StrategyError
from distsim.sim import engine
from distsim.sim.costs import AnalyticCosts
from distsim.sim.flow.uniform import build_flow
from tests.util import chain_model, hand_cluster


def test_engine_runs_a_dag_by_longest_path() -> None:
    #   0 (2s) -> 2 (1s) ; 1 (5s) -> 2 ; 3 (0s) waits on 2
    r = engine.run([2.0, 5.0, 1.0, 0.0], [[], [], [0, 1], [2]])
    assert r.start_s == [0.0, 0.0, 5.0, 6.0] and r.end_s == [2.0, 5.0, 6.0, 6.0]
    assert r.makespan_s == 6.0


def test_engine_reports_cycles() -> None:
    with pytest.raises(RuntimeError, match="cycle: 2 tasks never became ready"):
        engine.run([1.0, 1.0, 1.0], [[], [2], [1]])


def test_collective_waits_for_its_slowest_member() -> None:
    """A straggler delays the tensor-parallel all-reduce for its peer, which then idles."""
    model = chain_model([(1.0, 2.0, 0, 0.0)])
    model = model.with_layers(tuple(
        replace(layer, blocks=tuple(replace(b, tp="shard", tp_fwd_allreduce_bytes=100.0) for b in layer.blocks))
        for layer in model.layers
    ))  # fmt: skip
    cluster = hand_cluster(1, 2).with_slowdown({1: 3.0})
    r = simulate(model, cluster, Strategy(tp=2))
    assert not r.flow.symmetric and len(r.flow.represents) == 2
    df = r.timeline.df
    ar = df[df["kind"] == "tp_allreduce"]
    # forward of 1 s split over tp=2 takes 0.5 s on GPU 0 and 1.5 s on GPU 1; the all-reduce starts at 1.5 on both
    assert sorted(ar["start_s"].tolist()) == pytest.approx([1.5, 1.5])
    stats = {g.gpu: g for g in r.per_gpu}
    assert stats[0].idle_s > stats[1].idle_s


def test_symmetry_is_used_when_it_holds_and_can_be_required() -> None:
    model = chain_model([(1.0, 2.0, 100, 10.0)] * 4)
    sym = simulate(model, hand_cluster(2, 4), Strategy(pp=2, dp=4, num_micro_batches=4))
    assert sym.flow.symmetric and len(sym.flow.represents) == 2
    assert sorted(len(t) for t in sym.flow.represents.values()) == [4, 4]
    with pytest.raises(StrategyError, match="symmetric simulation was required"):
        simulate(
            model, hand_cluster(2, 4).with_slowdown({5: 2.0}), Strategy(pp=2, dp=4), options=FlowOptions(symmetric=True)
        )


@st.composite
def _dags(draw: st.DrawFn) -> tuple[list[float], list[list[int]], dict[int, list[tuple[int, float]]]]:
    """Random DAGs over a random permutation of ids (so some dependencies point to later ids), durations on a
    coarse grid (many equal finish times), and release constraints along the same order."""
    n = draw(st.integers(1, 25))
    perm = draw(st.permutations(range(n)))
    durations = [draw(st.sampled_from([0.0, 0.25, 0.5, 1.0, 1.5, 3.0])) for _ in range(n)]
    deps: list[list[int]] = [[] for _ in range(n)]
    releases: dict[int, list[tuple[int, float]]] = {}
    for k in range(1, n):
        for p in draw(st.lists(st.integers(0, k - 1), max_size=3)):
            deps[perm[k]].append(perm[p])
        if draw(st.booleans()):
            h = perm[draw(st.integers(0, k - 1))]
            releases.setdefault(h, []).append((perm[k], draw(st.sampled_from([0.0, 0.5, 2.0]))))
    return durations, deps, releases


@settings(max_examples=300, deadline=None)
@given(_dags())
def test_longest_path_pass_equals_the_simpy_simulation_exactly(dag) -> None:  # type: ignore[no-untyped-def]
    durations, deps, releases = dag
    fast, des = engine.run(durations, deps, releases), engine.run_simpy(durations, deps, releases)
    assert fast.start_s == des.start_s and fast.end_s == des.end_s  # bit for bit, not approximately


def test_dependencies_on_later_ids_are_ordered_first() -> None:
    # 0 waits for 2, 2 for 1: ids are not a topological order
    r = engine.run([1.0, 2.0, 3.0], [[2], [], [1]], {1: [(0, 10.0)]})
    assert r.start_s == [10.0, 0.0, 2.0] and r.end_s == [11.0, 2.0, 5.0]


def test_a_release_cycle_is_reported() -> None:
    with pytest.raises(RuntimeError, match="cycle"):
        engine.run([1.0, 1.0], [[], [0]], {1: [(0, 0.0)]})


@pytest.mark.parametrize("text", [
    "tp=2 pp=2 dp=2 mb=4 schedule=1f1b", "tp=1 pp=4 dp=2 mb=8 schedule=interleaved v=2 zero=zero1",
    "tp=4 pp=2 dp=1 mb=4 schedule=gpipe recompute=full sp=1", "tp=1 pp=1 dp=8 mb=2 zero=zero3",
])  # fmt: skip
def test_simulated_flows_run_identically_on_both_engines(text: str) -> None:
    cluster = get_cluster("dgx-a100").with_nodes(1)
    flow = build_flow(
        get_model("gpt2-345m"),
        cluster,
        Strategy.from_str(text),
        AnalyticCosts(cluster),
        FlowOptions(host=True, exact_host=True),
    )
    fast, des = (
        engine.run(flow.duration_s, flow.deps, flow.releases),
        engine.run_simpy(flow.duration_s, flow.deps, flow.releases),
    )
    assert fast == des

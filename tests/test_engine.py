"""The SimPy engine on tiny DAGs, and when the flow builder falls back to simulating every GPU."""

from __future__ import annotations

from dataclasses import replace

import pytest

from distsim import FlowOptions, Strategy, engine, simulate
from distsim.errors import StrategyError
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

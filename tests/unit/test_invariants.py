"""Invariants over random strategies, models and clusters (hypothesis).

* no two events overlap on one stream of one GPU;
* every dependency finishes before its dependent starts;
* per GPU, compute + exposed communication + idle = iteration time;
* more bandwidth or faster compute (any subset of layers, any factor >= 1) never makes the iteration slower;
* symmetric simulation, expanded to every GPU, equals full simulation row for row.

Scenarios draw every gradient synchronisation mode whose buckets do not depend on costs, and issue 12's activation
recomputation, sequence parallelism and optimizer sharding.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from distsim import FlowOptions, Strategy, simulate
from distsim.core.cluster import Cluster
from distsim.core.models import Model, model_from_dict
from distsim.sim.metrics import gpu_stats
from tests.util import InterferingCosts, hand_cluster

EXAMPLES = int(os.environ.get("DISTSIM_HYPOTHESIS_EXAMPLES", "80"))  # raise it for a longer hunt
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
EPS = 1e-9


@dataclass(frozen=True)
class Scenario:
    model: Model
    cluster: Cluster
    strategy: Strategy
    options: FlowOptions
    interference: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    """(compute, comm) slowdown of intra-node overlap, then of inter-node overlap."""
    launch_s: float = 0.0
    """Host seconds to enqueue each compute event (with ``options.host``)."""


def _layer(draw: Any, i: int, tp_split: bool) -> dict[str, Any]:
    layer: dict[str, Any] = {
        "name": f"l{i}",
        "params": draw(st.integers(0, 3000)),
        "out_bytes": draw(st.sampled_from([0.0, 100.0, 700.0, 2000.0])),
        "saved_bytes": 10.0,
    }
    if draw(st.booleans()):  # given times
        layer["forward_s"] = draw(st.floats(0.05, 2.0))
        layer["backward_s"] = draw(st.floats(0.05, 4.0))
    else:  # estimated from FLOPs by the cost source
        layer["op"] = f"op{i}"
        layer["flops"] = draw(st.floats(1e10, 5e12))
        layer["io_bytes"] = draw(st.floats(0, 1e9))
    if tp_split:
        layer["tp"] = "shard"
        layer["tp_allreduce_bytes"] = draw(st.sampled_from([0.0, 300.0, 1500.0]))
    return layer


def _grad_sync(draw: Any, n_layers: int) -> dict[str, Any]:
    """A gradient synchronisation mode whose buckets do not depend on costs (so that monotonicity holds): bulk,
    wfbp, ddp, or a given merge plan (mgwfbp with random consecutive layer groups)."""
    mode = draw(st.sampled_from(["bulk", "wfbp", "ddp", "mgwfbp"]))
    if mode != "mgwfbp":
        return {"grad_sync": mode}
    cuts = sorted(draw(st.sets(st.integers(1, n_layers - 1), max_size=n_layers - 1))) if n_layers > 1 else []
    edges = [0, *cuts, n_layers]
    return {"grad_sync": mode, "grad_groups": tuple(pairwise(edges))}


def _scale(draw: Any, tp: int) -> dict[str, Any]:
    """Issue 12's fields: activation recomputation (of the first N layers of each stage or all), sequence parallelism
    (tp > 1) and a sharded optimizer."""
    recompute = draw(st.sampled_from(["none", "selective", "full"]))
    return {
        "recompute": recompute,
        "recompute_layers": draw(st.sampled_from([None, 1, 2])) if recompute != "none" else None,
        "sequence_parallel": draw(st.booleans()) if tp > 1 else False,
        "optimizer_sharding": draw(st.sampled_from(["none", "zero1", "zero2", "zero3"])),
    }


@st.composite
def scenarios(draw: Any) -> Scenario:
    tp = draw(st.sampled_from([1, 1, 2]))
    pp = draw(st.integers(1, 3))
    dp = draw(st.sampled_from([1, 2]))
    schedule = draw(st.sampled_from(["gpipe", "1f1b", "interleaved"] if pp > 1 else ["gpipe", "1f1b"]))
    chunks = 2 if schedule == "interleaved" else 1
    m = pp * draw(st.integers(1, 2)) if schedule == "interleaved" else draw(st.integers(1, 5))
    n_layers = draw(st.integers(pp * chunks, pp * chunks + 3))
    model = model_from_dict({"name": "random", "layers": [_layer(draw, i, tp > 1) for i in range(n_layers)]})
    gpus = tp * pp * dp
    gpn = draw(st.sampled_from([d for d in (1, 2, 4, 8) if gpus % d == 0]))
    cluster = hand_cluster(
        nodes=gpus // gpn,
        gpus_per_node=gpn,
        intra_bw=draw(st.floats(200.0, 5000.0)),
        inter_bw=draw(st.floats(50.0, 2000.0)),
        intra_lat=draw(st.floats(0.0, 0.05)),
        inter_lat=draw(st.floats(0.0, 0.2)),
        nics=draw(st.integers(1, 2)),
    )
    cluster = replace(cluster, gpu=replace(cluster.gpu, memory_bandwidth_bytes_per_s=1e10, kernel_overhead_s=0.01))
    if draw(st.booleans()) and gpus > 1:
        cluster = cluster.with_slowdown({draw(st.integers(0, gpus - 1)): draw(st.floats(1.0, 2.0))})
    strategy = Strategy(
        tp=tp,
        pp=pp,
        dp=dp,
        num_micro_batches=m,
        micro_batch_size=draw(st.integers(1, 2)),
        schedule=schedule,
        warmup_policy=draw(st.sampled_from(["A", "B"])),
        **_grad_sync(draw, n_layers),
        **_scale(draw, tp),
        max_in_flight=draw(st.sampled_from([None, 1, 2])) if schedule == "1f1b" else None,
    )
    host = draw(st.booleans())
    options = FlowOptions(
        p2p_blocking=draw(st.booleans()),
        rank_order=draw(st.sampled_from(["tp,dp,pp", "tp,pp,dp"])),
        link_sharing=draw(st.sampled_from(["structural", "serialize"])),
        host=host,
        exact_host=draw(st.booleans()),
    )
    interference = tuple(draw(st.sampled_from([0.0, 0.0, 0.3, 1.0])) for _ in range(4))
    launch = draw(st.sampled_from([0.0, 0.005, 0.05, 0.3])) if host else 0.0
    return Scenario(model, cluster, strategy, options, interference, launch)  # type: ignore[arg-type]


def _run(sc: Scenario, **changes: Any):
    cluster = changes.get("cluster", sc.cluster)
    strategy = changes.get("strategy", sc.strategy)
    costs = InterferingCosts(cluster, slowdowns=sc.interference, launch_s=changes.get("launch_s", sc.launch_s))
    return simulate(sc.model, cluster, strategy, costs, options=changes.get("options", sc.options))


@SETTINGS
@given(scenarios())
def test_streams_never_overlap_and_dependencies_hold(sc: Scenario) -> None:
    r = _run(sc)
    df = r.timeline.df
    assert (df["end_s"] >= df["start_s"]).all()
    for _, group in df.groupby(["gpu", "stream"], observed=True):
        g = group.sort_values(["start_s", "end_s"])
        assert (g["start_s"].to_numpy()[1:] >= g["end_s"].to_numpy()[:-1] - EPS).all()
    start, end = r.tasks.start_s, r.tasks.end_s
    for i, deps in enumerate(r.flow.deps):
        for d in deps:
            assert end[d] <= start[i] + EPS
        assert end[i] == start[i] + r.flow.duration_s[i] or abs(end[i] - start[i] - r.flow.duration_s[i]) < 1e-6


@SETTINGS
@given(scenarios())
def test_time_accounting_adds_up(sc: Scenario) -> None:
    r = _run(sc)
    t = r.iteration_time_s
    for g in r.per_gpu:
        assert (
            g.compute_s + g.exposed_comm_s + g.idle_s == np.float64(t)
            or abs(g.compute_s + g.exposed_comm_s + g.idle_s - t) < 1e-6
        )
        assert -1e-9 <= g.exposed_comm_s <= g.comm_s + 1e-9
    rows = r.full_timeline().df
    assert (rows["kind"].astype(str) != "launch").sum() == r.events_total  # host rows are not device events
    assert 0 <= r.bubble_fraction <= 1


def _faster_model(model: Model, factors: list[float]) -> Model:
    layers = []
    for layer, k in zip(model.layers, factors, strict=True):
        blocks = tuple(
            replace(
                b,
                fwd_s=None if b.fwd_s is None else b.fwd_s / k,
                bwd_s=None if b.bwd_s is None else b.bwd_s / k,
                fwd_flops=b.fwd_flops / k,
                io_bytes=b.io_bytes / k,
            )
            for b in layer.blocks
        )
        layers.append(replace(layer, blocks=blocks))
    return model.with_layers(tuple(layers))


@SETTINGS
@given(scenarios(), st.data())
def test_more_bandwidth_or_faster_compute_is_never_slower(sc: Scenario, data: st.DataObject) -> None:
    base = _run(sc)
    fixed = replace(sc.strategy, partition=tuple(e - s for s, e in base.flow.stage_ranges))
    k_bw = data.draw(st.floats(1.0, 8.0), label="bandwidth factor")
    k_compute = data.draw(st.floats(1.0, 8.0), label="compute factor")
    per_layer = data.draw(st.lists(st.floats(1.0, 4.0), min_size=len(sc.model.layers), max_size=len(sc.model.layers)))
    wider = _run(sc, strategy=fixed, cluster=sc.cluster.scaled(bandwidth=k_bw))
    quicker = _run(sc, strategy=fixed, cluster=sc.cluster.scaled(compute=k_compute))
    costs = InterferingCosts(sc.cluster, slowdowns=sc.interference)
    some_layers = simulate(_faster_model(sc.model, per_layer), sc.cluster, fixed, costs, options=sc.options)
    t = base.iteration_time_s
    assert wider.iteration_time_s <= t + 1e-9
    assert quicker.iteration_time_s <= t + 1e-9
    assert some_layers.iteration_time_s <= t + 1e-9


def _rows(df: Any) -> list[tuple]:
    cols = ["gpu", "stream", "kind", "name", "layer", "stage", "microbatch", "start_s", "end_s"]
    out = df[cols].astype({"stream": str, "kind": str, "name": str}).itertuples(index=False, name=None)
    return sorted((*r[:7], round(r[7], 9), round(r[8], 9)) for r in out)


@SETTINGS
@given(scenarios())
def test_symmetric_and_full_simulation_agree(sc: Scenario) -> None:
    auto = _run(sc)
    full = _run(sc, options=replace(sc.options, symmetric=False))
    event(f"symmetric={auto.flow.symmetric}")
    event(f"tp={sc.strategy.tp} dp={sc.strategy.dp} nodes>1={sc.cluster.nodes > 1}")
    assert auto.iteration_time_s == full.iteration_time_s or abs(auto.iteration_time_s - full.iteration_time_s) < 1e-9
    assert auto.events_total == full.events_total
    assert _rows(auto.full_timeline().df) == _rows(full.timeline.df)
    if auto.flow.symmetric:
        assert len(auto.flow) <= len(full.flow)


@SETTINGS
@given(scenarios())
def test_chains_emit_exactly_the_tasks_of_the_op_by_op_builder(sc: Scenario) -> None:
    """A rank simulated by one GPU emits its templates as chains; op by op gives the very same flow."""
    import distsim.sim.flow.uniform as strategy_flow
    from distsim.sim.flow.uniform import build_flow

    options = sc.options
    costs = InterferingCosts(sc.cluster, slowdowns=sc.interference, launch_s=sc.launch_s)
    chained = build_flow(sc.model, sc.cluster, sc.strategy, costs, options)
    one_gpu = strategy_flow._Builder._action_on_one_gpu
    try:
        strategy_flow._Builder._action_on_one_gpu = strategy_flow._Builder._action_on_lanes  # type: ignore[method-assign]
        op_by_op = build_flow(sc.model, sc.cluster, sc.strategy, costs, options)
    finally:
        strategy_flow._Builder._action_on_one_gpu = one_gpu  # type: ignore[method-assign]
    for attr in ("duration_s", "deps", "slots", "kind", "name", "layer", "stage", "microbatch", "key", "keys"):
        assert getattr(chained, attr) == getattr(op_by_op, attr), attr


@SETTINGS
@given(scenarios())
def test_metrics_from_the_flow_equal_those_of_the_timeline(sc: Scenario) -> None:
    """The metrics come from the flow's arrays (a grid search never builds the timeline); the timeline agrees."""
    r = _run(sc)
    metrics = (r.iteration_time_s, r.per_gpu)
    assert metrics == (r.timeline.iteration_time_s, gpu_stats(r.timeline))

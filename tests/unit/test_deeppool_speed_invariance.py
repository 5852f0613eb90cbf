"""Burst plans simulated in symmetric classes (:mod:`distsim.plans.burst_classes`) give exactly what simulating every
GPU gives: the same iteration time, per-GPU figures, memory and (expanded) timeline rows, to the last bit.

Hand cases on the hand cluster (1000 bytes/s, no latency; 1e12 FLOPs per sample is 1 s forward, 2 s backward per
sample), then a property over random plans, options and stragglers.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distsim import FlowOptions, simulate
from distsim.core.models import Model, model_from_dict
from distsim.plans import Plan, burst_plan
from distsim.plans.burst_classes import burst_classes
from distsim.plans.burst_flow import estimate_burst_tasks
from distsim.plans.plan import split_samples
from distsim.plans.redistribution import slice_bounds
from distsim.sim.costs import AnalyticCosts
from distsim.sim.timeline import COLUMNS
from tests.unit.test_burst_flow import flops_model
from tests.util import hand_cluster

NO_HOST = FlowOptions(host=False)
EVERY_GPU = replace(NO_HOST, symmetric=False)


def _rows(result: Any) -> list[tuple]:
    """Every GPU's timeline rows (a symmetric result expanded), in one order whatever the emission order was."""
    df = result.full_timeline().df.astype({"stream": str, "kind": str, "name": str})
    return sorted(df[list(COLUMNS)].itertuples(index=False, name=None))


def assert_same(model: Model, cluster: Any, plan: Plan, options: FlowOptions) -> tuple[Any, Any]:
    """The symmetric and the every-GPU simulation of `plan` agree exactly; returns both."""
    sym = simulate(model, cluster, plan, options=options)
    full = simulate(model, cluster, plan, options=replace(options, symmetric=False))
    assert sym.iteration_time_s == full.iteration_time_s
    assert sym.per_gpu == full.per_gpu
    assert sym.memory == full.memory
    assert sym.events_total == full.events_total and sym.num_gpus == full.num_gpus
    assert _rows(sym) == _rows(full)
    assert len(sym.flow) <= estimate_burst_tasks(model, cluster, plan, AnalyticCosts(cluster), options)
    return sym, full


# --------------------------------------------------------------------------------------------------- by hand
def test_two_layers_on_two_gpus_are_one_class() -> None:
    """Batch 2, both layers on GPUs 0-1 with 500 parameters (1000 B of fp16 gradients): each GPU runs F 1 + 1 s,
    B 2 + 2 s, then two bulk all-reduces of 1000 B over 2 GPUs (1 s each): 8 s. Both GPUs do the same: GPU 0 is
    simulated and stands for GPU 1."""
    model = flops_model([(1.0, 500, 100.0), (1.0, 500, 0.0)])
    cluster = hand_cluster()
    plan = burst_plan(model, cluster, [2, 2], 2)
    assert burst_classes(model, cluster, plan) == {0: (0, 1)}
    sym, full = assert_same(model, cluster, plan, NO_HOST)
    assert sym.flow.represents == {0: (0, 1)} and sym.flow.symmetric and not full.flow.symmetric
    assert sym.iteration_time_s == pytest.approx(8.0)
    figures = [x for g in sym.per_gpu for x in (g.gpu, g.compute_s, g.comm_s, g.idle_s)]
    assert figures == pytest.approx([0, 6.0, 2.0, 0.0, 1, 6.0, 2.0, 0.0])
    assert len(sym.flow) < len(full.flow)


def test_one_gpu_then_four_by_hand() -> None:
    """Batch 4: l0 on GPU 0 (F 4 s), l1 on GPUs 0-3 (1 sample each, F 1 s, B 2 s), 100 B per sample of l0's output.
    GPU 0 keeps sample 0 and sends 1-3 (300 B, 0.3 s, 4.0-4.3): its F1 runs 4-5 at once, GPUs 1-3's 4.3-5.3; B1
    5-7 and 5.3-7.3; the gradients come back to GPU 0 (0.3 s, 7.3-7.6), B0 7.6-15.6. GPUs 1-3 receive alike and send
    alike: one class, simulated on GPU 1. GPU 0 computes 15 s and idles 7.0-7.3; each of GPUs 1-3 computes 3 s, waits
    0.6 s on the two transfers and idles 12 s."""
    model = flops_model([(1.0, 0, 100.0), (1.0, 0, 0.0)])
    cluster = hand_cluster()
    plan = burst_plan(model, cluster, [1, 4], 4)
    assert burst_classes(model, cluster, plan) == {0: (0,), 1: (1, 2, 3)}
    sym, _ = assert_same(model, cluster, plan, NO_HOST)
    assert sym.iteration_time_s == pytest.approx(15.6)
    figures = [x for g in sym.per_gpu for x in (g.compute_s, g.exposed_comm_s, g.idle_s)]
    assert figures == pytest.approx([15.0, 0.3, 0.3] + [3.0, 0.6, 12.0] * 3)


def test_classes_follow_each_gpus_part_in_the_transfers() -> None:
    """Batch 8, l0 on GPUs 0-3 (2 samples each), l1 on GPUs 0-1 (4 each): GPU 0 keeps samples 0-1 and receives 2-3;
    GPU 1 sends 2-3 and receives 4-7; GPUs 2 and 3 only send (and get their gradients back from GPU 1): alike.
    With nothing moved (no output bytes) a consumer waits for the producers holding its samples, named by id: GPUs 2
    and 3 both wait for GPU 1's backward, still alike; l0 on GPUs 1, 0, 3, 2 and l1 on 0-3 make every GPU wait for
    another one: no two alike."""
    cluster = hand_cluster()
    moving = flops_model([(1.0, 10, 100.0), (1.0, 10, 0.0)])
    plan = burst_plan(moving, cluster, [4, 2], 8)
    assert burst_classes(moving, cluster, plan) == {0: (0,), 1: (1,), 2: (2, 3)}
    assert_same(moving, cluster, plan, NO_HOST)
    still = flops_model([(1.0, 10, 0.0), (1.0, 10, 0.0)])
    assert burst_classes(still, cluster, plan) == {0: (0,), 1: (1,), 2: (2, 3)}
    assert_same(still, cluster, plan, NO_HOST)
    swapped = burst_plan(still, cluster, [4, 4], 8, devices={0: (1, 0, 3, 2)})
    assert burst_classes(still, cluster, swapped) == {g: (g,) for g in range(4)}
    assert_same(still, cluster, swapped, NO_HOST)


def test_a_straggler_leaves_its_class() -> None:
    """Data parallelism over 4 GPUs is one class, but a GPU that computes 1.5 x slower is its own."""
    model = flops_model([(1.0, 500, 100.0), (1.0, 500, 0.0)])
    cluster = hand_cluster().with_slowdown({2: 1.5})
    plan = burst_plan(model, cluster, [4, 4], 8)
    assert burst_classes(model, hand_cluster(), plan) == {0: (0, 1, 2, 3)}
    assert burst_classes(model, cluster, plan) == {0: (0, 1, 3), 2: (2,)}
    sym, _ = assert_same(model, cluster, plan, NO_HOST)
    assert sym.per_gpu[2].idle_s < sym.per_gpu[0].idle_s  # the others wait for it at the all-reduces


def test_fair_sharing_and_every_gpu_simulate_every_gpu() -> None:
    model = flops_model([(1.0, 500, 100.0), (1.0, 500, 0.0)])
    cluster = hand_cluster(nodes=2, gpus_per_node=2)
    plan = burst_plan(model, cluster, [4, 4], 8)
    for options in (EVERY_GPU, replace(NO_HOST, link_sharing="fair")):
        r = simulate(model, cluster, plan, options=options)
        assert r.flow.represents == {g: (g,) for g in range(4)} and not r.flow.symmetric


def test_slice_bounds_are_split_samples() -> None:
    for batch, count in ((1, 1), (7, 3), (8, 4), (1024, 64), (1000, 7)):
        lo, hi = slice_bounds(batch, count)
        assert list(zip(lo.tolist(), hi.tolist(), strict=True)) == split_samples(batch, count)


# ------------------------------------------------------------------------------------------------ a property
@st.composite
def _scenario(draw: Any) -> tuple[Model, Plan, FlowOptions, dict[int, float]]:
    """A random DAG of 2-5 layers (a tied pair sometimes), each on a prefix or a random set of 8 GPUs (prefixes
    make classes), options and maybe a straggler."""
    n = draw(st.integers(2, 5))
    spec = []
    for i in range(n):
        flops = draw(st.sampled_from([0.1, 0.5, 1.0])) * 1e12
        out_bytes = draw(st.sampled_from([0.0, 100.0, 1500.0]))
        layer = {"name": f"l{i}", "op": f"op{i}", "flops": flops, "params": draw(st.integers(0, 2000)),
                 "out_bytes": out_bytes}  # fmt: skip
        if i >= 2 and draw(st.booleans()):
            layer["inputs"] = [f"l{draw(st.integers(0, i - 1))}"]
        spec.append(layer)
    if draw(st.booleans()):
        spec[-1]["tied_to"] = "l0"
    model = model_from_dict({"name": "hand", "layers": spec})
    batch = draw(st.integers(1, 12))
    layouts = []
    for _ in range(n):
        g = draw(st.integers(1, min(batch, 8)))
        prefix = draw(st.booleans())
        layouts.append(tuple(range(g)) if prefix else tuple(draw(st.permutations(range(8)))[:g]))
    plan = burst_plan(model, "hand", [len(d) for d in layouts], batch, devices=dict(enumerate(layouts)),
                      grad_sync=draw(st.sampled_from(["bulk", "wfbp"])))  # fmt: skip
    options = FlowOptions(host=draw(st.booleans()), link_sharing=draw(st.sampled_from(["structural", "serialize"])),
                          p2p_blocking=draw(st.booleans()))  # fmt: skip
    slow = {draw(st.integers(0, 7)): 1.5} if draw(st.booleans()) else {}
    return model, plan, options, slow


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scenario())
def test_symmetric_classes_change_nothing(scenario: tuple[Model, Plan, FlowOptions, dict[int, float]]) -> None:
    model, plan, options, slow = scenario
    cluster = replace(hand_cluster(nodes=2, gpus_per_node=4), gpu=replace(hand_cluster().gpu, kernel_launch_s=0.01))
    assert_same(model, cluster.with_slowdown(slow) if slow else cluster, plan, options)


def test_deeppool_plans_at_scale_are_a_few_simulated_gpus() -> None:
    """VGG-16's data parallelism over 64 GPUs is one simulated GPU, its burst plan (the last layers on fewer GPUs) a
    few, with every figure as when every GPU is simulated."""
    from distsim import get_cluster, get_model

    model, cluster = get_model("vgg16"), get_cluster("dgx-a100").with_nodes(8)
    dp = burst_plan(model, cluster, [64] * 21, 256)
    sym, _ = assert_same(model, cluster, dp, FlowOptions())
    assert list(sym.flow.represents) == [0]
    burst = burst_plan(model, cluster, [64] * 14 + [16] * 4 + [1] * 3, 256)
    sym, _ = assert_same(model, cluster, burst, FlowOptions())
    assert len(sym.flow.represents) <= 4

"""Burst plans (DeepPool) in the simulator: every layer data-parallel over its own GPUs, checked by hand.

The hand cluster moves 1000 bytes/s with no latency; layers given as FLOPs per sample cost FLOPs / 1e12 seconds on
its GPU (no launch cost, free memory traffic), so a layer's time scales with its shard: 1e12 FLOPs per sample is 1 s
per sample forward and 2 s backward.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distsim import FlowOptions, Strategy, simulate
from distsim.core.models import Model, model_from_dict
from distsim.io.files import load_plan, write_plan
from distsim.plans import Plan, PlanError, StagePlan, burst_plan, check_plan, plan_from_dict
from distsim.plans.burst_flow import build_burst_flow, estimate_burst_tasks
from distsim.plans.redistribution import redistribution, redistribution_cost, shards
from distsim.sim.costs import AnalyticCosts, CommEvent, ComputeEvent
from distsim.sim.flow.events import KINDS
from tests.util import hand_cluster, run_cli

NO_HOST = FlowOptions(host=False)


def flops_model(layers: list[tuple[float, int, float]], inputs: dict[int, list[int]] | None = None) -> Model:
    """Layers as (forward seconds per sample on the hand GPU, params, out_bytes per sample); `inputs`: layer ->
    the layers it takes (default: the previous one)."""
    spec: list[dict[str, Any]] = []
    for i, (per_sample_s, params, out_bytes) in enumerate(layers):
        layer: dict[str, Any] = {"name": f"l{i}", "op": f"op{i}", "flops": per_sample_s * 1e12, "params": params,
                                 "out_bytes": out_bytes}  # fmt: skip
        if inputs and i in inputs:
            layer["inputs"] = [f"l{u}" for u in inputs[i]]
        spec.append(layer)
    return model_from_dict({"name": "hand", "layers": spec})


def _tasks(result: Any, kind: str) -> list[tuple[str, tuple[int, ...], float, float]]:
    """(name, gpus, start, end) of every task of a kind."""
    f, t = result.flow, result.tasks
    k = KINDS.index(kind)
    return [(f.name[i], tuple(g for g, _ in f.slots[i]), t.start_s[i], t.end_s[i])
            for i in range(len(f)) if f.kind[i] == k]  # fmt: skip


# ------------------------------------------------------------------------------------------ re-distribution bytes
def test_redistribution_2_to_4_and_4_to_2_by_hand() -> None:
    # batch 8: GPUs 0,1 hold samples 0-3, 4-7; GPUs 0..3 need 0-1, 2-3, 4-5, 6-7
    wide = redistribution(8, (0, 1), (0, 1, 2, 3))
    assert wide.sent == {0: 2, 1: 4} and wide.received == {0: 0, 1: 2, 2: 2, 3: 2}
    assert wide.busiest_samples == 4 and wide.total_samples == 6  # GPU 1 sends 4 samples
    narrow = redistribution(8, (0, 1, 2, 3), (0, 1))
    assert narrow.sent == {0: 0, 1: 2, 2: 2, 3: 2} and narrow.received == {0: 2, 1: 4}
    assert narrow.busiest_samples == 4  # GPU 1 receives 4
    apart = redistribution(8, (0, 1), (2, 3))  # disjoint: everything moves, each GPU 4 samples
    assert apart.sent == {0: 4, 1: 4} and apart.received == {2: 4, 3: 4} and apart.busiest_samples == 4
    same = redistribution(8, (0, 1), (0, 1))
    assert same.busiest_samples == 0
    cluster = hand_cluster()
    cost, nbytes = redistribution_cost(AnalyticCosts(cluster), 8, 8, 100.0, (0, 1), (0, 1, 2, 3))
    assert nbytes == 400 and cost is not None and cost.seconds == pytest.approx(0.4)  # 400 B at 1000 B/s


def test_the_simulated_transfers_move_the_busiest_gpus_bytes() -> None:
    """2 -> 4 -> 2 GPUs at batch 8, 100 bytes per sample: each transfer 4 samples, 0.4 s, on the movers' streams."""
    model = flops_model([(0.1, 0, 100.0), (0.1, 0, 100.0), (0.1, 0, 0.0)])
    cluster = hand_cluster()
    plan = burst_plan(model, cluster, [2, 4, 2], 8)
    r = simulate(model, cluster, plan, options=replace(NO_HOST, symmetric=False))  # the flow's slots: every mover
    moves = sorted(_tasks(r, "p2p"), key=lambda x: x[2])
    assert [(name, gpus) for name, gpus, _, _ in moves] == [
        ("act l0 2->4 GPUs", (0, 1, 2, 3)),
        ("act l1 4->2 GPUs", (0, 1, 2, 3)),  # GPU 0 receives only: it moves too
        ("grad l1 2->4 GPUs", (0, 1, 2, 3)),
        ("grad l0 4->2 GPUs", (0, 1, 2, 3)),
    ]
    assert all(end - start == pytest.approx(0.4) for _, _, start, end in moves)


# ------------------------------------------------------------------------------------------------- hand timeline
def test_a_1_2_1_chain_by_hand() -> None:
    """Batch 2; l0 on GPU 0 (2 samples, F 2 s, B 4 s), l1 on GPUs 0-1 (1 sample each, F 2 s, B 4 s), l2 on GPU 0
    (F 1 s, B 2 s); l0 sends 100 B per sample, l1 300 B; no parameters.

    GPU 0: F0 0-2; it keeps sample 0, so F1 runs 2-4 at once; GPU 1 waits for its sample (0.1 s): F1 2.1-4.1; GPU 1
    sends sample 1 back (0.3 s, 4.1-4.4); F2 4.4-5.4, B2 5.4-7.4; the gradient of sample 1 to GPU 1 (0.3 s,
    7.4-7.7) while GPU 0 runs B1 7.4-11.4; GPU 1's B1 7.7-11.7; its gradient back to GPU 0 (0.1 s, 11.7-11.8);
    B0 11.8-15.8. GPU 0 idles 4-4.1 and 11.4-11.7 (0.4 s), waits 0.4 s on exposed transfers (4.1-4.4, 11.7-11.8)
    and computes 15 s; GPU 1 is busy 2-4.4 and 7.4-11.8 (6 s compute) and idles 9 s."""
    model = flops_model([(1.0, 0, 100.0), (2.0, 0, 300.0), (0.5, 0, 0.0)])
    cluster = hand_cluster()
    plan = burst_plan(model, cluster, [1, 2, 1], 2)
    assert plan.notation() == "burst 1x1,2x1,1x1" and plan.num_gpus == 2 and plan.global_batch_size == 2
    r = simulate(model, cluster, plan, options=NO_HOST)
    assert r.iteration_time_s == pytest.approx(15.8)
    g0, g1 = r.per_gpu
    assert (g0.compute_s, g0.exposed_comm_s, g0.idle_s) == pytest.approx((15.0, 0.4, 0.4))
    assert (g1.compute_s, g1.exposed_comm_s, g1.idle_s) == pytest.approx((6.0, 0.8, 9.0))
    starts = {(name, gpus): (round(s, 9), round(e, 9)) for name, gpus, s, e in _tasks(r, "forward")}
    assert starts[("l1", (0,))] == (2.0, 4.0) and starts[("l1", (1,))] == (2.1, 4.1)
    assert starts[("l2", (0,))] == (4.4, 5.4)
    assert r.fits_in_memory and [m.rank for m in r.memory] == [0, 1]


def test_planner_equality_on_a_chain_without_overlap() -> None:
    """Counts 1, 2, 4, 2 at batch 4 with parameters, bulk sync: every layer holds GPU 0, so the all-reduces queue
    on it after the backward and nothing overlaps; the iteration is DeepPool's S[L] = sum over layers of
    2 comm_in + comp(i, g_i) + sync(i, g_i), priced by the same functions (the optimizer step costs ~1e-27 s)."""
    layers = [(1.0, 0, 200.0), (3.0, 500, 100.0), (2.0, 1500, 300.0), (1.0, 250, 0.0)]
    counts = [1, 2, 4, 2]
    model = flops_model(layers)
    cluster = hand_cluster()
    costs = AnalyticCosts(cluster)
    batch = 4
    expected = 0.0
    layouts = [tuple(range(g)) for g in counts]
    for i, g in enumerate(counts):
        block = model.layers[i].blocks[0]
        comp = sum(costs.compute(ComputeEvent(block, ph, batch // g, 1, "fp16-mixed")).seconds for ph in "FB")
        comm = 0.0
        if i:
            cost, _ = redistribution_cost(costs, 8, batch, layers[i - 1][2], layouts[i - 1], layouts[i])
            comm = 2 * cost.seconds if cost is not None else 0.0
        sync = costs.comm(CommEvent("all_reduce", layers[i][1] * 2, g, "intra")).seconds if g > 1 else 0.0
        expected += comm + comp + sync
    # by hand: comp 12 + 18 + 6 + 6 = 42 s (F + 2F at B/g samples), comm 2 x (2 x 200 + 2 x 100 + 2 x 300 B) / 1000
    # = 2.4 s (the busiest GPU moves 2 samples each time), sync 1000, 3000, 500 B by ring, 2(n-1)/n: 1 + 4.5 + 0.5 s
    assert expected == pytest.approx(42 + 2.4 + 6.0)
    r = simulate(model, cluster, burst_plan(model, cluster, counts, batch), costs, NO_HOST)
    assert r.iteration_time_s == pytest.approx(expected)
    assert len(_tasks(r, "dp_allreduce")) == 3


def test_a_diamond_runs_its_branches_concurrently() -> None:
    """A on 4 GPUs -> {B on GPUs 0-1, C on GPUs 2-3} -> D on 4 GPUs, batch 4: A and D take 1 + 2 s per GPU, B 8 +
    16 s (2 samples per GPU), C 4 + 8 s, so the iteration is A + max(B, C) + D = 3 + 24 + 3 = 30 s. C's output (1000
    B per sample) moves 2 s before D and its gradient 2 s after: both hide behind the longer branch B."""
    model = flops_model([(1.0, 0, 0.0), (4.0, 0, 0.0), (2.0, 0, 1000.0), (1.0, 0, 0.0)],
                        inputs={2: [0], 3: [1, 2]})  # fmt: skip
    cluster = hand_cluster()
    plan = burst_plan(model, cluster, [4, 2, 2, 4], 4, devices={2: (2, 3)})
    assert plan.burst == ((0, 1, 2, 3), (0, 1), (2, 3), (0, 1, 2, 3))
    r = simulate(model, cluster, plan, options=NO_HOST)
    assert r.iteration_time_s == pytest.approx(30.0)
    fwd = {(name, gpus[0]): (s, e) for name, gpus, s, e in _tasks(r, "forward")}
    assert fwd[("l1", 0)] == pytest.approx((1.0, 9.0)) and fwd[("l2", 2)] == pytest.approx((1.0, 5.0))
    transfers = _tasks(r, "p2p")
    assert [n for n, *_ in transfers] == ["act l2 2->4 GPUs", "grad l2 4->2 GPUs"]
    assert [t for _, _, s, e in transfers for t in (s, e)] == pytest.approx([5.0, 7.0, 12.0, 14.0])
    # both branches on GPUs 0-1: they take turns, in model order (B's backward waits for C's, which waits 2 s for
    # its gradient): A + B + C + D + C's transfers, 3 + 24 + 12 + 3 + 2 x 2 s
    serial = simulate(model, cluster, burst_plan(model, cluster, [4, 2, 2, 4], 4), options=NO_HOST)
    assert serial.iteration_time_s == pytest.approx(46.0)


def test_wfbp_overlaps_each_layers_all_reduce_with_the_backward() -> None:
    model = flops_model([(1.0, 500, 0.0), (1.0, 500, 0.0)])
    cluster = hand_cluster()
    bulk = simulate(model, cluster, burst_plan(model, cluster, [2, 2], 2), options=NO_HOST)
    wfbp = simulate(model, cluster, burst_plan(model, cluster, [2, 2], 2, grad_sync="wfbp"), options=NO_HOST)
    # each layer: F 1 s, B 2 s on one sample; all-reduce of 1000 B over 2 GPUs: 1 s
    assert bulk.iteration_time_s == pytest.approx(6 + 2) and wfbp.iteration_time_s == pytest.approx(6 + 1)


def test_memory_counts_each_gpus_layers_and_shards() -> None:
    model = model_from_dict({"name": "m", "layers": [
        {"name": "a", "forward_s": 1.0, "params": 1000, "saved_bytes": 10.0},
        {"name": "b", "forward_s": 1.0, "params": 3000, "saved_bytes": 100.0}]})  # fmt: skip
    cluster = hand_cluster()
    r = simulate(model, cluster, burst_plan(model, cluster, [1, 4], 8), options=NO_HOST)
    m0, m1 = r.memory[0], r.memory[1]
    assert m0.states_bytes == 16 * 4000 and m0.activations_bytes == 8 * 10 + 2 * 100
    assert m1.states_bytes == 16 * 3000 and m1.activations_bytes == 2 * 100 and len(r.memory) == 4


# ------------------------------------------------------------------------------------------------ plan files
def test_burst_plan_files_round_trip(tmp_path: Path) -> None:
    model = flops_model([(1.0, 0, 0.0)] * 5)
    cluster = hand_cluster()
    counted = burst_plan(model, cluster, [1, 1, 8, 8, 2], 16, driver="test")
    placed = burst_plan(model, cluster, [1, 2, 2, 4, 1], 16, devices={1: (4, 5), 4: (7,)}, grad_sync="wfbp")
    for plan in (counted, placed):
        for name in ("p.yaml", "p.json"):
            write_plan(tmp_path / name, plan)
            assert load_plan(tmp_path / name) == plan
    text = (tmp_path / "p.yaml").read_text()
    assert "kind: burst" in text and "gpus: 4-5" in text
    write_plan(tmp_path / "c.yaml", counted)
    assert "counts: 1x2,8x2,2x1" in (tmp_path / "c.yaml").read_text()
    read = plan_from_dict({"model": "m", "cluster": "c", "batch": 8, "layers": [2, {"gpus": "4-7"}, {"gpus": [1]}]},
                          "p.yaml")  # fmt: skip
    assert read.kind == "burst" and read.burst == ((0, 1), (4, 5, 6, 7), (1,))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"kind": "burst", "counts": "8x3"}, "needs batch"),
        ({"batch": 8, "counts": "8y3"}, "cannot read counts part '8y3'"),
        ({"batch": 8, "counts": "1x2", "layers": [1]}, "either counts"),
        ({"batch": 8, "layers": [1, "0-3"]}, "layer 1: expected a GPU count or {gpus"),
        ({"batch": 8, "counts": "1x2", "schedule": "gpipe"}, "schedule does not apply to a burst plan"),
        ({"batch": 8, "counts": "1x2", "grad_sync": "ddp"}, "bulk or wfbp"),
        ({"batch": 8, "layers": [{"gpus": [0, 0]}]}, "lists GPU 0 twice"),
        ({"kind": "stages", "batch": 8}, "batch belongs to a burst plan"),
        ({"kind": "moe", "batch": 8}, "kind must be one of"),
    ],
)
def test_malformed_burst_plans_name_the_problem(data: dict[str, Any], message: str) -> None:
    with pytest.raises(PlanError) as info:
        plan_from_dict({"model": "m", "cluster": "c", **data}, "plan.yaml")
    assert message in str(info.value) and str(info.value).startswith("plan.yaml")


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ("batch: 32\ncounts: 8x20\n", "gives GPUs for 20 layers but the model has 21"),
        ("batch: 32\ncounts: 1x20,16\n", "layer 20 uses GPU 8, but the cluster has GPUs 0..7"),
        ("batch: 4\ncounts: 1x3,8x18\n", "layer 3 runs on 8 GPUs but the batch has only 4 samples"),
    ],
)
def test_burst_plans_that_do_not_fit_are_one_line_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], lines: str, message: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("kind: burst\nmodel: vgg16\ncluster: dgx-a100\nnodes: 1\n" + lines)
    code, out, err = run_cli(["simulate", "--plan", str(path)], capsys)
    assert code == 2 and not out and err.count("\n") == 1
    assert err.startswith(f"distsim: error: {path}: ") and message in err


def test_simulate_cli_runs_a_burst_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "burst.yaml"
    path.write_text("kind: burst\nmodel: vgg16\ncluster: dgx-a100\nnodes: 1\nbatch: 32\ncounts: 1x3,8x10,1x8\n")
    code, out, _ = run_cli(["simulate", "--plan", str(path)], capsys)
    assert code == 0
    assert "plan burst 1x3,8x10,1x8 (21 layers on 8 GPUs; one batch of 32 samples" in out
    assert "GPUs per layer     layers 0-2 on GPU 0; layers 3-12 on GPUs 0-7; layers 13-20 on GPU 0" in out
    assert "GPU 1 (+6 alike)" in out  # GPUs 1-7 idle alike while GPU 0 runs the narrow layers: one class


def test_check_plan_and_the_flow_refuse_what_does_not_fit() -> None:
    plan = Plan(model="m", cluster="c", strategy=Strategy(micro_batch_size=2), kind="burst", layout=((0,), (0, 1)))
    check_plan(plan, 2, 2)
    with pytest.raises(PlanError, match="GPUs for 2 layers but the model has 3"):
        check_plan(plan, 3, 2)
    with pytest.raises(PlanError, match="unknown plan kind 'bursts'"):
        Plan(model="m", cluster="c", kind="bursts", layout=((0,),))
    with pytest.raises(PlanError, match="GPU ids must be integers"):
        Plan(
            model="m",
            cluster="c",
            strategy=Strategy(micro_batch_size=2),
            kind="burst",
            layout=((0,), (StagePlan((0, 1), (0,)),)),
        )
    model = flops_model([(1.0, 0, 0.0)] * 2)
    with pytest.raises(PlanError, match="always simulated GPU by GPU"):
        build_burst_flow(model, hand_cluster(), plan, AnalyticCosts(hand_cluster()), FlowOptions(symmetric=True))


# ------------------------------------------------------------------------------------------------- invariants
@st.composite
def _scenario(draw: Any) -> tuple[Model, Plan, FlowOptions]:
    n = draw(st.integers(2, 5))
    layers = [(draw(st.sampled_from([0.1, 0.5, 1.0])), draw(st.integers(0, 2000)),
               draw(st.sampled_from([0.0, 100.0, 1500.0]))) for _ in range(n)]  # fmt: skip
    inputs = {i: [draw(st.integers(0, i - 1))] for i in range(2, n) if draw(st.booleans())}  # branches
    batch = draw(st.integers(1, 6))
    layouts = [tuple(draw(st.permutations(range(8)))[: draw(st.integers(1, min(batch, 8)))]) for _ in range(n)]
    model = flops_model(layers, inputs)
    counts = [len(d) for d in layouts]
    plan = burst_plan(model, "hand", counts, batch, devices=dict(enumerate(layouts)),
                      grad_sync=draw(st.sampled_from(["bulk", "wfbp"])))  # fmt: skip
    options = FlowOptions(host=draw(st.booleans()), link_sharing=draw(st.sampled_from(["structural", "serialize"])),
                          p2p_blocking=draw(st.booleans()))  # fmt: skip
    return model, plan, options


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scenario())
def test_burst_invariants(scenario: tuple[Model, Plan, FlowOptions]) -> None:
    """No two events overlap on one stream of one GPU, the task estimate bounds the flow, and more bandwidth or
    faster compute never makes the iteration slower."""
    model, plan, options = scenario
    cluster = replace(hand_cluster(nodes=2, gpus_per_node=4), gpu=replace(hand_cluster().gpu, kernel_launch_s=0.01))
    r = simulate(model, cluster, plan, options=options)
    df = r.timeline.df
    for _, rows in df[df["stream"] != "host"].groupby(["gpu", "stream"], observed=True):
        s, e = rows["start_s"].to_numpy(), rows["end_s"].to_numpy()
        order = np.argsort(s, kind="stable")
        assert np.all(s[order][1:] >= e[order][:-1] - 1e-9)
    assert len(r.flow) <= estimate_burst_tasks(model, cluster, plan, AnalyticCosts(cluster), options)
    faster = [replace(cluster, intra=replace(cluster.intra, bandwidth_bytes_per_s=4000.0)),
              replace(cluster, inter=replace(cluster.inter, bandwidth_bytes_per_s=3000.0)),
              replace(cluster, gpu=replace(cluster.gpu, peak_flops_per_s=2e12))]  # fmt: skip
    for better in faster:
        assert simulate(model, better, plan, options=options).iteration_time_s <= r.iteration_time_s + 1e-9


def test_every_layer_on_every_gpu_is_data_parallelism() -> None:
    """VGG-16 on 8 A100s, batch 32: a burst plan of 8 GPUs per layer with WFBP is the uniform 1M1P8D strategy (4
    samples per GPU, one all-reduce per layer right after its backward), host launches included."""
    from distsim import Strategy, get_cluster, get_model

    model, cluster = get_model("vgg16"), replace(get_cluster("dgx-a100"), nodes=1)
    uniform = simulate(model, cluster, Strategy(dp=8, micro_batch_size=4, grad_sync="wfbp"))
    burst = simulate(model, cluster, burst_plan(model, cluster, [8] * 21, 32, grad_sync="wfbp"))
    assert burst.iteration_time_s == pytest.approx(uniform.iteration_time_s, rel=1e-12)
    assert burst.memory[0].total_bytes == pytest.approx(uniform.memory[0].total_bytes, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.data())
def test_redistribution_sweep_equals_every_pair_of_slices(batch: int, data: Any) -> None:
    """The linear sweep of :func:`redistribution` against the overlap of every pair of slices."""
    gpus = list(range(12))
    src = tuple(data.draw(st.permutations(gpus))[: data.draw(st.integers(1, min(batch, 12)))])
    dst = tuple(data.draw(st.permutations(gpus))[: data.draw(st.integers(1, min(batch, 12)))])
    have, need = shards(batch, src), shards(batch, dst)
    sent, received = dict.fromkeys(src, 0), dict.fromkeys(dst, 0)
    for g, (lo, hi) in have.items():
        for h, (lo2, hi2) in need.items():
            if g != h and min(hi, hi2) > max(lo, lo2):
                sent[g] += min(hi, hi2) - max(lo, lo2)
                received[h] += min(hi, hi2) - max(lo, lo2)
    moved = redistribution(batch, src, dst)
    assert moved.sent == sent and moved.received == received

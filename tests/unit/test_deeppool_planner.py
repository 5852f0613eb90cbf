"""DeepPool's planner (ALGORITHMS.md 1.4-1.5): hand-computed chains and a diamond, its fallback, the counts it
drops, the graphs it refuses, brute force on small DAGs, and the CLI. No case has a tie, so the paper's ``<=`` and
the authors' code's ``<`` give the same answers (ALGORITHMS.md 1.4)."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distsim import FlowOptions, simulate
from distsim.core.cluster import get_cluster
from distsim.core.models import Model, model_from_dict
from distsim.core.models.zoo import get_model
from distsim.io.files import load_plan
from distsim.plans.redistribution import redistribution, shards
from distsim.search.deeppool import (
    Block,
    Branch,
    BurstError,
    BurstProblem,
    decompose,
    evaluate,
    feasible_counts,
    plan,
    plan_deeppool,
    plan_linear,
    power_counts,
    side_by_side,
)
from distsim.sim.costs import AnalyticCosts
from tests.util import hand_cluster, run_cli

approx = pytest.approx


def burst_chain(limit: float) -> BurstProblem:
    """Three layers on 1 or 4 GPUs; a layout change costs 0.5. L0 and L2 are fc-like (compute scales, but the
    all-reduce at 4 GPUs costs 2.0); L1 is a wide conv (8.0 on one GPU, 2.0 on four, no parameters)."""
    return BurstProblem.chain(
        comp=[[1.0, 0.25], [8.0, 2.0], [1.0, 0.25]],
        sync=[[0.0, 2.0], [0.0, 0.0], [0.0, 2.0]],
        counts=(1, 4),
        comm=lambda i, h, g: 0.0 if h == g else 0.5,
        amp_limit=limit,
    )


def test_bursting_the_wide_layer_wins() -> None:
    # L0: S = [1.0, 2.25], Amp = [1, 9].  L1@1: from L0@1, S = 1 + 8 = 9 (L0@4 is over the limit);
    # L1@4: from L0@1, S = 1 + 0.5 + 2 = 3.5, T = 2.5, Amp = 2.5 * 4 / 8 = 1.25.
    # L2@1: min(9 + 0, 3.5 + 0.5) + 1 = 5.0; L2@4: min(9.5, 3.5) + 2.25 = 5.75. Best: L2@1 <- L1@4 <- L0@1.
    r = plan_linear(burst_chain(2.0))
    assert r.gpus == (1, 4, 1)
    assert r.time_s == approx(5.0)
    assert r.layer_s == approx((1.0, 2.5, 1.5))
    assert r.amp == approx((1.0, 1.25, 1.5))
    assert r.gpu_seconds == approx(1.0 + 2.5 * 4 + 1.5)
    assert r.over_limit == ()
    # plain data parallelism over the 4 GPUs: 2.25 + 2 + 2.25, and 4x that in GPU-seconds
    dp = evaluate(burst_chain(2.0), [4, 4, 4])
    assert (dp.time_s, dp.gpu_seconds) == (approx(6.5), approx(26.0))


def test_the_amplification_limit_forbids_the_burst() -> None:
    # with the limit at 1.2, L1@4 (Amp 1.25) is no longer an admissible predecessor of L2:
    # L2@1 = 9 + 1 = 10.0, L2@4 = 9.5 + 2.25 = 11.75
    r = plan_linear(burst_chain(1.2))
    assert r.gpus == (1, 1, 1)
    assert r.time_s == approx(10.0)
    assert r.amp == approx((1.0, 1.0, 1.0))
    assert r.over_limit == ()


def fallback_chain(limit: float) -> BurstProblem:
    """Counts 2 and 4 only: L0 does not scale (1.0 on one GPU, 1.0 on two, 0.9 on four), so Amp(L0) is 2.0 or 3.6;
    L1 scales (0.5, 0.25). A layout change costs 0.3."""
    return BurstProblem.chain(
        comp=[[1.0, 0.9], [0.5, 0.25]], counts=(2, 4), single=[1.0, 1.0],
        comm=lambda i, h, g: 0.0 if h == g else 0.3, amp_limit=limit,
    )  # fmt: skip


def test_fallback_when_every_option_breaks_the_limit() -> None:
    # limit 1.5: both of L0's counts break it. The first (h=2, Amp 2.0) is admitted anyway, after which only an
    # option at most that amplified is: L0@4 (Amp 3.6), though faster, is not.
    # L1@2 = 1.0 + 0.5 = 1.5; L1@4 = (1.0 + 0.3) + 0.25 = 1.55 -> L1@2.
    r = plan_linear(fallback_chain(1.5))
    assert r.gpus == (2, 2)
    assert r.time_s == approx(1.5)
    assert r.amp == approx((2.0, 1.0))
    assert r.over_limit == (0,)
    # without the limit L0@4 is taken: L1@4 = 0.9 + 0.25 = 1.15
    free = plan_linear(fallback_chain(100.0))
    assert free.gpus == (4, 4)
    assert free.time_s == approx(1.15)


def diamond(limit: float = 2.0) -> BurstProblem:
    """A -> {B, C} -> D on 1 or 2 GPUs, a layout change 0.1 on every edge. B scales perfectly (4.0, 2.0); C does not
    pay off (1.0, or 0.75 + a 1.0 all-reduce)."""
    return BurstProblem.from_tables(
        names=["A", "B", "C", "D"], inputs=[(), (0,), (0,), (1, 2)], counts=(1, 2),
        comp=[[1.0, 0.6], [4.0, 2.0], [1.0, 0.75], [1.0, 0.5]],
        sync=[[0, 0], [0, 0], [0, 1.0], [0, 0]],
        comm={e: [[0.0, 0.1], [0.1, 0.0]] for e in [(0, 1), (0, 2), (1, 3), (2, 3)]},
        amp_limit=limit,
    )  # fmt: skip


def test_diamond_branch_join_by_hand() -> None:
    # A: S = [1.0, 0.6], Amp = [1.0, 1.2].  Per entry config g0 (rows) and own config (columns):
    #   S_B = [[5.0, 3.1], [4.7, 2.6]], Amp_B = [[1, 1.05], [1.025, 1]]
    #   S_C = [[2.0, 2.85], [1.7, 2.35]], Amp_C = [[1, 3.7], [1.1, 3.5]] (C on 2 GPUs is over the limit)
    # Arrival at D (rows g0, columns D's count), each branch's best admissible end:
    #   B: [[3.2, 3.1], [2.7, 2.6]] (B on 2 GPUs);  C: [[2.0, 2.1], [1.7, 1.8]] (C on 1 GPU)
    # The branches run concurrently: max = B's.  D picks g0 = 2 for both counts: S_D = [2.7 + 1.0, 2.6 + 0.5].
    p = diamond()
    assert decompose(p.names, p.inputs) == Branch((0, Block((Branch((1,)), Branch((2,))), 3)))
    r = plan(p)
    assert r.gpus == (2, 2, 1, 2)
    assert r.time_s == approx(3.1)
    # T: A 0.6; B 2.0 (no layout change); C 0.1 + 1.0; D: the changes from both branches (0 + 0.1) + 0.5
    assert r.layer_s == approx((0.6, 2.0, 1.1, 0.6))
    assert r.amp == approx((1.2, 1.0, 1.1, 1.2))
    assert r.gpu_seconds == approx(0.6 * 2 + 2.0 * 2 + 1.1 + 0.6 * 2)
    # concurrent, not serial: the join waits for the slower branch only
    assert r.time_s == approx(evaluate(p, r.gpus).time_s)
    assert r.time_s < 0.6 + 2.0 + 1.1 + 0.6


def test_diamond_without_the_limit_is_the_brute_force_optimum() -> None:
    p = replace(diamond(), amp_limit=math.inf)
    best = min(evaluate(p, a).time_s for a in itertools.product(p.counts, repeat=4))
    assert plan(p).time_s == approx(best)


# --------------------------------------------------------------------------------- brute force on random DAGs
GRAPHS = {
    "chain": [(), (0,), (1,), (2,)],
    "diamond with a direct edge": [(), (0,), (0, 1), (2,)],
    "a branch that forks to the join": [(), (0,), (0,), (2,), (2,), (1, 3, 4), (5,)],
    "nested blocks": [(), (0,), (1,), (1,), (2, 3), (0,), (4, 5), (6,)],
    "two blocks back to back": [(), (0,), (0,), (1, 2), (3,), (3,), (4, 5)],
}


def random_problem(inputs: list[tuple[int, ...]], draw: st.DrawFn, limit: float) -> BurstProblem:
    counts = (1, 2, 4)
    t = st.floats(0.05, 5.0)
    comp = [[draw(t) for _ in counts] for _ in inputs]
    sync = [[0.0 if g == 1 else draw(t) for g in counts] for _ in inputs]
    comm = {(i, j): [[0.0 if h == g else draw(t) for g in counts] for h in counts]
            for j, ins in enumerate(inputs) for i in ins}  # fmt: skip
    names = [f"n{i}" for i in range(len(inputs))]
    return BurstProblem.from_tables(names, inputs, counts, comp, comm, sync, amp_limit=limit)


@settings(max_examples=20, deadline=None)
@given(st.sampled_from(sorted(GRAPHS)), st.data())
def test_without_a_limit_the_dp_is_optimal(name: str, data: st.DataObject) -> None:
    """Branches are independent given their entry's and join's counts, so with no limit the reduction is exact."""
    p = random_problem(GRAPHS[name], data.draw, math.inf)
    r = plan(p)
    best = min(evaluate(p, a).time_s for a in itertools.product(p.counts, repeat=p.num_layers))
    assert r.time_s == approx(best, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(GRAPHS)), st.data(), st.floats(1.0, 3.0))
def test_the_predicted_time_is_the_plans_longest_path(name: str, data: st.DataObject, limit: float) -> None:
    p = random_problem(GRAPHS[name], data.draw, limit)
    r = plan(p)
    assert r.time_s == approx(evaluate(p, r.gpus).time_s, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(1, 12), st.integers(1, 12), st.integers(0, 5))
def test_redistribution_matches_the_pairwise_overlaps(batch: int, h: int, g: int, offset: int) -> None:
    src, dst = tuple(range(h)), tuple(range(offset, offset + g))
    have, need = shards(batch, src), shards(batch, dst)
    sent = dict.fromkeys(src, 0)
    received = dict.fromkeys(dst, 0)
    for a, (lo, hi) in have.items():
        for b, (lo2, hi2) in need.items():
            overlap = max(0, min(hi, hi2) - max(lo, lo2))
            if a != b:
                sent[a] += overlap
                received[b] += overlap
    moved = redistribution(batch, src, dst)
    assert (moved.sent, moved.received) == (sent, received)


# ------------------------------------------------------------------------------------- the plan it hands over
def hand_model(layers: list[tuple[float, int, float]]) -> Model:
    """A chain of (forward seconds per sample on the hand GPU, params, out_bytes per sample)."""
    spec = [{"name": f"l{i}", "op": f"op{i}", "flops": s * 1e12, "params": p, "out_bytes": b}
            for i, (s, p, b) in enumerate(layers)]  # fmt: skip
    return model_from_dict({"name": "hand", "layers": spec})


def test_the_plan_simulates_to_the_planners_time_on_a_chain() -> None:
    """On the hand cluster (1000 B/s, no latency, free optimizer step), batch 4, counts 1, 2, 4. l0 and l2 are
    fc-like (F + B = 0.3 s per sample, 2000 parameters: a 4000-byte all-reduce costs 4 s on 2 GPUs, 6 s on 4), l1
    is a wide conv (3 s per sample, no parameters). The planner bursts l1 alone: 1.2 + (2 x 0.3 + 3) + (2 x 0.3 +
    1.2) = 6.6 s (each layout change: GPU 0 sends or receives 3 samples of 100 bytes). A chain with bulk all-reduces
    overlaps nothing, so the simulator's iteration is the planner's S."""
    model = hand_model([(0.1, 2000, 100.0), (1.0, 0, 100.0), (0.1, 2000, 0.0)])
    cluster = hand_cluster()
    result = plan_deeppool(model, cluster, AnalyticCosts(cluster), 8, 4)
    assert result.best.gpus == (1, 4, 1) and result.dropped == (8,)
    assert result.best.time_s == approx(6.6)
    plan = result.plan()
    assert plan.kind == "burst" and plan.burst == ((0,), (0, 1, 2, 3), (0,)) and plan.strategy.micro_batch_size == 4
    assert plan.note["planner_estimate_s"] == approx(6.6)
    sim = simulate(model, cluster, plan, AnalyticCosts(cluster), FlowOptions(host=False))
    assert sim.iteration_time_s == approx(result.best.time_s)


def test_side_by_side_puts_concurrent_branches_on_their_own_gpus() -> None:
    p = diamond()
    top = decompose(p.names, p.inputs)
    # B (2 GPUs) is the wider branch: it keeps the block's first GPUs, C goes next to it
    assert side_by_side(top, (2, 2, 1, 2), 4) == {0: (0, 1), 1: (0, 1), 2: (2,), 3: (0, 1)}
    # 2 + 2 GPUs do not fit in 3: both branches from GPU 0
    assert side_by_side(top, (2, 2, 2, 2), 3) == {0: (0, 1), 1: (0, 1), 2: (0, 1), 3: (0, 1)}


# ------------------------------------------------------------------------------------------- named errors
def test_counts_above_the_batch_are_dropped() -> None:
    assert feasible_counts((1, 2, 4, 8, 16), batch=4, gpus=16) == ((1, 2, 4), (8, 16))
    with pytest.raises(BurstError, match="exceeds the global batch 4"):
        feasible_counts((8, 16), batch=4, gpus=16)
    assert power_counts(8) == (1, 2, 4, 8) and power_counts(24) == (1, 2, 4, 8, 16, 24)


def test_a_batch_smaller_than_the_gpus_has_no_data_parallel_baseline() -> None:
    cluster = get_cluster("dgx-a100").with_nodes(1)
    r = plan_deeppool(get_model("vgg16"), cluster, AnalyticCosts(cluster), 8, batch=4)
    assert r.dropped == (8,) and r.best.counts == (1, 2, 4) and r.dp is None
    assert max(r.best.gpus) <= 4


def test_graphs_the_reduction_cannot_take() -> None:
    names = [f"n{i}" for i in range(5)]
    with pytest.raises(BurstError, match="'n2' joins branches that do not open at one layer"):
        decompose(names[:4], [(), (0,), (0, 1), (1, 2)])  # n1 -> n2 crosses from one branch into another
    with pytest.raises(BurstError, match="needs one first and one last layer"):
        decompose(names[:3], [(), (), (0, 1)])
    with pytest.raises(BurstError, match="t5-base: the layer graph is not a chain of branch/join blocks"):
        cluster = get_cluster("dgx-a100").with_nodes(1)
        plan_deeppool(get_model("t5-base"), cluster, AnalyticCosts(cluster), 8, 32)


def test_a_layer_without_an_output_size_is_refused() -> None:
    model = get_model("vgg16")
    layers = list(model.layers)
    layers[3] = replace(layers[3], out_bytes=0.0)
    cluster = get_cluster("dgx-a100").with_nodes(1)
    with pytest.raises(BurstError, match="layer 'conv2_1' has no output size"):
        plan_deeppool(model.with_layers(tuple(layers)), cluster, AnalyticCosts(cluster), 8, 32)


def test_an_amplification_limit_below_one_is_refused() -> None:
    with pytest.raises(BurstError, match="at least 1"):
        burst_chain(0.5)


# ------------------------------------------------------------------------------------------------- the CLI
def test_cli_vgg16_on_one_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["search", "deeppool", "--model", "vgg16", "--cluster", "dgx-a100", "--nodes", "1", "--global-batch", "32"]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    assert "GPUs per layer:" in out and "layers 0-" in out
    assert "burst plan" in out and "data parallel x8" in out and "amplification" in out and "simulated" in out
    assert "wrote deeppool.plan.yaml" in out and (tmp_path / "deeppool.plan.yaml").exists()
    code, out, err = run_cli([*args, "--json", "--plan-out", "", "--no-simulate"], capsys)
    data = json.loads(out)
    assert code == 0 and len(data["plan"]["gpus"]) == 21 and data["data_parallel"]["gpus"] == [8] * 21
    assert data["written"] == [] and data["simulated_s"] == {"plan": None, "data_parallel": None}


def test_cli_writes_a_plan_the_simulator_takes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "vgg.plan.yaml"
    args = ["search", "deeppool", "--model", "vgg16", "--cluster", "dgx-a100", "--nodes", "1", "--global-batch", "32",
            "--plan-out", str(out_file), "--json"]  # fmt: skip
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    data = json.loads(out)
    plan = load_plan(out_file)
    assert plan.kind == "burst" and [len(d) for d in plan.burst] == data["plan"]["gpus"]
    assert plan.note["predicted_iteration_s"] == approx(data["simulated_s"]["plan"], rel=1e-6)
    code, out, err = run_cli(["simulate", "--plan", str(out_file), "--json"], capsys)
    assert code == 0 and json.loads(out)["iteration_time_s"] == approx(data["simulated_s"]["plan"])


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--amp-limit", "0.5"], "amplification limit must be at least 1"),
        (["--counts", "64,128"], "no candidate GPU count fits"),
        (["--model", "t5-base"], "not a chain of branch/join blocks"),
    ],
)
def test_cli_errors_are_one_line(capsys: pytest.CaptureFixture[str], extra: list[str], needle: str) -> None:
    args = ["search", "deeppool", "--model", "vgg16", "--cluster", "dgx-a100", "--nodes", "1", "--global-batch", "32"]
    code, _, err = run_cli([*args, *extra, "--plan-out", ""], capsys)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_cli_warns_of_layers_over_the_limit(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["search", "deeppool", "--model", "inception-v3", "--cluster", "dgx-a100", "--nodes", "1",
            "--global-batch", "32", "--quiet", "--plan-out", "", "--no-simulate"]  # fmt: skip
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    assert "warning:" in out and "exceed the amplification limit 2" in out


def test_cli_collocates_a_background_job_with_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    """--background: the burst plan's idle GPUs host the background job; the foreground is never faster."""
    args = ["search", "deeppool", "--model", "vgg16", "--cluster", "dgx-a100", "--nodes", "1", "--global-batch", "32",
            "--plan-out", "", "--background", "vgg16", "--background-batch", "4", "--json"]  # fmt: skip
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    data = json.loads(out)
    col = data["collocation"]
    assert col["foreground_alone_iteration_s"] == approx(data["simulated_s"]["plan"])
    assert col["foreground_collocated_iteration_s"] >= col["foreground_alone_iteration_s"]
    assert col["background_samples_per_s"] > 0 and col["static_splits"]
    code, _, err = run_cli([*args[:-1], "--no-simulate"], capsys)
    assert code == 2 and "drop --no-simulate" in err and len(err.strip().splitlines()) == 1

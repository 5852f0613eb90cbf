"""``distsim search merge`` (MG-WFBP, ALGORITHMS.md 2): the simulator reproduces MG-WFBP's timeline on a hand case,
the CLI compares every mode and writes a plan that ``simulate --plan`` reproduces, MG-WFBP converges to SyncEASGD
under ring all-reduce as the workers grow, and the planner handles a 600-layer chain.

The hand cases use one node of n GPUs whose intra-node link has latency `lat` and bandwidth `bw`, so a ring
all-reduce of M bytes takes exactly 2(n-1) lat + 2(n-1)/n M / bw (MG-WFBP's a + b M), with the host not modelled and
an optimizer step of ~1e-27 s (tests/util.py's HAND_GPU).
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest

from distsim import AnalyticCosts, Cluster, FlowOptions, Strategy, get_cluster, get_model, simulate
from distsim.core import mgwfbp as mg
from distsim.core.models import Model
from distsim.search.merge import MergeSearchError, cluster_of, compare_sync, sweep_workers
from distsim.sim.flow.uniform import merge_groups
from tests.util import chain_model, hand_cluster, run_cli

HOST_OFF = FlowOptions(host=False)


def close(x: float, y: float) -> bool:
    return math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-12)


def hand_case(
    t_f: float, t_b: list[float], params: list[int], n: int, lat: float, bw: float
) -> tuple[Model, Cluster, mg.MergeProblem]:
    """A chain model (forward t_f spread evenly; fp16: 2 gradient bytes per parameter) on one node of n GPUs, and the
    MG-WFBP problem it is: a = 2(n-1) lat, b = 2(n-1) / (n bw)."""
    layers = [(t_f / len(t_b), b, p, 100.0) for b, p in zip(t_b, params, strict=True)]
    model = chain_model(layers)
    cluster = hand_cluster(nodes=1, gpus_per_node=n, intra_bw=bw, intra_lat=lat)
    problem = mg.MergeProblem(t_f, tuple(t_b), tuple(2.0 * p for p in params), 2 * (n - 1) * lat,
                              2 * (n - 1) / (n * bw))  # fmt: skip
    return model, cluster, problem


def sim_s(model: Model, cluster: Cluster, **strategy: Any) -> float:
    s = Strategy(dp=cluster.num_gpus, **strategy)
    return simulate(model, cluster, s, AnalyticCosts(cluster), HOST_OFF).iteration_time_s


def in_layer_order(groups: mg.Groups) -> tuple[tuple[int, int], ...]:
    return tuple(sorted(groups))


# ------------------------------------------------------------------------- (a) simulator == MG-WFBP's timeline
# Six layers: t_f = 0.105, t_b = (0.05, 0.02, 0.08, 0.03, 0.06, 0.04), p = 2 x (10, 40, 5, 30, 20, 25) bytes on 4 GPUs
# with lat = 2 ms and bw = 1000 B/s: a = 12 ms, b = 1.5 ms per byte.
SIX = (0.105, [0.05, 0.02, 0.08, 0.03, 0.06, 0.04], [10, 40, 5, 30, 20, 25], 4, 0.002, 1000.0)


def test_wfbp_bulk_and_a_given_merge_plan_simulate_to_the_mgwfbp_timeline() -> None:
    model, cluster, problem = hand_case(*SIX)
    assert close(sim_s(model, cluster, grad_sync="wfbp"), mg.wfbp(problem).t_iter)
    assert close(sim_s(model, cluster, grad_sync="bulk"), mg.sync_easgd(problem).t_iter)  # SyncEASGD, Eq. 9
    given = ((0, 3), (3, 6))
    expected = mg.timeline(problem, tuple(reversed(given))).t_iter
    assert close(sim_s(model, cluster, grad_sync="mgwfbp", grad_groups=given), expected)
    assert mg.wfbp(problem).t_iter != expected != mg.sync_easgd(problem).t_iter  # three different iterations


def test_planned_merges_are_the_papers_greedy_and_the_exact_dp() -> None:
    model, cluster, problem = hand_case(*SIX)
    for mode, planner in (("mgwfbp", mg.greedy), ("mgwfbp-optimal", mg.optimal)):
        found = planner(problem)
        s = Strategy(dp=4, grad_sync=mode)
        assert merge_groups(model, cluster, s, AnalyticCosts(cluster), HOST_OFF) == in_layer_order(found.groups)
        assert close(sim_s(model, cluster, grad_sync=mode), found.t_iter)
    assert mg.greedy(problem).t_iter < mg.wfbp(problem).t_iter  # the case does merge


def test_the_greedy_counterexample_simulates_to_32_50_against_the_optimum_30_80() -> None:
    """ALGORITHMS.md 2.3's verified counterexample (t_f = 1.52, a = 2.68, b = 1.65), with p scaled to 200 x whole
    bytes (b per byte = 1.65 / 200) on 2 GPUs: the greedy merges layers {4, 2} (32.50), the optimum {3, 2} (30.80)."""
    model, cluster, problem = hand_case(1.52, [2.56, 3.84, 1.70, 2.77], [419, 40, 373, 450], 2, 1.34, 200 / 1.65)
    assert math.isclose(problem.a, 2.68) and math.isclose(problem.b * 200, 1.65)
    greedy_s, optimal_s = sim_s(model, cluster, grad_sync="mgwfbp"), sim_s(model, cluster, grad_sync="mgwfbp-optimal")
    assert close(greedy_s, mg.greedy(problem).t_iter) and round(greedy_s, 2) == 32.50
    assert close(optimal_s, mg.optimal(problem).t_iter) and round(optimal_s, 2) == 30.80
    result = compare_sync(model, cluster, Strategy(dp=2), AnalyticCosts(cluster), options=HOST_OFF)
    assert [g.layers for g in result.result("mgwfbp").groups] == [(0, 2), (2, 4)]
    assert [g.layers for g in result.result("mgwfbp-optimal").groups] == [(0, 3), (3, 4)]


def test_compare_sync_reports_each_mode_as_simulated() -> None:
    model, cluster, problem = hand_case(*SIX)
    result = compare_sync(model, cluster, Strategy(dp=4), AnalyticCosts(cluster), options=HOST_OFF)
    assert [r.mode for r in result.results] == ["bulk", "wfbp", "ddp", "mgwfbp", "mgwfbp-optimal"]
    wfbp_tl, greedy_tl = mg.wfbp(problem), mg.greedy(problem)
    for r, tl in ((result.result("wfbp"), wfbp_tl), (result.result("bulk"), mg.sync_easgd(problem)),
                  (result.result("mgwfbp"), greedy_tl)):  # fmt: skip
        assert close(r.iteration_time_s, tl.t_iter)
        assert r.allreduces == tl.num_messages
        assert close(r.exposed_comm_s, tl.non_overlapped_s)  # only communication is ever exposed here
        assert close(r.speedup_vs_wfbp, wfbp_tl.t_iter / tl.t_iter)
    groups = result.result("mgwfbp").groups
    assert tuple(g.layers for g in groups) == in_layer_order(greedy_tl.groups)
    assert [g.nbytes for g in groups] == [2 * sum(SIX[2][lo:hi]) for lo, hi in (g.layers for g in groups)]
    assert result.result("bulk").groups == () and result.result("wfbp").groups == ()
    planned = result.plan_strategy("greedy")
    assert planned.grad_sync == "mgwfbp" and planned.grad_groups == in_layer_order(greedy_tl.groups)
    assert close(sim_s(model, cluster, grad_sync="mgwfbp", grad_groups=planned.grad_groups), greedy_tl.t_iter)


def test_compare_sync_refuses_what_it_cannot_compare() -> None:
    model, cluster, _ = hand_case(*SIX)
    with pytest.raises(MergeSearchError, match="dp = 1: nothing to synchronise"):
        compare_sync(model, hand_cluster(1, 1), Strategy())
    with pytest.raises(MergeSearchError, match="unknown gradient synchronisation 'nope'; choose from bulk, wfbp"):
        compare_sync(model, cluster, Strategy(dp=4), modes=["nope"])
    only = compare_sync(model, cluster, Strategy(dp=4), modes=["bulk"])
    assert [r.mode for r in only.results] == ["bulk", "wfbp"]  # the baseline is always there


# ---------------------------------------------------------------------------------------------- (b) the CLI
def test_cli_compares_every_mode_and_its_plan_simulates_to_the_same_prediction(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "m.plan.yaml"
    args = ["search", "merge", "--model", "resnet50", "--cluster", "v100-10gbe", "--micro-batch-size", "32",
            "--out", str(plan)]  # fmt: skip
    rc, out, err = run_cli(args, capsys)
    assert rc == 0, err
    for mode in ("bulk", "wfbp", "ddp", "mgwfbp", "mgwfbp-optimal"):
        assert any(line.split()[:1] == [mode] for line in out.splitlines()), mode
    assert "strategy 1M1P16D" in out and "merge plan (mgwfbp: MG-WFBP's greedy" in out
    assert "layers 0-" in out and " MB" in out and f"wrote {plan}" in out
    rc, out, err = run_cli([*args, "--json"], capsys)
    assert rc == 0, err
    data = json.loads(out)
    predicted = {m["mode"]: m["iteration_time_s"] for m in data["comparison"]["modes"]}
    rc, out, err = run_cli(["simulate", "--plan", str(plan), "--json"], capsys)
    assert rc == 0, err
    simulated = json.loads(out)
    assert "sync=mgwfbp groups=0-" in simulated["strategy_detail"]
    assert simulated["iteration_time_s"] == pytest.approx(predicted["mgwfbp"], rel=1e-12)
    rc, _, err = run_cli([*args, "--choose", "optimal", "--allreduce", "ring", "--modes", "wfbp"], capsys)
    assert rc == 0, err
    rc, out, err = run_cli(["simulate", "--plan", str(plan), "--allreduce", "ring", "--json"], capsys)
    assert rc == 0, err
    rc, again, _ = run_cli([*args, "--choose", "optimal", "--allreduce", "ring", "--json", "--out", ""], capsys)
    optimal = next(m for m in json.loads(again)["comparison"]["modes"] if m["mode"] == "mgwfbp-optimal")
    assert json.loads(out)["iteration_time_s"] == pytest.approx(optimal["iteration_time_s"], rel=1e-12)


def test_cli_sweep_prints_the_scaling_table_and_plots_and_writes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png, csv = tmp_path / "s.png", tmp_path / "s.csv"
    rc, out, err = run_cli(["search", "merge", "--model", "resnet50", "--cluster", "v100-ib56", "--micro-batch-size",
                            "32", "--sweep-workers", "2,4,8", "--plot", str(png), "--csv", str(csv), "--out", "",
                            "--quiet"], capsys)  # fmt: skip
    assert rc == 0, err
    assert "scaling: pure data parallelism over N GPUs" in out and "S(mgwfbp)" in out and "mgwfbp/bulk" in out
    rows = [line.split() for line in out.splitlines()[out.splitlines().index(next(
        line for line in out.splitlines() if line.split()[:2] == ["workers", "nodes"])) + 1:]]  # fmt: skip
    assert [r[0] for r in rows[:3]] == ["2", "4", "8"]
    assert png.stat().st_size > 10_000
    assert csv.read_text().splitlines()[0].startswith("workers,nodes,bulk_ms,wfbp_ms,mgwfbp_ms,speedup_bulk")
    assert len(csv.read_text().splitlines()) == 4


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--strategy", "1M1P1D", "--nodes", "1"], "dp = 1: nothing to synchronise"),
        (["--plot", "x.png"], "--plot draws the --sweep-workers scaling"),
        (["--modes", "bulk,nope"], "unknown gradient synchronisation 'nope'"),
        (["--sweep-workers", "2,4,12", "--nodes", "1", "--cluster", "dgx-a100"], "12 workers is not a whole number"),
        (["--sweep-workers", "0"], "--sweep-workers takes positive integers"),
    ],
)
def test_cli_bad_input_is_one_line(
    extra: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_cli(["search", "merge", "--model", "resnet50", "--cluster", "v100-10gbe", *extra], capsys)
    assert rc != 0 and not out
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "merge.plan.yaml").exists()


def test_search_merge_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_cli(["search", "merge", "--help"], capsys)
    assert rc == 0
    assert "distsim search merge --model resnet50 --cluster v100-10gbe" in out and "--sweep-workers" in out


def test_the_mgwfbp_presets_are_listed(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run_cli(["clusters"], capsys)
    assert rc == 0 and "v100-10gbe" in out and "v100-ib56" in out
    ib, eth = get_cluster("v100-ib56"), get_cluster("v100-10gbe")
    assert (ib.nodes, ib.gpus_per_node, eth.nodes, eth.gpus_per_node) == (16, 1, 16, 1)
    assert eth.inter.bandwidth_bytes_per_s == 10e9 / 8  # 10 GbE line rate
    assert ib.inter.bandwidth_bytes_per_s == pytest.approx(56.25e9 * 64 / 66 / 8)  # FDR 4x data rate


# ------------------------------------------------------------------------------- (c) scaling with the workers
def test_mgwfbp_converges_to_sync_easgd_under_ring_allreduce() -> None:
    """Ring all-reduce's start-up grows as 2(N-1) alpha, so with many workers merging everything into one message
    wins: MG-WFBP's iteration approaches SyncEASGD's (ratio -> 1), while with few workers it is clearly faster."""
    sweep = sweep_workers(get_model("resnet50"), get_cluster("v100-10gbe"), [4, 16, 256, 1024, 2048],
                          costs=lambda c: AnalyticCosts(c, allreduce="ring"), micro_batch_size=32)  # fmt: skip
    ratio = [p.iteration_s["mgwfbp"] / p.iteration_s["bulk"] for p in sweep.points]
    assert ratio[0] < 0.9
    assert all(x <= y + 1e-9 for x, y in itertools.pairwise(ratio))  # nearer SyncEASGD as N grows
    assert ratio[-1] == pytest.approx(1.0, abs=1e-3)
    assert [p.simulated_gpus for p in sweep.points] == [1] * 5  # symmetric replicas: one GPU simulated
    wfbp = [p.speedup("wfbp", sweep.single_gpu_s) for p in sweep.points]
    merged = [p.speedup("mgwfbp", sweep.single_gpu_s) for p in sweep.points]
    assert merged[-1] > 2 * wfbp[-1]  # WFBP's per-layer start-ups dominate at 2048 workers


def test_with_nccls_tree_merging_still_beats_sync_easgd_at_2048_workers() -> None:
    """The paper's double-binary-tree remark: a logarithmic start-up keeps overlapping worthwhile at any scale."""
    sweep = sweep_workers(get_model("resnet50"), get_cluster("v100-10gbe"), [2048], micro_batch_size=32)
    p = sweep.points[0]
    assert p.iteration_s["mgwfbp"] < 0.95 * p.iteration_s["bulk"]
    assert p.speedup("mgwfbp", sweep.single_gpu_s) == pytest.approx(2048 * sweep.single_gpu_s / p.iteration_s["mgwfbp"])


def test_cluster_of_cuts_whole_nodes_or_part_of_one() -> None:
    dgx = get_cluster("dgx-a100")  # 8 GPUs per node
    assert (cluster_of(dgx, 2).nodes, cluster_of(dgx, 2).gpus_per_node) == (1, 2)
    assert (cluster_of(dgx, 16).nodes, cluster_of(dgx, 16).gpus_per_node) == (2, 8)
    with pytest.raises(MergeSearchError, match="12 workers is not a whole number of dgx-a100 nodes"):
        cluster_of(dgx, 12)
    with pytest.raises(MergeSearchError, match="12 workers"):
        sweep_workers(get_model("resnet50"), dgx, [4, 12])


# --------------------------------------------------------------------------------- (d) a 600-layer chain
def test_the_merge_planner_handles_600_layers() -> None:
    n_layers = 600
    layers = [(1e-4, 2e-5 * (1 + (i * 7) % 5), 1000 * (1 + (i * 13) % 11), 100.0) for i in range(n_layers)]
    model = chain_model(layers)
    cluster = hand_cluster(nodes=1, gpus_per_node=8, intra_bw=1e9, intra_lat=5e-6)
    result = compare_sync(model, cluster, Strategy(dp=8), AnalyticCosts(cluster), ("mgwfbp", "mgwfbp-optimal"),
                          HOST_OFF)  # fmt: skip
    wfbp_s = result.result("wfbp").iteration_time_s
    greedy, optimal = result.result("mgwfbp"), result.result("mgwfbp-optimal")
    for r in (greedy, optimal):
        bounds = [g.layers for g in r.groups]
        assert bounds[0][0] == 0 and bounds[-1][1] == n_layers
        assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
        assert 1 < r.allreduces < n_layers  # merged, but not into one message
        assert sum(g.nbytes for g in r.groups) == 2 * sum(p for _, _, p, _ in layers)
    assert optimal.iteration_time_s <= greedy.iteration_time_s * (1 + 1e-12) <= wfbp_s * (1 + 1e-12)

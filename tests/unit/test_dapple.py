"""DAPPLE's planner: the latency model, the placement policies, the DP on hand-checkable cases, the simulator."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from distsim import AnalyticCosts, simulate
from distsim.core.cluster import Cluster, Link
from distsim.core.errors import DistsimError
from distsim.core.models import Model, model_from_dict
from distsim.plans import Plan, StagePlan
from distsim.search.dapple import check_with_simulator, plan_dapple, plan_micro_batches
from distsim.search.dapple_dp import _latency_terms, beam_width
from distsim.search.dapple_model import DappleSpec, StageCosts, evaluate, in_flight, pipeline_latency, place
from tests.util import HAND_GPU, hand_cluster
from tests.util import run_cli as run


def flops_chain(per_sample_s: list[float], params: list[int], out_bytes: float = 0.0, saved: float = 0.0) -> Model:
    """Layers whose forward takes `per_sample_s` seconds per sample on the hand GPU (1e12 FLOP/s; backward 2x)."""
    layers = [
        {"name": f"l{i}", "flops": s * 1e12, "params": p, "out_bytes": out_bytes, "saved_bytes": saved}
        for i, (s, p) in enumerate(zip(per_sample_s, params, strict=True))
    ]
    return model_from_dict({"name": "hand", "layers": layers})


# ---------------------------------------------------------------------------------------------- latency model
def test_pure_data_parallel_is_m_times_f_plus_b_plus_allreduce() -> None:
    # the paper's printed ending term would give M(F+B) + AR - 2B = 35
    assert pipeline_latency([3.0], [6.0], [5.0], 4) == (41.0, 0)


def test_uniform_pipeline_is_m_plus_s_minus_1_times_f_plus_b_plus_the_allreduce_tail() -> None:
    """Two compute stages (F 1, B 2) with a free transfer between, M = 4: (4 + 2 - 1) x 3 = 15; stage 0's
    all-reduce (3 s) starts when its last backward ends, at 15."""
    L, Q = pipeline_latency([1.0, 0.0, 1.0], [2.0, 0.0, 2.0], [3.0, 0.0, 0.5], 4)
    assert (L, Q) == (18.0, 2)


def test_pivot_moves_to_a_heavy_first_stage_and_later_stages_finish_before_it() -> None:
    """Stage 0 (F 3, B 6) dominates stage 1 (F 1, B 2): Q = 0, L = F0 + 3 (F0 + B0) + B0 = 36. Stage 1's last
    backward ends when stage 0's last one starts (off = 0), so a 40 s all-reduce on stage 1 ends at 30 + 40."""
    assert pipeline_latency([3.0, 0.0, 1.0], [6.0, 0.0, 2.0], [0.0, 0.0, 0.0], 4) == (36.0, 0)
    assert pipeline_latency([3.0, 0.0, 1.0], [6.0, 0.0, 2.0], [0.0, 0.0, 40.0], 4) == (70.0, 0)


def test_vectorised_latency_matches_the_formula() -> None:
    rng = random.Random(7)
    for _ in range(300):
        P, T, M = rng.randint(0, 5), rng.randint(1, 4), rng.randint(1, 9)
        shape = (3, 4)
        pre = [(rng.uniform(0, 3), rng.uniform(0, 6), rng.uniform(0, 9)) for _ in range(P)]
        tail = [
            tuple(np.array([[rng.uniform(0, 3) * (k + 1) for _ in range(4)] for _ in range(3)]) for k in range(3))
            for _ in range(T)
        ]
        extra = {k: np.full(shape, rng.uniform(0, 5)) for k in range(P) if rng.random() < 0.3}
        got = _latency_terms(pre, tail, M, shape, extra)
        for c in range(3):
            for w in range(4):
                F = [t[0] for t in pre] + [float(t[0][c, w]) for t in tail]
                B = [t[1] for t in pre] + [float(t[1][c, w]) for t in tail]
                AR = [t[2] + (float(extra[k][c, w]) if k in extra else 0.0) for k, t in enumerate(pre)]
                AR += [float(t[2][c, w]) for t in tail]
                assert got[c, w] == pytest.approx(pipeline_latency(F, B, AR, M)[0], rel=1e-12, abs=1e-12)


# ---------------------------------------------------------------------------------------------- placement
def test_placement_policies_on_two_machines_of_four() -> None:
    none: frozenset[int] = frozenset()
    some = frozenset({0, 1, 2})
    assert place("fresh", none, 3, 4, 8) == (0, 1, 2)
    assert place("fresh", none, 6, 4, 8) == (0, 1, 2, 3, 4, 5)  # a whole machine, then part of the next
    assert place("fresh", some, 2, 4, 8) == (4, 5)
    assert place("fresh", some, 5, 4, 8) is None  # one fresh machine left
    assert place("append", some, 1, 4, 8) == (3,)
    assert place("append", some, 2, 4, 8) is None  # the used machine has one GPU free
    assert place("append", none, 1, 4, 8) is None  # nothing is used yet
    assert place("scatter", none, 3, 4, 8) == (0, 4, 1)
    assert place("scatter", some, 3, 4, 8) == (3, 4, 5)
    assert place("scatter", some, 6, 4, 8) is None
    with pytest.raises(DistsimError, match="unknown placement policy"):
        place("random", none, 1, 4, 8)


# ---------------------------------------------------------------------------------------------- the planner
def test_three_layers_on_two_gpus_an_uneven_split_wins() -> None:
    """Layers of 2, 1, 1 s per sample forward (backward 2x), 25k parameters each, global batch 4.

    Pure DP pays a 150 s gradient all-reduce (150 kB over a 1000 B/s link): at M = 1, 2 x 2 samples x 3 s x 3
    = 24 s + 150. The even split 2:1 puts 3 s + 6 s per sample on stage 0 (pivot): at M = 4, 3 + 3 x 9 + 6 = 36.
    The uneven split 1:2 balances the stages (2 + 4 s each): (4 + 2 - 1) x 6 = 30, the best; the simulator agrees.
    """
    model = flops_chain([2.0, 1.0, 1.0], [25_000] * 3)
    cluster = hand_cluster(nodes=1, gpus_per_node=2)
    costs = AnalyticCosts(cluster)
    result = plan_dapple(model, cluster, DappleSpec(2, 4), costs)
    best = result.best
    assert best is not None
    assert best.stages == (StagePlan((0, 1), (0,)), StagePlan((1, 3), (1,)))
    assert (best.micro_batches, best.notation) == (4, "straight split 1:2")
    assert best.latency_s == pytest.approx(30.0)
    assert result.best_dp is not None and result.best_dp.latency_s == pytest.approx(174.0)
    sc = StageCosts(model, cluster, costs, 1)
    even = evaluate(sc, result.spec, 4, [(0, 2, (0,)), (2, 3, (1,))])
    assert even.latency_s == pytest.approx(36.0) and even.pivot == 0
    checked = check_with_simulator(result, costs)
    ours = next(c for c in checked if c.candidate == best)
    assert ours.iteration_s == pytest.approx(30.0)


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize(
    ("stages", "closed_form"),
    [
        # 2 stages x 2 replicas, one per node: each replica 1 sample (F 2 s, B 4 s); 5 x 6 = 30, then stage 0's
        # all-reduce of 2 layers x 1000 fp16 gradients over 2 GPUs in a node (4000 B / 1000 B/s = 4 s)
        ((((0, 2), (0, 1)), ((2, 4), (2, 3))), 34.0),
        # straight: 4 stages of one GPU, 2 samples (F 2 s, B 4 s) per micro-batch; (4 + 4 - 1) x 6, no all-reduce
        ((((0, 1), (0,)), ((1, 2), (1,)), ((2, 3), (2,)), ((3, 4), (3,))), 42.0),
    ],
)
def test_estimate_and_simulator_agree_on_uniform_pipelines(
    stages: tuple[tuple[tuple[int, int], tuple[int, ...]], ...], closed_form: float, schedule: str
) -> None:
    model = flops_chain([1.0] * 4, [1000] * 4)
    cluster = hand_cluster(nodes=2, gpus_per_node=2)
    costs = AnalyticCosts(cluster)
    spec = DappleSpec(4, 8, schedule=schedule)
    sc = StageCosts(model, cluster, costs, 2)
    cand = evaluate(sc, spec, 4, [(a, e, d) for (a, e), d in stages])
    plan = Plan.of_stages("hand", "hand", cand.stages, num_micro_batches=4, micro_batch_size=2, schedule=schedule)
    sim = simulate(model, cluster, plan, costs).iteration_time_s
    assert cand.latency_s == pytest.approx(closed_form)
    assert sim == pytest.approx(closed_form)


def test_pure_data_parallel_estimate_matches_the_simulator() -> None:
    """4 replicas over 2 nodes, M = 2 micro-batches of 4 samples (1 each): 2 x (4 + 8) = 24 s of compute, then
    the all-reduce of 4 x 1000 fp16 gradients (8000 B) in a ring of 4 across nodes: 2 x 3/4 x 8000 / 1000 = 12 s."""
    model = flops_chain([1.0] * 4, [1000] * 4)
    cluster = hand_cluster(nodes=2, gpus_per_node=2)
    costs = AnalyticCosts(cluster)
    sc = StageCosts(model, cluster, costs, 4)
    cand = evaluate(sc, DappleSpec(4, 8), 2, [(0, 4, (0, 1, 2, 3))])
    plan = Plan.of_stages("hand", "hand", cand.stages, num_micro_batches=2, micro_batch_size=4)
    assert cand.latency_s == pytest.approx(36.0)
    assert simulate(model, cluster, plan, costs).iteration_time_s == pytest.approx(36.0)


def test_estimate_with_transfers_matches_the_simulator_under_gpipe_and_warm_up_policy_b() -> None:
    """Activations cross nodes (0.6 s each way): the model counts each transfer as a pipeline stage, so
    L = (M - 1)(F + B) + S (F + B) + 2 (S - 1) x 0.6 + AR = 18 + 12 + 1.2 + 4. The simulator agrees under GPipe
    and under early backward with policy B (K_0 = 3). Policy A (K_0 = 2) pays the transfers' round trip in
    steady state (36.4 s): the reason DAPPLE added policy B for communication-heavy pipelines."""
    model = flops_chain([1.0] * 4, [1000] * 4, out_bytes=300.0)
    cluster = hand_cluster(nodes=2, gpus_per_node=2)
    costs = AnalyticCosts(cluster)
    sc = StageCosts(model, cluster, costs, 2)
    got = {}
    for schedule, policy in (("gpipe", "A"), ("1f1b", "B"), ("1f1b", "A")):
        cand = evaluate(sc, DappleSpec(4, 8, schedule=schedule), 4, [(0, 2, (0, 1)), (2, 4, (2, 3))])
        assert cand.forward_s[1] == pytest.approx(0.6)  # 300 B per sample, 1 sample per replica, 2 flows share a NIC
        assert cand.latency_s == pytest.approx(35.2)
        plan = Plan.of_stages("hand", "hand", cand.stages, num_micro_batches=4, micro_batch_size=2,
                              schedule=schedule, warmup_policy=policy)  # fmt: skip
        got[(schedule, policy)] = simulate(model, cluster, plan, costs).iteration_time_s
    assert got[("gpipe", "A")] == pytest.approx(35.2) and got[("1f1b", "B")] == pytest.approx(35.2)
    assert got[("1f1b", "A")] == pytest.approx(36.4)


def _reference(model: Model, cluster: Cluster, spec: DappleSpec, M: int) -> float | None:
    """The planner's DP written plainly: one full-plan evaluation per transition, no vectorisation."""
    costs = AnalyticCosts(cluster)
    b, G, N = spec.global_batch // M, spec.gpus, model.num_layers
    sc = StageCosts(model, cluster, costs, b)
    cap = cluster.gpu.memory_bytes if spec.memory_filter else float("inf")

    def stage_ok(a: int, e: int, devs: tuple[int, ...], i: int, S: int) -> bool:
        return len(devs) <= b and sc.memory(a, e, len(devs), in_flight(spec, M, i, S)) <= cap

    states: dict[tuple[int, frozenset[int]], tuple[tuple[bool, float], list]] = {(0, frozenset()): ((False, 0), [])}
    best = None
    for j in range(N - 1):
        for (jj, used), (_, prefix) in sorted(states.items(), key=lambda kv: (kv[1][0], sorted(kv[0][1]))):
            if jj != j:
                continue
            S = len(prefix) + 2
            if not all(stage_ok(a, e, d, i, S) for i, (a, e, d) in enumerate(prefix)):
                continue
            free = [g for g in range(G) if g not in used]
            for m in range(1, min(len(free) - 1, b) + 1):
                seen = []
                for policy in spec.policies:
                    devs = place(policy, used, m, cluster.gpus_per_node, G)
                    if devs is None or devs in seen:
                        continue
                    seen.append(devs)
                    rest = tuple(g for g in free if g not in devs)
                    for j2 in range(j + 1, N):
                        if not stage_ok(j, j2, devs, len(prefix), S):
                            continue
                        stages = [*prefix, (j, j2, devs), (j2, N, rest)]
                        L = evaluate(sc, spec, M, stages).latency_s
                        bad = not stage_ok(j2, N, rest, len(prefix) + 1, S)
                        key = (bad, L)
                        target = (j2, used | frozenset(devs))
                        if target not in states or key < states[target][0]:
                            states[target] = (key, [*prefix, (j, j2, devs)])
                        if not bad and (best is None or best > L):
                            best = L
    return best


@pytest.mark.parametrize("seed", range(10))
def test_vectorised_search_matches_a_plain_reference(seed: int) -> None:
    """Random chains (some with the last layer tied to the first, some short of memory) on 2 or 3 machines."""
    rng = random.Random(seed)
    n = rng.randint(3, 6)
    out_bytes, saved = rng.choice([0.0, 50.0, 400.0]), rng.choice([0.0, 1e3])
    layers = [
        {"name": f"l{i}", "flops": rng.uniform(0.2, 3.0) * 1e12, "params": rng.randint(10, 4000),
         "out_bytes": out_bytes, "saved_bytes": saved}
        for i in range(n)
    ]  # fmt: skip
    if seed % 2:
        layers[-1]["tied_to"] = "l0"
    model = model_from_dict({"name": "random", "layers": layers})
    gpu = replace(HAND_GPU, memory_bytes=rng.choice([1e12, 9e4]))
    cluster = Cluster("hand", rng.choice([2, 3]), 2, gpu, Link(4000.0, 0.0), Link(1000.0, 0.0), 1)
    spec = DappleSpec(cluster.num_gpus, 12, schedule=rng.choice(["1f1b", "gpipe"]))
    for M in (1, 2, 3, 6, 12):
        want = _reference(model, cluster, spec, M)
        got = plan_micro_batches(model, cluster, spec, AnalyticCosts(cluster), M)
        search_best = got[0]
        if want is None:
            continue
        assert search_best is not None and search_best.latency_s <= want * (1 + 1e-12)
        # the answer is the search's best unless pure DP or the straight pipeline beat it
        others = [c.latency_s for c in got[1:3] if c is not None]
        assert search_best.latency_s == pytest.approx(min([want, *others]), rel=1e-12)


def test_parallel_planning_returns_the_serial_result() -> None:
    model = flops_chain([1.0, 2.0, 1.5, 0.5, 1.0, 2.5], [300, 2000, 50, 900, 10, 4000], out_bytes=80.0, saved=100.0)
    cluster = Cluster("hand", 2, 3, HAND_GPU, Link(4000.0, 0.0), Link(1000.0, 0.0), 1)
    spec = DappleSpec(6, 24)
    serial = plan_dapple(model, cluster, spec, AnalyticCosts(cluster))
    parallel = plan_dapple(model, cluster, spec, AnalyticCosts(cluster), workers=2)
    assert serial.best == parallel.best and serial.best is not None
    assert serial.best_per_micro_batches == parallel.best_per_micro_batches
    assert (serial.best_dp, serial.best_straight, serial.evaluated) == (
        parallel.best_dp, parallel.best_straight, parallel.evaluated,
    )  # fmt: skip


def test_tied_layers_on_different_stages_pay_their_allreduce() -> None:
    """An embedding and the head tied to it (1 s per sample each, 4000 parameters) on two GPUs, M = 4: the
    pipeline takes (4 + 1) x 3 = 15 s, then the tied copies' 8000 B of gradients are all-reduced between the two
    GPUs (8 s); the simulator agrees."""
    spec_layers = [
        {"name": "emb", "flops": 1e12, "params": 4000, "out_bytes": 0.0},
        {"name": "head", "flops": 1e12, "params": 4000, "out_bytes": 0.0, "tied_to": "emb"},
    ]
    model = model_from_dict({"name": "tied", "layers": spec_layers})
    cluster = hand_cluster(nodes=1, gpus_per_node=2)
    costs = AnalyticCosts(cluster)
    sc = StageCosts(model, cluster, costs, 1)
    cand = evaluate(sc, DappleSpec(2, 4), 4, [(0, 1, (0,)), (1, 2, (1,))])
    assert cand.allreduce_s[0] == pytest.approx(8.0) and cand.allreduce_s[2] == pytest.approx(8.0)
    assert cand.latency_s == pytest.approx(23.0)
    plan = Plan.of_stages("tied", "hand", cand.stages, num_micro_batches=4, micro_batch_size=1)
    assert simulate(model, cluster, plan, costs).iteration_time_s == pytest.approx(23.0)


def test_memory_limits_the_micro_batch_count_and_nothing_fitting_is_said() -> None:
    model = flops_chain([1.0] * 4, [1000] * 4, saved=1e4)
    gpu = replace(HAND_GPU, memory_bytes=1e5)  # 16 B per parameter: 64 kB of state for all 4 layers
    cluster = Cluster("hand", 1, 2, gpu, Link(1000.0, 0.0), Link(1000.0, 0.0), 1)
    result = plan_dapple(model, cluster, DappleSpec(2, 8), AnalyticCosts(cluster))
    assert result.best is not None and result.best.fits and result.best.peak_memory_bytes <= 1e5
    tiny = Cluster("hand", 1, 2, replace(HAND_GPU, memory_bytes=1e3), Link(1e3, 0), Link(1e3, 0), 1)
    nothing = plan_dapple(model, tiny, DappleSpec(2, 8), AnalyticCosts(tiny))
    assert nothing.best is None and not nothing.best_per_micro_batches
    with pytest.raises(DistsimError, match="no plan fits"):
        nothing.plan()
    anyway = plan_dapple(model, tiny, DappleSpec(2, 8, memory_filter=False), AnalyticCosts(tiny))
    assert anyway.best is not None and not anyway.best.fits


def test_the_beam_bounds_the_search_and_says_so() -> None:
    from distsim import get_cluster

    cluster = get_cluster("dapple-a")
    assert beam_width(DappleSpec(16, 64), cluster) == 0  # two 8-GPU machines: 81 sets of used GPUs, all kept
    assert beam_width(DappleSpec(32, 64), cluster.with_nodes(4)) == 128  # four: 6,561
    assert beam_width(DappleSpec(32, 64, beam=0), cluster.with_nodes(4)) == 0
    model = flops_chain([1.0, 2.0, 1.5, 0.5, 1.0, 2.5], [300, 2000, 50, 900, 10, 4000], out_bytes=80.0)
    small = Cluster("hand", 3, 2, HAND_GPU, Link(4000.0, 0.0), Link(1000.0, 0.0), 1)
    full = plan_dapple(model, small, DappleSpec(6, 12))
    narrow = plan_dapple(model, small, DappleSpec(6, 12, beam=1))
    assert full.pruned_states == 0 and full.beam == 0
    assert narrow.pruned_states > 0 and narrow.beam == 1 and narrow.evaluated < full.evaluated
    assert narrow.best is not None and full.best is not None
    assert narrow.best.latency_s >= full.best.latency_s


def test_bad_specs_are_one_line_errors() -> None:
    with pytest.raises(DistsimError, match="do not divide the global batch 8"):
        DappleSpec(2, 8, micro_batches=(3,))
    with pytest.raises(DistsimError, match="placement policies"):
        DappleSpec(2, 8, policies=("fresh", "best-fit"))
    with pytest.raises(DistsimError, match="1f1b or gpipe"):
        DappleSpec(2, 8, schedule="interleaved")
    with pytest.raises(DistsimError, match="beam must be 0"):
        DappleSpec(2, 8, beam=-1)


# ---------------------------------------------------------------------------------------------- command line
def test_search_dapple_prints_the_plan_and_writes_a_file_simulate_accepts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan_path = tmp_path / "d.plan.yaml"
    args = ["search", "dapple", "--model", "bert-exlarge:layers=4", "--cluster", "dapple-a", "--gpus", "8",
            "--global-batch", "16", "--plan-out", str(plan_path), "-q"]  # fmt: skip
    code, out, err = run(args, capsys)
    assert code == 0, err
    for needle in ("chosen (lowest simulated time)", "planner estimate", "simulator", "stage 0: layers 0-", "M=2"):
        assert needle in out
    assert plan_path.exists()
    code, out2, err = run(["simulate", "--plan", str(plan_path)], capsys)
    assert code == 0, err
    assert "iteration time" in out2
    code, out3, err = run([*args, "--json", "--choose", "estimate"], capsys)
    assert code == 0, err
    data = json.loads(out3)
    assert data["choose"] == "estimate" and data["chosen"]["estimate_s"] == data["best"]["estimate_s"]
    assert {row["label"] for row in data["shortlist"]} >= {"M=1", "M=2"}


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--gpus", "32"], "has 16 GPUs"),
        (["--micro-batches", "5"], "5 micro-batches do not divide the global batch 64"),
        (["--policies", "fresh,best"], "--policies takes a comma-separated subset"),
    ],
)
def test_search_dapple_bad_input_exits_2_with_one_line(
    extra: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["search", "dapple", "--model", "bert-exlarge", "--cluster", "dapple-a", "--global-batch", "64", "-q"]
    code, _, err = run([*args, *extra], capsys)
    assert code == 2
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err

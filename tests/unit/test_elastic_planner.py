"""EasyScale's intra-job planner (ALGORITHMS.md 5.2): Eqs. 1a-1d on hand-computed heterogeneous cases, the N_i-weighted
waste against the printed Eq. 1c, the 0.30 cut, the ranking, agreement with brute force; capabilities and the CLI."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distsim.elastic import ElasticPlan, ElasticPlanError, plan_elastic
from distsim.elastic.planner import enumerate_plans, make_plan, rank_key, waste
from tests.util import run_cli as run


def table(plans: list[ElasticPlan]) -> list[tuple[str, float, float, float]]:
    return [(p.label(), round(p.step_s, 6), round(p.throughput, 6), round(p.waste, 6)) for p in plans]


# ------------------------------------------------------------------------------------------ hand-computed cases
# Case A: maxP = 4; V100 C = 2 mini-batches/s (2 available), T4 C = 1 (2 available).
# Step times tried: a / 2 and a / 1. The minimal GPU sets, each at the first step it fits:
#   f = 1   (A_V = 2, A_T = 1): V100 x2 -> 2*2 = 4; V100 x1 + T4 x2 -> 2 + 2*1 = 4.
#           waste = 2 (2 - 2/1) = 0 and 1 (2 - 2/1) + 2 (1 - 1/1) = 0; throughput 4 / 1 = 4 both.
#   f = 1.5 (A_V = 3, A_T = 1): V100 x1 + T4 x1 -> 3 + 1 = 4.
#           waste = 1 (2 - 3/1.5) + 1 (1 - 1/1.5) = 0 + 1/3; throughput 4 / 1.5 = 8/3 = (2 + 1) - 1/3.
#   f = 2   (A_V = 4, A_T = 2): V100 x1 -> 4; T4 x2 -> 2*2 = 4 (V100 x1 + T4 x1 = 6 is not minimal: 6 - 2 >= 4).
#           waste 0 both, throughput 2.
#   f = 4   (A_T = 4): T4 x1 -> 4, throughput 1.
# Ranking: throughput 4 (V100 x2 before V100 x1 + T4 x2: fewer GPUs), 8/3, 2 (V100 x1 before T4 x2), 1.
CASE_A = ({"V100": 2.0, "T4": 1.0}, {"V100": 2, "T4": 2})


def test_case_a_every_plan_and_the_ranking():
    caps, avail = CASE_A
    plans = plan_elastic(4, caps, avail)
    assert table(plans) == [
        ("V100:2x2", 1.0, 4.0, 0.0),
        ("V100:1x2,T4:2x1", 1.0, 4.0, 0.0),
        ("V100:1x3,T4:1x1", 1.5, round(8 / 3, 6), round(1 / 3, 6)),
        ("V100:1x4", 2.0, 2.0, 0.0),
        ("T4:2x2", 2.0, 2.0, 0.0),
        ("T4:1x4", 4.0, 1.0, 0.0),
    ]
    mixed = plans[2]
    assert mixed.counts == {"V100": 1, "T4": 1} and mixed.ests == {"V100": 3, "T4": 1}
    assert mixed.normalized_waste == pytest.approx((1 / 3) / 3)  # waste over 2 + 1 mini-batches/s of capability
    assert [p.gpus for p in plans] == [2, 3, 2, 1, 2, 1]


def test_throughput_ties_go_to_fewer_gpus_whatever_the_type_order():
    caps, avail = CASE_A
    # T4 listed first: the deterministic tail of the key changes, the GPU-count tie-break does not
    plans = plan_elastic(4, caps, {"T4": avail["T4"], "V100": avail["V100"]})
    assert [p.label() for p in plans[:2]] == ["V100:2x2", "T4:2x1,V100:1x2"]
    assert [p.label() for p in plans[3:5]] == ["V100:1x4", "T4:2x2"]


# Case B: the printed Eq. 1c (no N_i) against the per-GPU form. maxP = 6; V100 C = 4 (1 available), T4 C = 1.5 (2).
# Steps below 1 do not fit 6 ESTs: f = 0.75 gives A_V = 3, A_T = floor(1.125) = 1 -> 3 + 2 = 5.
# f = 1 (V100 a = 4): A_V = 4, A_T = floor(1.5) = 1 -> V100 x1 + T4 x2 = 4 + 2 = 6, minimal (dropping a T4: 5).
#   per-GPU waste: 1 (4 - 4/1) + 2 (1.5 - 1/1) + (6 - 6)/1 = 1.0
#   printed (each type once): (4 - 4) + (1.5 - 1) = 0.5
#   capability 4 + 2 * 1.5 = 7: 7 - 1.0 = 6 = maxP / f (Eq. 1d) holds; 7 - 0.5 = 6.5 does not.
def test_case_b_the_n_i_factor_makes_eq_1d_hold():
    caps = {"V100": 4.0, "T4": 1.5}
    counts, ests = {"V100": 1, "T4": 2}, {"V100": 4, "T4": 1}
    assert waste(counts, ests, caps, 6) == pytest.approx(1.0)
    assert waste(counts, ests, caps, 6, per_type=True) == pytest.approx(0.5)
    capacity = 4 + 2 * 1.5
    plan = make_plan(counts, ests, caps, 6)
    assert plan.step_s == pytest.approx(1.0) and plan.throughput == pytest.approx(6.0)
    assert capacity - plan.waste == pytest.approx(plan.throughput)
    assert capacity - waste(counts, ests, caps, 6, per_type=True) != pytest.approx(plan.throughput)
    # the planner finds this set at this step, with these ESTs
    found = {p.label(): p for p in plan_elastic(6, caps, {"V100": 1, "T4": 2})}
    assert found["V100:1x4,T4:2x1"].waste == pytest.approx(1.0)
    # with every N_i <= 1 the two forms agree: V100 x1 + T4 x1, A = 4 and 1, maxP = 5 = nEST, f = 1:
    # (4 - 4) + (1.5 - 1) = 0.5 either way
    one_each = {"V100": 1, "T4": 1}
    assert waste(one_each, ests, caps, 5) == pytest.approx(0.5)
    assert waste(one_each, ests, caps, 5, per_type=True) == pytest.approx(0.5)


def test_idle_est_slots_are_waste():
    # maxP = 3 on two V100 (C = 2): f = 1, A = 2, nEST = 4, one idle slot: waste = 2 (2 - 2) + (4 - 3)/1 = 1;
    # throughput 3 = 2 * 2 - 1
    plan = make_plan({"V100": 2}, {"V100": 2}, {"V100": 2.0}, 3)
    assert plan.est_slots == 4 and plan.waste == pytest.approx(1.0) and plan.throughput == pytest.approx(3.0)
    assert plan.normalized_waste == pytest.approx(0.25)


# Case C: the 0.30 cut. maxP = 3; V100 C = 1.9 (2 available), T4 C = 1 (1 available).
#   f = 1/1.9: A_V = 1, A_T = 0 -> at most 2 ESTs.
#   f = 1 (T4 a = 1): A_V = floor(1.9) = 1, A_T = 1: V100 x2 + T4 x1 = 3.
#       waste = 2 (1.9 - 1) + 1 (1 - 1) = 1.8, capability 4.8, normalised 0.375 > 0.30: CUT, though its throughput,
#       3, is the best. (The printed Eq. 1c, 0.9 / 4.8 = 0.1875, would have kept it.)
#   f = 2/1.9 (V100 a = 2): A_V = 2, A_T = floor(1.0526) = 1:
#       V100 x2 = 4 ESTs, 1 idle: waste 0 + (4 - 3) / (2/1.9) = 0.95, capability 3.8, normalised 0.25;
#       V100 x1 + T4 x1 = 3: waste 0 + (1 - 0.95) = 0.05, capability 2.9, normalised 0.0172;
#       both at throughput 3 * 1.9 / 2 = 2.85 on 2 GPUs: the one with less normalised waste first.
#   f = 3/1.9: V100 x1 (A = 3), throughput 1.9. f = 3: T4 x1 (A = 3), throughput 1.
CASE_C = ({"V100": 1.9, "T4": 1.0}, {"V100": 2, "T4": 1})


def test_case_c_the_waste_cut_drops_the_fastest_plan():
    caps, avail = CASE_C
    everything = enumerate_plans(3, caps, avail)
    first = everything[0]
    assert first.label() == "V100:2x1,T4:1x1"
    assert first.throughput == pytest.approx(3.0) and first.waste == pytest.approx(1.8)
    assert first.normalized_waste == pytest.approx(0.375)
    assert waste(first.counts, first.ests, caps, 3, per_type=True) / 4.8 == pytest.approx(0.1875)
    plans = plan_elastic(3, caps, avail)
    assert table(plans) == [
        ("V100:1x2,T4:1x1", round(2 / 1.9, 6), 2.85, 0.05),
        ("V100:2x2", round(2 / 1.9, 6), 2.85, 0.95),
        ("V100:1x3", round(3 / 1.9, 6), 1.9, 0.0),
        ("T4:1x3", 3.0, 1.0, 0.0),
    ]
    assert next(p.label() for p in plan_elastic(3, caps, avail, waste_cut=0.4)) == "V100:2x1,T4:1x1"
    # a cut of 0.2 also drops V100 x2 (0.25)
    assert [p.label() for p in plan_elastic(3, caps, avail, waste_cut=0.2)] == ["V100:1x2,T4:1x1", "V100:1x3",
                                                                                  "T4:1x3"]  # fmt: skip


# ------------------------------------------------------------------------------------------------- brute force
def brute_force(max_workers: int, caps: dict[str, float], avail: dict[str, int]) -> dict[tuple[int, ...], float]:
    """Every N_i <= available and A_i in 1..maxP with sum N_i A_i >= maxP: the best throughput per GPU multiset."""
    types = list(avail)
    best: dict[tuple[int, ...], float] = {}
    for counts in itertools.product(*(range(avail[t] + 1) for t in types)):
        used = [t for t, n in zip(types, counts, strict=True) if n]
        if not used:
            continue
        for a in itertools.product(range(1, max_workers + 1), repeat=len(used)):
            ests = dict(zip(used, a, strict=True))
            n = dict(zip(types, counts, strict=True))
            if sum(n[t] * ests[t] for t in used) < max_workers:
                continue
            thr = make_plan(n, ests, caps, max_workers).throughput
            best[counts] = max(best.get(counts, 0.0), thr)
    return best


@settings(max_examples=60, deadline=None)
@given(
    max_workers=st.integers(1, 6),
    caps=st.lists(st.sampled_from([0.5, 1.0, 1.5, 1.9, 2.0, 3.0, 3.7, 4.0]), min_size=1, max_size=3),
    avail=st.lists(st.integers(0, 3), min_size=3, max_size=3),
    waste_cut=st.sampled_from([0.1, 0.3, 1.0]),
)
def test_agrees_with_brute_force(max_workers, caps, avail, waste_cut):
    types = ["V100", "P100", "T4"][: len(caps)]
    c = dict(zip(types, caps, strict=False))
    a = dict(zip(types, avail, strict=False))
    truth = brute_force(max_workers, c, a)
    everything = enumerate_plans(max_workers, c, a)
    # each plan is a GPU multiset at its fastest mapping
    for p in everything:
        key = tuple(p.counts.get(t, 0) for t in types)
        assert p.throughput == pytest.approx(truth[key])
        assert p.waste == pytest.approx(sum(n * c[t] for t, n in p.counts.items()) - p.throughput)

    # and the multisets are exactly those from which no GPU can leave without slowing the job
    def minimal(key: tuple[int, ...]) -> bool:
        fewer = [(*key[:i], key[i] - 1, *key[i + 1 :]) for i in range(len(key)) if key[i]]
        return all(k not in truth or truth[k] < truth[key] * (1 - 1e-9) for k in fewer)

    assert sorted(tuple(p.counts.get(t, 0) for t in types) for p in everything) == sorted(filter(minimal, truth))
    # the best plan after the cut: the same throughput, then as few GPUs, as the best of all mappings
    admitted = []
    for key, thr in truth.items():
        n = dict(zip(types, key, strict=True))
        capacity = sum(n[t] * c[t] for t in types)
        if (capacity - thr) / capacity <= waste_cut + 1e-9:
            admitted.append((-round(thr, 9), sum(key)))
    plans = plan_elastic(max_workers, c, a, waste_cut)
    if not admitted:
        assert plans == []
        return
    assert plans, "brute force found an admissible plan the planner did not"
    assert (-round(plans[0].throughput, 9), plans[0].gpus) == min(admitted)
    order = {t: i for i, t in enumerate(types)}
    assert plans == sorted(plans, key=lambda p: rank_key(p, order))


def test_large_case_runs_and_keeps_the_one_gpu_plans():
    caps = {"V100": 10.5, "P100": 5.3, "T4": 3.2}
    plans = plan_elastic(64, caps, {"V100": 32, "P100": 32, "T4": 32})
    # 64 ESTs on one V100: waste 0, throughput 10.5 (any one GPU hosts every EST at no waste)
    one = [p for p in plans if p.gpus == 1]
    assert sorted(p.label() for p in one) == ["P100:1x64", "T4:1x64", "V100:1x64"]
    # the best: every GPU of every type would be 32 * (10.5 + 5.3 + 3.2) = 608 of capability; 64 ESTs on 32 V100
    # (A = 2, f = 2/10.5) give 336
    assert plans[0].throughput >= 336 - 1e-9
    assert all(p.normalized_waste <= 0.30 + 1e-9 for p in plans)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, {"V100": 1.0}, {"V100": 1}), "maxP"),
        ((4, {"V100": 0.0}, {"V100": 1}), "capability of V100"),
        ((4, {"V100": 1.0}, {"T4": 1}), "'T4' has no capability"),
        ((4, {"V100": 1.0}, {"V100": -1}), "available V100"),
    ],
)
def test_bad_input_is_one_line(args, message):
    with pytest.raises(ElasticPlanError, match=message) as exc:
        plan_elastic(*args)
    assert "\n" not in str(exc.value)


# -------------------------------------------------------------------------------------------- capability, CLI
def test_capability_is_one_over_the_simulated_single_gpu_iteration():
    from distsim.core.cluster import V100_16GB, get_cluster
    from distsim.elastic.capability import capability, single_gpu_cluster
    from distsim.io.files import load_model
    from distsim.search.collocate import background_iteration

    model = load_model("resnet50")
    v100 = capability(model, "V100-16GB", 32)
    assert v100 == pytest.approx(1 / background_iteration(model, single_gpu_cluster(V100_16GB), 32).iteration_time_s)
    assert capability(model, get_cluster("dapple-a"), 32) == pytest.approx(v100)  # the cluster's GPU, alone
    # a V100 (125 TF tensor, 900 GB/s) outruns a P100 (21.2 TF, 732 GB/s) on a convolutional net
    assert capability(model, "V100", 32) > capability(model, "P100", 32)
    assert capability(model, "V100", 64) < v100  # a larger mini-batch takes longer


def test_cli_hand_case(capsys):
    rc, out, err = run(["search", "elastic", "--model", "resnet50", "--max-workers", "4", "--gpus", "V100:2,T4:2",
                        "--capabilities", "V100:2,T4:1"], capsys)  # fmt: skip
    assert rc == 0, err
    assert "given (--capabilities)" in out
    assert "6 plans" in out and "0 cut" in out
    rows = [line.split() for line in out.splitlines() if line.strip()[:1].isdigit() and "x" in line]
    assert [r[1:3] for r in rows] == [["2x2", "-"], ["1x2", "2x1"], ["1x3", "1x1"], ["1x4", "-"], ["-", "2x2"],
                                      ["-", "1x4"]]  # fmt: skip


def test_cli_json_and_the_cut(capsys):
    rc, out, err = run(["search", "elastic", "-m", "resnet50", "-P", "3", "--gpus", "V100:2,T4:1",
                        "--capabilities", "V100:1.9,T4:1", "--json"], capsys)  # fmt: skip
    assert rc == 0, err
    data = json.loads(out)
    assert data["planned"] == 5 and data["cut"] == 1
    assert [p["counts"] for p in data["plans"]] == [{"V100": 1, "T4": 1}, {"V100": 2}, {"V100": 1}, {"T4": 1}]


def test_cli_simulated_capabilities(capsys):
    from distsim.elastic.capability import capability
    from distsim.io.files import load_model

    rc, out, err = run(["search", "elastic", "-m", "resnet50", "-P", "8", "--gpus", "v100:2,T4:4", "--json",
                        "--capabilities", "T4:3"], capsys)  # fmt: skip
    assert rc == 0, err
    data = json.loads(out)
    caps = data["capabilities"]
    assert caps["V100"]["per_s"] == pytest.approx(capability(load_model("resnet50"), "V100", 32))
    assert caps["V100"]["source"].startswith("simulated single-GPU iteration of resnet50 at batch 32")
    assert caps["T4"]["per_s"] == 3 and caps["T4"]["source"] == "given (--capabilities)"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "V100:4,K80:2"], "unknown GPU type 'K80'"),
        (["--gpus", "V100-4"], "--gpus takes TYPE:COUNT pairs"),
        (["--gpus", "V100:4,v100:2"], "names V100 twice"),
        (["--gpus", "V100:4", "--max-workers", "0"], "--max-workers (maxP) must be >= 1"),
        (["--gpus", "V100:0"], "no elastic plan"),
        (["--gpus", "V100:4", "--capabilities", "T4:2"], "which --gpus does not offer"),
        (["--gpus", "V100:4", "--capabilities", "V100:-1"], "positive number"),
        (["--gpus", "V100:4", "--waste-cut", "1.5"], "--waste-cut"),
    ],
)
def test_cli_bad_input_is_one_line(capsys, args, message):
    if "--max-workers" not in args:
        args = [*args, "--max-workers", "4"]
    rc, _out, err = run(["search", "elastic", "--model", "resnet50", *args], capsys)
    assert rc == 2
    assert message in err and len(err.strip().splitlines()) == 1


def test_every_named_gpu_type_is_a_valid_single_gpu_machine():
    from distsim.core.cluster import GPUS, gpu_type
    from distsim.elastic.capability import capability, single_gpu_cluster
    from distsim.io.files import load_model

    model = load_model("resnet50")
    rates = {name: capability(model, name, 32) for name in GPUS}
    assert all(r > 0 for r in rates.values())
    assert single_gpu_cluster("t4").gpu.memory_bytes == 16e9 and gpu_type("v100")[1].memory_bytes == 32e9
    # more tensor FLOP/s and bandwidth, more mini-batches/s: H100 > A100 > V100
    assert rates["H100"] > rates["A100"] > rates["V100"]

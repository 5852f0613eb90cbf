"""Plans: the stages form (own layer ranges and replica sets), its file form, and its event flow."""

from __future__ import annotations

from pathlib import Path

import pytest

from distsim import AnalyticCosts, FlowOptions, Strategy, get_cluster, get_model, simulate
from distsim.io.files import load_plan, load_profile, write_plan
from distsim.plans import Plan, PlanError, StagePlan, check_plan, plan_from_dict, stages_plan
from distsim.plans.plan import parse_devices
from distsim.plans.stages_flow import build_plan_flow
from distsim.sim.costs import ProfileCosts
from distsim.sim.flow.events import K_DP, K_P2P, resolve_partition
from tests.util import chain_model, hand_cluster

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("model_name", "cluster_name", "spec", "schedule", "sync", "sharing"),
    [
        ("gpt2-345m", "distsim-testbed", "1M4P4D", "1f1b", "bulk", "structural"),
        ("bert-large", "distsim-testbed", "1M2P8D", "gpipe", "wfbp", "serialize"),
        ("gpt2-345m", "distsim-a10", "1M8P2D", "1f1b", "wfbp", "structural"),
        ("t5-base", "distsim-testbed", "1M4P4D", "1f1b", "bulk", "serialize"),
    ],
)
def test_a_uniform_stages_plan_simulates_exactly_like_its_strategy(
    model_name: str, cluster_name: str, spec: str, schedule: str, sync: str, sharing: str
) -> None:
    model, cluster = get_model(model_name), get_cluster(cluster_name)
    strategy = Strategy.from_str(spec, num_micro_batches=8, micro_batch_size=2, schedule=schedule, grad_sync=sync)
    costs = AnalyticCosts(cluster)
    options = FlowOptions(link_sharing=sharing, symmetric=False)
    plan = stages_plan(strategy, cluster, resolve_partition(model, strategy, costs), model.name)
    a = simulate(model, cluster, strategy, costs, options)
    b = simulate(model, cluster, plan, costs, options)
    assert b.plan is plan and b.num_gpus == a.num_gpus == 16
    assert b.iteration_time_s == a.iteration_time_s
    assert len(b.flow) == len(a.flow)
    assert b.peak_memory_bytes == a.peak_memory_bytes
    assert b.global_batch_size == a.global_batch_size


def test_uniform_equivalence_holds_with_measured_costs_and_interference() -> None:
    model, cluster = get_model("gpt2-cpu"), get_cluster("cpu-1x2")
    costs = ProfileCosts(load_profile(ROOT / "profiles" / "cpu-gloo.json"), AnalyticCosts(cluster))
    for spec in ("1M2P1D", "1M1P2D"):
        strategy = Strategy.from_str(spec, num_micro_batches=4, grad_sync="wfbp")
        plan = stages_plan(strategy, cluster, resolve_partition(model, strategy, costs), model.name)
        a = simulate(model, cluster, strategy, costs, FlowOptions(symmetric=False))
        b = simulate(model, cluster, plan, costs)
        assert b.iteration_time_s == pytest.approx(a.iteration_time_s, rel=1e-12)


def _three_to_two_plan(b: int = 6) -> tuple[Plan, object]:
    # 2 layers, forward 1 s / backward 2 s per micro-batch, 100 bytes per sample cross the cut, links 1000 B/s
    model = chain_model([(1.0, 2.0, 500, 100.0), (1.0, 2.0, 500, 0.0)])
    plan = Plan.of_stages("hand", "hand", (StagePlan((0, 1), (0, 1, 2)), StagePlan((1, 2), (3, 4))),
                          num_micro_batches=1, micro_batch_size=b)  # fmt: skip
    return plan, model


def test_split_concat_ships_each_receiver_the_samples_it_shares_with_each_sender() -> None:
    plan, model = _three_to_two_plan()
    cluster = hand_cluster(nodes=1, gpus_per_node=8)
    flow = build_plan_flow(model, cluster, plan, AnalyticCosts(cluster))  # type: ignore[arg-type]
    assert plan.replica_samples(0) == [(0, 2), (2, 4), (4, 6)] and plan.replica_samples(1) == [(0, 3), (3, 6)]
    sends = [i for i, k in enumerate(flow.kind) if k == K_P2P]
    acts = sorted(
        (flow.slots[i][0][0], round(flow.duration_s[i] * 1000)) for i in sends if flow.name[i].startswith("act")
    )
    # sender GPU, bytes: replica 0 (samples 0-1) -> receiver 0; replica 1 (2|3) -> both; replica 2 (4-5) -> receiver 1
    assert acts == [(0, 200), (1, 100), (1, 100), (2, 200)]
    grads = sorted(
        (flow.slots[i][0][0], round(flow.duration_s[i] * 1000)) for i in sends if flow.name[i].startswith("grad")
    )
    assert grads == [(3, 100), (3, 200), (4, 100), (4, 200)]
    # one gradient all-reduce per replicated stage, over its own replicas
    ars = [i for i, k in enumerate(flow.kind) if k == K_DP]
    assert sorted(tuple(sorted(g for g, _ in flow.slots[i])) for i in ars) == [(0, 1, 2), (3, 4)]


def test_a_replicated_stage_plan_by_hand() -> None:
    """Stage 0 on 3 GPUs, stage 1 on 2, one micro-batch of 6 samples; times given per micro-batch (1 s F, 2 s B).

    F0 ends at 1; replica 1 of stage 0 sends its two 100-byte slices one after the other (0.1 s each) while
    replicas 0 and 2 send 200 B each, so both stage-1 replicas start at 1.2; F1 ends 2.2, B1 ends 4.2; each
    stage-1 replica sends its two gradient slices (300 B in all) one after the other, done at 4.5; B0 ends 6.5.
    Gradient all-reduces (1000 B of fp16 gradients, ring over 3 and 2 GPUs at 1000 B/s): 2/3 x 1000 / 1000 x 2 =
    1.333 s and 1 s; the optimizer step is free. Stage 0's all-reduce ends the iteration at 6.5 + 1.333.
    """
    plan, model = _three_to_two_plan()
    cluster = hand_cluster(nodes=1, gpus_per_node=8)
    r = simulate(model, cluster, plan)  # type: ignore[arg-type]
    assert r.iteration_time_s == pytest.approx(6.5 + 2 * (2 / 3) * 1000 / 1000, rel=1e-9)
    assert r.label == "3:2 split 1:1"
    assert r.global_batch_size == 6 and r.num_gpus == 5


def test_plan_file_round_trip(tmp_path: Path) -> None:
    plan, _ = _three_to_two_plan()
    for name in ("p.yaml", "p.json"):
        write_plan(tmp_path / name, plan)
        assert load_plan(tmp_path / name) == plan
    uniform = Plan(model="gpt2-345m", cluster="distsim-testbed", strategy=Strategy.from_str("2M4P2D"))
    write_plan(tmp_path / "u.yaml", uniform)
    assert load_plan(tmp_path / "u.yaml") == uniform


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"model": "m", "cluster": "c"}, "either strategy"),
        ({"model": "m", "cluster": "c", "strategy": "2M2P", "stages": []}, "either strategy"),
        ({"model": "m", "cluster": "c", "strategy": "2X"}, "cannot read strategy"),
        ({"model": "m", "cluster": "c", "strategy": "2M", "micro_batches": 4}, "belongs in the strategy"),
        ({"model": "m", "cluster": "c", "stages": [{"layers": [0, 2]}]}, "expected {layers"),
        ({"model": "m", "cluster": "c", "stages": [{"layers": [0], "devices": [0]}]}, "layers must be [start, end)"),
        ({"model": "m", "cluster": "c", "stages": [{"layers": [0, 2], "devices": "3-1"}]}, "cannot read devices"),
        ({"model": "m", "cluster": "c", "stages": [{"layers": [0, 2], "devices": [0]}], "schedule": "x"}, "gpipe or"),
        ({"model": "m", "cluster": "c", "stages": [{"layers": [0, 2], "devices": [0]}], "micro_batches": 0},
         "positive integer"),
        ({"model": "m", "stages": []}, "needs cluster"),
        ({"model": "m", "cluster": "c", "strategy": "2M", "extra": 1}, "unknown key 'extra'"),
    ],
)  # fmt: skip
def test_malformed_plan_files_name_the_problem(data: dict[str, object], message: str) -> None:
    with pytest.raises(PlanError) as info:
        plan_from_dict(data, "plan.yaml")
    assert message in str(info.value) and str(info.value).startswith("plan.yaml")


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        ([((0, 2), (0, 1)), ((2, 4), (1, 2))], "devices overlap: GPU 1 appears in stage 0 and in stage 1"),
        ([((0, 2), (0, 0))], "GPU 0 appears twice"),
        ([((0, 2), (0, 1)), ((3, 4), (2,))], "stage 1 starts at layer 3 but stage 0 ends at layer 2"),
        ([((1, 4), (0,))], "stage 0 starts at layer 1 but the model starts at layer 0"),
        ([((0, 2), (0, 1)), ((2, 3), (2,))], "they end at layer 3 but the model has 4"),
        ([((0, 4), (0, 9))], "uses GPU 9, but the cluster has GPUs 0..7"),
        ([((0, 4), tuple(range(5)))], "5 replicas but a micro-batch has only 4 samples"),
    ],
)
def test_plans_that_do_not_fit_the_model_or_cluster(stages: list, message: str) -> None:
    plan = Plan.of_stages("m", "c", [StagePlan(a, b) for a, b in stages], micro_batch_size=4)
    with pytest.raises(PlanError) as info:
        check_plan(plan, num_layers=4, num_gpus=8)
    assert message in str(info.value)


def test_device_lists() -> None:
    assert parse_devices("0-3,7", "x") == (0, 1, 2, 3, 7)
    assert parse_devices([4, 5], "x") == (4, 5)
    assert parse_devices(3, "x") == (3,)
    with pytest.raises(PlanError):
        parse_devices([0, "a"], "x")

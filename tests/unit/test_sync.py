"""Gradient synchronisation as a pass (distsim/core/sync.py): the modes' buckets, hand-computed data-parallel
timelines under each mode, the strategy and plan fields that carry them, and the CLI's choices."""

from __future__ import annotations

import pytest

from distsim import Strategy, simulate
from distsim.core.errors import StrategyError
from distsim.core.models import Model
from distsim.core.strategy import check_strategy
from distsim.core.sync import MB, MODES, GradUnit, SyncContext, SyncSettings, ddp_buckets, lower, tensor_bytes
from distsim.plans import Plan, StagePlan, plan_from_dict, plan_to_dict
from distsim.sim.costs import AnalyticCosts
from tests.util import chain_model, hand_cluster, run_cli


def test_ddp_assignment_closes_a_bucket_once_it_reaches_its_limit() -> None:
    # first limit 1 MiB: 0.6 + 0.6 = 1.2 MiB closes it; then 0.3 + 2 = 2.3 >= 1.5 closes the second; 1 MiB is left
    sizes = [round(x * MB) for x in (0.6, 0.6, 0.3, 2.0, 1.0)]
    assert ddp_buckets(sizes, 1.5 * MB, 1.0 * MB) == [[0, 1], [2, 3], [4]]
    assert ddp_buckets([], 25 * MB, MB) == []
    assert ddp_buckets([5 * MB], MB, MB) == [[0]]  # one tensor over the limit is a bucket of its own


def test_tensor_bytes_add_up_to_the_rounded_total() -> None:
    assert tensor_bytes([0.5, 0.5, 0.5], 3) == (2, 1, 1)  # 1.5, 3.0, 4.5 rounded as Python rounds: 2, 3, 4
    assert sum(tensor_bytes([1 / 3] * 7, 2)) == round(7 / 3 * 2)


def _units() -> tuple[GradUnit, ...]:
    return (GradUnit(2, (100, 50)), GradUnit(1, ()), GradUnit(0, (30,)))


def test_each_mode_lowers_to_its_buckets() -> None:
    ctx = SyncContext(_units(), lambda n: 1.0 + n)
    bulk = lower("bulk", ctx)
    assert [(b.nbytes, b.ready) for b in bulk.buckets] == [(180, None)] and bulk.at_end == bulk.buckets
    wfbp = lower("wfbp", ctx)  # the layer without gradients sends nothing
    assert [(b.nbytes, b.ready, b.layers) for b in wfbp.buckets] == [(150, 2, (2,)), (30, 0, (0,))]
    assert wfbp.cuts == {2, 0}
    # DDP walks tensors in reverse registration order: layer 2's second tensor (50 B) first
    tiny = SyncContext(_units(), lambda n: 1.0, settings=SyncSettings(bucket_cap_mb=60 / MB, first_bucket_mb=40 / MB))
    ddp = lower("ddp", tiny)
    assert [b.tensors for b in ddp.buckets] == [((2, 1),), ((2, 0),), ((0, 0),)]
    assert [b.ready for b in ddp.buckets] == [2, 2, 0]
    groups = SyncContext(_units(), lambda n: 1.0, settings=SyncSettings(groups=((0, 2), (2, 3))))
    assert [(b.layers, b.ready) for b in lower("mgwfbp", groups).buckets] == [
        ((2,), 2),
        ((0,), 0),
    ]  # layer 1 has no tensors
    with pytest.raises(ValueError, match="unknown gradient synchronisation 'nope'; choose from bulk, wfbp"):
        lower("nope", ctx)


# Three layers on two GPUs of one node (ring all-reduce over 2: bytes / bandwidth, no latency):
#   forward 1 s each (0-3); backward 2 s each: l2 3-5, l1 5-7, l0 7-9; gradients (fp16) l0 1.0 MB, l1 2.0 MB,
#   l2 0.5 MB at 1 MB/s: all-reduces of 1.0, 2.0 and 0.5 s.
#   wfbp:   l2 5-5.5, l1 7-9, l0 9-10.
#   ddp (cap 1.5 MiB, first bucket 1 MiB; reverse order l2, l1, l0): l2+l1 = 2.5 MB >= 1 MiB closes the first bucket
#           (ready after l1: 7-9.5); l0 alone (9.5-10.5).
#   mgwfbp with groups 0-1 / 1-3: the same buckets as ddp here.
#   bulk:   all 3.5 MB after backward, 9-12.5.
WANT = {
    "bulk": [("grads rank 0", 9.0, 12.5)],
    "wfbp": [("grads l2", 5.0, 5.5), ("grads l1", 7.0, 9.0), ("grads l0", 9.0, 10.0)],
    "ddp": [("grads l2..l1", 7.0, 9.5), ("grads l0", 9.5, 10.5)],
    "mgwfbp": [("grads l2..l1", 7.0, 9.5), ("grads l0", 9.5, 10.5)],
}


@pytest.mark.parametrize("mode", list(WANT))
def test_hand_computed_data_parallel_timeline(mode: str, hand_chain: Model) -> None:
    cluster = hand_cluster(nodes=1, gpus_per_node=2, intra_bw=1e6)
    extra = {"grad_groups": ((0, 1), (1, 3))} if mode == "mgwfbp" else {}
    strategy = Strategy(dp=2, grad_sync=mode, bucket_cap_mb=1.5, **extra)  # type: ignore[arg-type]
    df = simulate(hand_chain, cluster, strategy, AnalyticCosts(cluster)).timeline.df
    rows = df[(df.gpu == 0) & (df.stream == "dp")].sort_values("start_s")
    got = [(r.name, round(r.start_s, 9), round(r.end_s, 9)) for r in rows.itertuples()]
    assert got == WANT[mode]


def test_a_stages_plan_lowers_the_same_buckets(hand_chain: Model) -> None:
    cluster = hand_cluster(nodes=1, gpus_per_node=2, intra_bw=1e6)
    for mode, extra in (("ddp", {"bucket_cap_mb": 1.5}), ("mgwfbp", {"grad_groups": ((0, 1), (1, 3))})):
        plan = Plan.of_stages("hand", "hand", (StagePlan((0, 3), (0, 1)),), micro_batch_size=2,
                              grad_sync=mode, **extra)  # type: ignore[arg-type]  # fmt: skip
        df = simulate(hand_chain, cluster, plan, AnalyticCosts(cluster)).timeline.df
        rows = df[(df.gpu == 0) & (df.stream == "dp")].sort_values("start_s")
        assert [(r.name, round(r.start_s, 9), round(r.end_s, 9)) for r in rows.itertuples()] == WANT[mode]
        assert plan_from_dict(plan_to_dict(plan), "p") == plan


def test_strategy_carries_the_sync_options_and_checks_them(hand_chain: Model) -> None:
    s = Strategy(dp=2, grad_sync="mgwfbp", grad_groups=((0, 1), (1, 3)), bucket_cap_mb=10)
    assert s.describe().endswith("sync=mgwfbp cap=10 groups=0-1/1-3")
    assert Strategy.from_str(s.describe()) == s
    assert set(MODES) >= {"bulk", "wfbp", "ddp", "mgwfbp", "mgwfbp-optimal"}
    for bad, match in (
        ({"grad_sync": "ddp", "grad_groups": ((0, 3),)}, "merge plan of grad_sync mgwfbp, not ddp"),
        ({"grad_sync": "mgwfbp", "grad_groups": ((0, 1), (2, 3))}, "must be consecutive: 0-1 is followed by 2-3"),
        ({"grad_sync": "mgwfbp", "grad_groups": ((1, 1),)}, "not a layer range"),
        ({"bucket_cap_mb": 0}, "bucket_cap_mb must be a positive number"),
        ({"grad_sync": "sometimes"}, "unknown grad_sync 'sometimes'; choose one of bulk, wfbp, ddp"),
    ):
        with pytest.raises(StrategyError, match=match):
            Strategy(dp=2, **bad)  # type: ignore[arg-type]
    with pytest.raises(StrategyError, match="gradient groups cover layers 0-2 but hand has layers 0-3"):
        check_strategy(Strategy(dp=2, grad_sync="mgwfbp", grad_groups=((0, 2),)), hand_chain, hand_cluster(1, 2))
    with pytest.raises(StrategyError, match="groups must be layer ranges like 0-4/4-10"):
        Strategy.from_str("dp=2 sync=mgwfbp groups=0:3")


def test_cli_offers_every_mode(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["simulate", "--help"], capsys)
    assert code == 0
    for name in MODES:
        assert name in out
    args = ["simulate", "--model", "gpt2-cpu", "--cluster", "cpu-1x2", "--strategy", "1M1P2D", "--json"]
    code, out, err = run_cli([*args, "--grad-sync", "ddp", "--bucket-cap-mb", "2"], capsys)
    assert code == 0, err
    code, out, err = run_cli([*args, "--grad-sync", "fast"], capsys)
    assert code == 2 and "'fast' is not one of 'bulk', 'wfbp', 'ddp'" in err


def test_bucket_names_stay_unique_when_ddp_splits_a_layer(hand_chain: Model) -> None:
    from distsim.sim.flow.comm import bucket_names

    tiny = SyncContext(_units(), lambda n: 1.0, settings=SyncSettings(bucket_cap_mb=60 / MB, first_bucket_mb=40 / MB))
    lowered = lower("ddp", tiny)  # layer 2's two tensors land in two buckets
    names = bucket_names(chain_model([(1.0, 2.0, 1, 0.0)] * 3), lowered.buckets, 0)
    assert [names[b] for b in lowered.buckets] == ["grads l2", "grads l2 #2", "grads l0"]
    assert [bucket_names(hand_chain, lower("bulk", tiny).buckets, 3)[b] for b in lower("bulk", tiny).buckets] == [
        "grads rank 3"
    ]


def test_execute_takes_a_uniform_plan_and_refuses_a_stages_plan(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    stages = tmp_path / "stages.yaml"
    stages.write_text("model: gpt2-cpu\ncluster: cpu-1x2\nstages:\n- {layers: [0, 3], devices: 0}\n"
                      "- {layers: [3, 6], devices: 1}\n")  # fmt: skip
    code, _, err = run_cli(["execute", "--plan", str(stages)], capsys)
    assert code == 2 and "is a stages plan" in err and len(err.strip().splitlines()) == 1
    uniform = tmp_path / "u.yaml"
    uniform.write_text("model: gpt2-cpu\ncluster: cpu-1x2\nstrategy: tp=1 pp=1 dp=2 sync=mgwfbp groups=0-3/3-6\n")
    code, _, err = run_cli(["execute", "--plan", str(uniform), "--micro-batches", "4"], capsys)
    assert code == 2 and "--micro-batches does not apply to --plan" in err
    code, _, err = run_cli(["execute", "--plan", str(uniform), "--strategy", "1M1P2D"], capsys)
    assert code == 2 and "give --strategy or --plan, not both" in err

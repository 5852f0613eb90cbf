"""Collocation (DeepPool's GPU multiplexing): a background job in the foreground's idle time, checked by hand.

The hand cluster moves 1000 bytes/s with no latency and runs 1e12 FLOP/s; a layer given as FLOPs per sample costs
its share of the batch (see tests/unit/test_burst_flow.py), and layers without parameters have no all-reduce and a free
optimizer step. The background model is one layer of 0.25 s per sample forward (0.5 s backward): at batch 2 one
iteration takes 0.5 + 1.0 = 1.5 s.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from distsim import simulate
from distsim.core.cluster import get_cluster
from distsim.core.errors import DistsimError, ProfileError
from distsim.core.models import get_model
from distsim.core.strategy import Strategy
from distsim.io.files import write_plan
from distsim.plans import burst_plan
from distsim.search.collocate import (
    CollocationError,
    background_grain,
    background_iteration,
    collocation_report,
    gpu_gaps,
    idle_gaps,
    split_sizes,
    usable,
)
from distsim.sim.costs import DEEPPOOL_COLLOCATION_SLOWDOWN, AnalyticCosts, ProfileCosts
from distsim.sim.profile_db import Collocation, ProfileDB
from tests.unit.test_burst_flow import NO_HOST, flops_model
from tests.util import hand_cluster, run_cli

CHAIN = flops_model([(1.0, 0, 100.0), (2.0, 0, 300.0), (0.5, 0, 0.0)])
"""The 1 -> 2 -> 1 chain of test_burst_flow.test_a_1_2_1_chain_by_hand (15.8 s at batch 2; GPU 0 idles 4-4.1 and
11.4-11.7; GPU 1 is busy 2-4.4 (the transfers and its F1) and 7.4-11.8, so it idles 4.4-7.4 and 11.8-2 of the next
iteration: 3 s and 6 s)."""
BACKGROUND = flops_model([(0.25, 0, 0.0)])
BG_ITERATION_S = 1.5


def _chain(gpus: int = 2) -> tuple[Any, Any]:
    cluster = hand_cluster(gpus_per_node=gpus)
    return cluster, burst_plan(CHAIN, cluster, [1, 2, 1], 2)


def _report(slowdown: float, min_gap_s: float = 0.0, gpus: int = 2, **kw: Any) -> Any:
    cluster, plan = _chain(gpus)
    return collocation_report(CHAIN, cluster, plan, BACKGROUND, background_batch=2, slowdown=slowdown,
                              min_gap_s=min_gap_s, options=NO_HOST, **kw)  # fmt: skip


# ------------------------------------------------------------------------------------------------------ gaps
def test_idle_gaps_join_the_tail_and_the_next_iterations_head() -> None:
    busy = (np.array([1.0, 4.0]), np.array([3.0, 6.0]))
    assert idle_gaps(busy, 10.0) == pytest.approx([1.0, 5.0])  # 3-4, then 6-10 and 0-1
    assert idle_gaps((np.array([0.0]), np.array([10.0])), 10.0) == []  # never idle
    assert idle_gaps((np.empty(0), np.empty(0)), 10.0) == [10.0]  # idle all iteration
    assert usable([0.1, 0.3, 3.0, 6.0], 0.5) == [3.0, 6.0]


def test_the_chains_gaps_by_hand() -> None:
    cluster, plan = _chain(gpus=4)
    gaps = gpu_gaps(simulate(CHAIN, cluster, plan, options=NO_HOST))
    assert gaps[0] == pytest.approx([0.1, 0.3]) and gaps[1] == pytest.approx([3.0, 6.0])
    assert gaps[2] == gaps[3] == pytest.approx([15.8])  # GPUs the plan does not use


def test_the_background_iteration_is_a_one_gpu_simulation() -> None:
    r = background_iteration(BACKGROUND, hand_cluster(), 2, options=NO_HOST)
    assert r.num_gpus == 1 and r.iteration_time_s == pytest.approx(BG_ITERATION_S)
    with pytest.raises(CollocationError, match="at least 1 sample"):
        background_iteration(BACKGROUND, hand_cluster(), 0)


# -------------------------------------------------------------------------------------------------- by hand
def test_no_interference_by_hand() -> None:
    """f = 0: the foreground is as alone (15.8 s); the background fills GPU 1's 9 s and GPU 0's 0.4 s of each
    iteration at 1.5 s per iteration of 2 samples."""
    r = _report(0.0)
    assert r.collocated_iteration_s == r.alone_iteration_s == pytest.approx(15.8) and r.foreground_slowdown == 1.0
    g0, g1 = r.shares
    assert (g0.idle_s, g0.usable_s, g0.gaps, g0.hosts) == pytest.approx((0.4, 0.4, 2, True))
    assert (g1.idle_s, g1.usable_s, g1.gaps, g1.hosts) == pytest.approx((9.0, 9.0, 2, True))
    assert g1.background_samples_per_s == pytest.approx(9.0 / BG_ITERATION_S / 15.8 * 2)
    assert r.background_samples_per_s == pytest.approx(9.4 / BG_ITERATION_S / 15.8 * 2)
    assert r.foreground_samples_per_s == pytest.approx(2 / 15.8)
    assert r.total_samples_per_s == pytest.approx(2 / 15.8 + 9.4 / BG_ITERATION_S / 15.8 * 2)


def test_interference_by_hand() -> None:
    """f = 1 (compute twice as long) on GPU 1 only (GPU 0's gaps are under the 0.5 s minimum): GPU 1's F1 takes 4 s
    (2.1-6.1), its sample goes back 6.1-6.4, F2 6.4-7.4, B2 7.4-9.4, the gradient out 9.4-9.7, GPU 1's B1 8 s
    (9.7-17.7), its gradient back 17.7-17.8 and B0 17.8-21.8. GPU 1 is busy 2-6.4 and 9.4-17.8: idle 3 + 6 s."""
    r = _report(1.0, min_gap_s=0.5)
    assert r.hosts == [1]
    assert r.collocated_iteration_s == pytest.approx(21.8)
    assert r.foreground_slowdown == pytest.approx(21.8 / 15.8)
    g0, g1 = r.shares
    assert not g0.hosts and g0.usable_s == 0 and g0.background_samples_per_s == 0
    assert g0.idle_s == pytest.approx(6.4)  # idle now, but it was not alone: decided once, on the foreground alone
    assert (g1.idle_s, g1.usable_s) == pytest.approx((9.0, 9.0))
    assert g1.background_samples_per_s == pytest.approx(9.0 / BG_ITERATION_S / 21.8 * 2)


def test_the_minimum_gap_leaves_short_gaps_unused() -> None:
    r = _report(0.0, min_gap_s=4.0)  # GPU 1's 3 s gap is too short, its 6 s gap not
    assert r.hosts == [1] and r.shares[1].usable_s == pytest.approx(6.0) and r.shares[1].gaps == 1
    assert r.background_samples_per_s == pytest.approx(6.0 / BG_ITERATION_S / 15.8 * 2)


def test_the_default_minimum_gap_is_the_backgrounds_mean_layer() -> None:
    """The background's forward (0.5 s) and backward (1 s) average 0.75 s: GPU 0's gaps (0.1 and 0.3 s) are too
    short, GPU 1's (3 and 6 s) are not."""
    cluster, plan = _chain()
    assert background_grain(background_iteration(BACKGROUND, cluster, 2, options=NO_HOST)) == pytest.approx(0.75)
    r = collocation_report(CHAIN, cluster, plan, BACKGROUND, background_batch=2, slowdown=0.0, options=NO_HOST)
    assert r.min_gap_s == pytest.approx(0.75) and not r.min_gap_given
    assert r.hosts == [1] and r.shares[1].usable_s == pytest.approx(9.0)
    assert _report(0.0, min_gap_s=0.0).min_gap_given


def test_a_gpu_the_foreground_does_not_use_runs_the_background_all_iteration() -> None:
    r = _report(0.5, gpus=3)
    assert r.shares[2].hosts and r.shares[2].usable_s == pytest.approx(r.collocated_iteration_s)
    assert r.shares[2].background_samples_per_s == pytest.approx(2 / BG_ITERATION_S)


def test_static_partitions_by_hand() -> None:
    """2 GPUs: k = 1 runs the whole batch on GPU 0 (F 2 + 4 + 1 s, B twice that: 21 s) beside one background job
    alone (2 samples per 1.5 s); k = 2 is plain data parallelism, a sample per GPU (10.5 s, no parameters: no
    all-reduce)."""
    one, two = _report(0.0).splits
    assert (one.foreground_gpus, one.background_gpus, one.iteration_s) == (1, 1, pytest.approx(21.0))
    assert one.foreground_samples_per_s == pytest.approx(2 / 21) and one.background_samples_per_s == pytest.approx(
        2 / 1.5
    )
    assert one.total_samples_per_s == pytest.approx(2 / 21 + 2 / 1.5)
    assert (two.foreground_gpus, two.background_gpus, two.iteration_s) == (2, 0, pytest.approx(10.5))
    assert two.background_samples_per_s == 0
    assert split_sizes(8) == [1, 2, 4, 8] and split_sizes(6) == [1, 2, 4, 6] and split_sizes(1) == [1]


def test_a_partition_wider_than_the_batch_is_reported_not_run() -> None:
    cluster = hand_cluster(gpus_per_node=4)
    plan = burst_plan(CHAIN, cluster, [1, 2, 1], 2)
    r = collocation_report(CHAIN, cluster, plan, BACKGROUND, background_batch=2, options=NO_HOST)
    wide = r.splits[-1]
    assert wide.foreground_gpus == 4 and wide.iteration_s is None and "cannot be split over 4" in wide.note


def test_explicit_hosts_and_bad_parameters() -> None:
    r = _report(0.2, hosts=[0])
    assert r.hosts == [0] and r.shares[1].background_samples_per_s == 0
    for kw, message in (({"slowdown": -0.1}, "slowdown must be"), ({"min_gap_s": float("nan")}, "minimum usable gap"),
                        ({"hosts": [5]}, "GPU 5 is not in the cluster")):  # fmt: skip
        with pytest.raises(CollocationError, match=message):
            _report(**{"slowdown": 0.0, **kw})


# ------------------------------------------------------------------------------------------------ invariants
def test_a_gpu_that_is_never_idle_gets_no_background_and_is_not_slowed() -> None:
    model = flops_model([(1.0, 0, 0.0), (0.5, 0, 0.0)])
    cluster = hand_cluster(gpus_per_node=2)
    plan = burst_plan(model, cluster, [2, 2], 2)  # both GPUs busy end to end: no transfer, no all-reduce
    r = collocation_report(model, cluster, plan, BACKGROUND, background_batch=2, slowdown=0.5, options=NO_HOST)
    assert r.hosts == [] and r.background_samples_per_s == 0
    assert r.collocated_iteration_s == r.alone_iteration_s


@st.composite
def _scenario(draw: Any) -> tuple[Any, Any, Any]:
    n = draw(st.integers(2, 4))
    layers = [(draw(st.sampled_from([0.1, 0.5, 1.0])), draw(st.integers(0, 2000)),
               draw(st.sampled_from([0.0, 100.0, 1500.0]))) for _ in range(n)]  # fmt: skip
    batch = draw(st.integers(1, 4))
    counts = [draw(st.integers(1, min(batch, 4))) for _ in range(n)]
    model = flops_model(layers)
    plan = burst_plan(model, "hand", counts, batch, grad_sync=draw(st.sampled_from(["bulk", "wfbp"])))
    return model, plan, draw(st.sampled_from([0.0, 0.05, 0.5, 2.0]))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scenario())
def test_collocation_invariants(scenario: tuple[Any, Any, float]) -> None:
    """Collocation never makes the foreground faster; with f = 0 it leaves it exactly as alone; the background runs
    only in the collocated foreground's idle time, in proportion to the usable part of it; a longer minimum gap (the
    default, 0.75 s, against 0) never gives the background more."""
    model, plan, f = scenario
    cluster = hand_cluster(gpus_per_node=4)
    r = collocation_report(model, cluster, plan, BACKGROUND, background_batch=2, slowdown=f, min_gap_s=0.0,
                           options=NO_HOST, baselines=False)  # fmt: skip
    assert r.collocated_iteration_s >= r.alone_iteration_s - 1e-12 and r.foreground_slowdown >= 1 - 1e-12
    if f == 0:
        assert r.collocated_iteration_s == r.alone_iteration_s
    t, bg = r.collocated_iteration_s, r.background_iteration_s
    stats = {s.gpu: s for s in r.collocated.per_gpu}
    for s in r.shares:
        busy_bg = s.background_samples_per_s / 2 * bg * t  # background seconds per foreground iteration
        assert busy_bg <= s.idle_s + 1e-9 and s.usable_s <= s.idle_s + 1e-12
        if s.gpu in stats:
            assert s.idle_s == pytest.approx(stats[s.gpu].idle_s, abs=1e-9)
        if s.idle_s == 0:
            assert s.background_samples_per_s == 0
    hosted = sorted((s.usable_s, s.background_samples_per_s) for s in r.shares if s.hosts)
    assert all(a[1] <= b[1] + 1e-12 for a, b in itertools.pairwise(hosted))  # monotone in idle time
    if f == 0:
        longer = collocation_report(model, cluster, plan, BACKGROUND, background_batch=2, slowdown=0.0,
                                    options=NO_HOST, baselines=False)  # fmt: skip
        for a, b in zip(r.shares, longer.shares, strict=True):
            assert b.background_samples_per_s <= a.background_samples_per_s + 1e-12


def test_a_symmetric_strategys_gaps_stand_for_every_replica() -> None:
    """A 2-stage pipeline replicated twice: its bubbles idle each stage's GPUs alike, so the background gets the
    same on both replicas of a stage."""
    model = flops_model([(0.5, 0, 100.0)] * 4)
    cluster = hand_cluster(gpus_per_node=4)
    strategy = Strategy(pp=2, dp=2, num_micro_batches=2)
    r = collocation_report(model, cluster, strategy, BACKGROUND, background_batch=2, slowdown=0.0, options=NO_HOST)
    assert r.alone.flow.symmetric and len(r.shares) == 4
    rates = sorted(round(s.background_samples_per_s, 9) for s in r.shares)
    assert rates[0] == rates[1] > 0 and rates[2] == rates[3] > 0  # each stage's two replicas alike
    assert r.splits[-1].foreground_gpus == 4 and r.splits[-1].iteration_s is not None


# -------------------------------------------------------------------------------------------- the cost source
def test_the_slowdown_comes_from_the_cost_source() -> None:
    cluster = hand_cluster()
    analytic = AnalyticCosts(cluster).collocation_slowdown()
    assert analytic.fraction == DEEPPOOL_COLLOCATION_SLOWDOWN == 0.18 and analytic.source == "analytic"
    measured = Collocation(0.07, 1e-3, 2.0e-3, 2.07e-3, 100, "cpu: test", 0.4)
    db = ProfileDB(collocation=measured)
    got = ProfileCosts(db, AnalyticCosts(cluster)).collocation_slowdown()
    assert (got.fraction, got.source, got.detail) == (0.07, "measured", "cpu: test")
    assert ProfileCosts(ProfileDB(), AnalyticCosts(cluster)).collocation_slowdown() == analytic
    with pytest.raises(ProfileError, match="collocat"):
        ProfileCosts(ProfileDB(), AnalyticCosts(cluster), strict=True).collocation_slowdown()
    cluster2, plan = _chain()
    r = collocation_report(CHAIN, cluster2, plan, BACKGROUND, ProfileCosts(db, AnalyticCosts(cluster2)),
                           background_batch=2, options=NO_HOST)  # fmt: skip
    assert r.slowdown.fraction == 0.07 and r.slowdown.source == "measured"


def test_the_profile_keeps_the_collocation_record() -> None:
    measured = Collocation(0.07, 1e-3, 2.0e-3, 2.07e-3, 100, "cpu: test", 0.4)
    data = ProfileDB(collocation=measured).to_dict()
    assert data["version"] == 1 and data["collocation"]["slowdown"] == 0.07
    assert ProfileDB.from_dict(json.loads(json.dumps(data))).collocation == measured
    assert ProfileDB().merge(ProfileDB(collocation=measured)).collocation == measured
    assert ProfileDB(collocation=measured).merge(ProfileDB()).collocation == measured
    bad = {**data, "collocation": {**data["collocation"], "slowdown": -0.2}}
    with pytest.raises(ProfileError, match="collocation: slowdown must be >= 0"):
        ProfileDB.from_dict(bad)
    with pytest.raises(ProfileError, match=r"collocation: malformed entry \(missing 'cycles'\)"):
        ProfileDB.from_dict({**data, "collocation": {"slowdown": 0.1, "compute_s": 1, "alone_s": 1,
                                                     "collocated_s": 1}})  # fmt: skip


# ------------------------------------------------------------------------------------------------ command line
def _vgg_plan(tmp_path: Path) -> str:
    path = tmp_path / "vgg16-burst.plan.yaml"
    cluster = get_cluster("dgx-a100").with_nodes(1)
    write_plan(str(path), burst_plan(get_model("vgg16"), cluster, [8] * 18 + [1] * 3, 32))
    return str(path)


def test_simulate_prints_the_collocation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = _vgg_plan(tmp_path)
    rc, out, err = run_cli(["simulate", "--plan", plan, "--background", "vgg16", "--background-batch", "4",
                            "--background-gpus", "1-7"], capsys)  # fmt: skip
    assert rc == 0, err
    section = out[out.index("collocation: background vgg16 at batch 4, one single-GPU job on GPUs 1-7") :]
    for line in ("foreground alone", "foreground collocated", "total cluster", "(analytic: DeepPool section 7.1",
                 "(plain data parallelism)"):  # fmt: skip
        assert line in section
    rc, out, err = run_cli(["simulate", "--plan", plan, "--background", "resnet50", "--json"], capsys)
    data = json.loads(out)["collocation"]
    assert rc == 0 and data["background"] == "resnet50" and data["foreground_slowdown"] >= 1
    assert [s["foreground_gpus"] for s in data["static_splits"]] == [1, 2, 4, 8]
    assert data["total_samples_per_s"] == pytest.approx(
        data["foreground_samples_per_s"] + data["background_samples_per_s"]
    )


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--background", "resnet5"], "distsim: error: unknown model 'resnet5'"),
        (["--background-gpus", "1-7"], "--background-gpus needs --background MODEL"),
        (["--background", "vgg16", "--samples", "3"], "drop --samples"),
        (["--background", "vgg16", "--background-gpus", "9"], "background GPU 9 is not in the cluster"),
    ],
)
def test_bad_background_options_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    rc, _, err = run_cli(["simulate", "--plan", _vgg_plan(tmp_path), *extra], capsys)
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_strategy_foreground_collocates_too(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run_cli(["simulate", "--model", "vgg16", "--cluster", "dgx-a100", "--nodes", "1", "--strategy",
                            "1M1P8D", "--micro-batch-size", "4", "--background", "resnet50",
                            "--collocation-slowdown", "0"], capsys)  # fmt: skip
    assert rc == 0, err
    assert "slowdown 1.000x" in out and "(given)" in out


def test_stragglers_keep_their_own_factor() -> None:
    cluster, plan = _chain()
    slow = cluster.with_slowdown({1: 2.0})
    r = collocation_report(CHAIN, slow, plan, BACKGROUND, background_batch=2, slowdown=0.0, min_gap_s=0.5,
                           options=NO_HOST, baselines=False)  # fmt: skip
    assert r.collocated.cluster.speed_factor(1) == 2.0  # the straggler's factor times 1 + 0
    assert r.collocated_iteration_s == r.alone_iteration_s == pytest.approx(21.8)  # as f = 1 above
    assert replace(r, splits=()).plain_dp is None


def test_scaling_curves_refuses_an_empty_table_or_a_missing_column() -> None:
    import pandas as pd

    from distsim.io.plots import scaling_curves

    table = pd.DataFrame({"gpus": [1, 2, 4], "burst": [3.0, 2.0, 1.5]})
    assert len(scaling_curves(table, ["burst"], "ms").lines) == 1
    with pytest.raises(DistsimError, match="no rows"):
        scaling_curves(table.iloc[0:0], ["burst"], "ms")
    with pytest.raises(DistsimError, match="no column 'dp'"):
        scaling_curves(table, ["burst", "dp"], "ms")

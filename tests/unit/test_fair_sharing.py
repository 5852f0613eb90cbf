"""Fair link sharing (issue 21, mechanism 2): inter-node transfers of any pattern share each node's NICs while, and only
while, they overlap (:mod:`distsim.sim.network`).

Hand-checked cases use ``tests.util.hand_cluster``: one NIC per node moving 1000 bytes/s, no latency, so a ring
all-reduce of B bytes over 2 ranks (2(n-1)/n B = B on the wire) or a transfer of B bytes takes B/1000 s alone. Layers
are fp16, 2 gradient bytes per parameter. In the drawings ``=`` is a task at full rate, ``-`` at a shared one.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from distsim import FlowOptions, Strategy, get_cluster, get_model, simulate
from distsim.core.errors import DistsimError
from distsim.core.models import model_from_dict
from distsim.core.placement import Placement, pair_instances, shares_evenly
from distsim.plans import stages_plan
from distsim.plans.simulate import estimate_size
from distsim.sim import engine, network
from distsim.sim.costs import AnalyticCosts
from distsim.sim.flow.events import resolve_partition
from distsim.sim.flow.uniform import build_flow
from distsim.sim.network import NetUse, run_shared
from tests.unit.test_engine import _dags
from tests.unit.test_inputs import _slack
from tests.unit.test_invariants import Scenario, _rows, _run, scenarios
from tests.util import InterferingCosts, chain_model, hand_cluster, run_cli

FAIR = FlowOptions(link_sharing="fair")
EXAMPLES = int(os.environ.get("DISTSIM_HYPOTHESIS_EXAMPLES", "80"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _dp(r, stage: int | None = None) -> list[tuple[float, float]]:  # type: ignore[no-untyped-def]
    """(start, end) of the gradient all-reduces (of one pipeline stage), in start order."""
    df = r.timeline.df
    rows = df[df["kind"] == "dp_allreduce"]
    if stage is not None:
        rows = rows[rows["stage"] == stage]
    return sorted({(round(a, 9), round(b, 9)) for a, b in zip(rows["start_s"], rows["end_s"], strict=True)})


# ------------------------------------------------------------------------------------------------ by hand
def _sharded(params: int) -> object:
    """One layer split over the tensor-parallel ranks (no tensor-parallel all-reduce): forward 1 s, backward 2 s."""
    layer = {"name": "l0", "forward_s": 1.0, "backward_s": 2.0, "params": params, "out_bytes": 0.0, "tp": "shard"}
    return model_from_dict({"name": "hand", "layers": [layer]})


def test_two_groups_on_one_node_take_twice_as_long_together_as_alone() -> None:
    """tp=2 x dp=2 on 2 nodes of 2 GPUs: the dp groups {0,2} and {1,3} (one per tp rank) both cross between node 0 and
    node 1, at the same time. Each all-reduces 1000 bytes (500 parameters per tp shard): alone 1 s at 1000 B/s; the
    two share each node's NIC, 500 B/s each, so 2 s.

        GPU 0,1,2,3  F 0-0.5 | B 0.5-1.5 | all-reduce 1.5 ------- 3.5     (both groups, 500 B/s each)
        alone (tp=1 x dp=2 on 2 nodes of 1 GPU, one group):  F 0-1 | B 1-3 | all-reduce 3 ===== 4
    """
    cluster = hand_cluster(nodes=2, gpus_per_node=2)
    together = simulate(_sharded(1000), cluster, Strategy(tp=2, dp=2), options=FAIR)
    assert together.flow.symmetric and len(together.flow.network) == 1  # one task stands for both groups
    assert _dp(together) == [(1.5, 3.5)]
    assert together.iteration_time_s == pytest.approx(3.5)
    full = simulate(_sharded(1000), cluster, Strategy(tp=2, dp=2), options=replace(FAIR, symmetric=False))
    assert not full.flow.symmetric and len(full.flow.network) == 2
    assert _dp(full) == [(1.5, 3.5)]
    # one group alone: 500 parameters unsplit (tp=1) are the same 1000 bytes; it has the NICs to itself
    alone = simulate(_sharded(500), hand_cluster(nodes=2, gpus_per_node=1), Strategy(tp=1, dp=2), options=FAIR)
    assert _dp(alone) == [(3.0, 4.0)]
    # fully overlapping, fair sharing gives what the structural mode's static share (2 sharers) gives
    assert simulate(_sharded(1000), cluster, Strategy(tp=2, dp=2)).iteration_time_s == pytest.approx(3.5)


def test_offset_groups_share_only_while_they_overlap() -> None:
    """pp=2 x dp=2, rank order tp,pp,dp on 2 nodes of 2 GPUs: stage 0 on GPUs 0 and 2, stage 1 on GPUs 1 and 3, so
    both stages' dp groups cross between node 0 and node 1, and the activation/gradient transfers stay inside a node.
    GPipe, one micro-batch, 1 s per forward and backward; each stage all-reduces 2000 bytes (1000 parameters): 2 s
    alone. Stage 1's starts after its backward (3 s), stage 0's one second later (4 s):

        stage 0   F0 0-1 .............. B0 3-4 | AR0 4 ----------- 6 ====== 7
        stage 1          F1 1-2 | B1 2-3 | AR1 3 ===== 4 ----------- 6
        AR1: 3-4 alone at 1000 B/s (1000 B), 4-6 at 500 B/s (1000 B): done at 6
        AR0: 4-6 at 500 B/s (1000 B), then alone 6-7 at 1000 B/s (1000 B): done at 7

    The structural mode never shares them (one group per stage pattern): 3-5 and 4-6, iteration 6."""
    model = chain_model([(1.0, 1.0, 1000, 0.0), (1.0, 1.0, 1000, 0.0)])
    strategy = Strategy(pp=2, dp=2, num_micro_batches=1, schedule="gpipe")
    cluster = hand_cluster(nodes=2, gpus_per_node=2)
    fair = simulate(model, cluster, strategy, options=replace(FAIR, rank_order="tp,pp,dp"))
    assert _dp(fair, 1) == [(3.0, 6.0)] and _dp(fair, 0) == [(4.0, 7.0)]
    assert fair.iteration_time_s == pytest.approx(7.0)
    structural = simulate(model, cluster, strategy, options=FlowOptions(rank_order="tp,pp,dp"))
    assert _dp(structural, 1) == [(3.0, 5.0)] and _dp(structural, 0) == [(4.0, 6.0)]
    assert structural.iteration_time_s == pytest.approx(6.0)


def test_groups_on_separate_nodes_do_not_slow_each_other() -> None:
    """The first test's two dp groups placed on separate nodes (rank order dp,tp,pp on 4 nodes of 1 GPU: group
    {0,1} on nodes 0 and 1, group {2,3} on nodes 2 and 3): they overlap in time but share no NIC, so each takes its
    1 s alone.

        GPU 0,1,2,3  F 0-0.5 | B 0.5-1.5 | all-reduce 1.5 ===== 2.5     (each group alone on its nodes)
    """
    options = replace(FAIR, rank_order="dp,tp,pp")
    r = simulate(_sharded(1000), hand_cluster(nodes=4, gpus_per_node=1), Strategy(tp=2, dp=2), options=options)
    assert _dp(r) == [(1.5, 2.5)] and r.iteration_time_s == pytest.approx(2.5)
    assert r.flow.network and not r.tasks.slowed  # type: ignore[attr-defined]


def test_pipeline_send_shares_a_nic_with_an_all_reduce() -> None:
    """pp=2 x dp=2 on 4 nodes of 1 GPU (stage 0 on nodes 0 and 1, stage 1 on nodes 2 and 3), GPipe, one
    micro-batch. Layer 0 sends 1000 bytes of activations forward and of gradients back (1 s alone); each stage
    all-reduces 1000 bytes (1 s alone). After stage 1's backward (4 s) its gradient send 2->0 and its all-reduce over
    nodes 2 and 3 start together and both send through node 2's NIC (node 3's is shared the same way by the other
    replica's send 3->1): 500 B/s each, 2 s.

        stage 0   F0 0-1 | act 1 == 2 ................................ B0 6-7 | AR0 7 == 8
        stage 1                    F1 2-3 | B1 3-4 | grad 4 ------- 6
                                                   | AR1  4 ------- 6
    The structural mode overlaps traffic of different kinds freely: grad 4-5, AR1 4-5, B0 5-6, AR0 6-7."""
    model = chain_model([(1.0, 1.0, 500, 1000.0), (1.0, 1.0, 500, 0.0)])
    strategy = Strategy(pp=2, dp=2, num_micro_batches=1, schedule="gpipe")
    cluster = hand_cluster(nodes=4, gpus_per_node=1)
    fair = simulate(model, cluster, strategy, options=FAIR)
    df = fair.timeline.df
    grad = df[df["name"] == "grad 1->0"]
    assert list(zip(grad["start_s"], grad["end_s"], strict=True)) == [(4.0, 6.0)]
    assert _dp(fair, 1) == [(4.0, 6.0)] and _dp(fair, 0) == [(7.0, 8.0)]
    assert fair.iteration_time_s == pytest.approx(8.0)
    assert simulate(model, cluster, strategy).iteration_time_s == pytest.approx(7.0)
    # every GPU simulated gives the same timeline
    full = simulate(model, cluster, strategy, options=replace(FAIR, symmetric=False))
    assert _rows(fair.full_timeline().df) == _rows(full.timeline.df)


def test_engine_rates_piecewise_with_latency() -> None:
    """The engine alone. One resource of 1000 B/s. A: 2000 B then 0.5 s of latency (2.5 s alone), from 0; B: 500 B
    (0.5 s alone), after a 1 s task C.

        A  0 ====== 1 ------- 2 === 2.5 (bytes done) + 0.5 latency = 3.0
        C  0 ====== 1
        B           1 ------- 2
        A: 1000 B alone, then 500 B at 500 B/s beside B, then 500 B alone; B: 500 B at 500 B/s.
    Counting two copies on the resource (a task standing for two identical instances) halves its rate alone."""
    a = NetUse(((0, 1),), 0.5, 2000.0, 1000.0, 1000.0)
    b = NetUse(((0, 1),), 0.0, 500.0, 1000.0, 1000.0)
    r = run_shared([2.5, 0.5, 1.0], [[], [2], []], {}, {0: a, 1: b}, 1000.0)
    assert r.start_s == [0.0, 1.0, 0.0]
    assert r.end_s == pytest.approx([3.0, 2.0, 1.0])
    assert r.slowed == {0, 1}
    twice = run_shared([2.5], [[]], {}, {0: replace(a, usage=((0, 2),))}, 1000.0)
    assert twice.end_s == pytest.approx([4.5])  # 2000 B at 500 B/s, then the latency
    # a transfer capped at one NIC does not go faster on a node with two
    capped = run_shared([2.5], [[]], {}, {0: a}, 2000.0)
    assert capped.end_s == [2.5] and not capped.slowed


def test_processor_sharing_is_not_monotone_in_bandwidth() -> None:
    """Why monotonicity is not a theorem of fair sharing (a Graham-type anomaly, as with first-come arbitration):
    W (10 B, on another node's NIC) gates X (100 B); Y (4 B) follows 6 s of compute and gates 100 s of compute.
    At 1 B/s W ends at 10, exactly when Y does, so X never overlaps Y: 110 s. At 1.5 B/s W ends at 6.67 and X
    shares Y's NIC from then: Y moves 1 B alone (6-6.67), then 3 B at 0.75 B/s, ending at 10.67: 110.67 s.

        1 B/s    W 0 ========= 10 | X 10 ======...       Y 6 ==== 10 | compute 10 ... 110
        1.5 B/s  W 0 ===== 6.67 | X 6.67 ------...       Y 6 = 6.67 ------ 10.67 | compute ... 110.67
    """

    def run(bw: float) -> float:
        def use(resource: int, nbytes: float) -> NetUse:
            return NetUse(((resource, 1),), 0.0, nbytes, bw, bw)

        network = {0: use(4, 10.0), 1: use(0, 100.0), 3: use(0, 4.0)}
        durations = [10.0 / bw, 100.0 / bw, 6.0, 4.0 / bw, 100.0]
        return run_shared(durations, [[], [0], [], [2], [3]], {}, network, bw).makespan_s

    assert run(1.0) == pytest.approx(110.0)
    assert run(1.5) == pytest.approx(110.0 + 2 / 3)
    assert run(2.0) == pytest.approx(110.0)


def test_symmetry_falls_back_where_instances_see_different_loads() -> None:
    """Two transfer patterns whose instances meet different loads: sends 0->2 and 1->3 (nodes of one GPU) beside a
    pattern whose two transfers both leave node 0; the first pattern's instance on node 0 shares, the one on node 1
    does not, so one simulated instance cannot stand for both."""
    even = pair_instances([(0, 2), (1, 3)], 1)[0].pattern
    crowded = pair_instances([(0, 4), (0, 5)], 1)[0].pattern
    assert even is not None and crowded is not None
    assert shares_evenly([(even, True)]) and shares_evenly([(crowded, True)])
    assert not shares_evenly([(even, True), (crowded, True)])
    # GPT-style pipelines on DGX-like nodes do share evenly: the symmetric simulation is kept
    cluster = hand_cluster(nodes=8, gpus_per_node=4)
    placement = Placement(Strategy(tp=4, pp=2, dp=4), cluster)
    assert placement.shares_evenly([(0, 1)])


def test_the_default_mode_records_no_network_tasks_and_fair_is_refused_nowhere() -> None:
    model = chain_model([(1.0, 1.0, 500, 1000.0), (1.0, 1.0, 500, 0.0)])
    strategy = Strategy(pp=2, dp=2, num_micro_batches=2)
    cluster = hand_cluster(nodes=4, gpus_per_node=1)
    assert not build_flow(model, cluster, strategy, AnalyticCosts(cluster)).network
    assert build_flow(model, cluster, strategy, AnalyticCosts(cluster), FAIR).network
    with pytest.raises(DistsimError, match="structural, serialize, fair"):
        FlowOptions(link_sharing="first-come")


def test_a_uniform_stages_plan_shares_like_its_strategy() -> None:
    """The stages flow emits its transfers and gradient all-reduces through the same writer: a stages plan that is
    a uniform strategy gives the same fair-shared iteration (every GPU simulated), as does the symmetric simulation of
    the strategy."""
    model, cluster = get_model("gpt2-345m"), get_cluster("distsim-a10")
    strategy = Strategy.from_str("1M8P2D", num_micro_batches=8, micro_batch_size=2, grad_sync="wfbp")
    costs = AnalyticCosts(cluster)
    full = replace(FAIR, symmetric=False)
    plan = stages_plan(strategy, cluster, resolve_partition(model, strategy, costs), model.name)
    a = simulate(model, cluster, strategy, costs, full)
    b = simulate(model, cluster, plan, costs, full)
    assert a.flow.network and len(b.flow.network) == len(a.flow.network)
    assert b.iteration_time_s == a.iteration_time_s
    sym = simulate(model, cluster, strategy, costs, FAIR)
    assert sym.flow.symmetric and sym.iteration_time_s == pytest.approx(a.iteration_time_s, rel=1e-12)


def test_cli_takes_fair(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--model", "gpt2-345m", "--cluster", "distsim-testbed", "--strategy", "2M2P4D",
            "--micro-batches", "4", "--json"]  # fmt: skip
    code, out, err = run_cli([*args, "--link-sharing", "fair"], capsys)
    assert code == 0, err
    assert json.loads(out)["iteration_time_s"] > 0


# ------------------------------------------------------------------------------------------------ properties
def _fair(sc: Scenario) -> Scenario:
    return replace(sc, options=replace(sc.options, link_sharing="fair"))


@settings(max_examples=300, deadline=None)
@given(_dags(), st.data())
def test_shared_engine_equals_the_longest_path_when_nothing_shares(dag, data: st.DataObject) -> None:  # type: ignore[no-untyped-def]
    """Random DAGs (with release constraints) whose network tasks each have a NIC of their own: bit for bit."""
    durations, deps, releases = dag
    net = {}
    for i, d in enumerate(durations):
        if data.draw(st.booleans()):
            latency = d * data.draw(st.sampled_from([0.0, 0.25, 1.0]))
            net[i] = NetUse(((i, 1),), latency, (d - latency) * 100.0, 100.0, 100.0)
    shared = run_shared(durations, deps, releases, net, 100.0)
    alone = engine.run(durations, deps, releases)
    assert shared.start_s == alone.start_s and shared.end_s == alone.end_s and not shared.slowed


@SETTINGS
@given(scenarios())
def test_flows_where_nothing_shares_run_as_by_the_longest_path(sc: Scenario) -> None:
    """A fair flow is run by the shared engine; where no network task shared a NIC for any time it gives the
    longest path bit for bit, and in every case it is the longest path of the durations it realised."""
    sc = _fair(sc)
    costs = InterferingCosts(sc.cluster, slowdowns=sc.interference, launch_s=sc.launch_s)
    flow = build_flow(sc.model, sc.cluster, sc.strategy, costs, sc.options)
    shared = network.run_flow(flow)
    slowed = getattr(shared, "slowed", ())  # the longest path (no network task) slows nothing
    event(f"network tasks: {bool(flow.network)}, slowed: {bool(slowed)}")
    alone = engine.run(flow.duration_s, flow.deps, flow.releases)
    if not slowed:
        assert shared.start_s == alone.start_s and shared.end_s == alone.end_s
    realised = [e - s for s, e in zip(shared.start_s, shared.end_s, strict=True)]
    again = engine.run(realised, flow.deps, flow.releases)
    assert again.end_s == pytest.approx(shared.end_s, abs=1e-9)
    for i, d in enumerate(flow.duration_s):  # sharing only ever slows a task
        assert realised[i] >= d - 1e-9


@SETTINGS
@given(scenarios())
def test_symmetric_and_full_fair_simulations_agree(sc: Scenario) -> None:
    sc = _fair(sc)
    auto = _run(sc)
    full = _run(sc, options=replace(sc.options, symmetric=False))
    event(f"symmetric={auto.flow.symmetric}, network tasks: {bool(full.flow.network)}")
    assert auto.iteration_time_s == pytest.approx(full.iteration_time_s, abs=1e-9)
    assert _rows(auto.full_timeline().df) == _rows(full.timeline.df)


@SETTINGS
@given(scenarios())
def test_the_size_estimate_counts_a_fair_flow(sc: Scenario) -> None:
    """The estimate takes the same symmetric-or-full decision as the builder (fair sharing may simulate every GPU)."""
    sc = _fair(sc)
    costs = InterferingCosts(sc.cluster, slowdowns=sc.interference)
    tasks, _ = estimate_size(sc.model, sc.cluster, sc.strategy, costs, sc.options)
    built = len(simulate(sc.model, sc.cluster, sc.strategy, costs, sc.options).flow)
    assert built <= tasks <= built + _slack(sc.model, sc.strategy)


@settings(SETTINGS, derandomize=True)
@given(scenarios(), st.data())
def test_more_nics_or_bandwidth_is_never_slower(sc: Scenario, data: st.DataObject) -> None:
    """Over the flows these scenarios draw. Not a theorem (see the anomaly above), so the examples are drawn the same
    way on every run; searches of about 35,000 random flows (pipelines, ZeRO-3 gathers beside sends, WFBP) found no
    flow that a wider network slowed."""
    sc = _fair(sc)
    base = _run(sc)
    fixed = replace(sc.strategy, partition=tuple(e - s for s, e in base.flow.stage_ranges))
    k_bw = data.draw(st.floats(1.0, 8.0), label="bandwidth factor")
    wider = _run(sc, strategy=fixed, cluster=sc.cluster.scaled(bandwidth=k_bw))
    more = _run(sc, strategy=fixed, cluster=replace(sc.cluster, nics_per_node=sc.cluster.nics_per_node + 1))
    event(f"network tasks: {bool(base.flow.network)}, slowed: {bool(getattr(base.tasks, 'slowed', ()))}")
    assert wider.iteration_time_s <= base.iteration_time_s + 1e-9
    assert more.iteration_time_s <= base.iteration_time_s + 1e-9

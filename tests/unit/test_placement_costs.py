"""Rank placement, link scopes and NIC sharing; analytic and profiled event costs."""

from __future__ import annotations

import pytest

from distsim import Strategy, get_cluster
from distsim.core.errors import ProfileError
from distsim.core.models.graph import Block
from distsim.core.placement import Placement, parse_order
from distsim.sim.costs import AnalyticCosts, CommEvent, ComputeEvent, ProfileCosts, ring_volume
from distsim.sim.profile_db import AlphaBetaFit, CommMeasurement, Measurement, ProfileDB
from tests.util import hand_cluster


def test_megatron_rank_order_tp_innermost() -> None:
    p = Placement(Strategy(tp=2, pp=2, dp=2), hand_cluster(nodes=2, gpus_per_node=4))
    assert p.grid[0].tolist() == [[0, 1], [2, 3]]  # stage 0: replicas x tp ranks
    assert p.grid[1].tolist() == [[4, 5], [6, 7]]
    assert p.coords[5] == (1, 0, 1)
    assert [i.scope for i in p.tp_groups(0)] == ["intra", "intra"]
    assert [i.gpus for i in p.dp_groups(1)] == [(4, 6), (5, 7)]
    pairs = p.p2p_pairs(0, 1)
    assert [(i.gpus, i.scope, i.sharers) for i in pairs] == [
        ((0, 4), "inter", 4),
        ((1, 5), "inter", 4),
        ((2, 6), "inter", 4),
        ((3, 7), "inter", 4),
    ]


def test_other_rank_order_moves_dp_across_nodes() -> None:
    p = Placement(Strategy(tp=2, pp=2, dp=2), hand_cluster(nodes=2, gpus_per_node=4), parse_order("tp,pp,dp"))
    assert p.grid[0].tolist() == [[0, 1], [4, 5]]
    dp = p.dp_groups(0)
    assert [(i.gpus, i.scope, i.sharers) for i in dp] == [((0, 4), "inter", 2), ((1, 5), "inter", 2)]
    with pytest.raises(Exception, match="must name tp, dp and pp once each"):
        parse_order("tp,tp,pp")


def test_nic_sharing_slows_concurrent_flows() -> None:
    c = hand_cluster(nodes=2, gpus_per_node=4, inter_bw=1000.0, nics=2)
    assert c.inter_flow_bandwidth(1) == 1000.0 and c.inter_flow_bandwidth(2) == 1000.0
    assert c.inter_flow_bandwidth(4) == 500.0


def test_analytic_collectives_follow_ring_volumes() -> None:
    c = hand_cluster(nodes=2, gpus_per_node=4, intra_bw=1000.0, intra_lat=0.01, inter_bw=100.0, inter_lat=0.1)
    costs = AnalyticCosts(c)
    ar = costs.comm(CommEvent("all_reduce", 4000, 4, "intra")).seconds
    assert ar == pytest.approx(2 * 3 * 0.01 + 2 * 3 / 4 * 4000 / 1000)  # 2(N-1) alpha + 2(N-1)/N S / bw
    ag = costs.comm(CommEvent("all_gather", 4000, 4, "intra")).seconds
    assert ag == pytest.approx(3 * 0.01 + 3 / 4 * 4000 / 1000)
    assert costs.comm(CommEvent("p2p", 500, 2, "inter")).seconds == pytest.approx(0.1 + 5.0)
    assert costs.comm(CommEvent("p2p", 500, 2, "inter", sharers=4)).seconds == pytest.approx(0.1 + 20.0)


def test_analytic_compute_is_a_roofline() -> None:
    c = get_cluster("dgx-a100")
    gpu = c.gpu
    block = Block("mlp", (("h", 1024),), fwd_flops=1e12, params=1000, io_bytes=1e3, tp="shard")
    f = AnalyticCosts(c).compute(ComputeEvent(block, "F", 2, 2, "fp16-mixed"))
    achieved = gpu.peak_flops_per_s * gpu.compute_efficiency
    assert f.seconds == pytest.approx(1e12 * 2 / 2 / achieved + gpu.kernel_overhead_s)  # FLOPs x mbs / tp
    b = AnalyticCosts(c).compute(ComputeEvent(block, "B", 2, 2, "fp16-mixed"))
    assert b.seconds - gpu.kernel_overhead_s == pytest.approx(2 * (f.seconds - gpu.kernel_overhead_s))
    memory_bound = Block("norm", (), fwd_flops=1.0, io_bytes=1e9, tp="replicate")
    m = AnalyticCosts(c).compute(ComputeEvent(memory_bound, "F", 1, 8, "fp16-mixed"))
    assert m.seconds == pytest.approx(1e9 / gpu.memory_bandwidth_bytes_per_s + gpu.kernel_overhead_s)


def _db() -> ProfileDB:
    block = Block("mlp", (("h", 8),), fwd_flops=1e6)
    key = ComputeEvent(block, "F", 1, 1, "fp16-mixed").key
    return ProfileDB(
        provenance={"device": "test"},
        compute={key: Measurement(0.5)},
        comm=(CommMeasurement("all_reduce", "intra", 2, 1000, 0.123),),
        fits=(
            AlphaBetaFit("all_reduce", "intra", 2, 0.01, 1e-4, 5),
            AlphaBetaFit("all_reduce", "intra", 8, 0.02, 2e-4, 5),
            AlphaBetaFit("p2p", "inter", 2, 0.05, 1e-3, 5),
        ),
    )


def test_profile_lookup_order_and_sources() -> None:
    c = hand_cluster(nodes=4, gpus_per_node=8, nics=1)
    costs = ProfileCosts(_db(), AnalyticCosts(c))
    block = Block("mlp", (("h", 8),), fwd_flops=1e6)
    assert costs.compute(ComputeEvent(block, "F", 1, 1, "fp16-mixed")).source == "measured"
    assert costs.compute(ComputeEvent(block, "B", 1, 1, "fp16-mixed")).source == "analytic"
    exact = costs.comm(CommEvent("all_reduce", 1000, 2, "intra"))
    assert (exact.seconds, exact.source) == (0.123, "measured")
    fitted = costs.comm(CommEvent("all_reduce", 2000, 2, "intra"))
    assert (fitted.seconds, fitted.source) == (pytest.approx(0.01 + 0.2), "fitted")
    # 32 ranks: DistSim's ring-volume scaling from the largest profiled group (8)
    scaled = costs.comm(CommEvent("all_reduce", 1000, 32, "intra"))
    assert scaled.source == "scaled"
    assert scaled.seconds == pytest.approx((0.02 + 0.2) * ring_volume("all_reduce", 32) / ring_volume("all_reduce", 8))
    assert costs.comm(CommEvent("all_gather", 1000, 2, "intra")).source == "analytic"
    shared = costs.comm(CommEvent("p2p", 1000, 2, "inter", sharers=4))
    assert shared.seconds == pytest.approx(0.05 + 1.0 * 4)  # bandwidth term x 4 flows on one NIC


def test_strict_profile_refuses_missing_events() -> None:
    costs = ProfileCosts(_db(), AnalyticCosts(hand_cluster()), strict=True)
    with pytest.raises(ProfileError, match="profile has no measurement for all_gather over 2 GPUs"):
        costs.comm(CommEvent("all_gather", 1000, 2, "intra"))


def test_profile_schema_checks() -> None:
    data = _db().to_dict()
    assert ProfileDB.from_dict(data) == _db()
    with pytest.raises(ProfileError, match="not a distsim profile"):
        ProfileDB.from_dict({"schema": "other"})
    with pytest.raises(ProfileError, match="schema version 99"):
        ProfileDB.from_dict({**data, "version": 99})
    with pytest.raises(ProfileError, match="unknown collective 'broadcast'"):
        ProfileDB.from_dict({**data, "fits": [{**data["fits"][0], "collective": "broadcast"}]})
    with pytest.raises(ProfileError, match="median_s must be >= 0"):
        ProfileDB.from_dict({**data, "compute": {"k": {"median_s": -1}}})

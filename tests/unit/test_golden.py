"""Hand-computed iteration times, written as data, and closed-form pipeline results.

Every case below was worked out on paper; the comment under each case is that working. Units: seconds. The hand
cluster moves 1000 bytes/s per link with zero latency, so a p2p of 500 bytes takes 0.5 s and a 2-GPU ring all-reduce
of B bytes takes B/1000 s (2(N-1)/N = 1). Gradients are 2 bytes per parameter.
"""

from __future__ import annotations

import pytest

from distsim import FlowOptions, Strategy, simulate
from distsim.core.schedules import one_f_one_b, peak_in_flight, warmup_count
from tests.util import InterferingCosts, chain_model, hand_cluster

UNIFORM_2 = [(1.0, 2.0, 0, 0.0), (1.0, 2.0, 0, 0.0)]
UNIFORM_2_P2P = [(1.0, 2.0, 0, 500.0), (1.0, 2.0, 0, 500.0)]
SHARED = [(1.0, 2.0, 500, 500.0), (1.0, 2.0, 3000, 0.0)]

CASES = [
    # name, layers (F, B, params, out_bytes), strategy, flow options, GPUs per node, expected iteration time
    ("dp-only bulk", [(0.5, 1.0, 250, 0.0), (0.5, 1.0, 250, 0.0)], "tp=1 pp=1 dp=2 mb=2", {}, 2, 7.0),
    # F0 0-1, B0 1-3, F1 3-4, B1 4-6; one all-reduce of 500 params x 2 B = 1000 B: 6-7.
    ("dp-only wfbp", [(0.5, 1.0, 250, 0.0), (0.5, 1.0, 250, 0.0)], "tp=1 pp=1 dp=2 mb=2 sync=wfbp", {}, 2, 6.5),
    # last backward: l1 4-5 then its all-reduce (500 B) 5-5.5 overlaps l0 5-6; l0's all-reduce 6-6.5.
    ("gpipe 2 stages", UNIFORM_2, "tp=1 pp=2 dp=1 mb=3 schedule=gpipe", {}, 2, 12.0),
    # (M + S - 1)(F + B) = 4 * 3.
    ("1f1b 2 stages", UNIFORM_2, "tp=1 pp=2 dp=1 mb=3 schedule=1f1b", {}, 2, 12.0),
    # s0: F0 0-1 F1 1-2 B0 4-6 F2 6-7 B1 7-9 B2 10-12; s1: F0 1-2 B0 2-4 F1 4-5 B1 5-7 F2 7-8 B2 8-10.
    ("gpipe p2p non-blocking", UNIFORM_2_P2P, "tp=1 pp=2 dp=1 mb=2 schedule=gpipe", {}, 2, 10.0),
    # s0: F0 0-1 send 1-1.5, F1 1-2 send 2-2.5; s1: F0 1.5-2.5 F1 2.5-3.5 B0 3.5-5.5 (send 5.5-6) B1 5.5-7.5
    # (send 7.5-8); s0: B0 6-8, B1 8-10.
    ("gpipe p2p blocking", UNIFORM_2_P2P, "tp=1 pp=2 dp=1 mb=2 schedule=gpipe", {"p2p_blocking": True}, 2, 11.0),
    # sends occupy the sender: s0 F0 0-1 S 1-1.5 F1 1.5-2.5 S 2.5-3; s1 F0 1.5-2.5 F1 3-4 B0 4-6 S 6-6.5
    # B1 6.5-8.5 S 8.5-9; s0 B0 6.5-8.5, B1 9-11.
    ("1f1b p2p non-blocking", UNIFORM_2_P2P, "tp=1 pp=2 dp=1 mb=2 schedule=1f1b", {}, 2, 10.0),
    # s1: F0 1.5-2.5 B0 2.5-4.5 (send 4.5-5) F1 4.5-5.5 B1 5.5-7.5 (send 7.5-8); s0: B0 5-7, B1 8-10.
    ("1f1b p2p blocking", UNIFORM_2_P2P, "tp=1 pp=2 dp=1 mb=2 schedule=1f1b", {"p2p_blocking": True}, 2, 10.5),
    # s0: F0 0-1 S 1-1.5 F1 1.5-2.5 S 2.5-3; s1: F0 1.5-2.5 B0 2.5-4.5 S 4.5-5 F1 5-6 B1 6-8 S 8-8.5;
    # s0: B0 5-7, B1 8.5-10.5.
    ("grad tail, unequal stages", [(1.0, 2.0, 1000, 0.0), (2.0, 4.0, 500, 0.0)], "tp=1 pp=2 dp=2 mb=2", {}, 4, 17.0),
    # s0: F0 0-1 F1 1-2; s1: F0 1-3 B0 3-7 F1 7-9 B1 9-13; s0: B0 7-9 B1 13-15;
    # all-reduce of stage 0 (2000 B) 15-17, of stage 1 (1000 B) 13-14: the tail of stage 0 decides.
    ("send and all-reduce overlap", SHARED, "tp=1 pp=2 dp=2 mb=1 schedule=gpipe", {}, 4, 10.5),
    # s0: F 0-1, send act 1-1.5; s1: F 1.5-2.5, B 2.5-4.5, send grad 4.5-5 while its all-reduce (6000 B) runs
    # 4.5-10.5 on its own stream; s0: B 5-7, all-reduce (1000 B) 7-8.
    (
        "send and all-reduce share the link",
        SHARED,
        "tp=1 pp=2 dp=2 mb=1 schedule=gpipe",
        {"link_sharing": "serialize"},
        4,
        11.0,
    ),
    # stage 1's link serves the gradient send 4.5-5 (emitted first), then the all-reduce 5-11.
]


@pytest.mark.parametrize(("name", "layers", "text", "options", "gpn", "expected"), CASES, ids=[c[0] for c in CASES])
def test_hand_computed_iteration_time(
    name: str, layers: list, text: str, options: dict, gpn: int, expected: float
) -> None:
    strategy = Strategy.from_str(text)
    cluster = hand_cluster(nodes=strategy.num_gpus // gpn, gpus_per_node=gpn)
    result = simulate(chain_model(layers), cluster, strategy, options=FlowOptions(**options))
    assert result.iteration_time_s == pytest.approx(expected, abs=1e-9)


def test_two_stage_1f1b_timeline_matches_the_drawing() -> None:
    """The per-action start times of the '1f1b 2 stages' case, as drawn in the comment above."""
    r = simulate(chain_model(UNIFORM_2), hand_cluster(1, 2), Strategy.from_str("tp=1 pp=2 dp=1 mb=3 schedule=1f1b"))
    df = r.timeline.df
    compute = df[df["kind"].isin(["forward", "backward"])]
    got = {
        (int(row.gpu), f"{'F' if row.kind == 'forward' else 'B'}{row.microbatch}"): (row.start_s, row.end_s)
        for row in compute.itertuples()
    }
    drawn = {
        (0, "F0"): (0, 1),
        (0, "F1"): (1, 2),
        (0, "B0"): (4, 6),
        (0, "F2"): (6, 7),
        (0, "B1"): (7, 9),
        (0, "B2"): (10, 12),
        (1, "F0"): (1, 2),
        (1, "B0"): (2, 4),
        (1, "F1"): (4, 5),
        (1, "B1"): (5, 7),
        (1, "F2"): (7, 8),
        (1, "B2"): (8, 10),
    }
    assert got.keys() == drawn.keys()
    for key, (start, end) in drawn.items():
        assert got[key] == pytest.approx((start, end)), key


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("stages", "micro_batches"), [(1, 1), (1, 4), (2, 1), (2, 5), (3, 2), (4, 4), (4, 9), (6, 3)])
def test_closed_form_pipeline_makespan(schedule: str, stages: int, micro_batches: int) -> None:
    """Uniform stages, no communication: iteration = (M + S - 1)(F + B); bubble = (S - 1)/(M + S - 1)."""
    f, b = 0.3, 0.7
    model = chain_model([(f, b, 0, 0.0)] * stages)
    strategy = Strategy(pp=stages, num_micro_batches=micro_batches, schedule=schedule)
    r = simulate(model, hand_cluster(1, stages), strategy)
    assert r.iteration_time_s == pytest.approx((micro_batches + stages - 1) * (f + b))
    assert r.bubble_fraction == pytest.approx((stages - 1) / (micro_batches + stages - 1))


@pytest.mark.parametrize(("pp", "chunks", "micro_batches"), [(2, 2, 4), (4, 2, 8), (4, 3, 8), (2, 4, 6)])
def test_interleaved_bubble_shrinks_by_chunks(pp: int, chunks: int, micro_batches: int) -> None:
    """Narayanan et al. 2021 Sec. 2.2.2: with v chunks the bubble is (p - 1)(t_f + t_b)/v per rank."""
    f, b = 0.2, 0.4  # per chunk; a rank's full forward+backward of one micro-batch is chunks*(f+b)
    model = chain_model([(f, b, 0, 0.0)] * (pp * chunks))
    strategy = Strategy(pp=pp, num_micro_batches=micro_batches, schedule="interleaved", virtual_stages=chunks)
    r = simulate(model, hand_cluster(1, pp), strategy)
    per_mb = chunks * (f + b)
    assert r.iteration_time_s == pytest.approx(micro_batches * per_mb + (pp - 1) * per_mb / chunks)


@pytest.mark.parametrize(("stages", "limit"), [(4, None), (4, 2), (6, 3), (3, 10)])
def test_dapple_warmup_policies(stages: int, limit: int | None) -> None:
    """Forwards before the first backward on stage i: A, min(S - i, D); B, min(2(S - i) - 1, D)."""
    m = 16
    for policy, k in (("A", lambda i: stages - i), ("B", lambda i: 2 * (stages - i) - 1)):
        sched = one_f_one_b(stages, m, policy, limit)
        for i, actions in enumerate(sched.ranks):
            expected = min(k(i), limit) if limit else k(i)
            first_b = next(j for j, a in enumerate(actions) if a.op == "B")
            assert first_b == expected == warmup_count(i, stages, policy, limit)
            assert peak_in_flight(actions) == expected  # activations held: K_i micro-batches, not M


def test_dapple_policy_b_is_a_with_comm_stages_counted() -> None:
    """Policy B on S compute stages gives the warm-up of policy A on 2S-1 stages (comm stages interleaved)."""
    s = 4
    for i in range(s):
        assert warmup_count(i, s, "B") == warmup_count(2 * i, 2 * s - 1, "A")


@pytest.mark.parametrize(("slowdowns", "expected"), [((0.0, 0.0), 6.5), ((1.0, 0.0), 7.25), ((1.0, 0.5), 7.625)])
def test_overlapped_allreduce_takes_a_measured_share_of_compute(
    slowdowns: tuple[float, float], expected: float
) -> None:
    """WFBP over 2 replicas, four layers (F 0.5, B 1; 500 B of gradients each: an all-reduce of 0.5 s).

    Measured interference: compute c times slower while an all-reduce overlaps it, the all-reduce k times slower.
    An overlapped all-reduce lasts 0.5 (1 + k) and takes c/(1 + c) of that from the compute stream; the last one
    (layer 0, after the last backward) overlaps nothing.
    c = 1, k = 0: B l3 2-3, its all-reduce 3-3.5 with a 0.25 shadow 3-3.25; B l2 3.25-4.25, AR 4.25-4.75, shadow;
    B l1 4.5-5.5, AR 5.5-6, shadow; B l0 5.75-6.75; AR l0 6.75-7.25.
    c = 1, k = 0.5: all-reduces last 0.75 and shadows 0.375: B l3 2-3; B l2 3.375-4.375; B l1 4.75-5.75;
    B l0 6.125-7.125; AR l0 (0.5, alone) 7.125-7.625.
    """
    c, k = slowdowns
    model = chain_model([(0.5, 1.0, 250, 0.0)] * 4)
    cluster = hand_cluster(1, 2)
    r = simulate(model, cluster, Strategy.from_str("tp=1 pp=1 dp=2 mb=1 sync=wfbp"),
                 InterferingCosts(cluster, slowdowns=(c, k, 0.0, 0.0)))  # fmt: skip
    assert r.iteration_time_s == pytest.approx(expected)
    assert set(r.timeline.df["kind"].astype(str)) <= {"forward", "backward", "dp_allreduce", "optimizer"}


def test_the_last_stages_backward_waits_for_its_forwards_tensor_parallel_all_reduce() -> None:
    """The loss needs the forward's output, all-reduced over the tp group, so the last stage's backward starts after
    that all-reduce, not when the forward's compute ends. One sharded layer on tp = 2 (given times split over tp),
    all-reduces of 250 B at 1000 B/s (ring over 2: 0.25 s): F 0-0.5, its all-reduce 0.5-0.75, B 0.75-1.75, the
    backward all-reduce 1.75-2.0."""
    from distsim.core.models import model_from_dict
    from distsim.sim.costs import AnalyticCosts
    from tests.util import hand_cluster

    layer = {"name": "l0", "forward_s": 1.0, "backward_s": 2.0, "params": 0, "tp": "shard", "tp_allreduce_bytes": 250.0}
    model = model_from_dict({"name": "tp", "layers": [layer]})
    cluster = hand_cluster(nodes=1, gpus_per_node=2, intra_bw=1000.0)
    r = simulate(model, cluster, Strategy(tp=2), AnalyticCosts(cluster), FlowOptions(host=False))
    df = r.timeline.df
    rows = sorted((round(x.start_s, 9), round(x.end_s, 9), x.kind) for x in df[df.gpu == 0].itertuples())
    assert rows == [(0.0, 0.5, "forward"), (0.5, 0.75, "tp_allreduce"), (0.75, 1.75, "backward"),
                    (1.75, 2.0, "tp_allreduce")]  # fmt: skip
    assert r.iteration_time_s == 2.0

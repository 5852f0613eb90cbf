"""Overlap that frameworks do, and the slowdown it brings: Megatron's --tp-comm-overlap (a tensor-parallel collective
pipelined with the GEMM beside it) and the interference of a communication kernel with the compute it overlaps (the
SMs it holds)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distsim import Strategy, simulate
from distsim.core.cluster import Link, get_cluster
from distsim.core.framework import NCCL_SMS, Framework, FrameworkError, framework_from_dict, get_framework
from distsim.core.models.graph import Model
from distsim.sim.costs import AnalyticCosts, ProfileCosts
from distsim.sim.flow.events import K_SHADOW, K_TP
from distsim.sim.flow.uniform import build_flow
from distsim.sim.profile_db import ProfileDB
from tests.util import chain_model, hand_cluster

PAIR = Framework("pair", tp_comm_overlap=True, tp_comm_overlap_chunks=4, host_op_s=0.0, host_backward_op_s=0.0)


def test_a_pipelined_pair_takes_the_longer_plus_a_chunk_of_the_shorter() -> None:
    """A 4 ms GEMM and a 2 ms collective in 4 chunks: the GEMM's chunks run back to back, the collective's last
    chunk (0.5 ms) after the GEMM ends: 4.5 ms, 0.5 exposed. A 6 ms collective: its chunks back to back after the
    GEMM's first (1 ms): 7 ms, 3 exposed. With the GEMM slowed by 25 % while they overlap (2 ms of it): 4.5 ms of
    GEMM, 0.5 ms exposed."""
    assert PAIR.overlapped_pair_s(4.0, 2.0, 0.0) == pytest.approx((4.0, 0.5))
    assert PAIR.overlapped_pair_s(4.0, 6.0, 0.0) == pytest.approx((4.0, 3.0))
    assert PAIR.overlapped_pair_s(4.0, 2.0, 0.25) == pytest.approx((4.5, 0.5))


@settings(max_examples=200, deadline=None)
@given(
    st.floats(1e-6, 1.0),
    st.floats(1e-6, 1.0),
    st.integers(1, 64),
    st.floats(0.0, 1.0),
)
def test_a_pipelined_pair_is_bounded_by_the_longer_and_the_sum(gemm: float, comm: float, chunks: int,
                                                               slowdown: float) -> None:  # fmt: skip
    fw = replace(PAIR, tp_comm_overlap_chunks=chunks)
    longer, exposed = fw.overlapped_pair_s(gemm, comm, slowdown)
    total = longer + exposed
    assert exposed >= 0 and longer >= gemm
    assert total >= max(gemm, comm) * (1 - 1e-12)
    assert total <= (gemm + comm) * (1 + slowdown) * (1 + 1e-12)
    if slowdown == 0:
        assert total <= (gemm + comm) * (1 + 1e-12)
        more = replace(PAIR, tp_comm_overlap_chunks=chunks + 1).overlapped_pair_s(gemm, comm, 0.0)
        assert sum(more) <= total * (1 + 1e-12)  # finer chunks never lengthen the pair


def _a100(gpus: int = 2, intra_gb_s: float = 300.0) -> object:
    c = get_cluster("dgx-a100").with_nodes(1)
    return replace(c, gpus_per_node=gpus, intra=Link(intra_gb_s * 1e9, c.intra.latency_s))


def _time(model: Model, cluster: object, strategy: Strategy, fw: Framework) -> float:
    return simulate(model, cluster, strategy, AnalyticCosts(cluster, framework=fw)).iteration_time_s


SP2 = Strategy(tp=2, num_micro_batches=2, micro_batch_size=8, sequence_parallel=True)


def test_overlapped_tensor_parallelism_lies_between_free_and_exposed_communication(gpt2: Model) -> None:
    """gpt2-345m at tp 2 with sequence parallelism: overlapping the collectives with their GEMMs is never slower
    than exposing them, and never faster than communication that costs nothing (a link a million times faster)."""
    cluster = _a100()
    exposed = _time(gpt2, cluster, SP2, replace(PAIR, tp_comm_overlap=False))
    overlapped = _time(gpt2, cluster, SP2, PAIR)
    free = _time(gpt2, _a100(intra_gb_s=300e6), SP2, replace(PAIR, tp_comm_overlap=False))
    assert free < overlapped < exposed
    slow_link = _a100(intra_gb_s=30.0)  # collectives longer than their GEMMs: overlap still helps, less
    assert _time(gpt2, slow_link, SP2, PAIR) < _time(gpt2, slow_link, SP2, replace(PAIR, tp_comm_overlap=False))


def test_each_collective_keeps_its_exposed_part_in_its_place(gpt2: Model) -> None:
    """The flow names the exposed collectives, keeps their collective in the key, and is otherwise the flow without
    overlap: the same tasks in the same order. The embedding (a lookup, no GEMM) keeps its collectives whole."""
    cluster = _a100()
    plain = build_flow(gpt2, cluster, SP2, AnalyticCosts(cluster, framework=replace(PAIR, tp_comm_overlap=False)))
    flow = build_flow(gpt2, cluster, SP2, AnalyticCosts(cluster, framework=PAIR))
    assert len(flow) == len(plain) and flow.kind == plain.kind
    tp = [i for i, k in enumerate(flow.kind) if k == K_TP and flow.name[i] != "embedding"]
    assert tp and all(flow.name[i].endswith("(exposed)") for i in tp)
    embedding = [i for i, k in enumerate(flow.kind) if k == K_TP and flow.name[i] == "embedding"]
    assert embedding and all(flow.duration_s[i] == plain.duration_s[i] for i in embedding)
    assert all(flow.duration_s[i] < plain.duration_s[i] for i in tp)
    assert all("/overlapping=" in flow.keys[flow.key[i]] for i in tp)
    kinds = {flow.key_kinds[flow.key[i]] for i in tp}
    assert kinds <= {"tp_allgather", "tp_reducescatter"} and kinds


def test_overlap_needs_sequence_parallelism_and_one_node(gpt2: Model) -> None:
    """Megatron refuses --tp-comm-overlap without sequence parallelism and runs it over NVLink only: such a run's
    flow is the one without overlap."""
    cluster = _a100()
    no_sp = replace(SP2, sequence_parallel=False)
    assert _time(gpt2, cluster, no_sp, PAIR) == _time(gpt2, cluster, no_sp, replace(PAIR, tp_comm_overlap=False))
    across = replace(get_cluster("dgx-a100").with_nodes(2), gpus_per_node=1)  # tp 2 over two nodes
    assert _time(gpt2, across, SP2, PAIR) == _time(gpt2, across, SP2, replace(PAIR, tp_comm_overlap=False))


def test_interference_is_the_share_of_sms_a_collective_holds() -> None:
    """NCCL's 16 channels on an H100's 132 SMs: compute keeps 116 of them, so it takes 132/116 as long (c = 16/116);
    none under the ideal framework, and none on a device without SMs."""
    core = get_framework("megatron-core")
    assert core.comm_sms == NCCL_SMS == 16
    assert core.interference(132) == pytest.approx(16 / 116)
    assert get_framework("ideal").interference(132) == 0.0
    assert core.interference(0) == 0.0
    h100 = get_cluster("dgx-h100")
    assert AnalyticCosts(h100, framework=core).interference("inter") == pytest.approx((16 / 116, 0.0))
    assert AnalyticCosts(h100, framework=get_framework("ideal")).interference("intra") == (0.0, 0.0)


def test_a_profile_without_measured_interference_takes_the_frameworks() -> None:
    h100 = get_cluster("dgx-h100")
    costs = ProfileCosts(ProfileDB({}, {}), AnalyticCosts(h100, framework=get_framework("megatron-core")))
    assert costs.interference("intra") == pytest.approx((16 / 116, 0.0))
    assert costs.framework is costs.fallback.framework


def _wfbp_chain() -> tuple[Model, object]:
    """Four 10 ms / 20 ms layers of 50 MB of gradients on 2 data-parallel GPUs of 100 SMs: each layer's all-reduce
    (50 ms) overlaps the backward of the layers before it."""
    model = chain_model([(10e-3, 20e-3, 25_000_000, 1e6)] * 4)
    cluster = hand_cluster(1, 2, intra_bw=2e9)
    return model, replace(cluster, gpu=replace(cluster.gpu, sm_count=100))


def test_overlapped_gradient_reduction_slows_the_backward_beside_it() -> None:
    """Each WFBP all-reduce (25 ms) but the last overlaps backward. Holding s of 100 SMs, compute runs at (100 - s)
    percent while it does: the compute stream carries a shadow of s % of the all-reduce's 25 ms, but never more than
    the backward left beside it takes longer, c = s / (100 - s) of it (60, 40 and 20 ms after layers 3, 2 and 1).
    Holding more SMs is never faster."""
    model, cluster = _wfbp_chain()
    strategy = Strategy(dp=2, grad_sync="wfbp")
    allreduce_s = 2 * (2 - 1) / 2 * 50e6 / 2e9
    times = []
    for sms in (0, 10, 25, 50):
        fw = Framework("held", comm_sms=sms, host_op_s=0.0, host_backward_op_s=0.0)
        costs = AnalyticCosts(cluster, framework=fw)
        flow = build_flow(model, cluster, strategy, costs)
        shadows = [flow.duration_s[i] for i, k in enumerate(flow.kind) if k == K_SHADOW]
        c = sms / (100 - sms)
        expected = [min(allreduce_s * sms / 100, after * c) for after in (60e-3, 40e-3, 20e-3)] if sms else []
        assert shadows == pytest.approx(expected)
        times.append(simulate(model, cluster, strategy, costs).iteration_time_s)
    assert times == sorted(times) and times[0] < times[-1]


def test_a_framework_file_states_overlap_and_sms() -> None:
    fw = framework_from_dict({"name": "mine", "tp_comm_overlap": True, "tp_comm_overlap_chunks": 8,
                              "comm_sms": 20}, "f.yaml")  # fmt: skip
    assert (fw.tp_comm_overlap, fw.tp_comm_overlap_chunks, fw.comm_sms) == (True, 8, 20)
    assert "overlapped with GEMMs in 8 chunks" in fw.describe() and "hold 20 SMs" in fw.describe()
    for bad, match in ((("comm_sms", -1), "comm_sms must be a whole number >= 0"),
                       (("tp_comm_overlap_chunks", 0), "tp_comm_overlap_chunks must be a whole number >= 1"),
                       (("tp_comm_overlap", "yes"), "tp_comm_overlap must be true or false")):  # fmt: skip
        with pytest.raises(FrameworkError, match=match):
            framework_from_dict({"name": "bad", bad[0]: bad[1]}, "f.yaml")


def test_the_summary_names_the_framework_it_charged(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.util import run_cli

    base = ["simulate", "--model", "gpt2-345m", "--cluster", "dgx-a100", "--nodes", "1", "--strategy", "2M1P4D"]
    code, out, _ = run_cli(base, capsys)
    assert code == 0 and "framework          megatron-core: flash attention" in out
    code, out, _ = run_cli([*base, "--framework", "megatron-core-overlap", "--json"], capsys)
    assert code == 0 and '"framework": "megatron-core-overlap"' in out


def test_overlap_grad_reduce_is_megatrons_buckets() -> None:
    """--overlap-grad-reduce: buckets of max(40 M, 1 M x dp) parameters, reduced during backward (ddp mode, the first
    bucket as large as the rest); only where the strategy leaves synchronisation at its default and has dp > 1."""
    fw = get_framework("megatron-core-overlap")
    assert fw.overlap_grad_reduce and not get_framework("megatron-core").overlap_grad_reduce
    s = fw.synchronised(Strategy(dp=8), 2)
    assert (s.grad_sync, s.bucket_cap_mb) == ("ddp", pytest.approx(40e6 * 2 / 2**20))
    assert fw.synchronised(Strategy(dp=64), 4).bucket_cap_mb == pytest.approx(64e6 * 4 / 2**20)
    assert fw.synchronised(Strategy(dp=1), 2) == Strategy(dp=1)
    assert fw.synchronised(Strategy(dp=8, grad_sync="wfbp"), 2).grad_sync == "wfbp"
    assert get_framework("megatron-core").synchronised(Strategy(dp=8), 2) == Strategy(dp=8)


def test_the_cli_applies_the_frameworks_synchronisation_unless_given(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.util import run_cli

    base = ["simulate", "--model", "gpt2-345m", "--cluster", "dgx-a100", "--nodes", "1", "--strategy", "1M1P8D",
            "--framework", "megatron-core-overlap"]  # fmt: skip
    code, out, _ = run_cli(base, capsys)
    assert code == 0 and "sync=ddp" in out
    code, out, _ = run_cli([*base, "--grad-sync", "bulk"], capsys)
    assert code == 0 and "sync=" not in out
    code, out, _ = run_cli(["search", "grid", "--model", "gpt2-345m", "--cluster", "dgx-a100", "--nodes", "1",
                            "--global-batch", "8", "--tp", "1", "--pp", "1", "--framework", "megatron-core-overlap",
                            "--plan-out", ""], capsys)  # fmt: skip
    assert code == 0 and "sync=ddp" in out


def _sharded_chain() -> tuple[Model, object, Strategy]:
    """Four 10 ms / 20 ms layers of 25 M fp16 parameters, each its own gradient bucket, on 2 data-parallel GPUs
    with a sharded optimizer (zero1): each bucket's 50 MB of parameters is all-gathered after the step (12.5 ms)."""
    model, cluster = _wfbp_chain()
    return model, cluster, Strategy(dp=2, grad_sync="wfbp", optimizer_sharding="zero1")


def test_overlap_param_gather_issues_the_gathers_beside_the_first_forward() -> None:
    """--overlap-param-gather: no all-gather after the step; each runs from the iteration's start, in forward order,
    and each layer's first forward waits for its own bucket only: shorter than gathering after the step, and no
    shorter than the compute."""
    from distsim.sim.flow.events import K_DP, K_FWD

    model, cluster, strategy = _sharded_chain()
    plain = Framework("plain", host_op_s=0.0, host_backward_op_s=0.0)
    overlap = replace(plain, overlap_param_gather=True)
    after = simulate(model, cluster, strategy, AnalyticCosts(cluster, framework=plain))
    beside = simulate(model, cluster, strategy, AnalyticCosts(cluster, framework=overlap))
    flow = beside.flow
    gathers = [i for i, k in enumerate(flow.kind) if k == K_DP and flow.name[i].startswith("params")]
    assert len(gathers) == 4 and all(flow.deps[i] == [] for i in gathers[:1])
    assert [flow.layer[i] for i in gathers] == [0, 1, 2, 3]  # forward order
    first_forward = {flow.layer[i]: i for i in reversed(range(len(flow))) if flow.kind[i] == K_FWD}
    for g in gathers:
        assert g in flow.deps[first_forward[flow.layer[g]]]
    gather_s = 50e6 * (2 - 1) / 2 / 2e9
    assert after.iteration_time_s - beside.iteration_time_s > gather_s  # at least one gather no longer trails
    assert beside.iteration_time_s >= 4 * (10e-3 + 20e-3)


def test_the_task_estimate_counts_the_prefetched_gathers() -> None:
    from distsim.plans.simulate import estimate_size

    model, cluster, strategy = _sharded_chain()
    for sms in (0, 16):
        fw = Framework("pg", comm_sms=sms, overlap_param_gather=True, host_op_s=0.0, host_backward_op_s=0.0)
        costs = AnalyticCosts(cluster, framework=fw)
        tasks, _ = estimate_size(model, cluster, strategy, costs)
        assert tasks == len(simulate(model, cluster, strategy, costs).flow)

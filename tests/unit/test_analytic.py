"""The analytic cost model: per-op kernel times (GEMM waves, memory-bound kernels, flash attention, launches) and
ring/tree collectives over all of a node's NICs. Hand-computed cases, closed forms, this project's own H100
measurements, and monotonicity."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distsim.core.cluster import GPU, Cluster, Link, get_cluster
from distsim.core.collectives import TREE_BUS_BANDWIDTH, collective_s
from distsim.core.errors import ModelFileError
from distsim.core.framework import get_framework
from distsim.core.models import Model, get_model
from distsim.core.models.graph import FP16_MIXED, Block
from distsim.core.models.ops import AttentionOp, GemmOp, MemoryOp
from distsim.core.models.transformer import attention_block, mlp_block
from distsim.sim.costs import AnalyticCosts, CommEvent, ComputeEvent
from distsim.sim.kernels import REDUCTION_EFFICIENCY, attention_s, gemm_s, memory_s
from tests.util import hand_cluster

# A toy device with round numbers: 4 SMs sharing 1 TFLOP/s (250 GFLOP/s each) and 1 TB/s, 1 us per kernel on the
# device and 5 us to launch one from the host.
TOY = GPU(
    "toy", peak_flops_per_s=1e12, memory_bytes=1e12, memory_bandwidth_bytes_per_s=1e12, compute_efficiency=1.0,
    sm_count=4, kernel_latency_s=1e-6, kernel_launch_s=5e-6,
)  # fmt: skip


def toy_costs(gpu: GPU = TOY) -> AnalyticCosts:
    return AnalyticCosts(Cluster("toy", 1, 8, gpu, Link(1e9, 0.0), Link(1e9, 0.0)))


def seconds(costs: AnalyticCosts, block: Block, phase: str, mbs: int = 1, tp: int = 1) -> float:
    return costs.compute(ComputeEvent(block, phase, mbs, tp, "fp16-mixed")).seconds


def test_gemm_bound_block_by_hand() -> None:
    block = Block("linear", ops=(GemmOp("w", 256, 256, 1024, "none", 2),))
    assert block.fwd_flops == 2 * 256 * 256 * 1024 and block.io_bytes == 2 * (256 * 1024 + 256 * 256)
    costs = toy_costs()
    # forward: 2 x 2 tiles of 128 x 128 = 4 tiles on 4 SMs, one wave (no split-K: more than half a wave).
    #   main loop 2*128*128*1024 = 33,554,432 FLOPs at 1e12/4 FLOP/s = 134.217728 us
    #   epilogue  128*128*2 B = 32,768 B at 1e12/4 B/s (4 tiles share the bandwidth) = 0.131072 us
    #   + 1 us kernel latency; the bytes floor (A, B, C once: 1,179,648 B at 1 TB/s = 1.18 us) does not bind
    assert seconds(costs, block, "F") == pytest.approx((134.217728 + 0.131072 + 1) * 1e-6)
    # backward: dX = dY W^T, 256 x 1024 over inner 256: 2 x 8 = 16 tiles = 4 waves of
    #   (2*128*128*256 = 8,388,608 FLOPs: 33.554432 us) + 0.131072 us epilogue = 134.742016 us
    # dW = X^T dY, 1024 x 256 over inner 256, accumulated into the fp32 main gradient (8 B per element read+written):
    #   16 tiles = 4 waves of 33.554432 + 128*128*8 B / 2.5e11 B/s = 0.524288 us -> 136.31488 us
    # + 2 kernel latencies
    assert seconds(costs, block, "B") == pytest.approx((134.742016 + 136.31488 + 2) * 1e-6)
    # twice the samples: 4 x 2 = 8 tiles, two waves
    assert seconds(costs, block, "F", mbs=2) == pytest.approx((2 * (134.217728 + 0.131072) + 1) * 1e-6)


def test_memory_bound_block_by_hand() -> None:
    ops = (MemoryOp("add", 1e6), MemoryOp("gelu", 4e6, tp="shard"), MemoryOp("norm", 1e6, reduction=True))
    block = Block("elementwise", ops=ops, tp="shard")
    assert block.io_bytes == 6e6 and block.fwd_flops == 0
    costs = toy_costs()
    # 2 samples over tp=2: add is replicated (2e6 B), gelu is split (4e6 x 2 / 2 = 4e6 B), norm replicated 2e6 B
    # at 0.7 of the bandwidth; each at 1 TB/s plus 1 us
    norm = 2e6 / (1e12 * REDUCTION_EFFICIENCY)
    assert seconds(costs, block, "F", mbs=2, tp=2) == pytest.approx(2e-6 + 4e-6 + norm + 3e-6)
    # backward moves twice the bytes, one kernel each
    assert seconds(costs, block, "B", mbs=2, tp=2) == pytest.approx(4e-6 + 8e-6 + 2 * norm + 3e-6)
    # a device's measured streaming efficiency scales the bandwidth
    slower = toy_costs(replace(TOY, memory_efficiency=0.5))
    assert seconds(slower, Block("x", ops=(MemoryOp("add", 1e6),)), "F") == pytest.approx(2e-6 + 1e-6)


def test_block_without_ops_keeps_the_roofline() -> None:
    gpu = replace(TOY, kernel_overhead_s=10e-6)
    block = Block("mlp", fwd_flops=1e9, io_bytes=1e3)
    f = toy_costs(gpu).compute(ComputeEvent(block, "F", 2, 1, "fp16-mixed"))
    assert f.seconds == pytest.approx(2e9 / 1e12 + 10e-6)  # FLOPs x mbs / (peak x efficiency) + overhead
    fw = toy_costs(gpu).framework  # one kernel, two in backward, each its launch plus the framework's host time
    assert f.launch_s == pytest.approx(5e-6 + fw.host_op_s)
    b = toy_costs(gpu).compute(ComputeEvent(block, "B", 2, 1, "fp16-mixed"))
    assert b.launch_s == pytest.approx(2 * (5e-6 + fw.host_backward_op_s))


def test_ops_fill_and_check_the_block_totals() -> None:
    ops = (GemmOp("w", 8, 16, 32), MemoryOp("act", 100.0, flops=7.0))
    block = Block("b", ops=ops)
    assert block.fwd_flops == 2 * 8 * 16 * 32 + 7 and block.io_bytes == 2 * (8 * 32 + 8 * 16) + 100
    assert Block("b", ops=ops, fwd_flops=block.fwd_flops).fwd_flops == block.fwd_flops
    with pytest.raises(ModelFileError, match="not the sum over its ops"):
        Block("b", ops=ops, fwd_flops=1.0)


def test_a_gemm_just_over_one_wave_costs_two() -> None:
    gpu = get_cluster("dgx-h100").gpu
    assert gpu.sm_count == 132
    one_wave = gemm_s(gpu, 128 * 132, 128, 4096, 0.0, 2)  # 132 tiles of 128 x 128
    over = gemm_s(gpu, 128 * 133, 128, 4096, 0.0, 2)  # 133 tiles: a second wave for one tile
    assert 1.95 < over / one_wave <= 2.0
    # while its FLOPs grow by 1/132 only; a full second wave costs no more than the straggling tile
    assert gemm_s(gpu, 128 * 264, 128, 4096, 0.0, 2) == pytest.approx(over, rel=0.01)


def test_small_gemm_splits_k_over_idle_sms() -> None:
    gpu = get_cluster("dgx-h100").gpu
    # one 128 x 128 tile with a long inner dimension: split-K spreads it over many SMs
    t = gemm_s(gpu, 128, 128, 65536, 0.0, 2)
    one_sm = 2 * 128 * 128 * 65536 / (gpu.peak_flops_per_s * gpu.compute_efficiency / gpu.sm_count)
    assert t < one_sm / 16


def test_launch_time_is_kernels_times_launch_cost() -> None:
    """With no framework cost ("ideal") a kernel costs the host its launch; a framework adds its time per kernel."""
    costs = AnalyticCosts(get_cluster("dgx-h100"), framework=get_framework("ideal"))
    launch = costs.cluster.gpu.kernel_launch_s
    assert launch == pytest.approx(7e-6)  # shared/evidence/h100-2026-11-22/micro.log
    attention = attention_block(1024, 16, 1024, FP16_MIXED)
    # forward: layer norm, QKV GEMM, flash attention, output projection, bias-dropout-add
    assert costs.compute(ComputeEvent(attention, "F", 4, 2, "fp16-mixed")).launch_s == pytest.approx(5 * launch)
    # backward: layer norm 2, two GEMMs each for QKV and the projection, flash backward 3, bias-dropout-add 1
    assert costs.compute(ComputeEvent(attention, "B", 4, 2, "fp16-mixed")).launch_s == pytest.approx(10 * launch)
    mlp = mlp_block(1024, 4096, 1024, FP16_MIXED)
    assert costs.compute(ComputeEvent(mlp, "F", 1, 1, "fp16-mixed")).launch_s == pytest.approx(5 * launch)
    assert costs.compute(ComputeEvent(mlp, "B", 1, 1, "fp16-mixed")).launch_s == pytest.approx(8 * launch)
    # one NCCL kernel per collective; CPUs launch nothing apart
    assert costs.comm(CommEvent("all_reduce", 1 << 20, 8, "intra")).launch_s == pytest.approx(launch)
    cpu = AnalyticCosts(get_cluster("cpu-1x2"))
    assert cpu.compute(ComputeEvent(mlp, "F", 1, 1, "fp16-mixed")).launch_s == 0.0
    eager = AnalyticCosts(get_cluster("dgx-h100"), framework=get_framework("megatron-core"))
    fw = eager.framework
    assert eager.compute(ComputeEvent(mlp, "F", 1, 1, "fp16-mixed")).launch_s == pytest.approx(
        5 * (launch + fw.host_op_s)
    )
    assert eager.compute(ComputeEvent(mlp, "B", 1, 1, "fp16-mixed")).launch_s == pytest.approx(
        8 * (launch + fw.host_backward_op_s)
    )
    graphs = AnalyticCosts(get_cluster("dgx-h100"), framework=get_framework("torch-compile"))
    assert graphs.compute(ComputeEvent(mlp, "B", 1, 1, "fp16-mixed")).launch_s == 0.0  # CUDA graphs: no host pacing


def test_cross_node_collective_uses_all_nics() -> None:
    def all_reduce(nics: int, sharers: int = 1, intra_bw: float = 1e9, collective: str = "all_reduce") -> float:
        c = hand_cluster(nodes=2, gpus_per_node=8, intra_bw=intra_bw, inter_bw=1000.0, nics=nics)
        return AnalyticCosts(c).comm(CommEvent(collective, 8000, 2, "inter", sharers)).seconds

    # two members, no latency: 2(n-1)/n x 8000 B = 8000 B over the node's NICs
    assert all_reduce(1) == pytest.approx(8.0)
    assert all_reduce(8) == pytest.approx(1.0)  # striped over 8 NICs: 8 x the bandwidth
    assert all_reduce(4) == pytest.approx(2.0)
    assert all_reduce(8, sharers=8) == pytest.approx(8.0)  # 8 collectives at once: a NIC each
    assert all_reduce(8, sharers=16) == pytest.approx(16.0)  # half a NIC each
    assert all_reduce(8, intra_bw=2000.0) == pytest.approx(4.0)  # no more than the intra-node link feeds
    assert all_reduce(8, collective="all_gather") == pytest.approx(0.5)  # (n-1)/n of the bytes
    # point-to-point transfers still use one NIC each
    c = hand_cluster(nodes=2, gpus_per_node=8, intra_bw=1e9, inter_bw=1000.0, nics=8)
    assert AnalyticCosts(c).comm(CommEvent("p2p", 8000, 2, "inter")).seconds == pytest.approx(8.0)


def test_ring_or_tree_whichever_is_faster() -> None:
    alpha, nic = 5e-6, 25e9
    c = hand_cluster(nodes=8, gpus_per_node=8, intra_bw=300e9, inter_bw=nic, inter_lat=alpha, intra_lat=alpha)
    costs = AnalyticCosts(c)

    def ring(s: float) -> float:  # 2(n-1) steps of alpha, 2(n-1)/n of the bytes
        return 126 * alpha + 2 * 63 / 64 * s / nic

    def tree(s: float) -> float:  # 2 log2(n) steps, 2 S / (0.92 B)
        return 12 * alpha + 2 * s / (TREE_BUS_BANDWIDTH * nic)

    crossover = (126 - 12) * alpha / (2 / (TREE_BUS_BANDWIDTH * nic) - 2 * 63 / 64 / nic)  # about 69 MB
    for size, algorithm in ((1e3, "tree"), (1e6, "tree"), (0.9 * crossover, "tree"), (1.1 * crossover, "ring"),
                            (1e9, "ring")):  # fmt: skip
        t = costs.comm(CommEvent("all_reduce", int(size), 64, "inter")).seconds
        assert t == pytest.approx(min(ring(int(size)), tree(int(size))))
        assert collective_s("all_reduce", 64, int(size), alpha, nic, "nccl")[1] == algorithm
    # inside a node NCCL's tree is a chain: always the ring; all-gather and reduce-scatter are rings
    assert collective_s("all_reduce", 8, 1e3, alpha, nic, "ring")[1] == "ring"
    assert collective_s("all_gather", 64, 1e3, alpha, nic, "nccl")[1] == "ring"
    intra = costs.comm(CommEvent("all_reduce", 1000, 8, "intra")).seconds
    assert intra == pytest.approx(14 * alpha + 2 * 7 / 8 * 1000 / 300e9)


def test_close_to_our_own_h100_measurements() -> None:
    """shared/evidence/h100-2026-11-22/micro.log (one H100 SXM 80GB): the model within 15-25 % of what was measured
    (fp16 and bf16 timings both given where they differ)."""
    gpu = get_cluster("dgx-h100").gpu
    latency = gpu.kernel_latency_s
    gemms = {(4096, 4096, 4096): (175.9, 181.7), (8192, 50304, 1024): (1267.6, 1310.8),
             (16384, 12288, 12288): (6768.3, 7069.8), (2048, 6144, 1536): (63.2, 65.0),
             (8192, 3072, 1024): (83.4, 86.4)}  # fmt: skip
    for (m, n, k), measured_us in gemms.items():
        t = gemm_s(gpu, m, n, k, 2 * (m * k + k * n + m * n), 2) + latency
        assert min(measured_us) * 0.85e-6 < t < max(measured_us) * 1.15e-6, (m, n, k, t)
    # copy (streaming) and layer norm (a row reduction) of 2^27 fp16 elements, 4 bytes moved per element
    assert memory_s(gpu, 4 * 2**27) + latency == pytest.approx(179.7e-6, rel=0.05)
    assert memory_s(gpu, 4 * 2**27, reduction=True) + latency == pytest.approx(294.2e-6, rel=0.15)
    # causal SDPA forward, b=2, 16 heads, s=2048, d=128: 82.6 us; fwd+bwd 409.1 us
    op = AttentionOp("a", 16, 128, 2048, 2048, causal=True)
    fwd = attention_s(gpu, op, 2 * 16, "F") + latency
    assert fwd == pytest.approx(82.6e-6, rel=0.15)
    assert fwd + attention_s(gpu, op, 2 * 16, "B") + 3 * latency == pytest.approx(409.1e-6, rel=0.15)


def test_causal_attention_runs_about_half_the_blocks() -> None:
    gpu = get_cluster("dgx-h100").gpu
    full = attention_s(gpu, AttentionOp("a", 32, 128, 4096, 4096, causal=False), 4 * 32, "F")
    causal = attention_s(gpu, AttentionOp("a", 32, 128, 4096, 4096, causal=True), 4 * 32, "F")
    # 32 query blocks: 528 of 1024 block pairs (plus each thread block's Q read and O write, which do not halve)
    assert causal / full == pytest.approx(33 / 64, rel=0.05)


def test_transformer_and_cnn_blocks_list_their_kernels(gpt2: Model) -> None:
    gpt = gpt2
    attention = gpt.layers[1].blocks[0]
    assert [op.name for op in attention.ops] == ["layernorm", "qkv", "flash_attention", "proj", "bias_dropout_add"]
    assert attention.fwd_flops == 8 * 1024 * 1024**2 + 4 * 1024**2 * 1024  # Narayanan et al.: 8 s h^2 + 4 s^2 h
    assert attention.ops[2].causal and not get_model("bert-large").layers[1].blocks[0].ops[2].causal
    lm_head = gpt.layers[-1].blocks[0]
    assert [op.name for op in lm_head.ops] == ["layernorm", "logits", "cross_entropy", "cross_entropy_max_sum"]
    resnet = get_model("resnet50")
    bottleneck = next(layer for layer in resnet.layers if layer.name == "layer2.0").blocks[0]
    gemms = [op for op in bottleneck.ops if isinstance(op, GemmOp)]
    assert [(g.name, g.m, g.n, g.k) for g in gemms] == [
        ("conv1", 56 * 56, 128, 256),
        ("conv2", 28 * 28, 128, 9 * 128),
        ("conv3", 28 * 28, 512, 128),
        ("downsample", 28 * 28, 512, 256),
    ]


def test_presets_give_sensible_block_times() -> None:
    """GPT-3 175B's MLP block at tp=8 on an A100 runs at 60-80 % of peak; a CPU core's at most its measured rate."""
    block = get_model("gpt3-175b").layers[1].blocks[1]
    a100 = AnalyticCosts(get_cluster("dgx-a100"))
    t = seconds(a100, block, "F", mbs=1, tp=8)
    assert 0.6 < block.fwd_flops / 8 / t / 312e12 < 0.8
    cpu = AnalyticCosts(get_cluster("cpu-1x2"))
    small = get_model("gpt2-cpu").layers[1].blocks[1]
    assert small.fwd_flops / seconds(cpu, small, "F") < 134e9 * 0.8


dims = st.integers(1, 20000)


@settings(max_examples=200, deadline=None)
@given(dims, dims, dims, st.sampled_from(["m", "n", "k"]), st.integers(1, 5000))
def test_a_bigger_gemm_is_never_faster(m: int, n: int, k: int, which: str, more: int) -> None:
    def t(gpu: GPU, m: int, n: int, k: int) -> float:
        return gemm_s(gpu, m, n, k, 2 * (m * k + k * n + m * n), 2)

    bigger = {"m": m, "n": n, "k": k}
    bigger[which] += more
    for preset in ("dgx-h100", "distsim-a10", "cpu-1x2"):
        gpu = get_cluster(preset).gpu
        assert t(gpu, **bigger) >= t(gpu, m, n, k)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 64), st.integers(1, 4096), st.integers(1, 4096), st.booleans(), st.integers(0, 3))
def test_more_attention_or_bytes_is_never_faster(heads: int, q: int, extra: int, causal: bool, kind: int) -> None:
    gpu = get_cluster(["dgx-h100", "dgx-a100", "dapple-a", "cpu-1x2"][kind]).gpu
    for phase in "FB":
        base = attention_s(gpu, AttentionOp("a", heads, 64, q, q, causal), heads, phase)
        longer = attention_s(gpu, AttentionOp("a", heads, 64, q + extra, q + extra, causal), heads, phase)
        wider = attention_s(gpu, AttentionOp("a", heads, 64, q, q, causal), heads + extra, phase)
        assert longer >= base and wider >= base
    assert memory_s(gpu, float(q + extra)) >= memory_s(gpu, float(q))


@pytest.mark.parametrize("preset", ["dgx-h100", "distsim-testbed", "dapple-a", "cpu-1x2"])
@pytest.mark.parametrize("model", ["gpt2-345m", "t5-base", "resnet50"])
def test_more_samples_cost_more_and_more_tp_less(preset: str, model: str) -> None:
    costs = AnalyticCosts(get_cluster(preset))
    m = get_model(model)
    blocks = {b.op: b for layer in m.layers for b in layer.blocks}
    tps = (1, 2, 4) if m.tp_problem(2) is None else (1,)
    for block in blocks.values():
        for phase in "FB":
            for tp in tps:
                times = [seconds(costs, block, phase, mbs, tp) for mbs in (1, 2, 3, 4, 8)]
                assert times == sorted(times), (block.op, phase, tp)
            by_tp = [seconds(costs, block, phase, 2, tp) for tp in tps]
            assert by_tp == sorted(by_tp, reverse=True), (block.op, phase)
    assert math.isfinite(sum(seconds(costs, b, "B") for b in blocks.values()))


def test_dgx_links_run_at_their_payload_rate() -> None:
    """NVLink: 256 data bytes per 16-byte header flit; InfiniBand: 4096 payload bytes per 26 header bytes (HDR/NDR
    rates are data rates already)."""
    a100, h100 = get_cluster("dgx-a100"), get_cluster("dgx-h100")
    assert a100.intra.bandwidth_bytes_per_s == pytest.approx(300e9 * 256 / 272)
    assert h100.intra.bandwidth_bytes_per_s == pytest.approx(450e9 * 256 / 272)
    assert a100.inter.bandwidth_bytes_per_s == pytest.approx(200e9 / 8 * 4096 / 4122)
    assert h100.inter.bandwidth_bytes_per_s == pytest.approx(400e9 / 8 * 4096 / 4122)

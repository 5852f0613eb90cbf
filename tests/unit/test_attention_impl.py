"""The attention kernel is a choice of the model (issue 21, mechanism 3), and a layer's time and memory follow it.

``flash`` (FlashAttention-2, cuDNN: no s x s scores written or kept), ``unfused`` (Megatron-LM's attention core before
flash attention: Q K^T batched GEMM, scale, mask and softmax as separate kernels, dropout, P V batched GEMM) and
``fused_softmax`` (Megatron's FusedScaleMaskSoftmax: scale + mask + softmax in one kernel). Hand-computed kernel times
on the H100 preset, Korthikanti et al. 2022's activation formula for the stored-score kernels, flash's 4as in place
of their 5as^2, the model spec and file keys, and :func:`with_attention`.
"""

from __future__ import annotations

import pytest

from distsim import Strategy, get_model, simulate
from distsim.core.cluster import get_cluster
from distsim.core.errors import ModelFileError
from distsim.core.models import model_from_dict
from distsim.core.models.graph import FP32
from distsim.core.models.ops import ATTENTION_IMPLS, AttentionOp
from distsim.core.models.transformer import attention_cores, decoder_only, with_attention
from distsim.core.partition import ranges
from distsim.core.schedules import build_schedule
from distsim.sim.costs import AnalyticCosts, ComputeEvent
from distsim.sim.flow.recompute import attention_core
from distsim.sim.kernels import block_s, op_s
from distsim.sim.memory import estimate_memory, layer_activations
from tests.util import run_cli

# The H100 preset (dgx-h100): 989 TFLOP/s dense at 0.80 -> per SM (132) RATE_SM = 5.9939e12 FLOP/s; 3350 GB/s at
# 0.89 -> BW = 2981.5 GB/s, per SM 22.587 GB/s; row reductions at 0.70 of BW; 2 us of device latency per kernel.
H100 = get_cluster("dgx-h100").gpu
RATE_SM = 989e12 * 0.80 / 132
BW = 3350e9 * 0.89
BW_SM = BW / 132
LAT = 2e-6

# The case: one sequence (b = 1) of s = 1024 tokens, h = 1024, a = 16 heads of d = 64, tp = 1, fp16 (e = 2), causal:
# 16 (sequence, head) matrices of S = 16 x 1024^2 = 16,777,216 scores.
S, H, A, D = 1024, 1024, 16, 64
SCORES = A * S * S
GEMM_FLOOR_BYTES = A * 2 * (S * D + D * S + S * S)  # A, B and C of the batched GEMMs with an s x s operand or output
# Q K^T (and dP = dO V^T): 1024 x 1024 x 64 per head, 8 x 8 tiles of 128 x 128, 16 heads: 1,024 tiles, 8 waves of
# 132 (2 x 128^2 x 64 = 2,097,152 FLOPs: 0.34988 us; 128^2 x 2 B epilogue at BW_SM: 1.45074 us) = 14.405 us, above
# the floor of A, B, C (37,748,736 B / BW = 12.661 us)
QK_S = 8 * (2 * 128 * 128 * 64 / RATE_SM + 128 * 128 * 2 / BW_SM)
# P V (and dV, dQ, dK): 1024 x 64 x 1024 per head, 8 x 1 tiles of 128 x 64, 128 tiles in one wave (3.502 us): the
# floor binds, the same 37,748,736 B / BW = 12.661 us
PV_S = GEMM_FLOOR_BYTES / BW


def _mem(bytes_per_score: float, reduction: bool = False) -> float:
    """A memory-bound kernel over the 16,777,216 scores."""
    return SCORES * bytes_per_score / (BW * (0.70 if reduction else 1.0))


def _op(impl: str) -> AttentionOp:
    return AttentionOp(f"{impl}_attention", A, D, S, S, True, 2, impl)


def test_stored_score_kernels_by_hand_on_the_h100() -> None:
    """Each kernel's bytes (read + written per score) and FLOPs, from Megatron-LM's code (megatron/model/transformer.py
    CoreAttention; megatron/model/fused_softmax.py FusedScaleMaskSoftmax):

    unfused forward (6 kernels): baddbmm S = Q K^T (2 s^2 d FLOPs a head; 14.405 us), scale ``input * scale`` (read
    2 + write 2 B: 67.1 MB, 22.508 us), mask ``masked_fill_`` (2 + 2 + the 1-byte mask: 83.9 MB, 28.136 us), softmax
    (2 + 2, a row reduction: 32.155 us), dropout (2 + 2 + its 1-byte mask: 28.136 us), bmm O = P V (12.661 us);
    backward (8): dP = dO V^T (14.405), dV = P^T dO (12.661), dropout backward (dY 2 + mask 1 + dX 2: 28.136),
    softmax backward (dY 2 + Y 2 + dX 2, a reduction: 100.7 MB, 48.232 us), mask backward (2 + 1 + 2: 28.136), scale
    backward (2 + 2: 22.508), dQ = dS K and dK = dS^T Q (12.661 each).
    fused_softmax forward (4): baddbmm, ScaledUpperTriangMaskedSoftmax (2 + 2; a causal mask is built from indices,
    not read: 32.155 us), dropout, bmm; backward (6): dP, dV, dropout backward, the fused softmax backward (2 + 2 + 2:
    48.232 us), dQ, dK."""
    fwd = {
        "unfused": QK_S + _mem(4) + _mem(5) + _mem(4, True) + _mem(5) + PV_S + 6 * LAT,  # 150.000 us
        "fused_softmax": QK_S + _mem(4, True) + _mem(5) + PV_S + 4 * LAT,  # 95.356 us
    }
    bwd = {
        "unfused": QK_S + PV_S + _mem(5) + _mem(6, True) + _mem(5) + _mem(4) + 2 * PV_S + 8 * LAT,  # 195.400 us
        "fused_softmax": QK_S + PV_S + _mem(5) + _mem(6, True) + 2 * PV_S + 6 * LAT,  # 140.756 us
    }
    assert fwd["unfused"] == pytest.approx(150.000e-6, rel=1e-5)
    for impl, kernels in (("unfused", (6, 8)), ("fused_softmax", (4, 6))):
        op = _op(impl)
        assert op_s(H100, op, "F", 1, 1) == (pytest.approx(fwd[impl], rel=1e-9), kernels[0])
        assert op_s(H100, op, "B", 1, 1) == (pytest.approx(bwd[impl], rel=1e-9), kernels[1])
        # FLOPs: Q K^T and P V, 4 s^2 d a head, whatever the kernel; the stored-score kernels compute the whole square
        assert op.flops == 4 * S * S * D * A
        gemm_flops = sum(k.flops(S, S, D) for k in op.score_kernels("F"))
        assert gemm_flops * A == op.flops and sum(k.flops(S, S, D) for k in op.score_kernels("B")) * A == 2 * op.flops
    # forward bytes per sample: the two GEMMs' A, B, C plus the memory-bound kernels' bytes per score
    assert _op("unfused").bytes == GEMM_FLOOR_BYTES * 2 + SCORES * (4 + 5 + 4 + 5)
    assert _op("fused_softmax").bytes == GEMM_FLOOR_BYTES * 2 + SCORES * (4 + 5)
    # tp = 2 halves the heads: the same kernels over 8 matrices (QK^T: 512 tiles, 4 waves)
    half = op_s(H100, _op("fused_softmax"), "F", 1, 2)[0]
    assert half == pytest.approx(QK_S / 2 + (_mem(4, True) + _mem(5) + PV_S) / 2 + 4 * LAT, rel=1e-9)


def test_flash_by_hand_and_against_the_stored_scores() -> None:
    """FlashAttention-2 at the same shape: 8 query blocks of 128 and 8 key blocks, causal: 36 block pairs; 16 x 8 =
    128 thread blocks, one wave of 132 SMs, each looping over 36/8 = 4.5 pairs of (2 matmuls 2 x 128^2 x 64 FLOPs at
    RATE_SM: 0.69976 us; 128^2 scores x (one exp at 16 per SM per clock of 1.83 GHz + 4 FP32 ops at 67e12 / 2 / 132):
    0.81779 us) = 1.51755 us, plus its Q read and O write (2 x 128 x 64 x 2 B at BW_SM: 1.45074 us): 8.280 us, one
    kernel. Backward: per pair 5 matmuls, the scores and the fp32 dQ add (128 x 64 x 4 B at BW_SM): 4.01793 us; per
    thread block K, V read and dK, dV written: 2.90148 us; plus the dO.O row sums and the dQ conversion over 16 x 1024
    x 64 x (2 + 2 + 4 + 2) B at BW: 3.51694 us; three kernels."""
    scores_s = 128 * 128 * (1 / (16 * 1.83e9) + 4 / (67e12 / 2 / 132))
    fwd = 4.5 * (2 * 2 * 128 * 128 * 64 / RATE_SM + scores_s) + 2 * 128 * 64 * 2 / BW_SM
    pair_b = 5 * 2 * 128 * 128 * 64 / RATE_SM + scores_s + 128 * 64 * 4 / BW_SM
    bwd = 4.5 * pair_b + 4 * 128 * 64 * 2 / BW_SM + A * S * D * (2 * 2 + 4 + 2) / BW
    flash = _op("flash")
    assert op_s(H100, flash, "F", 1, 1) == (pytest.approx(fwd + LAT, rel=1e-9), 1)  # 10.280 us
    assert op_s(H100, flash, "B", 1, 1) == (pytest.approx(bwd + 3 * LAT, rel=1e-9), 3)  # 30.499 us
    assert flash.bytes == A * D * 2 * (2 * S + 2 * S)  # Q, K, V read and O written: 8,388,608 B
    # the stored-score kernels write and re-read the 16.8 M scores: far slower here (150 + 195 us against 41 us)
    unfused = sum(op_s(H100, _op("unfused"), p, 1, 1)[0] for p in "FB")
    fused = sum(op_s(H100, _op("fused_softmax"), p, 1, 1)[0] for p in "FB")
    assert sum(op_s(H100, flash, p, 1, 1)[0] for p in "FB") < fused < unfused


def test_memory_by_hand_at_the_same_shape() -> None:
    """What the core keeps per sample: unfused and fused_softmax the softmax output (2 B a score), the dropout mask (1)
    and the dropout output (2): 5 x 16,777,216 = 83,886,080 B (Korthikanti's 5as^2); flash only the fp32 log-sum-exp
    of each query row and head, 4 x 16 x 1024 = 65,536 B."""
    assert _op("unfused").saved_bytes == _op("fused_softmax").saved_bytes == 5 * SCORES == 83_886_080
    assert _op("unfused").saved_scores_bytes == 83_886_080
    assert _op("flash").saved_bytes == 4 * A * S == 65_536 and _op("flash").saved_scores_bytes == 0
    # fp32 activations: 4 + 1 + 4 bytes a score (the dropout mask stays one byte)
    assert AttentionOp("a", A, D, S, S, True, 4, "unfused").saved_bytes == 9 * SCORES


def korthikanti(s: int, h: int, a: int) -> float:
    """Korthikanti et al. 2022, Sec. 4.1: a transformer layer keeps sh(34 + 5as/h) bytes per sequence at t = 1 with
    2-byte activations (attention 11sh + 5as^2, MLP 19sh, layer norms 4sh)."""
    return s * h * (34 + 5 * a * s / h)


@pytest.mark.parametrize("impl", ["unfused", "fused_softmax"])
def test_stored_scores_follow_korthikanti(impl: str) -> None:
    for spec, (s, h, a) in (("gpt2-345m", (1024, 1024, 16)), ("gpt3-175b", (2048, 12288, 96)),
                            ("bert-large", (512, 1024, 16))):  # fmt: skip
        m = get_model(f"{spec}:attention={impl}")
        assert layer_activations(m, 1, 1, False, "none").stored == korthikanti(s, h, a)
        # with tensor parallelism t: sh(10 + 24/t + 5as/(ht)) (Sec. 4.2.1)
        assert layer_activations(m, 1, 8, False, "none").stored == s * h * (10 + 24 / 8 + 5 * a * s / (h * 8))


def test_flash_drops_exactly_the_scores() -> None:
    """Flash attention keeps sh x 34 + 4as at t = 1: Korthikanti's figure less 5as^2, plus the fp32 statistics."""
    for spec, (s, h, a) in (("gpt2-345m", (1024, 1024, 16)), ("gpt3-175b", (2048, 12288, 96))):
        flash, unfused = get_model(spec), get_model(f"{spec}:attention=unfused")
        for tp in (1, 2, 8):
            f = layer_activations(flash, 1, tp, False, "none").stored
            u = layer_activations(unfused, 1, tp, False, "none").stored
            assert u - f == (5 * a * s * s - 4 * a * s) / tp
        assert layer_activations(flash, 1, 1, False, "none").stored == s * h * 34 + 4 * a * s
        # sequence parallelism divides all of it by t: sh/t (34) + 4as/t
        assert layer_activations(flash, 1, 8, True, "none").stored == (s * h * 34 + 4 * a * s) / 8
        # selective recomputation drops the core: the scores under unfused, only the statistics under flash, so both
        # keep sh(10 + 24/t), and flash rebuilds 4as/t where unfused rebuilds 5as^2/t
        for m, core in ((flash, 4 * a * s), (unfused, 5 * a * s * s)):
            sel = layer_activations(m, 1, 8, False, "selective")
            assert sel.stored == s * h * (10 + 24 / 8) and sel.rebuilt == core / 8
            assert m.layers[1].saved_core_bytes == core
        # full recomputation keeps the layer input either way
        full = (layer_activations(m, 1, 8, False, "full").stored for m in (flash, unfused))
        assert next(full) == next(full) == 2 * s * h


def test_cross_attention_follows_the_kernel() -> None:
    """T5's decoder layer: self-attention over dec_seq and cross-attention over enc_seq, each core its own."""
    s, kv, a = 128, 512, 12
    flash, unfused = get_model("t5-base"), get_model("t5-base:attention=unfused")
    dec = flash.index["dec0"]
    assert flash.layers[dec].saved_core_bytes == 4 * a * s + 4 * a * s
    assert unfused.layers[dec].saved_core_bytes == 5 * a * s * s + 5 * a * s * kv
    diff = unfused.layers[dec].saved_sharded_bytes - flash.layers[dec].saved_sharded_bytes
    assert diff == 5 * a * s * (s + kv) - 8 * a * s


def test_time_and_memory_read_the_same_ops() -> None:
    """The layer's memory is read from the attention ops its blocks run, and those ops are what the cost model runs
    (a recomputed core included): one choice, both sides."""
    for impl in ATTENTION_IMPLS:
        m = get_model(f"gpt2-345m:attention={impl}")
        layer = m.layers[1]
        (core,) = attention_cores(layer.blocks)
        assert core.impl == impl and layer.saved_core_bytes == core.saved_bytes
        block = layer.blocks[0]
        rebuilt = attention_core(block)
        assert rebuilt is not None and rebuilt.ops == (core,)
        # a forward of the attention block runs its core's kernels: layer norm, QKV, the core, proj, bias-dropout-add
        assert block_s(H100, block.ops, "F", 1, 1)[1] == 4 + core.fwd_kernels


def test_the_event_key_names_a_stored_score_kernel() -> None:
    """A profile's flash measurement keeps its key; another kernel's event has another key."""
    key = {impl: ComputeEvent(get_model(f"gpt2-345m:attention={impl}").layers[1].blocks[0], "F", 1, 1, "fp16-mixed").key
           for impl in ATTENTION_IMPLS}  # fmt: skip
    assert key["flash"] == "attention[h=1024,heads=16,seq=1024]/F/mbs=1/tp=1/fp16-mixed"
    assert key["unfused"] == "attention[h=1024,heads=16,seq=1024,unfused=1]/F/mbs=1/tp=1/fp16-mixed"
    assert len(set(key.values())) == 3
    costs = AnalyticCosts(get_cluster("dgx-h100"))
    times = {impl: costs.compute(ComputeEvent(get_model(f"gpt2-345m:attention={impl}").layers[1].blocks[0], "F", 4, 2,
                                              "fp16-mixed")).seconds for impl in ATTENTION_IMPLS}  # fmt: skip
    assert times["flash"] < times["fused_softmax"] < times["unfused"]


def test_memory_estimate_names_the_scores() -> None:
    """A GPT of s = 8, h = 16, a = 4 (5as^2 = 1,280 B a layer) on 2 stages of [embedding, l0, l1 | l2, l3, head], 1F1B
    with 4 micro-batches: rank 0 holds K = 2 micro-batches of 2 layers, so 2 x 2 x 1,280 = 5,120 B of scores;
    flash none; selective and full recomputation drop them."""
    s = Strategy(pp=2, num_micro_batches=4)
    for impl, scores in (("unfused", 5120), ("fused_softmax", 5120), ("flash", 0)):
        m = decoder_only("tiny", 4, 16, 4, 8, 128, source="test", attention=impl)
        est = estimate_memory(m, s, build_schedule(s), ranges((3, 3)), 80e9)[0]
        assert est.attention_scores_bytes == scores and est.to_dict()["attention_scores_bytes"] == scores
        assert ("attention scores" in est.describe_parts(1.0, "B")) == bool(scores)
        for mode in ("selective", "full"):
            sel = estimate_memory(m, s.with_(recompute=mode), build_schedule(s), ranges((3, 3)), 80e9)[0]
            assert sel.attention_scores_bytes == 0
    # a simulation's result: the summary's memory line (describe_parts) and its JSON
    cluster = get_cluster("distsim-testbed")
    result = simulate(get_model("gpt2-345m:attention=unfused"), cluster, Strategy.from_str("2M4P2D"))
    assert "attention scores" in result.memory[0].describe_parts()
    rank = result.to_dict()["memory_per_rank"][0]
    # the in-flight micro-batches x 6 layers (24 over pp 4) of 16 heads x 1024^2 scores x 5 B, over tp 2
    assert rank["attention_scores_bytes"] == rank["in_flight_microbatches"] * 6 * 16 * 1024 * 1024 * 5 / 2 > 0
    flash = simulate(get_model("gpt2-345m"), cluster, Strategy.from_str("2M4P2D"))
    assert flash.to_dict()["memory_per_rank"][0]["attention_scores_bytes"] == 0


def test_zoo_specs_take_attention() -> None:
    m = get_model("gpt2-345m:attention=fused_softmax,seq=128")
    assert m.name == "gpt2-345m:attention=fused_softmax,seq=128" and "fused_softmax attention" in m.description
    assert {op.impl for op in attention_cores([b for layer in m.layers for b in layer.blocks])} == {"fused_softmax"}
    assert get_model("gpt2-345m:attention=flash").layers == get_model("gpt2-345m").layers
    assert get_model("t5-cpu:attention=unfused").layers[-2].blocks[1].ops[3].impl == "unfused"  # a cross-attention
    with pytest.raises(ModelFileError, match="attention must be one of flash, unfused, fused_softmax, got 'fa3'"):
        get_model("gpt2-345m:attention=fa3")
    with pytest.raises(ModelFileError, match="takes overrides image, classes, precision; not 'attention'"):
        get_model("resnet50:attention=flash")


def test_an_unknown_attention_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(["simulate", "--model", "gpt2-345m:attention=sdpa", "--cluster", "distsim-testbed",
                              "--strategy", "2M4P2D"], capsys)  # fmt: skip
    assert code == 2 and out == ""
    assert err.strip().splitlines() == [
        "distsim: error: model gpt2-345m: attention must be one of flash, unfused, fused_softmax, got 'sdpa'"
    ]


def test_model_files_take_attention() -> None:
    stack = {"layers": 2, "hidden": 64, "heads": 4, "seq": 32, "vocab": 1000}
    flash = model_from_dict({"name": "f", "transformer": stack})
    unfused = model_from_dict({"name": "f", "transformer": {**stack, "attention": "unfused"}})
    assert attention_cores(flash.layers[1].blocks)[0].impl == "flash"
    assert attention_cores(unfused.layers[1].blocks)[0].impl == "unfused"
    assert unfused.layers[1].saved_core_bytes == 5 * 4 * 32 * 32
    assert with_attention(flash, "unfused") == unfused
    for bad in ("flash2", 3, None):
        with pytest.raises(ModelFileError) as exc:
            model_from_dict({"name": "f", "transformer": {**stack, "attention": bad}})
        assert str(exc.value) == (f"model file transformer: attention must be one of flash, unfused, fused_softmax, "
                                  f"got {bad!r}")  # fmt: skip


def test_with_attention_round_trips() -> None:
    for spec in ("gpt2-345m", "bert-large:layers=2", "t5-base:layers=2", "gpt2-cpu"):
        m = get_model(spec)
        assert with_attention(m, "flash") is m
        for impl in ("unfused", "fused_softmax"):
            other = with_attention(m, impl)
            assert other.name == m.name
            built = get_model(f"{spec}{',' if ':' in spec else ':'}attention={impl}")
            assert other.layers == built.layers  # the same as building it with that kernel
            assert with_attention(other, "flash") == m
            assert with_attention(with_attention(other, "fused_softmax"), impl) == other
    fp32 = decoder_only("x", 2, 64, 4, 32, 100, source="t", precision=FP32)
    assert with_attention(with_attention(fp32, "unfused"), "flash") == fp32
    # a model without attention ops is returned as it is
    for plain in (get_model("resnet50"), model_from_dict({"name": "c", "layers": [{"name": "a", "forward_s": 1}]})):
        assert with_attention(plain, "unfused") is plain
    with pytest.raises(ModelFileError, match="attention must be one of flash, unfused, fused_softmax, got 'fa2'"):
        with_attention(get_model("gpt2-345m"), "fa2")


@pytest.mark.parametrize(
    ("impl", "preset"),
    [(impl, preset) for impl in ATTENTION_IMPLS for preset in ("dgx-h100", "dgx-a100", "cpu-1x2")
     if (impl, preset) != ("flash", "cpu-1x2")],
)  # fmt: skip
def test_more_attention_is_never_faster(impl: str, preset: str) -> None:
    """Longer sequences and more heads never run faster, on GPUs and CPUs. (Not flash on a CPU: its roofline counts
    the causal share in 128-blocks, so there 1025 causal tokens cost less than 1024; a separate, older matter.)"""
    gpu = get_cluster(preset).gpu
    for q in (1, 64, 100, 1024, 2048):
        for extra in (1, 63, 1000):
            for phase in "FB":
                base = op_s(gpu, AttentionOp("a", 8, 64, q, q, True, 2, impl), phase, 1, 1)[0]
                longer = op_s(gpu, AttentionOp("a", 8, 64, q + extra, q + extra, True, 2, impl), phase, 1, 1)[0]
                wider = op_s(gpu, AttentionOp("a", 8 + extra, 64, q, q, True, 2, impl), phase, 1, 1)[0]
                assert longer >= base and wider >= base, (q, extra, phase)

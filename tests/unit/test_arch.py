"""Today's transformer layers: grouped-query attention, SwiGLU, RMSNorm, rotary positions, untied output layer, no
biases or dropout (an Arch), checked against published parameter counts, the 6N FLOPs rule and hand-counted bytes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from distsim import Strategy, get_cluster, get_model
from distsim.core.errors import DistsimError, ModelFileError
from distsim.core.models.arch import GPT, LLAMA, Arch
from distsim.core.models.ops import GemmOp, MemoryOp, sequence_parallel_ops
from distsim.core.models.transformer import decoder_only, transformer_layer
from distsim.core.strategy import check_strategy

PUBLISHED = {"llama3-8b": 8.03e9, "llama3-70b": 70.6e9, "llama3-405b": 405.9e9}
"""Meta 2024, 'The Llama 3 Herd of Models' (8B, 70B, 405B; the released checkpoints' counts)."""


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_llama3_parameters_match_the_publication(name: str) -> None:
    assert get_model(name).params == pytest.approx(PUBLISHED[name], rel=0.005)


def _weights(model: object) -> int:
    """Parameters of every GEMM's weight matrix (the LM head's and every layer's linear layers)."""
    return (
        sum((op.n * op.k) for layer in model.layers for b in layer.blocks for op in b.ops if isinstance(op, GemmOp))
        // 1
    )


def test_forward_flops_are_two_per_weight_per_token_plus_attention() -> None:
    """The 6N rule's forward third: 2 FLOPs per GEMM weight per token; Llama 3 8B's GEMM weights are its parameters
    less the embedding table and the norms' scales. What the attention core adds is its own term."""
    m = get_model("llama3-8b")
    s = m.seq_len
    gemm_flops = sum(op.flops for layer in m.layers for b in layer.blocks for op in b.ops if isinstance(op, GemmOp))
    h, layers, vocab = 4096, 32, 128256
    norms = (2 * layers + 1) * h
    assert gemm_flops == 2 * s * (m.params - vocab * h - norms)
    core = (
        m.fwd_flops_per_sample
        - gemm_flops
        - sum(op.flops for layer in m.layers for b in layer.blocks for op in b.ops if isinstance(op, MemoryOp))
    )
    # the attention core: QK^T and PV, 2 x 2 s^2 h per layer (Narayanan et al.'s 4 s^2 h, the causal mask not halved)
    assert core == pytest.approx(layers * 4 * s * s * h, rel=0.01)


def test_grouped_query_attention_projects_and_keeps_fewer_kv_bytes() -> None:
    """64 query heads of 128 dims with 8 key/value heads: the QKV GEMM has (64 + 2 x 8) x 128 outputs, and a layer
    keeps 2 x 2 x (64 - 8) x 128 fewer bytes per token (K and V, 2-byte activations) than multi-head attention."""
    h, a, s, f = 8192, 64, 4096, 28672
    p = get_model("llama3-70b").precision
    gqa = transformer_layer("l", h, a, s, f, p, arch=replace(LLAMA, kv_heads=8))
    mha = transformer_layer("l", h, a, s, f, p, arch=LLAMA)
    qkv = next(op for op in gqa.blocks[0].ops if isinstance(op, GemmOp) and op.name == "qkv")
    assert qkv.n == (64 + 2 * 8) * 128
    assert mha.saved_sharded_bytes - gqa.saved_sharded_bytes == 2 * 2 * (64 - 8) * 128 * s
    assert dict(gqa.blocks[0].shape)["kv_heads"] == 8 and "kv_heads" not in dict(mha.blocks[0].shape)


def test_swiglu_has_three_weight_matrices_and_keeps_its_gate() -> None:
    """SwiGLU: gate and up (fused, h -> 2f) and down (f -> h), 3hf weights; the layer keeps gate and up (4sf) and
    their product (2sf) where GeLU keeps 4sf."""
    h, a, s, f = 1024, 16, 512, 2816
    p = get_model("gpt2-345m").precision
    swiglu = transformer_layer("l", h, a, s, f, p, arch=Arch(mlp="swiglu", bias=False))
    gelu = transformer_layer("l", h, a, s, f, p, arch=Arch(bias=False))
    mlp = swiglu.blocks[-1]
    assert mlp.params == 3 * h * f + 2 * h
    assert [op.name for op in mlp.ops] == ["layernorm", "fc1", "swiglu", "fc2", "bias_dropout_add"]
    assert swiglu.saved_sharded_bytes - gelu.saved_sharded_bytes == 2 * f * s


def test_the_gpt_defaults_are_unchanged() -> None:
    """Korthikanti's 34 s h + core: 10 s h whole, 24 s h split; the blocks' keys as profiles hold them."""
    m = get_model("gpt2-345m")
    layer = m.layers[1]
    s, h = 1024, 1024
    assert layer.saved_bytes == 10 * s * h and layer.saved_sharded_bytes - layer.saved_core_bytes == 24 * s * h
    assert layer.blocks[0].shape_str() == "h=1024,heads=16,seq=1024"
    assert layer.blocks[1].shape_str() == "h=1024,ffn=4096,seq=1024"
    assert m.layers[-1].tied_to == "embedding"


def test_llama_layers_run_rmsnorm_rope_and_plain_residuals() -> None:
    m = get_model("llama3-8b:layers=2,seq=256")
    attention, mlp = m.layers[1].blocks
    assert [op.name for op in attention.ops] == ["rmsnorm", "qkv", "rope", "flash_attention", "proj", "residual_add"]
    assert attention.shape_str() == "h=4096,heads=32,seq=256,kv_heads=8,rope=1,rmsnorm=1,bias=0,dropout=0"
    assert mlp.shape_str() == "h=4096,ffn=14336,seq=256,swiglu=1,rmsnorm=1,bias=0,dropout=0"
    assert m.layers[0].blocks[0].params == 128256 * 4096  # no position table
    assert m.layers[-1].tied_to is None  # its own output layer: counted in full
    sp = sequence_parallel_ops(attention.ops)
    assert {op.name for op in sp if isinstance(op, MemoryOp) and op.tp == "shard"} >= {"rmsnorm", "residual_add"}


def test_spec_keys_state_the_architecture() -> None:
    m = get_model("gpt2-345m:kv_heads=4,mlp=swiglu,norm=rmsnorm,position=rope,tied_embeddings=0,bias=0,dropout=0")
    attention = m.layers[1].blocks[0]
    assert dict(attention.shape)["kv_heads"] == 4
    assert m.name.startswith("gpt2-345m:bias=0,dropout=0,kv_heads=4")
    mha = get_model("llama3-8b:kv_heads=32").layers[1].blocks[0]
    assert mha.shape_str().startswith("h=4096,heads=32,seq=8192,rope")
    for spec, needle in (
        ("gpt2-345m:kv_heads=3", "kv_heads (3) must divide heads (16)"),
        ("gpt2-345m:mlp=relu", "mlp must be one of gelu, swiglu, got 'relu'"),
        ("gpt2-345m:bias=maybe", "bias must be 0 or 1"),
        ("gpt2-345m:kv_heads=two", "kv_heads must be a whole number"),
    ):
        with pytest.raises(ModelFileError, match=needle.replace("(", r"\(").replace(")", r"\)")):
            get_model(spec)


def test_tensor_parallelism_must_split_the_kv_groups() -> None:
    """Megatron splits the key/value groups over tp ranks: 8 groups allow tp 8, not 16."""
    m = get_model("llama3-70b:layers=2")
    cluster = get_cluster("dgx-h100").with_nodes(2)
    check_strategy(Strategy(tp=8, dp=2), m, cluster)
    with pytest.raises(DistsimError, match="query groups"):
        check_strategy(Strategy(tp=16), m, cluster)


def test_a_model_file_states_the_architecture() -> None:
    from distsim.core.models.loader import model_from_dict

    m = model_from_dict({"name": "mini-llama", "transformer": {"layers": 2, "hidden": 512, "heads": 8, "seq": 128,
                         "vocab": 1000, "ffn": 1376, "kv_heads": 2, "mlp": "swiglu", "norm": "rmsnorm",
                         "position": "rope", "tied_embeddings": False, "bias": False, "dropout": False}})  # fmt: skip
    same = decoder_only("mini-llama", 2, 512, 8, 128, 1000, "", f=1376, arch=replace(LLAMA, kv_heads=2))
    assert m.params == same.params and [b.shape for layer in m.layers for b in layer.blocks] == [
        b.shape for layer in same.layers for b in layer.blocks
    ]
    assert Arch() == GPT


def test_fp8_runs_the_layers_gemms_on_the_fp8_tensor_cores() -> None:
    """Transformer Engine's FP8: each tensor-parallel GEMM after a cast of its input (3 bytes per element: bf16 read,
    FP8 and amax written), at the H100's 1979 TF instead of 989; the LM head and the memory stay bf16's."""
    from distsim.core.cluster import get_cluster as cluster
    from distsim.sim.kernels import block_s

    bf16, fp8 = get_model("llama3-8b:layers=2,precision=bf16-mixed"), get_model("llama3-8b:layers=2,precision=fp8")
    mlp8 = fp8.layers[1].blocks[1]
    names = [op.name for op in mlp8.ops]
    assert names == ["rmsnorm", "fp8_cast", "fc1", "swiglu", "fp8_cast", "fc2", "residual_add"]
    cast, fc1 = mlp8.ops[1], mlp8.ops[2]
    assert cast.bytes == 3 * fc1.m * fc1.k and fc1.elem_bytes == 1
    assert all(op.elem_bytes == 2 for op in fp8.layers[-1].blocks[0].ops if isinstance(op, GemmOp))  # LM head
    h100 = cluster("dgx-h100").gpu
    gemm = (fc1,)
    t8, _ = block_s(h100, gemm, "F", 4, 1)
    t16, _ = block_s(h100, (replace(fc1, elem_bytes=2),), "F", 4, 1)
    assert 1.8 < t16 / t8 <= 2.0 + 1e-9  # compute-bound: the FP8 peak is twice bf16's
    assert fp8.params == bf16.params and fp8.layers[1].saved_sharded_bytes == bf16.layers[1].saved_sharded_bytes


def test_fp8_on_a_gpu_without_fp8_tensor_cores_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from tests.util import run_cli

    code, _, err = run_cli(["simulate", "--model", "llama3-8b:layers=2,precision=fp8", "--cluster", "dgx-a100",
                            "--nodes", "1", "--strategy", "1M1P8D"], capsys)  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "A100-SXM4-80GB has no FP8 tensor cores" in err

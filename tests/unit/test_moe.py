"""Mixture-of-experts MLPs (Mixtral): parameters against the publication, the FLOPs of the routed experts only, the
kept activations, and the inputs that state them (spec, Megatron launch line, the CLI)."""

from __future__ import annotations

import pytest

from distsim import get_model
from distsim.core.megatron import parse_megatron_args
from distsim.core.models.ops import GemmOp
from tests.util import run_cli


def _expert_params(model: object) -> int:
    return sum(n for layer in model.layers for b in layer.blocks if b.op == "moe" for n, split in b.tensors[2:]
               if split)  # fmt: skip


def _active(model: object, k: int, experts: int) -> float:
    """Parameters a token runs through: all but the experts it is not routed to."""
    return model.params - _expert_params(model) * (1 - k / experts)


@pytest.mark.parametrize(("name", "total", "active"), [("mixtral-8x7b", 46.7e9, 12.9e9),
                                                        ("mixtral-8x22b", 141e9, 39e9)])  # fmt: skip
def test_mixtral_parameters_match_the_publication(name: str, total: float, active: float) -> None:
    """Jiang et al. 2024: 8x7B has 46.7 B parameters, 12.9 B active per token; 8x22B 141 B and 39 B (Mistral AI)."""
    m = get_model(name)
    assert m.params == pytest.approx(total, rel=0.005)
    assert _active(m, 2, 8) == pytest.approx(active, rel=0.005)


def test_a_token_runs_only_its_experts() -> None:
    """The GEMMs' forward FLOPs are 2 per active weight per token: the attention's, the router's, top_k experts'
    (never all of them) and the LM head's."""
    m = get_model("mixtral-8x7b:layers=2")
    s, h, vocab = m.seq_len, 4096, 32000
    gemm_flops = sum(op.flops for layer in m.layers for b in layer.blocks for op in b.ops if isinstance(op, GemmOp))
    norms = (2 * 2 + 1) * h
    assert gemm_flops == pytest.approx(2 * s * (_active(m, 2, 8) - vocab * h - norms), rel=1e-12)


def test_an_moe_layer_keeps_the_routed_copies() -> None:
    """Beyond a dense layer's attention tensors, an MoE layer keeps the router's input and fp32 probabilities and
    the top_k permuted copies of each token (whole), and each copy's SwiGLU activations (6 ffn, split over tp)."""
    m = get_model("mixtral-8x7b:layers=1,seq=1024")
    dense = get_model("llama3-8b:layers=1,seq=1024,hidden=4096,heads=32,kv_heads=8,ffn=14336")
    s, h, f = 1024, 4096, 14336
    moe, llama = m.layers[1], dense.layers[1]
    assert moe.saved_bytes - llama.saved_bytes == (4 * s * 8 + 2 * s * 2 * h) - 0  # router probs, 2 copies; fc1 input
    assert moe.saved_sharded_bytes - llama.saved_sharded_bytes == 6 * f * s  # one more routed copy's activations


def test_a_mixtral_launch_line_is_the_zoo_model() -> None:
    line = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
            "--group-query-attention --num-query-groups 8 --seq-length 4096 --max-position-embeddings 32768 "
            "--position-embedding-type rope --normalization RMSNorm --swiglu --untie-embeddings-and-output-weights "
            "--disable-bias-linear --attention-dropout 0 --hidden-dropout 0 --vocab-size 32000 --num-experts 8 "
            "--moe-router-topk 2 --micro-batch-size 1 --global-batch-size 256 --tensor-model-parallel-size 2 "
            "--pipeline-model-parallel-size 4 --sequence-parallel --use-distributed-optimizer --bf16")  # fmt: skip
    job = parse_megatron_args(line)
    model, zoo = get_model(job.spec), get_model("mixtral-8x7b")
    assert model.params == zoo.params
    assert [b.shape for layer in model.layers for b in layer.blocks] == [
        b.shape for layer in zoo.layers for b in layer.blocks
    ]
    assert job.unknown == ()


def test_mixtral_simulates_and_the_profiler_refuses_its_experts(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--model", "mixtral-8x7b:layers=4", "--cluster", "dgx-h100", "--nodes", "1", "--strategy",
            "2M2P2D", "--micro-batches", "4", "--sequence-parallel"]  # fmt: skip
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    assert "iteration time" in out and "peak memory" in out
    assert "MoE 8 experts top-2" in get_model("mixtral-8x7b").description
    from distsim.profiler.build import build_problem

    moe = get_model("mixtral-8x7b:layers=1").layers[1].blocks[1]
    assert (build_problem(moe) or "").startswith("no torch module for block op 'moe'")

"""Megatron-LM launch lines as jobs (--megatron-args), and --global-batch."""

from __future__ import annotations

from pathlib import Path

import pytest

from distsim import get_model
from distsim.core.megatron import MegatronArgsError, parse_megatron_args
from tests.util import run_cli

LLAMA3_70B = """
# Llama 3 70B, as NVIDIA's Megatron-LM examples launch it (FP8 on H100)
torchrun --nproc-per-node 8 --nnodes 8 pretrain_gpt.py \\
    --use-mcore-models --transformer-impl transformer_engine \\
    --num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64 \\
    --group-query-attention --num-query-groups 8 --kv-channels 128 \\
    --seq-length 8192 --max-position-embeddings 8192 \\
    --position-embedding-type rope --rotary-base 500000 --normalization RMSNorm --norm-epsilon 1e-5 \\
    --swiglu --untie-embeddings-and-output-weights --disable-bias-linear \\
    --attention-dropout 0.0 --hidden-dropout 0.0 \\
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model meta-llama/Meta-Llama-3-70B \\
    --micro-batch-size 1 --global-batch-size 128 \\
    --tensor-model-parallel-size 8 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 5 \\
    --sequence-parallel --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap \\
    --bf16 --fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max \\
    --lr 1.5e-4 --min-lr 1.5e-5 --lr-decay-style cosine --weight-decay 0.1 --clip-grad 1.0 \\
    --train-iters 1000 --log-interval 1 --data-path /data/corpus --split 99,1,0 --save /ckpt --my-own-flag 3
"""

GPT2_MEDIUM = """python pretrain_gpt.py --num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024
    --max-position-embeddings 1024 --micro-batch-size 4 --global-batch-size 64 --tokenizer-type GPT2BPETokenizer
    --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt --fp16 --lr 0.00015"""


def _shapes(model: object) -> list[tuple]:
    return [b.shape for layer in model.layers for b in layer.blocks]


def test_a_llama3_70b_launch_line_is_the_zoo_model_and_its_strategy() -> None:
    job = parse_megatron_args(LLAMA3_70B)
    model, zoo = get_model(job.spec), get_model("llama3-70b:precision=fp8")
    assert model.params == zoo.params and _shapes(model) == _shapes(zoo)
    assert job.degrees(64) == (8, 4, 2, 64)  # dp = 64 / (8 x 4); 128 samples / (2 x 1)
    assert job.strategy == {"schedule": "interleaved", "virtual_stages": 4, "sequence_parallel": True,
                            "optimizer_sharding": "zero1", "partition": (6, *[5] * 14, 6)}  # fmt: skip
    assert job.framework == {"tp_comm_overlap": True, "overlap_grad_reduce": True, "overlap_param_gather": True}
    assert job.unknown == ("my-own-flag",)
    assert {"lr", "data-path", "save", "nnodes", "rotary-base"} <= set(job.no_effect)


def test_megatrons_defaults_are_gpt() -> None:
    """No architecture flags: dropout 0.1, learned positions, LayerNorm, GeLU 4h, tied embeddings, biases."""
    job = parse_megatron_args(GPT2_MEDIUM)
    model, zoo = get_model(job.spec), get_model("gpt2-345m")
    assert model.params == zoo.params and _shapes(model) == _shapes(zoo)
    assert job.degrees(8) == (1, 1, 8, 2) and job.unknown == ()


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("--hidden-size 1024 --num-attention-heads 16 --seq-length 64 --vocab-size 100", "--num-layers is missing"),
        (GPT2_MEDIUM + " --tensor-model-parallel-size two", "--tensor-model-parallel-size must be a whole number"),
        (GPT2_MEDIUM + " --kv-channels 32", "--kv-channels 32: heads of other than hidden/heads"),
        (
            GPT2_MEDIUM.replace("--tokenizer-type GPT2BPETokenizer", "--tokenizer-type SentencePieceTokenizer"),
            "give --vocab-size N",
        ),
        (GPT2_MEDIUM + " --normalization BatchNorm", "--normalization must be one of LayerNorm, RMSNorm"),
    ],
)
def test_what_cannot_be_read_is_one_line(line: str, needle: str) -> None:
    with pytest.raises(MegatronArgsError, match=needle):
        parse_megatron_args(line)


def test_the_global_batch_must_divide() -> None:
    with pytest.raises(MegatronArgsError, match="not a multiple of data-parallel 3"):
        parse_megatron_args(GPT2_MEDIUM).degrees(3)


def test_simulate_takes_a_launch_line_from_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "llama.sh"
    small = LLAMA3_70B.replace("--num-layers 80", "--num-layers 16").replace("--global-batch-size 128",
                                                                            "--global-batch-size 16")  # fmt: skip
    path.write_text(
        small.replace("--num-layers-per-virtual-pipeline-stage 5", "--num-layers-per-virtual-pipeline-stage 2")
    )
    code, out, err = run_cli(["simulate", "--megatron-args", f"@{path}", "--cluster", "dgx-h100", "--nodes", "8"],
                             capsys)  # fmt: skip
    assert code == 0, err
    assert "strategy 8M4P2D" in out and "schedule=interleaved v=2" in out and "sync=ddp" in out
    assert "not understood (check them): --my-own-flag" in err
    code, _, err = run_cli(["simulate", "--megatron-args", f"@{path}", "--model", "gpt2-345m", "--cluster",
                            "dgx-h100"], capsys)  # fmt: skip
    assert code == 2 and "drop --model" in err
    code, _, err = run_cli(["simulate", "--megatron-args", "@/no/such/file", "--cluster", "dgx-h100"], capsys)
    assert code == 2 and "cannot read /no/such/file" in err and "Traceback" not in err


def test_global_batch_sets_the_micro_batches(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["simulate", "--model", "gpt2-345m", "--cluster", "dgx-a100", "--nodes", "1", "--strategy", "1M2P4D",
            "--micro-batch-size", "2"]  # fmt: skip
    code, out, _ = run_cli([*base, "--global-batch", "64"], capsys)
    assert code == 0 and "mb=8" in out and "global batch 64" in out
    code, _, err = run_cli([*base, "--global-batch", "60"], capsys)
    assert code == 2 and "not a multiple of dp 4 x micro-batch size 2 = 8" in err
    code, _, err = run_cli([*base, "--global-batch", "64", "--micro-batches", "8"], capsys)
    assert code == 2 and "not both" in err


def test_the_shipped_example_is_the_zoo_model() -> None:
    """examples/megatron/llama3-70b-fp8.sh, which README simulates, reads without unknown flags as llama3-70b in
    fp8 on 8 x 8 H100s."""
    line = (Path(__file__).parents[2] / "examples" / "megatron" / "llama3-70b-fp8.sh").read_text()
    job = parse_megatron_args(line)
    assert job.unknown == ()
    assert get_model(job.spec).params == get_model("llama3-70b:precision=fp8").params
    assert job.degrees(64) == (8, 4, 2, 64)


def test_execute_takes_a_global_batch_too(capsys: pytest.CaptureFixture[str]) -> None:
    """The same rule as simulate's, checked before anything is launched."""
    base = ["execute", "--model", "gpt2-cpu", "--cluster", "cpu-1x2", "--strategy", "1M1P2D", "--micro-batch-size",
            "2"]  # fmt: skip
    code, _, err = run_cli([*base, "--global-batch", "6"], capsys)
    assert code == 2 and "--global-batch 6 is not a multiple of dp 2 x micro-batch size 2 = 4" in err

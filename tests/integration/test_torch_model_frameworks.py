"""What real frameworks' modules do that `distsim profile --torch-model` must see: a tied weight handed to a module
as an argument (megatron-core's output layer gets the word embedding's weight as ``weight=``), and blocks that
recompute in backward (activation checkpointing), which the profile refuses in one line. Plain torch modules here
stand in for any framework; the shipped example builders (examples/torch_models/) are the real ones (megatron-core's
are checked in tests/integration/test_examples_torch_models.py, in one subprocess)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.util import run_cli

torch = pytest.importorskip("torch")
nn = torch.nn

HERE = "tests.integration.test_torch_model_frameworks"
REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "torch_models"
VOCAB, WIDTH, BATCH, SEQ = 32, 16, 2, 8
REFUSAL = "the module recomputes its blocks in backward"


# --------------------------------------------------------------------------------------- the modules (user code)
class Head(nn.Module):
    """An LM head that owns only its bias and gets the embedding's weight when called, as megatron's does."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(VOCAB))

    def forward(self, x: Any, weight: Any, again: Any = None) -> Any:
        w = weight if weight.shape[0] == VOCAB else weight.t()
        return x @ w.t() + self.bias


class TiedLM(nn.Module):
    """Embedding, two identical blocks (each optionally checkpointed), a norm and :class:`Head`; `tie` says how the
    head gets the embedding's weight."""

    def __init__(self, tie: str = "keyword", checkpoint: str = "") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.GELU()) for _ in range(2))
        self.norm, self.head = nn.LayerNorm(WIDTH), Head()
        self.tie, self.checkpoint = tie, checkpoint

    def forward(self, ids: Any) -> Any:
        x = self.embed(ids)
        for block in self.blocks:
            if self.checkpoint:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=self.checkpoint == "reentrant")
            else:
                x = block(x)
        x, w = self.norm(x), self.embed.weight
        if self.tie == "keyword":
            return self.head(x, weight=w)
        if self.tie == "positional twice":  # the same parameter twice in one call: counted once
            return self.head(x, w, w)
        return self.head(x, w.t())  # a view of it


def spec(file: str, function: str) -> str:
    return f"{EXAMPLES / file}:{function}"


def _ids() -> Any:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))


def tied_keyword() -> tuple[nn.Module, Any]:
    return TiedLM("keyword"), _ids()


def tied_positional_twice() -> tuple[nn.Module, Any]:
    return TiedLM("positional twice"), _ids()


def tied_view() -> tuple[nn.Module, Any]:
    return TiedLM("view"), _ids()


def checkpointed_reentrant() -> tuple[nn.Module, Any]:
    return TiedLM(checkpoint="reentrant"), _ids()


def checkpointed_non_reentrant() -> tuple[nn.Module, Any]:
    return TiedLM(checkpoint="non-reentrant"), _ids()


# ------------------------------------------------------------------------------------------ tied weights as arguments
@pytest.mark.parametrize("builder", ["tied_keyword", "tied_positional_twice", "tied_view"])
def test_a_weight_handed_to_a_module_ties_its_layer_to_the_owner(builder: str) -> None:
    from distsim.core.models import model_from_dict
    from distsim.profiler.torch_model import trace

    traced = trace(f"{HERE}:{builder}", "cpu")
    pre, b0, b1, post = traced.layers
    assert (pre.name, post.name) == ("pre", "post") and traced.units == ["blocks.0", "blocks.1"]
    assert pre.params == VOCAB * WIDTH and pre.tied_to is None and b0.params == b1.params == WIDTH * WIDTH + WIDTH
    assert (post.params, post.tied_to, post.tied_params) == (2 * WIDTH + VOCAB + VOCAB * WIDTH, "pre", VOCAB * WIDTH)
    assert post.modules == ["norm", "head"]
    model = model_from_dict(traced.model_dict(), where="test")
    assert model.params == sum(p.numel() for p in traced.module.parameters())  # the embedding counted once


def test_the_hugging_face_gpt2_toy_head_stays_tied_to_its_embedding() -> None:
    pytest.importorskip("transformers")
    from distsim.profiler.torch_model import trace

    traced = trace(spec("hf_gpt2.py", "toy"), "cpu")
    post, vocab, width = traced.layers[-1], 256, 64
    assert (post.name, post.tied_to, post.tied_params) == ("post", "pre", vocab * width)
    assert post.params == 2 * width + vocab * width and post.modules == ["transformer.ln_f", "lm_head"]


# -------------------------------------------------------------------------------------------------- checkpointing
@pytest.mark.parametrize(
    ("builder", "how"),
    [
        ("checkpointed_reentrant", "a checkpoint's CheckpointFunctionBackward in its autograd graph"),
        ("checkpointed_non_reentrant", "torch.utils.checkpoint of blocks.0"),
    ],
)
def test_torch_checkpointing_is_refused_in_one_line(
    builder: str, how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.json"
    code, _, err = run_cli(["profile", "--torch-model", f"{HERE}:{builder}", "--out", str(out)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{REFUSAL} ({how})" in err and "--recompute full" in err and not out.exists()


@pytest.mark.parametrize(("file", "blocks"), [("hf_gpt2.py", "transformer.h.0"), ("hf_llama.py", "model.layers.0")])
def test_hugging_face_checkpointing_is_refused_in_one_line(
    file: str, blocks: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "p.json"
    code, _, err = run_cli(["profile", "--torch-model", spec(file, "toy_recompute"), "--out", str(out)], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{REFUSAL} (Hugging Face activation checkpointing of {blocks} and 1 more)" in err
    assert "build the module without checkpointing" in err and "--recompute full" in err and not out.exists()


# megatron-core's own tie and refusal: with the shipped example (tests/integration/test_examples_torch_models.py)

"""The shipped ``--torch-model`` examples (examples/torch_models/) at toy size on the CPU: every builder builds, one
step of the plain training loop (train_loop.py) trains it, and ``distsim profile --torch-model`` finds its decoder
layers as the repeated blocks. The Hugging Face ones run in this process, as tests/integration/test_torch_model.py
does; the megatron-core ones in subprocesses, because building one initialises torch.distributed and megatron's
global model-parallel state, which must not leak into the rest of the test session. Each skips, saying why, without
its framework."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from distsim.io.files import load_profile
from tests.util import run_cli

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "torch_models"
FAST = ["--repeats", "1", "--warmup", "0", "--no-self-check"]
HF = {  # file: (the block class, the blocks' module paths)
    "hf_gpt2.py": ("GPT2Block", "transformer.h.0..1"),
    "hf_llama.py": ("LlamaDecoderLayer", "model.layers.0..1"),
}


def spec(file: str, function: str) -> str:
    return f"{EXAMPLES / file}:{function}"


def need_megatron() -> None:
    """Skip without megatron-core (found without importing it: the import alone takes seconds)."""
    if importlib.util.find_spec("megatron") is None or importlib.util.find_spec("megatron.core") is None:
        pytest.skip("megatron-core is not installed (pip install megatron-core)")


def train_one_step(file: str, function: str) -> tuple[object, float]:
    """Build the example as distsim does and time one training step of two micro-batches: (module, seconds)."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(EXAMPLES))
    try:
        from train_loop import step_times
    finally:
        sys.path.remove(str(EXAMPLES))
    from distsim.profiler.torch_user import build

    module, batch = build(spec(file, function), torch.device("cpu"))
    (seconds,) = step_times(module, batch, micro_batches=2, steps=1, warmup=0)
    return module, seconds


def assert_blocks(err: str, out: Path, block: str, where: str) -> None:
    """The profile found two blocks of `block` at `where`, between a ``pre`` and a ``post`` layer."""
    assert f"2 x {block} ({where})" in err, err
    model = load_profile(out).model
    assert model is not None
    names = [layer["name"] for layer in model["layers"]]
    assert names[0] == "pre" and names[-1] == "post" and len(names) == 4, names


# ----------------------------------------------------------------------------------------------- Hugging Face
@pytest.mark.parametrize("file", sorted(HF))
def test_hugging_face_toys_train_and_profile(file: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    module, seconds = train_one_step(file, "toy")
    assert seconds > 0 and all(p.grad is None for p in module.parameters())  # the loop stepped and zeroed them
    assert next(module.parameters()).dtype.is_floating_point and module.training
    out = tmp_path / "toy.json"
    code, _, err = run_cli(["profile", "--torch-model", spec(file, "toy"), "--out", str(out), *FAST], capsys)
    assert code == 0, err
    assert_blocks(err, out, *HF[file])


@pytest.mark.parametrize("file", sorted(HF))
def test_hugging_face_recompute_toys_checkpoint_every_layer(file: str) -> None:
    pytest.importorskip("transformers")
    from distsim.profiler.torch_model import trace
    from distsim.profiler.torch_user import TorchModelError

    module, seconds = train_one_step(file, "toy_recompute")
    assert seconds > 0
    blocks = [m for m in module.modules() if type(m).__name__ == HF[file][0]]
    assert len(blocks) == 2 and all(b.gradient_checkpointing for b in blocks)
    with pytest.raises(TorchModelError, match="recomputes its blocks in backward"):  # profile the toy instead
        trace(spec(file, "toy_recompute"), "cpu")


# ------------------------------------------------------------------------------------------------ megatron-core
# One process for every megatron-core check (importing it takes seconds): both toys take a training step of the plain
# loop (its command line); the tracer ties the output layer, which gets the word embedding as an argument, to the
# embedding; `distsim profile` finds the decoder layers of the toy and refuses its recompute twin in one line (a
# profile times blocks without recomputation; simulate --recompute full adds it).
MEGATRON = """
import contextlib, io, json, sys
sys.path.insert(0, sys.argv[1])
import torch.distributed as dist
from train_loop import main as loop
from distsim.cli import main as cli
from distsim.core.models import model_from_dict
from distsim.profiler.torch_model import trace
toy, twin, out = sys.argv[2] + ":toy", sys.argv[2] + ":toy_recompute", sys.argv[3]
found = {}
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    for spec in (toy, twin):
        loop([spec, "--micro-batches", "2", "--steps", "1", "--warmup", "0"])
found["loops"] = [json.loads(line) for line in printed.getvalue().splitlines() if line.startswith("{")]
traced = trace(toy, "cpu")
found["layers"] = [{"name": x.name, "params": x.params, "tied_to": x.tied_to, "tied_params": x.tied_params,
                    "modules": x.modules} for x in traced.layers]
found["total"] = sum(p.numel() for p in traced.module.parameters())
found["model"] = model_from_dict(traced.model_dict(), where="test").params
for name, spec, target in (("profile", toy, out), ("refusal", twin, out + ".twin.json")):
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        try:
            cli(["profile", "--torch-model", spec, "--out", target, *sys.argv[4:]])
        except SystemExit as exc:
            found[name] = {"code": exc.code or 0, "stderr": said.getvalue()}
print(json.dumps(found))
dist.destroy_process_group()  # the builder's gloo group: left alive, its threads abort the exiting interpreter
"""


@pytest.fixture(scope="module")
def megatron(tmp_path_factory: pytest.TempPathFactory) -> dict:
    need_megatron()
    out = tmp_path_factory.mktemp("megatron") / "toy.json"
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", MEGATRON, str(EXAMPLES),
                           str(EXAMPLES / "megatron_gpt.py"), str(out), *FAST], cwd=REPO, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "out": out}


@pytest.mark.slow
def test_megatron_toys_train_one_step_with_and_without_recompute(megatron: dict) -> None:
    loops = megatron["loops"]
    assert [x["spec"].rsplit(":", 1)[1] for x in loops] == ["toy", "toy_recompute"]
    assert all(x["device"] == "cpu" and x["dtype"] == "float32" and math.isfinite(x["median_step_s"]) for x in loops)


@pytest.mark.slow
def test_megatron_toy_profiles_its_decoder_layers(megatron: dict) -> None:
    assert megatron["profile"]["code"] == 0, megatron["profile"]["stderr"][-3000:]
    assert_blocks(megatron["profile"]["stderr"], megatron["out"], "TransformerLayer", "gpt.decoder.layers.0..1")


@pytest.mark.slow
def test_megatron_output_layer_is_tied_to_the_word_embedding(megatron: dict) -> None:
    pre, post = megatron["layers"][0], megatron["layers"][-1]
    vocab, width, seq = 256, 64, 32
    assert pre["params"] == vocab * width + seq * width and pre["tied_to"] is None
    assert (post["tied_to"], post["tied_params"], post["params"]) == ("pre", vocab * width, 2 * width + vocab * width)
    assert post["modules"] == ["gpt.decoder.final_layernorm", "gpt.output_layer"]
    assert megatron["model"] == megatron["total"]  # the shared weight counted once


@pytest.mark.slow
def test_megatron_recomputation_is_refused_in_one_line(megatron: dict) -> None:
    refusal = megatron["refusal"]
    lines = [line for line in refusal["stderr"].strip().splitlines() if line.startswith("distsim")]
    assert refusal["code"] == 2 and len(lines) == 1, refusal["stderr"][-3000:]
    assert "Traceback" not in refusal["stderr"] and "not compatible with .grad()" not in refusal["stderr"]
    how = "megatron-core recompute_granularity='full', recompute_method='uniform' in gpt.config"
    assert f"the module recomputes its blocks in backward ({how})" in lines[0]
    assert "--recompute full" in lines[0] and not Path(str(megatron["out"]) + ".twin.json").exists()

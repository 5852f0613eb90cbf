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
def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_megatron_toy_profiles_its_decoder_layers(tmp_path: Path) -> None:
    need_megatron()
    out = tmp_path / "toy.json"
    done = run("-W", "ignore", "-m", "distsim", "profile", "--torch-model", spec("megatron_gpt.py", "toy"), "--out",
               str(out), *FAST)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert_blocks(done.stderr, out, "TransformerLayer", "gpt.decoder.layers.0..1")


# One process: both toys take a training step of the plain loop (its command line), and the recompute one is refused
# by distsim's tracer (a profile times blocks without recomputation; simulate --recompute full adds it).
MEGATRON_STEPS = """
import json, sys
sys.path.insert(0, sys.argv[1])
from train_loop import main
from distsim.profiler.torch_model import trace
from distsim.profiler.torch_user import TorchModelError
for function in ("toy", "toy_recompute"):
    main([f"{sys.argv[2]}:{function}", "--micro-batches", "2", "--steps", "1", "--warmup", "0"])
try:
    trace(f"{sys.argv[2]}:toy_recompute", "cpu")
    refused = ""
except TorchModelError as exc:
    refused = str(exc)
print(json.dumps({"refused": refused}))
"""


@pytest.mark.slow
def test_megatron_toys_train_one_step_with_and_without_recompute() -> None:
    need_megatron()
    done = run("-W", "ignore", "-c", MEGATRON_STEPS, str(EXAMPLES), str(EXAMPLES / "megatron_gpt.py"))
    assert done.returncode == 0, done.stderr[-3000:]
    *loops, traced = [json.loads(line) for line in done.stdout.strip().splitlines()]
    assert [x["spec"].rsplit(":", 1)[1] for x in loops] == ["toy", "toy_recompute"]
    assert all(x["device"] == "cpu" and x["dtype"] == "float32" and math.isfinite(x["median_step_s"]) for x in loops)
    assert "recompute_granularity='full', recompute_method='uniform'" in traced["refused"]

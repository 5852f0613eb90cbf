"""A user's own torch module: discovery of its layer graph, `distsim profile --torch-model`, and `distsim simulate
--model PROFILE` of it (real torch on CPU; the Hugging Face cases need transformers, the others do not)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from distsim.io.files import load_model, load_profile
from distsim.sim.profile_db import MODEL_VERSION, VERSION, Measurement, ProfileDB
from tests.util import run_cli

HELPER = "tests.torch_helper"
FAST = ["--repeats", "2", "--warmup", "1"]


def _params(module: Any) -> int:
    return sum(p.numel() for p in module.parameters())  # each shared Parameter once


# ------------------------------------------------------------------------------------ a profile holding its model
def _hand_profile(path: Path, with_model: bool = True) -> Path:
    """A profile whose model has two layers with measured events (1 ms forward, 2 ms backward each)."""
    block = {"op": "torch:Toy", "shape": {"params": 10}, "params": 10, "tp": "none"}
    model = {"name": "toy", "precision": "fp32", "micro_batch_size": 4,
             "layers": [{"name": f"l{i}", "blocks": [block], "out_bytes": 8.0} for i in range(2)]}  # fmt: skip
    compute = {f"torch:Toy[params=10]/{ph}/mbs=4/tp=1/fp32": Measurement(t) for ph, t in (("F", 1e-3), ("B", 2e-3))}
    compute |= {f"optimizer/params={n}/state_bytes=16": Measurement(1e-4) for n in (10, 20)}
    db = ProfileDB(provenance={"device": "test"}, compute=compute, model=model if with_model else None).refit()
    path.write_text(json.dumps(db.to_dict()))
    return path


def test_a_profile_with_a_model_is_the_model_and_its_own_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _hand_profile(tmp_path / "p.json")
    assert json.loads(path.read_text())["version"] == MODEL_VERSION
    assert load_model(str(path)).micro_batch_size == 4
    code, out, err = run_cli(["simulate", "--model", str(path), "--cluster", "cpu-1x2", "--strategy", "1M1P2D",
                              "--json"], capsys)  # fmt: skip
    assert code == 0, err
    result = json.loads(out)
    assert "mbs=4" in result["strategy_detail"]  # the profiled example batch is the default micro-batch
    assert result["event_sources"] == {"measured": 3, "analytic": 1}  # F, B, the step of 20 params; all-reduce
    assert result["profile"]["path"] == str(path)
    assert result["iteration_time_s"] > 2 * 3e-3  # two layers of 1 + 2 ms, then the (analytic) all-reduce
    code, out, _ = run_cli(["simulate", "--model", str(path), "--cluster", "cpu-1x2", "--strategy", "1M2P1D"], capsys)
    assert code == 0 and "also the model's layer graph" in out
    code, _, err = run_cli(["simulate", "--model", str(path), "--cluster", "cpu-1x2", "--strategy", "1M2P1D",
                            "--micro-batch-size", "8"], capsys)  # fmt: skip
    assert code == 2 and "profiled at micro-batch size 4" in err and len(err.strip().splitlines()) == 1


def test_profiles_without_a_model_stay_version_1_and_are_no_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _hand_profile(tmp_path / "p.json", with_model=False)
    assert json.loads(path.read_text())["version"] == VERSION == 1
    assert load_profile(path).model is None
    code, _, err = run_cli(["simulate", "--model", str(path), "--cluster", "cpu-1x2", "--strategy", "1M1P1D"], capsys)
    assert code == 2 and "a profile without a model" in err
    assert load_profile("profiles/cpu-gloo.json").model is None  # the shipped version-1 profile still loads


def test_grid_search_and_execute_of_a_profiled_module(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _hand_profile(tmp_path / "p.json")
    code, out, err = run_cli(["search", "grid", "--model", str(path), "--cluster", "cpu-1x2", "--gpus", "2",
                              "--global-batch", "8", "--plan-out", str(tmp_path / "best.yaml")], capsys)  # fmt: skip
    assert code == 0, err
    assert "mbs=4" in out and "costs: profile" in out  # its micro-batch size and its own measurements
    code, _, err = run_cli(["execute", "--model", str(path), "--cluster", "cpu-1x2", "--strategy", "1M1P2D",
                            "--out", str(tmp_path / "t.json")], capsys)  # fmt: skip
    assert code == 2 and "your own torch module" in err and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------------------------------------ discovery
def test_sequential_of_identical_blocks_is_pre_blocks_post() -> None:
    pytest.importorskip("torch")
    from distsim.core.models import model_from_dict
    from distsim.profiler.torch_model import trace
    from tests.torch_helper import make_mlp

    traced = trace(f"{HELPER}:make_mlp", "cpu")
    assert traced.repeated and traced.units == ["1", "2", "3"]
    assert [x.name for x in traced.layers] == ["pre", "1", "2", "3", "post"]
    assert [x.params for x in traced.layers] == [16 * 64 + 64, 4160, 4160, 4160, 64 * 4 + 4]
    assert traced.micro_batch_size == 8 and traced.precision == "fp32" and traced.seq_len is None
    assert len(traced.kinds()) == 3  # pre, the block, post
    assert traced.layers[1].out_bytes == 64 * 4  # one fp32 row of width 64 per sample crosses each cut
    assert traced.layers[-1].out_bytes == 0
    model = model_from_dict(traced.model_dict(), where="test")
    assert model.params == _params(make_mlp()[0]) and model.micro_batch_size == 8 and model.pipeline_layers == 3


def test_a_module_without_repeated_blocks_gets_a_layer_per_child() -> None:
    pytest.importorskip("torch")
    from distsim.profiler.torch_model import trace

    traced = trace(f"{HELPER}:make_plain", "cpu")
    assert not traced.repeated and [x.name for x in traced.layers] == ["0", "1", "2"]
    assert "no repeated blocks" in traced.report()
    assert sum(x.params for x in traced.layers) == 16 * 32 + 32 + 32 * 4 + 4


def test_tiny_hugging_face_gpt2_is_embeddings_two_blocks_and_tied_head() -> None:
    pytest.importorskip("transformers")
    from distsim.core.models import model_from_dict
    from distsim.profiler.torch_model import trace

    traced = trace(f"{HELPER}:make", "cpu")
    assert traced.repeated and traced.units == ["transformer.h.0", "transformer.h.1"]
    pre, h0, h1, post = traced.layers
    assert (pre.name, post.name) == ("pre", "post") and h0.op == h1.op == "torch:GPT2Block"
    assert pre.modules == ["transformer.wte", "transformer.wpe"] and post.modules == ["transformer.ln_f", "lm_head"]
    h, vocab, seq = 64, 256, 32
    block = 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + 2 * h + (h * 4 * h + 4 * h) + (4 * h * h + h)
    assert (pre.params, h0.params, h1.params) == (vocab * h + seq * h, block, block)
    assert (post.params, post.tied_to, post.tied_params) == (2 * h + vocab * h, "pre", vocab * h)
    model = model_from_dict(traced.model_dict(), where="test")
    assert model.params == _params(traced.module) == 118_528  # the tied word embedding counted once
    assert h0.out_bytes >= seq * h * 4 and h0.saved_bytes > h0.out_bytes  # fp32 hidden state; attention saves more
    assert traced.micro_batch_size == 2 and traced.seq_len == seq and len(traced.kinds()) == 3


# -------------------------------------------------------------------------------------------- profile, simulate
def _sources(path: Path, capsys: pytest.CaptureFixture[str], strategy: str, *more: str) -> dict[str, Any]:
    code, out, err = run_cli(["simulate", "--model", str(path), "--cluster", "cpu-1x2", "--strategy", strategy,
                              "--micro-batches", "2", "--json", *more], capsys)  # fmt: skip
    assert code == 0, err
    return json.loads(out)


def test_profile_and_simulate_a_torch_sequential(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    out = tmp_path / "mlp.json"
    code, _, err = run_cli(["profile", "--torch-model", f"{HELPER}:make_mlp", "--out", str(out), "--no-self-check",
                            *FAST], capsys)  # fmt: skip
    assert code == 0, err
    assert "3 x Sequential (1..3)" in err and f"distsim simulate --model {out}" in err
    db = load_profile(out)
    assert db.model is not None and db.provenance["model"] == f"{HELPER}:make_mlp"
    assert "self_check" not in db.provenance  # --no-self-check (the check itself: test_torch_model_gpu_true.py)
    assert sum(k.startswith("torch:") for k in db.compute) == 6  # pre, block, post x forward, backward
    result = _sources(out, capsys, "1M1P1D", "--nodes", "1", "--cluster", "cpu-2x1")  # one GPU: no communication
    assert result["event_sources"] == {"measured": 7}  # 3 layers' forward and backward, the whole model's step


def test_profile_and_simulate_a_tiny_hugging_face_gpt2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "gpt2.json"
    code, _, err = run_cli(["profile", "--torch-model", f"{HELPER}:make", "--out", str(out), *FAST], capsys)
    assert code == 0, err
    db = load_profile(out)
    keys = [k for k in db.compute if k.startswith("torch:")]
    assert len(keys) == 6 and all("/mbs=2/tp=1/fp32" in k for k in keys)
    assert db.compute[next(k for k in keys if k.startswith("torch:GPT2Block") and "/F/" in k)].flops > 0
    result = _sources(out, capsys, "1M2P1D")
    assert result["event_sources"]["measured"] == 6  # every compute event; optimizer steps fitted
    # one process measured no communication: only the p2p and tied-gradient all-reduce are estimated
    assert result["estimated_events"] and all(k.startswith(("p2p/", "all_reduce/")) for k in result["estimated_events"])


@pytest.mark.slow
def test_profile_a_tiny_gpt2_on_two_emulated_ranks_measures_everything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "gpt2.json"
    code, _, err = run_cli(["profile", "--torch-model", f"{HELPER}:make", "--cluster", "cpu-1x2", "--strategy",
                            "1M2P1D", "--micro-batches", "2", "--emulate-nodes", "1", "--procs-per-node", "2",
                            "--max-comm-bytes", "256KiB", "--comm-repeats", "2", "--out", str(out), *FAST],
                           capsys)  # fmt: skip
    assert code == 0, err
    result = _sources(out, capsys, "1M2P1D")
    assert "analytic" not in result["event_sources"] and result["event_sources"]["measured"] >= 8


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_function_here", "must be module:function"),
        ("tests.no_such_module:make", "cannot import tests.no_such_module (ModuleNotFoundError"),
        (f"{HELPER}:missing", "has no 'missing'"),
        (f"{HELPER}:NOT_CALLABLE", "'NOT_CALLABLE' is not callable (an int)"),
        (f"{HELPER}:not_a_pair", "must return (nn.Module, example batch), got Linear"),
        (f"{HELPER}:raises", "calling it raised ValueError: no data here"),
        ("no/such/file.py:make", "no such file no/such/file.py"),
    ],
)
def test_bad_torch_models_are_one_line(
    spec: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    code, _, err = run_cli(["profile", "--torch-model", spec, "--out", str(tmp_path / "p.json")], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "p.json").exists()


def test_another_micro_batch_size_than_the_example_batch_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    code, _, err = run_cli(["profile", "--torch-model", f"{HELPER}:make_mlp", "--micro-batch-size", "4", "--out",
                            str(tmp_path / "p.json")], capsys)  # fmt: skip
    assert code == 2 and "holds 8 samples and is the micro-batch" in err.strip().splitlines()[-1]

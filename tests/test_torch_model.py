"""A user's own torch module: `distsim simulate --model PROFILE` of a profile that holds its layer graph."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distsim.io import load_model, load_profile
from distsim.profile_db import MODEL_VERSION, VERSION, Measurement, ProfileDB
from tests.util import run_cli


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

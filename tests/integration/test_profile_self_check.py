"""The profile's self-check on CPU: in-situ chains of each stage's blocks, their ratios, and their reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from distsim.core.cluster import get_cluster  # noqa: E402
from distsim.core.strategy import Strategy  # noqa: E402
from distsim.infra.self_check import bias_warning, describe, summarise  # noqa: E402
from distsim.io.files import load_model, load_profile, write_json  # noqa: E402
from distsim.profiler.compute import time_compute_event  # noqa: E402
from distsim.profiler.insitu import plan_chains, run_chains  # noqa: E402
from distsim.search.discovery import discover  # noqa: E402
from distsim.sim.costs import AnalyticCosts  # noqa: E402
from distsim.sim.profile_db import Measurement, ProfileDB  # noqa: E402
from tests.util import run_cli  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TINY = "gpt2-345m:seq=16,layers=2,hidden=32,heads=4,vocab=64,precision=fp32"


def test_chains_cover_every_distinct_block_of_each_stage_with_at_least_four_layers() -> None:
    model = load_model("gpt2-345m")  # embedding, 24 transformer layers, LM head
    cluster = get_cluster("dgx-h100")
    one, two = Strategy.from_str("1M1P1D", micro_batch_size=2), Strategy.from_str("1M2P1D", micro_batch_size=2)
    (whole,) = plan_chains(model, cluster, [one])
    assert whole.layers == (0, 1, 2, 25) and [b.op for b in whole.blocks] == [
        "embedding", "attention", "mlp", "attention", "mlp", "lm_head"]  # fmt: skip
    assert len(whole.keys) == 12 and whole.keys[0].startswith("embedding") and whole.keys[-1].startswith("embedding")
    first, last = plan_chains(model, cluster, [two])
    assert first.layers == (0, 1, 2, 3) and last.layers[-1] == 25 and len(last.layers) == 4
    # stages with the same blocks share a chain; chains without a wanted event are left out
    assert len(plan_chains(model, cluster, [one, one])) == 1
    assert plan_chains(model, cluster, [one], wanted={"nothing"}) == []


def test_self_check_runs_on_cpu_and_records_a_positive_ratio_for_every_event(tmp_path: Path) -> None:
    model, cluster = load_model(TINY), get_cluster("cpu-1x2")
    strategies = [Strategy.from_str(s, num_micro_batches=2) for s in ("1M2P1D", "2M1P1D")]
    found = discover(model, cluster, strategies, AnalyticCosts(cluster))
    isolated = {
        k: time_compute_event(e, "cpu", warmup=1, repeats=2).mean_s for k, e in found.measurable_compute.items()
    }
    chains = plan_chains(model, cluster, strategies, wanted=set(isolated))
    assert set().union(*(c.keys for c in chains)) == set(isolated)  # every measured event is checked
    timings = run_chains(chains, torch.device("cpu"))
    assert len(timings) == len(chains)
    ratios, summary = summarise(timings, isolated, set(isolated), 1.0)
    assert set(ratios) == set(isolated) and all(r > 0 for r in ratios.values())
    assert summary["events"] == len(ratios) and summary["stage_ratio"] > 0
    assert len(summary["chains"]) == len(chains) and all(row["ratio"] > 0 for row in summary["chains"])
    assert summary["ratio_min"] <= summary["ratio_median"] <= summary["ratio_max"]

    # the profile records it; `profile show` prints it
    compute = {k: Measurement(t, mean_s=t, insitu_ratio=ratios[k]) for k, t in isolated.items()}
    path = tmp_path / "checked.json"
    write_json(path, ProfileDB(provenance={"device": "cpu", "self_check": summary}, compute=compute).to_dict())
    lines = describe(load_profile(path).provenance, ratios)
    assert lines[0].startswith("self-check, isolated / in-situ time: stage chains")
    assert any(chains[0].label in line for line in lines)


def _profile_with(tmp_path: Path, stage_ratio: float) -> Path:
    data = json.loads((ROOT / "profiles" / "cpu-gloo.json").read_text())
    keys = sorted(data["compute"])
    data["compute"][keys[0]].update(launch_s=2e-4, insitu_ratio=stage_ratio)
    data["provenance"]["self_check"] = {
        "chains": [{"label": "1M2P1D mbs=1 stage 0", "layers": [0, 1], "blocks": 3, "insitu_s": 0.01,
                    "isolated_s": 0.01 * stage_ratio, "ratio": stage_ratio}],
        "events": 1, "ratio_median": stage_ratio, "ratio_min": stage_ratio, "ratio_max": stage_ratio,
        "stage_ratio": stage_ratio, "seconds": 1.5,
    }  # fmt: skip
    path = tmp_path / f"bias-{stage_ratio}.json"
    path.write_text(json.dumps(data))
    return path


def test_profile_show_prints_the_self_check_and_launch_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(["profile", "show", str(_profile_with(tmp_path, 1.4))], capsys)
    assert code == 0
    assert "self-check, isolated / in-situ time: stage chains 1.400" in out
    assert "1M2P1D mbs=1 stage 0 (layers 0,1, 3 blocks)" in out and "off by more than 10%" in out
    assert "host launch time: 1 compute events" in out and "warning: the profile's self-check" in out
    code, out, _ = run_cli(["profile", "show", str(ROOT / "profiles" / "cpu-gloo.json")], capsys)
    assert code == 0 and "self-check: none recorded" in out and "host launch time" not in out


def test_simulate_mentions_a_large_bias_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--model", "gpt2-cpu", "--cluster", "cpu-1x2", "--strategy", "1M2P1D", "--micro-batches", "4"]
    code, out, err = run_cli([*args, "--profile", str(_profile_with(tmp_path, 1.4))], capsys)
    assert code == 0 and "self-check timed its blocks 1.40x in isolation" in out + err
    code, out, err = run_cli([*args, "--profile", str(_profile_with(tmp_path, 1.05))], capsys)
    assert code == 0 and "self-check" not in out + err
    assert bias_warning({"self_check": {"stage_ratio": 0.8}}) and bias_warning({}) is None

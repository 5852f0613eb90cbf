"""Validation reports known errors exactly, and refuses traces and profiles that do not belong together."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pandas as pd
import pytest

from distsim import Strategy, simulate
from distsim.io.files import load_cluster, load_model, write_json
from distsim.io.trace import Trace
from distsim.sim.costs import AnalyticCosts
from distsim.sim.timeline import COLUMNS, Timeline
from distsim.sim.validate import block_spans, compare
from tests.util import run_cli as run

MODEL, CLUSTER = "gpt2-cpu", "cpu-1x2"


def predicted(strategy: str = "tp=1 pp=2 dp=1 mb=4 schedule=1f1b partition=4:2") -> tuple[Timeline, dict]:
    model, cluster = load_model(MODEL), load_cluster(CLUSTER)
    s = Strategy.from_str(strategy)
    r = simulate(model, cluster, s, AnalyticCosts(cluster))
    plan = {"model": MODEL, "cluster": CLUSTER, "nodes": 1, "strategy": s.describe(), "p2p_blocking": False,
            "warmup": 0, "iterations": 1}  # fmt: skip
    return r.timeline.expand(), plan


def write_trace(path: Path, plan: dict, frames: list[pd.DataFrame], device: str | None = None) -> Path:
    provenance = {"device": device} if device else {}
    write_json(path, Trace(plan, provenance, [f[list(COLUMNS)].reset_index(drop=True) for f in frames]).to_dict())
    return path


def test_a_perfect_measurement_has_no_error() -> None:
    tl, _ = predicted()
    c = compare(tl, tl)
    assert c.batch_error == 0 and set(c.per_gpu.values()) == {0.0} and c.unmatched == 0
    assert c.matched == len(block_spans(tl.df)) > 0


def test_shifted_gpu_reports_the_shift_relative_to_iteration_time() -> None:
    tl, _ = predicted()
    df = tl.df.copy()
    t = tl.iteration_time_s
    delta = 0.01 * t
    late = df["gpu"] == 1
    df.loc[late, ["start_s", "end_s"]] += delta  # every event of GPU 1 happens delta later
    c = compare(tl, Timeline(df, tl.gpus_per_node))
    t_measured = max(t, df["end_s"].max())
    assert c.per_gpu[0] == pytest.approx(0.0)
    assert c.per_gpu[1] == pytest.approx(delta / t_measured)
    assert c.batch_error == pytest.approx(abs(t - t_measured) / t_measured)


def test_stretched_trace_reports_known_errors_through_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tl, plan = predicted()
    slow = tl.df.copy()
    slow[["start_s", "end_s"]] *= 1.10  # everything 10 % slower
    path = write_trace(tmp_path / "slow.json", plan, [slow])
    code, out, err = run(["validate", "--trace", str(path), "--json"], capsys)
    assert code == 0, err
    got = json.loads(out)
    assert got["batch_error"] == pytest.approx(0.1 / 1.1)
    spans = block_spans(tl.df)
    t = 1.1 * tl.iteration_time_s
    for gpu, rows in spans.groupby("gpu"):
        expected = ((0.1 * rows["start_s"] + 0.1 * rows["end_s"]) / 2 / t).mean()
        assert got["per_gpu_error"][str(gpu)] == pytest.approx(expected)
    plot = tmp_path / "cmp.png"
    code, _, err = run(["validate", "--trace", str(path), "--plot", str(plot)], capsys)
    assert code == 0 and plot.read_bytes()[:4] == b"\x89PNG"


def test_a_measurement_that_spreads_more_than_its_error_is_too_noisy_to_judge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tl, plan = predicted()
    frames = []
    for factor in (1.00, 1.02, 1.30):  # median 2 % slow: a 2 % error inside a 28 % spread
        df = tl.df.copy()
        df[["start_s", "end_s"]] *= factor
        frames.append(df)
    path = write_trace(tmp_path / "noisy.json", plan, frames)
    code, out, err = run(["validate", "--trace", str(path), "--json"], capsys)
    assert code == 0, err
    got = json.loads(out)
    assert got["measured_spread"] == pytest.approx(0.30 / 1.02)
    assert got["batch_error"] == pytest.approx(0.02 / 1.02) and got["too_noisy"] is True
    code, out, err = run(["validate", "--trace", str(path)], capsys)
    assert code == 0 and "too noisy to judge" in out + err
    # a steady run with the same error is judged
    steady = write_trace(tmp_path / "steady.json", plan, [frames[1]] * 3)
    code, out, err = run(["validate", "--trace", str(steady), "--json"], capsys)
    assert json.loads(out)["too_noisy"] is False


def test_mismatched_trace_and_profile_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tl, plan = predicted()
    other_device = write_trace(tmp_path / "gpu.json", plan, [tl.df], device="NVIDIA H100")
    code, _, err = run(["validate", "--trace", str(other_device), "--profile", "profiles/cpu-gloo.json"], capsys)
    assert code == 2 and "was measured on 'NVIDIA H100'" in err and len(err.strip().splitlines()) == 1
    unknown = write_trace(tmp_path / "u.json", {**plan, "model": "gpt2-cpu:hidden=256,heads=4"}, [tl.df])
    code, _, err = run(["validate", "--trace", str(unknown), "--profile", "profiles/cpu-gloo.json"], capsys)
    assert code == 2 and "does not cover the plan" in err and len(err.strip().splitlines()) == 1
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "distsim-trace", "version": 1, "plan": {"model": "x"}}')
    code, _, err = run(["validate", "--trace", str(bad)], capsys)
    assert code == 2 and "the plan must give" in err


def test_a_profile_of_another_device_is_refused_with_the_commands_that_fix_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's loop on another machine: the error names the command that profiles the trace's plan there (as
    the trace was launched) and the validate command to rerun."""
    trace_data = json.loads(Path("traces/gpt2-cpu-2x1-1M2P1D-1f1b-M4.json").read_text())
    trace = tmp_path / "mine.json"
    trace.write_text(json.dumps(trace_data))
    profile_data = json.loads(Path("profiles/validation/gpt2-cpu-2x1.json").read_text())
    profile_data["provenance"]["device"] = "Another CPU"
    profile = tmp_path / "other.json"
    profile.write_text(json.dumps(profile_data))
    code, _, err = run(["validate", "--trace", str(trace), "--profile", str(profile)], capsys)
    assert code == 2 and err.startswith("distsim: error: ") and "Traceback" not in err, err
    device = trace_data["provenance"]["device"]
    assert f"was measured on '{device}'" in err and f"{profile} on 'Another CPU'" in err
    profile_cmd, validate_cmd = (shlex.split(c) for c in err.split("`")[1:4:2])
    plan = trace_data["plan"]
    out = profile_cmd[profile_cmd.index("--out") + 1]
    assert profile_cmd[:2] == ["distsim", "profile"] and out.endswith(".json")
    expected = {"--model": "gpt2-cpu", "--cluster": "cpu-2x1", "--strategy": plan["strategy"], "--emulate-nodes": "2",
                "--procs-per-node": "1", "--link-bandwidth": "1gbit"}  # fmt: skip
    for flag, value in expected.items():
        assert profile_cmd[profile_cmd.index(flag) + 1] == value, (flag, profile_cmd)
    assert validate_cmd == ["distsim", "validate", "--trace", str(trace), "--profile", out]
    code, _, err = run([*profile_cmd[1:], "--dry-run"], capsys)  # the command is one distsim accepts
    assert code == 0 and "distinct" in err, err


def test_the_profile_command_without_emulation_runs_under_torchrun() -> None:
    from distsim.cli.common import profile_command, profile_out_name

    assert profile_out_name("/home/me/my model.json", "cpu-2x1") == "profile-my-model-cpu-2x1.json"
    alone = profile_command("gpt2-cpu", "cpu-1x2", Strategy(), "p.json")
    assert alone == "distsim profile --model gpt2-cpu --cluster cpu-1x2 --strategy 1M1P1D --out p.json"
    s = Strategy(tp=8, pp=2, num_micro_batches=4, schedule="gpipe")
    nodes = profile_command("gpt2-345m", "dgx-a100", s, "p.json", nodes=2, world=16, run_nodes=2)
    assert nodes.startswith("torchrun --nnodes 2 --nproc-per-node 8 --node-rank K --rdzv-endpoint HOST:PORT -m ")
    assert "--nodes 2 --strategy 8M2P1D --schedule gpipe --micro-batches 4 --out p.json" in nodes
    wfbp = profile_command("gpt2-cpu", "cpu-1x2", Strategy(dp=2, grad_sync="wfbp"), "p.json")
    assert "--strategy 'tp=1 pp=1 dp=2 mbs=1 mb=1 schedule=1f1b sync=wfbp' --out" in wfbp  # no option says wfbp


@pytest.mark.slow
def test_shipped_traces_validate(capsys: pytest.CaptureFixture[str]) -> None:
    traces = [p for p in Path("traces").glob("*.json") if not p.name.endswith(".chrome.json")]
    if not traces:
        pytest.skip("no shipped traces")
    # each trace with the profile it was planned with (profiles/validation/), mean durations only: the suite's
    # stochastic runs are what README's table reports, this checks that every shipped trace still validates
    code, out, err = run(["validate", "--suite", "traces", "--samples", "0", "--json"], capsys)
    assert code == 0, err
    result = json.loads(out)
    assert result["summary"]["traces"] == len(traces)
    assert all(r["measured_ms"] > 0 and r["predicted_ms"] > 0 for r in result["rows"])


def test_a_traces_recorded_profile_is_named_from_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`validate --suite` names the profiles that recorded load warnings so that `distsim profile show` opens them
    from where the user is, not relative to the traces' directory."""
    from distsim.cli.validate import planned_profile

    repo = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(tmp_path)
    path = planned_profile(str(repo / "traces" / "t.json"), "../profiles/cpu-gloo.json")
    assert not Path(path).is_absolute() and Path(path).resolve() == repo / "profiles" / "cpu-gloo.json"


def test_the_default_suite_outside_the_repository_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    code, out, err = run(["validate", "--suite"], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "traces: no such directory (the shipped traces are the repository's traces/" in err

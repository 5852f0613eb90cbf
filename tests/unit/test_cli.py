"""The command line: summary, JSON, exports, and one-line errors with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from distsim.core.cluster import Cluster
from distsim.core.models import Model
from tests.util import run_cli as run

SIM = [
    "simulate",
    "--model",
    "gpt2-345m",
    "--cluster",
    "distsim-testbed",
    "--strategy",
    "2M4P2D",
    "--micro-batches",
    "8",
    "--schedule",
    "1f1b",
]


def test_summary(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(SIM, capsys)
    assert code == 0, err
    for needle in ("iteration time", "throughput", "bubble fraction", "peak memory", "fits", "unique", "analytic"):
        assert needle in out


def test_json_has_the_documented_keys(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run([*SIM, "--json"], capsys)
    data = json.loads(out)
    for key in (
        "iteration_time_s",
        "throughput_samples_per_s",
        "bubble_fraction",
        "peak_memory_bytes",
        "fits_in_memory",
        "events_total",
        "events_unique",
        "per_gpu",
    ):
        assert key in data
    assert code == 0 and len(data["per_gpu"]) == 16
    assert set(data["per_gpu"][0]) >= {"gpu", "busy_compute_s", "comm_s", "idle_s"}
    assert data["events_unique"] < data["events_total"]


def test_exports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace, plot, csv = tmp_path / "t.json", tmp_path / "t.png", tmp_path / "t.csv"
    code, _, err = run([*SIM, "--trace", str(trace), "--plot", str(plot), "--csv", str(csv), "--all-gpus"], capsys)
    assert code == 0, err
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert len(names) == 16 and "GPU 0 (node 0)" in names
    assert {e["args"]["name"] for e in events if e.get("name") == "thread_name"} >= {"compute", "tp", "p2p", "dp"}
    assert all(e["dur"] >= 0 for e in events if e["ph"] == "X")
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    header = csv.read_text().splitlines()[0].split(",")
    assert header == ["gpu", "node", "stream", "kind", "name", "layer", "stage", "microbatch", "start_s", "end_s",
                      "key", "bytes", "peer", "group"]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["simulate", "--model", "gpt5", "--cluster", "dgx-a100", "--strategy", "8M"], "unknown model 'gpt5'"),
        (["simulate", "--model", "gpt2-345m", "--cluster", "dgx-z", "--strategy", "8M"], "unknown cluster 'dgx-z'"),
        (
            ["simulate", "--model", "gpt2-345m", "--cluster", "dgx-a100", "--strategy", "8Q"],
            "cannot read strategy '8Q'",
        ),
        (
            ["simulate", "--model", "gpt2-345m", "--cluster", "distsim-testbed", "--strategy", "3M1P1D"],
            "uses tp*pp*dp = 3*1*1 = 3 GPUs but cluster distsim-testbed has 16",
        ),
        (
            [
                "simulate",
                "--model",
                "gpt2-345m",
                "--cluster",
                "distsim-testbed",
                "--strategy",
                "1M4P4D",
                "--schedule",
                "interleaved",
                "--micro-batches",
                "6",
            ],
            "too few micro-batches",
        ),
        (
            [
                "simulate",
                "--model",
                "gpt2-345m",
                "--cluster",
                "distsim-testbed",
                "--strategy",
                "1M1P16D",
                "--profile",
                "missing.json",
            ],
            "missing.json: no such file",
        ),
        (["simulate", "--model", "gpt2-345m", "--strategy", "1M1P1D"], "give --model and --cluster"),
        (["simulate", "--model", "gpt2-345m", "--cluster", "distsim-testbed"], "give --strategy"),
        (["simulate", "--bogus"], "No such option '--bogus'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(args, capsys)
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert out == ""


def test_malformed_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m.yaml"
    model.write_text("name: x\nlayers: [ {name: a, forward_s: 1}\n")
    code, _, err = run(["simulate", "--model", str(model), "--cluster", "dapple-b", "--strategy", "1M1P16D"], capsys)
    assert code == 2 and "malformed YAML" in err and len(err.strip().splitlines()) == 1
    profile = tmp_path / "p.json"
    profile.write_text('{"schema": "distsim-profile", "version": 1, "compute": {"k": {}}}')
    code, _, err = run([*SIM, "--profile", str(profile)], capsys)
    assert code == 2 and "malformed entry" in err
    profile.write_text("{not json")
    code, _, err = run([*SIM, "--profile", str(profile)], capsys)
    assert code == 2 and "malformed JSON at line 1" in err
    code, _, err = run([*SIM, "--trace", str(tmp_path / "no" / "dir" / "t.json")], capsys)
    assert code == 2 and "does not exist" in err


def test_user_model_file_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "what-if.yaml"
    model.write_text("name: what-if\nlayers:\n  - {name: block, forward_s: 0.01, backward_s: 0.02, repeat: 8}\n")
    code, out, _ = run(
        [
            "simulate",
            "--model",
            str(model),
            "--cluster",
            "dapple-b",
            "--nodes",
            "4",
            "--strategy",
            "1M4P1D",
            "--micro-batches",
            "4",
            "--json",
        ],
        capsys,
    )
    # (M + S - 1)(F + B) of compute plus the 20 us latency of each pipeline send on the critical path
    assert code == 0 and json.loads(out)["iteration_time_s"] == pytest.approx((4 + 3) * 0.06, abs=20 * 20e-6)


def test_listings_and_schedule(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["models"], capsys)
    assert code == 0 and "gpt3-175b" in out and "inception-v3" in out
    code, out, _ = run(["clusters"], capsys)
    assert code == 0 and "dapple-a" in out and "source:" in out
    code, out, _ = run(["schedule", "--pp", "2", "--micro-batches", "2", "--schedule", "gpipe"], capsys)
    assert code == 0 and "rank 0: 0F0 0F1 0B0 0B1" in out


def test_module_entry_point_and_torch_free_core() -> None:
    """`python -m distsim` works (torchrun launches it so) and the simulator never imports torch."""
    code = "import sys, distsim.cli, distsim.plans.simulate; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
    out = subprocess.run([sys.executable, "-m", "distsim", "--help"], check=True, capture_output=True, text=True)
    assert "simulate" in out.stdout


def test_cluster_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "mine.yaml"
    cluster.write_text("base: dgx-a100\nname: mine\nnodes: 2\ninter: {bandwidth_bytes_per_s: 1.0e9}\n")
    code, out, err = run(
        ["simulate", "--model", "gpt2-345m", "--cluster", str(cluster), "--strategy", "1M1P16D", "--json"], capsys
    )
    assert code == 0, err
    slow = json.loads(out)
    code, out, _ = run(
        [
            "simulate",
            "--model",
            "gpt2-345m",
            "--cluster",
            "dgx-a100",
            "--nodes",
            "2",
            "--strategy",
            "1M1P16D",
            "--json",
        ],
        capsys,
    )
    assert slow["cluster"] == "mine" and slow["iteration_time_s"] > json.loads(out)["iteration_time_s"]
    cluster.write_text("base: dgx-a100\nnodes: two\n")
    code, _, err = run(["simulate", "--model", "gpt2-345m", "--cluster", str(cluster), "--strategy", "1M1P16D"], capsys)
    assert code == 2 and "nodes must be a positive integer, got 'two'" in err


def test_profile_file_is_used_and_strict_refuses_gaps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], gpt2: Model, testbed: Cluster
) -> None:
    """A profile holding half of the compute events: they are 'measured', the rest estimated and listed."""
    from distsim import Strategy, simulate

    strategy = Strategy.from_str("2M4P2D", num_micro_batches=8)
    r = simulate(gpt2, testbed, strategy)
    table = r.cost_table()
    compute = table[table["kind"] == "compute"]
    kept = compute.iloc[: len(compute) // 2]
    profile = {
        "schema": "distsim-profile",
        "version": 1,
        "provenance": {"device": "test"},
        "compute": {k: {"median_s": 0.001} for k in kept["event"]},
        "comm": [],
        "fits": [
            {"collective": c, "scope": s, "group_size": n, "alpha_s": 1e-5, "beta_s_per_byte": 1e-10}
            for c in ("all_reduce", "p2p")
            for s in ("intra", "inter")
            for n in (2, 4)
        ],
    }
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    code, out, err = run([*SIM, "--profile", str(path), "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["event_sources"]["measured"] == len(kept)
    assert data["event_sources"].get("fitted", 0) > 0
    estimated = set(data["estimated_events"])
    assert {k for k in estimated if not k.startswith("optimizer")} == set(compute["event"]) - set(kept["event"])
    assert any(k.startswith("optimizer") for k in estimated)  # the partition (so the shard) follows the costs
    code, out, _ = run([*SIM, "--profile", str(path)], capsys)
    assert code == 0 and f"profile: {path} (device test)" in out and "were not in the profile" in out
    code, _, err = run([*SIM, "--profile", str(path), "--strict"], capsys)
    assert code == 2 and "profile has no measurement for compute event" in err and "--strict" in err


def test_execute_refuses_a_plan_the_simulator_says_does_not_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    small = tmp_path / "small.yaml"
    small.write_text("base: cpu-1x2\ngpu: {memory_bytes: 1.0e6}\n")
    args = ["execute", "--model", "gpt2-cpu", "--cluster", str(small), "--strategy", "1M2P1D", "--micro-batches", "2",
            "--out", str(tmp_path / "t.json")]  # fmt: skip
    code, _, err = run(args, capsys)
    assert code == 2 and "1M2P1D does not fit in memory: pipeline rank 0 needs" in err and "--force" in err
    assert list(tmp_path.iterdir()) == [small]

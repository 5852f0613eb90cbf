"""The profiler end to end, with real processes: gloo ranks on this machine, emulated nodes, real failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from distsim.infra.launch import netns_problem
from tests.util import run_cli

pytestmark = pytest.mark.slow  # real multi-process runs

TINY = "gpt2-345m:seq=32,layers=2,hidden=64,heads=4,vocab=256,precision=fp32"
FAST = ["--repeats", "2", "--warmup", "1", "--comm-repeats", "2", "--max-comm-bytes", "64KiB"]


def distsim(*args: str, env: dict[str, str] | None = None, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "distsim", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})  # fmt: skip


def test_two_gloo_ranks_profile_a_model_that_simulate_then_uses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tiny.json"
    run = distsim("profile", "--model", TINY, "--cluster", "cpu-1x2", "--strategy", "1M2P1D", "--strategy", "1M1P2D",
                  "--strategy", "2M1P1D", "--micro-batches", "2", "--emulate-nodes", "1", "--procs-per-node", "2",
                  "--out", str(out), *FAST)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "3 strategies of" in run.stderr and "profiling cost:" in run.stderr
    db = json.loads(out.read_text())
    assert db["provenance"]["backend"] == "gloo" and db["provenance"]["procs_per_node"] == 2
    ops = {k.split("[")[0].split("/")[0] for k in db["compute"]}
    assert {"attention", "mlp", "embedding", "lm_head", "optimizer"} <= ops
    assert any(k.endswith("/tp=2/fp32") for k in db["compute"])  # tensor-parallel shards were measured
    groups = {(f["collective"], f["scope"], f["group_size"]) for f in db["fits"]}
    assert {("all_reduce", "intra", 2), ("p2p", "intra", 2)} <= groups
    # every rank timed the reference workload before and after, and read the machine's load at the start
    load = db["provenance"]["load"]
    assert load == db["provenance"]["runs"][0]["load"] and "matmuls" in load["workload"]
    assert [r["rank"] for r in load["ranks"]] == [0, 1] and isinstance(load["warnings"], list)
    for r in load["ranks"]:
        assert r["reference_start_s"] > 0 and r["reference_end_s"] > 0 and r["cores"] >= 1 and "busy_cores" in r
        assert r["loadavg_1m"] >= 0 and r["cpu_threads"] == 1
    # the self-check timed every measured block in situ (both ranks' shares of the chains); CPU has no launch time
    check = db["provenance"]["self_check"]
    assert check == db["provenance"]["runs"][0]["self_check"] and check["stage_ratio"] > 0 and check["chains"]
    blocks = {k: m for k, m in db["compute"].items() if not k.startswith("optimizer/")}
    assert check["events"] == len(blocks) and all(m["insitu_ratio"] > 0 for m in blocks.values())
    assert not any("launch_s" in m for m in db["compute"].values())
    host = db["host"]  # rank 0 timed its host per eager operator; CPU: no launch times, so no figure per kernel
    assert 0 < host["forward_op_s"] < 1 and 0 < host["backward_op_s"] < 1 and "per_kernel_s" not in host
    assert host["method"].startswith("eager nn.Module chain") and db["provenance"]["runs"][0]["host_speed"] == host
    for strategy in ("1M2P1D", "1M1P2D", "2M1P1D"):  # in this process: the profile is what is tested here
        code, sim_out, sim_err = run_cli(["simulate", "--model", TINY, "--cluster", "cpu-1x2", "--strategy", strategy,
                                          "--micro-batches", "2", "--profile", str(out), "--strict", "--json"],
                                         capsys)  # fmt: skip
        assert code == 0, sim_err
        result = json.loads(sim_out)
        assert "analytic" not in result["event_sources"] and result["event_sources"].get("measured", 0) > 0
    code, show, _ = run_cli(["profile", "show", str(out)], capsys)
    assert code == 0 and "all_reduce" in show and "gloo" in show
    assert "reference workload" in show and "rank 1 on " in show and "load average" in show
    assert "self-check, isolated / in-situ time: stage chains" in show and "1M2P1D mbs=1 stage 1" in show
    assert "host: " in show and " us per forward op, " in show and "(eager nn.Module chain, cpu, 1 thread)" in show

    # profiling more extends the profile: new events are added, the run is recorded
    single = distsim("profile", "--model", TINY, "--cluster", "cpu-1x2", "--strategy", "1M2P1D", "--micro-batch-size",
                     "2", "--micro-batches", "2", "--no-comm", "--out", str(out), *FAST)  # fmt: skip
    assert single.returncode == 2 and "threads per rank 1" in single.stderr  # 2 threads alone: not comparable
    more = distsim("profile", "--model", TINY, "--cluster", "cpu-1x2", "--strategy", "1M2P1D", "--emulate-nodes", "1",
                   "--procs-per-node", "2", "--micro-batch-size", "2", "--micro-batches", "2", "--no-comm",
                   "--out", str(out), *FAST)  # fmt: skip
    assert more.returncode == 0, more.stderr
    extended = json.loads(out.read_text())
    assert set(db["compute"]) < set(extended["compute"]) and len(extended["provenance"]["runs"]) == 2
    first, second = extended["provenance"]["runs"]
    assert first["load"] == load and len(second["load"]["ranks"]) == 2  # each run keeps its own readings
    assert any("/mbs=2/" in k for k in extended["compute"])
    assert second["self_check"]["events"] > 0 and extended["provenance"]["self_check"] == second["self_check"]
    assert extended["host"] == second["host_speed"] and first["host_speed"] == host  # the latest reading, and each


@pytest.mark.skipif(netns_problem() is not None, reason=f"network namespaces unavailable: {netns_problem()}")
def test_a_shaped_two_node_run_measures_both_scopes_and_removes_its_namespaces(tmp_path: Path) -> None:
    """The whole emulated-nodes path. How fast the shaped link is, is checked in test_launch.py by a bound that load
    cannot break; here: the run measures intra- and inter-node groups, records the link, and cleans up its own
    namespaces (named after its pid; other launches on the machine may hold theirs)."""
    out = tmp_path / "shaped.json"
    args = ["profile", "--model", TINY, "--cluster", "cpu-2x1", "--nodes", "2", "--strategy", "1M1P2D",
            "--emulate-nodes", "2", "--procs-per-node", "2", "--link-bandwidth", "400mbit", "--no-compute",
            "--out", str(out), *FAST]  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "distsim", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "DISTSIM_TEST": "1"})  # fmt: skip
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err
    assert "4 ranks on 2 cores" in err or (os.cpu_count() or 1) >= 4  # warned: the ranks share cores
    db = json.loads(out.read_text())
    assert db["provenance"]["emulation"]["link_bandwidth"] == "400mbit" and db["provenance"]["nodes"] == 2
    measured = {(m["collective"], m["scope"], m["group_size"]) for m in db["comm"] if m["median_s"] > 0}
    assert {(c, scope, 2) for c in ("all_reduce", "p2p") for scope in ("intra", "inter")} <= measured
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"distsim-{proc.pid}-" not in listed


@pytest.mark.parametrize(
    ("mode", "timeout", "expect"),
    # a rank that dies is reported whenever it dies (the timeout is far away); a hang always runs into the timeout,
    # whether the rank reached its hang point or was still starting: both outcomes do not depend on load
    [("die", "600", "rank 1 exited with status 17"), ("hang", "3", "did not finish within 3 s")],
)
def test_a_failing_rank_ends_the_run_with_one_error_and_no_profile(
    tmp_path: Path, mode: str, timeout: str, expect: str
) -> None:
    out = tmp_path / "never.json"
    run = distsim("profile", "--model", TINY, "--cluster", "cpu-1x2", "--strategy", "1M1P2D", "--emulate-nodes", "1",
                  "--procs-per-node", "2", "--out", str(out), "--timeout", timeout, *FAST,
                  env={"DISTSIM_FAULT": f"rank=1,at=compute,mode={mode}"})  # fmt: skip
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("distsim: error: profiling") and expect in last
    assert not out.exists()


def test_bad_arguments_exit_2_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    cases = [
        (["--model", "gpt9", "--cluster", "cpu-1x2", "--strategy", "1M1P2D"], "unknown model 'gpt9'"),
        (["--model", TINY, "--cluster", "cpu-1x2", "--strategy", "1M1P2D", "--out", str(bad)], "malformed JSON"),
        (
            ["--model", TINY, "--cluster", "cpu-1x2", "--strategy", "1M1P2D", "--out", "/nonexistent/dir/p.json"],
            "directory /nonexistent/dir does not exist",
        ),
        (["--model", TINY, "--cluster", "cpu-1x2", "--strategy", "1M1P4D"], "uses tp*pp*dp = 1*1*4 = 4 GPUs"),
        (["--model", TINY, "--cluster", "cpu-1x2"], "give the strategies to profile"),
        (
            [
                "--model",
                TINY,
                "--cluster",
                "cpu-1x2",
                "--strategy",
                "1M1P2D",
                "--emulate-nodes",
                "3",
                "--link-bandwidth",
                "1gbit",
            ],
            "joins exactly two emulated nodes",
        ),
    ]
    for args, message in cases:
        run = distsim("profile", *args)
        assert run.returncode == 2, (args, run.stderr)
        last = run.stderr.strip().splitlines()[-1]
        assert message in last and "Traceback" not in run.stderr, (args, run.stderr)

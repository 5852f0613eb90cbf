"""The executor trains the real model: two gloo ranks reproduce a single-process reference; failures end cleanly."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from distsim import Strategy, get_cluster  # noqa: E402
from distsim.core.models import get_model  # noqa: E402
from distsim.executor.reference import reference_step  # noqa: E402

pytestmark = pytest.mark.slow  # real multi-process runs

TINY = "gpt2-345m:seq=16,layers=2,hidden=32,heads=4,vocab=64,precision=fp32"
T5 = "t5-base:layers=1,seq=12,dec_seq=8,hidden=32,heads=4,ffn=64,vocab=64,precision=fp32"


def distsim(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "distsim", *args], capture_output=True, text=True, timeout=900,
                          env={**os.environ, **(env or {})})  # fmt: skip


@pytest.mark.parametrize(
    ("model", "strategy", "extra"),
    [
        (TINY, "1M1P2D", ["--grad-sync", "bulk"]),
        (TINY, "1M1P2D", ["--grad-sync", "wfbp"]),
        (TINY, "1M2P1D", ["--schedule", "1f1b"]),  # the tied LM head sits on the other stage
        (T5, "1M2P1D", ["--schedule", "gpipe"]),  # the encoder output crosses the cut with the decoder state
    ],
)
def test_two_ranks_reproduce_the_single_process_reference(tmp_path: Path, model: str, strategy: str,
                                                          extra: list[str]) -> None:  # fmt: skip
    """(2M runs in tests/integration/test_executor_scale.py, its first layer recomputed and its second not.)"""
    check, out = tmp_path / "check.pt", tmp_path / "trace.json"
    run = distsim("execute", "--model", model, "--cluster", "cpu-1x2", "--strategy", strategy, "--micro-batches", "2",
                  "--micro-batch-size", "2", *extra, "--emulate-nodes", "1", "--procs-per-node", "2",
                  "--iterations", "1", "--warmup", "0", "--check", str(check), "--out", str(out))  # fmt: skip
    assert run.returncode == 0, run.stderr
    got = torch.load(check)
    plan = json.loads(out.read_text())["plan"]
    want = reference_step(get_model(model), get_cluster("cpu-1x2"), Strategy.from_str(plan["strategy"]))
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
    assert set(got["grads"]) == set(want["grads"])
    for name, g in want["grads"].items():
        torch.testing.assert_close(got["grads"][name], g, rtol=1e-4, atol=1e-6, msg=name)


SMALL_GPT = "gpt2-345m:seq=32,layers=4,hidden=128,heads=4,vocab=1024,precision=fp32"
"""About 3.7 MB of fp32 gradients: DDP buckets of 0.5 MiB make several."""


@pytest.mark.parametrize(
    ("strategy", "extra", "buckets"),
    [
        ("1M1P2D", ["--grad-sync", "ddp", "--bucket-cap-mb", "0.5"], 7),  # the cap applies to the first bucket too
        ("tp=1 pp=1 dp=2 sync=mgwfbp groups=0-2/2-5/5-6", [], 3),
        ("1M1P2D", ["--grad-sync", "mgwfbp"], None),  # execute plans the merge from the (analytic) costs
    ],
)
def test_bucketed_gradient_sync_reproduces_the_reference_with_the_simulators_buckets(
    tmp_path: Path, strategy: str, extra: list[str], buckets: int | None
) -> None:
    """Two data-parallel ranks under DDP's buckets and MG-WFBP merge plans train as one process does, and each rank's
    gradient all-reduces are the simulator's: the same names, in the same order (so the same count)."""
    from distsim import simulate

    check, out = tmp_path / "check.pt", tmp_path / "trace.json"
    run = distsim("execute", "--model", SMALL_GPT, "--cluster", "cpu-1x2", "--strategy", strategy, "--micro-batches",
                  "2", "--micro-batch-size", "2", *extra, "--emulate-nodes", "1", "--procs-per-node", "2",
                  "--iterations", "1", "--warmup", "0", "--check", str(check), "--out", str(out))  # fmt: skip
    assert run.returncode == 0, run.stderr
    trace = json.loads(out.read_text())
    planned = Strategy.from_str(trace["plan"]["strategy"])
    assert planned.grad_sync in ("ddp", "mgwfbp") and (planned.grad_sync == "ddp") != bool(planned.grad_groups)
    model, cluster = get_model(SMALL_GPT), get_cluster("cpu-1x2")
    got = torch.load(check)
    want = reference_step(model, cluster, planned)
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
    assert set(got["grads"]) == set(want["grads"])
    for name, g in want["grads"].items():
        torch.testing.assert_close(got["grads"][name], g, rtol=1e-4, atol=1e-6, msg=name)
    sim = simulate(model, cluster, planned).timeline.df
    expected = list(sim[(sim["gpu"] == 0) & (sim["kind"] == "dp_allreduce")].sort_values("start_s")["name"])
    assert buckets is None or len(expected) == buckets
    cols = trace["iterations"][0]["columns"]
    for gpu in (0, 1):
        rows = sorted((s, n) for g, st, k, n, s in zip(cols["gpu"], cols["stream"], cols["kind"], cols["name"],
                      cols["start_s"], strict=True) if g == gpu and k == "dp_allreduce" and st == "dp")  # fmt: skip
        assert [n for _, n in rows] == expected


def test_trace_has_the_timeline_schema_and_every_event(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    run = distsim("execute", "--model", TINY, "--cluster", "cpu-1x2", "--strategy", "1M2P1D", "--micro-batches", "4",
                  "--schedule", "gpipe", "--emulate-nodes", "1", "--procs-per-node", "2", "--iterations", "2",
                  "--warmup", "1", "--out", str(out))  # fmt: skip
    assert run.returncode == 0, run.stderr
    trace = json.loads(out.read_text())
    assert trace["schema"] == "distsim-trace" and len(trace["iterations"]) == 2
    cols = trace["iterations"][0]["columns"]
    assert list(cols) == ["gpu", "node", "stream", "kind", "name", "layer", "stage", "microbatch", "start_s", "end_s",
                          "key", "bytes", "peer", "group"]  # fmt: skip
    kinds = set(cols["kind"])
    assert {"forward", "backward", "p2p", "optimizer", "dp_allreduce"} <= kinds  # dp: the tied embedding copies
    forwards = [(g, n, m) for g, k, n, m in zip(cols["gpu"], cols["kind"], cols["name"], cols["microbatch"],
                                                strict=True) if k == "forward"]  # fmt: skip
    assert len(forwards) == len(set(forwards)) == 4 * 6  # 4 micro-batches x (embedding, 2 x 2 blocks, lm_head)
    assert min(cols["start_s"]) >= 0 and all(e >= s for s, e in zip(cols["start_s"], cols["end_s"], strict=True))
    assert (tmp_path / "t.chrome.json").exists()
    # CPU work is synchronous: no host stream; each rank's compute rows follow one another without overlapping
    assert "host" not in set(cols["stream"]) and trace["provenance"]["timing"]["device_clock"] == "perf_counter"
    for gpu in (0, 1):
        spans = sorted((s, e) for g, st, k, s, e in zip(cols["gpu"], cols["stream"], cols["kind"], cols["start_s"],
                       cols["end_s"], strict=True) if g == gpu and st == "compute" and k != "p2p")  # fmt: skip
        assert all(e <= s2 for (_, e), (s2, _) in itertools.pairwise(spans))
    from tests.integration.test_measured_columns import assert_columns_are_the_simulators

    assert_columns_are_the_simulators(out)  # the transfers' and the tied copies' key, bytes, peer and group


@pytest.mark.parametrize(
    ("mode", "timeout", "expect"), [("die", "600", "rank 1 exited with status 17"), ("hang", "3", "did not finish")]
)
def test_a_rank_failing_mid_run_ends_every_rank_and_writes_no_trace(
    tmp_path: Path, mode: str, timeout: str, expect: str
) -> None:
    out = tmp_path / "t.json"
    run = distsim("execute", "--model", TINY, "--cluster", "cpu-1x2", "--strategy", "1M1P2D", "--micro-batches", "2",
                  "--emulate-nodes", "1", "--procs-per-node", "2", "--iterations", "3", "--warmup", "1",
                  "--timeout", timeout, "--out", str(out),
                  env={"DISTSIM_FAULT": f"rank=1,at=2,mode={mode}"})  # fmt: skip
    assert run.returncode == 1
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("distsim: error: execution") and expect in last
    assert not out.exists() and not (tmp_path / "t.chrome.json").exists()


def test_device_warning_names_both_devices_and_the_fix() -> None:
    from distsim.cli.execute import device_warning

    message = device_warning("intel.json", "Intel(R) Xeon(R) Processor", "AMD EPYC", "distsim profile --out m.json",
                             "m.json")  # fmt: skip
    assert message is not None
    assert "intel.json was measured on 'Intel(R) Xeon(R) Processor', this machine is 'AMD EPYC'" in message
    assert "`distsim profile --out m.json`" in message and "--profile m.json" in message
    assert device_warning("p.json", "AMD EPYC", "AMD EPYC", "c", "m.json") is None
    assert device_warning("p.json", None, "AMD EPYC", "c", "m.json") is None  # no provenance: nothing to compare


def test_execute_with_a_profile_of_another_device_warns_before_running(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's loop on another machine: the warning comes before anything runs (here the run then stops at a
    launch of 4 ranks for a 2-rank plan), with a profile command distsim accepts."""
    import shlex

    from distsim.profiler.compute import local_device_name
    from tests.util import run_cli

    data = json.loads(Path("profiles/cpu-gloo.json").read_text())
    readme = ["execute", "--model", "gpt2-cpu", "--cluster", "cpu-2x1", "--strategy", "1M2P1D", "--schedule", "1f1b",
              "--micro-batches", "8", "--emulate-nodes", "2", "--procs-per-node", "2", "--link-bandwidth", "1gbit",
              "--out", str(tmp_path / "mine.json")]  # fmt: skip
    for device in (local_device_name(), "Another CPU"):
        data["provenance"]["device"] = device
        profile = tmp_path / "p.json"
        profile.write_text(json.dumps(data))
        code, _, err = run_cli([*readme, "--profile", str(profile)], capsys)
        lines = err.strip().splitlines()
        assert code == 2 and lines[-1].startswith("distsim: error:") and "this launch starts 4" in lines[-1], err
        assert ("warning:" in err) == (device == "Another CPU"), err
    assert lines[0].startswith(f"warning: {profile} was measured on 'Another CPU', this machine is ")
    command = shlex.split(lines[0].split("`")[3])
    assert command[:2] == ["distsim", "profile"] and command[command.index("--strategy") + 1] == "1M2P1D"
    assert " ".join(command[command.index("--emulate-nodes") :]).startswith(
        "--emulate-nodes 2 --procs-per-node 2 --link-bandwidth 1gbit --out "
    )
    code, _, err = run_cli([*command[1:], "--dry-run"], capsys)
    assert code == 0, err


def test_execute_runs_the_merge_plan_search_merge_writes(tmp_path: Path) -> None:
    """`distsim search merge` writes a uniform plan with its layer groups; `distsim execute --plan` runs exactly it."""
    plan_file, out = tmp_path / "merge.plan.yaml", tmp_path / "trace.json"
    made = distsim("search", "merge", "--model", SMALL_GPT, "--cluster", "cpu-1x2", "--strategy", "1M1P2D",
                   "--micro-batches", "2", "--micro-batch-size", "2", "--out", str(plan_file))  # fmt: skip
    assert made.returncode == 0, made.stderr
    run = distsim("execute", "--plan", str(plan_file), "--emulate-nodes", "1", "--procs-per-node", "2",
                  "--iterations", "1", "--warmup", "0", "--out", str(out))  # fmt: skip
    assert run.returncode == 0, run.stderr
    from distsim.io.files import load_plan

    planned = load_plan(str(plan_file)).strategy
    ran = Strategy.from_str(json.loads(out.read_text())["plan"]["strategy"])
    assert planned is not None and planned.grad_groups and ran.grad_groups == planned.grad_groups

"""Frameworks: presets and files, the host time they charge per kernel (a launch-bound layer's time is its host
cost), CUDA graphs, and the CLI's --framework."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from distsim import Strategy, simulate
from distsim.core.errors import UnknownNameError
from distsim.core.framework import (
    DEFAULT_FRAMEWORK,
    FRAMEWORKS,
    Framework,
    FrameworkError,
    framework_from_dict,
    get_framework,
)
from distsim.sim.costs import AnalyticCosts
from tests.unit.test_burst_flow import flops_model
from tests.util import hand_cluster, run_cli

LAUNCH = 0.5e-3


def _launching_cluster(gpus: int = 1) -> object:
    """The hand cluster whose GPU launches each kernel in 0.5 ms and adds no time of its own to a kernel."""
    c = hand_cluster(1, gpus)
    return replace(c, gpu=replace(c.gpu, kernel_launch_s=LAUNCH, kernel_overhead_s=0.0))


def test_every_preset_names_its_source_and_the_default_is_one() -> None:
    assert DEFAULT_FRAMEWORK in FRAMEWORKS
    for name, fw in FRAMEWORKS.items():
        assert fw.name == name and fw.source
    assert get_framework("Megatron-Core") is FRAMEWORKS["megatron-core"]
    with pytest.raises(UnknownNameError, match="unknown framework 'megatron'; choose one of megatron-core"):
        get_framework("megatron")


def test_a_launch_bound_layer_takes_its_host_time() -> None:
    """One layer of 1e-9 s of work per sample: the device idles, the host sets the pace. Forward: one kernel, its
    launch 0.5 ms + the framework's 1 ms = 1.5 ms; backward: two kernels of 0.5 + 2 ms = 5 ms; 6.5 ms in all (the
    work itself, a few nanoseconds, waits behind its launch)."""
    model = flops_model([(1e-9, 0, 0.0)])
    cluster = _launching_cluster()
    fw = Framework("slow-host", host_op_s=1e-3, host_backward_op_s=2e-3)
    r = simulate(model, cluster, Strategy(), AnalyticCosts(cluster, framework=fw))
    assert r.iteration_time_s == pytest.approx(6.5e-3, rel=1e-5)
    ideal = simulate(model, cluster, Strategy(), AnalyticCosts(cluster, framework=get_framework("ideal")))
    assert ideal.iteration_time_s == pytest.approx(3 * LAUNCH, rel=1e-5)  # the launches alone
    graphs = simulate(model, cluster, Strategy(), AnalyticCosts(cluster, framework=get_framework("torch-compile")))
    assert graphs.iteration_time_s < 1e-6  # CUDA graphs: no host time per kernel


def test_no_host_time_on_a_device_that_runs_its_own_work() -> None:
    """A CPU device (launch 0) has no host stream to pace it: the framework adds nothing there."""
    model = flops_model([(1e-3, 0, 0.0)] * 2)
    cluster = hand_cluster(1, 1)
    heavy = Framework("heavy", host_op_s=0.5, host_backward_op_s=0.5)
    t = {fw.name: simulate(model, cluster, Strategy(), AnalyticCosts(cluster, framework=fw)).iteration_time_s
         for fw in (heavy, get_framework("ideal"))}  # fmt: skip
    assert t["heavy"] == t["ideal"]


@settings(max_examples=25, deadline=None)
@given(st.floats(0.0, 2e-4), st.floats(0.0, 2e-4), st.floats(1.0, 3.0), st.sampled_from([1, 2, 4]))
def test_a_faster_host_is_never_slower(forward: float, backward: float, factor: float, micro_batches: int) -> None:
    model = flops_model([(2e-5, 1000, 100.0)] * 3)
    cluster = _launching_cluster(2)
    strategy = Strategy(pp=2, num_micro_batches=micro_batches)
    fast = Framework("fast", host_op_s=forward, host_backward_op_s=backward)
    slow = replace(fast, name="slow", host_op_s=min(forward * factor, 0.5), host_backward_op_s=backward * factor)
    t_fast = simulate(model, cluster, strategy, AnalyticCosts(cluster, framework=fast)).iteration_time_s
    t_slow = simulate(model, cluster, strategy, AnalyticCosts(cluster, framework=slow)).iteration_time_s
    assert t_fast <= t_slow * (1 + 1e-12)


def test_a_framework_file_overrides_its_base(tmp_path: Path) -> None:
    fw = framework_from_dict({"name": "mine", "base": "megatron-lm-2021", "host_op_s": 2e-5}, "fw.yaml")
    assert (fw.name, fw.attention, fw.host_op_s) == ("mine", "fused_softmax", 2e-5)
    assert fw.host_backward_op_s == get_framework("megatron-lm-2021").host_backward_op_s
    for data, message in (
        ({"attention": "sparse"}, "attention must be one of flash, unfused, fused_softmax"),
        ({"host_op_s": -1}, "host_op_s must be seconds in"),
        ({"host_op_s": True}, "host_op_s must be seconds in"),
        ({"host_op_s": "1e-5"}, "YAML reads 1e-5 as a string; write it with a decimal point"),
        ({"cuda_graphs": "yes"}, "cuda_graphs must be true or false"),
        ({"hostop": 1}, "unknown key 'hostop'"),
        ({"base": "nope"}, "unknown framework 'nope'"),
        ([1, 2], "a framework file is a mapping"),
    ):  # fmt: skip
        with pytest.raises((FrameworkError, UnknownNameError), match=message):
            framework_from_dict(data, "fw.yaml")


SIM = ["simulate", "--model", "gpt2-345m:layers=2", "--cluster", "dgx-a100", "--nodes", "1", "--strategy", "1M1P8D",
       "--micro-batches", "2", "--json"]  # fmt: skip


def test_the_cli_takes_a_preset_or_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    times = {}
    for name in ("ideal", "megatron-core", "torch-compile"):
        code, out, err = run_cli([*SIM, "--framework", name], capsys)
        assert code == 0, err
        times[name] = json.loads(out)["iteration_time_s"]
    assert times["megatron-core"] > times["ideal"] >= times["torch-compile"]  # host time paces a small layer
    path = tmp_path / "fw.yaml"
    path.write_text("name: slow\nbase: ideal\nhost_op_s: 0.001\nhost_backward_op_s: 0.001\n")
    code, out, err = run_cli([*SIM, "--framework", str(path)], capsys)
    assert code == 0, err
    assert json.loads(out)["iteration_time_s"] > times["megatron-core"]
    code, _, err = run_cli([*SIM, "--framework", "megatorn"], capsys)
    assert code == 2 and "unknown framework 'megatorn'" in err and len(err.strip().splitlines()) == 1
    path.write_text("host_op_s: fast\n")
    code, _, err = run_cli([*SIM, "--framework", str(path)], capsys)
    assert code == 2 and f"{path}: framework" in err and "host_op_s must be seconds" in err
    code, out, _ = run_cli(["frameworks", "--json"], capsys)
    assert code == 0 and [f["name"] for f in json.loads(out)] == list(FRAMEWORKS)


def test_validate_names_a_framework_whose_kernels_the_profile_lacks(capsys: pytest.CaptureFixture[str]) -> None:
    trace = Path(__file__).resolve().parents[2] / "traces" / "gpt2-cpu-2x1-1M2P1D-1f1b-M4.json"
    code, _, err = run_cli(["validate", "--trace", str(trace), "--framework", "megatron-lm-2021", "--samples", "0"],
                           capsys)  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "--framework megatron-lm-2021 runs fused_softmax attention" in err and "leave --framework out" in err


def test_deeppools_plans_run_under_its_runtime_unless_told(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A burst plan is DeepPool's (its runtime replays CUDA graphs): simulated without --framework it is charged
    DeepPool's framework, with one the named one; a uniform strategy gets the default."""
    plan = tmp_path / "burst.plan.yaml"
    plan.write_text("kind: burst\nmodel: vgg16\ncluster: dgx-a100\nnodes: 1\nbatch: 32\ncounts: 1x3,8x10,1x8\n")
    code, out, _ = run_cli(["simulate", "--plan", str(plan)], capsys)
    assert code == 0 and "framework          deeppool:" in out
    code, out, _ = run_cli(["simulate", "--plan", str(plan), "--framework", "megatron-core"], capsys)
    assert code == 0 and "framework          megatron-core:" in out
    uniform = ["simulate", "--model", "vgg16", "--cluster", "dgx-a100", "--nodes", "1", "--strategy", "1M1P8D"]
    code, out, _ = run_cli(uniform, capsys)
    assert code == 0 and f"framework          {DEFAULT_FRAMEWORK}:" in out

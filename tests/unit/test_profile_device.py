"""A profile from one device used for another says so (a Xeon profile used to predict A100s, say)."""

from __future__ import annotations

import json

import pytest

from distsim.infra.self_check import device_mismatch
from tests.util import run_cli


@pytest.mark.parametrize(
    ("profiled", "gpu", "accelerator", "warns"),
    [
        ("NVIDIA H200", "NVIDIA H200", True, False),  # the validation's cluster file names the device
        ("NVIDIA H100 80GB HBM3", "H100-SXM5-80GB", True, False),
        ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB", True, False),
        ("NVIDIA H200", "H100-SXM5-80GB", True, True),  # another GPU model
        ("Intel(R) Xeon(R) Processor", "A100-SXM4-80GB", True, True),  # a CPU profile for GPUs
        ("NVIDIA H100 80GB HBM3", "x86 CPU core (1 thread)", False, True),  # a GPU profile for CPUs
        ("AMD EPYC", "x86 CPU core (1 thread)", False, False),
        ("", "A100-SXM4-80GB", True, False),  # no device recorded: nothing to say
    ],
)
def test_a_profile_names_the_device_it_was_measured_on(profiled: str, gpu: str, accelerator: bool,
                                                       warns: bool) -> None:  # fmt: skip
    line = device_mismatch({"device": profiled}, gpu, accelerator)
    assert (line is not None) == warns
    if warns:
        assert line is not None and profiled in line and gpu in line and "\n" not in line


def test_simulate_warns_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", "--model", "gpt2-cpu", "--cluster", "dgx-a100", "--nodes", "1", "--strategy", "1M1P8D",
            "--profile", "profiles/cpu-gloo.json"]  # fmt: skip
    code, out, err = run_cli(args, capsys)
    assert code == 0
    assert sum("warning: the profile was measured on" in line for line in err.splitlines()) == 1
    code, out, _ = run_cli([*args, "--json"], capsys)
    assert code == 0 and "not on the cluster's A100-SXM4-80GB" in json.loads(out)["profile"]["warning"]
    code, _, err = run_cli(["simulate", "--model", "gpt2-cpu", "--cluster", "cpu-2x1", "--strategy", "1M2P1D",
                            "--profile", "profiles/cpu-gloo.json"], capsys)  # fmt: skip
    assert code == 0 and "was measured on" not in err

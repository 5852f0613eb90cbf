"""The collocation measurement on this machine's CPU: two processes pinned to one core, the background SCHED_IDLE (or
nice 19), and the profile that records it. No timing ratio is asserted beyond bounds load cannot break."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.util import run_cli

torch = pytest.importorskip("torch")


@pytest.mark.slow  # a measurement: spawns a busy torch process on one core and times 300 cycles (about 4 s)
def test_profile_measures_and_simulate_uses_the_collocation(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "collocation.json"
    cores, threads = os.sched_getaffinity(0), torch.get_num_threads()
    rc, _, err = run_cli(["profile", "--model", "vgg16", "--cluster", "cpu-1x2", "--collocation", "--out", str(out)],
                         capsys)  # fmt: skip
    assert rc == 0, err
    assert os.sched_getaffinity(0) == cores and torch.get_num_threads() == threads  # the profiler restored both
    record = json.loads(out.read_text())["collocation"]
    assert record["slowdown"] >= 0 and record["cycles"] == 150
    assert record["compute_s"] > 0 and record["alone_s"] > record["compute_s"] * 1.5  # a kernel plus a gap as long
    assert record["collocated_s"] / record["alone_s"] > 0.5
    assert 0 <= record["background_busy"] <= 1
    assert "SCHED_IDLE" in record["method"] or "nice 19" in record["method"]
    rc, shown, _ = run_cli(["profile", "show", str(out)], capsys)
    assert rc == 0 and "collocation: a background job slows the foreground's compute by" in shown
    rc, text, err = run_cli(["simulate", "--model", "gpt2-cpu", "--cluster", "cpu-1x2", "--strategy", "1M2P1D",
                             "--micro-batches", "2", "--profile", str(out), "--background", "gpt2-cpu"],
                            capsys)  # fmt: skip
    assert rc == 0, err
    assert f"foreground compute x{1 + record['slowdown']:.3f} on those GPUs" in text and "(measured:" in text


def test_collocation_is_not_measured_on_an_unknown_device() -> None:
    from distsim.profiler.collocation import measure_collocation

    with pytest.raises(ValueError, match="cannot be measured on a meta device"):
        measure_collocation("meta")

"""Holistic Trace Analysis reads distsim's per-rank Kineto export and finds distsim's own per-GPU figures.

HTA's temporal breakdown of a rank is compute, non-compute (communication not under compute) and idle time between
the rank's first and last kernel; the export marks the iteration's bounds with zero-length kernels, so the three are
distsim's compute, exposed communication and idle time of that GPU (:mod:`distsim.io.kineto`), to the microsecond
the export rounds every time to.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("hta", reason="holistictraceanalysis is not installed (pip install HolisticTraceAnalysis)")

from distsim import Strategy, get_cluster, get_model, simulate
from distsim.io.kineto import write_kineto_traces
from distsim.io.rank_traces import RANK_FORMATS, write_rank_traces
from distsim.sim.metrics import of_timeline
from distsim.sim.timeline import Timeline
from tests.util import run_cli

# HTA 0.5 sorts its frames in place, which pandas 3.1 deprecates: HTA's own warning, not distsim's
pytestmark = pytest.mark.filterwarnings("ignore:The inplace keyword in DataFrame.sort_values:Warning")

TINY = "gpt2-345m:seq=16,layers=2,hidden=32,heads=4,vocab=64,precision=fp32"
TOLERANCE = 1e-3
"""HTA's figures against distsim's, as a share of the iteration (0.1 %)."""


def hta_breakdown(directory: Path) -> dict[int, dict[str, float]]:
    """HTA's temporal breakdown per rank, in seconds."""
    from hta.trace_analysis import TraceAnalysis

    df = TraceAnalysis(trace_dir=str(directory)).get_temporal_breakdown(visualize=False)
    return {int(r["rank"]): {"compute": r["compute_time(us)"] / 1e6, "exposed": r["non_compute_time(us)"] / 1e6,
                             "idle": r["idle_time(us)"] / 1e6, "span": r["kernel_time(us)"] / 1e6}
            for r in df.to_dict("records")}  # fmt: skip


def assert_agree(hta: dict[int, dict[str, float]], timeline: Timeline) -> None:
    """Per rank, HTA's compute / non-compute / idle are distsim's compute / exposed comm / idle within TOLERANCE of
    the iteration, and its span is the iteration."""
    metrics = of_timeline(timeline)
    iteration = metrics.iteration_time_s
    assert sorted(hta) == timeline.gpus
    for stats in metrics.per_gpu:
        got = hta[stats.gpu]
        want = {"compute": stats.compute_s, "exposed": stats.exposed_comm_s, "idle": stats.idle_s, "span": iteration}
        for key, value in want.items():
            assert got[key] == pytest.approx(value, abs=TOLERANCE * iteration), (stats.gpu, key)


def on_the_microsecond(timeline: Timeline) -> Timeline:
    """The timeline with every time rounded to the microsecond, as the export writes it."""
    df = timeline.df.copy()
    t0 = float(df["start_s"].min())
    for col in ("start_s", "end_s"):
        df[col] = np.rint((df[col].to_numpy() - t0) * 1e6) / 1e6
    return Timeline(df, timeline.gpus_per_node, dict(timeline.represents))


@pytest.mark.parametrize(
    ("cluster", "strategy"),
    [("cpu-1x2", "1M2P1D"), ("dgx-a100", "2M2P2D")],  # the second: 8 ranks from 2 simulated GPUs, TP collectives
)
def test_hta_breakdown_of_a_simulated_run_is_distsims_per_gpu_figures(tmp_path: Path, cluster: str,
                                                                       strategy: str) -> None:  # fmt: skip
    c = get_cluster(cluster)
    result = simulate(get_model("gpt2-345m"), c.with_nodes(1) if c.num_gpus > 8 else c,
                      Strategy.from_str(strategy, num_micro_batches=4))  # fmt: skip
    paths = write_rank_traces("kineto", tmp_path / "pred", result=result)
    assert [p.name for p in paths] == [f"distsim.rank{g}.json" for g in result.timeline.gpus]
    hta = hta_breakdown(tmp_path / "pred")
    assert_agree(hta, result.timeline)
    exact = of_timeline(on_the_microsecond(result.timeline))  # what HTA computes is these intervals' figures
    for stats in exact.per_gpu:
        assert hta[stats.gpu]["compute"] == pytest.approx(stats.compute_s, abs=1e-9)
        assert hta[stats.gpu]["exposed"] == pytest.approx(stats.exposed_comm_s, abs=1e-9)
        assert hta[stats.gpu]["idle"] == pytest.approx(stats.idle_s, abs=1e-9)


def test_each_rank_file_names_its_rank_device_streams_and_collectives(tmp_path: Path) -> None:
    result = simulate(get_model("gpt2-345m"), get_cluster("dgx-a100").with_nodes(1),
                      Strategy.from_str("2M2P2D", num_micro_batches=2))  # fmt: skip
    paths = write_kineto_traces(result.timeline, tmp_path, "x")
    data = json.loads(paths[5].read_text())
    assert data["distributedInfo"] == {"backend": "nccl", "rank": 5, "world_size": 8}
    kernels = [e for e in data["traceEvents"] if e.get("cat") == "kernel"]
    assert {e["args"]["device"] for e in kernels} == {e["pid"] for e in kernels} == {5}
    assert all(e["args"]["stream"] > 0 and isinstance(e["ts"], int) for e in kernels)
    comm = [e for e in kernels if e["args"].get("distsim_kind") in ("tp_allreduce", "dp_allreduce", "p2p")]
    assert comm and all(e["name"].startswith("ncclDevKernel_") for e in comm)
    host = [e for e in data["traceEvents"] if e.get("cat") == "cpu_op"]
    assert any(e["name"] == "ProfilerStep#0" for e in host)
    assert any(e["name"].startswith("launch") for e in host)  # host launch rows: CPU-side, not kernels
    assert not any(e["name"].startswith("launch") for e in kernels)


@pytest.mark.slow  # a real 2-rank gloo run
def test_hta_breakdown_of_an_executed_run_and_the_torch_profilers_traces(tmp_path: Path) -> None:
    """One run: distsim's Kineto export of the measured iteration agrees with distsim's metrics of it, and
    --torch-profiler leaves one trace per rank that HTA loads with its rank and ProfilerSteps."""
    from distsim.io.files import load_trace

    out = tmp_path / "run.json"
    run = subprocess.run([sys.executable, "-m", "distsim", "execute", "--model", TINY, "--cluster", "cpu-1x2",
                          "--strategy", "1M2P1D", "--schedule", "1f1b", "--micro-batches", "2", "--emulate-nodes", "1",
                          "--procs-per-node", "2", "--iterations", "2", "--warmup", "1", "--out", str(out),
                          "--trace-dir", str(tmp_path / "kineto"), "--trace-format", "kineto", "--torch-profiler"],
                         capture_output=True, text=True, timeout=300, env={**os.environ})  # fmt: skip
    assert run.returncode == 0, run.stderr
    trace = load_trace(str(out))
    measured = trace.timeline(trace.median_index(), 2)
    assert_agree(hta_breakdown(tmp_path / "kineto"), measured)
    assert trace.provenance["torch_profiler"] == str(tmp_path / "run.torch")

    from hta.trace_analysis import TraceAnalysis

    torch_dir = tmp_path / "run.torch"
    assert sorted(p.name for p in torch_dir.iterdir()) == ["rank0.json", "rank1.json"]
    analysis = TraceAnalysis(trace_dir=str(torch_dir))
    assert analysis.t.get_ranks() == [0, 1]
    steps = {name for name in analysis.t.symbol_table.get_sym_table() if name.startswith("ProfilerStep#")}
    assert steps == {"ProfilerStep#0", "ProfilerStep#1"}  # the two measured iterations


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["simulate", "--trace-format", "kineto"], "--trace-format needs --trace-dir"),
        (["simulate", "--trace-dir", "{tmp}/d"], "--trace-dir needs --trace-format"),
        (["simulate", "--trace-dir", "{tmp}/file/d", "--trace-format", "kineto"], "is not a directory"),
        (["execute", "--trace-dir", "{tmp}/d", "--trace-format", "chakra"], "a measured run has none"),
    ],
)
def test_rank_trace_options_refuse_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                               message: str) -> None:  # fmt: skip
    (tmp_path / "file").write_text("")
    job = ["--model", TINY, "--cluster", "cpu-1x2", "--strategy", "1M2P1D"]
    code, _out, err = run_cli([args[0], *job, *(a.format(tmp=tmp_path) for a in args[1:])], capsys)
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "d").exists()  # refused before anything ran or was written


def test_the_registry_names_each_writer_by_import_path() -> None:
    assert RANK_FORMATS["kineto"][1] == "distsim.io.kineto:write_kineto_traces"
    assert RANK_FORMATS["chakra"][1] == "distsim.io.chakra:write_chakra_traces"
